//! Writes the CRD YAML for every Sweety resource (placeholder until the CRD work lands).
fn main() {}
