//! Gateway API front end: GatewayClass, Gateway, HTTPRoute, GRPCRoute, TLSRoute, TCPRoute,
//! UDPRoute, ReferenceGrant, BackendTLSPolicy and SweetySecurityPolicy into listeners,
//! virtual hosts and statuses.
//!
//! Order of work: classes → policies → Gateways and their listeners → container ports
//! (`addressing`) → routes attach to listeners and become routes/L4 routes → dataplane
//! listeners and virtual hosts → statuses. Every invalid object gets a condition saying why
//! and is left out without stopping the rest.
//!
//! Modules: `model` (uniform route spec types), `classes`, `listeners`, `frontend` (client
//! certificate validation), `listenersets`, `client_cert` (the Gateway's certificate towards backends), `attach`, `refgrant`,
//! `policy`, `security` (SweetySecurityPolicy), `backend` (backendRef resolution), `http` (HTTPRoute rules), `grpc` (GRPCRoute
//! matches), `l4` (TLS/TCP/UDP routes), `routes` (attachment and route status), `emit`
//! (dataplane listeners, virtual hosts, Gateway status), `capture` (what one route adds),
//! `vhost_cache` (the per-virtual-host memo of `translate_incremental`).

mod attach;
mod backend;
mod capture;
mod classes;
mod client_cert;
mod emit;
mod frontend;
mod grpc;
mod http;
mod l4;
mod listeners;
mod listenersets;
mod model;
mod policy;
mod refgrant;
mod routes;
mod security;
mod tls_secret;
pub(crate) mod vhost_cache;

pub use security::services as security_services;
pub use vhost_cache::{Changes, VhostMemo};

use super::addressing::Allocation;
use super::Builder;
use listeners::ValidatedListener;
use policy::Policies;
use std::collections::BTreeMap;
use std::sync::Arc;
use sweety_gateway_api::gateways::Gateway;

/// A Gateway of ours with its validated listeners.
pub struct OwnedGateway {
    /// The Gateway object as watched.
    pub gateway: Arc<Gateway>,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its `metadata.generation`, for `observedGeneration`.
    pub generation: i64,
    /// Its listeners and those of attached ListenerSets, each validated (conflicts marked).
    pub listeners: Vec<ValidatedListener>,
    /// Why the Gateway as a whole is not accepted (its listeners are then not programmed).
    pub rejected: Option<String>,
    /// Why it may not have its per-Gateway Service (an older Gateway's has the same name, or
    /// a Service of that name exists that is not this Gateway's); also in `rejected`.
    pub service_refused: Option<String>,
    /// Serve HTTP/3 on HTTPS listeners (class SweetyProxyConfig, else `Params::http3`).
    pub http3: bool,
    /// Its class: the per-Gateway Service's type, traffic policy and owner.
    pub class: classes::ClassInfo,
    /// ListenerSets naming this Gateway, in precedence order (their listeners are in
    /// `listeners` with `owner` set).
    pub listener_sets: Vec<listenersets::AttachedListenerSet>,
    /// `spec.tls.backend.clientCertificateRef`, resolved (Err: why not, for `ResolvedRefs`).
    pub backend_client_cert: Result<Option<client_cert::ClientCert>, listeners::Problem>,
    /// Client certificates SweetySecurityPolicies ask for, by listener index.
    pub client_certs: BTreeMap<usize, security::ListenerCert>,
}

/// What the Gateway API front end derives from every object but the routes.
pub struct World {
    /// Our Gateways, listeners validated and container ports allocated (nothing attached).
    pub gateways: Vec<OwnedGateway>,
    /// Validated BackendTLSPolicies (`used_by` empty) and SweetySecurityPolicies.
    pub policies: Policies,
    /// Container port of every Gateway listener port, by index in `gateways`.
    pub allocation: Allocation,
}

/// GatewayClasses, BackendTLSPolicies, Gateways and their ports (with their statuses where
/// they do not depend on routes).
pub fn world(b: &mut Builder<'_>) -> World {
    let classes = classes::translate(b);
    let mut policies = policy::collect(b);
    let mut gateways = emit::gateways(b, &classes);
    policies.security = security::collect(b, &mut gateways);
    let allocation = emit::allocate(b, &mut gateways);
    World {
        gateways,
        policies,
        allocation,
    }
}

/// Translate every Gateway API object in the snapshot.
pub fn translate(b: &mut Builder<'_>) {
    let World {
        mut gateways,
        mut policies,
        allocation,
    } = world(b);
    let mut out = routes::Collected::default();
    routes::translate(b, &mut gateways, &mut policies, &mut out);
    emit::emit(b, &gateways, &allocation, out);
    policy::statuses(b, &policies);
    security::statuses(b, &policies.security, &gateways);
    b.config.user_sets = policies.security.user_sets();
}
