//! `translate` stays pure: no module under `src/translate/` imports one of the controller's I/O
//! modules (the watches, the pusher, the status and Service writers, leader election, the run
//! loop, health and metrics) or names a Kubernetes client. What the two sides share (label and
//! annotation names, the config items) lives in modules of its own (`labels`, `config_items`).

use std::path::{Path, PathBuf};

/// The controller's modules that do I/O; `translate` may be used by them, never the reverse.
const IO_MODULES: [&str; 10] = [
    "watch",
    "push",
    "run",
    "status_worker",
    "status_writer",
    "gateway_services",
    "leader",
    "health",
    "metrics",
    "main",
];

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

/// Every `crate::NAME` path in `text` whose first segment is one of `IO_MODULES`, and every
/// use of a kube client (`kube::Api`, `kube::Client`), with its line number.
fn io_uses(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let first: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if IO_MODULES.contains(&first.as_str()) {
                found.push((n + 1, format!("crate::{first}")));
            }
        }
        for client in ["kube::Api", "kube::Client", "kube::api::"] {
            if code.contains(client) {
                found.push((n + 1, client.to_string()));
            }
        }
    }
    found
}

#[test]
fn translate_imports_no_io_module() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/translate");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    files.sort();
    assert!(
        files.len() > 10,
        "the translate sources are in {}",
        dir.display()
    );
    let mut offences = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (line, what) in io_uses(&text) {
            offences.push(format!("{}:{line}: {what}", file.display()));
        }
    }
    assert!(
        offences.is_empty(),
        "translate must not depend on the I/O modules:\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_check_finds_io_imports() {
    let text = "use crate::labels::X;\nuse crate::gateway_services::{A, B};\n\
                let c = crate::push::Pusher::spawn(o); // crate::watch in a comment\n\
                fn f(c: kube::Client) {}\n";
    assert_eq!(
        io_uses(text),
        [
            (2, "crate::gateway_services".to_string()),
            (3, "crate::push".to_string()),
            (4, "kube::Client".to_string()),
        ]
    );
}
