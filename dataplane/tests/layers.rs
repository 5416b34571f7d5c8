//! The dataplane's layer rule, checked on its source: each module names (as `crate::NAME`,
//! outside comments and its `#[cfg(test)]` part) only modules of a lower layer; the handler
//! layer's modules may name each other. From the top:
//!
//! control → reload, admin, idle_purge → listen → pipeline → state → handlers (router,
//! filters, proxy, cache, static files, access, …) → exec.
//!
//! The snapshot (`state`) is made of the handlers' compiled types, so it sits above them: the
//! handlers see neither the snapshot nor anything that reloads or serves it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Layer of each top-level module of the crate (higher may name lower).
fn layer(module: &str) -> Option<u8> {
    Some(match module {
        "control" => 6,
        "reload" | "admin" | "idle_purge" => 5,
        "listen" => 4,
        "pipeline" => 3,
        "state" => 2,
        "access" | "access_log" | "basic_auth" | "ext_auth" | "body" | "cache" | "client_caps"
        | "client_cert" | "compress" | "ctx" | "defaults" | "error_pages" | "filters" | "grpc"
        | "identity" | "limits" | "metrics" | "path_norm" | "proxy" | "proxy_protocol"
        | "quic_budget" | "request_id" | "router" | "send_timeout" | "static_files" | "tls"
        | "trace" | "websocket" | "conn_headers" | "hpack" => 1,
        "exec" => 0,
        _ => return None,
    })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules `code` names as `crate::NAME`, outside comments and before its first
/// `#[cfg(test)]` item.
fn named(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in code.lines() {
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.push(name);
        }
    }
    names
}

#[test]
fn every_module_names_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut broken = BTreeMap::new();
    let mut checked = 0;
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .to_string();
        // The binary, the crate root and test-only files are no layer.
        if rel == "main.rs" || rel == "lib.rs" || rel.ends_with("tests.rs") {
            continue;
        }
        let module = rel.split(['/', '.']).next().unwrap().to_string();
        let own = layer(&module).unwrap_or_else(|| panic!("{rel}: module {module} has no layer"));
        checked += 1;
        let code = std::fs::read_to_string(&file).unwrap();
        for name in named(&code) {
            let Some(theirs) = layer(&name) else {
                panic!("{rel} names crate::{name}, which has no layer");
            };
            let allowed = name == module || theirs < own || (own == 1 && theirs == 1);
            if !allowed {
                broken
                    .entry(rel.clone())
                    .or_insert_with(Vec::new)
                    .push(name);
            }
        }
    }
    assert!(
        checked > 40,
        "only {checked} files found under {}",
        src.display()
    );
    assert!(
        broken.is_empty(),
        "modules naming a higher layer: {broken:?}"
    );
}

#[test]
fn the_scan_sees_uses_and_paths_and_skips_comments_and_tests() {
    let code = "use crate::state::Shared;\n\
                // crate::control in a comment\n\
                fn f() { crate::reload::x(); } // crate::admin\n\
                #[cfg(test)]\n\
                mod tests { use crate::listen; }\n";
    assert_eq!(named(code), ["state", "reload"]);
}
