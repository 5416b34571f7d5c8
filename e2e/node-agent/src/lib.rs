//! sweety-node-agent: a small, test-only "kubelet" for the Docker-less e2e cluster (e2e/cluster/up.sh).
//!
//! It registers a Node, watches the Pods bound to it and runs each container as a local process inside a
//! per-Pod network namespace whose veth is attached to a host bridge (`--pod-cidr`, default
//! 10.244.0.0/24, gateway .1), so Pod IPs are real, host-reachable and accepted by EndpointSlices. See README.md for what is missing.

pub mod agent;
pub mod apiserver;
pub mod container;
pub mod env;
pub mod error;
pub mod imagemap;
pub mod lb;
pub mod net;
pub mod node;
pub mod server;
pub mod status;
pub mod volumes;

pub use error::{Error, Result};

/// Current time as a Kubernetes `Time`.
pub fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

/// Resolves once `stop` is true (or its sender is gone); holds no borrow across awaits.
pub async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
