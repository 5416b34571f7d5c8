//! `SweetySite`: hostnames, TLS and routes (static, proxy, redirect) of one site.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Placeholder: fleshed out by the CRD work.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "sweety.dev",
    version = "v1alpha1",
    kind = "SweetySite",
    namespaced,
    status = "SweetySiteStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct SweetySiteSpec {
    /// Hostnames the site answers for.
    #[serde(default)]
    pub hostnames: Vec<String>,
}

/// Observed state of a SweetySite.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SweetySiteStatus {}
