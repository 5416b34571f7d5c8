//! Golden tests for `translate`: every `testdata/translate/<case>.in.yaml` (Kubernetes objects,
//! opening with a `#` comment that says what the case checks) is translated and compared with
//! `<case>.out.yaml` (config, statuses, per-Gateway Services, static content).
//!
//! `SWEETY_BLESS=1 cargo test -p sweety-controller goldens` rewrites the `.out.yaml` files.

use super::{translate, Params, Snapshot};
use std::path::{Path, PathBuf};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/translate")
}

/// Translate one input file to its golden text.
fn render(input: &Path) -> String {
    let text = std::fs::read_to_string(input).unwrap();
    assert!(
        text.starts_with('#'),
        "{} must open with a comment saying what it checks",
        input.display()
    );
    let (snapshot, overrides) =
        Snapshot::from_yaml(&text).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
    let params: Params = match overrides {
        Some(mut v) => {
            if let Some(m) = v.as_mapping_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            serde_yaml::from_value(v).unwrap_or_else(|e| panic!("{}: params: {e}", input.display()))
        }
        None => Params::default(),
    };
    let mut params = params;
    // The controller always has a default certificate (configured or generated): goldens use
    // a fixed one so the ingress-https listener shows it first.
    if params.default_certificate.is_none() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
        params.default_certificate = Some(super::DefaultCertificate {
            cert: std::fs::read_to_string(dir.join("default-cert.pem")).unwrap(),
            key: std::fs::read_to_string(dir.join("default-key.pem")).unwrap(),
        });
    }
    let out = translate(&snapshot, &params);
    // Pure: a second run gives byte-identical output.
    let again = translate(&snapshot, &params);
    let text = serde_yaml::to_string(&out).unwrap();
    assert_eq!(
        text,
        serde_yaml::to_string(&again).unwrap(),
        "translate is not deterministic"
    );
    // Whatever translate emits must be a valid dataplane config (files are checked by the dataplane).
    if let Err(errors) = out.config.validate_structure() {
        panic!(
            "{}: translate produced an invalid config: {errors:?}",
            input.display()
        );
    }
    text
}

#[test]
fn goldens() {
    let bless = std::env::var_os("SWEETY_BLESS").is_some();
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(testdata())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".in.yaml"))
        .collect();
    inputs.sort();
    assert!(
        !inputs.is_empty(),
        "no golden inputs in {}",
        testdata().display()
    );
    let mut failures = Vec::new();
    for input in &inputs {
        let expected_path = PathBuf::from(input.to_string_lossy().replace(".in.yaml", ".out.yaml"));
        let got = render(input);
        if bless {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if want != got {
            failures.push(format!(
                "{}: output differs from {} (SWEETY_BLESS=1 to regenerate)\n--- got ---\n{got}",
                input.display(),
                expected_path.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
