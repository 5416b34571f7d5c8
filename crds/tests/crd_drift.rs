//! The committed CRD YAML in `charts/sweety/crds/` must match what the Rust types generate.

use std::path::PathBuf;

#[test]
fn committed_crd_yaml_is_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/sweety/crds");
    for (name, want) in sweety_crds::crd_files().unwrap() {
        let path = dir.join(name);
        let got = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            got == want,
            "{} is stale: run `cargo run -p sweety-crds --bin crdgen` and commit the result",
            path.display()
        );
    }
}
