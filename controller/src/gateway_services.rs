//! Per-Gateway Services: each Gateway gets a controller-owned Service in the controller's
//! namespace that maps its listener ports to the dataplane container ports `translate`
//! allocated, selecting the dataplane pods. Created and updated with server-side apply (only
//! when they differ from what the cluster has); owned Services whose Gateway is gone are deleted.
//!
//! Ownership is by label: `app.kubernetes.io/managed-by: sweety` plus the Gateway's namespace
//! and name labels (values longer than 63 characters are shortened with a hash suffix). The
//! Service also carries the standard `gateway.networking.k8s.io/gateway-name` label and the
//! Gateway's `spec.infrastructure` labels and annotations (e.g. load-balancer annotations of a
//! cloud provider); ours win where a key clashes.

use crate::translate::GatewayService;
use crate::Error;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "sweety";
pub const GATEWAY_NAMESPACE_LABEL: &str = "sweety.dev/gateway-namespace";
pub const GATEWAY_NAME_LABEL: &str = "sweety.dev/gateway-name";
/// Annotation listing the Gateway `spec.infrastructure` keys set on the Service.
pub const INFRASTRUCTURE_KEYS: &str = "sweety.dev/infrastructure-keys";
/// The Gateway API's own label for resources created for a Gateway.
pub const STANDARD_GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";

/// What one sync did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub applied: Vec<String>,
    pub unchanged: usize,
    pub deleted: Vec<String>,
}

/// Keeps the per-Gateway Services in one namespace in line with `Output::gateway_services`.
pub struct GatewayServices {
    api: Api<Service>,
    selector: BTreeMap<String, String>,
    field_manager: String,
}

impl GatewayServices {
    /// `selector` picks the dataplane pods (e.g. `app.kubernetes.io/name: sweety`).
    pub fn new(
        client: Client,
        namespace: &str,
        selector: BTreeMap<String, String>,
        field_manager: &str,
    ) -> Self {
        GatewayServices {
            api: Api::namespaced(client, namespace),
            selector,
            field_manager: field_manager.into(),
        }
    }

    /// Apply every desired Service that differs from the cluster's and delete owned ones that
    /// are no longer desired.
    pub async fn sync(&self, desired: &[GatewayService]) -> Result<SyncReport, Error> {
        let owned = self
            .api
            .list(&ListParams::default().labels(&format!(
                "{MANAGED_BY_LABEL}={MANAGED_BY},{GATEWAY_NAME_LABEL}"
            )))
            .await
            .map_err(Error::Kube)?;
        let mut existing: BTreeMap<String, Service> = owned
            .items
            .into_iter()
            .filter_map(|s| Some((s.metadata.name.clone()?, s)))
            .collect();
        let mut report = SyncReport::default();
        for d in desired {
            let want = self.service(d);
            let current = existing.remove(&d.name);
            if current.as_ref().is_some_and(|c| same(c, &want)) {
                report.unchanged += 1;
                continue;
            }
            self.api
                .patch(
                    &d.name,
                    &PatchParams::apply(&self.field_manager).force(),
                    &Patch::Apply(&want),
                )
                .await
                .map_err(Error::Kube)?;
            report.applied.push(d.name.clone());
        }
        for name in existing.into_keys() {
            match self.api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => report.deleted.push(name),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Error::Kube(e)),
            }
        }
        Ok(report)
    }

    /// The Service we want for one Gateway.
    pub fn service(&self, d: &GatewayService) -> Service {
        let mut labels = d.labels.clone();
        labels.extend([
            (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
            (
                GATEWAY_NAMESPACE_LABEL.to_string(),
                label_value(&d.gateway_namespace),
            ),
            (GATEWAY_NAME_LABEL.to_string(), label_value(&d.gateway_name)),
            (
                STANDARD_GATEWAY_NAME_LABEL.to_string(),
                label_value(&d.gateway_name),
            ),
        ]);
        let mut annotations = d.annotations.clone();
        // Which infrastructure keys this apply sets: a key removed from the Gateway changes
        // this value, so the Service is applied again and server-side apply drops the key.
        let keys: Vec<String> = d
            .labels
            .keys()
            .map(|k| format!("label:{k}"))
            .chain(d.annotations.keys().map(|k| format!("annotation:{k}")))
            .collect();
        annotations.insert(INFRASTRUCTURE_KEYS.to_string(), keys.join(","));
        annotations.insert(
            "sweety.dev/gateway".to_string(),
            format!("{}/{}", d.gateway_namespace, d.gateway_name),
        );
        let load_balancer_ip = match d.requested_addresses.as_slice() {
            [one] if d.service_type == "LoadBalancer" => Some(one.clone()),
            _ => None,
        };
        Service {
            metadata: ObjectMeta {
                name: Some(d.name.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(d.service_type.clone()),
                selector: Some(self.selector.clone()),
                load_balancer_ip,
                ports: Some(
                    d.ports
                        .iter()
                        .map(|p| ServicePort {
                            name: Some(p.name.clone()),
                            protocol: Some(p.protocol.clone()),
                            port: p.port.into(),
                            target_port: Some(IntOrString::Int(p.target_port.into())),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }
}

/// Whether the cluster's Service already matches what we would apply (the fields we set).
fn same(current: &Service, want: &Service) -> bool {
    let subset = |want: &Option<BTreeMap<String, String>>,
                  have: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|l| l.get(k)).is_some_and(|c| c == v))
    };
    // Keys we no longer set show up as a changed INFRASTRUCTURE_KEYS annotation.
    let labels_match = subset(&want.metadata.labels, &current.metadata.labels)
        && subset(&want.metadata.annotations, &current.metadata.annotations);
    let (Some(c), Some(w)) = (&current.spec, &want.spec) else {
        return false;
    };
    let ports = |s: &ServiceSpec| -> Vec<(Option<String>, String, i32, Option<IntOrString>)> {
        let mut v: Vec<_> = s
            .ports
            .iter()
            .flatten()
            .map(|p| {
                (
                    p.name.clone(),
                    p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    p.port,
                    p.target_port.clone(),
                )
            })
            .collect();
        v.sort_by(|a, b| (a.2, &a.1).cmp(&(b.2, &b.1)));
        v
    };
    labels_match
        && c.type_.as_deref().unwrap_or("ClusterIP") == w.type_.as_deref().unwrap_or("ClusterIP")
        && c.selector == w.selector
        // Also when no address is wanted any more: the old request must go.
        && c.load_balancer_ip == w.load_balancer_ip
        && ports(c) == ports(w)
}

/// A valid label value: the input when it fits in 63 characters, else a prefix plus a hash.
pub fn label_value(s: &str) -> String {
    if s.len() <= 63 {
        return s.to_string();
    }
    let hash = Sha256::digest(s.as_bytes());
    let hex: String = hash[..5].iter().map(|b| format!("{b:02x}")).collect();
    let prefix: String = s.chars().take(52).collect();
    format!("{}-{hex}", prefix.trim_end_matches(['-', '.', '_']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_label_values_are_shortened_stably() {
        assert_eq!(label_value("short"), "short");
        let long = "a".repeat(100);
        let v = label_value(&long);
        assert!(v.len() <= 63, "{v}");
        assert_eq!(v, label_value(&long));
        assert_ne!(v, label_value(&"a".repeat(99)));
    }

    fn desired(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> GatewayService {
        let map = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        GatewayService {
            gateway_namespace: "apps".into(),
            gateway_name: "web".into(),
            name: "sweety-gw-apps-web".into(),
            service_type: "LoadBalancer".into(),
            ports: Vec::new(),
            requested_addresses: Vec::new(),
            labels: map(labels),
            annotations: map(annotations),
        }
    }

    #[tokio::test]
    async fn infrastructure_metadata_lands_on_the_service_and_removals_reapply() {
        // The client is never used: `service` and `same` are pure.
        let cfg = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(cfg).unwrap();
        let gs = GatewayServices::new(client, "sweety", BTreeMap::new(), "test");
        let with = gs.service(&desired(
            &[("team", "a"), (MANAGED_BY_LABEL, "someone-else")],
            &[("lb.example/internal", "true")],
        ));
        let labels = with.metadata.labels.clone().unwrap();
        assert_eq!(labels["team"], "a");
        assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY, "ours win");
        assert_eq!(labels[STANDARD_GATEWAY_NAME_LABEL], "web");
        let ann = with.metadata.annotations.clone().unwrap();
        assert_eq!(ann["lb.example/internal"], "true");
        assert_eq!(
            ann[INFRASTRUCTURE_KEYS],
            "label:app.kubernetes.io/managed-by,label:team,annotation:lb.example/internal"
        );
        assert!(same(&with, &with));
        // The Gateway dropped its infrastructure metadata: the cluster's copy no longer matches.
        let without = gs.service(&desired(&[], &[]));
        assert!(!same(&with, &without));
    }
}
