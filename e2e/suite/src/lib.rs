//! sweety-e2e: helpers for the end-to-end tests in `tests/e2e.rs`, which run against a live cluster where
//! Sweety was installed with `helm install` (e2e/install.sh here, e2e/kind/run.sh with kind). Everything talks
//! to the real thing: the apiserver through kube-rs, the dataplane through its load-balancer address with curl
//! (HTTP/1.1, HTTP/2) and a quinn/h3 client (HTTP/3).
//!
//! Configuration (environment):
//! * `SWEETY_E2E_KUBECONFIG`: the cluster. The tests are `#[ignore]`d (`cargo test --workspace` stays green
//!   without a cluster); run with `--ignored` (as e2e/run.sh does), a missing cluster fails them.
//! * `SWEETY_E2E_ALLOWED_CIDR` (required with a cluster): load-balancer addresses must be inside it; the
//!   tests refuse to send traffic anywhere else.
//! * `SWEETY_E2E_NAMESPACE` / `SWEETY_E2E_RELEASE` (default `sweety` / `sweety`): where the chart is.
//! * `SWEETY_E2E_RESTART` (default `process`): how a container is killed for the restart test: `process`
//!   (SIGKILL to the container's process on this host: the e2e node agent runs containers as local
//!   processes, and so does the real node of e2e/realnode, whose runc containers are host processes; the
//!   kubelet then restarts the container; needs root) or `kind` (`crictl stop` inside the kind node container `SWEETY_E2E_KIND_NODE`,
//!   default `sweety-e2e-control-plane`, through `docker exec`).
//! * `SWEETY_E2E_ECHO_IMAGE`: image of the echo backends (Gateway API's echo-basic); the default is a local
//!   name the e2e node agent maps to the binary.
//! * `SWEETY_E2E_PULL_POLICY` (default `IfNotPresent`): the echo backends' `imagePullPolicy` (`Never` on the
//!   real node of e2e/realnode, which holds only imported images).

pub mod client;
pub mod cluster;
pub mod error;
pub mod tls;

pub use error::{Error, Result};

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `f` every `every` until it returns `Some`, for at most `timeout`; the error names `what` and the
/// last observation `f` reported through `last`.
pub async fn eventually<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut f: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match f().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                secs: timeout.as_secs(),
                last,
            });
        }
        tokio::time::sleep(every).await;
    }
}
