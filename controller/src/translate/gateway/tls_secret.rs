//! A Gateway-side reference to a `kubernetes.io/tls` Secret (listener `certificateRefs`,
//! `spec.tls.backend.clientCertificateRef`): the kind check, the ReferenceGrant for another
//! namespace, the lookup, and the `tls.crt`/`tls.key` pair. Callers turn a [`RefError`] into
//! the condition reason and message of their field.

use super::listeners::{Problem, GROUP};
use super::refgrant::{self, Reference};
use crate::translate::Snapshot;

/// The parts of a `SecretObjectReference` (group, kind and namespace as written, or absent).
pub(super) struct SecretRef<'a> {
    pub group: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
}

/// Why a reference does not resolve.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum RefError {
    /// Not the core `Secret` kind; carries `group` and `kind` as the reference gave them.
    NotASecret { group: String, kind: String },
    /// In another namespace without a ReferenceGrant.
    NotPermitted,
    /// No such Secret among the `kubernetes.io/tls` Secrets the controller reads.
    NotFound,
    /// The Secret lacks `tls.crt` or `tls.key` (or they are not UTF-8).
    NoKeyPair,
}

impl RefError {
    /// The condition reason and message for the reference `field` (e.g. `certificateRef`) to
    /// Secret `namespace/name`; `invalid` is the field's reason for a bad reference.
    pub(super) fn problem(
        &self,
        field: &str,
        invalid: &'static str,
        namespace: &str,
        name: &str,
    ) -> Problem {
        match self {
            RefError::NotASecret { group, kind } => {
                let gk = if group.is_empty() {
                    kind.clone()
                } else {
                    format!("{kind}.{group}")
                };
                (
                    invalid,
                    format!("{field} {gk} {namespace}/{name} is not a Secret"),
                )
            }
            RefError::NotPermitted => (
                "RefNotPermitted",
                format!(
                    "Secret {namespace}/{name} is in another namespace and no ReferenceGrant allows it"
                ),
            ),
            RefError::NotFound => (
                invalid,
                format!("Secret {namespace}/{name} not found (only kubernetes.io/tls Secrets are read)"),
            ),
            RefError::NoKeyPair => (
                invalid,
                format!(
                    "Secret {namespace}/{name} has no PEM certificate in tls.crt and key in tls.key"
                ),
            ),
        }
    }
}

/// A resolved Secret: the PEM texts of its `tls.crt` and `tls.key`.
pub(super) struct TlsPair {
    pub cert: String,
    pub key: String,
}

/// Resolve `r`, written in a `from_kind` object of namespace `ns`.
pub(super) fn resolve(
    snapshot: &Snapshot,
    from_kind: &str,
    ns: &str,
    r: &SecretRef<'_>,
) -> Result<TlsPair, RefError> {
    let group = r.group.unwrap_or("");
    let kind = r.kind.unwrap_or("Secret");
    let secret_ns = r.namespace.unwrap_or(ns);
    if !group.is_empty() || kind != "Secret" {
        return Err(RefError::NotASecret {
            group: group.into(),
            kind: kind.into(),
        });
    }
    let grant = Reference {
        from_group: GROUP,
        from_kind,
        from_namespace: ns,
        to_group: "",
        to_kind: "Secret",
        to_namespace: secret_ns,
        to_name: r.name,
    };
    if !refgrant::permitted(snapshot, &grant) {
        return Err(RefError::NotPermitted);
    }
    let secret = snapshot
        .secrets
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref() == Some(secret_ns)
                && s.metadata.name.as_deref() == Some(r.name)
        })
        .ok_or(RefError::NotFound)?;
    let get = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
    };
    match (get("tls.crt"), get("tls.key")) {
        (Some(cert), Some(key)) => Ok(TlsPair { cert, key }),
        _ => Err(RefError::NoKeyPair),
    }
}
