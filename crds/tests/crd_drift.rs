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

/// deploy/sweety.yaml (the chart's default render, kept by `e2e/chart/check.sh`) embeds each of our
/// CRDs as the chart ships it. A CRD change that forgot the re-render fails here, in `cargo test`,
/// not only in CI's chart step (a stop's CI once failed there after a field was added).
#[test]
fn deploy_manifest_embeds_the_current_crds() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/sweety.yaml");
    let deploy = std::fs::read_to_string(&path).unwrap();
    for (name, want) in sweety_crds::crd_files().unwrap() {
        assert!(
            deploy.contains(&format!("# Source: sweety/crds/{name}\n{want}")),
            "{} does not embed the current {name}: run `SWEETY_BLESS=1 bash e2e/chart/check.sh` and commit deploy/sweety.yaml",
            path.display()
        );
    }
}
