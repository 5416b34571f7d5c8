//! Per-Gateway Services: each Gateway gets a controller-owned Service that maps its listener
//! ports to the dataplane container ports `translate` allocated. Where it lives is
//! `--gateway-service-namespace` ([`GatewayService::namespace`]):
//!
//! - `release` (default): in the controller's own namespace, as Envoy Gateway does by default
//!   (its proxy Services live in the controller's namespace, named after the Gateway's
//!   namespace and name and labelled with both). The dataplane Pods are there too, so the
//!   Service has a plain selector: the one of the chart's dataplane Service
//!   (`--ingress-service`), read from the cluster; the cluster's EndpointSlice controller keeps
//!   its endpoints. The controller writes Services in its own namespace only (a Role).
//! - `gateway`: in the Gateway's namespace (next to the Gateway). A selector cannot reach the
//!   dataplane Pods across namespaces, so the Service has none and the controller writes its
//!   EndpointSlices: they mirror the endpoints (addresses, readiness, node, Pod reference) of
//!   the EndpointSlices of the dataplane Service with the Gateway's container ports. This needs
//!   write access to Services and EndpointSlices in every Gateway namespace.
//!
//! Services and slices are created and updated with server-side apply, only when they differ
//! from what the cluster has, and only when they are ours: an object of the wanted name that
//! this installation did not make for this Gateway is never adopted or overwritten
//! ([`SyncReport::refused`]; translate refuses such a Gateway too,
//! [`crate::translate::addressing::is_service_of`]); owned ones that are no longer wanted where they are (Gateway
//! gone, or the setting changed) are deleted, and so are the Services an older release
//! created in the controller's namespace without an owner label. A stale one the controller
//! may not delete (a Gateway namespace after a switch to `release`: no write access there)
//! is reported in [`SyncReport::left`] and logged with the command that removes it.
//!
//! Both carry an ownerReference to the Gateway's GatewayClass, never to the Gateway: an owner
//! in another namespace is invalid, and a cluster-scoped one may own objects in any
//! namespace. When the class goes (`helm uninstall` deletes the chart's GatewayClass) the
//! garbage collector removes them even though no controller is left to do it; a deleted
//! Gateway's are deleted by the controller. The Service type is `--gateway-service-type`
//! unless the class's SweetyProxyConfig sets `service.type` (and
//! `service.externalTrafficPolicy`).
//!
//! Ownership is by label: `app.kubernetes.io/managed-by: sweety`, the Gateway's namespace and
//! name labels (values longer than 63 characters are shortened with a hash suffix) and
//! [`crate::labels::OWNER_LABEL`] = the controller's namespace (so two installations never delete each other's
//! objects). The Service also carries the standard `gateway.networking.k8s.io/gateway-name`
//! label and the Gateway's `spec.infrastructure` labels and annotations (e.g. load-balancer
//! annotations of a cloud provider); ours win where a key clashes. The EndpointSlices carry
//! `kubernetes.io/service-name` and `endpointslice.kubernetes.io/managed-by:
//! controller.sweety.dev`, so the cluster's EndpointSlice controller leaves them alone.
//!
//! Readiness changes of the dataplane Pods reach the mirrored slices on the next reconcile,
//! which the controller's EndpointSlice watch triggers (with `--watch-namespaces` that leave out
//! the controller's namespace, a watch of just the dataplane Service's slices there does:
//! `WatchOptions::dataplane_service`).

pub use crate::labels::label_value;
use crate::labels::{
    GATEWAY_ANNOTATION, GATEWAY_NAMESPACE_LABEL, GATEWAY_NAME_LABEL, INFRASTRUCTURE_KEYS,
    MANAGED_BY, MANAGED_BY_LABEL, OWNER_LABEL, SERVICE_NAME_LABEL, SLICE_MANAGED_BY,
    SLICE_MANAGED_BY_LABEL, STANDARD_GATEWAY_NAME_LABEL,
};
use crate::translate::GatewayService;
use crate::Error;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use std::collections::BTreeMap;

/// The API's limit of endpoints in one EndpointSlice; more dataplane Pods are left out (with a
/// warning).
pub const MAX_ENDPOINTS: usize = 1000;

/// What one sync did. Names are `namespace/name`; slices are prefixed `EndpointSlice `.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Services and slices created or updated.
    pub applied: Vec<String>,
    /// Services and slices already as wanted.
    pub unchanged: usize,
    /// Services and slices of Gateways that are gone.
    pub deleted: Vec<String>,
    /// Services (and slices) left alone because one of that name exists that is not ours
    /// for this Gateway (a user's own, another installation's, another Gateway's): never
    /// taken over.
    pub refused: Vec<String>,
    /// Stale owned objects the controller may not delete (403: no write access in that
    /// namespace, e.g. Gateway namespaces after a switch to `release`); same naming as
    /// `deleted`.
    pub left: Vec<String>,
}

/// Keeps the per-Gateway Services and their EndpointSlices in line with
/// `Output::gateway_services`.
pub struct GatewayServices {
    client: Client,
    /// The controller's namespace (owner label value, home of the dataplane Service).
    namespace: String,
    /// The dataplane Service: its selector is copied onto Services in `namespace`, its
    /// EndpointSlices are mirrored for Services elsewhere.
    dataplane_service: Option<String>,
    field_manager: String,
}

type Key = (String, String);

fn key_of(m: &ObjectMeta) -> Option<Key> {
    Some((m.namespace.clone()?, m.name.clone()?))
}

/// The objects `params` selects, by namespace and name.
async fn list_by_key<K>(api: &Api<K>, params: &ListParams) -> Result<BTreeMap<Key, K>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list(params)
        .await
        .map_err(Error::Kube)?
        .items
        .into_iter()
        .filter_map(|o| Some((key_of(o.meta())?, o)))
        .collect())
}

impl GatewayServices {
    /// `dataplane_service` is the Service in `namespace` that selects the dataplane Pods; with
    /// `None` the per-Gateway Services get no endpoints.
    pub fn new(
        client: Client,
        namespace: &str,
        dataplane_service: Option<String>,
        field_manager: &str,
    ) -> Self {
        GatewayServices {
            client,
            namespace: namespace.into(),
            dataplane_service,
            field_manager: field_manager.into(),
        }
    }

    fn owned_selector(&self) -> String {
        format!(
            "{MANAGED_BY_LABEL}={MANAGED_BY},{GATEWAY_NAME_LABEL},{OWNER_LABEL}={}",
            label_value(&self.namespace)
        )
    }

    /// Apply every desired Service and EndpointSlice that differs from the cluster's and delete
    /// owned ones that are no longer desired (and the Services of an older release in the
    /// controller's namespace).
    pub async fn sync(&self, desired: &[GatewayService]) -> Result<SyncReport, Error> {
        let services: Api<Service> = Api::all(self.client.clone());
        let slices: Api<EndpointSlice> = Api::all(self.client.clone());
        let owned = ListParams::default().labels(&self.owned_selector());
        let mut existing: BTreeMap<Key, Service> = list_by_key(&services, &owned).await?;
        // An older release's Services: in the controller's namespace, without the owner label.
        let legacy = list_by_key(
            &Api::<Service>::namespaced(self.client.clone(), &self.namespace),
            &ListParams::default().labels(&format!(
                "{MANAGED_BY_LABEL}={MANAGED_BY},{GATEWAY_NAME_LABEL},!{OWNER_LABEL}"
            )),
        )
        .await?;
        for (k, s) in legacy {
            existing.entry(k).or_insert(s);
        }
        // Only the slices we wrote: the cluster's EndpointSlice controller copies a Service's
        // labels (ours included) onto the slices it makes for a Service with a selector.
        let mut existing_slices: BTreeMap<Key, EndpointSlice> = list_by_key(
            &slices,
            &ListParams::default().labels(&format!(
                "{},{SLICE_MANAGED_BY_LABEL}={SLICE_MANAGED_BY}",
                self.owned_selector()
            )),
        )
        .await?;
        // Read only for what the desired Services need: a selector for those beside the
        // dataplane, mirrored endpoints for the others.
        let selector = if desired.iter().any(|d| self.beside_dataplane(d)) {
            self.dataplane_selector().await?
        } else {
            None
        };
        let source = if desired.iter().any(|d| !self.beside_dataplane(d)) {
            self.dataplane_endpoints().await?
        } else {
            BTreeMap::new()
        };
        let mut report = SyncReport::default();
        for d in desired {
            let want = self.service(d, selector.as_ref());
            let k = (d.namespace.clone(), d.name.clone());
            let mut current = existing.remove(&k);
            // Ours, but made for another Gateway (a name collision translate should have
            // refused): never rewritten for this one; it goes as no longer wanted.
            if let Some(c) = current.take_if(|c| !for_gateway(c, d)) {
                tracing::warn!(
                    service = %format!("{}/{}", k.0, k.1),
                    "this Service is another Gateway's; not taking it over"
                );
                report.refused.push(format!("{}/{}", k.0, k.1));
                existing.insert(k, c);
                continue;
            }
            let api = Api::<Service>::namespaced(self.client.clone(), &d.namespace);
            if current.as_ref().is_some_and(|c| same(c, &want)) {
                report.unchanged += 1;
            } else {
                if current.is_none() && api.get_opt(&d.name).await.map_err(Error::Kube)?.is_some() {
                    tracing::warn!(
                        service = %format!("{}/{}", k.0, k.1),
                        "a Service with this name exists and is not ours; not taking it over"
                    );
                    report.refused.push(format!("{}/{}", k.0, k.1));
                    continue;
                }
                api.patch(
                    &d.name,
                    &PatchParams::apply(&self.field_manager).force(),
                    &Patch::Apply(&want),
                )
                .await
                .map_err(Error::Kube)?;
                // Which listener port reaches which dataplane container port, and what it was:
                // what a misrouted request is traced back to.
                tracing::info!(
                    service = %format!("{}/{}", k.0, k.1),
                    ports = %port_map(&want),
                    was = %current.as_ref().map(port_map).unwrap_or_default(),
                    "per-Gateway Service applied"
                );
                report.applied.push(format!("{}/{}", k.0, k.1));
            }
            if self.beside_dataplane(d) {
                // The cluster's EndpointSlice controller serves a Service with a selector.
                continue;
            }
            for slice in self.endpoint_slices(d, &source) {
                let Some(sk) = key_of(&slice.metadata) else {
                    continue;
                };
                let current = existing_slices.remove(&sk);
                if current.as_ref().is_some_and(|c| same_slice(c, &slice)) {
                    report.unchanged += 1;
                    continue;
                }
                let slice_api = Api::<EndpointSlice>::namespaced(self.client.clone(), &sk.0);
                // As for Services: a slice of that name that is not ours is left alone.
                if current.is_none()
                    && slice_api
                        .get_opt(&sk.1)
                        .await
                        .map_err(Error::Kube)?
                        .is_some()
                {
                    tracing::warn!(
                        slice = %format!("{}/{}", sk.0, sk.1),
                        "an EndpointSlice with this name exists and is not ours; not taking it over"
                    );
                    report
                        .refused
                        .push(format!("EndpointSlice {}/{}", sk.0, sk.1));
                    continue;
                }
                slice_api
                    .patch(
                        &sk.1,
                        &PatchParams::apply(&self.field_manager).force(),
                        &Patch::Apply(&slice),
                    )
                    .await
                    .map_err(Error::Kube)?;
                report
                    .applied
                    .push(format!("EndpointSlice {}/{}", sk.0, sk.1));
            }
        }
        for (ns, name) in existing_slices.into_keys() {
            let api = Api::<EndpointSlice>::namespaced(self.client.clone(), &ns);
            let what = format!("EndpointSlice {ns}/{name}");
            match delete(&api, &name).await? {
                Deleted::Yes => report.deleted.push(what),
                Deleted::Gone => {}
                Deleted::Forbidden => report.left.push(what),
            }
        }
        for (ns, name) in existing.into_keys() {
            let api = Api::<Service>::namespaced(self.client.clone(), &ns);
            let what = format!("{ns}/{name}");
            match delete(&api, &name).await? {
                Deleted::Yes => report.deleted.push(what),
                Deleted::Gone => {}
                Deleted::Forbidden => report.left.push(what),
            }
        }
        if !report.left.is_empty() {
            tracing::warn!(
                left = ?report.left,
                "stale per-Gateway Services/EndpointSlices this controller may not delete (no \
                 write access there, e.g. after --gateway-service-namespace changed to release); \
                 remove them with `kubectl delete service,endpointslice -A -l {}`",
                self.owned_selector()
            );
        }
        Ok(report)
    }

    /// Whether the Service of `d` lives beside the dataplane Pods (the controller's namespace),
    /// where a selector reaches them.
    fn beside_dataplane(&self, d: &GatewayService) -> bool {
        d.namespace == self.namespace
    }

    /// The selector of the dataplane Service (`None` without one, or when it has none: the
    /// Services then get no endpoints, with a warning).
    async fn dataplane_selector(&self) -> Result<Option<BTreeMap<String, String>>, Error> {
        let Some(svc) = &self.dataplane_service else {
            return Ok(None);
        };
        let found = Api::<Service>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(svc)
            .await
            .map_err(Error::Kube)?;
        let selector = found
            .and_then(|s| s.spec?.selector)
            .filter(|s| !s.is_empty());
        if selector.is_none() {
            tracing::warn!(
                service = %format!("{}/{svc}", self.namespace),
                "the dataplane Service is missing or has no selector; per-Gateway Services get no endpoints"
            );
        }
        Ok(selector)
    }

    /// The endpoints of the dataplane Service's EndpointSlices, by address type.
    async fn dataplane_endpoints(&self) -> Result<BTreeMap<String, Vec<Endpoint>>, Error> {
        let Some(svc) = &self.dataplane_service else {
            return Ok(BTreeMap::new());
        };
        let list = Api::<EndpointSlice>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={svc}")))
            .await
            .map_err(Error::Kube)?;
        Ok(mirror_endpoints(&list.items))
    }

    /// The labels that make a Service or EndpointSlice ours: managed by us, for this Gateway,
    /// owned by this installation (what [`GatewayServices::owned_selector`] selects).
    fn owned_labels(&self, d: &GatewayService) -> impl Iterator<Item = (String, String)> {
        [
            (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
            (
                GATEWAY_NAMESPACE_LABEL.to_string(),
                label_value(&d.gateway_namespace),
            ),
            (GATEWAY_NAME_LABEL.to_string(), label_value(&d.gateway_name)),
            (OWNER_LABEL.to_string(), label_value(&self.namespace)),
        ]
        .into_iter()
    }

    /// The GatewayClass as the owner of the Service and its slices (none without its uid).
    fn owner_references(d: &GatewayService) -> Option<Vec<OwnerReference>> {
        let o = d.owner.as_ref()?;
        Some(vec![OwnerReference {
            api_version: "gateway.networking.k8s.io/v1".into(),
            kind: "GatewayClass".into(),
            name: o.name.clone(),
            uid: o.uid.clone(),
            controller: Some(false),
            block_owner_deletion: Some(false),
        }])
    }

    /// The EndpointSlices of one Gateway's Service: one per address type of the dataplane's.
    pub fn endpoint_slices(
        &self,
        d: &GatewayService,
        source: &BTreeMap<String, Vec<Endpoint>>,
    ) -> Vec<EndpointSlice> {
        let mut labels: BTreeMap<String, String> = self.owned_labels(d).collect();
        labels.extend([
            (SERVICE_NAME_LABEL.to_string(), d.name.clone()),
            (
                SLICE_MANAGED_BY_LABEL.to_string(),
                SLICE_MANAGED_BY.to_string(),
            ),
        ]);
        let ports: Vec<EndpointPort> = d
            .ports
            .iter()
            .map(|p| EndpointPort {
                name: Some(p.name.clone()),
                protocol: Some(p.protocol.clone()),
                port: Some(p.target_port.into()),
                ..Default::default()
            })
            .collect();
        source
            .iter()
            .map(|(address_type, endpoints)| EndpointSlice {
                metadata: ObjectMeta {
                    name: Some(format!("{}-{}", d.name, address_type.to_ascii_lowercase())),
                    namespace: Some(d.namespace.clone()),
                    labels: Some(labels.clone()),
                    owner_references: Self::owner_references(d),
                    ..Default::default()
                },
                address_type: address_type.clone(),
                endpoints: endpoints.clone(),
                ports: Some(ports.clone()),
            })
            .collect()
    }

    /// The Service we want for one Gateway; `selector` (the dataplane Service's) is set only
    /// when it lives beside the dataplane.
    pub fn service(
        &self,
        d: &GatewayService,
        selector: Option<&BTreeMap<String, String>>,
    ) -> Service {
        let mut labels = d.labels.clone();
        labels.extend(self.owned_labels(d));
        labels.insert(
            STANDARD_GATEWAY_NAME_LABEL.to_string(),
            label_value(&d.gateway_name),
        );
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
            GATEWAY_ANNOTATION.to_string(),
            format!("{}/{}", d.gateway_namespace, d.gateway_name),
        );
        let load_balancer_ip = match d.requested_addresses.as_slice() {
            [one] if d.service_type == "LoadBalancer" => Some(one.clone()),
            _ => None,
        };
        Service {
            metadata: ObjectMeta {
                name: Some(d.name.clone()),
                namespace: Some(d.namespace.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                owner_references: Self::owner_references(d),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(d.service_type.clone()),
                external_traffic_policy: d
                    .external_traffic_policy
                    .clone()
                    .filter(|_| d.service_type != "ClusterIP"),
                // Elsewhere no selector: the controller writes the endpoints (module docs).
                selector: selector.filter(|_| self.beside_dataplane(d)).cloned(),
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

/// What [`delete`] did.
enum Deleted {
    Yes,
    /// Already gone.
    Gone,
    /// Not allowed (no write access in that namespace).
    Forbidden,
}

/// Delete one object.
async fn delete<K>(api: &Api<K>, name: &str) -> Result<Deleted, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(Deleted::Yes),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Deleted::Gone),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(Deleted::Forbidden),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// The endpoints of the dataplane's EndpointSlices by address type (deduplicated by address,
/// sorted, at most [`MAX_ENDPOINTS`] each), with the fields a mirror keeps: addresses,
/// conditions, node, zone and the Pod reference.
pub fn mirror_endpoints(slices: &[EndpointSlice]) -> BTreeMap<String, Vec<Endpoint>> {
    let mut out: BTreeMap<String, BTreeMap<Vec<String>, Endpoint>> = BTreeMap::new();
    for s in slices {
        let by_address = out.entry(s.address_type.clone()).or_default();
        for e in &s.endpoints {
            if e.addresses.is_empty() {
                continue;
            }
            by_address
                .entry(e.addresses.clone())
                .or_insert_with(|| Endpoint {
                    addresses: e.addresses.clone(),
                    conditions: e.conditions.clone(),
                    node_name: e.node_name.clone(),
                    zone: e.zone.clone(),
                    target_ref: e.target_ref.clone(),
                    ..Default::default()
                });
        }
    }
    out.into_iter()
        .map(|(t, eps)| {
            if eps.len() > MAX_ENDPOINTS {
                tracing::warn!(
                    address_type = %t,
                    endpoints = eps.len(),
                    "more dataplane endpoints than one EndpointSlice holds; the rest are left out"
                );
            }
            (t, eps.into_values().take(MAX_ENDPOINTS).collect())
        })
        .collect()
}

/// Whether owned Service `c` was made for the Gateway of `d` (by its
/// [`GATEWAY_ANNOTATION`]; one without it, from an older release, by its name).
fn for_gateway(c: &Service, d: &GatewayService) -> bool {
    c.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(GATEWAY_ANNOTATION))
        .is_none_or(|a| *a == format!("{}/{}", d.gateway_namespace, d.gateway_name))
}

/// Whether the cluster's EndpointSlice already matches what we would apply.
fn same_slice(current: &EndpointSlice, want: &EndpointSlice) -> bool {
    let labels_match = want
        .metadata
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| current.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v));
    labels_match
        && current.metadata.owner_references == want.metadata.owner_references
        && current.address_type == want.address_type
        && current.endpoints == want.endpoints
        && current.ports == want.ports
}

/// Whether the cluster's Service already matches what we would apply (the fields we set).
/// A Service's ports as `<port>/<protocol>-><targetPort> ...`, for the log.
fn port_map(s: &Service) -> String {
    let ports = s.spec.iter().flat_map(|sp| sp.ports.iter().flatten());
    ports
        .map(|p| {
            let target = match &p.target_port {
                Some(IntOrString::Int(n)) => n.to_string(),
                Some(IntOrString::String(n)) => n.clone(),
                None => p.port.to_string(),
            };
            let protocol = p.protocol.as_deref().unwrap_or("TCP");
            format!("{}/{protocol}->{target}", p.port)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

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
    // An externalTrafficPolicy we do not set is the API server's default (Cluster).
    let policy = |s: &ServiceSpec| match s.type_.as_deref() {
        Some("NodePort" | "LoadBalancer") => s
            .external_traffic_policy
            .clone()
            .unwrap_or_else(|| "Cluster".into()),
        _ => String::new(),
    };
    labels_match
        && current.metadata.owner_references == want.metadata.owner_references
        && c.type_.as_deref().unwrap_or("ClusterIP") == w.type_.as_deref().unwrap_or("ClusterIP")
        && policy(c) == policy(w)
        && c.selector == w.selector
        // Also when no address is wanted any more: the old request must go.
        && c.load_balancer_ip == w.load_balancer_ip
        && ports(c) == ports(w)
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
            namespace: "apps".into(),
            name: "sweety-gw-apps-web".into(),
            service_type: "LoadBalancer".into(),
            external_traffic_policy: None,
            owner: None,
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
        let gs = GatewayServices::new(client, "sweety", Some("sweety".into()), "test");
        let with = gs.service(
            &desired(
                &[("team", "a"), (MANAGED_BY_LABEL, "someone-else")],
                &[("lb.example/internal", "true")],
            ),
            None,
        );
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
        let without = gs.service(&desired(&[], &[]), None);
        assert!(!same(&with, &without));
    }

    #[tokio::test]
    async fn mirrored_slices_carry_the_gateway_ports_and_every_dataplane_endpoint() {
        let cfg = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(cfg).unwrap();
        let gs = GatewayServices::new(client, "sweety", Some("sweety".into()), "test");
        let source: Vec<EndpointSlice> = serde_json::from_value(serde_json::json!([
            {"metadata": {"name": "a"}, "addressType": "IPv4", "endpoints": [
                {"addresses": ["10.0.0.2"], "conditions": {"ready": true}, "nodeName": "n1"},
                {"addresses": ["10.0.0.1"], "conditions": {"ready": false}}]},
            // The same Pod again (slices overlap while the endpoint controller moves it).
            {"metadata": {"name": "b"}, "addressType": "IPv4", "endpoints": [
                {"addresses": ["10.0.0.2"], "conditions": {"ready": true}}, {"addresses": []}]},
            {"metadata": {"name": "c"}, "addressType": "IPv6", "endpoints": [
                {"addresses": ["fd00::1"], "conditions": {"ready": true}}]}
        ]))
        .unwrap();
        let mirrored = mirror_endpoints(&source);
        let addrs = |t: &str| -> Vec<String> {
            mirrored[t].iter().map(|e| e.addresses[0].clone()).collect()
        };
        assert_eq!(addrs("IPv4"), ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(addrs("IPv6"), ["fd00::1"]);
        assert_eq!(mirrored["IPv4"][1].node_name.as_deref(), Some("n1"));
        let mut d = desired(&[], &[]);
        d.ports = vec![crate::translate::ServicePort {
            name: "tcp-80".into(),
            protocol: "TCP".into(),
            port: 80,
            target_port: 20003,
        }];
        let slices = gs.endpoint_slices(&d, &mirrored);
        assert_eq!(slices.len(), 2);
        let v4 = &slices[0];
        assert_eq!(v4.metadata.name.as_deref(), Some("sweety-gw-apps-web-ipv4"));
        assert_eq!(v4.metadata.namespace.as_deref(), Some("apps"));
        let labels = v4.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[SERVICE_NAME_LABEL], "sweety-gw-apps-web");
        assert_eq!(labels[SLICE_MANAGED_BY_LABEL], SLICE_MANAGED_BY);
        assert_eq!(labels[OWNER_LABEL], "sweety");
        let port = &v4.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.port),
            (Some("tcp-80"), Some(20003))
        );
        assert!(same_slice(v4, v4));
        let mut fewer = v4.clone();
        fewer.endpoints.pop();
        assert!(!same_slice(&fewer, v4));
        // The Service itself: in the Gateway's namespace, no selector (even when one is known).
        let selector: BTreeMap<String, String> = [("app".to_string(), "sweety".to_string())].into();
        let svc = gs.service(&d, Some(&selector));
        assert_eq!(svc.metadata.namespace.as_deref(), Some("apps"));
        assert!(svc.spec.unwrap().selector.is_none());
    }

    #[tokio::test]
    async fn a_service_beside_the_dataplane_selects_its_pods_and_gets_no_mirrored_slices() {
        let cfg = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(cfg).unwrap();
        let gs = GatewayServices::new(client, "sweety", Some("sweety".into()), "test");
        let mut d = desired(&[], &[]);
        d.namespace = "sweety".into();
        assert!(gs.beside_dataplane(&d));
        let selector: BTreeMap<String, String> = [("app".to_string(), "sweety".to_string())].into();
        let svc = gs.service(&d, Some(&selector));
        assert_eq!(svc.metadata.namespace.as_deref(), Some("sweety"));
        let labels = svc.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[GATEWAY_NAMESPACE_LABEL], "apps");
        assert_eq!(labels[STANDARD_GATEWAY_NAME_LABEL], "web");
        // Owned by the (cluster-scoped) class only: a Gateway in another namespace cannot own it.
        assert!(svc
            .metadata
            .owner_references
            .iter()
            .flatten()
            .all(|o| o.kind == "GatewayClass"));
        assert_eq!(
            svc.spec.as_ref().unwrap().selector.as_ref(),
            Some(&selector)
        );
        // A selector change (e.g. the chart's labels) is applied again.
        assert!(!same(&svc, &gs.service(&d, None)));
    }
}
