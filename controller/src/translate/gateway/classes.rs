//! GatewayClass acceptance: classes naming our controller get `Accepted` and the list of
//! features the dataplane and `translate` really implement; other controllers' classes are
//! left alone (no status).

use crate::translate::status::{Condition, GatewayClassStatus, ObjectKey, ObjectStatus};
use crate::translate::{Builder, ClassOwner, GatewayServiceNamespace, Params};
use std::collections::BTreeMap;

/// Features we claim: exactly those whose conformance tests pass against the local cluster
/// (e2e/conformance/run.sh; docs/conformance.md has the latest report). Sorted. Unclaimed
/// features and why: e2e/conformance/unclaimed-features.txt. [`GATEWAY_NAMESPACE_ONLY`] is
/// left out unless the per-Gateway Services live in the Gateway's namespace.
pub(super) const SUPPORTED_FEATURES: &[&str] = &[
    "BackendTLSPolicy",
    "BackendTLSPolicySANValidation",
    "GRPCRoute",
    "GRPCRouteNamedRouteRule",
    "Gateway",
    "GatewayAddressEmpty",
    "GatewayBackendClientCertificate",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayHTTPListenerIsolation",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "GatewayInfrastructure",
    "GatewayPort8080",
    "GatewayStaticAddresses",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteCORS",
    "HTTPRouteDestinationPortMatching",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteRetry",
    "HTTPRouteRetryBackendTimeout",
    "HTTPRouteRetryConnectionError",
    "HTTPRouteSchemeRedirect",
    "ListenerSet",
    "ReferenceGrant",
    "TCPRoute",
    "TLSRoute",
    "TLSRouteModeMixed",
    "TLSRouteModeTerminate",
    "UDPRoute",
];

use crate::translate::proxy_settings::{
    self, GROUP as PROXY_CONFIG_GROUP, KIND as PROXY_CONFIG_KIND,
};

/// The Kubernetes spelling of a SweetyProxyConfig `service.type`.
fn service_type_name(t: sweety_crds::proxy_config::ServiceType) -> &'static str {
    use sweety_crds::proxy_config::ServiceType as T;
    match t {
        T::LoadBalancer => "LoadBalancer",
        T::NodePort => "NodePort",
        T::ClusterIP => "ClusterIP",
    }
}

/// The Kubernetes spelling of a SweetyProxyConfig `service.externalTrafficPolicy`.
fn traffic_policy_name(t: sweety_crds::proxy_config::ExternalTrafficPolicy) -> &'static str {
    use sweety_crds::proxy_config::ExternalTrafficPolicy as P;
    match t {
        P::Cluster => "Cluster",
        P::Local => "Local",
    }
}

/// One of our GatewayClasses.
#[derive(Clone, Debug, Default)]
pub struct ClassInfo {
    pub accepted: bool,
    /// HTTP/3 on HTTPS listeners, from the SweetyProxyConfig (None: `Params::http3`).
    pub http3: Option<bool>,
    /// Per-Gateway Service type from the SweetyProxyConfig (None: `Params::gateway_service_type`).
    pub service_type: Option<String>,
    /// Per-Gateway Service `externalTrafficPolicy` from the SweetyProxyConfig.
    pub external_traffic_policy: Option<String>,
    /// The class as the owner of the per-Gateway Services (None when it has no uid yet).
    pub owner: Option<ClassOwner>,
}

/// Set the status of our GatewayClasses; returns each of our classes by name.
pub(super) fn translate(b: &mut Builder<'_>) -> BTreeMap<String, ClassInfo> {
    let mut accepted = BTreeMap::new();
    let mut classes: Vec<_> = b.snapshot.gateway_classes.iter().collect();
    classes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for class in classes {
        if class.spec.controller_name != b.params.controller_name {
            continue;
        }
        let name = class.metadata.name.clone().unwrap_or_default();
        let generation = class.metadata.generation.unwrap_or(0);
        let mut http3 = None;
        let mut service = None;
        let problem = class.spec.parameters_ref.as_ref().and_then(|p| {
            if p.group != PROXY_CONFIG_GROUP || p.kind != PROXY_CONFIG_KIND {
                return Some(format!(
                    "parametersRef must be a {PROXY_CONFIG_KIND}.{PROXY_CONFIG_GROUP}, got {}.{}",
                    p.kind, p.group
                ));
            }
            let Some(ns) = p.namespace.as_deref() else {
                return Some(format!(
                    "parametersRef to {PROXY_CONFIG_KIND} needs a namespace"
                ));
            };
            match proxy_settings::find(b.snapshot, ns, &p.name) {
                Some(c) => {
                    http3 = c.spec.http3;
                    service = c.spec.service.clone();
                    None
                }
                None => Some(format!("{PROXY_CONFIG_KIND} {ns}/{} not found", p.name)),
            }
        });
        let condition = match &problem {
            None => Condition::new(
                "Accepted",
                true,
                "Accepted",
                "handled by the sweety controller",
                generation,
            ),
            Some(why) => Condition::new("Accepted", false, "InvalidParameters", why, generation),
        };
        accepted.insert(
            name.clone(),
            ClassInfo {
                accepted: problem.is_none(),
                http3,
                service_type: service
                    .as_ref()
                    .and_then(|s| s.type_)
                    .map(|t| service_type_name(t).to_string()),
                external_traffic_policy: service
                    .as_ref()
                    .and_then(|s| s.external_traffic_policy)
                    .map(|t| traffic_policy_name(t).to_string()),
                owner: class.metadata.uid.clone().map(|uid| ClassOwner {
                    name: name.clone(),
                    uid,
                }),
            },
        );
        b.status(
            ObjectKey::new("GatewayClass", "", &name),
            ObjectStatus::GatewayClass(GatewayClassStatus {
                conditions: vec![condition],
                supported_features: supported_features(b.params),
            }),
        );
    }
    accepted
}

/// Claimed only with `--gateway-service-namespace=gateway`: its conformance test looks for
/// the generated objects (a Service, Pod or ServiceAccount with the `gateway-name` label) in
/// the Gateway's namespace, where the default mode creates nothing (Envoy Gateway's default
/// mode does not claim it either).
pub(super) const GATEWAY_NAMESPACE_ONLY: &str = "GatewayInfrastructure";

/// The features GatewayClass status lists under these parameters.
pub(super) fn supported_features(params: &Params) -> Vec<String> {
    SUPPORTED_FEATURES
        .iter()
        .filter(|f| {
            **f != GATEWAY_NAMESPACE_ONLY
                || params.gateway_service_namespace == GatewayServiceNamespace::Gateway
        })
        .map(|s| s.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::SUPPORTED_FEATURES;

    #[test]
    fn features_sorted_and_unique() {
        let mut sorted = SUPPORTED_FEATURES.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, SUPPORTED_FEATURES);
        assert!(SUPPORTED_FEATURES.contains(&super::GATEWAY_NAMESPACE_ONLY));
    }

    #[test]
    fn infrastructure_is_claimed_only_with_services_in_the_gateway_namespace() {
        use crate::translate::{GatewayServiceNamespace, Params};
        let mut params = Params::default();
        let release = super::supported_features(&params);
        params.gateway_service_namespace = GatewayServiceNamespace::Gateway;
        let gateway = super::supported_features(&params);
        assert_eq!(gateway.len(), SUPPORTED_FEATURES.len());
        assert_eq!(release.len() + 1, gateway.len());
        assert!(!release.iter().any(|f| f == super::GATEWAY_NAMESPACE_ONLY));
    }
}
