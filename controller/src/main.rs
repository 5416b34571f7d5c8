//! `sweety-controller`: watches the cluster and drives the dataplane (placeholder `main`; the
//! runtime lands with the watch, push and status modules).
fn main() -> anyhow::Result<()> {
    Ok(())
}
