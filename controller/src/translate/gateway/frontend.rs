//! Gateway `spec.tls.frontend`: client certificate validation (mutual TLS) for HTTPS
//! listeners. The configuration for a port is its `perPort` entry, else `default`; its
//! `caCertificateRefs` (ConfigMaps, or `kubernetes.io/tls` Secrets, with `ca.crt`; another
//! namespace needs a ReferenceGrant) become the listener's `client_auth` CA bundle.
//!
//! Invalid references set `ResolvedRefs: False` on every HTTPS listener of the port
//! (`InvalidCACertificateRef`, `InvalidCACertificateKind`, `RefNotPermitted`); when none is
//! valid the listeners are also not accepted (`NoValidCACertificate`) and not served, so no
//! client gets in without the validation the Gateway asked for.

use super::listeners::Problem;
use super::listeners::GROUP;
use super::refgrant::{self, Reference};
use crate::translate::snapshot::CA_KEY;
use crate::translate::Snapshot;
use sweety_config::{ClientAuth, ClientAuthMode, PemSource};
use sweety_gateway_api::gateways::{
    Gateway, GatewayTlsFrontendDefaultValidationMode as DefaultMode,
    GatewayTlsFrontendPerPortTlsValidationMode as PortMode,
};

/// The validation a port asks for, before its references are resolved.
struct Wanted {
    refs: Vec<CaRef>,
    fallback: bool,
}

struct CaRef {
    group: String,
    kind: String,
    name: String,
    namespace: Option<String>,
}

/// The outcome for one HTTPS port.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Frontend {
    /// What the dataplane listener verifies (None: no client certificate requested).
    pub auth: Option<ClientAuth>,
    /// The first invalid reference (for `ResolvedRefs: False`), also when others are valid.
    pub invalid_ref: Option<Problem>,
    /// Every reference is invalid: the port's HTTPS listeners are not accepted.
    pub none_valid: bool,
}

fn wanted(gw: &Gateway, port: u16) -> Option<Wanted> {
    let frontend = gw.spec.tls.as_ref()?.frontend.as_ref()?;
    let per_port = frontend
        .per_port
        .iter()
        .flatten()
        .find(|p| i64::from(p.port) == i64::from(port));
    if let Some(p) = per_port {
        let v = p.tls.validation.as_ref()?;
        return Some(Wanted {
            refs: v
                .ca_certificate_refs
                .iter()
                .map(|r| CaRef {
                    group: r.group.clone(),
                    kind: r.kind.clone(),
                    name: r.name.clone(),
                    namespace: r.namespace.clone(),
                })
                .collect(),
            fallback: v.mode == Some(PortMode::AllowInsecureFallback),
        });
    }
    let v = frontend.default.validation.as_ref()?;
    Some(Wanted {
        refs: v
            .ca_certificate_refs
            .iter()
            .map(|r| CaRef {
                group: r.group.clone(),
                kind: r.kind.clone(),
                name: r.name.clone(),
                namespace: r.namespace.clone(),
            })
            .collect(),
        fallback: v.mode == Some(DefaultMode::AllowInsecureFallback),
    })
}

/// True when the validation of `port` is in `AllowInsecureFallback` mode (the Gateway then has
/// the `InsecureFrontendValidationMode` condition).
pub(super) fn insecure_fallback(gw: &Gateway, port: u16) -> bool {
    wanted(gw, port).is_some_and(|w| w.fallback)
}

#[cfg(test)]
thread_local! {
    /// How many times [`resolve`] ran on this thread (tests check it runs once per port).
    pub static RESOLVE_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Resolve the client certificate validation of HTTPS `port` of `gw` (namespace `ns`).
pub(super) fn resolve(snapshot: &Snapshot, gw: &Gateway, ns: &str, port: u16) -> Frontend {
    #[cfg(test)]
    RESOLVE_CALLS.with(|c| c.set(c.get() + 1));
    let Some(w) = wanted(gw, port) else {
        return Frontend::default();
    };
    let mut out = Frontend::default();
    let mut bundle = String::new();
    for r in &w.refs {
        match ca_pem(snapshot, ns, r) {
            Ok(pem) => {
                bundle.push_str(pem.trim_end());
                bundle.push('\n');
            }
            Err(p) => {
                out.invalid_ref.get_or_insert(p);
            }
        }
    }
    if bundle.is_empty() {
        out.none_valid = true;
        out.invalid_ref
            .get_or_insert(("InvalidCACertificateRef", "no caCertificateRefs".into()));
        return out;
    }
    out.auth = Some(ClientAuth {
        ca: PemSource::Pem(bundle),
        mode: if w.fallback {
            ClientAuthMode::AllowInsecureFallback
        } else {
            ClientAuthMode::Require
        },
    });
    out
}

/// The PEM bundle of one reference, checked by sweety-config like the dataplane will.
fn ca_pem(snapshot: &Snapshot, ns: &str, r: &CaRef) -> Result<String, Problem> {
    let target_ns = r.namespace.as_deref().unwrap_or(ns);
    let kind = match (r.group.as_str(), r.kind.as_str()) {
        ("", "ConfigMap") => "ConfigMap",
        ("", "Secret") => "Secret",
        (g, k) => {
            let gk = if g.is_empty() {
                k.to_string()
            } else {
                format!("{k}.{g}")
            };
            return Err((
                "InvalidCACertificateKind",
                format!(
                    "caCertificateRef {gk} {target_ns}/{} is not a ConfigMap or Secret",
                    r.name
                ),
            ));
        }
    };
    let grant = Reference {
        from_group: GROUP,
        from_kind: "Gateway",
        from_namespace: ns,
        to_group: "",
        to_kind: kind,
        to_namespace: target_ns,
        to_name: &r.name,
    };
    if !refgrant::permitted(snapshot, &grant) {
        return Err((
            "RefNotPermitted",
            format!(
                "{kind} {target_ns}/{} is in another namespace and no ReferenceGrant allows it",
                r.name
            ),
        ));
    }
    let same = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.namespace.as_deref() == Some(target_ns) && m.name.as_deref() == Some(r.name.as_str())
    };
    let found = if kind == "ConfigMap" {
        snapshot
            .config_map_ca(target_ns, &r.name)
            .map(|ca| ca.map(String::from))
    } else {
        snapshot
            .secrets
            .iter()
            .find(|s| same(&s.metadata))
            .map(|s| {
                s.data
                    .as_ref()
                    .and_then(|d| d.get(CA_KEY))
                    .and_then(|v| String::from_utf8(v.0.clone()).ok())
            })
    };
    let pem = match found {
        None => {
            return Err((
                "InvalidCACertificateRef",
                if kind == "Secret" {
                    format!(
                        "Secret {target_ns}/{} not found (only kubernetes.io/tls Secrets are read)",
                        r.name
                    )
                } else {
                    format!("{kind} {target_ns}/{} not found", r.name)
                },
            ))
        }
        Some(None) => {
            return Err((
                "InvalidCACertificateRef",
                format!("{kind} {target_ns}/{} has no ca.crt", r.name),
            ))
        }
        Some(Some(pem)) => pem,
    };
    check_ca(&pem).map_err(|why| {
        (
            "InvalidCACertificateRef",
            format!("{kind} {target_ns}/{} ca.crt: {why}", r.name),
        )
    })?;
    Ok(pem)
}

/// sweety-config's own PEM check, so a bad CA fails only its listeners.
fn check_ca(pem: &str) -> Result<(), String> {
    sweety_config::check_pem(pem, sweety_config::PemKind::Certificate)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = include_str!("../../../testdata/frontend-ca.pem");

    fn gateway(tls: &str, extra: &str) -> (Snapshot, Gateway) {
        let ca = CA.replace('\n', "\n    ");
        let text = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ca, namespace: app}}\ndata:\n  ca.crt: |\n    {ca}\n---\n{extra}apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw, namespace: app}}\nspec:\n  gatewayClassName: sweety\n  tls: {tls}\n  listeners:\n  - {{name: a, port: 443, protocol: HTTPS}}\n"
        );
        let (s, _) = Snapshot::from_yaml(&text).unwrap();
        let gw = (*s.gateways[0]).clone();
        (s, gw)
    }

    #[test]
    fn per_port_overrides_default_and_mode_is_kept() {
        let (s, gw) = gateway(
            "{frontend: {default: {validation: {caCertificateRefs: [{group: '', kind: ConfigMap, name: missing}]}}, perPort: [{port: 8443, tls: {validation: {mode: AllowInsecureFallback, caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}]}}}]}}",
            "",
        );
        let f = resolve(&s, &gw, "app", 8443);
        let auth = f.auth.unwrap();
        assert_eq!(auth.mode, ClientAuthMode::AllowInsecureFallback);
        assert!(matches!(auth.ca, PemSource::Pem(p) if p.contains("BEGIN CERTIFICATE")));
        assert!(f.invalid_ref.is_none() && !f.none_valid);
        assert!(insecure_fallback(&gw, 8443) && !insecure_fallback(&gw, 443));
        let f = resolve(&s, &gw, "app", 443);
        assert!(f.auth.is_none() && f.none_valid);
        assert_eq!(f.invalid_ref.unwrap().0, "InvalidCACertificateRef");
        assert_eq!(resolve(&s, &gw, "app", 443).auth, None);
    }

    #[test]
    fn invalid_kinds_grants_and_partial_validity() {
        let (s, gw) = gateway(
            "{frontend: {default: {validation: {caCertificateRefs: [{group: '', kind: Service, name: ca}]}}, perPort: [{port: 6443, tls: {validation: {caCertificateRefs: [{group: '', kind: ConfigMap, name: ca, namespace: other}]}}}, {port: 7443, tls: {validation: {caCertificateRefs: [{group: '', kind: ConfigMap, name: nope}, {group: '', kind: ConfigMap, name: ca}]}}}]}}",
            "",
        );
        let f = resolve(&s, &gw, "app", 443);
        assert!(f.none_valid);
        assert_eq!(f.invalid_ref.unwrap().0, "InvalidCACertificateKind");
        let f = resolve(&s, &gw, "app", 6443);
        assert!(f.none_valid);
        assert_eq!(f.invalid_ref.unwrap().0, "RefNotPermitted");
        // One of two valid: validation is on with the valid CA; ResolvedRefs still says why.
        let f = resolve(&s, &gw, "app", 7443);
        assert!(!f.none_valid && f.auth.is_some());
        assert_eq!(f.invalid_ref.unwrap().0, "InvalidCACertificateRef");
        // No frontend config at all: nothing requested.
        let (s, gw) = gateway("{}", "");
        assert_eq!(resolve(&s, &gw, "app", 443), Frontend::default());
    }
}
