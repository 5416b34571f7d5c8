//! What translating one route object adds to the shared state (its dataplane route
//! entries, backends, attachment counts, policy use and the Services it looked up), captured
//! apart from everything else: the per-virtual-host memo of
//! [`crate::translate::translate_incremental`] ([`super::VhostMemo`]) keeps it per route
//! object, so that a route that changed or left can be taken out again.
//!
//! [`Object`] is a route object of the snapshot: its identity (the address of its `Arc`,
//! held so that the address stays unique) and its spec, converted only when needed.

use super::policy::Policies;
use super::routes::{Collected, HttpEntry, L4Entry};
use super::OwnedGateway;
use crate::translate::Builder;
use serde::Serialize;
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use sweety_config::Backend;

/// A route object of the snapshot: its identity and its spec, converted only when needed.
pub(super) struct Object<'a> {
    keep: Arc<dyn Any + Send + Sync>,
    spec: Box<dyn Fn() -> Vec<u8> + 'a>,
}

impl<'a> Object<'a> {
    pub(super) fn new<T: Any + Send + Sync, S: Serialize>(object: &Arc<T>, spec: &'a S) -> Self {
        Object {
            keep: object.clone(),
            spec: Box::new(move || serde_json::to_vec(spec).unwrap_or_default()),
        }
    }

    /// The spec as JSON (the route front end reads its uniform model from it).
    pub(super) fn spec(&self) -> Vec<u8> {
        (self.spec)()
    }

    /// The address of the object's allocation: its identity while `keep` is held.
    pub(super) fn addr(&self) -> usize {
        Arc::as_ptr(&self.keep) as *const () as usize
    }

    /// The object, held so that its address stays unique.
    pub(super) fn keep(&self) -> Arc<dyn Any + Send + Sync> {
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
    /// Where the HTTPRoute a SweetySecurityPolicy targets is attached (see
    /// `SecurityPolicies::record_attachment`).
    pub security_attachments: super::security::Attachments,
}

fn attached(gateways: &[OwnedGateway]) -> Vec<i32> {
    gateways
        .iter()
        .flat_map(|g| g.listeners.iter().map(|l| l.attached))
        .collect()
}

/// Runs `translate` (one route object) and returns what it added (its status is left in
/// `b` and not part of the result) and the Services it looked up. Entries, backends and
/// policy use go into the result only (`out` is left as it was).
pub(super) fn capture(
    b: &mut Builder<'_>,
    gateways: &mut [OwnedGateway],
    policies: &mut Policies,
    out: &mut Collected,
    translate: impl FnOnce(&mut Builder<'_>, &mut [OwnedGateway], &mut Policies, &mut Collected),
) -> (Effects, BTreeSet<(String, String)>) {
    let (http_len, l4_len) = (out.http.len(), out.l4.len());
    let backends = std::mem::take(&mut b.backends);
    let used_by = std::mem::take(&mut policies.used_by);
    let attachments = std::mem::take(&mut policies.security.attachments);
    let before = attached(gateways);

    b.services.record();
    translate(b, gateways, policies, out);
    let services = b.services.recorded();

    let added = std::mem::replace(&mut b.backends, backends).into_config();
    let used = std::mem::replace(&mut policies.used_by, used_by);
    let security_attachments = std::mem::replace(&mut policies.security.attachments, attachments);
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
        security_attachments,
    };
    (effects, services)
}
