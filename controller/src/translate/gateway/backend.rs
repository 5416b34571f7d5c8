//! backendRef resolution for every route kind: kind check, ReferenceGrant for other
//! namespaces, Service port lookup, protocol (GRPCRoute defaults to h2c) and BackendTLSPolicy.

use super::listeners::{Problem, GROUP};
use super::model::BackendRefSpec;
use super::policy::Policies;
use super::refgrant::{self, Reference};
use crate::translate::backends::{protocol_of, BackendOptions, PortRef};
use crate::translate::Builder;
use sweety_config::BackendProtocol;

/// A resolved backendRef: the dataplane backend name and the Service it came from.
pub(super) struct Resolved {
    pub backend: String,
    pub service: (String, String),
}

/// Resolve one backendRef of a route of `route_kind` in `route_ns`. `grpc` makes h2c the
/// default protocol.
pub(super) fn resolve(
    b: &mut Builder<'_>,
    policies: &Policies,
    route_kind: &str,
    route_ns: &str,
    r: &BackendRefSpec,
    grpc: bool,
) -> Result<Resolved, Problem> {
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Service");
    if !group.is_empty() || kind != "Service" {
        return Err((
            "InvalidKind",
            format!("backendRef {group}/{kind} {} is not a Service", r.name),
        ));
    }
    let ns = r.namespace.as_deref().unwrap_or(route_ns);
    let grant = Reference {
        from_group: GROUP,
        from_kind: route_kind,
        from_namespace: route_ns,
        to_group: "",
        to_kind: "Service",
        to_namespace: ns,
        to_name: &r.name,
    };
    if !refgrant::permitted(b.snapshot, &grant) {
        return Err((
            "RefNotPermitted",
            format!(
                "Service {ns}/{} is in another namespace and no ReferenceGrant allows it",
                r.name
            ),
        ));
    }
    let port = r.port.map(PortRef::Number);
    let (_, sp) = b
        .services
        .port(ns, &r.name, port.as_ref())
        .map_err(|e| (e.reason(), e.to_string()))?;
    let mut options = BackendOptions::default();
    // IANA service names are case-insensitive (`HTTPS` appears in the wild and in the suite).
    let app_protocol = sp.app_protocol.as_deref().map(|p| {
        if p.contains('/') {
            p.to_string()
        } else {
            p.to_ascii_lowercase()
        }
    });
    match app_protocol.as_deref() {
        None
        | Some("http")
        | Some("kubernetes.io/h2c")
        | Some("h2c")
        | Some("https")
        | Some("kubernetes.io/https")
        // WebSocket over HTTP/1.1: the dataplane tunnels `Upgrade` requests on any proxy route.
        | Some("kubernetes.io/ws") => {}
        Some(other) => {
            return Err((
                "UnsupportedProtocol",
                format!(
                    "Service {ns}/{} port appProtocol {other:?} is not supported",
                    r.name
                ),
            ))
        }
    }
    if grpc && protocol_of(sp) == BackendProtocol::Http1 {
        options.protocol = Some(BackendProtocol::H2c);
    }
    if let Some(t) = policies.lookup(ns, &r.name, sp.name.as_deref()) {
        match &t.tls {
            Ok(tls) => options.tls = Some(tls.clone()),
            Err((_, msg)) => {
                return Err((
                    "BackendNotFound",
                    format!(
                        "BackendTLSPolicy {}/{} for Service {ns}/{} is invalid: {msg}",
                        t.policy.0, t.policy.1, r.name
                    ),
                ))
            }
        }
    }
    let backend = b
        .backends
        .service(&b.services, ns, &r.name, port.as_ref(), &options)
        .map_err(|e| (e.reason(), e.to_string()))?;
    Ok(Resolved {
        backend,
        service: (ns.to_string(), r.name.clone()),
    })
}
