//! The watch layer: one shared reflector per watched kind, a debounce-free change counter that
//! the reconcile loop coalesces, and [`Stores::snapshot`] to build a [`Snapshot`] from the
//! reflector stores with cheap `Arc` clones.
//!
//! - Kinds whose CRD is not installed (e.g. TCPRoute, or the Sweety CRDs) are detected through
//!   API discovery at start and skipped with a log line; they never block startup. Discovery
//!   is then polled for them (every [`WatchOptions::discovery_min`], doubling up to
//!   [`WatchOptions::discovery_max`] while nothing new appears): a kind the API server starts
//!   serving (its CRD installed and Established: discovery lists only established CRDs) gets
//!   its watches then, without a restart, and its first list triggers a reconcile.
//! - Namespaced kinds are watched cluster-wide or in each configured namespace (one reflector
//!   per namespace); cluster-scoped kinds (IngressClass, GatewayClass, Namespace) are always
//!   watched cluster-wide.
//! - Secrets are watched with the field selectors `type=kubernetes.io/tls` and `type=Opaque`
//!   (ingress-nginx's `auth-secret` htpasswd files are Opaque Secrets users do not label; the
//!   cost is caching the Opaque Secrets of the watched namespaces), and only Secrets that
//!   an Ingress (`spec.tls[].secretName`, the `auth-secret`, `auth-tls-secret` and
//!   `proxy-ssl-secret` annotations), a Gateway or ListenerSet listener
//!   (`tls.certificateRefs`), a Gateway's
//!   client certificate validation (`spec.tls.frontend` CA refs) or backend client certificate
//!   (`spec.tls.backend.clientCertificateRef`), a
//!   BackendTLSPolicy (`validation.caCertificateRefs`), a SweetySecurityPolicy (`basicAuth.secretRef`,
//!   `clientCertificate.caCertificateRefs`) or a SweetySite (`tls.secretName`,
//!   `routes[].static.configMap`) references reach the snapshot. ConfigMaps have no natural selector, so they are all watched (in the watched
//!   namespaces) and filtered the same way into the snapshot: users need not label them, at the
//!   cost of caching them. Secret data is never logged.
//! - `managedFields` is stripped from every cached object to keep the stores small.
//! - Kinds whose status this controller writes and `translate` does not read (GatewayClass,
//!   Gateway, ListenerSet, the route kinds, BackendTLSPolicy, SweetySecurityPolicy, Ingress,
//!   SweetySite) pass a
//!   predicate before the store: an update that changes neither `metadata.generation` (the
//!   spec) nor the labels, annotations, owner references, finalizers or deletion timestamp —
//!   a status write, ours or another controller's — neither reaches the store nor triggers a
//!   reconcile. The stored object (and its `Arc`, which the translate cache compares) stays
//!   the one translated, so a status write costs no translation; its cached status can then
//!   lag (the status writer relies on what it wrote itself, and reads the live object on a
//!   conflict). A relist refreshes every object.
//! - An [`ObjectJournal`] lists the route objects (kind, namespace, name) whose events reached
//!   the stores, in order and bounded, so that [`Stores::snapshot_since`] can tell the
//!   translate cache which routes changed since its last snapshot (it then looks at those
//!   only, not at every route). An event is journalled after the reflector applied it to the
//!   store, and a snapshot reads the journal before the stores, so every change a snapshot's
//!   position covers is in its lists; a relist, or a position older than the journal keeps,
//!   gives no list (every route is compared).
//! - Another ([`Stores::created`]) lists the objects of the kinds whose status is written
//!   ([`crate::status_writer::STATUS_KINDS`]) that came into the stores under a name the
//!   watch did not hold (created, or deleted and created again: a new `metadata.uid`), so
//!   that the status worker writes the status of an object recreated under the same name
//!   with the same spec (`kubectl replace --force`), whose wanted status is the one offered
//!   before (see [`crate::status_worker`]). Journalled after the store has the object; a
//!   relist gives no list (the worker then looks at every object again). A snapshot carries
//!   this journal's position too ([`Snapshot::created_at`], read before the stores): the
//!   worker takes an entry only once an offered translation's snapshot covers it.
//! - [`Activity`] counts watch events by kind (passed on or ignored) and keeps the time and
//!   kind of the first event not yet reconciled, for the controller's metrics.

use crate::labels::{GATEWAY_NAME_LABEL, MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL};
use crate::translate::{ChangedRoute, RouteChanges, RouteObject, Snapshot};
use crate::Error;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use sweety_crds::{SweetyProxyConfig, SweetySecurityPolicy, SweetySite};
use sweety_gateway_api as gw;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Which namespaces to watch.
#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// Empty: every namespace. Otherwise only these.
    pub namespaces: Vec<String>,
    /// The chart's dataplane Service (namespace, name), whose EndpointSlices the per-Gateway
    /// Services mirror: when `namespaces` leaves out its namespace, its slices (and only
    /// those) are watched there too, so a dataplane readiness change still triggers a
    /// reconcile. They never enter the snapshot.
    pub dataplane_service: Option<(String, String)>,
    /// The controller's namespace when the per-Gateway Services live there
    /// (`--gateway-service-namespace=release`): when `namespaces` leaves it out, the owned
    /// Services there (and only those, by label) are watched into the snapshot too, for Gateway
    /// status addresses and stable container ports.
    pub gateway_services_namespace: Option<String>,
    /// The default-certificate Secret (namespace, name): kept in every snapshot although
    /// nothing references it, so a rotation is served; when `namespaces` leaves out its
    /// namespace, that Secret alone (by name) is watched there too.
    pub default_certificate_secret: Option<(String, String)>,
    /// First wait between discovery polls for kinds not served at start.
    pub discovery_min: Duration,
    /// Longest wait between those polls (the backoff doubles up to it).
    pub discovery_max: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            namespaces: Vec::new(),
            dataplane_service: None,
            gateway_services_namespace: None,
            default_certificate_secret: None,
            discovery_min: Duration::from_secs(5),
            discovery_max: Duration::from_secs(60),
        }
    }
}

/// The reader halves of every reflector of one kind (one per watched namespace); empty while
/// the kind is not served by the cluster (filled in when discovery finds it later).
pub struct Stored<K: Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    stores: Arc<RwLock<Vec<Store<K>>>>,
}

impl<K: Resource + Clone + 'static> Clone for Stored<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn clone(&self) -> Self {
        Stored {
            stores: self.stores.clone(),
        }
    }
}

impl<K: Resource + Clone + 'static> Stored<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn new(stores: Vec<Store<K>>) -> Self {
        Stored {
            stores: Arc::new(RwLock::new(stores)),
        }
    }

    /// The stores (a poisoned lock only means a panic elsewhere while pushing: the list is
    /// still whole).
    fn read(&self) -> Vec<Store<K>> {
        self.stores
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// One more store (an extra watch of this kind), read with the others.
    fn push(&self, store: Store<K>) {
        self.stores
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(store);
    }

    /// Every cached object of this kind.
    pub fn state(&self) -> Vec<Arc<K>> {
        match self.read().as_slice() {
            [one] => one.state(),
            many => many.iter().flat_map(|s| s.state()).collect(),
        }
    }

    fn state_filter(&self, keep: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        self.read()
            .iter()
            .flat_map(|s| s.state_filter(&keep))
            .collect()
    }

    /// Whether this kind is watched at all.
    pub fn watched(&self) -> bool {
        !self.read().is_empty()
    }

    /// The cached object `namespace`/`name` (`namespace` empty for cluster-scoped kinds).
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>>
    where
        K::DynamicType: Default,
    {
        let r = reflector::ObjectRef::new(name);
        let r = if namespace.is_empty() {
            r
        } else {
            r.within(namespace)
        };
        self.read().iter().find_map(|s| s.get(&r))
    }
}

/// Every reflector store the controller reads.
#[derive(Clone)]
pub struct Stores {
    /// IngressClasses (cluster-wide): which classes name this controller.
    pub ingress_classes: Stored<IngressClass>,
    /// Ingresses of the watched namespaces.
    pub ingresses: Stored<Ingress>,
    /// GatewayClasses (cluster-wide): which classes name this controller.
    pub gateway_classes: Stored<gw::gatewayclasses::GatewayClass>,
    /// Gateways of the watched namespaces.
    pub gateways: Stored<gw::gateways::Gateway>,
    /// HTTPRoutes of the watched namespaces.
    pub http_routes: Stored<gw::httproutes::HttpRoute>,
    /// GRPCRoutes of the watched namespaces.
    pub grpc_routes: Stored<gw::grpcroutes::GrpcRoute>,
    /// TLSRoutes of the watched namespaces (empty when the CRD is absent).
    pub tls_routes: Stored<gw::tlsroutes::TlsRoute>,
    /// TCPRoutes of the watched namespaces (empty when the CRD is absent).
    pub tcp_routes: Stored<gw::tcproutes::TcpRoute>,
    /// UDPRoutes of the watched namespaces (empty when the CRD is absent).
    pub udp_routes: Stored<gw::udproutes::UdpRoute>,
    /// ReferenceGrants: which cross-namespace references are allowed.
    pub reference_grants: Stored<gw::referencegrants::ReferenceGrant>,
    /// BackendTLSPolicies: how to verify HTTPS backends.
    pub backend_tls_policies: Stored<gw::backendtlspolicies::BackendTlsPolicy>,
    /// ListenerSets: listeners added to a Gateway from other objects.
    pub listener_sets: Stored<gw::listenersets::ListenerSet>,
    /// SweetySites: a whole site (hosts, TLS, routes) in one object.
    pub sites: Stored<SweetySite>,
    /// SweetyProxyConfigs: dataplane settings a GatewayClass points at (`parametersRef`).
    pub proxy_configs: Stored<SweetyProxyConfig>,
    /// SweetySecurityPolicies: authentication and IP rules for Gateways and HTTPRoutes.
    pub security_policies: Stored<SweetySecurityPolicy>,
    /// Services: ports and types of the backends.
    pub services: Stored<Service>,
    /// EndpointSlices: the backends' addresses and readiness.
    pub endpoint_slices: Stored<EndpointSlice>,
    /// Secrets of type `kubernetes.io/tls` only (certificates and keys).
    pub secrets: Stored<Secret>,
    /// Secrets of type `Opaque` (htpasswd files of ingress-nginx's `auth-secret`).
    pub opaque_secrets: Stored<Secret>,
    /// ConfigMaps (CA bundles, a Site's static content).
    pub config_maps: Stored<ConfigMap>,
    /// Always cluster-wide: their labels drive Gateway `allowedRoutes` selectors.
    pub namespaces: Stored<Namespace>,
    /// [`WatchOptions::default_certificate_secret`].
    pub default_certificate_secret: Option<(String, String)>,
    /// Route changes in order, for [`Stores::snapshot_since`].
    pub route_journal: Arc<ObjectJournal>,
    /// Objects of the status kinds that came under a name not held before (see the module
    /// docs), for the status worker.
    pub created: Arc<ObjectJournal>,
}

/// Journal entries kept (changes between two readers' looks; more: everything is compared).
const JOURNAL_MAX: usize = 4096;

/// An object in an [`ObjectJournal`]: kind, namespace, name.
type RouteKey = (&'static str, String, String);

/// The route kinds (the kinds [`Stores::route_journal`] records).
pub const ROUTE_KINDS: [&str; 5] = ["HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "UDPRoute"];

/// Objects whose watch events reached the stores, in order, bounded (see the module docs).
#[derive(Debug, Default)]
pub struct ObjectJournal {
    inner: Mutex<Journal>,
}

#[derive(Debug, Default)]
struct Journal {
    /// Position of the last entry (or reset).
    seq: u64,
    /// Positions before this one are not answered (entries dropped, or a relist).
    floor: u64,
    entries: VecDeque<(u64, RouteKey)>,
}

impl ObjectJournal {
    /// Records an applied event of `kind` `namespace/name`.
    pub fn record(&self, kind: &'static str, namespace: String, name: String) {
        let mut j = lock(&self.inner);
        j.seq += 1;
        let seq = j.seq;
        j.entries.push_back((seq, (kind, namespace, name)));
        if j.entries.len() > JOURNAL_MAX {
            if let Some((dropped, ..)) = j.entries.pop_front() {
                j.floor = dropped;
            }
        }
    }

    /// A relist (the store is replaced): no earlier position is answered any more.
    pub fn reset(&self) {
        let mut j = lock(&self.inner);
        j.seq += 1;
        j.floor = j.seq;
        j.entries.clear();
    }

    /// The current position: every entry at or before it was recorded after its event reached
    /// the store, so a store read after this sees it.
    pub fn position(&self) -> u64 {
        lock(&self.inner).seq
    }

    /// The objects recorded after position `since` up to position `upto` (each once), or
    /// `Err(floor)` when the journal no longer has them all (a relist, or more entries than
    /// it keeps): it answers no position below `floor`, and whatever it lost was recorded at
    /// or before `floor`.
    pub fn between(&self, since: u64, upto: u64) -> Result<BTreeSet<RouteKey>, u64> {
        lock(&self.inner).between(since, upto)
    }

    /// The current position, and the objects recorded after `since` (each once; `None`: not
    /// known from here).
    pub fn since(&self, since: Option<u64>) -> (u64, Option<BTreeSet<RouteKey>>) {
        let j = lock(&self.inner);
        let keys = since.and_then(|s| j.between(s, j.seq).ok());
        (j.seq, keys)
    }
}

impl Journal {
    /// [`ObjectJournal::between`] on the locked state (one lock for a position and what came
    /// before it, as [`ObjectJournal::since`] needs).
    fn between(&self, since: u64, upto: u64) -> Result<BTreeSet<RouteKey>, u64> {
        if since < self.floor || since > self.seq {
            return Err(self.floor);
        }
        Ok(self
            .entries
            .iter()
            .rev()
            .skip_while(|e| e.0 > upto)
            .take_while(|e| e.0 > since)
            .map(|(_, key)| key.clone())
            .collect())
    }
}

impl Stores {
    /// A consistent-enough view of every store: each list is one store read. Secrets and
    /// ConfigMaps are filtered to those something references.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_since(None)
    }

    /// [`Stores::snapshot`], with the route objects changed since journal position `since`
    /// (that of an earlier snapshot) when the journal still knows them.
    pub fn snapshot_since(&self, since: Option<u64>) -> Snapshot {
        // The journal before the stores: whatever it lists up to `at` is in them already.
        let (at, keys) = self.route_journal.since(since);
        let created_at = self.created.position();
        let mut s = Snapshot {
            ingress_classes: self.ingress_classes.state(),
            ingresses: self.ingresses.state(),
            gateway_classes: self.gateway_classes.state(),
            gateways: self.gateways.state(),
            http_routes: self.http_routes.state(),
            grpc_routes: self.grpc_routes.state(),
            tls_routes: self.tls_routes.state(),
            tcp_routes: self.tcp_routes.state(),
            udp_routes: self.udp_routes.state(),
            reference_grants: self.reference_grants.state(),
            backend_tls_policies: self.backend_tls_policies.state(),
            listener_sets: self.listener_sets.state(),
            sites: self.sites.state(),
            proxy_configs: self.proxy_configs.state(),
            security_policies: self.security_policies.state(),
            services: self.services.state(),
            endpoint_slices: self.endpoint_slices.state(),
            secrets: Vec::new(),
            config_maps: Vec::new(),
            namespaces: self.namespaces.state(),
            routes_at: Some(at),
            routes_changed: None,
            created_at: Some(created_at),
        };
        s.routes_changed = since.zip(keys).map(|(since, keys)| RouteChanges {
            since,
            routes: keys
                .into_iter()
                .map(|(kind, namespace, name)| {
                    let object = self.route(kind, &namespace, &name);
                    ChangedRoute {
                        kind,
                        namespace,
                        name,
                        object,
                    }
                })
                .collect(),
        });
        let mut refs = References::of(&s);
        refs.secrets.extend(self.default_certificate_secret.clone());
        s.secrets = self
            .secrets
            .state_filter(|o| refs.secrets.contains(&key(o)));
        s.secrets.extend(
            self.opaque_secrets
                .state_filter(|o| refs.secrets.contains(&key(o))),
        );
        s.config_maps = self
            .config_maps
            .state_filter(|o| refs.config_maps.contains(&key(o)));
        s
    }
}

impl Stores {
    /// The route object `kind` `namespace/name` in the stores.
    fn route(&self, kind: &str, namespace: &str, name: &str) -> Option<RouteObject> {
        match kind {
            "HTTPRoute" => self.http_routes.get(namespace, name).map(RouteObject::Http),
            "GRPCRoute" => self.grpc_routes.get(namespace, name).map(RouteObject::Grpc),
            "TLSRoute" => self.tls_routes.get(namespace, name).map(RouteObject::Tls),
            "TCPRoute" => self.tcp_routes.get(namespace, name).map(RouteObject::Tcp),
            "UDPRoute" => self.udp_routes.get(namespace, name).map(RouteObject::Udp),
            _ => None,
        }
    }
}

fn key<K: Resource>(o: &K) -> (String, String) {
    let m = o.meta();
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// Secrets and ConfigMaps (namespace, name) that objects in a snapshot reference.
#[derive(Debug, Default, PartialEq)]
pub struct References {
    /// Secrets named by an Ingress, Gateway, policy or Site (certificates, CA bundles).
    pub secrets: HashSet<(String, String)>,
    /// ConfigMaps named by a policy or Site (CA bundles, static content).
    pub config_maps: HashSet<(String, String)>,
}

impl References {
    /// Collect the references of every Ingress, Gateway, BackendTLSPolicy,
    /// SweetySecurityPolicy, SweetySite and SweetyProxyConfig.
    pub fn of(s: &Snapshot) -> References {
        let mut r = References::default();
        for ing in &s.ingresses {
            let ns = ing.metadata.namespace.clone().unwrap_or_default();
            for tls in ing.spec.iter().flat_map(|sp| sp.tls.iter().flatten()) {
                if let Some(name) = &tls.secret_name {
                    r.secrets.insert((ns.clone(), name.clone()));
                }
            }
            for name in crate::translate::ingress::nginx::secret_refs(
                ing.metadata.annotations.as_ref(),
                &ns,
            ) {
                r.secrets.insert((ns.clone(), name));
            }
        }
        for g in &s.gateways {
            let ns = g.metadata.namespace.clone().unwrap_or_default();
            // Client certificate validation CAs (spec.tls.frontend), ConfigMaps or Secrets.
            let frontend = g.spec.tls.as_ref().and_then(|t| t.frontend.as_ref());
            let mut ca_refs: Vec<(&str, &str, &str, Option<&String>)> = Vec::new();
            if let Some(f) = frontend {
                for v in f.default.validation.iter() {
                    for c in &v.ca_certificate_refs {
                        ca_refs.push((&c.group, &c.kind, &c.name, c.namespace.as_ref()));
                    }
                }
                for p in f.per_port.iter().flatten() {
                    for v in p.tls.validation.iter() {
                        for c in &v.ca_certificate_refs {
                            ca_refs.push((&c.group, &c.kind, &c.name, c.namespace.as_ref()));
                        }
                    }
                }
            }
            // The backend client certificate (spec.tls.backend.clientCertificateRef).
            if let Some(c) = g
                .spec
                .tls
                .as_ref()
                .and_then(|t| t.backend.as_ref())
                .and_then(|b| b.client_certificate_ref.as_ref())
            {
                let core = c.group.as_deref().unwrap_or("").is_empty();
                if core && c.kind.as_deref().unwrap_or("Secret") == "Secret" {
                    let cns = c.namespace.clone().unwrap_or_else(|| ns.clone());
                    r.secrets.insert((cns, c.name.clone()));
                }
            }
            for (group, kind, name, cns) in ca_refs {
                let key = (cns.cloned().unwrap_or_else(|| ns.clone()), name.to_string());
                match (group, kind) {
                    ("", "ConfigMap") => {
                        r.config_maps.insert(key);
                    }
                    ("", "Secret") => {
                        r.secrets.insert(key);
                    }
                    _ => {}
                }
            }
            for l in &g.spec.listeners {
                let refs = l
                    .tls
                    .iter()
                    .flat_map(|t| t.certificate_refs.iter().flatten());
                for c in refs {
                    let core = c.group.as_deref().unwrap_or("").is_empty();
                    let secret = c.kind.as_deref().unwrap_or("Secret") == "Secret";
                    if core && secret {
                        let ns = c.namespace.clone().unwrap_or_else(|| ns.clone());
                        r.secrets.insert((ns, c.name.clone()));
                    }
                }
            }
        }
        for ls in &s.listener_sets {
            let ns = ls.metadata.namespace.clone().unwrap_or_default();
            for l in &ls.spec.listeners {
                for c in l
                    .tls
                    .iter()
                    .flat_map(|t| t.certificate_refs.iter().flatten())
                {
                    let core = c.group.as_deref().unwrap_or("").is_empty();
                    if core && c.kind.as_deref().unwrap_or("Secret") == "Secret" {
                        let ns = c.namespace.clone().unwrap_or_else(|| ns.clone());
                        r.secrets.insert((ns, c.name.clone()));
                    }
                }
            }
        }
        for p in &s.backend_tls_policies {
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            for c in p.spec.validation.ca_certificate_refs.iter().flatten() {
                if !c.group.is_empty() {
                    continue;
                }
                match c.kind.as_str() {
                    "ConfigMap" => {
                        r.config_maps.insert((ns.clone(), c.name.clone()));
                    }
                    "Secret" => {
                        r.secrets.insert((ns.clone(), c.name.clone()));
                    }
                    _ => {}
                }
            }
        }
        for p in &s.security_policies {
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let key = |o: &sweety_crds::security_policy::ObjectRef| {
                (
                    o.namespace.clone().unwrap_or_else(|| ns.clone()),
                    o.name.clone(),
                )
            };
            if let Some(b) = &p.spec.basic_auth {
                r.secrets.insert(key(&b.secret_ref));
            }
            for c in p
                .spec
                .client_certificate
                .iter()
                .flat_map(|c| &c.ca_certificate_refs)
            {
                match c.kind.as_deref().unwrap_or("Secret") {
                    "ConfigMap" => r.config_maps.insert(key(c)),
                    _ => r.secrets.insert(key(c)),
                };
            }
        }
        // Tracing's CA ConfigMap and client certificate Secret.
        for pc in &s.proxy_configs {
            let ns = pc.metadata.namespace.clone().unwrap_or_default();
            if let Some(t) = &pc.spec.tracing {
                if let Some(ca) = &t.ca_certificate_ref {
                    r.config_maps.insert((ns.clone(), ca.name.clone()));
                }
                if let Some(c) = &t.client_certificate_ref {
                    r.secrets.insert((ns.clone(), c.name.clone()));
                }
            }
        }
        for site in &s.sites {
            let ns = site.metadata.namespace.clone().unwrap_or_default();
            if let Some(tls) = &site.spec.tls {
                r.secrets.insert((ns.clone(), tls.secret_name.clone()));
            }
            for route in &site.spec.routes {
                if let Some(cm) = route
                    .r#static
                    .as_ref()
                    .and_then(|st| st.config_map.as_ref())
                {
                    r.config_maps.insert((ns.clone(), cm.name.clone()));
                }
            }
        }
        r
    }
}

/// What the watches saw, for metrics: events by kind, and the first event the reconcile loop
/// has not taken yet.
#[derive(Debug, Default)]
pub struct Activity {
    first: Mutex<Option<(Instant, &'static str)>>,
    /// (kind, passed on) → events.
    events: Mutex<BTreeMap<(&'static str, bool), u64>>,
}

impl Activity {
    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, kind: &'static str, passed: bool) {
        *Self::lock(&self.events).entry((kind, passed)).or_default() += 1;
        if passed {
            Self::lock(&self.first).get_or_insert((Instant::now(), kind));
        }
    }

    /// The time and kind of the first event since the last call (the reconcile that follows
    /// covers it and every later one).
    pub fn take_first(&self) -> Option<(Instant, &'static str)> {
        Self::lock(&self.first).take()
    }

    /// Events passed on to a reconcile so far, of every kind but `except`.
    pub fn passed_except(&self, except: &[&str]) -> u64 {
        Self::lock(&self.events)
            .iter()
            .filter(|((kind, passed), _)| *passed && !except.contains(kind))
            .map(|(_, n)| *n)
            .sum()
    }

    /// Events so far: (kind, passed on to a reconcile) → count.
    pub fn events(&self) -> BTreeMap<(&'static str, bool), u64> {
        Self::lock(&self.events).clone()
    }
}

/// The running watches.
pub struct Watches {
    /// The reflector stores the watches fill.
    pub stores: Stores,
    /// Watch events by kind, for the metrics.
    pub activity: Arc<Activity>,
    changes: watch::Receiver<u64>,
    /// Every reflector task, also those started after a late discovery.
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// Kinds skipped at start because the cluster did not serve them.
    pub skipped: Vec<String>,
    /// Kinds still not served (their discovery poll goes on).
    pending: Arc<Mutex<Vec<String>>>,
    discovery: Option<JoinHandle<()>>,
}

impl Watches {
    /// Start every reflector. Kinds the cluster does not serve are skipped (logged).
    pub async fn start(client: Client, options: &WatchOptions) -> Result<Watches, Error> {
        let served = ServedResources::discover(&client).await?;
        let (tx, changes) = watch::channel(0u64);
        let tx = Arc::new(tx);
        let activity = Arc::new(Activity::default());
        let journal = Arc::new(ObjectJournal::default());
        let created = Arc::new(ObjectJournal::default());
        let mut w = Starter {
            activity: activity.clone(),
            journal: journal.clone(),
            created: created.clone(),
            client,
            namespaces: options.namespaces.clone(),
            served,
            tx,
            tasks: Arc::new(Mutex::new(Vec::new())),
            skipped: Vec::new(),
            late: Vec::new(),
        };
        let stores = Stores {
            ingress_classes: w.cluster(watcher::Config::default()),
            ingresses: w.namespaced(watcher::Config::default()),
            gateway_classes: w.cluster(watcher::Config::default()),
            gateways: w.namespaced(watcher::Config::default()),
            http_routes: w.namespaced(watcher::Config::default()),
            grpc_routes: w.namespaced(watcher::Config::default()),
            tls_routes: w.namespaced(watcher::Config::default()),
            tcp_routes: w.namespaced(watcher::Config::default()),
            udp_routes: w.namespaced(watcher::Config::default()),
            reference_grants: w.namespaced(watcher::Config::default()),
            backend_tls_policies: w.namespaced(watcher::Config::default()),
            listener_sets: w.namespaced(watcher::Config::default()),
            sites: w.namespaced(watcher::Config::default()),
            proxy_configs: w.namespaced(watcher::Config::default()),
            security_policies: w.namespaced(watcher::Config::default()),
            services: w.namespaced(watcher::Config::default()),
            endpoint_slices: w.namespaced(watcher::Config::default()),
            secrets: w.namespaced(watcher::Config::default().fields("type=kubernetes.io/tls")),
            opaque_secrets: w.namespaced(watcher::Config::default().fields("type=Opaque")),
            config_maps: w.namespaced(watcher::Config::default()),
            namespaces: w.cluster(watcher::Config::default()),
            default_certificate_secret: options.default_certificate_secret.clone(),
            route_journal: journal,
            created,
        };
        if let Some((ns, name)) = &options.dataplane_service {
            if !options.namespaces.is_empty() && !options.namespaces.contains(ns) {
                let api = Api::<EndpointSlice>::namespaced(w.client.clone(), ns);
                let config =
                    watcher::Config::default().labels(&format!("{SERVICE_NAME_LABEL}={name}"));
                w.trigger(api, config);
            }
        }
        if let Some(ns) = &options.gateway_services_namespace {
            if !options.namespaces.is_empty() && !options.namespaces.contains(ns) {
                let api = Api::<Service>::namespaced(w.client.clone(), ns);
                let config = watcher::Config::default().labels(&format!(
                    "{MANAGED_BY_LABEL}={MANAGED_BY},{GATEWAY_NAME_LABEL}"
                ));
                stores.services.push(w.spawn(api, config));
            }
        }
        if let Some((ns, name)) = &options.default_certificate_secret {
            // Outside the watched namespaces: that one Secret (by name) is watched too, so a
            // rotation or a replacement is served there as well.
            if !options.namespaces.is_empty() && !options.namespaces.contains(ns) {
                let api = Api::<Secret>::namespaced(w.client.clone(), ns);
                let config = watcher::Config::default()
                    .fields(&format!("metadata.name={name},type=kubernetes.io/tls"));
                stores.secrets.push(w.spawn(api, config));
            }
        }
        let tasks = w.tasks.clone();
        let skipped = w.skipped.clone();
        let pending = Arc::new(Mutex::new(skipped.clone()));
        let discovery = (!w.late.is_empty()).then(|| {
            tokio::spawn(discover_late(
                w,
                pending.clone(),
                options.discovery_min,
                options.discovery_max,
            ))
        });
        Ok(Watches {
            stores,
            activity,
            changes,
            tasks,
            skipped,
            pending,
            discovery,
        })
    }

    /// Kinds not served yet (watched as soon as discovery finds them).
    pub fn pending(&self) -> Vec<String> {
        lock(&self.pending).clone()
    }

    /// A receiver that changes on every watch event after the initial lists.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// Whether every reflector task is still running (for `/healthz`).
    pub fn running(&self) -> bool {
        lock(&self.tasks).iter().all(|t| !t.is_finished())
    }

    /// A cheap probe of [`Watches::running`] that can be moved into another task (it sees the
    /// watches started later too).
    pub fn liveness(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let tasks = self.tasks.clone();
        move || lock(&tasks).iter().all(|t| !t.is_finished())
    }

    /// Wait until every store has seen its initial list, or the timeout passes.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let s = &self.stores;
        let all = async {
            macro_rules! ready {
                ($($f:ident),*) => {$(
                    for st in &s.$f.read() {
                        if st.wait_until_ready().await.is_err() {
                            return false;
                        }
                    }
                )*};
            }
            ready!(
                ingress_classes,
                ingresses,
                gateway_classes,
                gateways,
                http_routes,
                grpc_routes,
                tls_routes,
                tcp_routes,
                udp_routes,
                reference_grants,
                backend_tls_policies,
                sites,
                proxy_configs,
                security_policies,
                services,
                endpoint_slices,
                secrets,
                opaque_secrets,
                config_maps,
                namespaces
            );
            true
        };
        tokio::time::timeout(timeout, all).await.unwrap_or(false)
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        if let Some(d) = &self.discovery {
            d.abort();
        }
        for t in lock(&self.tasks).iter() {
            t.abort();
        }
    }
}

/// A lock that a panic elsewhere does not poison for us (the data are plain lists).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Poll discovery for the kinds not served at start; start each one's watches once it is
/// served. Ends when every kind is watched. A failed poll (API server unreachable) is logged
/// and retried like an empty one.
async fn discover_late(
    mut w: Starter,
    pending: Arc<Mutex<Vec<String>>>,
    min: Duration,
    max: Duration,
) {
    let mut wait = min;
    while !w.late.is_empty() {
        tokio::time::sleep(wait).await;
        match ServedResources::discover(&w.client).await {
            Ok(served) => w.served = served,
            Err(e) => {
                tracing::warn!(error = %e, "API discovery failed; retrying");
                wait = (wait * 2).min(max);
                continue;
            }
        }
        let (ready, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut w.late).into_iter().partition(|l| {
                w.served
                    .plurals
                    .contains(&(l.api_version.clone(), l.plural.clone()))
            });
        w.late = waiting;
        if ready.is_empty() {
            wait = (wait * 2).min(max);
            continue;
        }
        for l in ready {
            tracing::info!(kind = %l.kind, api_version = %l.api_version, "now served by the cluster; watching it");
            lock(&pending).retain(|k| *k != l.kind);
            (l.start)(&mut w);
        }
        // CRDs tend to arrive together (one bundle): look again soon.
        wait = min;
    }
}

/// Resource plurals the cluster serves, per group/version.
struct ServedResources {
    plurals: BTreeSet<(String, String)>,
}

impl ServedResources {
    async fn discover(client: &Client) -> Result<ServedResources, Error> {
        let mut plurals = BTreeSet::new();
        for gv in [
            "gateway.networking.k8s.io/v1",
            &format!("{}/v1alpha1", sweety_crds::GROUP),
        ] {
            match client.list_api_group_resources(gv).await {
                Ok(list) => {
                    for r in list.resources {
                        plurals.insert((gv.to_string(), r.name));
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(Error::Kube(e)),
            }
        }
        Ok(ServedResources { plurals })
    }

    fn serves<K: Resource<DynamicType = ()>>(&self) -> bool {
        let group = K::group(&());
        if group.is_empty() || group == "networking.k8s.io" || group == "discovery.k8s.io" {
            return true;
        }
        let gv = K::api_version(&()).to_string();
        self.plurals.contains(&(gv, K::plural(&()).to_string()))
    }
}

struct Starter {
    activity: Arc<Activity>,
    journal: Arc<ObjectJournal>,
    created: Arc<ObjectJournal>,
    client: Client,
    namespaces: Vec<String>,
    served: ServedResources,
    tx: Arc<watch::Sender<u64>>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    skipped: Vec<String>,
    /// Kinds not served at start, with how to start their watches when they are.
    late: Vec<Late>,
}

/// A kind waiting for the API server to serve it.
struct Late {
    kind: String,
    api_version: String,
    plural: String,
    start: Box<dyn FnOnce(&mut Starter) + Send>,
}

trait Watchable:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}
impl<K> Watchable for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl Starter {
    fn cluster<K: Watchable>(&mut self, config: watcher::Config) -> Stored<K> {
        if !self.check::<K>() {
            let stored = Stored::new(Vec::new());
            let late = stored.clone();
            self.later::<K>(Box::new(move |w: &mut Starter| {
                let api = Api::<K>::all(w.client.clone());
                late.push(w.spawn(api, config));
            }));
            return stored;
        }
        let api = Api::<K>::all(self.client.clone());
        Stored::new(vec![self.spawn(api, config)])
    }

    fn namespaced<K: Watchable + Resource<Scope = kube::core::NamespaceResourceScope>>(
        &mut self,
        config: watcher::Config,
    ) -> Stored<K> {
        if !self.check::<K>() {
            let stored = Stored::new(Vec::new());
            let late = stored.clone();
            self.later::<K>(Box::new(move |w: &mut Starter| {
                let stores = w.spawn_namespaced::<K>(config);
                late.stores
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(stores);
            }));
            return stored;
        }
        Stored::new(self.spawn_namespaced::<K>(config))
    }

    /// Remember how to start the watches of `K` once the API server serves it.
    fn later<K: Watchable>(&mut self, start: Box<dyn FnOnce(&mut Starter) + Send>) {
        self.late.push(Late {
            kind: K::kind(&()).to_string(),
            api_version: K::api_version(&()).to_string(),
            plural: K::plural(&()).to_string(),
            start,
        });
    }

    /// One reflector per watched namespace (one cluster-wide when every namespace is watched).
    fn spawn_namespaced<K: Watchable + Resource<Scope = kube::core::NamespaceResourceScope>>(
        &mut self,
        config: watcher::Config,
    ) -> Vec<Store<K>> {
        if self.namespaces.is_empty() {
            vec![self.spawn(Api::<K>::all(self.client.clone()), config)]
        } else {
            let apis: Vec<_> = self
                .namespaces
                .iter()
                .map(|ns| Api::<K>::namespaced(self.client.clone(), ns))
                .collect();
            apis.into_iter()
                .map(|api| self.spawn(api, config.clone()))
                .collect()
        }
    }

    fn check<K: Watchable>(&mut self) -> bool {
        if self.served.serves::<K>() {
            return true;
        }
        let kind = K::kind(&()).to_string();
        tracing::info!(
            kind = %kind,
            api_version = %K::api_version(&()),
            "not served by the cluster (CRD not installed); watching it once it is"
        );
        self.skipped.push(kind);
        false
    }

    /// A watch that only signals changes (no store): for objects read elsewhere.
    fn trigger<K: Watchable>(&mut self, api: Api<K>, config: watcher::Config) {
        let tx = self.tx.clone();
        let activity = self.activity.clone();
        let kind = kind_name::<K>();
        let stream = watcher(api, config).default_backoff();
        lock(&self.tasks).push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    // A relist's end signals too: changes during a watch gap show only there.
                    Ok(watcher::Event::Init) | Ok(watcher::Event::InitApply(_)) => {}
                    Ok(_) => {
                        activity.count(kind, true);
                        tx.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    Err(e) => tracing::warn!(kind = %kind, error = %e, "watch error; retrying"),
                }
            }
        }));
    }

    fn spawn<K: Watchable>(&mut self, api: Api<K>, config: watcher::Config) -> Store<K> {
        let (reader, writer) = reflector::store();
        let tx = self.tx.clone();
        let activity = self.activity.clone();
        let kind = kind_name::<K>();
        let mut filter = StatusOnly::for_kind(kind);
        // The object the filter saw come under a new name, for the created journal once the
        // store has it (the filter runs before the reflector, the loop below after it, event
        // by event).
        let came = Arc::new(Mutex::new(None::<(String, String)>));
        let (status_kind, came_in) = (filter.is_some(), came.clone());
        let counted = activity.clone();
        let stream = watcher(api, config)
            .default_backoff()
            .modify(|o: &mut K| o.meta_mut().managed_fields = None)
            .filter(move |event| {
                let pass = match (&mut filter, event) {
                    (Some(f), Ok(e)) => {
                        let pass = f.pass(e);
                        *lock(&came_in) = f.take_created().filter(|_| pass);
                        pass
                    }
                    _ => true,
                };
                if !pass {
                    counted.count(kind, false);
                }
                std::future::ready(pass)
            })
            .reflect(writer);
        // Route kinds are journalled (after the reflector applied the event to the store).
        let journal = ROUTE_KINDS.contains(&kind).then(|| self.journal.clone());
        let created = status_kind.then(|| self.created.clone());
        lock(&self.tasks).push(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let (Some(j), Ok(e)) = (&journal, &event) {
                    match e {
                        watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                            let (ns, name) = key(o);
                            j.record(kind, ns, name);
                        }
                        watcher::Event::Init | watcher::Event::InitDone => j.reset(),
                        watcher::Event::InitApply(_) => {}
                    }
                }
                if let (Some(j), Ok(e)) = (&created, &event) {
                    match e {
                        watcher::Event::Apply(_) => {
                            if let Some((ns, name)) = lock(&came).take() {
                                j.record(kind, ns, name);
                            }
                        }
                        watcher::Event::Init | watcher::Event::InitDone => j.reset(),
                        watcher::Event::InitApply(_) | watcher::Event::Delete(_) => {}
                    }
                }
                match event {
                    Ok(watcher::Event::Init) | Ok(watcher::Event::InitApply(_)) => {}
                    Ok(_) => {
                        activity.count(kind, true);
                        tx.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    // The error says which request failed; it never carries object data.
                    Err(e) => tracing::warn!(kind = %kind, error = %e, "watch error; retrying"),
                }
            }
        }));
        reader
    }
}

/// A kind's name as a `'static` string (kinds are a fixed set: each name is leaked once).
fn kind_name<K: Resource<DynamicType = ()>>() -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let kind = K::kind(&());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names.get(kind.as_ref()) {
        return n;
    }
    let n: &'static str = Box::leak(kind.to_string().into_boxed_str());
    names.insert(n);
    n
}

/// The watch predicate of kinds whose status is written here: passes an event only when the
/// object is new, deleted, or changed in what `translate` reads (the spec, seen through
/// `metadata.generation`, and the metadata listed in the module docs). Objects without a
/// generation always pass. Bounded by the number of objects of the kind (entries leave with
/// their objects, and a relist starts over).
#[derive(Default)]
pub struct StatusOnly {
    /// By (namespace, name): the hash of what `translate` reads ([`meaning`]) and of the uid.
    seen: HashMap<(String, String), (u64, u64)>,
    /// Filled during a relist, swapped in at its end.
    relist: Option<HashMap<(String, String), (u64, u64)>>,
    /// The last event passed was an object under a name not held (created, or deleted and
    /// created again): (namespace, name). Not during a relist.
    created: Option<(String, String)>,
}

impl StatusOnly {
    /// The predicate for `kind`'s watch: only kinds whose status this controller writes and
    /// `translate` does not read get one ([`crate::status_writer::STATUS_KINDS`]); every other
    /// kind (Secrets, ConfigMaps, Services, EndpointSlices, ... whose changes bump no
    /// generation, or whose status `translate` reads) passes every event.
    pub fn for_kind(kind: &str) -> Option<StatusOnly> {
        crate::status_writer::STATUS_KINDS
            .contains(&kind)
            .then(StatusOnly::default)
    }

    /// Whether `event` goes on to the store (and to a reconcile).
    pub fn pass<K: Resource>(&mut self, event: &watcher::Event<K>) -> bool {
        self.created = None;
        match event {
            watcher::Event::Apply(o) => {
                let Some(h) = meaning(o) else { return true };
                let (k, uid) = (key(o), uid_hash(o));
                match self.seen.insert(k.clone(), (h, uid)) {
                    Some((before, before_uid)) if before_uid == uid => before != h,
                    // A name not held, or held by another object (its Delete not seen).
                    _ => {
                        self.created = Some(k);
                        true
                    }
                }
            }
            watcher::Event::Delete(o) => {
                self.seen.remove(&key(o));
                true
            }
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                true
            }
            watcher::Event::InitApply(o) => {
                if let (Some(r), Some(h)) = (self.relist.as_mut(), meaning(o)) {
                    r.insert(key(o), (h, uid_hash(o)));
                }
                true
            }
            watcher::Event::InitDone => {
                if let Some(r) = self.relist.take() {
                    self.seen = r;
                }
                true
            }
        }
    }
}

impl StatusOnly {
    /// (namespace, name) when the last event passed was an object under a name not held
    /// before (created, or deleted and created again), once.
    pub fn take_created(&mut self) -> Option<(String, String)> {
        self.created.take()
    }
}

/// A hash of an object's `metadata.uid`.
fn uid_hash<K: Resource>(o: &K) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    o.meta().uid.hash(&mut h);
    h.finish()
}

/// A hash of what `translate` reads from an object besides its spec, with its generation;
/// `None` when the object has no generation.
fn meaning<K: Resource>(o: &K) -> Option<u64> {
    let m = o.meta();
    let generation = m.generation?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    generation.hash(&mut h);
    m.uid.hash(&mut h);
    m.labels.hash(&mut h);
    m.annotations.hash(&mut h);
    m.finalizers.hash(&mut h);
    m.deletion_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .hash(&mut h);
    if let Some(owners) = &m.owner_references {
        for o in owners {
            (&o.api_version, &o.kind, &o.name, &o.uid, o.controller).hash(&mut h);
        }
    }
    Some(h.finish())
}

/// Object counts per kind, for the `objects` metric.
pub fn object_counts(s: &Snapshot) -> [(&'static str, usize); 20] {
    [
        ("IngressClass", s.ingress_classes.len()),
        ("Ingress", s.ingresses.len()),
        ("GatewayClass", s.gateway_classes.len()),
        ("Gateway", s.gateways.len()),
        ("HTTPRoute", s.http_routes.len()),
        ("GRPCRoute", s.grpc_routes.len()),
        ("TLSRoute", s.tls_routes.len()),
        ("TCPRoute", s.tcp_routes.len()),
        ("UDPRoute", s.udp_routes.len()),
        ("ReferenceGrant", s.reference_grants.len()),
        ("ListenerSet", s.listener_sets.len()),
        ("BackendTLSPolicy", s.backend_tls_policies.len()),
        ("SweetySite", s.sites.len()),
        ("SweetyProxyConfig", s.proxy_configs.len()),
        ("SweetySecurityPolicy", s.security_policies.len()),
        ("Service", s.services.len()),
        ("EndpointSlice", s.endpoint_slices.len()),
        ("Secret", s.secrets.len()),
        ("ConfigMap", s.config_maps.len()),
        ("Namespace", s.namespaces.len()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(generation: Option<i64>, uid: &str, status: &str) -> gw::httproutes::HttpRoute {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "r", "namespace": "n", "uid": uid, "generation": generation},
            "spec": {},
            "status": {"parents": [{"controllerName": status, "parentRef": {"name": "g"}, "conditions": []}]},
        }))
        .unwrap()
    }

    /// The status worker's journal of created objects is fed by [`StatusOnly::take_created`]:
    /// an object under a name not held (new, or deleted and created again, or a new uid
    /// whose Delete was not seen), and nothing else; not during a relist.
    #[test]
    fn status_only_tells_the_objects_that_come_under_a_name_not_held() {
        use watcher::Event::*;
        let mut f = StatusOnly::for_kind("HTTPRoute").expect("HTTPRoute status is ours");
        let created = |f: &mut StatusOnly, e: watcher::Event<gw::httproutes::HttpRoute>| {
            f.pass(&e);
            f.take_created()
        };
        let r = Some(("n".to_string(), "r".to_string()));
        assert_eq!(created(&mut f, Apply(route(Some(1), "u1", "a"))), r, "new");
        assert_eq!(f.take_created(), None, "told once");
        assert_eq!(created(&mut f, Apply(route(Some(1), "u1", "b"))), None);
        assert_eq!(created(&mut f, Apply(route(Some(2), "u1", "b"))), None);
        assert_eq!(created(&mut f, Delete(route(Some(2), "u1", "b"))), None);
        // `kubectl replace --force`: the same name, spec and generation, a new uid.
        assert_eq!(created(&mut f, Apply(route(Some(1), "u2", "a"))), r);
        assert_eq!(
            created(&mut f, Apply(route(Some(1), "u3", "a"))),
            r,
            "Delete missed"
        );
        assert_eq!(created(&mut f, Init), None);
        assert_eq!(created(&mut f, InitApply(route(Some(1), "u4", "a"))), None);
        assert_eq!(created(&mut f, InitDone), None);
        assert_eq!(created(&mut f, Apply(route(Some(1), "u4", "b"))), None);
        assert_eq!(created(&mut f, Apply(route(Some(1), "u5", "b"))), r);
    }

    #[test]
    fn status_only_updates_are_dropped_and_everything_else_passes() {
        use watcher::Event::*;
        let mut f = StatusOnly::for_kind("HTTPRoute").expect("HTTPRoute status is ours");
        assert!(f.pass(&Apply(route(Some(1), "u1", "a"))), "new object");
        // A status write (ours or another controller's): same generation and metadata.
        assert!(
            !f.pass(&Apply(route(Some(1), "u1", "b"))),
            "status-only update"
        );
        // A spec change bumps the generation.
        assert!(f.pass(&Apply(route(Some(2), "u1", "b"))), "spec change");
        // Metadata translate reads: labels, annotations.
        let mut labelled = route(Some(2), "u1", "b");
        labelled.metadata.labels = Some([("team".to_string(), "x".to_string())].into());
        assert!(f.pass(&Apply(labelled.clone())), "label change");
        let mut annotated = labelled.clone();
        annotated.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        assert!(f.pass(&Apply(annotated)), "annotation change");
        // Deleted and created again under the same name, generation 1 again: a new uid.
        assert!(f.pass(&Delete(route(Some(2), "u1", "b"))));
        assert!(f.pass(&Apply(route(Some(1), "u2", "b"))), "recreated");
        assert!(
            f.pass(&Apply(route(Some(1), "u3", "b"))),
            "new uid, same generation"
        );
        // No generation (a kind or an apiserver that does not keep one): never dropped.
        assert!(f.pass(&Apply(route(None, "u3", "b"))));
        assert!(
            f.pass(&Apply(route(None, "u3", "b"))),
            "no generation: always passes"
        );
        // A relist passes every object and starts the comparison over from what it listed.
        assert!(f.pass::<gw::httproutes::HttpRoute>(&Init));
        assert!(f.pass(&InitApply(route(Some(7), "u3", "b"))));
        assert!(f.pass::<gw::httproutes::HttpRoute>(&InitDone));
        assert!(!f.pass(&Apply(route(Some(7), "u3", "c"))), "after a relist");
        assert!(f.pass(&Apply(route(Some(8), "u3", "c"))));
    }

    #[test]
    fn kinds_without_a_generation_or_read_status_are_never_filtered() {
        // Their spec changes bump no generation (or translate reads their status, like a
        // Service's load-balancer addresses): a predicate on them would drop real changes.
        for kind in [
            "Secret",
            "ConfigMap",
            "Service",
            "EndpointSlice",
            "Namespace",
            "IngressClass",
            "ReferenceGrant",
            "SweetyProxyConfig",
        ] {
            assert!(StatusOnly::for_kind(kind).is_none(), "{kind} is filtered");
        }
        for kind in crate::status_writer::STATUS_KINDS {
            assert!(StatusOnly::for_kind(kind).is_some(), "{kind}");
        }
        assert!(StatusOnly::for_kind("Ingress").is_some());
        // Even through a predicate, an object without a generation passes every update.
        let mut f = StatusOnly::default();
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": "n", "uid": "u"}, "data": {"k": "dg=="}
        }))
        .unwrap();
        for _ in 0..3 {
            assert!(f.pass(&watcher::Event::Apply(secret.clone())));
        }
    }

    #[test]
    fn references_cover_ingress_gateway_policy_and_site() {
        let (s, _) = Snapshot::from_yaml(
            r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: i, namespace: a}
spec:
  tls: [{secretName: ing-cert}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: annotated
  namespace: a
  annotations:
    nginx.ingress.kubernetes.io/auth-secret: htpasswd
    nginx.ingress.kubernetes.io/auth-tls-secret: a/client-ca
    nginx.ingress.kubernetes.io/proxy-ssl-secret: backend-ca
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: foreign
  namespace: a
  annotations:
    nginx.ingress.kubernetes.io/auth-tls-secret: other/ca
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: g, namespace: b}
spec:
  gatewayClassName: sweety
  listeners:
  - name: https
    port: 443
    protocol: HTTPS
    tls:
      certificateRefs:
      - {name: gw-cert}
      - {name: other-ns, namespace: c}
      - {name: not-a-secret, group: example.com, kind: Vault}
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: p, namespace: d}
spec:
  targetRefs: [{group: "", kind: Service, name: s}]
  validation:
    hostname: s.example
    caCertificateRefs: [{group: "", kind: ConfigMap, name: ca}]
"#,
        )
        .unwrap();
        let r = References::of(&s);
        let set = |v: &[(&str, &str)]| -> HashSet<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            r.secrets,
            set(&[
                ("a", "ing-cert"),
                // ingress-nginx's Secret annotations (Opaque Secrets users do not label); another
                // namespace's is never read.
                ("a", "htpasswd"),
                ("a", "client-ca"),
                ("a", "backend-ca"),
                ("b", "gw-cert"),
                ("c", "other-ns")
            ])
        );
        assert_eq!(r.config_maps, set(&[("d", "ca")]));
    }

    #[test]
    fn proxy_config_references_cover_the_tracing_ca_and_client_certificate() {
        let (s, _) = Snapshot::from_yaml(
            r#"
apiVersion: sweety.dev/v1alpha1
kind: SweetyProxyConfig
metadata: {name: a, namespace: obs}
spec:
  tracing:
    otlpEndpoint: https://collector:4317
    otlpProtocol: grpc
    caCertificateRef: {name: otlp-ca}
    clientCertificateRef: {name: otlp-client}
---
apiVersion: sweety.dev/v1alpha1
kind: SweetyProxyConfig
metadata: {name: b, namespace: other}
spec:
  tracing: {otlpEndpoint: 'http://collector:4318/v1/traces'}
"#,
        )
        .unwrap();
        let r = References::of(&s);
        let one = |ns: &str, name: &str| HashSet::from([(ns.to_string(), name.to_string())]);
        assert_eq!(r.config_maps, one("obs", "otlp-ca"));
        assert_eq!(r.secrets, one("obs", "otlp-client"));
    }

    #[test]
    fn site_references_cover_tls_and_static_config_maps() {
        let (s, _) = Snapshot::from_yaml(
            r#"
apiVersion: sweety.dev/v1alpha1
kind: SweetySite
metadata: {name: site, namespace: ns}
spec:
  hostnames: [s.example]
  tls: {secretName: site-cert}
  routes:
  - {path: /, static: {configMap: {name: pages}}}
  - {path: /docs, static: {directory: /srv/docs}}
  - {path: /api, proxy: {backends: [{service: api, port: 80}]}}
"#,
        )
        .unwrap();
        let r = References::of(&s);
        assert!(r.secrets.contains(&("ns".into(), "site-cert".into())));
        assert_eq!(r.secrets.len(), 1);
        assert!(r.config_maps.contains(&("ns".into(), "pages".into())));
        assert_eq!(r.config_maps.len(), 1);
    }

    #[test]
    fn route_journal_lists_what_came_after_a_position_and_refuses_what_it_lost() {
        let j = ObjectJournal::default();
        let (start, all) = j.since(None);
        assert!(all.is_none(), "no position: unknown");
        j.record("HTTPRoute", "a".into(), "r1".into());
        j.record("HTTPRoute", "a".into(), "r2".into());
        j.record("HTTPRoute", "a".into(), "r1".into());
        let (at, keys) = j.since(Some(start));
        let keys = keys.expect("answered");
        assert_eq!(
            keys.into_iter().collect::<Vec<_>>(),
            vec![
                ("HTTPRoute", "a".to_string(), "r1".to_string()),
                ("HTTPRoute", "a".to_string(), "r2".to_string())
            ],
            "each route once"
        );
        assert_eq!(j.since(Some(at)).1, Some(BTreeSet::new()), "nothing since");
        assert_eq!(j.since(Some(at + 1)).1, None, "a position it never gave");
        // A relist: no earlier position is answered.
        j.reset();
        assert_eq!(j.since(Some(at)).1, None);
        let (after, _) = j.since(None);
        j.record("GRPCRoute", "b".into(), "g".into());
        assert_eq!(j.since(Some(after)).1.map(|k| k.len()), Some(1));
        // Bounded: positions older than the entries kept are not answered.
        for i in 0..JOURNAL_MAX + 1 {
            j.record("HTTPRoute", "a".into(), format!("x{i}"));
        }
        assert_eq!(j.since(Some(after)).1, None);
        let (now, _) = j.since(None);
        assert_eq!(j.since(Some(now - 10)).1.map(|k| k.len()), Some(10));
        assert!(lock(&j.inner).entries.len() <= JOURNAL_MAX);
    }

    /// The status worker's reading of the created journal: only the entries between two
    /// positions (after the first, up to the second: a snapshot's), and the floor when it
    /// lost some.
    #[test]
    fn created_journal_lists_what_came_between_two_positions() {
        let j = ObjectJournal::default();
        let start = j.position();
        j.record("HTTPRoute", "a".into(), "r1".into());
        let snapshot = j.position();
        j.record("Gateway", "a".into(), "g".into());
        let names = |r: Result<BTreeSet<RouteKey>, u64>| {
            r.map(|k| k.into_iter().map(|(_, _, n)| n).collect::<Vec<_>>())
        };
        assert_eq!(names(j.between(start, snapshot)), Ok(vec!["r1".into()]));
        assert_eq!(names(j.between(snapshot, snapshot)), Ok(vec![]));
        assert_eq!(
            names(j.between(start, j.position())),
            Ok(vec!["g".into(), "r1".into()])
        );
        // A relist: lost, and a snapshot after it covers what was lost.
        j.reset();
        let floor = j.between(start, j.position()).unwrap_err();
        assert_eq!(floor, j.position());
        assert!(floor > snapshot);
    }
}
