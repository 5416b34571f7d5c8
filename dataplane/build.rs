//! Build script of sweety-dataplane: in release builds for x86_64 Linux, the executable's
//! functions listed in `symbol-order.txt` are linked together at the start of its code, in
//! the file's order (issue 23, idle RSS).
//!
//! An idle dataplane's RSS is mostly the executable's code: the kernel maps the 64 KiB around
//! every fault of a file mapping, so how many 64 KiB windows the code of the event loop and of
//! a first connection spans decides it, and with the linker's default order that moved by
//! ~2 MiB from build to build of the same code (docs/benchmarks.md, "Idle RSS"). The file lists
//! the functions an idle server runs, then those a few requests run, from a callgrind profile
//! (`ORDER=dataplane/symbol-order.txt e2e/bench/callgrind.sh BINARY`, never written by hand).
//! The script below starts the `.text` output section with each listed function's input
//! sections (one per function, [`input_sections`]); every other function follows in the
//! linker's usual order (`INSERT BEFORE .init` keeps the default layout around it; one `.text`,
//! so valgrind and perf read every symbol as before). A name the build does not have (code
//! changed since the profile) matches nothing. No instruction changes, only where a function
//! lies.
//!
//! Only where the linker is known to take the script: the x86_64 Linux GNU target, which Rust
//! links with its own LLD by default (`readelf -p .comment` on the binary says "Linker: LLD"),
//! unless the build's flags pick another linker. `SWEETY_SYMBOL_ORDER=0` turns it off.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=symbol-order.txt");
    println!("cargo:rerun-if-env-changed=SWEETY_SYMBOL_ORDER");
    let target = env::var("TARGET").unwrap_or_default();
    let profile = env::var("PROFILE").unwrap_or_default();
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let other_linker = flags.contains("linker=") || flags.contains("linker-features=-lld");
    let off = env::var("SWEETY_SYMBOL_ORDER").is_ok_and(|v| v == "0");
    if target != "x86_64-unknown-linux-gnu" || profile != "release" || other_linker || off {
        return;
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let Ok(list) = std::fs::read_to_string(manifest.join("symbol-order.txt")) else {
        return;
    };
    let Some(script) = linker_script(&list) else {
        return;
    };
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_default()).join("hot-text.ld");
    if std::fs::write(&out, script).is_err() {
        return;
    }
    println!(
        "cargo:rustc-link-arg-bin=sweety-dataplane=-Wl,-T,{}",
        Path::new(&out).display()
    );
}

/// The linker script for `list` (symbol names, one a line; a line starting with `#` begins a
/// group), or `None` when it names nothing usable. Each name's input section goes in list
/// order ([`input_sections`]). Then, for every legacy-mangled name, the same with its
/// hash as a wildcard (`17h*E`), group by group: that hash changes with the crate's `-C
/// metadata` (a build script added, a dependency's version), and then the exact names match
/// nothing but these still keep each group's functions together (with the other instances of
/// a generic function, which share the name). An input section goes to the first pattern it
/// matches. Names are Rust mangled symbols or C functions (`[A-Za-z0-9_$.]`); a line with any
/// other character (which the script's lexer could read as syntax) is left out.
fn linker_script(list: &str) -> Option<String> {
    let mut exact = String::new();
    let mut wildcard = String::new();
    for name in list.lines().map(str::trim) {
        if name.is_empty() || name.starts_with('#') {
            continue;
        }
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'.');
        if !name.bytes().all(allowed) {
            continue;
        }
        input_sections(&mut exact, name);
        if let Some(path) = legacy_path(name) {
            input_sections(&mut wildcard, &format!("{path}17h*E"));
        }
    }
    if exact.is_empty() {
        return None;
    }
    Some(format!(
        "/* From dataplane/symbol-order.txt by dataplane/build.rs. */\n\
         SECTIONS {{\n  .text : {{\n{exact}{wildcard}  }}\n}}\nINSERT BEFORE .init;\n"
    ))
}

/// One line of the script: the input sections of the function `name` (a pattern), that is
/// `.text.NAME`, and `.text.unlikely.NAME` / `.text.hot.NAME` where LLVM marked it cold (rustc
/// does for `#[cold]` code) or hot, each also with ThinLTO's `.llvm.*` suffix.
fn input_sections(out: &mut String, name: &str) {
    let _ = write!(out, "    *(");
    for prefix in [".text.", ".text.unlikely.", ".text.hot."] {
        let _ = write!(out, "{prefix}{name} {prefix}{name}.llvm.* ");
    }
    let _ = writeln!(out, ")");
}

/// The path of a legacy-mangled Rust symbol (`_ZN` + path + `17h` + 16 hex digits + `E`): the
/// name up to its hash, `_ZN` included.
fn legacy_path(name: &str) -> Option<&str> {
    let body = name.strip_prefix("_ZN")?.strip_suffix('E')?;
    let (path, hash) = body.split_at_checked(body.len().checked_sub(19)?)?;
    let hex = hash.strip_prefix("17h")?;
    (hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| &name[..3 + path.len()])
}
