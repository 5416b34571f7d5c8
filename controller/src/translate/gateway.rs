//! Gateway API front end: GatewayClass, Gateway, HTTPRoute, GRPCRoute, TLSRoute, TCPRoute,
//! UDPRoute, ReferenceGrant and BackendTLSPolicy into listeners, virtual hosts and statuses.

use super::Builder;

/// Translate every Gateway API object in the snapshot (not yet implemented: adds nothing).
pub fn translate(b: &mut Builder<'_>) {
    let _ = b;
}
