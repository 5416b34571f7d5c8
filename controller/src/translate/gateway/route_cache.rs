//! Per-route memo for [`crate::translate::translate_incremental`]: what translating one
//! route object contributed (dataplane route entries, backends, attachment counts, policy
//! use, its status), so an unchanged route is replayed instead of translated again.
//!
//! Identity: an entry is keyed by the address of the route's `Arc` in the snapshot and holds
//! a clone of that `Arc`. While the entry lives the allocation cannot be freed or reused, and
//! an object behind a shared `Arc` cannot change, so the same address means the same object
//! (the reflector stores hand out the same `Arc` until the object changes). Everything else a
//! route's translation reads (Gateways, classes, Services, ReferenceGrants, policies, params…)
//! is checked by the caller, which clears the whole memo when any of it changed.
//!
//! Replaying must give exactly what translating gives: `translate_incremental_matches_translate`
//! in `translate::cache_tests` checks it over every golden input and random edit sequences.

use super::policy::Policies;
use super::routes::{Collected, HttpEntry, L4Entry};
use super::{listeners::RouteKind, GwState};
use crate::translate::status::{ObjectKey, ObjectStatus};
use crate::translate::Builder;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use sweety_config::Backend;

/// A route object of the snapshot: its identity and its spec, converted only when needed.
pub struct Object<'a> {
    keep: Arc<dyn Any + Send + Sync>,
    spec: Box<dyn Fn() -> Vec<u8> + 'a>,
}

impl<'a> Object<'a> {
    pub fn new<T: Any + Send + Sync, S: Serialize>(object: &Arc<T>, spec: &'a S) -> Self {
        Object {
            keep: object.clone(),
            spec: Box::new(move || serde_json::to_vec(spec).unwrap_or_default()),
        }
    }

    /// The spec as JSON (the route front end reads its uniform model from it).
    pub fn spec(&self) -> Vec<u8> {
        (self.spec)()
    }

    /// The address of the object's allocation: its identity while `keep` is held.
    pub fn addr(&self) -> usize {
        Arc::as_ptr(&self.keep) as *const () as usize
    }

    /// The object, held so that its address stays unique.
    pub fn keep(&self) -> Arc<dyn Any + Send + Sync> {
        self.keep.clone()
    }
}

pub(super) type UsedBy = BTreeMap<(String, String), BTreeSet<(String, String)>>;

/// What translating one route added to the shared state.
pub(super) struct Effects {
    pub http: Vec<HttpEntry>,
    pub l4: Vec<L4Entry>,
    pub backends: Vec<Backend>,
    /// (gateway, listener) attachment increments.
    pub attached: Vec<(usize, usize)>,
    pub used_by: UsedBy,
    pub status: Option<(ObjectKey, ObjectStatus)>,
}

struct Entry {
    _keep: Arc<dyn Any + Send + Sync>,
    effects: Effects,
    /// Services (namespace, name) its translation looked up.
    services: BTreeSet<(String, String)>,
    /// The `RouteCache::epoch` of the last translate that saw this object.
    seen: u64,
}

/// The memo: route object address → effects.
#[derive(Default)]
pub struct RouteCache {
    entries: HashMap<usize, Entry>,
    epoch: u64,
    /// Routes replayed / translated by the last call.
    pub hits: usize,
    pub misses: usize,
}

fn attached(gateways: &[GwState]) -> Vec<i32> {
    gateways
        .iter()
        .flat_map(|g| g.listeners.iter().map(|l| l.attached))
        .collect()
}

fn merge_used_by(into: &mut UsedBy, from: &UsedBy) {
    for (k, v) in from {
        into.entry(k.clone()).or_default().extend(v.iter().cloned());
    }
}

impl RouteCache {
    /// Forget every entry (something a route's translation depends on changed).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Forget the entries whose translation looked up one of these Services (namespace,
    /// name); how many were dropped.
    pub fn invalidate_services(&mut self, changed: &BTreeSet<(String, String)>) -> usize {
        let before = self.entries.len();
        self.entries
            .retain(|_, e| e.services.iter().all(|s| !changed.contains(s)));
        before - self.entries.len()
    }

    /// Starts one translate pass.
    pub fn begin(&mut self) {
        self.epoch += 1;
        self.hits = 0;
        self.misses = 0;
    }

    /// Ends a pass: entries of objects that were not in the snapshot are dropped.
    pub fn end(&mut self) {
        let epoch = self.epoch;
        self.entries.retain(|_, e| e.seen == epoch);
    }

    /// Replays the memoized effects of `object`, or runs `translate` (the route front end)
    /// and memoizes what it added.
    #[allow(clippy::too_many_arguments)]
    pub fn route(
        &mut self,
        b: &mut Builder<'_>,
        gateways: &mut [GwState],
        policies: &mut Policies,
        out: &mut Collected,
        kind: RouteKind,
        meta: &ObjectMeta,
        object: Object<'_>,
        translate: impl FnOnce(&mut Builder<'_>, &mut [GwState], &mut Policies, &mut Collected, &[u8]),
    ) {
        let addr = object.addr();
        if let Some(e) = self.entries.get_mut(&addr) {
            e.seen = self.epoch;
            self.hits += 1;
            replay(&e.effects, b, gateways, policies, out);
            return;
        }
        self.misses += 1;
        let (effects, services) = capture(b, gateways, policies, out, |b, g, p, o| {
            translate(b, g, p, o, &object.spec())
        });
        let key = ObjectKey::new(
            kind.name(),
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        );
        let status = b.statuses.get(&key).cloned().map(|s| (key, s));
        let effects = Effects { status, ..effects };
        // Merge what this route added, exactly as a replay would.
        out.http.extend_from_slice(&effects.http);
        out.l4.extend_from_slice(&effects.l4);
        for backend in &effects.backends {
            b.backends.insert_ref(backend);
        }
        merge_used_by(&mut policies.used_by, &effects.used_by);
        self.entries.insert(
            addr,
            Entry {
                _keep: object.keep,
                effects,
                services,
                seen: self.epoch,
            },
        );
    }
}

/// Runs `translate` (one route object) and returns what it added (its status is left in
/// `b` and not part of the result) and the Services it looked up. Entries, backends and
/// policy use go into the result only (`out` is left as it was).
pub(super) fn capture(
    b: &mut Builder<'_>,
    gateways: &mut [GwState],
    policies: &mut Policies,
    out: &mut Collected,
    translate: impl FnOnce(&mut Builder<'_>, &mut [GwState], &mut Policies, &mut Collected),
) -> (Effects, BTreeSet<(String, String)>) {
    let (http_len, l4_len) = (out.http.len(), out.l4.len());
    let backends = std::mem::take(&mut b.backends);
    let used_by = std::mem::take(&mut policies.used_by);
    let before = attached(gateways);

    b.services.record();
    translate(b, gateways, policies, out);
    let services = b.services.recorded();

    let added = std::mem::replace(&mut b.backends, backends).into_config();
    let used = std::mem::replace(&mut policies.used_by, used_by);
    let mut increments = Vec::new();
    let mut i = 0;
    for (g, gw) in gateways.iter().enumerate() {
        for (l, listener) in gw.listeners.iter().enumerate() {
            for _ in before[i]..listener.attached {
                increments.push((g, l));
            }
            i += 1;
        }
    }
    let effects = Effects {
        http: out.http.split_off(http_len),
        l4: out.l4.split_off(l4_len),
        backends: added,
        attached: increments,
        used_by: used,
        status: None,
    };
    (effects, services)
}

fn replay(
    fx: &Effects,
    b: &mut Builder<'_>,
    gateways: &mut [GwState],
    policies: &mut Policies,
    out: &mut Collected,
) {
    out.http.extend_from_slice(&fx.http);
    out.l4.extend_from_slice(&fx.l4);
    for backend in &fx.backends {
        // Most routes share their backends: copy only the first occurrence.
        b.backends.insert_ref(backend);
    }
    for &(g, l) in &fx.attached {
        gateways[g].listeners[l].attached += 1;
    }
    merge_used_by(&mut policies.used_by, &fx.used_by);
    if let Some((key, status)) = &fx.status {
        b.status(key.clone(), status.clone());
    }
}
