//! ReferenceGrant checks: may an object of (group, kind) in one namespace reference an object
//! of (group, kind, name) in another? Same-namespace references never need a grant.

use crate::translate::Snapshot;

/// A cross-namespace reference to check.
pub(super) struct Reference<'a> {
    pub from_group: &'a str,
    pub from_kind: &'a str,
    pub from_namespace: &'a str,
    pub to_group: &'a str,
    pub to_kind: &'a str,
    pub to_namespace: &'a str,
    pub to_name: &'a str,
}

/// True when the reference stays in its namespace or a ReferenceGrant in the target
/// namespace allows it.
pub(super) fn permitted(snapshot: &Snapshot, r: &Reference<'_>) -> bool {
    if r.from_namespace == r.to_namespace {
        return true;
    }
    snapshot.reference_grants.iter().any(|g| {
        g.metadata.namespace.as_deref() == Some(r.to_namespace)
            && g.spec.from.iter().any(|f| {
                f.group == r.from_group && f.kind == r.from_kind && f.namespace == r.from_namespace
            })
            && g.spec.to.iter().any(|t| {
                t.group == r.to_group
                    && t.kind == r.to_kind
                    && t.name.as_deref().is_none_or(|n| n == r.to_name)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference<'a>(to_name: &'a str, from_ns: &'a str) -> Reference<'a> {
        Reference {
            from_group: "gateway.networking.k8s.io",
            from_kind: "HTTPRoute",
            from_namespace: from_ns,
            to_group: "",
            to_kind: "Service",
            to_namespace: "backend",
            to_name,
        }
    }

    #[test]
    fn grant_by_kind_namespace_and_optional_name() {
        let (s, _) = Snapshot::from_yaml(
            r#"
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: g, namespace: backend}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: app}]
  to: [{group: "", kind: Service, name: web}]
"#,
        )
        .unwrap();
        assert!(permitted(&s, &reference("web", "app")));
        assert!(!permitted(&s, &reference("db", "app")), "name must match");
        assert!(!permitted(&s, &reference("web", "other")), "from namespace");
        assert!(
            permitted(&s, &reference("any", "backend")),
            "same namespace"
        );
    }
}
