//! BackendTLSPolicy: TLS towards Services (CA bundle from ConfigMaps `ca.crt`, SNI from
//! `validation.hostname`, subjectAltNames of type Hostname and URI), and the policy's status per Gateway it takes effect
//! through.

use super::listeners::{Problem, GROUP};
use crate::translate::status::{
    Condition, ObjectKey, ObjectStatus, ParentRef, PolicyStatus, RouteParentStatus,
};
use crate::translate::Builder;
use std::collections::{BTreeMap, BTreeSet};
use sweety_config::{BackendTls, PemSource};
use sweety_gateway_api::backendtlspolicies::{
    BackendTlsPolicy, BackendTlsPolicyValidationSubjectAltNamesType as SanType,
};

/// One validated policy target.
#[derive(Clone, Debug)]
pub struct Target {
    /// Policy `namespace/name`.
    pub policy: (String, String),
    /// Service port name (`sectionName`), or None for every port.
    pub section: Option<String>,
    /// The TLS settings, or why the policy cannot be applied.
    pub tls: Result<BackendTls, Problem>,
    /// An older policy (creation time, then namespace/name) already targets the same Service
    /// and section: this one is not applied.
    pub conflicted: bool,
}

/// Policies by target Service `(namespace, name)`, plus the Gateways each policy reached.
#[derive(Default)]
pub struct Policies {
    targets: BTreeMap<(String, String), Vec<Target>>,
    /// policy → Gateways (namespace, name) whose routes use a targeted Service.
    pub used_by: BTreeMap<(String, String), BTreeSet<(String, String)>>,
    /// The SweetySecurityPolicies (`super::security`).
    pub security: super::security::SecurityPolicies,
}

impl Policies {
    /// Every policy (namespace, name) that targets a Service.
    pub fn all_for(&self, ns: &str, svc: &str) -> Vec<(String, String)> {
        let list = self.targets.get(&(ns.to_string(), svc.to_string()));
        list.into_iter()
            .flatten()
            .map(|t| t.policy.clone())
            .collect()
    }

    /// The policy for a Service port: one naming the port wins over one for the whole Service;
    /// among equals the oldest-named (sorted) policy wins.
    pub fn lookup(&self, ns: &str, svc: &str, port_name: Option<&str>) -> Option<&Target> {
        let list = self.targets.get(&(ns.to_string(), svc.to_string()))?;
        let list = || list.iter().filter(|t| !t.conflicted);
        list()
            .find(|t| t.section.is_some() && t.section.as_deref() == port_name)
            .or_else(|| list().find(|t| t.section.is_none()))
    }
}

/// Validate every BackendTLSPolicy.
pub(super) fn collect(b: &Builder<'_>) -> Policies {
    let mut out = Policies::default();
    let mut policies: Vec<&BackendTlsPolicy> = b
        .snapshot
        .backend_tls_policies
        .iter()
        .map(|p| &**p)
        .collect();
    // Oldest first: on a conflict the older policy wins (then namespace/name order).
    policies.sort_by_cached_key(|p| super::routes::meta_key(&p.metadata));
    for p in policies {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let name = p.metadata.name.clone().unwrap_or_default();
        let tls = tls_of(b, &ns, p);
        for t in &p.spec.target_refs {
            if !t.group.is_empty() || t.kind != "Service" {
                continue;
            }
            let list = out.targets.entry((ns.clone(), t.name.clone())).or_default();
            let conflicted = list
                .iter()
                .any(|o| !o.conflicted && o.section == t.section_name);
            list.push(Target {
                policy: (ns.clone(), name.clone()),
                section: t.section_name.clone(),
                tls: tls.clone(),
                conflicted,
            });
        }
    }
    out
}

fn tls_of(b: &Builder<'_>, ns: &str, p: &BackendTlsPolicy) -> Result<BackendTls, Problem> {
    let v = &p.spec.validation;
    let refs = v.ca_certificate_refs.as_deref().unwrap_or_default();
    if v.well_known_ca_certificates.is_some() && refs.is_empty() {
        return Err((
            "Invalid",
            "wellKnownCACertificates is not supported; give caCertificateRefs".into(),
        ));
    }
    if refs.is_empty() {
        return Err(("InvalidCACertificateRef", "no caCertificateRefs".into()));
    }
    let mut bundle = String::new();
    for r in refs {
        if !r.group.is_empty() || r.kind != "ConfigMap" {
            return Err((
                "InvalidKind",
                format!(
                    "caCertificateRef {}/{} {} is not a ConfigMap",
                    r.group, r.kind, r.name
                ),
            ));
        }
        let ca = b
            .snapshot
            .config_map_ca(ns, &r.name)
            .flatten()
            .filter(|pem| pem.contains("-----BEGIN CERTIFICATE-----"));
        match ca {
            Some(pem) => {
                bundle.push_str(pem);
                if !pem.ends_with('\n') {
                    bundle.push('\n');
                }
            }
            None => {
                return Err((
                    "InvalidCACertificateRef",
                    format!("ConfigMap {ns}/{} has no PEM certificate in ca.crt", r.name),
                ))
            }
        }
    }
    let mut sans = Vec::new();
    for san in p.spec.validation.subject_alt_names.iter().flatten() {
        let value = match san.r#type {
            SanType::Hostname => &san.hostname,
            SanType::Uri => &san.uri,
        };
        match (&san.r#type, value) {
            (SanType::Hostname, Some(h)) => sans.push(h.clone()),
            // The dataplane tells URI SANs (`spiffe://…`) from names by their `://`.
            (SanType::Uri, Some(u)) if u.contains("://") => sans.push(u.clone()),
            (SanType::Hostname, None) => {
                return Err((
                    "Invalid",
                    "a subjectAltName of type Hostname needs hostname".into(),
                ))
            }
            (SanType::Uri, _) => {
                return Err((
                    "Invalid",
                    "a subjectAltName of type URI needs an absolute uri (scheme://…)".into(),
                ))
            }
        }
    }
    let tls = BackendTls {
        ca: Some(PemSource::Pem(bundle)),
        sni: Some(v.hostname.clone()),
        subject_alt_names: sans,
        ..Default::default()
    };
    // sweety-config's own checks (PEM blocks, SNI and SAN names): a bad policy fails alone.
    let mut cfg = sweety_config::Config::default();
    let mut backend = sweety_config::Backend::new("check", Vec::new());
    backend.protocol = sweety_config::BackendProtocol::Https;
    backend.tls = Some(tls.clone());
    cfg.backends.push(backend);
    if let Err(e) = cfg.validate_structure() {
        let why: Vec<String> = e.0.iter().map(|e| e.to_string()).collect();
        let reason = if why.iter().any(|w| w.contains(".ca")) {
            "InvalidCACertificateRef"
        } else {
            "Invalid"
        };
        return Err((reason, why.join("; ")));
    }
    Ok(tls)
}

/// Write the status of every policy that a Gateway of ours reached.
pub(super) fn statuses(b: &mut Builder<'_>, policies: &Policies) {
    let mut by_policy: BTreeMap<(String, String), Result<(), Problem>> = BTreeMap::new();
    for list in policies.targets.values() {
        for t in list {
            let entry = by_policy.entry(t.policy.clone()).or_insert(Ok(()));
            if t.conflicted {
                *entry = Err((
                    "Conflicted",
                    "an older BackendTLSPolicy targets the same Service and section".into(),
                ));
            } else if let (Ok(()), Err(e)) = (&entry, &t.tls) {
                *entry = Err(e.clone());
            }
        }
    }
    for ((ns, name), result) in by_policy {
        let Some(gateways) = policies.used_by.get(&(ns.clone(), name.clone())) else {
            continue;
        };
        let generation = b
            .snapshot
            .backend_tls_policies
            .iter()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(&ns)
                    && p.metadata.name.as_deref() == Some(&name)
            })
            .and_then(|p| p.metadata.generation)
            .unwrap_or(0);
        let conditions = match &result {
            Ok(()) => vec![
                Condition::new("Accepted", true, "Accepted", "policy applied", generation),
                Condition::new(
                    "ResolvedRefs",
                    true,
                    "ResolvedRefs",
                    "CA certificates resolved",
                    generation,
                ),
            ],
            Err((reason, msg)) if *reason == "Conflicted" => vec![
                Condition::new("Accepted", false, "Conflicted", msg.clone(), generation),
                Condition::new(
                    "ResolvedRefs",
                    true,
                    "ResolvedRefs",
                    "not applied: conflicted",
                    generation,
                ),
            ],
            Err((reason, msg)) if *reason == "Invalid" => vec![
                Condition::new("Accepted", false, "Invalid", msg.clone(), generation),
                Condition::new(
                    "ResolvedRefs",
                    true,
                    "ResolvedRefs",
                    "no references to resolve",
                    generation,
                ),
            ],
            Err((reason, msg)) => vec![
                Condition::new(
                    "Accepted",
                    false,
                    "NoValidCACertificate",
                    msg.clone(),
                    generation,
                ),
                Condition::new("ResolvedRefs", false, reason, msg.clone(), generation),
            ],
        };
        let ancestors = gateways
            .iter()
            .map(|(gns, gname)| RouteParentStatus {
                parent_ref: ParentRef {
                    group: Some(GROUP.into()),
                    kind: Some("Gateway".into()),
                    namespace: Some(gns.clone()),
                    name: gname.clone(),
                    ..Default::default()
                },
                controller_name: b.params.controller_name.clone(),
                conditions: conditions.clone(),
            })
            .collect();
        b.status(
            ObjectKey::new("BackendTLSPolicy", &ns, &name),
            ObjectStatus::Policy(PolicyStatus { ancestors }),
        );
    }
}
