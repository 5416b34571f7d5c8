//! The label and annotation names the controller writes on the objects it owns and reads back,
//! in one place: both the pure [`crate::translate`] (which recognises our per-Gateway Services
//! and reads EndpointSlice ownership) and the I/O modules ([`crate::gateway_services`],
//! [`crate::watch`]) use them, so neither imports the other for a name.

use sha2::{Digest, Sha256};

/// The standard "managed by" label; ours carry [`MANAGED_BY`].
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Our value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "sweety";
/// The namespace of the Gateway a per-Gateway Service belongs to.
pub const GATEWAY_NAMESPACE_LABEL: &str = "sweety.dev/gateway-namespace";
/// The name of the Gateway a per-Gateway Service belongs to.
pub const GATEWAY_NAME_LABEL: &str = "sweety.dev/gateway-name";
/// The namespace of the controller installation that owns the object.
pub const OWNER_LABEL: &str = "sweety.dev/owner";
/// Annotation listing the Gateway `spec.infrastructure` keys set on the Service.
pub const INFRASTRUCTURE_KEYS: &str = "sweety.dev/infrastructure-keys";
/// Annotation naming the Gateway (`namespace/name`) a per-Gateway Service serves.
pub const GATEWAY_ANNOTATION: &str = "sweety.dev/gateway";
/// The Gateway API's own label for resources created for a Gateway.
pub const STANDARD_GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// The label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label saying who manages an EndpointSlice.
pub const SLICE_MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Our value of [`SLICE_MANAGED_BY_LABEL`].
pub const SLICE_MANAGED_BY: &str = "controller.sweety.dev";

/// A valid label value: the input when it fits in 63 characters, else a prefix plus a hash.
pub fn label_value(s: &str) -> String {
    if s.len() <= 63 {
        return s.to_string();
    }
    let hash = Sha256::digest(s.as_bytes());
    let hex: String = hash[..5].iter().map(|b| format!("{b:02x}")).collect();
    let prefix: String = s.chars().take(52).collect();
    format!("{}-{hex}", prefix.trim_end_matches(['-', '.', '_']))
}
