//! Incremental translation: [`translate_incremental`] gives exactly what [`super::translate`] gives,
//! but reuses what did not change since the previous call with the same [`TranslateCache`].
//! One changed HTTPRoute among thousands then costs the translation of that route and the
//! emission of the virtual hosts it touches, not a pass over all of them.
//!
//! The cache is an explicit input and output, so translation stays pure: no I/O, no clock,
//! and the output depends only on the snapshot and the params (the cache only saves work).
//!
//! What is reused, and when:
//! * the world of the routes: every object that is not a route, an Ingress, an IngressClass
//!   or a SweetySite (GatewayClasses, Gateways, ReferenceGrants, BackendTLSPolicies,
//!   ListenerSets, Services, EndpointSlices, Secrets, ConfigMaps, Namespaces,
//!   SweetyProxyConfigs, SweetySecurityPolicies) and the [`Params`]. When any of them changed
//!   (compared by `Arc` identity, in any order) every route is translated again, except for Services and
//!   EndpointSlices: when only those changed, only the routes whose translation looked up a
//!   changed Service (or the Service of a changed EndpointSlice) are translated again.
//!   A Service object named like a per-Gateway Service (which port allocation and Gateway
//!   status read, in any namespace) or named by a SweetySecurityPolicy's `extAuth` (the
//!   policies read it) still counts as a change of the world; EndpointSlices
//!   never do (translation reads them only through a Service lookup), so a readiness flip
//!   of the dataplane's own Service or of any other costs only the routes that use it;
//! * otherwise a route object whose `Arc` is the one seen last time is not translated again;
//!   a new or changed object is translated, objects that left the snapshot are forgotten.
//!   With [`gateway::VhostMemo`] (the usual case) the memo works per virtual host: only the
//!   virtual hosts, L4 listeners, Gateway and policy statuses a changed route touches are
//!   emitted again, and the output is updated in place. Where that memo does not apply (see
//!   its docs and [`TranslateCache::unsupported`]; rare: a Gateway with a backend client
//!   certificate, for one) every call is a plain [`super::translate`], its items reused
//!   where equal, until the world changes or, when the cause is in the routes (two routes
//!   giving different backends under one name, for one), until a route object, Ingress,
//!   IngressClass or SweetySite changes: the memo is then tried again;
//! * Ingresses and SweetySites (with [`gateway::VhostMemo`]): their translation is reused as a
//!   whole while the same Ingress, IngressClass and SweetySite objects (by `Arc` identity)
//!   are in the snapshot and none of the Services it looked up (backends, the ingress
//!   Service's addresses) or their EndpointSlices changed; a route change, or a change of a
//!   Service only the routes use, does not translate them. When one of them changes, all of
//!   them are translated again (Ingresses merge by host and SweetySites claim hostnames in
//!   age order, so one object's output depends on the others'), and the items and statuses
//!   are compared with the previous call's.
//!
//! [`TranslateCache::update`] returns the output as a [`Translation`] whose config is
//! [`ConfigItems`]: items that did not change keep their allocation and digest, which is what
//! the pusher builds deltas from without comparing or serializing them again.

use super::status::{ObjectKey, ObjectStatus, Statuses};
use super::{
    addressing, gateway, ingress, site, Builder, GatewayService, Output, Params, Snapshot,
    StaticContent,
};
use crate::config_items::{ConfigItems, Item};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use sweety_config::delta::{settings_of, Named};
use sweety_config::{Backend, Listener, VirtualHost};

/// What [`translate_incremental`] carries from one call to the next.
#[derive(Default)]
pub struct TranslateCache {
    world: Option<World>,
    /// Per-virtual-host memo (None: not built yet, or not usable for this world).
    vhosts: Option<gateway::VhostMemo>,
    /// Why `vhosts` cannot serve (plain translation serves meanwhile). A cause in the world
    /// lasts until the world changes; a cause in the routes (or Ingresses, IngressClasses,
    /// SweetySites) until they change: `tried` holds those the memo failed with.
    unsupported: Option<(gateway::vhost_cache::Unsupported, Option<Tried>)>,
    /// What Ingress and SweetySite translation gave last time (with `vhosts`).
    front: IngressSiteOutput,
    out: Option<Translation>,
    stats: CacheStats,
    /// Calls that translated every route (a new world, or one the memos cannot serve).
    full_translates: u64,
    /// Calls that translated every route because the memo could not serve.
    plain_translates: u64,
    /// Calls (with the per-virtual-host memo) that translated the Ingresses and SweetySites.
    front_translates: u64,
    /// The statuses [`super::proxy_settings::settings`] gave last time (with `vhosts`).
    setting_statuses: Vec<(ObjectKey, ObjectStatus)>,
    /// Route objects the last call looked at (see [`TranslateCache::visited`]).
    visited: usize,
}

/// The route objects, Ingresses, IngressClasses and SweetySites the per-virtual-host memo
/// failed with for a cause outside the world (held, so that their addresses stay theirs).
struct Tried {
    addrs: Vec<Vec<usize>>,
    _held: Snapshot,
}

impl Tried {
    fn addrs(s: &Snapshot) -> Vec<Vec<usize>> {
        vec![
            addrs(&s.http_routes),
            addrs(&s.grpc_routes),
            addrs(&s.tls_routes),
            addrs(&s.tcp_routes),
            addrs(&s.udp_routes),
            addrs(&s.ingresses),
            addrs(&s.ingress_classes),
            addrs(&s.sites),
        ]
    }

    fn of(s: &Snapshot) -> Tried {
        Tried {
            addrs: Tried::addrs(s),
            _held: Snapshot {
                http_routes: s.http_routes.clone(),
                grpc_routes: s.grpc_routes.clone(),
                tls_routes: s.tls_routes.clone(),
                tcp_routes: s.tcp_routes.clone(),
                udp_routes: s.udp_routes.clone(),
                ingresses: s.ingresses.clone(),
                ingress_classes: s.ingress_classes.clone(),
                sites: s.sites.clone(),
                ..Snapshot::default()
            },
        }
    }
}

/// Routes reused and translated by the last [`translate_incremental`] call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Route objects whose translation was reused from the memo.
    pub replayed: usize,
    /// Route objects translated again.
    pub translated: usize,
}

/// The output of [`TranslateCache::update`]: [`Output`] with the config as shared items.
#[derive(Clone, Debug)]
pub struct Translation {
    /// The dataplane config, as shared digested items.
    pub config: ConfigItems,
    /// The status of every object looked at, shared with the status worker.
    pub statuses: Arc<Statuses>,
    /// Which of `statuses` may differ from the previous call's output.
    pub status_changes: StatusChanges,
    /// The per-Gateway Services to create or update (sorted by name).
    pub gateway_services: Vec<GatewayService>,
    /// Static file directories to write before the config is pushed.
    pub static_content: Vec<StaticContent>,
}

/// Which statuses of a [`Translation`] may differ from those of the previous call with the
/// same cache: the status queue then compares only those, not every object's status (at
/// 5,000 routes that comparison was most of a reconcile's CPU).
#[derive(Clone, Debug, PartialEq)]
pub enum StatusChanges {
    /// Any of them (the first call, a new world, a plain translation).
    All,
    /// Only these keys: set, changed or removed (a key may be listed with its status unchanged).
    Only(Vec<ObjectKey>),
}

impl Translation {
    /// The same as an [`Output`] (copies everything).
    pub fn to_output(&self) -> Output {
        Output {
            config: self.config.to_config(),
            statuses: (*self.statuses).clone(),
            gateway_services: self.gateway_services.clone(),
            static_content: self.static_content.clone(),
        }
    }
}

impl TranslateCache {
    /// What the last call reused.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// How many calls so far translated every route: the first, every change of the world
    /// of the routes (see the module docs), every call that only the plain translation
    /// serves ([`Self::plain_translates`]), and the memo built again after those.
    pub fn full_translates(&self) -> u64 {
        self.full_translates
    }

    /// How many of [`Self::full_translates`] were plain translations because the
    /// per-virtual-host memo could not serve (see [`Self::unsupported`]).
    pub fn plain_translates(&self) -> u64 {
        self.plain_translates
    }

    /// Why the per-virtual-host memo does not serve the last snapshot (None: it does).
    pub fn unsupported(&self) -> Option<gateway::vhost_cache::Unsupported> {
        self.unsupported.as_ref().map(|(u, _)| *u)
    }

    /// How many route objects the last call looked at: with the per-virtual-host memo and the
    /// snapshot's [`super::RouteChanges`] continuing from the last call, those it lists;
    /// otherwise every route of the snapshot.
    pub fn visited(&self) -> usize {
        self.visited
    }

    /// How many calls so far translated the Ingresses and SweetySites (with the
    /// per-virtual-host memo; plain translation always does): see the module docs.
    pub fn front_translates(&self) -> u64 {
        self.front_translates
    }

    /// Translates `snapshot` (exactly what [`super::translate`] gives), reusing what did not
    /// change since the last call. See the module docs.
    pub fn update(&mut self, snapshot: &Snapshot, params: &Params) -> &Translation {
        let change = self.world_change(snapshot, params);
        if matches!(change, Change::All) {
            self.vhosts = None;
            self.unsupported = None;
        }
        // A cause in the routes is tried again once they (or the front's objects) changed;
        // a failed try costs a memo build on top of the plain translation.
        let retry = match &self.unsupported {
            None => true,
            Some((_, None)) => false,
            Some((_, Some(t))) => t.addrs != Tried::addrs(snapshot),
        };
        if retry {
            // Without a memo (a new world, or after a failure) every route is translated.
            let fresh = self.vhosts.is_none();
            match self.update_vhosts(snapshot, params, &change) {
                Ok(()) => {
                    self.full_translates += u64::from(fresh);
                    self.unsupported = None;
                    return self.out.as_ref().expect("just set");
                }
                Err(cause) => {
                    // Not for the per-virtual-host memo (for now): translate in full.
                    self.vhosts = None;
                    self.front = IngressSiteOutput::default();
                    let tried = (!cause.in_world()).then(|| Tried::of(snapshot));
                    self.unsupported = Some((cause, tried));
                }
            }
        }
        self.plain_translates += 1;
        self.update_full(snapshot, params);
        self.out.as_ref().expect("just set")
    }

    /// Compares the world with the last call's and remembers the new one.
    fn world_change(&mut self, snapshot: &Snapshot, params: &Params) -> Change {
        let (addrs, held) = world(snapshot);
        let Some(w) = self.world.as_ref() else {
            self.world = Some(World {
                addrs,
                params: params.clone(),
                held,
            });
            return Change::All;
        };
        if w.addrs == addrs && w.params == *params {
            return Change::None;
        }
        let others_same = w.params == *params
            && w.addrs.len() == addrs.len()
            && (0..addrs.len())
                .filter(|&i| i != SERVICES && i != ENDPOINT_SLICES)
                .all(|i| w.addrs[i] == addrs[i]);
        let change = match others_same.then(|| changed_services(&w.held, &held)) {
            // Port allocation and Gateway status read the per-Gateway Service objects (named
            // by prefix, in a Gateway's namespace or, from an older release, the
            // controller's). Any other Service, and every EndpointSlice, is read only through
            // the backend lookups each route records: a dataplane readiness flip (its
            // Service's slices) re-translates only the routes that use that Service.
            // The auth Services of SweetySecurityPolicies are read by the policies (the
            // world), not through a route's lookups: a change of one is a change of the world.
            Some(changed)
                if !changed
                    .objects
                    .iter()
                    .any(|(_, name)| name.starts_with(addressing::SERVICE_PREFIX))
                    && !gateway::security_services(&held)
                        .iter()
                        .any(|s| changed.objects.contains(s)) =>
            {
                Change::Services(changed)
            }
            _ => Change::All,
        };
        self.world = Some(World {
            addrs,
            params: params.clone(),
            held,
        });
        change
    }

    /// With the per-virtual-host memo; `Err` when this world is not for it.
    fn update_vhosts(
        &mut self,
        snapshot: &Snapshot,
        params: &Params,
        change: &Change,
    ) -> Result<(), gateway::vhost_cache::Unsupported> {
        let mut b = Builder::new(snapshot, params);
        let mut ch = gateway::Changes::default();
        let first = self.vhosts.is_none() || self.out.is_none();
        if first {
            self.vhosts = None;
            let mut memo = gateway::VhostMemo::new(&mut b)?;
            memo.sync(&mut b, None, true, &mut ch)?;
            self.vhosts = Some(memo);
        } else {
            let stale = match change {
                Change::Services(s) => Some(&s.all),
                _ => None,
            };
            let memo = self.vhosts.as_mut().expect("checked");
            if let Err(e) = memo.sync(&mut b, stale, false, &mut ch) {
                self.vhosts = None;
                return Err(e);
            }
        }
        drop(b);
        let memo = self.vhosts.as_ref().expect("just set");
        self.stats = CacheStats {
            replayed: memo.reused,
            translated: memo.translated,
        };
        self.visited = memo.visited;
        // A first sync assembles everything: the front's items and statuses all count as new.
        let prev_front = std::mem::take(&mut self.front);
        let prev_front = if first {
            IngressSiteOutput::default()
        } else {
            prev_front
        };
        let stale = match change {
            Change::Services(s) => Some(s),
            _ => None,
        };
        let (front, translated) =
            IngressSiteOutput::update(snapshot, params, memo, prev_front, stale, &mut ch)?;
        self.front = front;
        self.front_translates += u64::from(translated);
        // The dataplane-wide settings: a few objects, computed every time.
        let (settings, setting_statuses) = super::proxy_settings::settings(snapshot, params);
        let prev = std::mem::take(&mut self.setting_statuses);
        let prev = if first { Vec::new() } else { prev };
        super::proxy_settings::status_changes(&prev, &setting_statuses, &mut ch.statuses);
        self.setting_statuses = setting_statuses;
        let mut settings = settings_of(&settings);
        let (memo, front) = (self.vhosts.as_ref().expect("just set"), &self.front);
        // The SweetySecurityPolicies' user sets depend on the world only (as in `translate`).
        settings.user_sets = memo.user_sets();
        settings.user_sets.extend(front.user_sets.iter().cloned());
        match self.out.as_mut().filter(|_| !first) {
            Some(out) => {
                if *out.config.settings.value != settings {
                    out.config.settings = Item::new(settings);
                }
                apply(&mut out.config.listeners, &ch.listeners, |n| {
                    memo.listeners.get(n).or_else(|| front.listeners.get(n))
                });
                apply(&mut out.config.virtual_hosts, &ch.virtual_hosts, |n| {
                    memo.virtual_hosts
                        .get(n)
                        .or_else(|| front.virtual_hosts.get(n))
                });
                apply(&mut out.config.backends, &ch.backends, |n| {
                    memo.backend(n).or_else(|| front.backends.get(n))
                });
                let mut keys = Vec::with_capacity(ch.statuses.len());
                if !ch.statuses.is_empty() {
                    let statuses = Arc::make_mut(&mut out.statuses);
                    for (key, status) in ch.statuses {
                        keys.push(key.clone());
                        match status {
                            Some(s) => statuses.insert(key, s),
                            None => statuses.remove(&key),
                        };
                    }
                }
                out.status_changes = StatusChanges::Only(keys);
                if out.static_content != front.static_content {
                    out.static_content = front.static_content.clone();
                }
            }
            None => {
                let listeners = merged(memo.listeners.values(), front.listeners.values())?;
                let virtual_hosts =
                    merged(memo.virtual_hosts.values(), front.virtual_hosts.values())?;
                // A backend both use: the routes' (the one `translate` registers first).
                let front_only = front
                    .backends
                    .values()
                    .filter(|i| memo.backend(i.value.name()).is_none());
                let backends = merged(memo.backends().map(|(_, i)| i), front_only)?;
                let mut statuses = Statuses::new();
                for (key, status) in ch.statuses {
                    match status {
                        Some(s) => statuses.insert(key, s),
                        None => statuses.remove(&key),
                    };
                }
                let settings = Item::new(settings);
                self.out = Some(Translation {
                    config: ConfigItems {
                        settings,
                        listeners,
                        virtual_hosts,
                        backends,
                    },
                    statuses: Arc::new(statuses),
                    status_changes: StatusChanges::All,
                    gateway_services: memo.gateway_services.clone(),
                    static_content: front.static_content.clone(),
                });
            }
        }
        Ok(())
    }

    /// Plain translation, its items reused from the previous output where equal.
    fn update_full(&mut self, snapshot: &Snapshot, params: &Params) {
        self.full_translates += 1;
        let out = super::translate(snapshot, params);
        self.stats = CacheStats {
            replayed: 0,
            translated: snapshot.http_routes.len()
                + snapshot.grpc_routes.len()
                + snapshot.tls_routes.len()
                + snapshot.tcp_routes.len()
                + snapshot.udp_routes.len(),
        };
        self.visited = self.stats.translated;
        let config = match &self.out {
            Some(prev) => ConfigItems::from_config_reusing(out.config, &prev.config),
            None => ConfigItems::from_config(out.config),
        };
        self.out = Some(Translation {
            config,
            statuses: Arc::new(out.statuses),
            status_changes: StatusChanges::All,
            gateway_services: out.gateway_services,
            static_content: out.static_content,
        });
    }
}

/// How the world changed since the last call.
enum Change {
    None,
    /// Only Services and EndpointSlices.
    Services(ServiceChange),
    All,
}

/// Services (namespace, name) whose object or EndpointSlices changed.
struct ServiceChange {
    /// Every such Service.
    all: BTreeSet<(String, String)>,
    /// Those whose Service object changed (the others: only their EndpointSlices).
    objects: BTreeSet<(String, String)>,
}

/// Ingress and SweetySite output (translated after the Gateway API), and what it was
/// translated from.
#[derive(Default)]
struct IngressSiteOutput {
    listeners: BTreeMap<String, Item<Listener>>,
    virtual_hosts: BTreeMap<String, Item<VirtualHost>>,
    /// Backends the Ingresses and SweetySites use (the routes may use some of them too).
    backends: BTreeMap<String, Item<Backend>>,
    statuses: Statuses,
    static_content: Vec<StaticContent>,
    /// The user sets of the Ingresses' `auth-secret`s (after the SweetySecurityPolicies' in
    /// the config's `user_sets`, as `translate` puts them).
    user_sets: Vec<sweety_config::UserSet>,
    /// None: translate next time.
    inputs: Option<IngressSiteInputs>,
}

/// What an [`IngressSiteOutput`] translation read besides the world of the routes (whose changes, but
/// for Services, start a new memo and so a new translation).
struct IngressSiteInputs {
    /// Addresses of the Ingresses, IngressClasses and SweetySites, each list sorted.
    addrs: [Vec<usize>; 3],
    /// Those objects, held so that their addresses stay unique (a snapshot of them only).
    _held: Snapshot,
    /// Services (namespace, name) looked up: backends, and the ingress Service's addresses.
    services: BTreeSet<(String, String)>,
    /// Those whose EndpointSlices were read too: all but the ingress Service when no
    /// backend was made of it (a readiness flip of the dataplane's own Service then changes
    /// nothing here).
    endpoints_read: BTreeSet<(String, String)>,
}

impl IngressSiteOutput {
    /// `prev` again when nothing it was translated from changed: the same Ingresses,
    /// IngressClasses and SweetySites (by `Arc` identity), no Service object it looked up
    /// among `stale`, and no EndpointSlice of a Service whose endpoints it read. Otherwise
    /// [`IngressSiteOutput::translate`]. Also says whether it translated.
    fn update(
        snapshot: &Snapshot,
        params: &Params,
        memo: &gateway::VhostMemo,
        prev: IngressSiteOutput,
        stale: Option<&ServiceChange>,
        ch: &mut gateway::Changes,
    ) -> Result<(IngressSiteOutput, bool), gateway::vhost_cache::Unsupported> {
        let addrs = [
            addrs(&snapshot.ingresses),
            addrs(&snapshot.ingress_classes),
            addrs(&snapshot.sites),
        ];
        let same = prev.inputs.as_ref().is_some_and(|i| {
            i.addrs == addrs
                && stale.is_none_or(|s| {
                    s.objects.is_disjoint(&i.services) && s.all.is_disjoint(&i.endpoints_read)
                })
        });
        if !same {
            return Ok((
                IngressSiteOutput::translate(snapshot, params, memo, &prev, ch)?,
                true,
            ));
        }
        // The routes' listeners and virtual hosts that changed must still not take a name
        // of ours.
        let unsupported = gateway::vhost_cache::Unsupported::FrontName;
        if ch
            .listeners
            .iter()
            .any(|n| prev.listeners.contains_key(n) && memo.listeners.contains_key(n))
            || ch
                .virtual_hosts
                .iter()
                .any(|n| prev.virtual_hosts.contains_key(n) && memo.virtual_hosts.contains_key(n))
        {
            return Err(unsupported);
        }
        Ok((prev, false))
    }

    /// Translates the Ingresses and SweetySites of `snapshot` as `translate` does after the
    /// Gateway API, recording what differs from `prev` in `ch`.
    fn translate(
        snapshot: &Snapshot,
        params: &Params,
        memo: &gateway::VhostMemo,
        prev: &IngressSiteOutput,
        ch: &mut gateway::Changes,
    ) -> Result<IngressSiteOutput, gateway::vhost_cache::Unsupported> {
        let active = !snapshot.ingresses.is_empty() || !snapshot.sites.is_empty();
        let mut next = IngressSiteOutput::default();
        let mut services = BTreeSet::new();
        if active {
            // The routes' backends are not registered first (as `translate` does): a name
            // both register is the same Service port with the same options, so the same
            // backend, and the output takes the routes' (see `update_vhosts`).
            let mut b = Builder::new(snapshot, params);
            b.services.record();
            let ingress_hosts = ingress::translate(&mut b);
            site::translate(&mut b, &ingress_hosts);
            services = b.services.recorded();
            let unsupported = gateway::vhost_cache::Unsupported::FrontName;
            for l in b.listeners {
                if memo.listeners.contains_key(&l.name) || next.listeners.contains_key(&l.name) {
                    return Err(unsupported);
                }
                next.listeners
                    .insert(l.name.clone(), reuse(&prev.listeners, l));
            }
            for v in b.virtual_hosts {
                if memo.virtual_hosts.contains_key(&v.name)
                    || next.virtual_hosts.contains_key(&v.name)
                {
                    return Err(unsupported);
                }
                next.virtual_hosts
                    .insert(v.name.clone(), reuse(&prev.virtual_hosts, v));
            }
            for bk in b.backends.into_config() {
                next.backends
                    .insert(bk.name.clone(), reuse(&prev.backends, bk));
            }
            next.statuses = b.statuses;
            next.user_sets = std::mem::take(&mut b.config.user_sets);
            next.static_content = b.static_content;
            next.static_content.sort_by(|a, b| a.dir.cmp(&b.dir));
        }
        // Backend names start with `<namespace>/<service>:` (see `backends::Backends`).
        let mut endpoints_read = services.clone();
        if let Some(name) = params.ingress_service.as_deref() {
            let prefix = format!("{}/{name}:", params.namespace);
            if !next.backends.keys().any(|b| b.starts_with(&prefix)) {
                endpoints_read.remove(&(params.namespace.clone(), name.to_string()));
            }
        }
        next.inputs = Some(IngressSiteInputs {
            addrs: [
                addrs(&snapshot.ingresses),
                addrs(&snapshot.ingress_classes),
                addrs(&snapshot.sites),
            ],
            _held: Snapshot {
                ingresses: snapshot.ingresses.clone(),
                ingress_classes: snapshot.ingress_classes.clone(),
                sites: snapshot.sites.clone(),
                ..Snapshot::default()
            },
            services,
            endpoints_read,
        });
        changed_names(&prev.listeners, &next.listeners, &mut ch.listeners);
        changed_names(
            &prev.virtual_hosts,
            &next.virtual_hosts,
            &mut ch.virtual_hosts,
        );
        changed_names(&prev.backends, &next.backends, &mut ch.backends);
        for key in prev.statuses.keys() {
            if !next.statuses.contains_key(key) {
                ch.statuses.push((key.clone(), None));
            }
        }
        for (key, status) in &next.statuses {
            if prev.statuses.get(key) != Some(status) {
                ch.statuses.push((key.clone(), Some(status.clone())));
            }
        }
        Ok(next)
    }
}

/// `value` as an item: the previous item of its name when equal (no digest computed).
fn reuse<T>(prev: &BTreeMap<String, Item<T>>, value: T) -> Item<T>
where
    T: serde::Serialize + PartialEq + Named,
{
    match prev.get(value.name()) {
        Some(p) if *p.value == value => p.clone(),
        _ => Item::new(value),
    }
}

/// Names whose item differs between `a` and `b` (added, removed or changed).
fn changed_names<T>(
    a: &BTreeMap<String, Item<T>>,
    b: &BTreeMap<String, Item<T>>,
    out: &mut BTreeSet<String>,
) {
    for (n, i) in a {
        if !b.get(n).is_some_and(|j| j.same(i)) {
            out.insert(n.clone());
        }
    }
    for n in b.keys() {
        if !a.contains_key(n) {
            out.insert(n.clone());
        }
    }
}

/// Two name-sorted item sets as one list sorted by name; `Err` on a name in both.
fn merged<'a, T: Named + 'a>(
    a: impl Iterator<Item = &'a Item<T>>,
    b: impl Iterator<Item = &'a Item<T>>,
) -> Result<Vec<Item<T>>, gateway::vhost_cache::Unsupported> {
    let mut v: Vec<Item<T>> = a.chain(b).cloned().collect();
    v.sort_by(|x, y| x.value.name().cmp(y.value.name()));
    if v.windows(2).any(|w| w[0].value.name() == w[1].value.name()) {
        return Err(gateway::vhost_cache::Unsupported::FrontName);
    }
    Ok(v)
}

/// Updates the name-sorted `list` for the `changed` names from `get` (None: removed).
fn apply<'a, T: Named + 'a>(
    list: &mut Vec<Item<T>>,
    changed: &BTreeSet<String>,
    get: impl Fn(&str) -> Option<&'a Item<T>>,
) {
    for name in changed {
        let pos = list.binary_search_by(|i| i.value.name().cmp(name.as_str()));
        match (pos, get(name)) {
            (Ok(i), Some(item)) => list[i] = item.clone(),
            (Ok(i), None) => {
                list.remove(i);
            }
            (Err(i), Some(item)) => list.insert(i, item.clone()),
            (Err(_), None) => {}
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
const SERVICES: usize = 7;
const ENDPOINT_SLICES: usize = 8;

/// The Services whose object or EndpointSlices differ between `old` and `new` (by `Arc`
/// identity).
fn changed_services(old: &Snapshot, new: &Snapshot) -> ServiceChange {
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
    let mut objects = BTreeSet::new();
    for s in diff(&old.services, &new.services) {
        objects.insert(key(&s.metadata, s.metadata.name.as_ref()));
    }
    out.extend(objects.iter().cloned());
    for es in diff(&old.endpoint_slices, &new.endpoint_slices) {
        let svc = es
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::labels::SERVICE_NAME_LABEL));
        if let Some(svc) = svc {
            out.insert(key(&es.metadata, Some(svc)));
        }
    }
    ServiceChange { all: out, objects }
}

fn addrs<T>(list: &[Arc<T>]) -> Vec<usize> {
    let mut v: Vec<usize> = list.iter().map(|a| Arc::as_ptr(a) as usize).collect();
    v.sort_unstable();
    v
}

/// Every list of the snapshot that the routes' translation reads (not the routes, Ingresses,
/// IngressClasses and SweetySites): (addresses per list, the lists themselves).
fn world(s: &Snapshot) -> (Vec<Vec<usize>>, Snapshot) {
    let held = Snapshot {
        ingress_classes: Vec::new(),
        ingresses: Vec::new(),
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
        sites: Vec::new(),
        proxy_configs: s.proxy_configs.clone(),
        security_policies: s.security_policies.clone(),
        services: s.services.clone(),
        endpoint_slices: s.endpoint_slices.clone(),
        secrets: s.secrets.clone(),
        config_maps: s.config_maps.clone(),
        namespaces: s.namespaces.clone(),
        routes_at: None,
        routes_changed: None,
        created_at: None,
    };
    let a = vec![
        addrs(&s.gateway_classes),
        addrs(&s.gateways),
        addrs(&s.reference_grants),
        addrs(&s.backend_tls_policies),
        addrs(&s.listener_sets),
        addrs(&s.proxy_configs),
        addrs(&s.security_policies),
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
    cache.update(snapshot, params).to_output()
}

#[cfg(test)]
mod tests {
    use super::super::translate;
    use super::*;
    use crate::translate::RouteChanges;
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

    /// [`translate_incremental`], checking that every status that differs from the previous
    /// call's is among the [`StatusChanges`] the translation lists.
    fn checked(
        s: &Snapshot,
        params: &Params,
        cache: &mut TranslateCache,
        prev: &mut Option<Arc<Statuses>>,
        at: &str,
    ) -> Output {
        let t = cache.update(s, params);
        if let (Some(before), StatusChanges::Only(keys)) = (prev.as_ref(), &t.status_changes) {
            let listed: BTreeSet<&ObjectKey> = keys.iter().collect();
            let all: BTreeSet<&ObjectKey> = before.keys().chain(t.statuses.keys()).collect();
            for k in all {
                assert!(
                    before.get(k) == t.statuses.get(k) || listed.contains(k),
                    "{at}: the status of {k:?} changed but is not listed"
                );
            }
        }
        *prev = Some(t.statuses.clone());
        t.to_output()
    }

    fn route_count(s: &Snapshot) -> usize {
        s.http_routes.len()
            + s.grpc_routes.len()
            + s.tls_routes.len()
            + s.tcp_routes.len()
            + s.udp_routes.len()
    }

    /// `next` as the watch layer gives it after `prev`: its route lists one journal position
    /// further, with the route objects changed since `prev` listed. At `step`s where
    /// `step % 7 == 3` no list is given, and where `step % 11 == 5` the list starts at a
    /// position the cache did not see (a gap in the journal) and lists nothing: both must
    /// compare every route (the output differs from `translate` if the gap's list is used).
    fn journalled(prev: &Snapshot, next: &Snapshot, step: usize) -> Snapshot {
        let mut j = next.clone();
        let at = prev.routes_at.unwrap_or_default() + 2;
        let mut changes = RouteChanges::between(prev, next);
        if step % 11 == 5 {
            // Lists only what came after a position the cache never saw: here nothing.
            changes.since += 1;
            changes.routes.clear();
        }
        j.routes_at = Some(at);
        j.routes_changed = (step % 7 != 3).then_some(changes);
        j
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

    /// Every kind of edit [`edit`] makes (what it returns, "none" aside).
    const EDIT_KINDS: &[&str] = &[
        "touch HTTPRoute",
        "change HTTPRoute",
        "remove HTTPRoute",
        "re-add HTTPRoute",
        "touch other routes",
        "touch Service/EndpointSlice",
        "remove Service",
        "remove ReferenceGrant",
        "remove Gateway",
        "remove EndpointSlice",
        "touch Gateway/Namespace",
        "edit EndpointSlice",
        "edit Service",
        "move HTTPRoute to another Gateway",
        "move HTTPRoute to other hostnames",
        "change Gateway listener",
        "add HTTPRoute",
        "remove Ingress",
        "remove SweetySite",
        "re-add Ingress/SweetySite",
        "edit Ingress",
        "edit SweetySite",
        "touch Ingress/SweetySite",
        "reorder routes",
    ];

    /// Counts of the edits made, by kind.
    type EditCounts = BTreeMap<&'static str, usize>;

    /// Every kind in [`EDIT_KINDS`] was made at least once (and nothing else but "none").
    fn assert_every_kind(counts: &EditCounts, kinds: &[&str]) {
        for k in kinds {
            assert!(
                counts.get(k).copied().unwrap_or(0) >= 1,
                "edit kind {k:?} never happened: {counts:?}"
            );
        }
        for k in counts.keys() {
            assert!(
                *k == "none" || EDIT_KINDS.contains(k),
                "edit kind {k:?} is not listed in EDIT_KINDS"
            );
        }
    }

    /// Objects an edit took out, for a later edit to put back.
    #[derive(Default)]
    struct Removed {
        routes: Vec<Arc<sweety_gateway_api::httproutes::HttpRoute>>,
        ingresses: Vec<Arc<k8s_openapi::api::networking::v1::Ingress>>,
        sites: Vec<Arc<sweety_crds::SweetySite>>,
    }

    /// One random edit of an Ingress or a SweetySite (memoized beside the routes' memo).
    fn edit_front(rng: &mut Rng, s: &mut Snapshot, removed: &mut Removed) -> &'static str {
        match rng.below(8) {
            0 => match remove(rng, &mut s.ingresses) {
                Some(i) => {
                    removed.ingresses.push(i);
                    "remove Ingress"
                }
                None => "none",
            },
            1 => match remove(rng, &mut s.sites) {
                Some(i) => {
                    removed.sites.push(i);
                    "remove SweetySite"
                }
                None => "none",
            },
            2 => {
                let a = removed.ingresses.pop().map(|i| s.ingresses.push(i));
                let b = removed.sites.pop().map(|i| s.sites.push(i));
                if a.is_some() || b.is_some() {
                    "re-add Ingress/SweetySite"
                } else {
                    "none"
                }
            }
            3 | 4 => {
                // A content change: the first rule takes another Ingress's host (merging
                // with it, or conflicting on its paths), its first path changes, or its
                // backend becomes another Ingress's.
                if s.ingresses.is_empty() {
                    return "none";
                }
                let i = rng.below(s.ingresses.len());
                let j = rng.below(s.ingresses.len());
                let first_rule = |ing: &k8s_openapi::api::networking::v1::Ingress| {
                    ing.spec
                        .as_ref()
                        .and_then(|sp| sp.rules.as_ref())
                        .and_then(|r| r.first())
                        .cloned()
                };
                let other = first_rule(&s.ingresses[j]);
                let mut ing = (*s.ingresses[i]).clone();
                let Some(rule) = ing
                    .spec
                    .as_mut()
                    .and_then(|sp| sp.rules.as_mut())
                    .and_then(|r| r.first_mut())
                else {
                    return "none";
                };
                match rng.below(3) {
                    0 => {
                        rule.host = match other.and_then(|o| o.host) {
                            Some(h) if i != j => Some(h),
                            _ => Some(format!("edited-{}.example.com", rng.below(1000))),
                        }
                    }
                    1 => {
                        let n = rng.below(4);
                        for p in rule.http.iter_mut().flat_map(|h| h.paths.first_mut()) {
                            p.path = Some(format!("/p{n}"));
                        }
                    }
                    _ => {
                        let backend = other
                            .and_then(|o| o.http)
                            .and_then(|h| h.paths.first().map(|p| p.backend.clone()));
                        match (
                            backend,
                            rule.http.as_mut().and_then(|h| h.paths.first_mut()),
                        ) {
                            (Some(b), Some(p)) => p.backend = b,
                            _ => return "none",
                        }
                    }
                }
                s.ingresses[i] = Arc::new(ing);
                "edit Ingress"
            }
            5 | 6 => {
                // A content change: another site's hostnames (a conflict), new ones, or a
                // changed first route path.
                if s.sites.is_empty() {
                    return "none";
                }
                let i = rng.below(s.sites.len());
                let j = rng.below(s.sites.len());
                let mut site = (*s.sites[i]).clone();
                match rng.below(3) {
                    0 if i != j => site.spec.hostnames = s.sites[j].spec.hostnames.clone(),
                    0 | 1 => {
                        site.spec.hostnames = vec![format!("site-{}.example.com", rng.below(1000))]
                    }
                    _ => match site.spec.routes.first_mut() {
                        Some(r) => r.path = format!("/s{}", rng.below(4)),
                        None => return "none",
                    },
                }
                s.sites[i] = Arc::new(site);
                "edit SweetySite"
            }
            _ => {
                if touch(rng, &mut s.ingresses) | touch(rng, &mut s.sites) {
                    "touch Ingress/SweetySite"
                } else {
                    "none"
                }
            }
        }
    }

    /// One random edit of the kind a watch event makes. Returns what it did.
    fn edit(rng: &mut Rng, s: &mut Snapshot, removed: &mut Removed) -> &'static str {
        match rng.below(18) {
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
                    removed.routes.push(r);
                    "remove HTTPRoute"
                }
                None => "none",
            },
            4 => match removed.routes.pop() {
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
            12 => {
                // A route moves to another Gateway (every parentRef names it), or to a
                // section of it.
                if s.http_routes.is_empty() || s.gateways.is_empty() {
                    return "none";
                }
                let i = rng.below(s.http_routes.len());
                let gw = s.gateways[rng.below(s.gateways.len())].clone();
                let section = match rng.below(3) {
                    0 => gw.spec.listeners.first().map(|l| l.name.clone()),
                    _ => None,
                };
                let mut r = (*s.http_routes[i]).clone();
                for p in r.spec.parent_refs.iter_mut().flatten() {
                    p.name = gw.metadata.name.clone().unwrap_or_default();
                    p.namespace = gw.metadata.namespace.clone();
                    p.section_name = section.clone();
                }
                s.http_routes[i] = Arc::new(r);
                "move HTTPRoute to another Gateway"
            }
            13 => {
                // A route takes another route's hostnames (now sharing its virtual hosts),
                // or none (every hostname of its listeners).
                if s.http_routes.is_empty() {
                    return "none";
                }
                let i = rng.below(s.http_routes.len());
                let j = rng.below(s.http_routes.len());
                let mut r = (*s.http_routes[i]).clone();
                r.spec.hostnames = if rng.below(4) == 0 {
                    None
                } else {
                    s.http_routes[j].spec.hostnames.clone()
                };
                s.http_routes[i] = Arc::new(r);
                "move HTTPRoute to other hostnames"
            }
            14 => {
                // A Gateway listener changes hostname or port.
                if s.gateways.is_empty() {
                    return "none";
                }
                let i = rng.below(s.gateways.len());
                let mut gw = (*s.gateways[i]).clone();
                let Some(l) = gw.spec.listeners.first_mut() else {
                    return "none";
                };
                match rng.below(3) {
                    0 => l.hostname = None,
                    1 => l.hostname = Some("*.example.com".into()),
                    _ => l.port += 1,
                }
                s.gateways[i] = Arc::new(gw);
                "change Gateway listener"
            }
            15 => {
                // A new HTTPRoute: a copy of another under a new name.
                if s.http_routes.is_empty() {
                    return "none";
                }
                let i = rng.below(s.http_routes.len());
                let mut r = (*s.http_routes[i]).clone();
                r.metadata.name = Some(format!("added-{}", rng.below(1_000_000)));
                if s.http_routes.iter().any(|x| {
                    x.metadata.name == r.metadata.name
                        && x.metadata.namespace == r.metadata.namespace
                }) {
                    return "none";
                }
                s.http_routes.push(Arc::new(r));
                "add HTTPRoute"
            }
            16 => edit_front(rng, s, removed),
            _ => {
                s.http_routes.reverse();
                s.grpc_routes.reverse();
                "reorder routes"
            }
        }
    }

    #[test]
    fn dataplane_settings_follow_their_classes_in_the_incremental_translation() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/translate");
        let y = std::fs::read_to_string(dir.join("proxy-config-settings.in.yaml")).unwrap();
        let (mut s, _) = Snapshot::from_yaml(&y).unwrap();
        let params = Params::default();
        let mut cache = TranslateCache::default();
        let mut check = |s: &Snapshot, what: &str| {
            let out = cache.update(s, &params).to_output();
            assert_eq!(out, translate(s, &params), "{what}");
            out
        };
        let first = check(&s, "first");
        assert_eq!(first.config.limits.idle_timeout.to_string(), "30s");
        // The IngressClass points elsewhere (a front change): its config is no longer in
        // effect, the class says why.
        let mut class = (*s.ingress_classes[0]).clone();
        let p = class.spec.as_mut().unwrap().parameters.as_mut().unwrap();
        p.kind = "ConfigMap".into();
        s.ingress_classes[0] = Arc::new(class);
        let out = check(&s, "IngressClass parameters of another kind");
        assert_eq!(out.config.limits.idle_timeout.to_string(), "2m");
        assert!(out
            .statuses
            .keys()
            .any(|k| k.kind == "IngressClass" && k.name == "sweety"));
        assert!(!out.statuses.keys().any(|k| k.name == "ingresses"));
        // The GatewayClass's config changes (the world).
        let mut pc = (*s.proxy_configs[0]).clone();
        pc.spec.limits.as_mut().unwrap().idle_timeout = Some("10s".into());
        s.proxy_configs[0] = Arc::new(pc);
        let out = check(&s, "SweetyProxyConfig edit");
        assert_eq!(out.config.limits.idle_timeout.to_string(), "10s");
        // Back to the first state: the same output as at first.
        let (s0, _) = Snapshot::from_yaml(&y).unwrap();
        assert_eq!(check(&s0, "back"), first);
    }

    #[test]
    fn translate_incremental_matches_translate() {
        let cases = goldens();
        assert!(cases.len() >= 60, "golden inputs: {}", cases.len());
        let total = cases.len();
        let (mut replayed_total, mut edit_replays, mut vhost_memo) = (0, 0, 0);
        let mut listed_steps = 0;
        let mut counts = EditCounts::new();
        for (n, (path, snapshot, params)) in cases.into_iter().enumerate() {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let mut cache = TranslateCache::default();
            let mut s = snapshot;
            assert_eq!(
                translate_incremental(&s, &params, &mut cache),
                translate(&s, &params),
                "{name}: first run"
            );
            let memo = cache.vhosts.is_some();
            if memo {
                vhost_memo += 1;
            }
            // Nothing changed: every route is replayed (plain translation where the memo
            // does not apply), the output is the same.
            let full = cache.full_translates();
            assert_eq!(
                translate_incremental(&s, &params, &mut cache),
                translate(&s, &params),
                "{name}: unchanged rerun"
            );
            let routes = route_count(&s);
            if memo {
                assert_eq!(
                    (cache.stats(), cache.full_translates()),
                    (
                        CacheStats {
                            replayed: routes,
                            translated: 0
                        },
                        full
                    ),
                    "{name}: unchanged rerun reuses every route"
                );
                replayed_total += routes;
            } else {
                assert_eq!(
                    (cache.stats(), cache.full_translates()),
                    (
                        CacheStats {
                            replayed: 0,
                            translated: routes
                        },
                        full + 1
                    ),
                    "{name}: plain translation"
                );
            }
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (n as u64 + 1));
            let mut removed = Removed::default();
            let mut done = Vec::new();
            let mut prev = Some(cache.update(&s, &params).statuses.clone());
            let mut last = s.clone();
            for step in 0..40 {
                let what = edit(&mut rng, &mut s, &mut removed);
                *counts.entry(what).or_default() += 1;
                done.push(what);
                let at = format!("{name}: step {step}");
                // Through the journal's lists (and, some steps, without them).
                let j = journalled(&last, &s, step);
                let incremental = checked(&j, &params, &mut cache, &mut prev, &at);
                edit_replays += cache.stats().replayed;
                if memo && cache.vhosts.is_some() && cache.visited() < route_count(&s) {
                    listed_steps += 1;
                }
                last = j;
                let full = translate(&s, &params);
                assert!(
                    incremental == full,
                    "{name}: step {step}, after {done:?}: incremental output differs\n--- incremental ---\n{}\n--- translate ---\n{}",
                    serde_yaml::to_string(&incremental).unwrap(),
                    serde_yaml::to_string(&full).unwrap()
                );
            }
        }
        // Every kind of edit was compared at least once.
        assert_every_kind(&counts, EDIT_KINDS);
        // The comparisons above covered replays, not only fresh translations.
        assert!(
            replayed_total >= 50,
            "replays of unchanged goldens: {replayed_total}"
        );
        assert!(
            edit_replays >= 500,
            "replays during edit sequences: {edit_replays}"
        );
        // Most edit steps looked only at the routes the journal listed.
        assert!(
            listed_steps >= 1000,
            "steps that looked at the listed routes only: {listed_steps}"
        );
        // Both paths were compared: most goldens use the per-virtual-host memo, those with a
        // backend client certificate (and the like) plain translation.
        assert!(
            vhost_memo >= 60,
            "goldens with the vhost memo: {vhost_memo}"
        );
        assert!(
            vhost_memo < total,
            "no golden used plain translation: {vhost_memo} of {total}"
        );
    }

    #[test]
    fn ingresses_beside_gateway_routes_match_translate_through_edits() {
        // No golden mixes them: Ingresses are memoized beside the routes' memo and use some
        // of the same backends, so check that mix here.
        let mut y = String::from(
            "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: sweety}\nspec: {controller: sweety.dev/ingress-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: sweety}\nspec: {controllerName: sweety.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: app}\n\
spec:\n  gatewayClassName: sweety\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n---\n",
        );
        for s in 0..3 {
            y.push_str(&format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: svc{s}, namespace: app}}\nspec: {{ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc{s}-a, namespace: app, labels: {{kubernetes.io/service-name: svc{s}}}}}\n\
addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [10.0.0.{s}]}}]\n---\n\
apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: ing{s}, namespace: app, creationTimestamp: \"2026-01-01T00:00:0{s}Z\"{}}}\n\
spec:\n  ingressClassName: sweety\n  rules:\n  - host: i{s}.example.com\n    http:\n      paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: svc{s}, port: {{number: 80}}}}}}}}]\n---\n",
                if s == 1 {
                    ", annotations: {nginx.ingress.kubernetes.io/affinity: cookie}"
                } else {
                    ""
                }
            ));
        }
        for r in 0..9 {
            y.push_str(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{r}, namespace: app}}\n\
spec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [h{}.example.com]\n  rules: [{{backendRefs: [{{name: svc{}, port: 80}}]}}]\n---\n",
                r % 4,
                r % 3
            ));
        }
        let (mut s, _) = Snapshot::from_yaml(&y).unwrap();
        let params = Params::default();
        let mut cache = TranslateCache::default();
        let first = translate_incremental(&s, &params, &mut cache);
        assert_eq!(first, translate(&s, &params));
        assert!(cache.vhosts.is_some(), "the per-virtual-host memo is used");
        assert!(first
            .config
            .virtual_hosts
            .iter()
            .any(|v| v.name.starts_with("ingress/")));
        let mut rng = Rng(0x5eed);
        let mut removed = Removed::default();
        let mut done = Vec::new();
        let mut counts = EditCounts::new();
        let mut prev = Some(cache.update(&s, &params).statuses.clone());
        let mut last = s.clone();
        for step in 0..80 {
            // Every third edit is one of the Ingresses.
            let what = if step % 3 == 0 {
                edit_front(&mut rng, &mut s, &mut removed)
            } else {
                edit(&mut rng, &mut s, &mut removed)
            };
            *counts.entry(what).or_default() += 1;
            done.push(what);
            let j = journalled(&last, &s, step);
            let incremental = checked(&j, &params, &mut cache, &mut prev, &format!("step {step}"));
            last = j;
            assert!(
                incremental == translate(&s, &params),
                "step {step}, after {done:?}: incremental output differs"
            );
        }
        // The Ingresses were edited, beside the routes and their Services.
        assert_every_kind(
            &counts,
            &[
                "remove Ingress",
                "re-add Ingress/SweetySite",
                "edit Ingress",
                "touch Ingress/SweetySite",
                "change HTTPRoute",
                "edit Service",
                "edit EndpointSlice",
            ],
        );
    }

    #[test]
    fn ingresses_and_sites_are_translated_again_only_when_their_inputs_change() {
        let mut y = String::from(
            "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: sweety}\nspec: {controller: sweety.dev/ingress-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: sweety}\nspec: {controllerName: sweety.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: app}\n\
spec:\n  gatewayClassName: sweety\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n---\n\
apiVersion: v1\nkind: Service\nmetadata: {name: sweety, namespace: sweety}\nspec: {ports: [{name: http, port: 80}]}\n---\n\
apiVersion: sweety.dev/v1alpha1\nkind: SweetySite\nmetadata: {name: site, namespace: app}\n\
spec:\n  hostnames: [site.example.com]\n  routes: [{path: /, proxy: {backends: [{service: svc2, port: 80}]}}]\n---\n",
        );
        for s in 0..4 {
            y.push_str(&format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: svc{s}, namespace: app}}\nspec: {{ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc{s}-a, namespace: app, labels: {{kubernetes.io/service-name: svc{s}}}}}\n\
addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [10.0.0.{s}]}}]\n---\n"
            ));
        }
        // The Ingresses use svc0 (also the route r0's backend) and svc2 (also the site's).
        for (i, svc) in [(0, 0), (1, 2)] {
            y.push_str(&format!(
                "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: ing{i}, namespace: app}}\n\
spec:\n  ingressClassName: sweety\n  rules:\n  - host: i{i}.example.com\n    http:\n      paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: svc{svc}, port: {{number: 80}}}}}}}}]\n---\n"
            ));
        }
        for r in 0..2 {
            y.push_str(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{r}, namespace: app}}\n\
spec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [r{r}.example.com]\n  rules: [{{backendRefs: [{{name: svc{r}, port: 80}}]}}]\n---\n"
            ));
        }
        let (mut s, _) = Snapshot::from_yaml(&y).unwrap();
        let params = Params::default();
        let mut cache = TranslateCache::default();
        let check = |cache: &mut TranslateCache, s: &Snapshot, what: &str, front: u64| {
            assert_eq!(
                cache.update(s, &params).to_output(),
                translate(s, &params),
                "{what}"
            );
            assert!(
                cache.vhosts.is_some(),
                "{what}: the per-virtual-host memo is used"
            );
            assert_eq!(
                cache.front_translates(),
                front,
                "{what}: Ingress/site translations"
            );
            assert_eq!(cache.full_translates(), 1, "{what}: full translates");
        };
        check(&mut cache, &s, "first", 1);

        // A route's hostname: the Ingresses and the site are not translated again.
        let mut r = (*s.http_routes[1]).clone();
        r.spec.hostnames = Some(vec!["moved.example.com".into()]);
        s.http_routes[1] = Arc::new(r);
        check(&mut cache, &s, "route edit", 1);
        // Unchanged: nothing at all.
        check(&mut cache, &s, "no change", 1);
        // A slice nobody uses.
        let i = s
            .endpoint_slices
            .iter()
            .position(|e| e.metadata.name.as_deref() == Some("svc3-a"))
            .unwrap();
        s.endpoint_slices[i] = Arc::new((*s.endpoint_slices[i]).clone());
        check(&mut cache, &s, "unused slice", 1);
        // A slice of a Service an Ingress uses.
        let i = s
            .endpoint_slices
            .iter()
            .position(|e| e.metadata.name.as_deref() == Some("svc2-a"))
            .unwrap();
        let mut es = (*s.endpoint_slices[i]).clone();
        es.endpoints[0].addresses = vec!["10.0.9.9".into()];
        s.endpoint_slices[i] = Arc::new(es);
        check(&mut cache, &s, "used slice", 2);
        // The route that shared svc0 with ing0 goes: the routes no longer have svc0's
        // backend, the output keeps the Ingress's without translating it again.
        let i = s
            .http_routes
            .iter()
            .position(|r| r.metadata.name.as_deref() == Some("r0"))
            .unwrap();
        s.http_routes.remove(i);
        check(&mut cache, &s, "route with a shared backend removed", 2);
        assert!(cache
            .update(&s, &params)
            .config
            .backends
            .iter()
            .any(|b| b.value.name == "app/svc0:80"));
        // An Ingress edit, a new site, an IngressClass touched.
        let mut ing = (*s.ingresses[1]).clone();
        ing.spec.as_mut().unwrap().rules.as_mut().unwrap()[0].host = Some("x.example.com".into());
        s.ingresses[1] = Arc::new(ing);
        check(&mut cache, &s, "Ingress edit", 3);
        let mut site = (*s.sites[0]).clone();
        site.metadata.name = Some("site2".into());
        site.spec.hostnames = vec!["site2.example.com".into()];
        s.sites.push(Arc::new(site));
        check(&mut cache, &s, "new site", 4);
        s.ingress_classes[0] = Arc::new((*s.ingress_classes[0]).clone());
        check(&mut cache, &s, "IngressClass touched", 5);
        // The ingress Service's load-balancer address (the Ingress and site statuses).
        let i = s
            .services
            .iter()
            .position(|v| v.metadata.name.as_deref() == Some("sweety"))
            .unwrap();
        let mut svc = (*s.services[i]).clone();
        svc.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
            load_balancer: Some(k8s_openapi::api::core::v1::LoadBalancerStatus {
                ingress: Some(vec![k8s_openapi::api::core::v1::LoadBalancerIngress {
                    ip: Some("192.0.2.7".into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        });
        s.services[i] = Arc::new(svc);
        check(&mut cache, &s, "ingress Service address", 6);
        let out = cache.update(&s, &params).to_output();
        let yaml = serde_yaml::to_string(&out.statuses).unwrap();
        assert!(yaml.contains("192.0.2.7"), "{yaml}");
    }

    #[test]
    fn a_route_change_emits_only_its_virtual_hosts_again() {
        let mut y = String::from(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: sweety}\nspec: {controllerName: sweety.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: app}\n\
spec:\n  gatewayClassName: sweety\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n---\n\
apiVersion: v1\nkind: Service\nmetadata: {name: svc, namespace: app}\nspec: {ports: [{name: http, port: 80}]}\n---\n",
        );
        for r in 0..40 {
            y.push_str(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{r}, namespace: app}}\n\
spec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [h{}.example.com]\n  rules: [{{backendRefs: [{{name: svc, port: 80}}]}}]\n---\n",
                r % 20
            ));
        }
        let (mut s, _) = Snapshot::from_yaml(&y).unwrap();
        let params = Params::default();
        let mut cache = TranslateCache::default();
        let before = cache.update(&s, &params).clone();
        assert!(cache.vhosts.is_some(), "the per-virtual-host memo is used");
        assert_eq!(before.config.virtual_hosts.len(), 20);

        // r3 (on h3 with r23) moves to h7 (with r7 and r27): h3 and h7 change, nothing else.
        let mut r = (*s.http_routes[3]).clone();
        r.spec.hostnames = Some(vec!["h7.example.com".into()]);
        s.http_routes[3] = Arc::new(r);
        let after = cache.update(&s, &params).clone();
        assert_eq!(
            cache.stats(),
            CacheStats {
                replayed: 39,
                translated: 1
            }
        );
        assert_eq!(after.to_output(), translate(&s, &params));
        let mut changed = Vec::new();
        for (a, b) in before
            .config
            .virtual_hosts
            .iter()
            .zip(&after.config.virtual_hosts)
        {
            assert_eq!(a.value.name, b.value.name);
            if !Arc::ptr_eq(&a.value, &b.value) {
                changed.push(b.value.name.clone());
            }
        }
        assert_eq!(
            changed,
            ["gw/app/gw/80/h3.example.com", "gw/app/gw/80/h7.example.com"]
        );
        for (a, b) in before.config.backends.iter().zip(&after.config.backends) {
            assert!(Arc::ptr_eq(&a.value, &b.value), "backends are unchanged");
        }
        // No status changed (a route's status does not name its hostnames).
        assert_eq!(*after.statuses, *before.statuses);

        // The delta the pusher sends carries exactly those two virtual hosts.
        let delta = after
            .config
            .delta_from(&before.config, &after.config.hash())
            .unwrap();
        let names: Vec<&str> = delta
            .virtual_hosts
            .upsert
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(names, changed);
        assert!(delta.listeners.is_empty() && delta.backends.is_empty());
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
    fn the_memo_serves_again_once_the_routes_it_failed_with_change() {
        let mut y = String::from(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: sweety}\nspec: {controllerName: sweety.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: app}\n\
spec:\n  gatewayClassName: sweety\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n---\n\
apiVersion: v1\nkind: Service\nmetadata: {name: svc, namespace: app}\nspec: {ports: [{name: http, port: 80}]}\n---\n",
        );
        for r in 0..10 {
            y.push_str(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{r}, namespace: app}}\n\
spec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [r{r}.example.com]\n  rules: [{{backendRefs: [{{name: svc, port: 80}}]}}]\n---\n"
            ));
        }
        let (mut s, _) = Snapshot::from_yaml(&y).unwrap();
        // A second object with the id of r3 (a cause in the routes, not in the world).
        let mut twin = (*s.http_routes[3]).clone();
        twin.spec.hostnames = Some(vec!["twin.example.com".into()]);
        s.http_routes.push(Arc::new(twin));
        let params = Params::default();
        let mut cache = TranslateCache::default();
        let check = |s: &Snapshot, cache: &mut TranslateCache, what: &str| {
            let out = translate_incremental(s, &params, cache);
            assert_eq!(out, translate(s, &params), "{what}");
            (cache.full_translates(), cache.plain_translates())
        };
        use gateway::vhost_cache::Unsupported;
        assert_eq!(check(&s, &mut cache, "first"), (1, 1));
        assert_eq!(cache.unsupported(), Some(Unsupported::DuplicateRoute));
        assert!(cache.vhosts.is_none());

        // Nothing changed: plain translation again, the memo is not tried.
        assert_eq!(check(&s, &mut cache, "same"), (2, 2));
        // A Service change is no route change: still not tried.
        s.services[0] = Arc::new((*s.services[0]).clone());
        assert_eq!(check(&s, &mut cache, "service"), (3, 3));
        assert_eq!(cache.unsupported(), Some(Unsupported::DuplicateRoute));

        // Another route changes while the twin is still there: tried, fails again.
        let mut r = (*s.http_routes[5]).clone();
        r.spec.hostnames = Some(vec!["r5b.example.com".into()]);
        s.http_routes[5] = Arc::new(r);
        assert_eq!(check(&s, &mut cache, "edit with twin"), (4, 4));
        assert_eq!(cache.unsupported(), Some(Unsupported::DuplicateRoute));

        // The twin leaves: the memo is built (a full translate, not a plain one) and serves.
        s.http_routes.pop();
        assert_eq!(check(&s, &mut cache, "twin removed"), (5, 4));
        assert_eq!(cache.unsupported(), None);
        assert!(cache.vhosts.is_some(), "the per-virtual-host memo is used");

        // From now on a route edit costs that route only.
        let mut r = (*s.http_routes[7]).clone();
        r.spec.hostnames = Some(vec!["r7b.example.com".into()]);
        s.http_routes[7] = Arc::new(r);
        assert_eq!(check(&s, &mut cache, "edit after"), (5, 4));
        assert_eq!(
            cache.stats(),
            CacheStats {
                replayed: 9,
                translated: 1
            }
        );
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

        // A Service in the controller's namespace that is no per-Gateway Service: nothing
        // uses it, nothing is translated again.
        let full = cache.full_translates();
        let mut own = (*s.services[0]).clone();
        own.metadata.namespace = Some(params.namespace.clone());
        s.services.push(Arc::new(own));
        assert_eq!(
            translate_incremental(&s, &params, &mut cache),
            translate(&s, &params)
        );
        assert_eq!(cache.stats().translated, 0);
        assert_eq!(cache.full_translates(), full);

        // A per-Gateway Service (read by port allocation and Gateway status) clears
        // everything.
        let mut own = (*s.services[0]).clone();
        own.metadata.namespace = Some(params.namespace.clone());
        own.metadata.name = Some(addressing::service_name("app", "gw"));
        s.services.push(Arc::new(own));
        assert_eq!(
            translate_incremental(&s, &params, &mut cache),
            translate(&s, &params)
        );
        assert_eq!(cache.stats().translated, 30);
        assert_eq!(cache.full_translates(), full + 1);
    }

    #[test]
    fn slice_changes_in_the_controller_namespace_translate_incrementally() {
        // The dataplane's own Service (`sweety/sweety`, the ingress Service), an unrelated
        // Service beside it, and one Service there that two routes use as their backend.
        let mut y = String::from(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: sweety}\nspec: {controllerName: sweety.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: app}\n\
spec:\n  gatewayClassName: sweety\n  listeners: [{name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}]\n---\n",
        );
        for (ns, svc) in [
            ("sweety", "sweety"),
            ("sweety", "unrelated"),
            ("sweety", "used"),
            ("app", "web"),
        ] {
            y.push_str(&format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {svc}, namespace: {ns}}}\nspec: {{ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {svc}-a, namespace: {ns}, labels: {{kubernetes.io/service-name: {svc}}}}}\n\
addressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [10.0.0.1], conditions: {{ready: true}}}}, {{addresses: [10.0.0.2], conditions: {{ready: true}}}}]\n---\n"
            ));
        }
        for r in 0..10 {
            let (ns, svc) = if r < 2 {
                ("sweety", "used")
            } else {
                ("app", "web")
            };
            y.push_str(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{r}, namespace: {ns}}}\n\
spec:\n  parentRefs: [{{name: gw, namespace: app}}]\n  hostnames: [r{r}.example.com]\n  rules: [{{backendRefs: [{{name: {svc}, port: 80}}]}}]\n---\n"
            ));
        }
        // An Ingress (its status reads the ingress Service `sweety/sweety`) using app/web.
        y.push_str(
            "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: sweety}\nspec: {controller: sweety.dev/ingress-controller}\n---\n\
apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: ing, namespace: app}\n\
spec:\n  ingressClassName: sweety\n  rules:\n  - host: ing.example.com\n    http:\n      paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]\n",
        );
        let (mut s, _) = Snapshot::from_yaml(&y).unwrap();
        let params = Params::default();
        assert_eq!(params.namespace, "sweety");
        assert_eq!(params.ingress_service.as_deref(), Some("sweety"));
        let mut cache = TranslateCache::default();
        assert_eq!(
            cache.update(&s, &params).to_output(),
            translate(&s, &params)
        );
        assert!(cache.vhosts.is_some(), "the per-virtual-host memo is used");
        assert_eq!(cache.full_translates(), 1);
        // One endpoint of a slice of `namespace/name` stops being ready (a readiness flip).
        let flip = |s: &mut Snapshot, ns: &str, name: &str| {
            let i = s
                .endpoint_slices
                .iter()
                .position(|e| {
                    e.metadata.namespace.as_deref() == Some(ns)
                        && e.metadata.name.as_deref() == Some(&format!("{name}-a"))
                })
                .unwrap();
            let mut es = (*s.endpoint_slices[i]).clone();
            let c = es.endpoints[0]
                .conditions
                .get_or_insert_with(Default::default);
            c.ready = Some(!c.ready.unwrap_or(true));
            s.endpoint_slices[i] = Arc::new(es);
        };
        for (svc, translated) in [("unrelated", 0), ("sweety", 0), ("used", 2)] {
            for _ in 0..2 {
                flip(&mut s, "sweety", svc);
                let out = cache.update(&s, &params).to_output();
                assert_eq!(out, translate(&s, &params), "{svc}");
                assert_eq!(
                    cache.stats(),
                    CacheStats {
                        replayed: 10 - translated,
                        translated
                    },
                    "{svc}"
                );
                assert_eq!(cache.full_translates(), 1, "{svc}: no full translate");
                assert_eq!(cache.front_translates(), 1, "{svc}: the Ingress is kept");
            }
        }
        // The used Service's flip reached its backend.
        flip(&mut s, "sweety", "used");
        let out = cache.update(&s, &params).to_output();
        let used = out
            .config
            .backends
            .iter()
            .find(|b| b.name.contains("sweety") && b.name.contains("used"))
            .expect("the used Service's backend");
        assert_eq!(used.endpoints.len(), 1, "{used:?}");
        assert_eq!(out, translate(&s, &params));
        assert_eq!(cache.full_translates(), 1);

        // Once the Ingress uses the ingress Service as its backend, that Service's slices
        // are read: a flip translates the Ingress again.
        let mut ing = (*s.ingresses[0]).clone();
        let rule = &mut ing.spec.as_mut().unwrap().rules.as_mut().unwrap()[0];
        let path = &mut rule.http.as_mut().unwrap().paths[0];
        path.backend.service.as_mut().unwrap().name = "sweety".into();
        ing.metadata.namespace = Some("sweety".into());
        s.ingresses[0] = Arc::new(ing);
        assert_eq!(
            cache.update(&s, &params).to_output(),
            translate(&s, &params)
        );
        assert_eq!(cache.front_translates(), 2);
        flip(&mut s, "sweety", "sweety");
        assert_eq!(
            cache.update(&s, &params).to_output(),
            translate(&s, &params)
        );
        assert_eq!(cache.front_translates(), 3);
        assert_eq!(cache.full_translates(), 1);
    }

    /// A Gateway, a Service with one endpoint, and `n` HTTPRoutes to it, one hostname each
    /// (the convergence benchmark's shape).
    fn many_routes(n: usize) -> Snapshot {
        let y = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: sweety}\nspec: {controllerName: sweety.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: bench, namespace: b}\n\
spec:\n  gatewayClassName: sweety\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n---\n\
apiVersion: v1\nkind: Service\nmetadata: {name: echo, namespace: b}\nspec: {ports: [{name: http, port: 8080, targetPort: 3000}]}\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: echo-a, namespace: b, labels: {kubernetes.io/service-name: echo}}\n\
addressType: IPv4\nports: [{name: http, port: 3000}]\nendpoints: [{addresses: [10.0.0.9]}]\n";
        let (mut s, _) = Snapshot::from_yaml(y).unwrap();
        for i in 0..n {
            s.http_routes.push(Arc::new(bench_route(i, None)));
        }
        s.routes_at = Some(1);
        s
    }

    fn bench_route(i: usize, header: Option<&str>) -> sweety_gateway_api::httproutes::HttpRoute {
        let mut rule = serde_json::json!({"backendRefs": [{"name": "echo", "port": 8080}]});
        if let Some(h) = header {
            rule["filters"] = serde_json::json!([{"type": "RequestHeaderModifier",
                "requestHeaderModifier": {"set": [{"name": "x-bench-change", "value": h}]}}]);
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": format!("r{i}"), "namespace": "b", "generation": 1,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"parentRefs": [{"name": "bench"}],
                     "hostnames": [format!("r{i}.bench.example")], "rules": [rule]},
        }))
        .unwrap()
    }

    /// `s` with route `k` changed (its header filter set to `value`), one journal position
    /// further, with (`listed`) or without the journal's list of that one route.
    fn one_change(s: &Snapshot, k: usize, value: &str, listed: bool) -> Snapshot {
        let mut next = s.clone();
        next.http_routes[k] = Arc::new(bench_route(k, Some(value)));
        let at = s.routes_at.unwrap_or_default();
        next.routes_at = Some(at + 1);
        next.routes_changed = listed.then(|| RouteChanges {
            since: at,
            routes: vec![crate::translate::ChangedRoute {
                kind: "HTTPRoute",
                namespace: "b".into(),
                name: format!("r{k}"),
                object: Some(crate::translate::RouteObject::Http(
                    next.http_routes[k].clone(),
                )),
            }],
        });
        next
    }

    #[test]
    fn one_route_change_visits_only_the_listed_route_at_5000_routes() {
        // The watch layer's journal lists the one changed route: the memo looks at it only,
        // not at the 5,000 routes (fails if the sync goes back to a pass over every route).
        let n = 5000;
        let params = Params::default();
        let mut cache = TranslateCache::default();
        let s0 = many_routes(n);
        cache.update(&s0, &params);
        assert_eq!(cache.visited(), n, "the first call compares every route");
        let s1 = one_change(&s0, 1234, "c1", true);
        let out = cache.update(&s1, &params).to_output();
        assert_eq!(
            (cache.visited(), cache.stats()),
            (
                1,
                CacheStats {
                    replayed: n - 1,
                    translated: 1
                }
            )
        );
        assert_eq!(cache.full_translates(), 1);
        let vh = out
            .config
            .virtual_hosts
            .iter()
            .find(|v| v.hostnames.iter().any(|h| h == "r1234.bench.example"))
            .expect("the changed route's virtual host");
        assert!(
            serde_json::to_string(vh).unwrap().contains("c1"),
            "the change is in the output: {vh:?}"
        );
        assert_eq!(out, translate(&s1, &params), "listed sync = translate");
        // Without the list (or with a list from a position the cache did not see), every
        // route is compared, and the result is the same.
        let s2 = one_change(&s1, 77, "c2", false);
        cache.update(&s2, &params);
        assert_eq!(cache.visited(), n);
        let mut s3 = one_change(&s2, 78, "c3", true);
        s3.routes_changed.as_mut().unwrap().since = 0;
        let out = cache.update(&s3, &params).to_output();
        assert_eq!((cache.visited(), cache.stats().translated), (n, 1));
        assert_eq!(out, translate(&s3, &params));
        // A route deleted, listed: taken out without a pass.
        let mut s4 = s3.clone();
        s4.http_routes.remove(10);
        s4.routes_at = Some(s3.routes_at.unwrap() + 1);
        s4.routes_changed = Some(RouteChanges::between(&s3, &s4));
        let out = cache.update(&s4, &params).to_output();
        assert_eq!(cache.visited(), 1);
        assert_eq!(out, translate(&s4, &params));
    }

    /// Per-change work of the translate cache at 5,000 routes, for callgrind (instructions,
    /// a count that does not depend on the machine's load):
    /// `SWEETY_BENCH_LISTED=0|1 valgrind --tool=callgrind --collect-atstart=no
    /// --toggle-collect='*bench_changes*' TESTBINARY --ignored --exact
    /// translate::cache::tests::bench_one_change_at_5000_routes`; the Ir of the window / 20
    /// is one change's. Prints the routes visited per change.
    #[test]
    #[ignore]
    fn bench_one_change_at_5000_routes() {
        let listed = std::env::var("SWEETY_BENCH_LISTED").map_or(true, |v| v != "0");
        let params = Params::default();
        let mut cache = TranslateCache::default();
        let s = many_routes(5000);
        cache.update(&s, &params);
        // The snapshots are made before the window: only the translate cache's work is in it.
        let mut snapshots = Vec::new();
        let mut last = s;
        for j in 0..20 {
            let next = one_change(&last, 50 + j * 97, &format!("c{j}"), listed);
            snapshots.push(next.clone());
            last = next;
        }
        let visited = bench_changes(&mut cache, &snapshots, &params);
        println!("listed={listed}: routes visited per change {visited:?}");
    }

    #[inline(never)]
    fn bench_changes(
        cache: &mut TranslateCache,
        snapshots: &[Snapshot],
        params: &Params,
    ) -> Vec<usize> {
        snapshots
            .iter()
            .map(|s| {
                cache.update(s, params);
                cache.visited()
            })
            .collect()
    }
}

/// The shape of `examples/scale.rs` (what the benchmark measures) takes the fast path.
#[cfg(test)]
mod scale_shape_tests {
    use super::*;

    #[test]
    fn the_scale_benchmark_shape_uses_the_vhost_memo() {
        let y = super::super::scale_world(20, 5);
        let (s, _) = Snapshot::from_yaml(&y).unwrap();
        let params = Params::default();
        let mut cache = TranslateCache::default();
        let out = cache.update(&s, &params).to_output();
        assert!(cache.vhosts.is_some(), "the per-virtual-host memo is used");
        assert_eq!(out, super::super::translate(&s, &params));
    }
}
