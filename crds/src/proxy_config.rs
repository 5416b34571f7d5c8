//! `SweetyProxyConfig`: dataplane settings referenced from a GatewayClass `parametersRef`.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Placeholder: fleshed out by the CRD work.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "sweety.dev",
    version = "v1alpha1",
    kind = "SweetyProxyConfig",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct SweetyProxyConfigSpec {
    /// Serve HTTP/3 on HTTPS listeners unless a listener says otherwise.
    #[serde(default)]
    pub http3: Option<bool>,
}
