//! `sweety-controller migrate-report`: before traffic moves from ingress-nginx, what Sweety
//! would do with every Ingress of the cluster (any class), annotation by annotation: honoured,
//! honoured differently (how), refused and failing closed, or ignored. Read-only: it lists
//! Ingresses and reads the Secrets their `auth-secret`, `auth-tls-secret` and `proxy-ssl-secret`
//! name, and writes nothing.
//!
//! The verdicts come from the translator itself: the row of
//! [`crate::translate::ingress::nginx::ANNOTATIONS`] (the table the
//! translator's fail-closed rule and the docs use) plus what
//! `Annotations::parse` reports for this Ingress's values (an invalid value, a missing Secret:
//! that annotation then fails closed here too).

use crate::translate::ingress::nginx::{self, annotation_spec, Support, PREFIX};
use crate::translate::ingress::Report;
use crate::translate::Params;
use crate::Error;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::ListParams;
use kube::{Api, Client};
use serde::Serialize;
use std::sync::Arc;

/// Longest annotation value shown.
const MAX_VALUE_CHARS: usize = 80;

/// What Sweety would do with one Ingress.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IngressReport {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.ingressClassName` or the legacy annotation.
    pub class: Option<String>,
    /// When every path of the Ingress would be refused: the status and answer.
    pub refused: Option<String>,
    /// One entry per `nginx.ingress.kubernetes.io/*` annotation, in name order.
    pub annotations: Vec<AnnotationReport>,
    /// Problems reading what the Ingress references (a Secret that cannot be read).
    pub notes: Vec<String>,
}

/// The verdict on one annotation of one Ingress.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AnnotationReport {
    /// The annotation name without the prefix.
    pub annotation: String,
    /// Its value (cut to 80 characters, control characters escaped).
    pub value: String,
    /// The verdict.
    pub support: Support,
    /// How it differs, or why it is refused or ignored.
    pub how: String,
    /// What the translator reported about this annotation's value.
    pub events: Vec<String>,
}

fn shown(v: &str) -> String {
    let escaped: String = v.escape_debug().collect();
    if escaped.chars().count() > MAX_VALUE_CHARS {
        let mut s: String = escaped.chars().take(MAX_VALUE_CHARS).collect();
        s.push('…');
        s
    } else {
        escaped
    }
}

/// The report of one Ingress, given the Secrets it references (pure).
pub fn ingress_report(ing: &Ingress, params: &Params, secrets: &[Arc<Secret>]) -> IngressReport {
    let mut report = Report::default();
    // The class's limit statuses change no verdict: the defaults do.
    let parsed = nginx::Annotations::parse(
        ing,
        params,
        &nginx::ClassSettings::default(),
        secrets,
        &mut report,
    );
    let refusal = parsed.refuse.as_ref();
    let mut annotations = Vec::new();
    for (key, value) in ing.metadata.annotations.iter().flatten() {
        let Some(name) = key.strip_prefix(PREFIX) else {
            continue;
        };
        let events: Vec<String> = report
            .conditions
            .iter()
            .filter(|c| c.message.contains(key.as_str()))
            .map(|c| format!("{}: {}", c.reason, c.message))
            .collect();
        let (mut support, how) = match annotation_spec(name) {
            Some(s) => (s.support, s.note.to_string()),
            None => (
                Support::IgnoredHarmless,
                "not an annotation Sweety reads".into(),
            ),
        };
        // This Ingress's value makes it fail closed (an invalid entry, a missing Secret).
        let answers = |e: &String| e.contains("answer 403") || e.contains("answer 503");
        if refusal.is_some() && events.iter().any(answers) {
            support = Support::RefusedFailClosed;
        }
        annotations.push(AnnotationReport {
            annotation: name.to_string(),
            value: shown(value),
            support,
            how,
            events,
        });
    }
    let class = ing
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.clone())
        .or_else(|| {
            ing.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::translate::ingress::LEGACY_CLASS_ANNOTATION))
                .cloned()
        });
    IngressReport {
        namespace: ing.metadata.namespace.clone().unwrap_or_default(),
        name: ing.metadata.name.clone().unwrap_or_default(),
        class,
        refused: refusal.map(|(status, body)| format!("{status}: {}", body.trim_end())),
        annotations,
        notes: Vec::new(),
    }
}

/// Read every Ingress (of `namespace`, or all) and the Secrets their annotations name
/// ([`nginx::secret_refs`]), and
/// report on each, ordered by namespace and name.
pub async fn collect(
    client: &Client,
    namespace: Option<&str>,
    params: &Params,
) -> Result<Vec<IngressReport>, Error> {
    let api: Api<Ingress> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut ingresses = api
        .list(&ListParams::default())
        .await
        .map_err(Error::Kube)?
        .items;
    ingresses.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let mut out = Vec::new();
    for ing in &ingresses {
        let ns = ing.metadata.namespace.clone().unwrap_or_default();
        let mut secrets = Vec::new();
        let mut notes = Vec::new();
        let secrets_api: Api<Secret> = Api::namespaced(client.clone(), &ns);
        for name in nginx::secret_refs(ing.metadata.annotations.as_ref(), &ns) {
            match secrets_api.get_opt(&name).await {
                Ok(Some(s)) => secrets.push(Arc::new(s)),
                Ok(None) => {}
                Err(e) => notes.push(format!("cannot read the Secret {ns}/{name}: {e}")),
            }
        }
        let mut r = ingress_report(ing, params, &secrets);
        r.notes = notes;
        out.push(r);
    }
    Ok(out)
}

/// The report as a plain-text table: one line per annotation.
pub fn table(reports: &[IngressReport]) -> String {
    let mut rows: Vec<[String; 5]> = vec![[
        "INGRESS".into(),
        "CLASS".into(),
        "ANNOTATION".into(),
        "SWEETY".into(),
        "HOW".into(),
    ]];
    for r in reports {
        let id = format!("{}/{}", r.namespace, r.name);
        let class = r.class.clone().unwrap_or_else(|| "-".into());
        if r.annotations.is_empty() {
            rows.push([
                id.clone(),
                class.clone(),
                "-".into(),
                "-".into(),
                String::new(),
            ]);
        }
        for a in &r.annotations {
            let mut how = a.how.clone();
            if let Some(e) = a.events.first() {
                how = if how.is_empty() {
                    e.clone()
                } else {
                    format!("{how}; {e}")
                };
            }
            rows.push([
                id.clone(),
                class.clone(),
                a.annotation.clone(),
                a.support.label().into(),
                how,
            ]);
        }
        if let Some(refused) = &r.refused {
            rows.push([
                id.clone(),
                class.clone(),
                "(whole Ingress)".into(),
                "refused (fail closed)".into(),
                refused.replace('\n', " "),
            ]);
        }
        for n in &r.notes {
            rows.push([
                id.clone(),
                class.clone(),
                "(note)".into(),
                String::new(),
                n.clone(),
            ]);
        }
    }
    let widths: Vec<usize> = (0..4)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        for (i, w) in widths.iter().enumerate() {
            out.push_str(&format!("{:<w$}  ", r[i], w = *w));
        }
        out.push_str(&r[4]);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_come_from_the_table_and_the_parser() {
        let ing: Ingress = serde_yaml::from_str(
            r#"
metadata:
  name: shop
  namespace: app
  annotations:
    nginx.ingress.kubernetes.io/rewrite-target: /
    nginx.ingress.kubernetes.io/auth-url: http://auth.example/verify
    nginx.ingress.kubernetes.io/auth-proxy-set-headers: app/auth-headers
    nginx.ingress.kubernetes.io/proxy-body-size: 8m
    nginx.ingress.kubernetes.io/whitelist-source-range: "office-vpn"
    nginx.ingress.kubernetes.io/x-made-up: "\u0007"
    nginx.ingress.kubernetes.io/ssl-passthrough: "true"
    kubernetes.io/ingress.class: nginx
"#,
        )
        .unwrap();
        let r = ingress_report(&ing, &Params::default(), &[]);
        assert_eq!(r.class.as_deref(), Some("nginx"));
        let verdict = |n: &str| {
            r.annotations
                .iter()
                .find(|a| a.annotation == n)
                .map(|a| a.support)
        };
        assert_eq!(
            verdict("rewrite-target"),
            Some(Support::HonouredDifferently)
        );
        assert_eq!(verdict("auth-url"), Some(Support::HonouredDifferently));
        assert_eq!(
            verdict("auth-proxy-set-headers"),
            Some(Support::RefusedFailClosed)
        );
        assert_eq!(verdict("proxy-body-size"), Some(Support::Honoured));
        // Honoured in general, but this value cannot be: it fails closed.
        assert_eq!(
            verdict("whitelist-source-range"),
            Some(Support::RefusedFailClosed)
        );
        assert_eq!(verdict("x-made-up"), Some(Support::IgnoredHarmless));
        // Honoured differently where the class allows it; the report reads it against a
        // class that does not (ingress-nginx's default too), where it fails closed.
        assert_eq!(
            annotation_spec("ssl-passthrough").map(|s| s.support),
            Some(Support::HonouredDifferently)
        );
        assert_eq!(verdict("ssl-passthrough"), Some(Support::RefusedFailClosed));
        assert_eq!(
            r.annotations
                .iter()
                .find(|a| a.annotation == "x-made-up")
                .unwrap()
                .value,
            "\\u{7}"
        );
        assert!(r.refused.as_deref().unwrap().starts_with("403: forbidden"));
        let t = table(std::slice::from_ref(&r));
        assert!(t.lines().count() >= 6, "{t}");
        assert!(t.contains("refused (fail closed)"));
    }
}
