//! The status writer: turns `translate`'s statuses into `status` subresource writes.
//!
//! - One field manager (`sweety-controller`), server-side apply of `status` only.
//! - Written only when changed: compared with what this writer last wrote for the object and
//!   with the object's current status in the snapshot (a subset match, so fields the apiserver
//!   defaults or other writers add do not count as a change). What was written is remembered
//!   per object and `metadata.uid`: an object created again under the same name starts
//!   afresh. After gaining the lease ([`StatusWriter::distrust_cache`]) a status only the
//!   watch cache says is right is read from the API server first (the cache does not see
//!   status writes, so not the other leader's).
//! - `lastTransitionTime` is added here from the clock: the previous time is kept when a
//!   condition's type, status and reason are unchanged.
//! - Route `status.parents` and BackendTLSPolicy (and SweetySecurityPolicy) `status.ancestors`
//!   are `atomic` lists in the Gateway API CRDs (and ours), so server-side apply would replace
//!   other controllers' entries. For those kinds the writer reads the live object, keeps every
//!   entry whose `controllerName` is not ours, puts ours after them, and applies with the read
//!   `resourceVersion` as a precondition (a conflict is retried on the next reconcile). Entries
//!   of ours for parents `translate` no longer reports are removed, also from routes
//!   `translate` no longer reports at all.
//! - `Programmed=True` is held back as `Unknown`/`Pending` until the dataplane acknowledged the
//!   generation that contains the object ([`Gate`]); a rejected generation gives
//!   `False`/`Invalid` with the dataplane's errors.
//! - Ingress has no conditions: `ObjectStatus::Conditions` for an Ingress (and other kinds
//!   without a status block we own) is logged once per change instead and, with
//!   [`StatusWriter::with_events`], published as Kubernetes Events on the object (`Warning` for
//!   a `False` condition or one of type `Warning`, `Normal` otherwise). Problems `translate`
//!   records for an Ingress under `ingress::EVENT_KIND` become Events on that Ingress, so
//!   `kubectl describe ingress` shows them to its owner. An Event names the object's
//!   `metadata.uid` (`kubectl describe` lists only those); what was published is remembered
//!   per uid, so the Events of an Ingress created again under the same name are published
//!   again, about the new object (the status worker queues them: the watch journals
//!   Ingresses, not IngressClasses or SweetyProxyConfigs). A failed publish is retried.

use crate::push::PushState;
use crate::translate::status::{Condition, ObjectKey, ObjectStatus, ParentRef, Statuses};
use crate::translate::Snapshot;
use crate::Error;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Arc;
use sweety_gateway_api as gw;

/// The field manager of every status write.
pub const FIELD_MANAGER: &str = "sweety-controller";

/// Whether the dataplane applied the generation a set of statuses belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gate {
    /// The dataplane acknowledged that generation (or a later one).
    pub acked: bool,
    /// The dataplane rejected that generation: its errors, joined (shared: every status
    /// written under one gate holds the same text).
    pub nack: Option<Arc<str>>,
}

impl Gate {
    /// The gate for statuses computed with the config submitted as `generation`.
    pub fn new(state: &PushState, generation: u64) -> Gate {
        let nack = match &state.last_nack {
            Some((g, errors)) if *g >= generation && state.acked < generation => {
                Some(Arc::from(join_errors(errors)))
            }
            _ => None,
        };
        Gate {
            acked: state.acked >= generation,
            nack,
        }
    }

    /// A gate that lets `Programmed=True` through (tests, or no dataplane to wait for).
    pub fn open() -> Gate {
        Gate {
            acked: true,
            nack: None,
        }
    }
}

/// The most bytes of a Nack's errors a status condition's message carries (Gateway API caps a
/// condition message at 32,768 characters; a longer one makes every status write fail).
pub const NACK_MESSAGE_MAX: usize = 1024;

/// A Nack's errors joined with "; ", as many whole ones as fit in [`NACK_MESSAGE_MAX`] bytes
/// (the first one cut at a character boundary, marked "…", if it alone is longer), then
/// " (N more errors)" for those left out.
fn join_errors(errors: &[String]) -> String {
    let mut out = String::new();
    let mut shown = 0usize;
    for e in errors {
        let sep = if shown == 0 { "" } else { "; " };
        if out.len() + sep.len() + e.len() > NACK_MESSAGE_MAX {
            if shown == 0 {
                let mut end = NACK_MESSAGE_MAX;
                while !e.is_char_boundary(end) {
                    end -= 1;
                }
                out.push_str(&e[..end]);
                out.push('…');
                shown = 1;
            }
            break;
        }
        out.push_str(sep);
        out.push_str(e);
        shown += 1;
    }
    match errors.len() - shown {
        0 => {}
        1 => out.push_str(" (1 more error)"),
        n => out.push_str(&format!(" ({n} more errors)")),
    }
    out
}

/// What one [`StatusWriter::write`] did.
#[derive(Debug, Default)]
pub struct WriteReport {
    /// Objects whose status was written.
    pub written: Vec<ObjectKey>,
    /// Objects whose status was already as wanted (no request).
    pub unchanged: usize,
    /// Writes that failed, with why; they are retried on the next pass.
    pub errors: Vec<(ObjectKey, Error)>,
    /// The pass stopped early because this replica no longer leads.
    pub not_leader: bool,
}

/// What [`StatusWriter::prepare`] decided for one object.
pub enum Prepared {
    /// Nothing to write: what was last written, or what the object carries, already says it.
    Unchanged,
    /// A write to run ([`WriteJob::run`], anywhere) and hand back ([`StatusWriter::finish`]).
    Write(Box<WriteJob>),
}

/// One status write (or one object's Events), prepared without I/O and owning everything it
/// needs, so that several can run at once while the writer's memory stays with its owner.
pub struct WriteJob {
    key: ObjectKey,
    work: Work,
}

enum Work {
    Apply {
        api: Api<DynamicObject>,
        resource: ApiResource,
        desired: Value,
        /// Route and policy kinds: recomputed against the live list before the write.
        atomic: Option<Box<Atomic>>,
        leading: Option<tokio::sync::watch::Receiver<bool>>,
        /// The watch cache's resourceVersion of the object when the job was prepared.
        seen: Option<String>,
    },
    Events {
        recorder: Recorder,
        reference: ObjectReference,
        conditions: Vec<Condition>,
        value: Value,
    },
}

/// The inputs of an atomic-list merge (see the module docs).
struct Atomic {
    controller_name: String,
    status: Option<ObjectStatus>,
    /// What earlier `lastTransitionTime`s come from (the last write, else the object).
    prev: Option<Value>,
    gate: Gate,
    now: String,
    /// The object's resourceVersion and status as last known (after our own last write, or
    /// from the watch cache): the precondition of the write, which saves reading it first. A
    /// conflict (someone wrote in between) reads the live object and tries once more.
    known: Option<(String, Value)>,
    /// The watch cache's resourceVersion of the object when the job was prepared.
    seen: Option<String>,
}

/// How one [`WriteJob`] ended.
pub struct Outcome {
    /// The object the job was for.
    pub key: ObjectKey,
    /// What it wrote, or why the write failed.
    pub result: Result<Done, Error>,
}

/// A finished job: what is now on the object (or was published).
pub struct Done {
    /// The status this controller wants there (written, or found there already).
    desired: Value,
    /// Something was sent (a status write, or Events).
    pub written: bool,
    /// The watch cache's resourceVersion when the job was prepared, and the object's
    /// resourceVersion and status after the write (or, for atomic kinds, as read when nothing
    /// needed writing).
    live: Option<(Option<String>, String, Value)>,
}

impl WriteJob {
    /// The object this job writes.
    pub fn key(&self) -> &ObjectKey {
        &self.key
    }

    /// Send the write (server-side apply of `status`) or publish the Events.
    pub async fn run(self: Box<Self>) -> Outcome {
        let key = self.key;
        let result = match self.work {
            Work::Apply {
                api,
                resource,
                desired,
                atomic,
                leading,
                seen,
            } => {
                apply(
                    &api,
                    &resource,
                    &key,
                    desired,
                    atomic,
                    leading.as_ref(),
                    seen,
                )
                .await
            }
            Work::Events {
                recorder,
                reference,
                conditions,
                value,
            } => {
                let (mut published, mut failed) = (false, None);
                for c in &conditions {
                    let event = Event {
                        type_: if c.status == "False" || c.type_ == "Warning" {
                            EventType::Warning
                        } else {
                            EventType::Normal
                        },
                        reason: c.reason.chars().take(128).collect(),
                        note: Some(format!("{}={}: {}", c.type_, c.status, c.message)),
                        action: "Translate".into(),
                        secondary: None,
                    };
                    match recorder.publish(&event, &reference).await {
                        Ok(()) => published = true,
                        Err(e) => failed = Some(e),
                    }
                }
                // A failed one is tried again (all of them: the recorder counts a repeat
                // into the same Event series).
                match failed {
                    Some(e) => Err(Error::Kube(e)),
                    None => Ok(Done {
                        desired: value,
                        written: published,
                        live: None,
                    }),
                }
            }
        };
        Outcome { key, result }
    }
}

fn still_leading(leading: Option<&tokio::sync::watch::Receiver<bool>>) -> bool {
    leading.is_none_or(|l| *l.borrow())
}

/// The write of [`Work::Apply`].
async fn apply(
    api: &Api<DynamicObject>,
    resource: &ApiResource,
    key: &ObjectKey,
    desired: Value,
    atomic: Option<Box<Atomic>>,
    leading: Option<&tokio::sync::watch::Receiver<bool>>,
    seen: Option<String>,
) -> Result<Done, Error> {
    let mut metadata = json!({"name": key.name});
    if !key.namespace.is_empty() {
        metadata["namespace"] = json!(key.namespace);
    }
    let body = |metadata: &Value, status: &Value| {
        json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": metadata,
            "status": status,
        })
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let Some(mut a) = atomic else {
        if !still_leading(leading) {
            return Ok(Done {
                desired,
                written: false,
                live: None,
            });
        }
        let obj = api
            .patch_status(
                &key.name,
                &params,
                &Patch::Apply(&body(&metadata, &desired)),
            )
            .await
            .map_err(Error::Kube)?;
        let status = obj.data.get("status").cloned().unwrap_or(Value::Null);
        let live = obj.metadata.resource_version.map(|rv| (seen, rv, status));
        return Ok(Done {
            desired,
            written: true,
            live,
        });
    };
    // Read-modify-write: foreign entries from the object, under its resourceVersion. The
    // first try uses what is known of it; a conflict reads it and tries once more.
    for attempt in 0..2 {
        let (rv, live_status) = match a.known.take().filter(|_| attempt == 0) {
            Some(known) => known,
            None => {
                let live = api.get_status(&key.name).await.map_err(Error::Kube)?;
                let status = live.data.get("status").cloned().unwrap_or(Value::Null);
                (live.metadata.resource_version.unwrap_or_default(), status)
            }
        };
        let prev = a.prev.as_ref().unwrap_or(&live_status);
        let desired = desired_status(
            &a.controller_name,
            key,
            a.status.as_ref(),
            prev,
            &live_status,
            &a.gate,
            &a.now,
        );
        if subset(&desired, &live_status) {
            return Ok(Done {
                desired,
                written: false,
                live: Some((a.seen.clone(), rv, live_status)),
            });
        }
        if !still_leading(leading) {
            return Ok(Done {
                desired,
                written: false,
                live: None,
            });
        }
        let mut metadata = metadata.clone();
        metadata["resourceVersion"] = json!(rv);
        match api
            .patch_status(
                &key.name,
                &params,
                &Patch::Apply(&body(&metadata, &desired)),
            )
            .await
        {
            Ok(obj) => {
                let status = obj.data.get("status").cloned().unwrap_or(Value::Null);
                let live = obj
                    .metadata
                    .resource_version
                    .map(|rv| (a.seen.clone(), rv, status));
                return Ok(Done {
                    desired,
                    written: true,
                    live,
                });
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt == 0 => continue,
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    unreachable!("the second attempt returns")
}

/// What the writer remembers of one object.
#[derive(Default)]
struct Written {
    /// The `metadata.uid` of the object `status` and `live` were written for.
    uid: Option<String>,
    /// The status last written (or found there already, or the conditions last published).
    status: Option<Value>,
    /// Route and policy kinds: the resourceVersion the watch cache had when we last wrote,
    /// and the object's resourceVersion and status right after that write; that status is
    /// `None` when it equals `status` (the usual case: no other controller's entries), so
    /// thousands of routes do not keep each status twice (a route status is several KB as a
    /// `Value`).
    live: Option<(Option<String>, String, Option<Value>)>,
}

/// Writes statuses; remembers what it wrote so unchanged statuses cost nothing.
pub struct StatusWriter {
    client: Client,
    controller_name: String,
    written: HashMap<ObjectKey, Written>,
    /// While set, every write first checks that this replica still leads.
    leading: Option<tokio::sync::watch::Receiver<bool>>,
    events: Option<Recorder>,
    /// Set on gaining the lease ([`StatusWriter::distrust_cache`]): a status the watch cache
    /// alone says is right is read from the API server before it is skipped.
    distrust: bool,
}

impl StatusWriter {
    /// `controller_name` is the GatewayClass controller name: route parent and policy ancestor
    /// entries carrying it are ours.
    pub fn new(client: Client, controller_name: &str) -> StatusWriter {
        StatusWriter {
            client,
            controller_name: controller_name.into(),
            written: HashMap::new(),
            leading: None,
            events: None,
            distrust: false,
        }
    }

    /// Publish conditions of kinds without a status block (Ingress, ...) as Events, reported
    /// as `reporter` (the controller's name and this replica's identity).
    pub fn with_events(mut self, reporter: Reporter) -> StatusWriter {
        self.events = Some(Recorder::new(self.client.clone(), reporter));
        self
    }

    /// Check leadership before every single write: losing the lease stops a write pass midway.
    pub fn with_leadership(mut self, leading: tokio::sync::watch::Receiver<bool>) -> StatusWriter {
        self.leading = Some(leading);
        self
    }

    /// The GatewayClass controller name this writer writes entries as.
    pub fn controller_name(&self) -> &str {
        &self.controller_name
    }

    /// Whether this replica may write now.
    pub fn may_write(&self) -> bool {
        still_leading(self.leading.as_ref())
    }

    /// Forget what was written (after losing leadership: another replica may write meanwhile).
    pub fn forget(&mut self) {
        self.written.clear();
    }

    /// This replica gained the lease: from now on, an object this writer has neither written
    /// nor read since it last forgot ([`StatusWriter::forget`]) is not skipped on the word of
    /// the watch cache alone. The cache does not see status-only updates (see
    /// [`crate::watch`]), so it does not hold what another leader wrote meanwhile: such an
    /// object is read (`get` of its `status`) and written only when the live status differs,
    /// once; then this writer's memory of it serves again.
    pub fn distrust_cache(&mut self) {
        self.distrust = true;
    }

    /// Forget one object (deleted, or no longer reported).
    pub fn forget_one(&mut self, key: &ObjectKey) {
        self.written.remove(key);
    }

    /// Write every status that changed, one at a time. Errors are per object and do not stop
    /// the others. (The controller's run loop writes through [`crate::status_worker`]
    /// instead, with the same [`StatusWriter::prepare`] and [`StatusWriter::finish`].)
    pub async fn write(
        &mut self,
        statuses: &Statuses,
        snapshot: &Snapshot,
        gate: &Gate,
    ) -> WriteReport {
        let now = now();
        let index = Index::new(snapshot);
        let mut report = WriteReport::default();
        let mut keys: Vec<(ObjectKey, Option<&ObjectStatus>)> =
            statuses.iter().map(|(k, s)| (k.clone(), Some(s))).collect();
        // Our entries on routes translate no longer reports (e.g. detached from our Gateways).
        for (kind, ns, name, current) in index.routes() {
            let key = ObjectKey::new(kind, ns, name);
            if !statuses.contains_key(&key) && self.has_our_entries(kind, &current.status()) {
                keys.push((key, None));
            }
        }
        for (key, status) in keys {
            if !self.may_write() {
                report.not_leader = true;
                return report;
            }
            let current = index.get(&key);
            if current.is_none() && !matches!(status, Some(ObjectStatus::Conditions(_))) {
                self.forget_one(&key);
                continue;
            }
            let job = match self.prepare(&key, status, current, gate, &now) {
                Prepared::Unchanged => {
                    report.unchanged += 1;
                    continue;
                }
                Prepared::Write(job) => job,
            };
            match self.finish(job.run().await) {
                Ok(true) => report.written.push(key),
                Ok(false) => report.unchanged += 1,
                Err(e) => report.errors.push((key, e)),
            }
        }
        // Forget objects translate no longer reports (deleted, or no longer ours).
        self.written.retain(|k, _| statuses.contains_key(k));
        report
    }

    /// Decide what to write for one object. `status: None` removes our route/policy entries;
    /// `current` is the object as the watch cache has it (`None`: not there; nothing is
    /// written). Kinds without a status block of ours (Ingress, IngressClass,
    /// SweetyProxyConfig) log their conditions once per change and object, and publish them
    /// as Events when enabled; their `current` is the object the Events are about
    /// ([`event_object`]).
    pub fn prepare(
        &mut self,
        key: &ObjectKey,
        status: Option<&ObjectStatus>,
        current: Option<&dyn Current>,
        gate: &Gate,
        now: &str,
    ) -> Prepared {
        if let Some(ObjectStatus::Conditions(conditions)) = status {
            let v = serde_json::to_value(conditions).unwrap_or(Value::Null);
            // `current` is the object the Events are about ([`event_object`]): published
            // again for an object created again under the same name (a new `metadata.uid`),
            // since `kubectl describe` shows only the Events that name the object's uid.
            let uid = current.and_then(|c| c.uid());
            let said = |w: &Written| w.uid == uid && w.status.as_ref() == Some(&v);
            if self.written.get(key).is_some_and(said) {
                return Prepared::Unchanged;
            }
            for c in conditions {
                if c.status == "False" || c.type_ == "Warning" {
                    tracing::warn!(
                        kind = %key.kind, namespace = %key.namespace, name = %key.name,
                        condition = %c.type_, status = %c.status, reason = %c.reason,
                        message = %c.message, "object condition"
                    );
                } else {
                    tracing::info!(
                        kind = %key.kind, namespace = %key.namespace, name = %key.name,
                        condition = %c.type_, status = %c.status, reason = %c.reason,
                        message = %c.message, "object condition"
                    );
                }
            }
            let reference = uid.clone().and_then(|uid| event_reference(key, uid));
            return match (&self.events, reference) {
                (Some(recorder), Some(reference)) => {
                    // What was published goes with the uid ([`StatusWriter::finish`] records
                    // it).
                    let written = self.written.entry(key.clone()).or_default();
                    if written.uid != uid {
                        *written = Written {
                            uid,
                            ..Written::default()
                        };
                    }
                    Prepared::Write(Box::new(WriteJob {
                        key: key.clone(),
                        work: Work::Events {
                            recorder: recorder.clone(),
                            reference,
                            conditions: conditions.clone(),
                            value: v,
                        },
                    }))
                }
                // Not in the cache (deleted): no Event, which nothing would show; what was
                // published stays remembered.
                (Some(_), None) => Prepared::Unchanged,
                (None, _) => {
                    self.written.insert(
                        key.clone(),
                        Written {
                            uid,
                            status: Some(v),
                            live: None,
                        },
                    );
                    Prepared::Unchanged
                }
            };
        }
        let (Some(current), Some(resource)) = (current, api_resource(&key.kind)) else {
            return Prepared::Unchanged;
        };
        let cur_status = current.status();
        // An object deleted and created again under the same name starts without our status:
        // what was written for the old one says nothing about it.
        let uid = current.uid();
        let written = self.written.entry(key.clone()).or_default();
        if written.uid != uid {
            *written = Written {
                uid,
                ..Written::default()
            };
        }
        let written = &*written;
        let atomic = is_atomic_kind(&key.kind);
        let cached_rv = current.resource_version();
        // What we know of the object: after our last write, unless the watch cache has seen
        // the object change since (then the cache's copy is newer).
        let known = match &written.live {
            Some((seen, rv, st)) if *seen == cached_rv => Some((
                rv.clone(),
                st.as_ref()
                    .or(written.status.as_ref())
                    .cloned()
                    .unwrap_or(Value::Null),
            )),
            _ => cached_rv.clone().map(|rv| (rv, cur_status.clone())),
        };
        let have = known.as_ref().map_or(&cur_status, |k| &k.1);
        let last = written.status.as_ref();
        let stamp_src = last.unwrap_or(have);
        let desired = desired_status(
            &self.controller_name,
            key,
            status,
            stamp_src,
            have,
            gate,
            now,
        );
        let prev = last.cloned();
        // What was last written stands for the object only while the watch cache has not
        // moved since that write (it may not have seen the write yet). Once it has, the
        // cache's copy decides: a status someone else changed (or a late write) is written
        // again, instead of being trusted to what this writer remembers.
        let cache_unmoved = matches!(&written.live, Some((seen, _, _)) if *seen == cached_rv);
        let remembered = last == Some(&desired) && cache_unmoved;
        // Right by the cache alone, after a lease gain, and neither written nor read since:
        // read it (the other leader's writes are not in the cache).
        let unverified = self.distrust && !remembered && written.live.is_none();
        let cache_says_right = subset(&desired, have);
        if remembered || (cache_says_right && !unverified) {
            if let Some(w) = self.written.get_mut(key) {
                // `live` may stand for the status being replaced: keep it.
                if let Some((_, _, live @ None)) = &mut w.live {
                    *live = w.status.clone();
                }
                w.status = Some(desired);
            }
            return Prepared::Unchanged;
        }
        let api: Api<DynamicObject> = if key.namespace.is_empty() {
            Api::all_with(self.client.clone(), &resource)
        } else {
            Api::namespaced_with(self.client.clone(), &key.namespace, &resource)
        };
        // Read-modify-write for route and policy kinds, and to verify what the cache alone
        // says is right (read first: `known: None`; written only if the live status differs).
        let verify = cache_says_right;
        let atomic = (atomic || verify).then(|| {
            Box::new(Atomic {
                controller_name: self.controller_name.clone(),
                status: status.cloned(),
                prev,
                gate: gate.clone(),
                now: now.to_string(),
                known: known.filter(|_| !verify),
                seen: cached_rv.clone(),
            })
        });
        Prepared::Write(Box::new(WriteJob {
            key: key.clone(),
            work: Work::Apply {
                api,
                resource,
                desired,
                atomic,
                leading: self.leading.clone(),
                seen: cached_rv,
            },
        }))
    }

    /// Record how a job ended; `Ok(true)` when something was written.
    pub fn finish(&mut self, outcome: Outcome) -> Result<bool, Error> {
        let done = outcome.result?;
        let w = self.written.entry(outcome.key).or_default();
        w.live = done
            .live
            .map(|(seen, rv, st)| (seen, rv, (st != done.desired).then_some(st)));
        w.status = Some(done.desired);
        Ok(done.written)
    }

    fn has_our_entries(&self, kind: &str, status: &Value) -> bool {
        has_our_entries(&self.controller_name, kind, status)
    }
}

/// The clock reading `lastTransitionTime` takes.
pub fn now() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Whether a route's or policy's status has entries of `controller_name`.
pub fn has_our_entries(controller_name: &str, kind: &str, status: &Value) -> bool {
    status
        .get(list_field(kind))
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|e| is_ours(controller_name, e)))
}

fn is_ours(controller_name: &str, entry: &Value) -> bool {
    entry.get("controllerName").and_then(Value::as_str) == Some(controller_name)
}

/// The status to apply. `prev` supplies earlier `lastTransitionTime`s; `live` supplies other
/// controllers' route/policy entries.
fn desired_status(
    controller_name: &str,
    key: &ObjectKey,
    status: Option<&ObjectStatus>,
    prev: &Value,
    live: &Value,
    gate: &Gate,
    now: &str,
) -> Value {
    let st = Stamper { gate, now };
    let merge = |ours: &[crate::translate::status::RouteParentStatus], reference: &str| {
        merge_entries(controller_name, key, ours, reference, prev, live, &st)
    };
    match status {
        Some(ObjectStatus::GatewayClass(s)) => json!({
            "conditions": st.conditions(&s.conditions, prev.get("conditions")),
            "supportedFeatures": s.supported_features.iter().map(|n| json!({"name": n})).collect::<Vec<_>>(),
        }),
        Some(ObjectStatus::Gateway(s)) => {
            let mut v = json!({
                "addresses": s.addresses,
                "conditions": st.conditions(&s.conditions, prev.get("conditions")),
                "listeners": listener_statuses(&s.listeners, prev, &st),
            });
            if s.attached_listener_sets > 0 {
                v["attachedListenerSets"] = json!(s.attached_listener_sets);
            }
            v
        }
        Some(ObjectStatus::ListenerSet(s)) => json!({
            "conditions": st.conditions(&s.conditions, prev.get("conditions")),
            "listeners": listener_statuses(&s.listeners, prev, &st),
        }),
        Some(ObjectStatus::Route(s)) => json!({"parents": merge(&s.parents, "parentRef")}),
        Some(ObjectStatus::Policy(s)) => json!({"ancestors": merge(&s.ancestors, "ancestorRef")}),
        Some(ObjectStatus::Ingress(s)) => json!({"loadBalancer": {"ingress": s.load_balancer}}),
        Some(ObjectStatus::Site(s)) => json!({
            "conditions": st.conditions(&s.conditions, prev.get("conditions")),
            "addresses": s.addresses,
        }),
        Some(ObjectStatus::Conditions(_)) => Value::Null,
        None => {
            let field = list_field(&key.kind);
            let reference = if field == "ancestors" {
                "ancestorRef"
            } else {
                "parentRef"
            };
            json!({ field: merge(&[], reference) })
        }
    }
}

/// Other controllers' entries from `live`, then ours (stamped against `prev`).
fn merge_entries(
    controller_name: &str,
    key: &ObjectKey,
    ours: &[crate::translate::status::RouteParentStatus],
    reference: &str,
    prev: &Value,
    live: &Value,
    st: &Stamper<'_>,
) -> Vec<Value> {
    let field = list_field(&key.kind);
    let mut out: Vec<Value> = live
        .get(field)
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter(|e| !is_ours(controller_name, e))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let prev_entries = prev.get(field).and_then(Value::as_array);
    for p in ours {
        let r = parent_ref_value(&p.parent_ref);
        let prev_e = prev_entries.and_then(|l| {
            l.iter()
                .find(|e| is_ours(controller_name, e) && e.get(reference) == Some(&r))
        });
        out.push(json!({
            reference: r,
            "controllerName": p.controller_name,
            "conditions": st.conditions(&p.conditions, prev_e.and_then(|e| e.get("conditions"))),
        }));
    }
    out
}

/// `status.listeners` of a Gateway or ListenerSet, keeping earlier `lastTransitionTime`s.
fn listener_statuses(
    listeners: &[crate::translate::status::ListenerStatus],
    prev: &Value,
    st: &Stamper<'_>,
) -> Vec<Value> {
    let prev_listeners = prev.get("listeners").and_then(Value::as_array);
    listeners
        .iter()
        .map(|l| {
            let prev_l = prev_listeners.and_then(|pl| {
                pl.iter()
                    .find(|p| p.get("name").and_then(Value::as_str) == Some(&l.name))
            });
            json!({
                "name": l.name,
                "supportedKinds": l.supported_kinds,
                "attachedRoutes": l.attached_routes,
                "conditions": st.conditions(&l.conditions, prev_l.and_then(|p| p.get("conditions"))),
            })
        })
        .collect()
}

/// Adds `lastTransitionTime` and applies the Programmed gate.
struct Stamper<'a> {
    gate: &'a Gate,
    now: &'a str,
}

impl Stamper<'_> {
    fn conditions(&self, conditions: &[Condition], prev: Option<&Value>) -> Vec<Value> {
        let prev = prev.and_then(Value::as_array);
        conditions
            .iter()
            .map(|c| {
                // Already written as programmed for this generation of the object: a later
                // config (another object's change) being applied does not unprogram it.
                let programmed_before = prev.is_some_and(|p| {
                    p.iter().any(|o| {
                        o.get("type").and_then(Value::as_str) == Some("Programmed")
                            && o.get("status").and_then(Value::as_str) == Some("True")
                            && o.get("observedGeneration").and_then(Value::as_i64)
                                == Some(c.observed_generation)
                    })
                });
                let held = c.type_ == "Programmed"
                    && c.status == "True"
                    && !self.gate.acked
                    && (self.gate.nack.is_some() || !programmed_before);
                let (status, reason, message) = if held {
                    match &self.gate.nack {
                        Some(errors) => (
                            "False",
                            "Invalid",
                            format!("the dataplane rejected the configuration: {errors}"),
                        ),
                        None => (
                            "Unknown",
                            "Pending",
                            "Waiting for the dataplane to apply the configuration".to_string(),
                        ),
                    }
                } else {
                    (c.status.as_str(), c.reason.as_str(), c.message.clone())
                };
                let kept = prev.and_then(|p| {
                    p.iter().find(|o| {
                        o.get("type").and_then(Value::as_str) == Some(&c.type_)
                            && o.get("status").and_then(Value::as_str) == Some(status)
                            && o.get("reason").and_then(Value::as_str) == Some(reason)
                    })
                });
                let time = kept
                    .and_then(|o| o.get("lastTransitionTime"))
                    .and_then(Value::as_str)
                    .unwrap_or(self.now);
                json!({
                    "type": c.type_,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "observedGeneration": c.observed_generation,
                    "lastTransitionTime": time,
                })
            })
            .collect()
    }
}

/// The object the Events of `key` are about, for kinds `translate` reports bare conditions
/// for: an Ingress's problems are recorded under their own key kind (so the Ingress's
/// load-balancer status is kept), and are about the Ingress itself.
pub fn event_object(key: &ObjectKey) -> ObjectKey {
    if key.kind == crate::translate::ingress::EVENT_KIND {
        ObjectKey::new("Ingress", &key.namespace, &key.name)
    } else {
        key.clone()
    }
}

/// The object an Event is about (kinds `translate` reports bare conditions for), with the
/// object's `uid`: `kubectl describe` lists the Events whose object reference carries the
/// uid of the object described (its field selector includes `involvedObject.uid`).
fn event_reference(key: &ObjectKey, uid: String) -> Option<ObjectReference> {
    let (api_version, kind) = match key.kind.as_str() {
        "Ingress" | "IngressClass" => ("networking.k8s.io/v1", key.kind.as_str()),
        crate::translate::ingress::EVENT_KIND => ("networking.k8s.io/v1", "Ingress"),
        "SweetyProxyConfig" => ("sweety.dev/v1alpha1", key.kind.as_str()),
        _ => return None,
    };
    Some(ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.into()),
        namespace: (!key.namespace.is_empty()).then(|| key.namespace.clone()),
        name: Some(key.name.clone()),
        uid: Some(uid),
        ..Default::default()
    })
}

/// A parent reference as the apiserver returns it (CRD defaults for group and kind filled).
fn parent_ref_value(p: &ParentRef) -> Value {
    let mut m = Map::new();
    m.insert(
        "group".into(),
        json!(p.group.as_deref().unwrap_or("gateway.networking.k8s.io")),
    );
    m.insert("kind".into(), json!(p.kind.as_deref().unwrap_or("Gateway")));
    if let Some(ns) = &p.namespace {
        m.insert("namespace".into(), json!(ns));
    }
    m.insert("name".into(), json!(p.name));
    if let Some(s) = &p.section_name {
        m.insert("sectionName".into(), json!(s));
    }
    if let Some(port) = p.port {
        m.insert("port".into(), json!(port));
    }
    Value::Object(m)
}

/// Whether `want` is contained in `have`: objects key by key (extra keys in `have` are fine),
/// arrays element by element, empty arrays equal to absent.
fn subset(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w.iter().all(|(k, v)| match h.get(k) {
            Some(hv) => subset(v, hv),
            None => is_empty(v),
        }),
        (Value::Object(w), Value::Null) => w.values().all(is_empty),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| subset(a, b))
        }
        (Value::Array(w), Value::Null) => w.is_empty(),
        (w, h) => w == h,
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_empty),
        _ => false,
    }
}

const ROUTE_KINDS: [&str; 5] = ["HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "UDPRoute"];

/// Route and policy kinds, whose status lists are `atomic` (see the module docs).
pub fn is_atomic_kind(kind: &str) -> bool {
    ROUTE_KINDS.contains(&kind) || kind == "BackendTLSPolicy" || kind == "SweetySecurityPolicy"
}

fn list_field(kind: &str) -> &'static str {
    if kind == "BackendTLSPolicy" || kind == "SweetySecurityPolicy" {
        "ancestors"
    } else {
        "parents"
    }
}

/// The API resource of a kind the writer writes status for.
pub fn api_resource(kind: &str) -> Option<ApiResource> {
    use gw::*;
    Some(match kind {
        "GatewayClass" => ApiResource::erase::<gatewayclasses::GatewayClass>(&()),
        "Gateway" => ApiResource::erase::<gateways::Gateway>(&()),
        "ListenerSet" => ApiResource::erase::<listenersets::ListenerSet>(&()),
        "HTTPRoute" => ApiResource::erase::<httproutes::HttpRoute>(&()),
        "GRPCRoute" => ApiResource::erase::<grpcroutes::GrpcRoute>(&()),
        "TLSRoute" => ApiResource::erase::<tlsroutes::TlsRoute>(&()),
        "TCPRoute" => ApiResource::erase::<tcproutes::TcpRoute>(&()),
        "UDPRoute" => ApiResource::erase::<udproutes::UdpRoute>(&()),
        "BackendTLSPolicy" => ApiResource::erase::<backendtlspolicies::BackendTlsPolicy>(&()),
        "Ingress" => ApiResource::erase::<k8s_openapi::api::networking::v1::Ingress>(&()),
        "SweetySite" => ApiResource::erase::<sweety_crds::SweetySite>(&()),
        "SweetySecurityPolicy" => ApiResource::erase::<sweety_crds::SweetySecurityPolicy>(&()),
        _ => return None,
    })
}

/// An object whose status the writer compares against.
pub trait Current: Send + Sync {
    /// The object's `status` as the watch cache has it (Null when absent).
    fn status(&self) -> Value;
    /// `metadata.uid`: tells a re-created object (same name) from the one written before.
    fn uid(&self) -> Option<String>;
    /// `metadata.resourceVersion` as the watch cache has it.
    fn resource_version(&self) -> Option<String>;
}

/// `impl Current` for the kinds listed; `status: |o| ...` reads an object's status (the
/// kinds Events are published about that have no status of ours: `Value::Null`).
macro_rules! impl_current {
    (status: $status:expr; $($t:ty),*) => {$(
        impl Current for $t {
            fn status(&self) -> Value {
                let status: fn(&$t) -> Value = $status;
                status(self)
            }
            fn uid(&self) -> Option<String> {
                self.metadata.uid.clone()
            }
            fn resource_version(&self) -> Option<String> {
                self.metadata.resource_version.clone()
            }
        }
    )*};
}

impl_current!(
    status: |_| Value::Null;
    k8s_openapi::api::networking::v1::IngressClass,
    sweety_crds::SweetyProxyConfig
);

impl_current!(
    status: |o| serde_json::to_value(&o.status).unwrap_or(Value::Null);
    gw::gatewayclasses::GatewayClass,
    gw::gateways::Gateway,
    gw::listenersets::ListenerSet,
    gw::httproutes::HttpRoute,
    gw::grpcroutes::GrpcRoute,
    gw::tlsroutes::TlsRoute,
    gw::tcproutes::TcpRoute,
    gw::udproutes::UdpRoute,
    gw::backendtlspolicies::BackendTlsPolicy,
    k8s_openapi::api::networking::v1::Ingress,
    sweety_crds::SweetySite,
    sweety_crds::SweetySecurityPolicy
);

/// Every kind whose status the writer writes, with its field in [`Snapshot`] and in
/// [`crate::watch::Stores`] (the two name them alike): the one list [`STATUS_KINDS`], the
/// snapshot index of [`StatusWriter::write`] and the status worker's cache lookups are made of.
/// `status_kinds!(m!(args;))` calls `m!(args; "Kind" field, ...)`.
macro_rules! status_kinds {
    ($m:ident!($($args:tt)*)) => {
        $m!($($args)*
            "GatewayClass" gateway_classes,
            "Gateway" gateways,
            "ListenerSet" listener_sets,
            "HTTPRoute" http_routes,
            "GRPCRoute" grpc_routes,
            "TLSRoute" tls_routes,
            "TCPRoute" tcp_routes,
            "UDPRoute" udp_routes,
            "BackendTLSPolicy" backend_tls_policies,
            "Ingress" ingresses,
            "SweetySite" sites,
            "SweetySecurityPolicy" security_policies
        )
    };
}
pub(crate) use status_kinds;

macro_rules! kind_names {
    ($($kind:literal $field:ident),*) => {
        [$($kind),*]
    };
}

/// The kinds whose status the writer writes. `translate` reads none of their statuses, so the
/// watches treat a status-only update of one of them as no change of the input.
pub const STATUS_KINDS: [&str; 12] = status_kinds!(kind_names!());

type IndexKey<'a> = (&'static str, &'a str, &'a str);

/// The snapshot's objects by (kind, namespace, name).
struct Index<'a> {
    map: HashMap<IndexKey<'a>, &'a dyn Current>,
}

impl<'a> Index<'a> {
    fn new(s: &'a Snapshot) -> Index<'a> {
        let mut map: HashMap<IndexKey<'a>, &'a dyn Current> = HashMap::new();
        fn add<'a, K: Current + kube::Resource + 'static>(
            map: &mut HashMap<IndexKey<'a>, &'a dyn Current>,
            kind: &'static str,
            list: &'a [Arc<K>],
        ) {
            for o in list {
                let m = kube::Resource::meta(o.as_ref());
                let ns = m.namespace.as_deref().unwrap_or("");
                let name = m.name.as_deref().unwrap_or("");
                map.insert((kind, ns, name), o.as_ref());
            }
        }
        macro_rules! add_all {
            ($($kind:literal $field:ident),*) => {
                $(add(&mut map, $kind, &s.$field);)*
            };
        }
        status_kinds!(add_all!());
        add(&mut map, "IngressClass", &s.ingress_classes);
        add(&mut map, "SweetyProxyConfig", &s.proxy_configs);
        Index { map }
    }

    /// The object `key`'s status is for, or the one its Events are about.
    fn get(&self, key: &ObjectKey) -> Option<&'a dyn Current> {
        let key = event_object(key);
        let kind = *STATUS_KINDS
            .iter()
            .chain(&["IngressClass", "SweetyProxyConfig"])
            .find(|k| **k == key.kind)?;
        self.map
            .get(&(kind, key.namespace.as_str(), key.name.as_str()))
            .copied()
    }

    /// Every route and BackendTLSPolicy, sorted.
    fn routes(&self) -> Vec<(&'static str, &'a str, &'a str, &'a dyn Current)> {
        let mut v: Vec<_> = self
            .map
            .iter()
            .filter(|(k, _)| is_atomic_kind(k.0))
            .map(|(k, c)| (k.0, k.1, k.2, *c))
            .collect();
        v.sort_by_key(|e| (e.0, e.1, e.2));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Gateway as the watch cache has it.
    struct Cached {
        status: Value,
        rv: &'static str,
    }

    impl Current for Cached {
        fn status(&self) -> Value {
            self.status.clone()
        }
        fn uid(&self) -> Option<String> {
            Some("uid-1".into())
        }
        fn resource_version(&self) -> Option<String> {
            Some(self.rv.into())
        }
    }

    fn gateway_status(attached: i32) -> ObjectStatus {
        use crate::translate::status::{GatewayStatus, ListenerStatus};
        ObjectStatus::Gateway(GatewayStatus {
            addresses: Vec::new(),
            conditions: Vec::new(),
            listeners: vec![ListenerStatus {
                name: "http".into(),
                supported_kinds: Vec::new(),
                attached_routes: attached,
                conditions: Vec::new(),
            }],
            attached_listener_sets: 0,
        })
    }

    fn attached_in(status: &Value) -> i64 {
        status["listeners"][0]["attachedRoutes"].as_i64().unwrap()
    }

    /// Events that could not be published (here: no API server) are an error, so the status
    /// worker tries them again, and are not remembered as published. (Before, the job ended
    /// well whatever the recorder answered, and the conditions were never published again for
    /// that object.) With the object gone from the cache, nothing is published.
    #[tokio::test]
    async fn events_that_fail_are_tried_again() {
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let mut w =
            StatusWriter::new(client, "sweety.dev/gateway-controller").with_events(Reporter {
                controller: FIELD_MANAGER.into(),
                instance: None,
            });
        let key = ObjectKey::new(crate::translate::ingress::EVENT_KIND, "ns", "ing");
        let want = ObjectStatus::Conditions(vec![Condition::new(
            "Warning",
            true,
            "HostTaken",
            "taken".to_string(),
            1,
        )]);
        let (gate, now) = (Gate::open(), "2026-01-01T00:00:00Z");
        let ingress = Cached {
            status: Value::Null,
            rv: "1",
        };
        for attempt in 0..2 {
            let Prepared::Write(job) = w.prepare(&key, Some(&want), Some(&ingress), &gate, now)
            else {
                panic!("attempt {attempt}: the Events are published");
            };
            let Work::Events { reference, .. } = &job.work else {
                panic!("Events");
            };
            assert_eq!(reference.uid.as_deref(), Some("uid-1"));
            assert_eq!(reference.kind.as_deref(), Some("Ingress"));
            assert!(w.finish(job.run().await).is_err(), "attempt {attempt}");
        }
        assert!(matches!(
            w.prepare(&key, Some(&want), None, &gate, now),
            Prepared::Unchanged
        ));
    }

    /// What this writer last wrote is trusted only until the watch cache moves past that write:
    /// a Gateway whose cached status says something else (another writer, or a write of ours
    /// that landed late) gets the wanted status again even when it equals the last one written.
    /// (Before, the writer compared with its memory first and left a stale `attachedRoutes: 1`
    /// on the conformance suite's Gateways for good: their "0 routes attached" checks failed.)
    #[tokio::test]
    async fn a_status_changed_behind_the_writers_back_is_written_again() {
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let mut w = StatusWriter::new(client, "sweety.dev/gateway-controller");
        let key = ObjectKey::new("Gateway", "ns", "gw");
        let gate = Gate::open();
        let now = "2026-01-01T00:00:00Z";
        let want = gateway_status(0);
        // The cache (rv 1) says 1 route; we want 0: a write.
        let before = Cached {
            status: json!({"listeners": [{"name": "http", "attachedRoutes": 1}]}),
            rv: "1",
        };
        let Prepared::Write(job) = w.prepare(&key, Some(&want), Some(&before), &gate, now) else {
            panic!("a status that differs from the cache's is written");
        };
        let Work::Apply { desired, .. } = &job.work else {
            panic!("a status write");
        };
        assert_eq!(attached_in(desired), 0);
        // It was written: the object is at rv 2 with 0 routes (the cache has not seen it yet).
        let written = desired.clone();
        w.finish(Outcome {
            key: key.clone(),
            result: Ok(Done {
                desired: written.clone(),
                written: true,
                live: Some((Some("1".into()), "2".into(), written.clone())),
            }),
        })
        .unwrap();
        // The cache still at rv 1 (it lags our write): no second write.
        assert!(matches!(
            w.prepare(&key, Some(&want), Some(&before), &gate, now),
            Prepared::Unchanged
        ));
        // The cache caught up (rv 2, 0 routes): nothing to write.
        let caught_up = Cached {
            status: written.clone(),
            rv: "2",
        };
        assert!(matches!(
            w.prepare(&key, Some(&want), Some(&caught_up), &gate, now),
            Prepared::Unchanged
        ));
        // Then the object changed behind the writer's back (rv 3, 1 route again) while the
        // wanted status is still the one last written: it is written again.
        let changed = Cached {
            status: json!({"listeners": [{"name": "http", "attachedRoutes": 1}]}),
            rv: "3",
        };
        let Prepared::Write(job) = w.prepare(&key, Some(&want), Some(&changed), &gate, now) else {
            panic!("the cache's status differs from what we want: write again");
        };
        let Work::Apply { desired, .. } = &job.work else {
            panic!("a status write");
        };
        assert_eq!(attached_in(desired), 0);
    }

    #[test]
    fn subset_ignores_extra_fields_and_empty_lists() {
        let want = json!({"a": [{"x": 1}], "b": [], "c": {"d": []}});
        let have = json!({"a": [{"x": 1, "y": 2}], "z": true});
        assert!(subset(&want, &have));
        assert!(!subset(&json!({"a": [{"x": 2}]}), &have));
        assert!(!subset(&json!({"a": []}), &have));
    }

    #[test]
    fn programmed_is_held_until_ack_and_times_are_kept() {
        let conds = vec![
            Condition::new("Accepted", true, "Accepted", "ok", 3),
            Condition::new("Programmed", true, "Programmed", "ok", 3),
        ];
        let prev = json!([{"type": "Accepted", "status": "True", "reason": "Accepted",
            "lastTransitionTime": "2020-01-01T00:00:00Z"}]);
        let pending = Gate::default();
        let st = Stamper {
            gate: &pending,
            now: "2026-01-01T00:00:00Z",
        };
        let out = st.conditions(&conds, Some(&prev));
        assert_eq!(out[0]["lastTransitionTime"], "2020-01-01T00:00:00Z");
        assert_eq!(out[1]["status"], "Unknown");
        assert_eq!(out[1]["reason"], "Pending");
        assert_eq!(out[1]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(out[1]["observedGeneration"], 3);
        let open = Gate::open();
        let st = Stamper {
            gate: &open,
            now: "2026-01-01T00:00:00Z",
        };
        assert_eq!(st.conditions(&conds, None)[1]["status"], "True");
    }

    #[test]
    fn programmed_stays_true_while_a_later_config_is_pending() {
        let conds = vec![Condition::new("Programmed", true, "Programmed", "ok", 3)];
        let prev = json!([{"type": "Programmed", "status": "True", "reason": "Programmed",
            "observedGeneration": 3, "lastTransitionTime": "2020-01-01T00:00:00Z"}]);
        let pending = Gate::default();
        let st = Stamper {
            gate: &pending,
            now: "2026-01-01T00:00:00Z",
        };
        let out = st.conditions(&conds, Some(&prev));
        assert_eq!(out[0]["status"], "True");
        assert_eq!(out[0]["lastTransitionTime"], "2020-01-01T00:00:00Z");
        // A new generation of the object waits for the dataplane again.
        let newer = vec![Condition::new("Programmed", true, "Programmed", "ok", 4)];
        assert_eq!(st.conditions(&newer, Some(&prev))[0]["status"], "Unknown");
        // A rejected config still says so.
        let nack = Gate {
            acked: false,
            nack: Some("bad".into()),
        };
        let st = Stamper {
            gate: &nack,
            now: "2026-01-01T00:00:00Z",
        };
        assert_eq!(st.conditions(&conds, Some(&prev))[0]["status"], "False");
    }

    #[test]
    fn gate_follows_acks_and_nacks() {
        let mut s = PushState {
            submitted: 5,
            acked: 4,
            ..Default::default()
        };
        assert!(!Gate::new(&s, 5).acked);
        assert!(Gate::new(&s, 4).acked);
        s.last_nack = Some((5, vec!["bad listener".into()]));
        assert_eq!(Gate::new(&s, 5).nack.as_deref(), Some("bad listener"));
        assert_eq!(Gate::new(&s, 4).nack, None);
    }

    /// review-s22b F4: a Nack with a huge error list still gives a condition message far
    /// below Gateway API's 32,768-character cap: whole errors up to NACK_MESSAGE_MAX bytes,
    /// then how many were left out; a single huge error is cut at a character boundary.
    #[test]
    fn a_huge_nack_gives_a_bounded_condition_message() {
        let errors: Vec<String> = (0..10_000)
            .map(|i| format!("listeners[{i}]: cannot bind 0.0.0.0:{i}: Address already in use"))
            .collect();
        let s = PushState {
            submitted: 5,
            acked: 4,
            last_nack: Some((5, errors.clone())),
            ..Default::default()
        };
        let gate = Gate::new(&s, 5);
        let text = gate.nack.as_deref().unwrap();
        assert!(text.len() <= NACK_MESSAGE_MAX + 40, "{}", text.len());
        let (shown, more) = text.rsplit_once(" (").unwrap();
        assert!(shown.len() <= NACK_MESSAGE_MAX);
        let listed = shown.split("; ").count();
        assert!(listed > 1);
        assert_eq!(shown, errors[..listed].join("; "));
        assert_eq!(more, format!("{} more errors)", errors.len() - listed));
        let conds = vec![Condition::new("Programmed", true, "Programmed", "ok", 3)];
        let st = Stamper {
            gate: &gate,
            now: "2026-01-01T00:00:00Z",
        };
        let out = st.conditions(&conds, None);
        assert_eq!(out[0]["status"], "False");
        let message = out[0]["message"].as_str().unwrap();
        assert!(message.chars().count() < 2048, "{}", message.len());
        assert!(message.ends_with("more errors)"));

        // One error longer than the cap, of 2-byte characters, and a short one after it.
        let huge = "é".repeat(40_000);
        let s = PushState {
            last_nack: Some((5, vec![huge, "next".into()])),
            ..s
        };
        let text = Gate::new(&s, 5).nack.unwrap();
        assert!(text.len() <= NACK_MESSAGE_MAX + 40, "{}", text.len());
        assert!(text.starts_with("éé"));
        assert!(text.ends_with("… (1 more error)"), "{text}");
        // A short list is written whole.
        let s = PushState {
            last_nack: Some((5, vec!["a".into(), "b".into()])),
            ..s
        };
        assert_eq!(Gate::new(&s, 5).nack.as_deref(), Some("a; b"));
    }
}
