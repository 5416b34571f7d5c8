//! Sweety's custom resources: `SweetySite` (a whole site in one object),
//! `SweetyProxyConfig` (dataplane settings a GatewayClass points at through `parametersRef`)
//! and `SweetySecurityPolicy` (authentication, client certificates and IP rules attached to
//! Gateways and HTTPRoutes).
//!
//! The CRD YAML in `charts/sweety/crds/` is generated from these types by the `crdgen` binary
//! (`cargo run -p sweety-crds --bin crdgen`); the `crd_drift` test fails when the committed YAML
//! is stale.

pub mod proxy_config;
pub mod security_policy;
pub mod site;

use kube::CustomResourceExt;
pub use proxy_config::{SweetyProxyConfig, SweetyProxyConfigSpec};
pub use security_policy::{
    SweetySecurityPolicy, SweetySecurityPolicySpec, SweetySecurityPolicyStatus,
};
pub use site::{SweetySite, SweetySiteSpec, SweetySiteStatus};

/// The API group of every Sweety resource.
pub const GROUP: &str = "sweety.dev";

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A CRD could not be rendered as YAML.
    #[error("rendering the {kind} CRD as YAML")]
    Render {
        /// The CRD's kind, as named in the error message.
        kind: &'static str,
        /// What serde_yaml reported.
        #[source]
        source: serde_yaml::Error,
    },
}

/// Header written at the top of every generated CRD file.
pub const GENERATED_HEADER: &str =
    "# Generated from crds/src by `cargo run -p sweety-crds --bin crdgen`. Do not edit.\n";

/// Every CRD as `(file name, YAML text)`, in a fixed order.
pub fn crd_files() -> Result<Vec<(&'static str, String)>, Error> {
    let render = |kind: &'static str, crd| {
        serde_yaml::to_string(&crd)
            .map(|y| format!("{GENERATED_HEADER}{y}"))
            .map_err(|source| Error::Render { kind, source })
    };
    Ok(vec![
        ("sweetysites.yaml", render("SweetySite", SweetySite::crd())?),
        (
            "sweetyproxyconfigs.yaml",
            render("SweetyProxyConfig", SweetyProxyConfig::crd())?,
        ),
        (
            "sweetysecuritypolicies.yaml",
            render("SweetySecurityPolicy", SweetySecurityPolicy::crd())?,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Every CEL rule (`x-kubernetes-validations[].rule`) anywhere in a CRD.
    fn rules(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Array(list)) = m.get("x-kubernetes-validations") {
                    for r in list {
                        out.push(r["rule"].as_str().unwrap_or_default().to_string());
                    }
                }
                m.values().for_each(|x| rules(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| rules(x, out)),
            _ => {}
        }
    }

    #[test]
    fn site_crd_carries_the_cel_rules() {
        let crd = serde_json::to_value(SweetySite::crd()).unwrap();
        let mut found = Vec::new();
        rules(&crd, &mut found);
        for needle in [
            "[has(self.static), has(self.proxy), has(self.redirect)].filter(x, x).size() == 1",
            "self.startsWith('/')",
            "self in [301, 302, 303, 307, 308]",
            "has(self.configMap) != has(self.directory)",
            "self.exists(b, !has(b.weight) || b.weight > 0)",
        ] {
            assert!(
                found.iter().any(|r| r == needle),
                "rule {needle:?} missing; found {found:?}"
            );
        }
        let text = serde_json::to_string(&crd).unwrap();
        assert!(
            text.contains(r#""minItems":1"#),
            "hostnames must be non-empty"
        );
        let version = &crd["spec"]["versions"][0];
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(columns, ["Hosts", "Programmed", "Age"]);
        assert_eq!(version["subresources"]["status"], serde_json::json!({}));
    }

    #[test]
    fn proxy_config_crd_has_service_rule_and_enums() {
        let crd = serde_json::to_value(SweetyProxyConfig::crd()).unwrap();
        let mut found = Vec::new();
        rules(&crd, &mut found);
        // The Service rule and tracing's samplingFraction rule.
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().any(|r| r.contains("externalTrafficPolicy")));
        assert!(found.iter().any(|r| r.contains("self.numerator <=")));
        let text = serde_json::to_string(&crd).unwrap();
        for v in ["LoadBalancer", "NodePort", "ClusterIP", "json", "text"] {
            assert!(text.contains(&format!("\"{v}\"")), "enum value {v} missing");
        }
    }

    #[test]
    fn security_policy_crd_has_its_rules_status_and_example() {
        let crd = serde_json::to_value(SweetySecurityPolicy::crd()).unwrap();
        let mut found = Vec::new();
        rules(&crd, &mut found);
        assert!(
            found
                .iter()
                .any(|r| r.contains("has(self.extAuth) || has(self.basicAuth)")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|r| r == "self.startsWith('/')"),
            "{found:?}"
        );
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["subresources"]["status"], serde_json::json!({}));
        let schema = &version["schema"]["openAPIV3Schema"]["properties"];
        let target = &schema["spec"]["properties"]["targetRefs"];
        assert_eq!(target["minItems"], 1);
        let ancestor = &schema["status"]["properties"]["ancestors"]["items"]["properties"];
        for field in ["ancestorRef", "controllerName", "conditions"] {
            assert!(
                ancestor.get(field).is_some(),
                "status.ancestors[].{field} missing"
            );
        }
        let text = serde_json::to_string(&crd).unwrap();
        for v in ["Require", "Optional", "OptionalNoCA"] {
            assert!(text.contains(&format!("\"{v}\"")), "mode {v} missing");
        }
        let p: SweetySecurityPolicy = serde_yaml::from_str(
            r#"
apiVersion: sweety.dev/v1alpha1
kind: SweetySecurityPolicy
metadata: {name: auth, namespace: app}
spec:
  targetRefs:
  - {group: gateway.networking.k8s.io, kind: Gateway, name: gw, sectionName: https}
  - {group: gateway.networking.k8s.io, kind: HTTPRoute, name: web}
  extAuth:
    backendRef: {name: oauth2-proxy, port: 4180}
    path: /oauth2/auth
    headersToBackend: [X-Auth-Request-User]
    signinURL: "https://auth.example.com/oauth2/start"
  basicAuth: {secretRef: {name: htpasswd}, realm: Staff}
  clientCertificate:
    caCertificateRefs: [{kind: ConfigMap, name: client-ca}]
    mode: OptionalNoCA
    passCertificateToUpstream: true
  ipRules: {allow: [10.0.0.0/8], deny: [10.9.0.0/16]}
"#,
        )
        .unwrap();
        let s = &p.spec;
        assert_eq!(s.target_refs[0].section_name.as_deref(), Some("https"));
        assert_eq!(s.ext_auth.as_ref().unwrap().backend_ref.port, 4180);
        assert_eq!(
            s.client_certificate.as_ref().unwrap().mode,
            security_policy::ClientCertificateMode::OptionalNoCA
        );
        assert_eq!(s.ip_rules.as_ref().unwrap().deny, ["10.9.0.0/16"]);
    }

    const SITE: &str = r#"
apiVersion: sweety.dev/v1alpha1
kind: SweetySite
metadata: {name: www, namespace: web}
spec:
  hostnames: [www.example.com, "*.example.org"]
  tls: {secretName: www-tls}
  http3: false
  preset: spa
  routes:
  - path: /
    static: {configMap: {name: www-content}}
  - path: /assets
    static: {directory: /srv/assets}
  - path: /api
    proxy:
      backends:
      - {service: api, port: 80, weight: 90}
      - {service: api-canary, port: 80, weight: 10}
  - path: /old
    pathType: Exact
    redirect: {url: "https://new.example.com/", statusCode: 301}
  compression: {enabled: true, minimumSize: 1024}
  cache: {ttlSeconds: 60}
  rateLimit: {requestsPerSecond: 10, burst: 20}
  responseHeaders:
    set: [{name: X-Frame-Options, value: DENY}]
    remove: [Server]
"#;

    #[test]
    fn example_site_deserializes() {
        let site: SweetySite = serde_yaml::from_str(SITE).unwrap();
        let s = &site.spec;
        assert_eq!(s.hostnames.len(), 2);
        assert_eq!(s.preset, Some(site::Preset::Spa));
        assert_eq!(s.routes.len(), 4);
        assert_eq!(
            s.routes[0]
                .r#static
                .as_ref()
                .unwrap()
                .config_map
                .as_ref()
                .unwrap()
                .name,
            "www-content"
        );
        assert_eq!(
            s.routes[2].proxy.as_ref().unwrap().backends[1].weight,
            Some(10)
        );
        assert_eq!(s.routes[3].path_type, site::PathType::Exact);
        assert_eq!(
            s.routes[3].redirect.as_ref().unwrap().status_code,
            Some(301)
        );
        assert_eq!(s.rate_limit.as_ref().unwrap().burst, Some(20));
        assert_eq!(s.response_headers.as_ref().unwrap().remove, ["Server"]);
    }

    #[test]
    fn example_proxy_config_deserializes() {
        let pc: SweetyProxyConfig = serde_yaml::from_str(
            r#"
apiVersion: sweety.dev/v1alpha1
kind: SweetyProxyConfig
metadata: {name: default, namespace: sweety}
spec:
  limits: {maxConnections: 10000, maxRequestsInFlight: 5000, maxRequestBodyBytes: 1048576, headerReadTimeout: 10s, idleTimeout: 2m}
  http3: true
  logging: {accessLog: true, format: text}
  clientIp: {trustedProxies: [10.0.0.0/8], forwardedForDepth: 2}
  service: {type: NodePort, externalTrafficPolicy: Local}
"#,
        )
        .unwrap();
        let spec = &pc.spec;
        assert_eq!(spec.limits.as_ref().unwrap().max_connections, Some(10000));
        assert_eq!(
            spec.logging.as_ref().unwrap().format,
            Some(proxy_config::LogFormat::Text)
        );
        let ip = spec.client_ip.as_ref().unwrap();
        assert_eq!(
            ip.trusted_proxies.as_deref(),
            Some(&["10.0.0.0/8".to_string()][..])
        );
        assert_eq!(ip.forwarded_for_depth, Some(2));
        let svc = spec.service.as_ref().unwrap();
        assert_eq!(svc.type_, Some(proxy_config::ServiceType::NodePort));
        assert_eq!(
            svc.external_traffic_policy,
            Some(proxy_config::ExternalTrafficPolicy::Local)
        );
    }
}
