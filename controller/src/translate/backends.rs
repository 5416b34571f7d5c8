//! Service and EndpointSlice resolution, shared by every front end (Ingress, Gateway API,
//! SweetySite): a reference to `namespace/service:port` becomes a named dataplane [`Backend`]
//! whose endpoints are the *ready* EndpointSlice addresses (never the ClusterIP).
//!
//! [`Backends`] collects what the routes reference and emits each backend once, sorted by name.

use super::snapshot::Snapshot;
use crate::labels::SERVICE_NAME_LABEL;
use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use sweety_config::{Backend, BackendProtocol, BackendTls, Endpoint};

/// How a route names the Service port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortRef {
    /// The Service port number (`port`, not `targetPort`).
    Number(i32),
    /// The Service port's `name` (Ingress `service.port.name`).
    Name(String),
}

/// Why a backend reference did not resolve. `reason()` gives the Gateway API reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendError {
    /// No Service of that name in that namespace.
    ServiceNotFound {
        /// Namespace the reference points into.
        namespace: String,
        /// The Service name it asked for.
        name: String,
    },
    /// The Service has no such port.
    PortNotFound {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
        /// The port number or name asked for, as text.
        port: String,
    },
    /// The route gave no port and the Service needs one.
    PortRequired {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
    },
    /// An ExternalName Service while the controller does not allow them
    /// (`Params::allow_external_name`): its name could point anywhere the dataplane reaches.
    ExternalNameDisabled {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
    },
}

impl BackendError {
    /// `ResolvedRefs` reason as Gateway API names it.
    pub fn reason(&self) -> &'static str {
        "BackendNotFound"
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::ServiceNotFound { namespace, name } => {
                write!(f, "Service {namespace}/{name} not found")
            }
            BackendError::PortNotFound {
                namespace,
                name,
                port,
            } => {
                write!(f, "Service {namespace}/{name} has no port {port}")
            }
            BackendError::PortRequired { namespace, name } => {
                write!(f, "a port is required for Service {namespace}/{name}")
            }
            BackendError::ExternalNameDisabled { namespace, name } => write!(
                f,
                "Service {namespace}/{name} is of type ExternalName, which this controller does \
                 not follow (--allow-external-name is off)"
            ),
        }
    }
}

/// Per-reference options that change how the dataplane talks to the backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendOptions {
    /// Overrides the protocol derived from the Service port's `appProtocol`.
    pub protocol: Option<BackendProtocol>,
    /// TLS towards the backend (BackendTLSPolicy); implies https or h2.
    pub tls: Option<BackendTls>,
}

/// Indexes over the snapshot for fast lookups.
pub struct ServiceIndex<'a> {
    services: BTreeMap<(&'a str, &'a str), &'a Arc<Service>>,
    slices: BTreeMap<(&'a str, &'a str), Vec<&'a Arc<EndpointSlice>>>,
    /// While recording ([`ServiceIndex::record`]): every (namespace, name) looked up, found
    /// or not. The incremental translation keeps them as dependencies on Services and their
    /// EndpointSlices (whose endpoints are only read through a Service found here): per route
    /// object in the per-virtual-host memo (`RouteMemo::services` in
    /// `gateway::vhost_cache`), and for the Ingresses and SweetySites as a whole in the
    /// front memo (`IngressSiteInputs::services` in `translate::cache`).
    recorded: std::cell::RefCell<Option<BTreeSet<(String, String)>>>,
    /// Whether ExternalName Services resolve (`Params::allow_external_name`).
    pub allow_external_name: bool,
}

impl<'a> ServiceIndex<'a> {
    /// Indexes the Services of `snapshot`; ExternalName Services stay refused until
    /// [`ServiceIndex::allow_external_name`] is set.
    pub fn new(snapshot: &'a Snapshot) -> Self {
        let mut services = BTreeMap::new();
        for s in &snapshot.services {
            if let (Some(ns), Some(name)) = (&s.metadata.namespace, &s.metadata.name) {
                services.insert((ns.as_str(), name.as_str()), s);
            }
        }
        let mut slices: BTreeMap<_, Vec<_>> = BTreeMap::new();
        for es in &snapshot.endpoint_slices {
            let ns = es.metadata.namespace.as_deref().unwrap_or_default();
            let svc = es
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL));
            if let Some(svc) = svc {
                slices.entry((ns, svc.as_str())).or_default().push(es);
            }
        }
        ServiceIndex {
            services,
            slices,
            recorded: Default::default(),
            // Closed unless the caller opts in (`Params::allow_external_name`, off by default).
            allow_external_name: false,
        }
    }

    /// The Service, if it exists.
    pub fn service(&self, namespace: &str, name: &str) -> Option<&'a Arc<Service>> {
        if let Some(r) = self.recorded.borrow_mut().as_mut() {
            r.insert((namespace.to_string(), name.to_string()));
        }
        self.services.get(&(namespace, name)).copied()
    }

    /// Starts recording the Services looked up.
    pub fn record(&self) {
        *self.recorded.borrow_mut() = Some(BTreeSet::new());
    }

    /// Stops recording: the Services looked up since [`ServiceIndex::record`].
    pub fn recorded(&self) -> BTreeSet<(String, String)> {
        self.recorded.borrow_mut().take().unwrap_or_default()
    }

    /// Find the Service port a reference names.
    pub fn port(
        &self,
        namespace: &str,
        name: &str,
        port: Option<&PortRef>,
    ) -> Result<(&'a Arc<Service>, &'a ServicePort), BackendError> {
        let svc = self
            .service(namespace, name)
            .ok_or_else(|| BackendError::ServiceNotFound {
                namespace: namespace.into(),
                name: name.into(),
            })?;
        let ports = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_deref())
            .unwrap_or_default();
        let found = match port {
            Some(PortRef::Number(n)) => ports.iter().find(|p| p.port == *n),
            Some(PortRef::Name(n)) => ports.iter().find(|p| p.name.as_deref() == Some(n)),
            None if ports.len() == 1 => ports.first(),
            None => {
                return Err(BackendError::PortRequired {
                    namespace: namespace.into(),
                    name: name.into(),
                })
            }
        };
        let found = found.ok_or_else(|| BackendError::PortNotFound {
            namespace: namespace.into(),
            name: name.into(),
            port: match port {
                Some(PortRef::Number(n)) => n.to_string(),
                Some(PortRef::Name(n)) => n.clone(),
                None => String::new(),
            },
        })?;
        let external = svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName");
        if external && !self.allow_external_name {
            return Err(BackendError::ExternalNameDisabled {
                namespace: namespace.into(),
                name: name.into(),
            });
        }
        Ok((svc, found))
    }

    /// Ready endpoints of a Service port, as sorted, de-duplicated `ip:port` strings.
    /// ExternalName Services resolve to `externalName:port`.
    pub fn endpoints(&self, svc: &Service, port: &ServicePort) -> Vec<String> {
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let spec = svc.spec.as_ref();
        if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            return match spec.and_then(|s| s.external_name.as_deref()) {
                Some(host) => vec![format!("{host}:{}", port.port)],
                None => Vec::new(),
            };
        }
        let mut out = BTreeSet::new();
        for es in self
            .slices
            .get(&(ns, name))
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            // EndpointSlice ports carry the Service port's name (unnamed: none).
            let Some(target) = es
                .ports
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|p| p.name.as_deref().unwrap_or("") == port.name.as_deref().unwrap_or(""))
                .and_then(|p| p.port)
            else {
                continue;
            };
            let v6 = es.address_type == "IPv6";
            for ep in &es.endpoints {
                // `ready` unset means ready (EndpointSlice API).
                let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                if !ready {
                    continue;
                }
                for addr in &ep.addresses {
                    out.insert(if v6 {
                        format!("[{addr}]:{target}")
                    } else {
                        format!("{addr}:{target}")
                    });
                }
            }
        }
        out.into_iter().collect()
    }
}

/// Protocol from the Service port's `appProtocol`.
pub fn protocol_of(port: &ServicePort) -> BackendProtocol {
    match port.app_protocol.as_deref() {
        Some("kubernetes.io/h2c") | Some("h2c") => BackendProtocol::H2c,
        Some("kubernetes.io/https") | Some("https") => BackendProtocol::Https,
        _ => BackendProtocol::Http1,
    }
}

/// Collects the backends routes reference; each distinct (service, port, options) once.
#[derive(Default)]
pub struct Backends {
    by_name: BTreeMap<String, Backend>,
}

impl Backends {
    /// No backends yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Resolve `namespace/name:port` and register it; returns the backend name to reference.
    /// A Service with no ready endpoints still resolves (the dataplane answers 503 for it).
    pub fn service(
        &mut self,
        index: &ServiceIndex<'_>,
        namespace: &str,
        name: &str,
        port: Option<&PortRef>,
        options: &BackendOptions,
    ) -> Result<String, BackendError> {
        let (svc, sp) = index.port(namespace, name, port)?;
        let mut protocol = options.protocol.unwrap_or_else(|| protocol_of(sp));
        if options.tls.is_some() {
            protocol = match protocol {
                BackendProtocol::H2c | BackendProtocol::H2 => BackendProtocol::H2,
                _ => BackendProtocol::Https,
            };
        }
        let mut backend_name = format!("{namespace}/{name}:{}", sp.port);
        if options != &BackendOptions::default() {
            backend_name.push_str(&format!("~{}", protocol_name(protocol)));
            if let Some(sni) = options.tls.as_ref().and_then(|t| t.sni.as_deref()) {
                backend_name.push_str(&format!("~{sni}"));
            }
        }
        if !self.by_name.contains_key(&backend_name) {
            let endpoints = index
                .endpoints(svc, sp)
                .into_iter()
                .map(|address| Endpoint { address, weight: 1 })
                .collect();
            let mut b = Backend::new(&backend_name, endpoints);
            // An ExternalName's name could point anywhere: the dataplane refuses internal
            // addresses it resolves to.
            b.external = svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName");
            b.protocol = protocol;
            b.tls = options.tls.clone();
            self.by_name.insert(backend_name.clone(), b);
        }
        Ok(backend_name)
    }

    /// Register a backend built elsewhere (e.g. mirrors to a fixed address); first one wins.
    pub fn insert(&mut self, backend: Backend) {
        self.by_name.entry(backend.name.clone()).or_insert(backend);
    }

    /// Forget the backend registered under `name`.
    pub fn remove(&mut self, name: &str) {
        self.by_name.remove(name);
    }

    /// [`Backends::insert`] for a borrowed backend: copied only when its name is new.
    pub fn insert_ref(&mut self, backend: &Backend) {
        if !self.by_name.contains_key(&backend.name) {
            self.by_name.insert(backend.name.clone(), backend.clone());
        }
    }

    /// The backend registered under `name`, if any.
    pub fn get(&self, name: &str) -> Option<&Backend> {
        self.by_name.get(name)
    }

    /// All backends, sorted by name.
    pub fn into_config(self) -> Vec<Backend> {
        self.by_name.into_values().collect()
    }
}

fn protocol_name(p: BackendProtocol) -> &'static str {
    match p {
        BackendProtocol::Http1 => "http1",
        BackendProtocol::H2c => "h2c",
        BackendProtocol::Https => "https",
        BackendProtocol::H2 => "h2",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJECTS: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: app}
spec:
  ports:
  - {name: http, port: 80, targetPort: 8080}
  - {name: grpc, port: 9000, targetPort: 9000, appProtocol: kubernetes.io/h2c}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: app, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: grpc, port: 9000}]
endpoints:
- addresses: [10.0.0.2]
  conditions: {ready: true}
- addresses: [10.0.0.1]
- addresses: [10.0.0.3]
  conditions: {ready: false}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: app}
spec: {type: ExternalName, externalName: example.internal, ports: [{port: 443}]}
"#;

    fn snapshot() -> Snapshot {
        Snapshot::from_yaml(OBJECTS).unwrap().0
    }

    #[test]
    fn ready_endpoints_only_sorted_with_target_port() {
        let s = snapshot();
        let idx = ServiceIndex::new(&s);
        let (svc, port) = idx.port("app", "web", Some(&PortRef::Number(80))).unwrap();
        assert_eq!(
            idx.endpoints(svc, port),
            vec!["10.0.0.1:8080", "10.0.0.2:8080"]
        );
        let (svc, port) = idx
            .port("app", "web", Some(&PortRef::Name("grpc".into())))
            .unwrap();
        assert_eq!(
            idx.endpoints(svc, port),
            vec!["10.0.0.1:9000", "10.0.0.2:9000"]
        );
        assert_eq!(protocol_of(port), BackendProtocol::H2c);
    }

    #[test]
    fn errors_name_what_is_missing() {
        let s = snapshot();
        let idx = ServiceIndex::new(&s);
        let e = idx
            .port("app", "nope", Some(&PortRef::Number(80)))
            .unwrap_err();
        assert_eq!(e.to_string(), "Service app/nope not found");
        let e = idx
            .port("app", "web", Some(&PortRef::Number(81)))
            .unwrap_err();
        assert_eq!(e.to_string(), "Service app/web has no port 81");
        let e = idx.port("app", "web", None).unwrap_err();
        assert!(matches!(e, BackendError::PortRequired { .. }));
        assert_eq!(e.reason(), "BackendNotFound");
    }

    #[test]
    fn external_name_is_refused_unless_enabled() {
        let s = snapshot();
        let idx = ServiceIndex::new(&s);
        let e = idx.port("app", "ext", None).unwrap_err();
        assert!(
            matches!(e, BackendError::ExternalNameDisabled { .. }),
            "{e}"
        );
        let mut b = Backends::new();
        assert!(b
            .service(&idx, "app", "ext", None, &BackendOptions::default())
            .is_err());
    }

    #[test]
    fn external_name_and_dedup_by_options() {
        let s = snapshot();
        let mut idx = ServiceIndex::new(&s);
        idx.allow_external_name = true;
        let mut b = Backends::new();
        let a = b
            .service(&idx, "app", "ext", None, &BackendOptions::default())
            .unwrap();
        let a2 = b
            .service(&idx, "app", "ext", None, &BackendOptions::default())
            .unwrap();
        let tls = BackendOptions {
            tls: Some(BackendTls {
                sni: Some("ext.example".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let t = b.service(&idx, "app", "ext", None, &tls).unwrap();
        assert_eq!(a, a2);
        assert_eq!(a, "app/ext:443");
        assert_eq!(t, "app/ext:443~https~ext.example");
        let cfg = b.into_config();
        assert_eq!(cfg.len(), 2);
        assert_eq!(cfg[0].endpoints[0].address, "example.internal:443");
        assert_eq!(cfg[1].protocol, BackendProtocol::Https);
    }
}
