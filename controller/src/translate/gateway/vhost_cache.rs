//! Virtual-host-level memo of [`crate::translate::translate_incremental`] for the Gateway API
//! front end: a change costs what it touches, not a pass over every route.
//!
//! [`VhostMemo`] keeps, for one "world" (every object but the routes, and the params, as the
//! caller checks), the Gateway state of [`super::World`] with live attachment counts, what
//! each route object contributed (where its rules were placed, its backends, attachments,
//! policy use and status key), the rules of every virtual host (Gateway port and hostname)
//! and of every L4 listener, reference counts of backends and policy use, and the emitted
//! listeners, virtual hosts and backends as digested [`Item`]s.
//!
//! [`VhostMemo::sync`] takes a snapshot of the same world: route objects whose `Arc` it has
//! not seen are translated, those gone (or whose Services changed) are taken out, and only
//! the virtual hosts, L4 listeners, Gateway statuses and policy statuses they touched are
//! emitted again. Which route objects changed it learns from the snapshot's
//! [`RouteChanges`] when they start where the memo's last sync ended (the watch layer's
//! journal; [`VhostMemo::visited`] is then the number of routes listed): only those are
//! looked at. Otherwise (the first sync, a gap in the journal, Services that changed) it
//! compares every route object of the snapshot with the ones it holds. Emission uses the same functions as `emit::emit` (`place_http`,
//! `virtual_host`, `l4_listener`, `status`), so the result is what `translate` gives;
//! `translate_incremental_matches_translate` checks it.
//!
//! Not handled here (the caller falls back to plain translation; [`Unsupported`] says why):
//! Gateways with a backend client certificate (their routes' backends are rewritten per
//! Gateway and unused originals dropped), two route objects with the same kind, namespace
//! and name, and two routes giving different backends under one name.

use super::capture::{self, Object};
use super::emit::{self, GatewayLayout, PortL4Route};
use super::listeners::RouteKind;
use super::routes::{self, Collected, SortKey};
use super::{policy, security, World};
use crate::config_items::Item;
use crate::translate::snapshot::{RouteChanges, RouteObject};
use crate::translate::status::{ObjectKey, ObjectStatus};
use crate::translate::{Builder, GatewayService};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use sweety_config::{Backend, Listener, Route, VirtualHost};

/// The kind of the statuses `policy::statuses` writes.
const POLICY_KIND: &str = "BackendTLSPolicy";

/// A route object's identity: kind, namespace, name (the Gateway API route order).
type RouteId = (RouteKind, String, String);

/// A virtual host: (Gateway, group of its layout, hostname or "").
type HostKey = (usize, usize, String);

/// What one route object contributed.
struct RouteMemo {
    _keep: Arc<dyn Any + Send + Sync>,
    id: RouteId,
    /// Creation time (the first part of its rules' sort keys).
    created: String,
    /// Virtual hosts and the indices of the rules placed there.
    placements: Vec<(HostKey, usize)>,
    /// L4 groups (Gateway, group) it has routes in.
    l4: Vec<(usize, usize)>,
    /// Backends (by name) it registered.
    backends: Vec<String>,
    /// (Gateway, listener) attachment increments.
    attached: Vec<(usize, usize)>,
    /// (policy, Gateway) uses.
    used_by: Vec<((String, String), (String, String))>,
    /// The HTTPRoute whose attachments it recorded for SweetySecurityPolicies.
    security_attachments: Vec<(String, String)>,
    status: Option<ObjectKey>,
    /// Services (namespace, name) its translation looked up.
    services: BTreeSet<(String, String)>,
    seen: u64,
}

/// What a [`VhostMemo::sync`] changed in the output.
#[derive(Default)]
pub struct Changes {
    /// Names of listeners added, replaced or removed.
    pub listeners: BTreeSet<String>,
    /// Names of virtual hosts added, replaced or removed.
    pub virtual_hosts: BTreeSet<String>,
    /// Names of backends added, replaced or removed.
    pub backends: BTreeSet<String>,
    /// Statuses set (Some) or removed (None), in order.
    pub statuses: Vec<(ObjectKey, Option<ObjectStatus>)>,
}

/// Why the memo cannot represent a snapshot (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsupported {
    /// A Gateway with a backend client certificate (the world).
    BackendClientCert,
    /// Two Gateway HTTP listeners with one name (the world).
    ListenerName,
    /// Two route objects with the same kind, namespace and name.
    DuplicateRoute,
    /// Two routes giving different backends under one name.
    BackendConflict,
    /// A listener or virtual host name both the routes and the Ingresses or SweetySites use.
    FrontName,
}

impl Unsupported {
    /// True when the cause is in the world (every object but the routes, Ingresses,
    /// IngressClasses and SweetySites), so only a change of the world can lift it.
    pub fn in_world(self) -> bool {
        matches!(
            self,
            Unsupported::BackendClientCert | Unsupported::ListenerName
        )
    }

    /// A short name (logs).
    pub fn name(self) -> &'static str {
        match self {
            Unsupported::BackendClientCert => "backend client certificate",
            Unsupported::ListenerName => "listener name",
            Unsupported::DuplicateRoute => "duplicate route",
            Unsupported::BackendConflict => "backend conflict",
            Unsupported::FrontName => "name shared with Ingresses or SweetySites",
        }
    }
}

/// See the module docs.
pub struct VhostMemo {
    world: World,
    layout: Vec<GatewayLayout>,
    routes: HashMap<usize, RouteMemo>,
    ids: HashMap<RouteId, usize>,
    /// Rules of each virtual host by (sort key, kind): the first kind of a sort key wins.
    hosts: HashMap<HostKey, BTreeMap<(SortKey, RouteKind), Route>>,
    /// L4 routes of each L4 group, per route object in route order.
    l4: BTreeMap<(usize, usize), BTreeMap<RouteId, Vec<PortL4Route>>>,
    /// Backends and how many route objects registered each.
    backend_refs: BTreeMap<String, (Item<Backend>, usize)>,
    /// policy → Gateway → how many route objects made the policy reach it.
    used_by: BTreeMap<(String, String), BTreeMap<(String, String), usize>>,
    /// Keys of the BackendTLSPolicy statuses last written.
    policy_keys: BTreeSet<ObjectKey>,
    /// Keys of the SweetySecurityPolicy statuses last written.
    security_keys: BTreeSet<ObjectKey>,
    epoch: u64,
    /// The emitted Gateway listeners, by name.
    pub listeners: BTreeMap<String, Item<Listener>>,
    /// The emitted Gateway virtual hosts, by name.
    pub virtual_hosts: BTreeMap<String, Item<VirtualHost>>,
    /// The per-Gateway Services (sorted by name).
    pub gateway_services: Vec<GatewayService>,
    /// Route objects translated by the last sync.
    pub translated: usize,
    /// Route objects the last sync found unchanged (their output reused).
    pub reused: usize,
    /// Route objects the last sync looked at: every route of the snapshot, or only those
    /// its [`RouteChanges`] listed.
    pub visited: usize,
    /// The journal position of the snapshot of the last sync ([`crate::translate::Snapshot::routes_at`]).
    routes_at: Option<u64>,
}

/// A changed route object's kind, metadata and [`Object`].
fn parts(o: &RouteObject) -> (RouteKind, &ObjectMeta, Object<'_>) {
    match o {
        RouteObject::Http(r) => (RouteKind::Http, &r.metadata, Object::new(r, &r.spec)),
        RouteObject::Grpc(r) => (RouteKind::Grpc, &r.metadata, Object::new(r, &r.spec)),
        RouteObject::Tls(r) => (RouteKind::Tls, &r.metadata, Object::new(r, &r.spec)),
        RouteObject::Tcp(r) => (RouteKind::Tcp, &r.metadata, Object::new(r, &r.spec)),
        RouteObject::Udp(r) => (RouteKind::Udp, &r.metadata, Object::new(r, &r.spec)),
    }
}

/// The route objects of the snapshot that `known` does not know (with `known` marking the
/// others), and how many it knew.
fn unknown<'s>(
    b: &Builder<'s>,
    mut known: impl FnMut(usize) -> bool,
) -> (Vec<(RouteKind, &'s ObjectMeta, Object<'s>)>, usize) {
    let s = b.snapshot;
    let mut new = Vec::new();
    let mut seen = 0;
    macro_rules! add {
        ($list:expr, $kind:expr) => {
            for r in &$list {
                // The address `Object::addr` gives, without building the object.
                if known(Arc::as_ptr(r) as *const () as usize) {
                    seen += 1;
                } else {
                    new.push(($kind, &r.metadata, Object::new(r, &r.spec)));
                }
            }
        };
    }
    add!(s.http_routes, RouteKind::Http);
    add!(s.grpc_routes, RouteKind::Grpc);
    add!(s.tls_routes, RouteKind::Tls);
    add!(s.tcp_routes, RouteKind::Tcp);
    add!(s.udp_routes, RouteKind::Udp);
    (new, seen)
}

/// Dirty parts of one sync.
#[derive(Default)]
struct Dirty {
    /// Every virtual host (the first sync), else `hosts`.
    all_hosts: bool,
    hosts: BTreeSet<HostKey>,
    l4: BTreeSet<(usize, usize)>,
    gateways: BTreeSet<usize>,
    policies: bool,
    /// A route object came or went (SweetySecurityPolicy statuses read the routes).
    routes: bool,
}

impl VhostMemo {
    /// A memo for the world of `b`'s snapshot (its world statuses are left in `b`), or
    /// `Unsupported`. Follow with [`VhostMemo::sync`] for the routes.
    pub fn new(b: &mut Builder<'_>) -> Result<VhostMemo, Unsupported> {
        let world = super::world(b);
        if world
            .gateways
            .iter()
            .any(|g| matches!(g.backend_client_cert, Ok(Some(_))))
        {
            return Err(Unsupported::BackendClientCert);
        }
        let layout = emit::layout(b, &world.gateways);
        let mut listeners = BTreeMap::new();
        for (gw, lay) in world.gateways.iter().zip(&layout) {
            for group in &lay.groups {
                // An L4 group starts without routes (its port is bound all the same: see
                // `emit::l4_listener`); the routes that reach it mark it dirty in `sync`.
                let listener = if group.is_http() {
                    group.listener.clone()
                } else {
                    emit::l4_listener(gw, group, Vec::new())
                };
                let item = Item::new(listener);
                if listeners
                    .insert(group.listener.name.clone(), item)
                    .is_some()
                {
                    return Err(Unsupported::ListenerName);
                }
            }
        }
        Ok(VhostMemo {
            world,
            layout,
            routes: HashMap::new(),
            ids: HashMap::new(),
            hosts: HashMap::new(),
            l4: BTreeMap::new(),
            backend_refs: BTreeMap::new(),
            used_by: BTreeMap::new(),
            policy_keys: BTreeSet::new(),
            security_keys: BTreeSet::new(),
            epoch: 0,
            listeners,
            virtual_hosts: BTreeMap::new(),
            gateway_services: Vec::new(),
            translated: 0,
            reused: 0,
            visited: 0,
            routes_at: None,
        })
    }

    /// The user sets of the world's SweetySecurityPolicies (the config's `user_sets`).
    pub fn user_sets(&self) -> Vec<sweety_config::UserSet> {
        self.world.policies.security.user_sets()
    }

    /// The backends every route registered, by name.
    pub fn backends(&self) -> impl Iterator<Item = (&String, &Item<Backend>)> {
        self.backend_refs.iter().map(|(n, (i, _))| (n, i))
    }

    /// One backend by name.
    pub fn backend(&self, name: &str) -> Option<&Item<Backend>> {
        self.backend_refs.get(name).map(|(i, _)| i)
    }

    /// Brings the memo to `b`'s snapshot (same world as the memo's, except for the Services
    /// in `stale_services`: routes that looked them up are translated again). `first`: the
    /// first sync after [`VhostMemo::new`] (every Gateway status and listener is emitted).
    /// Statuses written into `b` (and the changes) go into `changes`. On `Unsupported` the
    /// memo is unusable.
    pub fn sync(
        &mut self,
        b: &mut Builder<'_>,
        stale_services: Option<&BTreeSet<(String, String)>>,
        first: bool,
        changes: &mut Changes,
    ) -> Result<(), Unsupported> {
        self.epoch += 1;
        self.translated = 0;
        self.reused = 0;
        let mut dirty = Dirty::default();
        if first {
            dirty.all_hosts = true;
            dirty.gateways.extend(0..self.world.gateways.len());
            dirty.policies = true;
            changes.listeners.extend(self.listeners.keys().cloned());
        }
        if let Some(stale) = stale_services {
            let gone: Vec<usize> = self
                .routes
                .iter()
                .filter(|(_, m)| m.services.iter().any(|s| stale.contains(s)))
                .map(|(a, _)| *a)
                .collect();
            for addr in gone {
                self.remove(addr, &mut dirty, changes);
            }
        }
        let s = b.snapshot;
        // The routes that changed since the last sync, when the snapshot's journal says so
        // from where that sync ended (Services that changed need every route compared).
        let listed = s.routes_changed.as_ref().filter(|c| {
            !first
                && stale_services.is_none()
                && s.routes_at.is_some()
                && self.routes_at == Some(c.since)
        });
        self.routes_at = s.routes_at;
        match listed {
            Some(c) => self.sync_listed(b, c, &mut dirty, changes)?,
            None => self.sync_all(b, &mut dirty, changes)?,
        }
        self.emit(b, dirty, first, changes);
        Ok(())
    }

    /// Compares every route object of the snapshot with those held.
    fn sync_all(
        &mut self,
        b: &mut Builder<'_>,
        dirty: &mut Dirty,
        changes: &mut Changes,
    ) -> Result<(), Unsupported> {
        let epoch = self.epoch;
        let routes = &mut self.routes;
        let (new, seen) = unknown(b, |addr| match routes.get_mut(&addr) {
            Some(m) => {
                m.seen = epoch;
                true
            }
            None => false,
        });
        self.reused = seen;
        self.visited = seen + new.len();
        // Take out what left before adding what came, so a replaced object's backends are
        // never compared with its successor's.
        let gone: Vec<usize> = self
            .routes
            .iter()
            .filter(|(_, m)| m.seen != epoch)
            .map(|(a, _)| *a)
            .collect();
        for addr in gone {
            self.remove(addr, dirty, changes);
        }
        for (kind, meta, object) in new {
            self.add(b, kind, meta, object, dirty, changes)?;
            self.translated += 1;
        }
        Ok(())
    }

    /// Looks only at the route objects `listed` names: each one held under that name and
    /// not the listed object is taken out, each listed object not held is added.
    fn sync_listed(
        &mut self,
        b: &mut Builder<'_>,
        listed: &RouteChanges,
        dirty: &mut Dirty,
        changes: &mut Changes,
    ) -> Result<(), Unsupported> {
        // Take out first (as `sync_all`), then add.
        let mut add = Vec::new();
        for r in &listed.routes {
            let object = r.object.as_ref().map(parts);
            let kind = match &object {
                Some((kind, _, _)) => *kind,
                None => match RouteKind::from_name(r.kind) {
                    Some(kind) => kind,
                    None => continue,
                },
            };
            let held = self
                .ids
                .get(&(kind, r.namespace.clone(), r.name.clone()))
                .copied();
            let addr = object.as_ref().map(|(_, _, o)| o.addr());
            if held.is_some() && held == addr {
                continue;
            }
            if let Some(a) = held {
                self.remove(a, dirty, changes);
            }
            add.extend(object);
        }
        for (kind, meta, object) in add {
            if self.routes.contains_key(&object.addr()) {
                // Listed twice: added already.
                continue;
            }
            self.add(b, kind, meta, object, dirty, changes)?;
            self.translated += 1;
        }
        self.visited = listed.routes.len();
        self.reused = self.routes.len() - self.translated;
        Ok(())
    }

    /// Translates one route object and adds what it contributes.
    fn add(
        &mut self,
        b: &mut Builder<'_>,
        kind: RouteKind,
        meta: &ObjectMeta,
        object: Object<'_>,
        dirty: &mut Dirty,
        changes: &mut Changes,
    ) -> Result<(), Unsupported> {
        let id: RouteId = (
            kind,
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        if self.ids.contains_key(&id) {
            return Err(Unsupported::DuplicateRoute);
        }
        dirty.routes = true;
        let mut out = Collected::default();
        let (fx, services) = capture::capture(
            b,
            &mut self.world.gateways,
            &mut self.world.policies,
            &mut out,
            |b, g, p, o| routes::route(b, g, p, o, kind, meta, &object.spec()),
        );
        let key = ObjectKey::new(kind.name(), &id.1, &id.2);
        let status = b.statuses.contains_key(&key).then_some(key);
        let mut memo = RouteMemo {
            _keep: object.keep(),
            id: id.clone(),
            created: String::new(),
            placements: Vec::new(),
            l4: Vec::new(),
            backends: Vec::new(),
            attached: fx.attached,
            used_by: Vec::new(),
            security_attachments: Vec::new(),
            status,
            services,
            seen: self.epoch,
        };
        // (The translation counted its attachments in `gateways` already.)
        for &(g, _) in &memo.attached {
            dirty.gateways.insert(g);
        }
        for (policy, gws) in fx.used_by {
            for gw in gws {
                let n = self
                    .used_by
                    .entry(policy.clone())
                    .or_default()
                    .entry(gw.clone())
                    .or_default();
                *n += 1;
                dirty.policies |= *n == 1;
                memo.used_by.push((policy.clone(), gw));
            }
        }
        for (route, gateways) in fx.security_attachments {
            memo.security_attachments.push(route.clone());
            self.world
                .policies
                .security
                .attachments
                .insert(route, gateways);
        }
        for backend in fx.backends {
            let name = backend.name.clone();
            match self.backend_refs.get_mut(&name) {
                Some((item, n)) => {
                    if *item.value != backend {
                        return Err(Unsupported::BackendConflict);
                    }
                    *n += 1;
                }
                None => {
                    self.backend_refs
                        .insert(name.clone(), (Item::new(backend), 1));
                    changes.backends.insert(name.clone());
                }
            }
            memo.backends.push(name);
        }
        for e in fx.http {
            let gw = &self.world.gateways[e.gw];
            let lay = &self.layout[e.gw];
            let Some(gi) = emit::group_of(gw, lay, e.listener) else {
                continue;
            };
            let group = &lay.groups[gi];
            if !group.is_http() {
                continue;
            }
            if memo.created.is_empty() {
                memo.created.clone_from(&e.key.0);
            }
            let rule = e.key.3;
            let mut key = Some(e.key);
            let placed = emit::place_http(gw, group, &e.hostnames, e.listener, e.route);
            let n = placed.len();
            for (i, (host, route)) in placed.into_iter().enumerate() {
                let hk = (e.gw, gi, host);
                let k = if i + 1 == n { key.take() } else { key.clone() };
                let k = k.expect("taken last");
                if !dirty.all_hosts {
                    dirty.hosts.insert(hk.clone());
                }
                memo.placements.push((hk.clone(), rule));
                self.hosts.entry(hk).or_default().insert((k, kind), route);
            }
        }
        for e in fx.l4 {
            let g = e.gw;
            let gw = &self.world.gateways[g];
            let Some(gi) = emit::group_of(gw, &self.layout[g], e.listener) else {
                continue;
            };
            if self.layout[g].groups[gi].is_http() {
                continue;
            }
            self.l4
                .entry((g, gi))
                .or_default()
                .entry(id.clone())
                .or_default()
                .push(emit::l4_entry(gw, e));
            dirty.l4.insert((g, gi));
            if !memo.l4.contains(&(g, gi)) {
                memo.l4.push((g, gi));
            }
        }
        self.ids.insert(id, object.addr());
        self.routes.insert(object.addr(), memo);
        Ok(())
    }

    /// Takes out everything a route object contributed.
    fn remove(&mut self, addr: usize, dirty: &mut Dirty, changes: &mut Changes) {
        let Some(m) = self.routes.remove(&addr) else {
            return;
        };
        self.ids.remove(&m.id);
        dirty.routes = true;
        for (g, l) in m.attached {
            self.world.gateways[g].listeners[l].attached -= 1;
            dirty.gateways.insert(g);
        }
        for (policy, gw) in m.used_by {
            if let Some(per) = self.used_by.get_mut(&policy) {
                if let Some(n) = per.get_mut(&gw) {
                    *n -= 1;
                    if *n == 0 {
                        per.remove(&gw);
                        dirty.policies = true;
                    }
                }
                if per.is_empty() {
                    self.used_by.remove(&policy);
                }
            }
        }
        for route in m.security_attachments {
            self.world.policies.security.attachments.remove(&route);
        }
        for name in m.backends {
            if let Some((_, n)) = self.backend_refs.get_mut(&name) {
                *n -= 1;
                if *n == 0 {
                    self.backend_refs.remove(&name);
                    changes.backends.insert(name);
                }
            }
        }
        if let Some(key) = m.status {
            changes.statuses.push((key, None));
        }
        for (hk, rule) in m.placements {
            if let Some(rules) = self.hosts.get_mut(&hk) {
                let key = (m.created.clone(), m.id.1.clone(), m.id.2.clone(), rule);
                rules.remove(&(key, m.id.0));
                if rules.is_empty() {
                    self.hosts.remove(&hk);
                }
            }
            dirty.hosts.insert(hk);
        }
        for gk in m.l4 {
            if let Some(per) = self.l4.get_mut(&gk) {
                per.remove(&m.id);
                if per.is_empty() {
                    self.l4.remove(&gk);
                }
            }
            dirty.l4.insert(gk);
        }
    }

    /// Emits the dirty virtual hosts, L4 listeners and statuses.
    fn emit(&mut self, b: &mut Builder<'_>, dirty: Dirty, first: bool, changes: &mut Changes) {
        if dirty.all_hosts {
            // The first sync: every virtual host, and the caller assembles everything (no
            // names to record).
            for (hk, rules) in &self.hosts {
                let (name, vh) = host(&self.layout, hk, Some(rules));
                set(&mut self.virtual_hosts, name, vh, &mut BTreeSet::new());
            }
        } else {
            for hk in dirty.hosts {
                let (name, vh) = host(&self.layout, &hk, self.hosts.get(&hk));
                set(
                    &mut self.virtual_hosts,
                    name,
                    vh,
                    &mut changes.virtual_hosts,
                );
            }
        }
        for (g, gi) in dirty.l4 {
            let gw = &self.world.gateways[g];
            let group = &self.layout[g].groups[gi];
            let routes: Vec<PortL4Route> = self
                .l4
                .get(&(g, gi))
                .into_iter()
                .flat_map(|per| per.values().flatten().cloned())
                .collect();
            let listener = Some(emit::l4_listener(gw, group, routes));
            set(
                &mut self.listeners,
                group.listener.name.clone(),
                listener,
                &mut changes.listeners,
            );
        }
        for g in dirty.gateways {
            emit::status(b, &self.world.gateways[g]);
        }
        if first {
            // The Services depend on the world only: built once per memo.
            self.gateway_services = self
                .world
                .gateways
                .iter()
                .zip(&self.layout)
                .filter_map(|(gw, lay)| emit::service(gw, lay.service_ports.clone(), b.params))
                .collect();
            self.gateway_services.sort_by(|a, b| a.name.cmp(&b.name));
        }
        if dirty.policies {
            for key in std::mem::take(&mut self.policy_keys) {
                changes.statuses.push((key, None));
            }
            self.world.policies.used_by = self
                .used_by
                .iter()
                .map(|(p, gws)| (p.clone(), gws.keys().cloned().collect()))
                .collect();
            policy::statuses(b, &self.world.policies);
            self.world.policies.used_by.clear();
            self.policy_keys = b
                .statuses
                .keys()
                .filter(|k| k.kind == POLICY_KIND)
                .cloned()
                .collect();
        }
        // SweetySecurityPolicy statuses read the world and the route objects (parents, rule
        // names): written again on the first sync and whenever a route object came or went.
        if first || (dirty.routes && !self.world.policies.security.is_empty()) {
            for key in std::mem::take(&mut self.security_keys) {
                changes.statuses.push((key, None));
            }
            security::statuses(b, &self.world.policies.security, &self.world.gateways);
            self.security_keys = b
                .statuses
                .keys()
                .filter(|k| k.kind == security::KIND)
                .cloned()
                .collect();
        }
        for (key, status) in std::mem::take(&mut b.statuses) {
            changes.statuses.push((key, Some(status)));
        }
    }
}

/// The name and (None: no rules left) the virtual host of `hk` with `rules`.
fn host(
    layout: &[GatewayLayout],
    hk: &HostKey,
    rules: Option<&BTreeMap<(SortKey, RouteKind), Route>>,
) -> (String, Option<VirtualHost>) {
    let (g, gi, host) = hk;
    let group = &layout[*g].groups[*gi];
    let name = emit::virtual_host_name(group, host);
    let vh = rules.map(|rules| {
        let mut routes = Vec::with_capacity(rules.len());
        let mut last: Option<&SortKey> = None;
        for ((key, _), route) in rules {
            // The same sort key from two kinds: the first kind's rule (translate's order) is
            // the one kept.
            if last != Some(key) {
                routes.push(route.clone());
            }
            last = Some(key);
        }
        emit::virtual_host(group, host.clone(), routes)
    });
    (name, vh)
}

/// Sets (Some) or removes (None) the item `name` of `map`, recording the name when the
/// content changed.
fn set<T: serde::Serialize>(
    map: &mut BTreeMap<String, Item<T>>,
    name: String,
    value: Option<T>,
    changed: &mut BTreeSet<String>,
) {
    match value {
        Some(v) => {
            let item = Item::new(v);
            if map.get(&name).is_some_and(|old| old.digest == item.digest) {
                return;
            }
            map.insert(name.clone(), item);
            changed.insert(name);
        }
        None => {
            if map.remove(&name).is_some() {
                changed.insert(name);
            }
        }
    }
}
