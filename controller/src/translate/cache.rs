//! Incremental translation: [`translate_incremental`] gives exactly what [`super::translate`] gives,
//! but reuses the translation of every route object that did not change since the previous
//! call with the same [`TranslateCache`]. One changed HTTPRoute among thousands then costs
//! the translation of that route plus assembling the output, not a translation of all of them.
//!
//! The cache is an explicit input and output, so translation stays pure: no I/O, no clock,
//! and the output depends only on the snapshot and the params (the cache only saves work).
//!
//! What is reused, and when:
//! * the world of a route: every object that is not a route (GatewayClasses, Gateways,
//!   ReferenceGrants, BackendTLSPolicies, ListenerSets, Services, EndpointSlices, Secrets, ConfigMaps,
//!   Namespaces, SweetyProxyConfigs, Ingress objects, SweetySites) and the [`Params`]. When any
//!   of them changed (compared by `Arc` identity, in any order) every route is translated
//!   again, except for Services and EndpointSlices: when only those changed, only the routes
//!   whose translation looked up a changed Service (or the Service of a changed
//!   EndpointSlice) are translated again. Services in the controller's own namespace (where
//!   the per-Gateway Services live, which port allocation reads) still clear everything;
//! * otherwise a route object whose `Arc` is the one seen last time is replayed from
//!   [`gateway::RouteCache`] (see there why `Arc` identity is sound); a new or changed object
//!   is translated and memoized. Objects that left the snapshot are forgotten.
//!
//! Ingress and SweetySite translation and the assembly of listeners and virtual hosts always
//! run in full; they are linear in the number of routes and cheap next to route translation.

use super::{gateway, ingress, site, Builder, Output, Params, Snapshot};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

/// What [`translate_incremental`] carries from one call to the next.
#[derive(Default)]
pub struct TranslateCache {
    world: Option<World>,
    routes: gateway::RouteCache,
}

/// Routes replayed and translated by the last [`translate_incremental`] call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub replayed: usize,
    pub translated: usize,
}

impl TranslateCache {
    /// What the last call reused.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            replayed: self.routes.hits,
            translated: self.routes.misses,
        }
    }
}

/// The non-route objects (held, so their addresses stay unique) and params the memoized
/// routes were translated with.
struct World {
    addrs: Vec<Vec<usize>>,
    params: Params,
    held: Snapshot,
}

/// Positions of the Service and EndpointSlice lists in `World::addrs`.
const SERVICES: usize = 9;
const ENDPOINT_SLICES: usize = 10;

/// (namespace, name) of the Services whose object or EndpointSlices differ between `old` and
/// `new` (by `Arc` identity).
fn changed_services(old: &Snapshot, new: &Snapshot) -> BTreeSet<(String, String)> {
    fn diff<'a, T>(old: &'a [Arc<T>], new: &'a [Arc<T>]) -> impl Iterator<Item = &'a Arc<T>> {
        let o: HashSet<usize> = old.iter().map(|a| Arc::as_ptr(a) as usize).collect();
        let n: HashSet<usize> = new.iter().map(|a| Arc::as_ptr(a) as usize).collect();
        let gone = old
            .iter()
            .filter(move |a| !n.contains(&(Arc::as_ptr(a) as usize)));
        let came = new
            .iter()
            .filter(move |a| !o.contains(&(Arc::as_ptr(a) as usize)));
        gone.chain(came)
    }
    let key = |m: &ObjectMeta, name: Option<&String>| {
        (
            m.namespace.clone().unwrap_or_default(),
            name.cloned().unwrap_or_default(),
        )
    };
    let mut out = BTreeSet::new();
    for s in diff(&old.services, &new.services) {
        out.insert(key(&s.metadata, s.metadata.name.as_ref()));
    }
    for es in diff(&old.endpoint_slices, &new.endpoint_slices) {
        let svc = es
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(super::backends::SERVICE_NAME_LABEL));
        if let Some(svc) = svc {
            out.insert(key(&es.metadata, Some(svc)));
        }
    }
    out
}

fn addrs<T>(list: &[Arc<T>]) -> Vec<usize> {
    let mut v: Vec<usize> = list.iter().map(|a| Arc::as_ptr(a) as usize).collect();
    v.sort_unstable();
    v
}

/// Every list of the snapshot except the routes: (addresses per list, the lists themselves).
fn world(s: &Snapshot) -> (Vec<Vec<usize>>, Snapshot) {
    let held = Snapshot {
        ingress_classes: s.ingress_classes.clone(),
        ingresses: s.ingresses.clone(),
        gateway_classes: s.gateway_classes.clone(),
        gateways: s.gateways.clone(),
        http_routes: Vec::new(),
        grpc_routes: Vec::new(),
        tls_routes: Vec::new(),
        tcp_routes: Vec::new(),
        udp_routes: Vec::new(),
        reference_grants: s.reference_grants.clone(),
        backend_tls_policies: s.backend_tls_policies.clone(),
        listener_sets: s.listener_sets.clone(),
        sites: s.sites.clone(),
        proxy_configs: s.proxy_configs.clone(),
        services: s.services.clone(),
        endpoint_slices: s.endpoint_slices.clone(),
        secrets: s.secrets.clone(),
        config_maps: s.config_maps.clone(),
        namespaces: s.namespaces.clone(),
    };
    let a = vec![
        addrs(&s.ingress_classes),
        addrs(&s.ingresses),
        addrs(&s.gateway_classes),
        addrs(&s.gateways),
        addrs(&s.reference_grants),
        addrs(&s.backend_tls_policies),
        addrs(&s.listener_sets),
        addrs(&s.sites),
        addrs(&s.proxy_configs),
        addrs(&s.services),
        addrs(&s.endpoint_slices),
        addrs(&s.secrets),
        addrs(&s.config_maps),
        addrs(&s.namespaces),
    ];
    (a, held)
}

/// [`super::translate`], reusing what `cache` remembers from earlier calls. The output is always
/// equal to `translate(snapshot, params)`.
pub fn translate_incremental(
    snapshot: &Snapshot,
    params: &Params,
    cache: &mut TranslateCache,
) -> Output {
    let (addrs, held) = world(snapshot);
    let same = cache
        .world
        .as_ref()
        .is_some_and(|w| w.addrs == addrs && w.params == *params);
    if !same {
        // Only Services or EndpointSlices changed: forget the routes that use them.
        let scoped = cache.world.as_ref().and_then(|w| {
            let others_same = w.params == *params
                && w.addrs.len() == addrs.len()
                && (0..addrs.len())
                    .filter(|&i| i != SERVICES && i != ENDPOINT_SLICES)
                    .all(|i| w.addrs[i] == addrs[i]);
            let changed = others_same.then(|| changed_services(&w.held, &held))?;
            let own = changed.iter().any(|(ns, _)| *ns == params.namespace);
            (!own).then_some(changed)
        });
        match scoped {
            Some(changed) => {
                cache.routes.invalidate_services(&changed);
            }
            None => cache.routes.clear(),
        }
        cache.world = Some(World {
            addrs,
            params: params.clone(),
            held,
        });
    }
    cache.routes.begin();
    let mut b = Builder::new(snapshot, params);
    b.route_cache = Some(&mut cache.routes);
    gateway::translate(&mut b);
    ingress::translate(&mut b);
    site::translate(&mut b);
    let out = b.finish();
    cache.routes.end();
    out
}

#[cfg(test)]
mod tests {
    use super::super::translate;
    use super::*;
    use std::path::{Path, PathBuf};

    fn goldens() -> Vec<(PathBuf, Snapshot, Params)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/translate");
        let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".in.yaml"))
            .collect();
        inputs.sort();
        inputs
            .into_iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p).unwrap();
                let (snapshot, overrides) = Snapshot::from_yaml(&text).unwrap();
                let params = match overrides {
                    Some(mut v) => {
                        if let Some(m) = v.as_mapping_mut() {
                            m.remove("kind");
                            m.remove("apiVersion");
                        }
                        serde_yaml::from_value(v).unwrap()
                    }
                    None => Params::default(),
                };
                (p, snapshot, params)
            })
            .collect()
    }

    fn route_count(s: &Snapshot) -> usize {
        s.http_routes.len()
            + s.grpc_routes.len()
            + s.tls_routes.len()
            + s.tcp_routes.len()
            + s.udp_routes.len()
    }

    /// xorshift64*: deterministic edit sequences without a dependency.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
        }
    }

    /// Replace the `Arc` at a random index with a copy (same content, new identity).
    fn touch<T: Clone>(rng: &mut Rng, list: &mut [Arc<T>]) -> bool {
        if list.is_empty() {
            return false;
        }
        let i = rng.below(list.len());
        list[i] = Arc::new((*list[i]).clone());
        true
    }

    fn remove<T>(rng: &mut Rng, list: &mut Vec<Arc<T>>) -> Option<Arc<T>> {
        (!list.is_empty()).then(|| list.remove(rng.below(list.len())))
    }

    /// One random edit of the kind a watch event makes. Returns what it did.
    fn edit(
        rng: &mut Rng,
        s: &mut Snapshot,
        removed: &mut Vec<Arc<sweety_gateway_api::httproutes::HttpRoute>>,
    ) -> &'static str {
        match rng.below(12) {
            0 | 1 => {
                if touch(rng, &mut s.http_routes) {
                    "touch HTTPRoute"
                } else {
                    "none"
                }
            }
            2 => {
                // A content change: one HTTPRoute takes the spec of another (or of itself, with
                // its first hostname changed).
                if s.http_routes.is_empty() {
                    return "none";
                }
                let i = rng.below(s.http_routes.len());
                let j = rng.below(s.http_routes.len());
                let mut r = (*s.http_routes[i]).clone();
                r.spec = s.http_routes[j].spec.clone();
                if i == j {
                    r.spec.hostnames =
                        Some(vec![format!("edited-{}.example.com", rng.below(1000))]);
                }
                s.http_routes[i] = Arc::new(r);
                "change HTTPRoute"
            }
            3 => match remove(rng, &mut s.http_routes) {
                Some(r) => {
                    removed.push(r);
                    "remove HTTPRoute"
                }
                None => "none",
            },
            4 => match removed.pop() {
                Some(r) => {
                    s.http_routes.push(r);
                    "re-add HTTPRoute"
                }
                None => "none",
            },
            5 => {
                let a = touch(rng, &mut s.grpc_routes);
                let b = touch(rng, &mut s.tls_routes);
                let c = touch(rng, &mut s.tcp_routes) | touch(rng, &mut s.udp_routes);
                if a || b || c {
                    "touch other routes"
                } else {
                    "none"
                }
            }
            6 => {
                let a = touch(rng, &mut s.services) | touch(rng, &mut s.endpoint_slices);
                if a {
                    "touch Service/EndpointSlice"
                } else {
                    "none"
                }
            }
            7 => match rng.below(4) {
                0 => remove(rng, &mut s.services).map_or("none", |_| "remove Service"),
                1 => {
                    remove(rng, &mut s.reference_grants).map_or("none", |_| "remove ReferenceGrant")
                }
                2 => remove(rng, &mut s.gateways).map_or("none", |_| "remove Gateway"),
                _ => remove(rng, &mut s.endpoint_slices).map_or("none", |_| "remove EndpointSlice"),
            },
            8 => {
                let a = touch(rng, &mut s.gateways) | touch(rng, &mut s.namespaces);
                if a {
                    "touch Gateway/Namespace"
                } else {
                    "none"
                }
            }
            10 => {
                // A content change of an EndpointSlice: its first endpoint moves, or it loses
                // its endpoints.
                if s.endpoint_slices.is_empty() {
                    return "none";
                }
                let i = rng.below(s.endpoint_slices.len());
                let mut es = (*s.endpoint_slices[i]).clone();
                match es
                    .endpoints
                    .first_mut()
                    .and_then(|e| e.addresses.first_mut())
                {
                    Some(a) if rng.below(3) > 0 => {
                        *a = format!("10.99.{}.{}", rng.below(250), rng.below(250))
                    }
                    _ => es.endpoints.clear(),
                }
                s.endpoint_slices[i] = Arc::new(es);
                "edit EndpointSlice"
            }
            11 => {
                // A content change of a Service: its first port changes number.
                if s.services.is_empty() {
                    return "none";
                }
                let i = rng.below(s.services.len());
                let mut svc = (*s.services[i]).clone();
                let port = svc
                    .spec
                    .as_mut()
                    .and_then(|sp| sp.ports.as_mut())
                    .and_then(|p| p.first_mut());
                match port {
                    Some(p) => p.port += 1,
                    None => return "none",
                }
                s.services[i] = Arc::new(svc);
                "edit Service"
            }
            _ => {
                s.http_routes.reverse();
                s.grpc_routes.reverse();
                "reorder routes"
            }
        }
    }

    #[test]
    fn translate_incremental_matches_translate() {
        let cases = goldens();
        assert!(cases.len() >= 60, "golden inputs: {}", cases.len());
        let (mut replayed_total, mut edit_replays) = (0, 0);
        for (n, (path, snapshot, params)) in cases.into_iter().enumerate() {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let mut cache = TranslateCache::default();
            let mut s = snapshot;
            assert_eq!(
                translate_incremental(&s, &params, &mut cache),
                translate(&s, &params),
                "{name}: first run"
            );
            // Nothing changed: every route is replayed, the output is the same.
            assert_eq!(
                translate_incremental(&s, &params, &mut cache),
                translate(&s, &params),
                "{name}: unchanged rerun"
            );
            assert_eq!(
                cache.stats(),
                CacheStats {
                    replayed: route_count(&s),
                    translated: 0
                },
                "{name}: unchanged rerun reuses every route"
            );
            replayed_total += route_count(&s);
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (n as u64 + 1));
            let mut removed = Vec::new();
            let mut done = Vec::new();
            for step in 0..24 {
                let what = edit(&mut rng, &mut s, &mut removed);
                done.push(what);
                let incremental = translate_incremental(&s, &params, &mut cache);
                edit_replays += cache.stats().replayed;
                let full = translate(&s, &params);
                assert!(
                    incremental == full,
                    "{name}: step {step}, after {done:?}: incremental output differs\n--- incremental ---\n{}\n--- translate ---\n{}",
                    serde_yaml::to_string(&incremental).unwrap(),
                    serde_yaml::to_string(&full).unwrap()
                );
            }
        }
        // The comparisons above covered replays, not only fresh translations.
        assert!(
            replayed_total >= 50,
            "replays of unchanged goldens: {replayed_total}"
        );
        assert!(
            edit_replays >= 500,
            "replays during edit sequences: {edit_replays}"
        );
    }

    #[test]
    fn one_changed_route_is_the_only_one_translated_again() {
        let mut y = String::from(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: sweety}\nspec: {controllerName: sweety.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: app}\n\
spec:\n  gatewayClassName: sweety\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n---\n\
apiVersion: v1\nkind: Service\nmetadata: {name: svc, namespace: app}\nspec: {ports: [{name: http, port: 80}]}\n---\n",
        );
        for r in 0..50 {
            y.push_str(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{r}, namespace: app}}\n\
spec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [r{r}.example.com]\n  rules: [{{backendRefs: [{{name: svc, port: 80}}]}}]\n---\n"
            ));
        }
        let (mut s, _) = Snapshot::from_yaml(&y).unwrap();
        let params = Params::default();
        let mut cache = TranslateCache::default();
        let first = translate_incremental(&s, &params, &mut cache);
        assert_eq!(
            cache.stats(),
            CacheStats {
                replayed: 0,
                translated: 50
            }
        );
        assert_eq!(first.config.virtual_hosts.len(), 50);

        let mut r = (*s.http_routes[7]).clone();
        r.spec.hostnames = Some(vec!["changed.example.com".into()]);
        s.http_routes[7] = Arc::new(r);
        let out = translate_incremental(&s, &params, &mut cache);
        assert_eq!(
            cache.stats(),
            CacheStats {
                replayed: 49,
                translated: 1
            }
        );
        assert_eq!(out, translate(&s, &params));
        let hosts: Vec<&str> = out
            .config
            .virtual_hosts
            .iter()
            .flat_map(|v| v.hostnames.iter().map(String::as_str))
            .collect();
        assert!(hosts.contains(&"changed.example.com"), "{hosts:?}");
        assert!(!hosts.contains(&"r7.example.com"), "{hosts:?}");

        // A Service change re-translates the routes that use it: here, all of them.
        s.services[0] = Arc::new((*s.services[0]).clone());
        assert_eq!(
            translate_incremental(&s, &params, &mut cache),
            translate(&s, &params)
        );
        assert_eq!(
            cache.stats(),
            CacheStats {
                replayed: 0,
                translated: 50
            }
        );

        // So can other params.
        let other = Params {
            listen_address: "127.0.0.1".into(),
            ..Params::default()
        };
        assert_eq!(
            translate_incremental(&s, &other, &mut cache),
            translate(&s, &other)
        );
        assert_eq!(cache.stats().translated, 50);
    }

    #[test]
    fn an_endpoint_slice_change_translates_only_the_routes_of_its_service() {
        let mut y = String::from(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: sweety}\nspec: {controllerName: sweety.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: app}\n\
spec:\n  gatewayClassName: sweety\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n---\n",
        );
        for s in 0..3 {
            y.push_str(&format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: svc{s}, namespace: app}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc{s}-a, namespace: app, labels: {{kubernetes.io/service-name: svc{s}}}}}\n\
addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [10.0.0.{s}]}}]\n---\n"
            ));
        }
        for r in 0..30 {
            y.push_str(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{r}, namespace: app}}\n\
spec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [r{r}.example.com]\n  rules: [{{backendRefs: [{{name: svc{}, port: 80}}]}}]\n---\n",
                r % 3
            ));
        }
        let (mut s, _) = Snapshot::from_yaml(&y).unwrap();
        let params = Params::default();
        let mut cache = TranslateCache::default();
        translate_incremental(&s, &params, &mut cache);
        assert_eq!(cache.stats().translated, 30);

        // svc1's endpoints change: its 10 routes are translated again, the rest replayed.
        let i = s
            .endpoint_slices
            .iter()
            .position(|e| e.metadata.name.as_deref() == Some("svc1-a"))
            .unwrap();
        let mut es = (*s.endpoint_slices[i]).clone();
        es.endpoints[0].addresses = vec!["10.0.9.9".into()];
        s.endpoint_slices[i] = Arc::new(es);
        let out = translate_incremental(&s, &params, &mut cache);
        assert_eq!(
            cache.stats(),
            CacheStats {
                replayed: 20,
                translated: 10
            }
        );
        assert_eq!(out, translate(&s, &params));
        let addrs: Vec<&str> = out
            .config
            .backends
            .iter()
            .flat_map(|b| b.endpoints.iter().map(|e| e.address.as_str()))
            .collect();
        assert!(addrs.contains(&"10.0.9.9:8080"), "{addrs:?}");

        // A new Service nobody references yet: nothing is translated again.
        let mut svc = (*s.services[0]).clone();
        svc.metadata.name = Some("unused".into());
        s.services.push(Arc::new(svc));
        assert_eq!(
            translate_incremental(&s, &params, &mut cache),
            translate(&s, &params)
        );
        assert_eq!(cache.stats().translated, 0);

        // A Service in the controller's namespace (per-Gateway Services, read by port
        // allocation) clears everything.
        let mut own = (*s.services[0]).clone();
        own.metadata.namespace = Some(params.namespace.clone());
        s.services.push(Arc::new(own));
        assert_eq!(
            translate_incremental(&s, &params, &mut cache),
            translate(&s, &params)
        );
        assert_eq!(cache.stats().translated, 30);
    }
}
