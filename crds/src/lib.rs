//! Sweety's custom resources: `SweetySite` (a whole site in one object) and
//! `SweetyProxyConfig` (dataplane settings a GatewayClass points at through `parametersRef`).
//!
//! The CRD YAML in `charts/sweety/crds/` is generated from these types by the `crdgen` binary;
//! a test fails when the committed YAML is stale.

pub mod proxy_config;
pub mod site;

pub use proxy_config::{SweetyProxyConfig, SweetyProxyConfigSpec};
pub use site::{SweetySite, SweetySiteSpec, SweetySiteStatus};

/// The API group of every Sweety resource.
pub const GROUP: &str = "sweety.dev";
