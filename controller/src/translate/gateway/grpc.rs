//! GRPCRoute: method matches become HTTP path matches on `/service/method` (exact or RE2
//! regex), header matches carry over; filters and backends are handled as for HTTPRoute with
//! h2c as the default backend protocol.

use super::model::{GrpcRuleSpec, HttpMatchSpec, HttpRuleSpec, PathMatchSpec};

use crate::translate::regex_escape as escape;

/// Convert a GRPCRoute rule into the HTTPRoute rule shape.
pub(super) fn to_http(rule: &GrpcRuleSpec) -> HttpRuleSpec {
    let matches = rule
        .matches
        .iter()
        .map(|m| {
            let path = m.method.as_ref().map(|mm| {
                let regex = mm.type_.as_deref() == Some("RegularExpression");
                let part = |v: &Option<String>| match v {
                    Some(v) if regex => format!("(?:{v})"),
                    Some(v) => escape(v),
                    None => "[^/]+".to_string(),
                };
                match (&mm.service, &mm.method, regex) {
                    (Some(s), Some(me), false) => PathMatchSpec {
                        type_: Some("Exact".into()),
                        value: Some(format!("/{s}/{me}")),
                    },
                    _ => PathMatchSpec {
                        type_: Some("RegularExpression".into()),
                        value: Some(format!("/{}/{}", part(&mm.service), part(&mm.method))),
                    },
                }
            });
            HttpMatchSpec {
                path,
                headers: m.headers.clone(),
                query_params: Vec::new(),
                method: None,
            }
        })
        .collect();
    HttpRuleSpec {
        name: rule.name.clone(),
        matches,
        filters: rule.filters.clone(),
        backend_refs: rule.backend_refs.clone(),
        timeouts: None,
        retry: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::gateway::model::{GrpcMatchSpec, GrpcMethodSpec};

    fn method(t: Option<&str>, s: Option<&str>, m: Option<&str>) -> String {
        let rule = GrpcRuleSpec {
            matches: vec![GrpcMatchSpec {
                method: Some(GrpcMethodSpec {
                    type_: t.map(Into::into),
                    service: s.map(Into::into),
                    method: m.map(Into::into),
                }),
                headers: Vec::new(),
            }],
            ..Default::default()
        };
        let p = to_http(&rule).matches[0].path.clone().unwrap();
        format!("{} {}", p.type_.unwrap(), p.value.unwrap())
    }

    #[test]
    fn method_matches_become_paths() {
        assert_eq!(
            method(None, Some("pkg.Svc"), Some("Get")),
            "Exact /pkg.Svc/Get"
        );
        assert_eq!(
            method(None, Some("pkg.Svc"), None),
            r"RegularExpression /pkg\.Svc/[^/]+"
        );
        assert_eq!(
            method(None, None, Some("Get")),
            "RegularExpression /[^/]+/Get"
        );
        assert_eq!(
            method(Some("RegularExpression"), Some("pkg\\..*"), Some("Get|Put")),
            "RegularExpression /(?:pkg\\..*)/(?:Get|Put)"
        );
    }
}
