//! Writes the CRD YAML for every Sweety resource into `charts/sweety/crds/`.
//!
//! `crdgen` (re)writes the files; `crdgen --check` writes nothing and fails when a committed
//! file differs from what the types generate; `crdgen --stdout` prints them.

use anyhow::{bail, Context};
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/sweety/crds");
    let files = sweety_crds::crd_files()?;
    match mode.as_str() {
        "" => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, text) in &files {
                let path = dir.join(name);
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
        }
        "--stdout" => {
            for (_, text) in &files {
                println!("---\n{text}");
            }
        }
        "--check" => {
            let mut stale = Vec::new();
            for (name, text) in &files {
                let path = dir.join(name);
                if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                    stale.push(path.display().to_string());
                }
            }
            if !stale.is_empty() {
                bail!(
                    "stale CRD YAML: {}; run `cargo run -p sweety-crds --bin crdgen`",
                    stale.join(", ")
                );
            }
        }
        other => bail!("unknown argument {other:?}; usage: crdgen [--check | --stdout]"),
    }
    Ok(())
}
