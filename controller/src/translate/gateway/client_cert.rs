//! Gateway `spec.tls.backend.clientCertificateRef`: the certificate the Gateway presents when
//! it talks TLS to a backend (mutual TLS towards the backend).
//!
//! The reference is a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`); another namespace
//! needs a ReferenceGrant. Problems set the Gateway's `ResolvedRefs: False`
//! (`InvalidClientCertificateRef`, `RefNotPermitted`) and its routes then talk to their
//! backends without a client certificate.
//!
//! Routes are translated once, whatever Gateway they attach to, so the certificate is applied
//! when a route is placed on a Gateway ([`apply`]): every TLS backend the route uses (also
//! mirrors) is replaced by a variant carrying the certificate, named after the Secret, so
//! Gateways with different certificates never share a backend and Gateways with the same one
//! do.

use super::listeners::Problem;
use super::tls_secret::{self, SecretRef, TlsPair};
use crate::translate::backends::Backends;
use crate::translate::{Builder, Snapshot};
use std::collections::BTreeSet;
use sweety_config::{check_pem, Action, BackendProtocol, Filter, PemKind, PemSource, Route};
use sweety_gateway_api::gateways::Gateway;

/// A resolved client certificate.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientCert {
    /// `namespace/name` of the Secret (part of the backend variant's name).
    pub secret: String,
    /// PEM certificate chain.
    pub cert: String,
    /// PEM private key.
    pub key: String,
}

/// The Gateway's backend client certificate: None when it asks for none.
pub(super) fn resolve(
    snapshot: &Snapshot,
    gw: &Gateway,
    ns: &str,
) -> Result<Option<ClientCert>, Problem> {
    let Some(r) = gw
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.backend.as_ref())
        .and_then(|b| b.client_certificate_ref.as_ref())
    else {
        return Ok(None);
    };
    let secret_ns = r.namespace.as_deref().unwrap_or(ns);
    let secret_ref = SecretRef {
        group: r.group.as_deref(),
        kind: r.kind.as_deref(),
        namespace: r.namespace.as_deref(),
        name: &r.name,
    };
    let TlsPair { cert, key } =
        tls_secret::resolve(snapshot, "Gateway", ns, &secret_ref).map_err(|e| {
            e.problem(
                "clientCertificateRef",
                "InvalidClientCertificateRef",
                secret_ns,
                &r.name,
            )
        })?;
    let cc = ClientCert {
        secret: format!("{secret_ns}/{}", r.name),
        cert,
        key,
    };
    check(&cc).map_err(|why| {
        (
            "InvalidClientCertificateRef",
            format!("Secret {secret_ns}/{}: {why}", r.name),
        )
    })?;
    Ok(Some(cc))
}

/// sweety-config's own PEM checks, so a bad Secret only fails this Gateway.
fn check(cc: &ClientCert) -> Result<(), String> {
    check_pem(&cc.cert, PemKind::Certificate).map_err(|e| format!("tls.crt: {e}"))?;
    check_pem(&cc.key, PemKind::PrivateKey).map_err(|e| format!("tls.key: {e}"))
}

/// Point every TLS backend of `route` (proxy targets and mirrors) at a variant presenting
/// `cc`, registering the variants in `backends`. Plain-text backends are left alone. Returns
/// the names of the backends that were replaced.
pub(super) fn apply(backends: &mut Backends, route: &mut Route, cc: &ClientCert) -> Vec<String> {
    let mut replaced = Vec::new();
    let mut swap = |name: &mut String| {
        let v = variant(backends, name, cc);
        if v != *name {
            replaced.push(std::mem::replace(name, v));
        }
    };
    for_each_backend(route, &mut swap);
    replaced
}

/// Calls `f` with every backend name `route` sends to (proxy targets and mirrors).
fn for_each_backend(route: &mut Route, f: &mut impl FnMut(&mut String)) {
    for flt in &mut route.filters {
        if let Filter::Mirror(m) = flt {
            f(&mut m.backend);
        }
    }
    if let Action::Proxy(p) = &mut route.action {
        for wb in &mut p.backends {
            f(&mut wb.backend);
            for flt in &mut wb.filters {
                if let Filter::Mirror(m) = flt {
                    f(&mut m.backend);
                }
            }
        }
    }
}

/// Removes the backends in `replaced` that no Gateway route or L4 route uses any more (their
/// routes all went to client-certificate variants). Ingress and SweetySite translation run
/// later and register what they need again.
pub(super) fn drop_unused(b: &mut Builder<'_>, replaced: &BTreeSet<String>) {
    if replaced.is_empty() {
        return;
    }
    let mut used = BTreeSet::new();
    for vh in &mut b.virtual_hosts {
        for r in &mut vh.routes {
            for_each_backend(r, &mut |n: &mut String| {
                used.insert(n.clone());
            });
        }
    }
    for l in &b.listeners {
        for r in &l.l4_routes {
            used.extend(r.backends.iter().map(|w| w.backend.clone()));
        }
    }
    for name in replaced.difference(&used) {
        b.backends.remove(name);
    }
}

fn variant(backends: &mut Backends, name: &str, cc: &ClientCert) -> String {
    let Some(orig) = backends.get(name) else {
        return name.to_string();
    };
    if !matches!(orig.protocol, BackendProtocol::Https | BackendProtocol::H2) {
        return name.to_string();
    }
    let new_name = format!("{name}~client={}", cc.secret);
    if backends.get(&new_name).is_none() {
        let mut b = orig.clone();
        b.name = new_name.clone();
        let mut tls = b.tls.take().unwrap_or_default();
        tls.client_cert = Some(PemSource::Pem(cc.cert.clone()));
        tls.client_key = Some(PemSource::Pem(cc.key.clone()));
        b.tls = Some(tls);
        backends.insert(b);
    }
    new_name
}

#[cfg(test)]
mod tests {
    use super::*;
    use sweety_config::{Backend, Mirror, ProxyAction, Timeouts, WeightedBackend};

    fn cc() -> ClientCert {
        ClientCert {
            secret: "infra/client".into(),
            cert: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
            key: "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n".into(),
        }
    }

    #[test]
    fn only_tls_backends_and_their_mirrors_get_the_certificate() {
        let mut backends = Backends::new();
        let mut tls = Backend::new("app/secure:443~https", Vec::new());
        tls.protocol = BackendProtocol::Https;
        backends.insert(tls);
        backends.insert(Backend::new("app/plain:80", Vec::new()));
        let wb = |name: &str| WeightedBackend {
            backend: name.into(),
            weight: 1,
            filters: Vec::new(),
        };
        let mut route = Route {
            name: "r".into(),
            matches: Vec::new(),
            filters: vec![Filter::Mirror(Mirror {
                backend: "app/secure:443~https".into(),
                percent: 100.0,
            })],
            action: Action::Proxy(ProxyAction {
                backends: vec![wb("app/secure:443~https"), wb("app/plain:80")],
            }),
            timeouts: Timeouts::default(),
            retry: None,
            max_request_body_bytes: None,
        };
        let replaced = apply(&mut backends, &mut route, &cc());
        assert_eq!(
            replaced,
            vec!["app/secure:443~https"; 2],
            "the mirror and the target"
        );
        let want = "app/secure:443~https~client=infra/client";
        let Action::Proxy(p) = &route.action else {
            unreachable!()
        };
        assert_eq!(p.backends[0].backend, want);
        assert_eq!(p.backends[1].backend, "app/plain:80");
        assert!(matches!(&route.filters[0], Filter::Mirror(m) if m.backend == want));
        let v = backends.get(want).unwrap();
        let tls = v.tls.as_ref().unwrap();
        assert_eq!(tls.client_cert, Some(PemSource::Pem(cc().cert)));
        assert_eq!(tls.client_key, Some(PemSource::Pem(cc().key)));
        // The original stays for Gateways without a client certificate.
        assert!(backends.get("app/secure:443~https").unwrap().tls.is_none());
    }
}
