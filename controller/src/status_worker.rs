//! The status worker: writes the statuses `translate` wants without holding back config.
//!
//! The reconcile loop translates, submits the config to the pusher, and only then offers the
//! translation's statuses here ([`StatusQueue::offer`]): it never waits for a status write. A
//! separate task writes them through the [`StatusWriter`]:
//!
//! - **Coalesced per object.** The queue holds one entry per object: the latest wanted status
//!   and the config generation that status came with. An object offered again before it was
//!   written keeps one place in the queue and only its latest status is written; one offered
//!   while its write is in flight is written again afterwards. The queue is therefore bounded
//!   by the number of objects `translate` reports (plus routes whose entries of ours are being
//!   removed); nothing is ever dropped, and an offer compares only the statuses the translation
//!   says may have changed ([`StatusChanges`]; every object's after a full translation).
//! - **Skipped when unchanged.** An offer queues only objects whose wanted status differs from
//!   the one offered before; the writer then skips statuses equal to what it last wrote or to
//!   what the object already carries ([`StatusWriter::prepare`]), without a request.
//! - **Bounded.** At most [`StatusOptions::concurrency`] writes are in flight, and a token
//!   bucket ([`TokenBucket`]) limits them to [`StatusOptions::qps`] per second with bursts of
//!   [`StatusOptions::burst`]: a change of thousands of objects cannot flood the API server.
//!   Pushes never wait for any of it (the pusher and the reconcile loop are other tasks).
//! - **Gated on the dataplane's Ack.** An entry whose generation the dataplane has neither
//!   acknowledged nor rejected waits (up to [`StatusOptions::ack_wait`]) for its answer, so a
//!   status usually goes out once, already `Programmed`. Past that wait it is written with
//!   `Programmed` held as `Unknown`/`Pending` ([`Gate`]), and written again when the answer
//!   comes: `Programmed=True` is only ever written after the dataplane acknowledged a
//!   generation that contains the object, `False`/`Invalid` after it rejected it. A status
//!   written before an `Ack` is written again whenever its gate changes, so it follows the
//!   last answer: an `Ack` after a `Nack` (the full config sent again after a rejected delta,
//!   or a later generation whose statuses are the same) replaces the rejection. When the
//!   acknowledged generation goes back (a restarted dataplane's Hello), the statuses written
//!   as acknowledged since are looked at again, so a rejection of the config sent again
//!   unprograms them.
//! - **Leader only.** Nothing is written while this replica does not lead. On losing the lease
//!   the writer forgets what it wrote; on gaining it every object is queued again (the writer
//!   skips what is already right), and routes carrying entries of ours that `translate` no
//!   longer reports are queued to have them removed. The watch cache does not see status
//!   writes (the other leader's among them), so after gaining the lease a status the cache
//!   alone says is right is read from the API server before it is skipped
//!   ([`StatusWriter::distrust_cache`]): one `get` per such object, once, within the same
//!   rate limit.
//! - **Failures** are retried after [`StatusOptions::retry`] (the latest wanted status then).
//! - **Recreated objects.** An object deleted and created again under the same name with the
//!   same spec between two translations (`kubectl replace --force`, a GitOps tool) has the
//!   wanted status offered before, so no offer queues it, yet the new object carries no
//!   status of ours. The watch journals every object that comes under a name it did not
//!   hold ([`crate::watch::Stores::created`]); the worker queues those it has entries for,
//!   an Ingress's Events with the Ingress (and every object when the journal lost its
//!   place: a relist), and the writer, whose memory of an object goes with its
//!   `metadata.uid`, writes them to (or publishes them about) the new object. Every
//!   offer wakes the worker for that, and tells it the journal's position its snapshot was
//!   taken at ([`crate::translate::Snapshot::created_at`]): the worker takes entries only up
//!   to that position. An object created again with another spec thus waits for the offer
//!   of the translation that saw it, and is not written the status of the old object
//!   (whose config may be acknowledged at the same generation, 1). So does an entry queued
//!   before its object was created again: no status is written to an object the journal
//!   shows created after the latest offer's snapshot, and none at all after a relist in
//!   between, until the next offer ([`Untranslated`]). Only a write already in flight when
//!   the object is created again can land on it; the next offer's translation corrects it.

use crate::metrics::{ConditionCounts, Metrics};
use crate::push::PushState;
use crate::status_writer::{self, Current, Gate, Prepared, StatusWriter};
use crate::translate::status::{ObjectKey, ObjectStatus, Statuses};
use crate::translate::StatusChanges;
use crate::watch::{ObjectJournal, Stores};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How the status worker writes.
#[derive(Clone, Debug)]
pub struct StatusOptions {
    /// Status writes in flight at once.
    pub concurrency: usize,
    /// Client-side rate limit: status writes per second (token bucket refill rate).
    pub qps: f64,
    /// Client-side rate limit: the token bucket's size (writes that may go at once after a
    /// quiet period).
    pub burst: u32,
    /// Longest wait for the dataplane's answer on a generation before a status is written with
    /// `Programmed` held as pending.
    pub ack_wait: Duration,
    /// Delay before a failed write is tried again.
    pub retry: Duration,
}

impl Default for StatusOptions {
    fn default() -> Self {
        StatusOptions {
            concurrency: 8,
            qps: 500.0,
            burst: 500,
            ack_wait: Duration::from_secs(2),
            retry: Duration::from_secs(2),
        }
    }
}

/// A token bucket: `rate` tokens per second, at most `burst` stored.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket. `rate` below 0.001/s counts as 0.001/s; `burst` below 1 as 1.
    pub fn new(rate: f64, burst: u32, now: Instant) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            rate: rate.max(0.001),
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Take one token, or say how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }

    /// Give back a token that was not used.
    pub fn refund(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }
}

/// Where an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Written (or nothing to write) for its latest wanted status.
    Idle,
    Dirty,
    /// Waiting for the dataplane's answer on its generation.
    Held,
    /// Waiting to try again after a failure.
    Retry,
    InFlight,
}

struct Entry {
    /// `None`: remove our entries from a route or policy `translate` no longer reports.
    want: Option<ObjectStatus>,
    /// The config generation the wanted status came with.
    generation: u64,
    /// When this wanted status was offered.
    since: Instant,
    place: Place,
    /// Offered again while in flight: write once more afterwards.
    again: bool,
}

#[derive(Default)]
struct Queue {
    entries: HashMap<ObjectKey, Entry>,
    dirty: VecDeque<ObjectKey>,
    held: Vec<ObjectKey>,
    retry: VecDeque<(Instant, ObjectKey)>,
    /// Entries written while their generation was not acknowledged (no answer yet, or a
    /// `Nack`), with the gate they were written under: written again when the gate of their
    /// generation changes (the answer, an `Ack` after a `Nack`, another `Nack`'s errors), so
    /// the status always follows the dataplane's last answer. Acknowledged entries are not
    /// here: a truly unchanged status is never looked at again.
    unacked: HashMap<ObjectKey, Gate>,
    /// Objects that left: the writer forgets them.
    gone: Vec<ObjectKey>,
    /// Entries with `want: Some` (objects `translate` reports).
    reported: usize,
    /// The generation of the last offer.
    generation: u64,
    offered: bool,
    /// The position in the journal of created objects of the latest offer's snapshot (its
    /// translation saw every object created up to there; `None`: no offer told one).
    created_upto: Option<u64>,
    /// Look for routes with entries of ours that `translate` does not report (after the first
    /// offer, and after gaining the lease).
    scan_routes: bool,
    /// The wanted statuses (`want: Some`) by kind, condition and status, for the metrics.
    conditions: ConditionCounts,
}

impl Queue {
    fn mark(&mut self, key: &ObjectKey) {
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        match e.place {
            Place::Idle => {
                e.place = Place::Dirty;
                self.dirty.push_back(key.clone());
            }
            Place::InFlight => e.again = true,
            Place::Dirty | Place::Held | Place::Retry => {}
        }
    }

    /// See [`StatusQueue::offer`]; the number of entries queued or changed. With
    /// [`StatusChanges::Only`] only the listed keys are compared (the others are what the last
    /// offer had); the first offer compares everything whatever it is told.
    fn offer(
        &mut self,
        statuses: &Statuses,
        changes: &StatusChanges,
        generation: u64,
        created_at: Option<u64>,
        now: Instant,
    ) -> usize {
        self.generation = generation;
        if created_at.is_some() {
            self.created_upto = created_at.max(self.created_upto);
        }
        let mut changed = 0usize;
        match changes {
            StatusChanges::Only(keys) if self.offered => {
                for key in keys {
                    changed += match statuses.get(key) {
                        Some(status) => self.want(key, status, generation, now),
                        None => self.left(key, generation, now),
                    };
                }
            }
            _ => {
                for (key, status) in statuses {
                    changed += self.want(key, status, generation, now);
                }
                if self.reported > statuses.len() {
                    // Some objects left (every reported key is in `entries`).
                    let left: Vec<ObjectKey> = self
                        .entries
                        .iter()
                        .filter(|(k, e)| e.want.is_some() && !statuses.contains_key(*k))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for key in left {
                        changed += self.left(&key, generation, now);
                    }
                }
            }
        }
        if !self.offered {
            self.offered = true;
            self.scan_routes = true;
            changed += 1;
        }
        changed
    }

    /// `translate` reports `status` for `key`: queue it unless it is the one offered before.
    fn want(
        &mut self,
        key: &ObjectKey,
        status: &ObjectStatus,
        generation: u64,
        now: Instant,
    ) -> usize {
        match self.entries.get_mut(key) {
            Some(e) if e.want.as_ref() == Some(status) => return 0,
            Some(e) => {
                match &e.want {
                    None => self.reported += 1,
                    Some(old) => self.conditions.remove(&key.kind, old),
                }
                self.conditions.add(&key.kind, status);
                e.want = Some(status.clone());
                e.generation = generation;
                e.since = now;
            }
            None => {
                self.reported += 1;
                self.conditions.add(&key.kind, status);
                self.entries.insert(
                    key.clone(),
                    Entry {
                        want: Some(status.clone()),
                        generation,
                        since: now,
                        place: Place::Idle,
                        again: false,
                    },
                );
            }
        }
        self.mark(key);
        1
    }

    /// `translate` no longer reports `key`: forget it, or queue the removal of our entries
    /// from a route or policy. Nothing when it was not reported.
    fn left(&mut self, key: &ObjectKey, generation: u64, now: Instant) -> usize {
        let Some(e) = self.entries.get_mut(key).filter(|e| e.want.is_some()) else {
            return 0;
        };
        self.reported -= 1;
        if let Some(old) = e.want.take() {
            self.conditions.remove(&key.kind, &old);
        }
        e.generation = generation;
        e.since = now;
        if status_writer::is_atomic_kind(&key.kind) {
            self.mark(key);
        } else if e.place != Place::InFlight {
            // An entry in flight is removed when its write ends.
            self.remove(key);
            self.gone.push(key.clone());
        }
        1
    }

    /// Drop an entry from every place it may be listed.
    fn remove(&mut self, key: &ObjectKey) {
        if let Some(e) = self.entries.remove(key) {
            match e.place {
                Place::Dirty => self.dirty.retain(|k| k != key),
                Place::Held => self.held.retain(|k| k != key),
                Place::Retry => self.retry.retain(|(_, k)| k != key),
                Place::Idle | Place::InFlight => {}
            }
        }
        self.unacked.remove(key);
    }

    /// Statuses waiting or in flight.
    fn depth(&self, inflight: usize) -> usize {
        self.dirty.len() + self.held.len() + self.retry.len() + inflight
    }
}

struct Shared {
    queue: Mutex<Queue>,
    notify: Notify,
}

impl Shared {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The reconcile loop's handle on the status worker (the worker stops when it is dropped).
pub struct StatusQueue {
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StatusQueue {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StatusQueue {
    /// Start the worker: `writer` writes (its leadership receiver should be `leading`), the
    /// objects' current statuses come from `stores`, the gate from `push`.
    pub fn spawn(
        writer: StatusWriter,
        stores: Stores,
        push: watch::Receiver<PushState>,
        leading: watch::Receiver<bool>,
        metrics: Arc<Metrics>,
        options: StatusOptions,
    ) -> StatusQueue {
        let worker = Worker::new(
            writer,
            Box::new(stores),
            push,
            leading,
            metrics.clone(),
            options,
        );
        StatusQueue {
            shared: worker.shared.clone(),
            metrics,
            task: tokio::spawn(worker.run()),
        }
    }

    /// Offer the statuses of the translation submitted as `generation`: objects whose wanted
    /// status changed since the last offer are queued (an object already queued keeps its
    /// place, with the new status); objects no longer reported are forgotten, routes and
    /// policies among them queued to have our entries removed.
    /// The objects by kind and condition (`sweety_controller_objects`) follow the same
    /// comparison: only the changed statuses are counted again.
    /// The worker is woken even when nothing changed: it queues the objects created again
    /// under a name that the translation's snapshot, taken at `created_at` in the journal of
    /// created objects ([`crate::translate::Snapshot::created_at`]), saw (see the module
    /// docs).
    pub fn offer(
        &self,
        statuses: &Statuses,
        changes: &StatusChanges,
        generation: u64,
        created_at: Option<u64>,
    ) {
        {
            let mut q = self.shared.queue();
            q.offer(statuses, changes, generation, created_at, Instant::now());
            q.conditions.publish(&self.metrics);
        }
        self.shared.notify.notify_one();
    }
}

struct Worker {
    shared: Arc<Shared>,
    writer: StatusWriter,
    objects: Box<dyn Objects>,
    push: watch::Receiver<PushState>,
    leading: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    options: StatusOptions,
    bucket: TokenBucket,
    jobs: JoinSet<(status_writer::Outcome, Duration)>,
    /// The earliest end of an Ack wait among held entries.
    held_until: Option<Instant>,
    /// The highest acknowledged generation any status was written under (or the last one
    /// seen, if lower): when the acknowledged generation drops below it (a restarted
    /// dataplane's Hello), the entries written as acknowledged in between are looked at again.
    acked_high: u64,
    /// The gates of the push state they were computed from, by generation: one per generation
    /// (a Nack's errors are joined once, and every entry written under it shares the text).
    gates: (PushState, HashMap<u64, Gate>),
    /// The position in the journal of created objects ([`Objects::created_between`]) up to
    /// which they were queued (`None`: not looked at yet).
    created_at: Option<u64>,
    /// The objects created after the latest offer's snapshot, whose entries wait.
    untranslated: Untranslated,
}

/// Whether the gate has the dataplane's answer.
fn answered(gate: &Gate) -> bool {
    gate.acked || gate.nack.is_some()
}

impl Worker {
    /// A worker with an empty queue of its own, not started.
    fn new(
        writer: StatusWriter,
        objects: Box<dyn Objects>,
        push: watch::Receiver<PushState>,
        leading: watch::Receiver<bool>,
        metrics: Arc<Metrics>,
        options: StatusOptions,
    ) -> Worker {
        Worker {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                notify: Notify::new(),
            }),
            writer,
            objects,
            push,
            leading,
            metrics,
            bucket: TokenBucket::new(options.qps, options.burst, Instant::now()),
            options,
            jobs: JoinSet::new(),
            held_until: None,
            acked_high: 0,
            gates: Default::default(),
            created_at: None,
            untranslated: Untranslated::default(),
        }
    }

    async fn run(mut self) {
        let (mut push_open, mut leader_open) = (true, true);
        loop {
            let wake = self.start_writes();
            let depth = self.shared.queue().depth(self.jobs.len());
            self.metrics.status_queue_depth.set(depth as u64);
            let sleep = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.shared.notify.notified() => {}
                changed = self.push.changed(), if push_open => {
                    if changed.is_err() {
                        push_open = false;
                        continue;
                    }
                    self.push_changed();
                }
                changed = self.leading.changed(), if leader_open => {
                    if changed.is_err() {
                        leader_open = false;
                        self.writer.forget();
                        continue;
                    }
                    self.lease_changed();
                }
                Some(done) = self.jobs.join_next(), if !self.jobs.is_empty() => {
                    if let Ok((outcome, took)) = done {
                        self.finish(outcome, took);
                    }
                }
                _ = sleep => self.release_held(false),
            }
        }
    }

    /// This replica gained or lost the lease. Lost: what was written is forgotten (another
    /// replica may write meanwhile), and so are the gates entries were written under. Gained:
    /// every object is queued again, under the gate of now (the writer skips what is already
    /// right, reading first what only the watch cache says is right: the cache does not see
    /// the other leader's status writes), and routes are looked at for entries of ours.
    fn lease_changed(&mut self) {
        if *self.leading.borrow_and_update() {
            self.writer.distrust_cache();
            let mut q = self.shared.queue();
            let keys: Vec<ObjectKey> = q.entries.keys().cloned().collect();
            for k in &keys {
                q.mark(k);
            }
            q.scan_routes = q.offered;
        } else {
            self.writer.forget();
            self.shared.queue().unacked.clear();
        }
    }

    /// The dataplane's answer (or the pusher's state) changed.
    fn push_changed(&mut self) {
        let acked = self.push.borrow_and_update().acked;
        if acked < self.acked_high {
            // A restarted dataplane (its Hello) runs an older generation, or none: the
            // entries of generations (acked, acked_high] were written as acknowledged and are
            // in no `unacked` record. Their gate is no longer an Ack: queue them, so that they
            // follow the answer to the config sent again (a Nack makes them `False`); the
            // writer skips those whose status does not change.
            let high = self.acked_high;
            let mut q = self.shared.queue();
            let keys: Vec<ObjectKey> = q
                .entries
                .iter()
                .filter(|(_, e)| e.generation > acked && e.generation <= high)
                .map(|(k, _)| k.clone())
                .collect();
            for key in &keys {
                q.mark(key);
            }
        }
        self.acked_high = acked;
        self.release_held(true);
    }

    fn leads(&self) -> bool {
        *self.leading.borrow()
    }

    /// Start writes while there is room, tokens and work; the next time to look again.
    fn start_writes(&mut self) -> Option<Instant> {
        let mut wake = self.held_until;
        let state = self.push.borrow().clone();
        if self.gates.0 != state {
            self.gates = (state.clone(), HashMap::new());
        }
        let now_str = status_writer::now();
        let now = Instant::now();
        {
            let mut q = self.shared.queue();
            for key in std::mem::take(&mut q.gone) {
                self.writer.forget_one(&key);
            }
            queue_created(&*self.objects, &mut self.created_at, &mut q);
            while q.retry.front().is_some_and(|(at, _)| *at <= now) {
                let (_, key) = q.retry.pop_front().expect("checked");
                if let Some(e) = q.entries.get_mut(&key) {
                    e.place = Place::Idle;
                }
                q.mark(&key);
            }
            if let Some((at, _)) = q.retry.front() {
                wake = earliest(wake, *at);
            }
        }
        if !self.leads() {
            return wake;
        }
        self.scan_routes();
        {
            let q = self.shared.queue();
            if !q.dirty.is_empty() {
                self.untranslated.update(&*self.objects, q.created_upto);
            }
        }
        while self.jobs.len() < self.options.concurrency.max(1) {
            let mut q = self.shared.queue();
            let Some(key) = q.dirty.pop_front() else {
                break;
            };
            let Some(e) = q.entries.get(&key) else {
                continue;
            };
            if e.want.is_some() && self.untranslated.holds(&key) {
                // Created again under its name after the latest offer's snapshot: what the
                // entry wants is for the old object. Queued again by the offer whose
                // snapshot saw it ([`queue_created`]). (An entry that only removes ours
                // goes: the new object has none of them anyway.)
                q.entries.get_mut(&key).expect("present").place = Place::Idle;
                continue;
            }
            let (generation, since) = (e.generation, e.since);
            let gate = self
                .gates
                .1
                .entry(generation)
                .or_insert_with(|| Gate::new(&state, generation))
                .clone();
            let answered = answered(&gate);
            if !answered && now < since + self.options.ack_wait {
                let until = since + self.options.ack_wait;
                q.entries.get_mut(&key).expect("present").place = Place::Held;
                q.held.push(key);
                self.held_until = earliest(self.held_until, until);
                wake = earliest(wake, until);
                continue;
            }
            if let Err(wait) = self.bucket.take(now) {
                q.dirty.push_front(key);
                wake = earliest(wake, now + wait);
                break;
            }
            let want = q.entries.get(&key).expect("present").want.clone();
            let current = self.objects.lookup(&key);
            let prepared =
                if current.is_none() && !matches!(want, Some(ObjectStatus::Conditions(_))) {
                    // Not in the cache (deleted): nothing to write; translate drops it next.
                    self.writer.forget_one(&key);
                    Prepared::Unchanged
                } else {
                    self.writer
                        .prepare(&key, want.as_ref(), current.as_deref(), &gate, &now_str)
                };
            if gate.acked {
                self.acked_high = self.acked_high.max(state.acked);
                q.unacked.remove(&key);
            } else {
                q.unacked.insert(key.clone(), gate);
            }
            match prepared {
                Prepared::Unchanged => {
                    self.bucket.refund();
                    if want.is_none() {
                        q.remove(&key);
                    } else {
                        q.entries.get_mut(&key).expect("present").place = Place::Idle;
                    }
                }
                Prepared::Write(job) => {
                    let e = q.entries.get_mut(&key).expect("present");
                    e.place = Place::InFlight;
                    e.again = false;
                    drop(q);
                    self.jobs.spawn(async move {
                        let started = Instant::now();
                        let outcome = job.run().await;
                        (outcome, started.elapsed())
                    });
                }
            }
        }
        wake
    }

    /// Move held entries whose generation has an answer (or whose wait is over, unless
    /// `answers_only`) to the queue, and written entries whose gate changed too.
    fn release_held(&mut self, answers_only: bool) {
        let state = self.push.borrow().clone();
        let now = Instant::now();
        let wait = self.options.ack_wait;
        let mut q = self.shared.queue();
        let held = std::mem::take(&mut q.held);
        let mut until = None;
        for key in held {
            let Some(e) = q.entries.get_mut(&key) else {
                continue;
            };
            let ready = answered(&Gate::new(&state, e.generation))
                || (!answers_only && now >= e.since + wait);
            if ready {
                e.place = Place::Idle;
                q.mark(&key);
            } else {
                until = earliest(until, e.since + wait);
                q.held.push(key);
            }
        }
        self.held_until = until;
        if answers_only && !q.unacked.is_empty() {
            // One gate per generation (a Nack's errors are joined once, not per entry).
            let mut gates: HashMap<u64, Gate> = HashMap::new();
            let changed: Vec<ObjectKey> = q
                .unacked
                .iter()
                .filter(|(k, written)| {
                    q.entries.get(*k).is_some_and(|e| {
                        *gates
                            .entry(e.generation)
                            .or_insert_with(|| Gate::new(&state, e.generation))
                            != **written
                    })
                })
                .map(|(k, _)| k.clone())
                .collect();
            for key in changed {
                q.unacked.remove(&key);
                q.mark(&key);
            }
        }
    }

    fn finish(&mut self, outcome: status_writer::Outcome, took: Duration) {
        let key = outcome.key.clone();
        self.metrics.status_write_duration.observe(took);
        let result = self.writer.finish(outcome);
        let mut q = self.shared.queue();
        let retry_at = Instant::now() + self.options.retry;
        let Some(e) = q.entries.get_mut(&key) else {
            return;
        };
        e.place = Place::Idle;
        match result {
            Ok(written) => {
                if written {
                    self.metrics.status_writes.inc();
                }
                if e.again {
                    e.again = false;
                    q.mark(&key);
                } else if e.want.is_none() {
                    q.remove(&key);
                    self.writer.forget_one(&key);
                }
            }
            Err(err) => {
                tracing::warn!(kind = %key.kind, namespace = %key.namespace, name = %key.name, error = %err, "status write failed; retrying");
                self.metrics.error(err.kind());
                e.again = false;
                e.place = Place::Retry;
                q.retry.push_back((retry_at, key));
            }
        }
    }

    /// Queue routes and policies that carry entries of ours `translate` does not report.
    fn scan_routes(&mut self) {
        let mut q = self.shared.queue();
        if !q.scan_routes {
            return;
        }
        q.scan_routes = false;
        let generation = q.generation;
        let now = Instant::now();
        let mut found: Vec<ObjectKey> = Vec::new();
        let name = self.writer.controller_name().to_string();
        for kind in status_writer::STATUS_KINDS {
            if !status_writer::is_atomic_kind(kind) {
                continue;
            }
            for (ns, n, status) in self.objects.statuses(kind) {
                let key = ObjectKey::new(kind, &ns, &n);
                if !q.entries.contains_key(&key)
                    && status_writer::has_our_entries(&name, kind, &status)
                {
                    found.push(key);
                }
            }
        }
        for key in found {
            q.entries.insert(
                key.clone(),
                Entry {
                    want: None,
                    generation,
                    since: now,
                    place: Place::Idle,
                    again: false,
                },
            );
            q.mark(&key);
        }
    }
}

/// Queue the objects the watch saw created under a name since the last look (deleted and
/// created again: translate may want the very status it wanted for the old object, and
/// the new one has none), or every object translate reports when the journal cannot
/// tell (a relist). Only those up to the position of the latest offer's snapshot: a later
/// one was not translated yet, and the entry of its name wants the old object's status
/// (another spec may want another); it waits for the offer that saw it. The writer skips
/// those whose status is already right: its memory of an object holds only for the same
/// `metadata.uid`.
fn queue_created(objects: &dyn Objects, created_at: &mut Option<u64>, q: &mut Queue) {
    let Some(upto) = q.created_upto else {
        return;
    };
    let Some(since) = *created_at else {
        // The first look after an offer: every entry so far was queued as it was offered
        // (the first offer queues all), and is written to the object the cache then has.
        *created_at = Some(upto);
        return;
    };
    if upto <= since {
        return;
    }
    let keys: Vec<ObjectKey> = match objects.created_between(since, upto) {
        Created::Later => return,
        Created::Keys(keys) => keys
            .into_iter()
            // An Ingress's Events are about the new object too.
            .flat_map(|k| {
                let events = (k.kind == "Ingress").then(|| {
                    ObjectKey::new(crate::translate::ingress::EVENT_KIND, &k.namespace, &k.name)
                });
                std::iter::once(k).chain(events)
            })
            .filter(|k| q.entries.get(k).is_some_and(|e| e.want.is_some()))
            .collect(),
        Created::Lost => q
            .entries
            .iter()
            .filter(|(_, e)| e.want.is_some())
            .map(|(k, _)| k.clone())
            .collect(),
    };
    *created_at = Some(upto);
    for key in &keys {
        q.mark(key);
    }
}

/// The objects the watch saw come under a name after the snapshot of the latest offer: no
/// translation has seen them, so their entries want the statuses of the objects they
/// replaced, and wait for the offer whose snapshot covers them ([`queue_created`] queues
/// them then). Kept across write passes and extended by the journal's new entries only, so a
/// pass costs what was journalled since the last one, and an offer what its snapshot left out.
#[derive(Default)]
struct Untranslated {
    /// The latest offer's snapshot position and the journal position this was read up to.
    read: Option<(u64, u64)>,
    /// Everything is held: the journal lost its place after the snapshot (a relist, or more
    /// entries than it keeps); the offer after the relist covers it.
    all: bool,
    keys: std::collections::HashSet<ObjectKey>,
}

impl Untranslated {
    /// Follow the journal up to now; `upto` is the latest offer's snapshot position.
    fn update(&mut self, objects: &dyn Objects, upto: Option<u64>) {
        let Some(upto) = upto else {
            return;
        };
        let now = objects.created_position();
        let since = match self.read {
            Some((u, read)) if u == upto && !self.all => {
                if read == now {
                    return;
                }
                read
            }
            _ => {
                self.keys.clear();
                self.all = false;
                upto
            }
        };
        self.read = Some((upto, now));
        match objects.created_between(since, now) {
            Created::Keys(keys) => self.keys.extend(keys),
            Created::Lost | Created::Later => self.all = true,
        }
    }

    /// Whether the entry of `key` waits (for an Ingress's Events: the Ingress).
    fn holds(&self, key: &ObjectKey) -> bool {
        if self.all {
            return true;
        }
        if self.keys.is_empty() {
            return false;
        }
        if key.kind == crate::translate::ingress::EVENT_KIND {
            return self.keys.contains(&status_writer::event_object(key));
        }
        self.keys.contains(key)
    }
}

/// What the journal of created objects tells between two positions.
enum Created {
    /// The objects created under a name in between.
    Keys(Vec<ObjectKey>),
    /// Not known (a relist, or more than the journal keeps), but all of it is covered by
    /// the later position: every object is looked at.
    Lost,
    /// Not known, and the journal lost entries after the later position: wait for an offer
    /// whose snapshot covers them.
    Later,
}

/// [`Objects::created_between`] from `journal`.
fn created_in(journal: &ObjectJournal, since: u64, upto: u64) -> Created {
    match journal.between(since, upto) {
        Ok(keys) => Created::Keys(
            keys.into_iter()
                .map(|(kind, ns, name)| ObjectKey::new(kind, &ns, &name))
                .collect(),
        ),
        Err(floor) if floor <= upto => Created::Lost,
        Err(_) => Created::Later,
    }
}

fn earliest(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// Where the worker finds the objects it writes statuses for: the watch caches
/// ([`Stores`]; tests give their own).
trait Objects: Send + Sync + 'static {
    /// The cached object a status is for, or the one its Events are about
    /// ([`status_writer::event_object`]).
    fn lookup(&self, key: &ObjectKey) -> Option<Arc<dyn Current>>;
    /// (namespace, name, status) of the cached objects of `kind` (asked for atomic kinds only).
    fn statuses(&self, kind: &str) -> Vec<(String, String, serde_json::Value)>;
    /// The objects that came into the cache under a name it did not hold after position
    /// `since` of its journal, up to position `upto`.
    fn created_between(&self, since: u64, upto: u64) -> Created;
    /// The current position of that journal.
    fn created_position(&self) -> u64;
}

impl Objects for Stores {
    fn lookup(&self, key: &ObjectKey) -> Option<Arc<dyn Current>> {
        fn get<K>(st: &crate::watch::Stored<K>, key: &ObjectKey) -> Option<Arc<dyn Current>>
        where
            K: Current + kube::Resource<DynamicType = ()> + Clone + 'static,
        {
            st.get(&key.namespace, &key.name)
                .map(|o| o as Arc<dyn Current>)
        }
        let key = &status_writer::event_object(key);
        macro_rules! find {
            ($($kind:literal $field:ident),*) => {
                match key.kind.as_str() {
                    $($kind => get(&self.$field, key),)*
                    "IngressClass" => get(&self.ingress_classes, key),
                    "SweetyProxyConfig" => get(&self.proxy_configs, key),
                    _ => None,
                }
            };
        }
        status_writer::status_kinds!(find!())
    }

    fn statuses(&self, kind: &str) -> Vec<(String, String, serde_json::Value)> {
        macro_rules! of {
            ($($kind:literal $field:ident),*) => {
                match kind {
                    $($kind => statuses_of(&self.$field.state()),)*
                    _ => Vec::new(),
                }
            };
        }
        status_writer::status_kinds!(of!())
    }

    fn created_between(&self, since: u64, upto: u64) -> Created {
        created_in(&self.created, since, upto)
    }

    fn created_position(&self) -> u64 {
        self.created.position()
    }
}

/// (namespace, name, status) of cached objects.
fn statuses_of<K>(list: &[Arc<K>]) -> Vec<(String, String, serde_json::Value)>
where
    K: Current + kube::Resource,
{
    list.iter()
        .map(|o| {
            let m = o.meta();
            (
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
                o.status(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::status::Condition;

    fn key(kind: &str, name: &str) -> ObjectKey {
        ObjectKey {
            kind: kind.into(),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn conditions(reason: &str) -> ObjectStatus {
        ObjectStatus::Conditions(vec![Condition {
            type_: "Warning".into(),
            status: "True".into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: 1,
        }])
    }

    fn statuses(list: &[(&ObjectKey, &str)]) -> Statuses {
        list.iter()
            .map(|(k, r)| ((*k).clone(), conditions(r)))
            .collect()
    }

    #[test]
    fn queue_coalesces_offers_per_object_and_keeps_the_latest() {
        let t = Instant::now();
        let (a, b) = (key("SweetyProxyConfig", "a"), key("SweetyProxyConfig", "b"));
        let mut q = Queue::default();
        assert_eq!(
            q.offer(
                &statuses(&[(&a, "one"), (&b, "one")]),
                &StatusChanges::All,
                1,
                None,
                t
            ),
            3
        );
        // Offered again and again before it was written: one place in the queue, the latest
        // wanted status and generation.
        assert_eq!(
            q.offer(
                &statuses(&[(&a, "two"), (&b, "one")]),
                &StatusChanges::All,
                2,
                None,
                t
            ),
            1
        );
        assert_eq!(
            q.offer(
                &statuses(&[(&a, "three"), (&b, "one")]),
                &StatusChanges::All,
                3,
                None,
                t
            ),
            1
        );
        assert_eq!(q.dirty, VecDeque::from([a.clone(), b.clone()]));
        assert_eq!(q.entries[&a].want, Some(conditions("three")));
        assert_eq!(q.entries[&a].generation, 3);
        assert_eq!(q.entries[&b].generation, 1);
        // The same statuses again: nothing queued.
        assert_eq!(
            q.offer(
                &statuses(&[(&a, "three"), (&b, "one")]),
                &StatusChanges::All,
                4,
                None,
                t
            ),
            0
        );
        assert_eq!(q.depth(0), 2);

        // In flight and offered again: written once more afterwards, still one entry.
        q.dirty.retain(|k| k != &a);
        q.entries.get_mut(&a).unwrap().place = Place::InFlight;
        assert_eq!(
            q.offer(
                &statuses(&[(&a, "four"), (&b, "one")]),
                &StatusChanges::All,
                5,
                None,
                t
            ),
            1
        );
        assert!(q.entries[&a].again);
        assert_eq!(q.dirty, VecDeque::from([b.clone()]));

        // An object that leaves is forgotten (not written); one in flight stays until its
        // write ends. A route leaving stays queued to have our entries removed.
        let r = key("HTTPRoute", "r");
        q.entries.insert(
            r.clone(),
            Entry {
                want: Some(conditions("route")),
                generation: 5,
                since: t,
                place: Place::Idle,
                again: false,
            },
        );
        q.reported += 1;
        assert_eq!(
            q.offer(&statuses(&[(&a, "four")]), &StatusChanges::All, 6, None, t),
            2
        );
        assert!(!q.entries.contains_key(&b) && q.gone == vec![b.clone()]);
        assert!(q.dirty.iter().all(|k| k != &b));
        assert!(
            q.entries.contains_key(&a),
            "in flight: removed when it ends"
        );
        assert_eq!(q.entries[&r].want, None);
        assert_eq!(q.entries[&r].place, Place::Dirty);
        assert_eq!(q.reported, 1);
    }

    /// What a queue holds, in a comparable form.
    fn state(q: &Queue) -> impl PartialEq + std::fmt::Debug {
        let mut entries: Vec<_> = q
            .entries
            .iter()
            .map(|(k, e)| (k.clone(), e.want.clone(), e.generation, e.place, e.again))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        // The order of the queue follows the order of the offer (keys, or the changes as
        // translated); which entries wait is what counts.
        let mut dirty: Vec<_> = q.dirty.iter().cloned().collect();
        dirty.sort();
        let mut gone = q.gone.clone();
        gone.sort();
        (entries, dirty, gone, q.reported)
    }

    #[test]
    fn offering_only_the_changed_keys_equals_offering_everything() {
        // The same sequence of translations offered to two queues: one compares every status,
        // the other only the keys the translation says may have changed (plus some listed
        // but unchanged, as the translate cache may list). They must end up the same, step by
        // step, whatever was added, changed, removed or in flight.
        let t = Instant::now();
        let keys: Vec<ObjectKey> = (0..12)
            .map(|i| {
                key(
                    if i % 3 == 0 { "HTTPRoute" } else { "Gateway" },
                    &format!("o{i}"),
                )
            })
            .collect();
        let (mut all, mut only) = (Queue::default(), Queue::default());
        let mut prev = Statuses::new();
        let mut rng = 0x2545_f491_u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for step in 0..400u64 {
            let mut cur = prev.clone();
            for _ in 0..next(4) {
                let k = &keys[next(keys.len() as u64) as usize];
                match next(3) {
                    0 => {
                        cur.remove(k);
                    }
                    _ => {
                        cur.insert(k.clone(), conditions(&format!("r{}", next(3))));
                    }
                }
            }
            let mut changed: Vec<ObjectKey> = keys
                .iter()
                .filter(|k| prev.get(*k) != cur.get(*k))
                .cloned()
                .collect();
            changed.push(keys[next(keys.len() as u64) as usize].clone());
            let a = all.offer(&cur, &StatusChanges::All, step + 1, None, t);
            let b = only.offer(&cur, &StatusChanges::Only(changed), step + 1, None, t);
            assert_eq!(a, b, "step {step}: entries queued or changed");
            assert_eq!(state(&all), state(&only), "step {step}");
            // The worker's part, the same on both: some entries go in flight or finish.
            for q in [&mut all, &mut only] {
                if step % 5 == 0 {
                    // The smallest waiting key (the queues may hold them in other orders).
                    if let Some(i) = (0..q.dirty.len()).min_by_key(|&i| q.dirty[i].clone()) {
                        let k = q.dirty.remove(i).unwrap();
                        q.entries.get_mut(&k).unwrap().place = Place::InFlight;
                    }
                }
                if step % 7 == 0 {
                    let done: Vec<_> = q
                        .entries
                        .iter()
                        .filter(|(_, e)| e.place == Place::InFlight)
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in done {
                        let e = q.entries.get_mut(&k).unwrap();
                        e.place = Place::Idle;
                        if std::mem::take(&mut e.again) {
                            q.mark(&k);
                        } else if e.want.is_none() {
                            q.remove(&k);
                        }
                    }
                }
            }
            prev = cur;
        }
    }

    /// A stand-in for the API server's `status` subresource, enough for [`WriteJob::run`]:
    /// a PATCH is answered with the object as applied (a new resourceVersion), and every
    /// request is recorded as it arrives. While held ([`FakeApi::hold`]), requests are
    /// recorded but not answered until released: their writes are in flight.
    struct FakeApi {
        addr: std::net::SocketAddr,
        log: Log,
        /// The `metadata` of every request, in the order of `log`.
        metadata: Arc<Mutex<Vec<serde_json::Value>>>,
        /// The body of every request, in the order of `log`.
        bodies: Arc<Mutex<Vec<serde_json::Value>>>,
        held: Arc<watch::Sender<bool>>,
        task: tokio::task::JoinHandle<()>,
    }

    /// (method, kind, namespace, name, status) of every request, in order.
    type Log = Arc<Mutex<Vec<(String, String, String, String, serde_json::Value)>>>;

    impl FakeApi {
        async fn start() -> FakeApi {
            use http_body_util::BodyExt as _;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let log: Log = Arc::default();
            let seen = log.clone();
            let metadata: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
            let metas = metadata.clone();
            let bodies: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
            let kept = bodies.clone();
            let held = Arc::new(watch::channel(false).0);
            let hold = held.clone();
            let task = tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (seen, hold, metas) = (seen.clone(), hold.clone(), metas.clone());
                    let kept = kept.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(
                            move |req: http::Request<hyper::body::Incoming>| {
                                let (seen, metas) = (seen.clone(), metas.clone());
                                let kept = kept.clone();
                                let mut release = hold.subscribe();
                                async move {
                                    let method = req.method().to_string();
                                    let path = req.uri().path().to_string();
                                    let body = req.into_body().collect().await?.to_bytes();
                                    let mut obj: serde_json::Value =
                                        serde_json::from_slice(&body).unwrap_or_default();
                                    let text = |v: &serde_json::Value| {
                                        v.as_str().unwrap_or_default().to_string()
                                    };
                                    {
                                        let mut seen = seen.lock().unwrap();
                                        if method == "GET" {
                                            obj = FakeApi::get(&path, &seen);
                                        }
                                        metas.lock().unwrap().push(obj["metadata"].clone());
                                        kept.lock().unwrap().push(obj.clone());
                                        seen.push((
                                            method,
                                            text(&obj["kind"]),
                                            text(&obj["metadata"]["namespace"]),
                                            text(&obj["metadata"]["name"]),
                                            obj["status"].clone(),
                                        ));
                                        obj["metadata"]["resourceVersion"] =
                                            serde_json::json!((seen.len() + 1).to_string());
                                    }
                                    // Answered once released (a closed channel releases).
                                    let _ = release.wait_for(|held| !*held).await;
                                    let mut resp = http::Response::new(http_body_util::Full::new(
                                        bytes::Bytes::from(obj.to_string()),
                                    ));
                                    resp.headers_mut().insert(
                                        http::header::CONTENT_TYPE,
                                        http::HeaderValue::from_static("application/json"),
                                    );
                                    Ok::<_, hyper::Error>(resp)
                                }
                            },
                        );
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    });
                }
            });
            FakeApi {
                addr,
                log,
                metadata,
                bodies,
                held,
                task,
            }
        }

        /// The answer to a `get` of `path` (`.../namespaces/NS/PLURAL/NAME/status`, or
        /// `.../PLURAL/NAME/status`): the object with the status last patched, `null` if none.
        fn get(
            path: &str,
            log: &[(String, String, String, String, serde_json::Value)],
        ) -> serde_json::Value {
            let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
            let (ns, plural, name) = match parts.iter().position(|p| *p == "namespaces") {
                Some(i) => (parts[i + 1], parts[i + 2], parts[i + 3]),
                None => ("", parts[parts.len() - 3], parts[parts.len() - 2]),
            };
            let kind = status_writer::STATUS_KINDS
                .into_iter()
                .find(|k| status_writer::api_resource(k).is_some_and(|r| r.plural == plural))
                .unwrap_or_else(|| panic!("a get of {path}"));
            let status = log
                .iter()
                .rev()
                .find(|(m, k, n, o, _)| m == "PATCH" && k == kind && n == ns && o == name)
                .map_or(serde_json::Value::Null, |e| e.4.clone());
            serde_json::json!({
                "apiVersion": status_writer::api_resource(kind).unwrap().api_version,
                "kind": kind,
                "metadata": {"name": name, "namespace": ns},
                "status": status,
            })
        }

        /// Hold the requests that arrive from now on unanswered (`true`), or answer them and
        /// every later one (`false`).
        fn hold(&self, held: bool) {
            self.held.send_replace(held);
        }

        /// Waits (up to 10 s) until `n` requests in all have arrived.
        async fn arrived(&self, n: usize) {
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.log.lock().unwrap().len() < n {
                assert!(
                    Instant::now() < deadline,
                    "{} of {n} requests arrived",
                    self.log.lock().unwrap().len()
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }

        /// Requests so far (writes and reads).
        fn requests(&self) -> usize {
            self.log.lock().unwrap().len()
        }

        /// Requests so far with `method`.
        fn count(&self, method: &str) -> usize {
            self.log
                .lock()
                .unwrap()
                .iter()
                .filter(|e| e.0 == method)
                .count()
        }

        fn client(&self) -> kube::Client {
            let url = format!("http://{}", self.addr).parse().unwrap();
            kube::Client::try_from(kube::Config::new(url)).unwrap()
        }

        /// Status writes (PATCHes) so far, by kind.
        fn writes(&self) -> std::collections::BTreeMap<String, usize> {
            let mut by_kind = std::collections::BTreeMap::new();
            for (method, kind, ..) in self.log.lock().unwrap().iter() {
                assert!(method == "PATCH" || method == "GET", "{method}");
                if method == "PATCH" {
                    *by_kind.entry(kind.clone()).or_default() += 1;
                }
            }
            by_kind
        }

        /// The status last written for each object.
        fn last(&self) -> HashMap<ObjectKey, serde_json::Value> {
            self.log
                .lock()
                .unwrap()
                .iter()
                .filter(|e| e.0 == "PATCH")
                .map(|(_, k, ns, n, status)| (ObjectKey::new(k, ns, n), status.clone()))
                .collect()
        }
    }

    impl Drop for FakeApi {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    /// The objects of a snapshot as a watch cache holds them (resourceVersion 1; the cache
    /// never sees our writes, as when it lags behind them), and the objects its watch saw
    /// created under a name since the worker last looked (none unless [`Cached::created`]).
    struct Cached(HashMap<ObjectKey, Arc<dyn Current>>, Arc<ObjectJournal>);

    impl Cached {
        fn of(s: &crate::translate::Snapshot) -> Cached {
            Cached::with(s, &HashMap::new(), "1")
        }

        /// The objects of `s` carrying the statuses of `status` (where it has one), all at
        /// resourceVersion `rv`: the cache once it has seen those writes.
        fn with(
            s: &crate::translate::Snapshot,
            status: &HashMap<ObjectKey, serde_json::Value>,
            rv: &str,
        ) -> Cached {
            use kube::Resource as _;
            let mut map: HashMap<ObjectKey, Arc<dyn Current>> = HashMap::new();
            macro_rules! add {
                ($($kind:literal $field:ident),*) => {$(
                    for o in &s.$field {
                        let mut o = (**o).clone();
                        let m = o.meta();
                        let key = ObjectKey::new(
                            $kind,
                            m.namespace.as_deref().unwrap_or_default(),
                            m.name.as_deref().unwrap_or_default(),
                        );
                        if let Some(st) = status.get(&key) {
                            let mut v = serde_json::to_value(&o).unwrap();
                            v["status"] = st.clone();
                            o = serde_json::from_value(v).unwrap();
                        }
                        o.meta_mut().resource_version = Some(rv.into());
                        map.insert(key, Arc::new(o));
                    }
                )*};
            }
            status_writer::status_kinds!(add!());
            Cached(map, Arc::default())
        }

        /// The same, its watch journalling created objects in `journal`.
        fn journal(mut self, journal: &Arc<ObjectJournal>) -> Cached {
            self.1 = journal.clone();
            self
        }
    }

    impl Objects for Cached {
        fn lookup(&self, key: &ObjectKey) -> Option<Arc<dyn Current>> {
            self.0.get(&status_writer::event_object(key)).cloned()
        }

        fn statuses(&self, kind: &str) -> Vec<(String, String, serde_json::Value)> {
            self.0
                .iter()
                .filter(|(k, _)| k.kind == kind)
                .map(|(k, o)| (k.namespace.clone(), k.name.clone(), o.status()))
                .collect()
        }

        fn created_between(&self, since: u64, upto: u64) -> Created {
            created_in(&self.1, since, upto)
        }

        fn created_position(&self) -> u64 {
            self.1.position()
        }
    }

    /// The watch saw `key` come under its name (created again): journalled in `journal`.
    fn record_created(journal: &ObjectJournal, key: &ObjectKey) {
        let kind: &'static str = status_writer::STATUS_KINDS
            .iter()
            .find(|k| **k == key.kind)
            .expect("a status kind");
        journal.record(kind, key.namespace.clone(), key.name.clone());
    }

    /// A worker writing to `api`, leading, gated on `push`, that never times a wait out
    /// (an entry waits for its answer however long the test takes) and is never short of
    /// tokens.
    fn test_worker(
        api: &FakeApi,
        objects: Cached,
        push: watch::Receiver<PushState>,
    ) -> (Worker, watch::Sender<bool>) {
        let (leader, leading) = watch::channel(true);
        let options = StatusOptions {
            concurrency: 8,
            qps: 1e9,
            burst: 1_000_000,
            ack_wait: Duration::from_secs(3600),
            retry: Duration::from_secs(3600),
        };
        let worker = Worker::new(
            StatusWriter::new(api.client(), "sweety.dev/gateway-controller"),
            Box::new(objects),
            push,
            leading,
            Arc::new(Metrics::default()),
            options,
        );
        (worker, leader)
    }

    /// What the worker's loop does until it would sleep: start writes, finish them, again.
    /// No write may fail (a failed one would wait for its retry).
    async fn drain(w: &mut Worker) {
        loop {
            w.start_writes();
            let Some(done) = w.jobs.join_next().await else {
                break;
            };
            let (outcome, took) = done.expect("a write job");
            w.finish(outcome, took);
        }
        assert!(w.shared.queue().retry.is_empty(), "a status write failed");
    }

    /// (type, status, reason, message) of every condition in `v`, depth first (the written
    /// status and `translate`'s serialized one list them in the same order).
    fn conditions_in(v: &serde_json::Value) -> Vec<[String; 4]> {
        let mut out = Vec::new();
        fn walk(v: &serde_json::Value, out: &mut Vec<[String; 4]>) {
            match v {
                serde_json::Value::Object(m) => {
                    for (k, v) in m {
                        match (k.as_str(), v) {
                            ("conditions", serde_json::Value::Array(list)) => {
                                for c in list {
                                    let f = |name: &str| c[name].as_str().unwrap_or("").to_string();
                                    out.push([f("type"), f("status"), f("reason"), f("message")]);
                                }
                            }
                            _ => walk(v, out),
                        }
                    }
                }
                serde_json::Value::Array(list) => list.iter().for_each(|v| walk(v, out)),
                _ => {}
            }
        }
        walk(v, &mut out);
        out
    }

    /// `translate`'s own conditions of a status.
    fn translated(status: &ObjectStatus) -> Vec<[String; 4]> {
        conditions_in(&serde_json::to_value(status).unwrap())
    }

    /// Whether `translate` says the object is programmed somewhere (the only conditions the
    /// gate changes).
    fn programmed(status: &ObjectStatus) -> bool {
        translated(status)
            .iter()
            .any(|c| c[0] == "Programmed" && c[1] == "True")
    }

    const EADDRINUSE: &str = "config rejected: listeners[6] (gw/gateway-conformance-infra/gateway-with-listenerset-protocol-conflict/80): cannot bind 0.0.0.0:28921: Address already in use (os error 98)";

    /// The conformance suite's ListenerSetProtocolConflict objects (the Gateway stop 34's CI
    /// run left unprogrammed) and `routes` HTTPRoutes on its first listener, translated.
    fn conflict_world(routes: usize) -> (crate::translate::Snapshot, Statuses) {
        conflict_world_where(routes, "gateway-listener")
    }

    /// [`conflict_world`] with route r0 attached to the listener `r0_listener` (another spec).
    fn conflict_world_where(
        routes: usize,
        r0_listener: &str,
    ) -> (crate::translate::Snapshot, Statuses) {
        let mut y =
            include_str!("../testdata/translate/conf-listenerset-protocol-conflict.in.yaml")
                .to_string();
        for i in 0..routes {
            let listener = if i == 0 {
                r0_listener
            } else {
                "gateway-listener"
            };
            y.push_str(&format!(
                "\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n\
metadata: {{name: r{i}, namespace: gateway-conformance-infra, generation: 1}}\n\
spec:\n  parentRefs: [{{name: gateway-with-listenerset-protocol-conflict, sectionName: {listener}}}]\n  \
hostnames: [gateway-listener.com]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: /r{i}}}}}]}}]\n"
            ));
        }
        let (snapshot, _) = crate::translate::Snapshot::from_yaml(&y).unwrap();
        let statuses =
            crate::translate::translate(&snapshot, &crate::translate::Params::default()).statuses;
        (snapshot, statuses)
    }

    fn gateway_key() -> ObjectKey {
        ObjectKey::new(
            "Gateway",
            "gateway-conformance-infra",
            "gateway-with-listenerset-protocol-conflict",
        )
    }

    /// Whether `written` says the object is not programmed because the dataplane rejected
    /// the configuration with `EADDRINUSE` (or a message like it).
    fn says_rejected(written: &[[String; 4]]) -> bool {
        written.iter().any(|c| {
            c[0] == "Programmed"
                && c[1] == "False"
                && c[2] == "Invalid"
                && c[3].contains("Address already in use")
        })
    }

    /// Whether `written` says the object is programmed.
    fn says_programmed(written: &[[String; 4]]) -> bool {
        written
            .iter()
            .any(|c| c[0] == "Programmed" && c[1] == "True")
    }

    /// A worker (`test_worker`) writing to its own fake API server, gated on a dataplane that
    /// was sent `generation` and acknowledged the one before, with every status of
    /// `statuses` offered for `generation`; nothing is written yet.
    struct Gated {
        api: FakeApi,
        w: Worker,
        push: watch::Sender<PushState>,
        leader: watch::Sender<bool>,
        /// The watch's journal of created objects (of the tests' caches that use it): an
        /// offer carries its position ([`Gated::offer`]).
        journal: Arc<ObjectJournal>,
    }

    impl Gated {
        async fn start(
            snapshot: &crate::translate::Snapshot,
            statuses: &Statuses,
            generation: u64,
        ) -> Gated {
            let api = FakeApi::start().await;
            let (push, rx) = watch::channel(PushState {
                connected: true,
                submitted: generation,
                acked: generation - 1,
                ..Default::default()
            });
            let journal = Arc::new(ObjectJournal::default());
            let (w, leader) = test_worker(&api, Cached::of(snapshot).journal(&journal), rx);
            let g = Gated {
                api,
                w,
                push,
                leader,
                journal,
            };
            g.offer(statuses, generation);
            g
        }

        /// [`Gated::start`], then the dataplane acknowledges `generation` and every status of
        /// `statuses` is written, as translated; with the API server's request count then (one
        /// write per status).
        async fn start_written(
            snapshot: &crate::translate::Snapshot,
            statuses: &Statuses,
            generation: u64,
        ) -> (Gated, usize) {
            let mut g = Gated::start(snapshot, statuses, generation).await;
            g.step(|s| s.acked = generation).await;
            g.assert_translated(statuses);
            let before = g.api.requests();
            assert_eq!(before, statuses.len());
            (g, before)
        }

        /// Offers every status of `statuses` for `generation`, as the reconcile loop does;
        /// how many entries that queued.
        fn offer(&self, statuses: &Statuses, generation: u64) -> usize {
            self.offer_at(statuses, generation, self.journal.position())
        }

        /// [`Gated::offer`] of a translation whose snapshot was taken at `created_at` in the
        /// journal of created objects.
        fn offer_at(&self, statuses: &Statuses, generation: u64, created_at: u64) -> usize {
            self.w.shared.queue().offer(
                statuses,
                &StatusChanges::All,
                generation,
                Some(created_at),
                Instant::now(),
            )
        }

        /// The push loop's state changes by `f` (a submit, an answer, a reconnect): the
        /// worker hears of it and writes all it then may.
        async fn step(&mut self, f: impl FnOnce(&mut PushState)) {
            self.change(f);
            drain(&mut self.w).await;
        }

        /// The push loop's state changes by `f` and the worker hears of it, but starts no
        /// write and waits for none (writes in flight stay so).
        fn change(&mut self, f: impl FnOnce(&mut PushState)) {
            self.push.send_modify(f);
            self.w.push_changed();
        }

        /// This replica gains (`true`) or loses the lease; the worker hears of it.
        fn lease(&mut self, leading: bool) {
            self.leader.send_replace(leading);
            self.w.lease_changed();
        }

        /// The dataplane rejects `generation` with `EADDRINUSE`.
        async fn nack(&mut self, generation: u64) {
            self.step(|s| s.last_nack = Some((generation, vec![EADDRINUSE.into()])))
                .await;
        }

        /// The conditions last written for `key`.
        fn written(&self, key: &ObjectKey) -> Vec<[String; 4]> {
            conditions_in(&self.api.last()[key])
        }

        /// Every object's last written status is `translate`'s own.
        fn assert_translated(&self, statuses: &Statuses) {
            let last = self.api.last();
            for (key, status) in statuses {
                assert_eq!(conditions_in(&last[key]), translated(status), "{key:?}");
            }
        }
    }

    /// The writes per kind of the objects whose `translate` status passes `which`.
    fn kinds(
        statuses: &Statuses,
        which: impl Fn(&ObjectStatus) -> bool,
    ) -> std::collections::BTreeMap<String, usize> {
        let mut kinds = std::collections::BTreeMap::new();
        for (key, status) in statuses {
            if which(status) {
                *kinds.entry(key.kind.clone()).or_insert(0usize) += 1;
            }
        }
        kinds
    }

    /// The writes per kind of the objects whose `translate` status is programmed.
    fn programmed_kinds(statuses: &Statuses) -> std::collections::BTreeMap<String, usize> {
        kinds(statuses, programmed)
    }

    fn add_writes(
        a: &std::collections::BTreeMap<String, usize>,
        b: &std::collections::BTreeMap<String, usize>,
    ) -> std::collections::BTreeMap<String, usize> {
        let mut sum = a.clone();
        for (kind, n) in b {
            *sum.entry(kind.clone()).or_insert(0) += n;
        }
        sum
    }

    /// Stop 34's failed conformance run: the dataplane rejected generation 322 (a port it was
    /// still releasing), the full config of 322 went again and was acknowledged 40 ms later,
    /// but the Gateway kept "Programmed=False Invalid: the dataplane rejected the
    /// configuration ... Address already in use" until the suite gave up. After the Ack, every
    /// status the Nack wrote must be `translate`'s own again: here the Gateway and its
    /// ListenerSets, with their listeners.
    #[tokio::test]
    async fn an_ack_after_a_nack_of_the_same_generation_rewrites_what_the_nack_wrote() {
        let (snapshot, statuses) = conflict_world(2);
        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        // Nothing is written before the dataplane answers.
        drain(&mut g.w).await;
        assert!(g.api.writes().is_empty(), "{:?}", g.api.writes());

        // The dataplane rejects 322: the programmed objects say so.
        g.nack(322).await;
        let gated: Vec<&ObjectKey> = statuses
            .iter()
            .filter(|(_, s)| programmed(s))
            .map(|(k, _)| k)
            .collect();
        assert!(
            gated.contains(&&gateway_key()) && gated.len() >= 3,
            "{gated:?}"
        );
        for key in &gated {
            let written = g.written(key);
            assert!(says_rejected(&written), "{key:?}: {written:?}");
        }

        // The full config of 322 is applied: every status is translate's own.
        g.step(|s| s.acked = 322).await;
        g.assert_translated(&statuses);
    }

    /// The same, when the Ack is of a later generation whose statuses are the ones the
    /// rejected generation had: the offer of 323 queues nothing (the statuses did not change),
    /// yet the Nack's message must go once 323 is acknowledged.
    #[tokio::test]
    async fn an_ack_of_a_later_generation_with_the_same_statuses_rewrites_what_the_nack_wrote() {
        let (snapshot, statuses) = conflict_world(2);
        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        g.nack(322).await;
        let after_nack = g.api.writes();
        let gateway = g.written(&gateway_key());
        assert!(says_rejected(&gateway), "{gateway:?}");

        // 323: another config, the same statuses. Nothing is queued for them.
        assert_eq!(g.offer(&statuses, 323), 0);
        g.step(|s| s.submitted = 323).await;
        assert_eq!(
            g.api.writes(),
            after_nack,
            "no answer on 323 yet: nothing to write"
        );

        g.step(|s| s.acked = 323).await;
        g.assert_translated(&statuses);
    }

    /// With thousands of routes, a Nack and then an Ack cost no more writes than the statuses
    /// that change: every object once while nothing is programmed yet (held until the
    /// answer, then written with the rejection), then only the objects `translate` says are
    /// programmed (the routes' statuses do not depend on the answer and are not written
    /// again), then nothing for a later acknowledged generation with the same statuses. And no
    /// status of any kind keeps the rejection's message.
    #[tokio::test]
    async fn after_a_nack_and_an_ack_only_the_programmed_statuses_are_written_again() {
        const ROUTES: usize = 1000;
        let (snapshot, statuses) = conflict_world(ROUTES);
        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        g.nack(322).await;
        let every_kind = kinds(&statuses, |_| true);
        assert_eq!(every_kind["HTTPRoute"], ROUTES);
        assert_eq!(g.api.writes(), every_kind, "each object written once");
        // review-s22b F1: every entry written under the Nack holds the same text, not a copy.
        {
            let q = g.w.shared.queue();
            let texts: Vec<&Arc<str>> =
                q.unacked.values().filter_map(|e| e.nack.as_ref()).collect();
            assert_eq!(texts.len(), statuses.len());
            assert!(texts.iter().all(|t| Arc::ptr_eq(t, texts[0])), "one copy");
            assert_eq!(
                Arc::strong_count(texts[0]),
                texts.len() + 1,
                "and the gate cache's"
            );
        }

        g.step(|s| s.acked = 322).await;
        let programmed_kinds = programmed_kinds(&statuses);
        assert!(!programmed_kinds.contains_key("HTTPRoute"));
        let want = add_writes(&every_kind, &programmed_kinds);
        assert_eq!(g.api.writes(), want, "only the programmed objects again");
        for (key, written) in g.api.last() {
            assert!(
                !written.to_string().contains("rejected"),
                "{key:?}: {written}"
            );
        }
        g.assert_translated(&statuses);

        // A later generation with the same statuses, acknowledged: nothing to write.
        g.offer(&statuses, 323);
        g.step(|s| {
            s.submitted = 323;
            s.acked = 323;
        })
        .await;
        assert_eq!(g.api.writes(), want);
        assert!(g.w.shared.queue().unacked.is_empty());
    }

    /// review-s22b F2: generation 322 acknowledged (everything Programmed=True), then the
    /// dataplane restarts (its Hello: acked 0) and rejects the resent 322 (the old process
    /// still holds a port). The Gateway and its ListenerSets must say so, although their
    /// statuses were acknowledged before; the routes' statuses do not depend on the answer and
    /// are not written again (1,000 of them: no PATCH at the Hello, only the programmed
    /// objects at the Nack and again at the next Ack).
    #[tokio::test]
    async fn a_restarted_dataplane_rejecting_the_resent_config_unprograms_what_was_acked() {
        const ROUTES: usize = 1000;
        let (snapshot, statuses) = conflict_world(ROUTES);
        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        g.step(|s| s.acked = 322).await;
        let acked = g.api.writes();
        assert_eq!(acked["HTTPRoute"], ROUTES);
        g.assert_translated(&statuses);

        // The dataplane restarts: its Hello says it runs nothing.
        g.step(|s| {
            s.acked = 0;
            s.last_nack = None;
        })
        .await;
        assert_eq!(g.api.writes(), acked, "nothing changes before the answer");

        // It rejects the resent 322.
        g.nack(322).await;
        let programmed_kinds = programmed_kinds(&statuses);
        assert!(programmed_kinds.contains_key("Gateway"));
        assert!(!programmed_kinds.contains_key("HTTPRoute"));
        let after_nack = add_writes(&acked, &programmed_kinds);
        assert_eq!(g.api.writes(), after_nack, "only the programmed objects");
        for (key, status) in &statuses {
            let written = g.written(key);
            if programmed(status) {
                assert!(says_rejected(&written), "{key:?}: {written:?}");
                assert!(!says_programmed(&written), "{key:?}: {written:?}");
            } else {
                assert_eq!(written, translated(status), "{key:?}");
            }
        }

        // Its next try is acknowledged: translate's own statuses again.
        g.step(|s| s.acked = 322).await;
        assert_eq!(g.api.writes(), add_writes(&after_nack, &programmed_kinds));
        g.assert_translated(&statuses);
        assert!(g.w.shared.queue().unacked.is_empty());
    }

    /// review-s22b F2's worse variant: 322 acknowledged, 323 rejected (the rejection stays,
    /// as it should, across the reconnect), then the dataplane restarts: it is sent only the
    /// rejected 323 and runs nothing, so what 322 programmed is no longer programmed.
    #[tokio::test]
    async fn a_restart_after_a_rejection_unprograms_what_the_older_ack_programmed() {
        let (snapshot, statuses) = conflict_world(2);
        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        g.step(|s| s.acked = 322).await;
        g.offer(&statuses, 323);
        g.step(|s| {
            s.submitted = 323;
            s.last_nack = Some((323, vec![EADDRINUSE.into()]));
        })
        .await;
        let gateway = g.written(&gateway_key());
        assert!(says_programmed(&gateway), "322 still runs: {gateway:?}");

        g.step(|s| s.acked = 0).await;
        let gateway = g.written(&gateway_key());
        assert!(says_rejected(&gateway), "{gateway:?}");
        assert!(!says_programmed(&gateway), "{gateway:?}");
    }

    /// The keys of the objects whose `translate` status is programmed (the ones the gate
    /// changes), and of the others.
    fn split_programmed(statuses: &Statuses) -> (Vec<ObjectKey>, Vec<ObjectKey>) {
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for (key, status) in statuses {
            if programmed(status) {
                on.push(key.clone());
            } else {
                off.push(key.clone());
            }
        }
        (on, off)
    }

    /// Every programmed object's last written status says the dataplane rejected it (and
    /// nothing says programmed); every other object's is `translate`'s own.
    fn assert_rejected(g: &Gated, statuses: &Statuses) {
        for (key, status) in statuses {
            let written = g.written(key);
            if programmed(status) {
                assert!(says_rejected(&written), "{key:?}: {written:?}");
                assert!(!says_programmed(&written), "{key:?}: {written:?}");
            } else {
                assert_eq!(written, translated(status), "{key:?}");
            }
        }
    }

    /// The writes to `api` of another replica that leads meanwhile: its cache has what `api`
    /// holds now, its own dataplane acknowledged `generation` (`nack: None`) or rejected it
    /// with `nack`, and it writes `statuses` for `generation` until it has nothing left.
    async fn other_leader(
        api: &FakeApi,
        snapshot: &crate::translate::Snapshot,
        statuses: &Statuses,
        generation: u64,
        nack: Option<&str>,
    ) {
        let (_push, rx) = watch::channel(PushState {
            connected: true,
            submitted: generation,
            acked: if nack.is_some() { 0 } else { generation },
            last_nack: nack.map(|e| (generation, vec![e.to_string()])),
            ..Default::default()
        });
        let cache = Cached::with(snapshot, &api.last(), &(api.requests() + 1).to_string());
        let (mut w, _leader) = test_worker(api, cache, rx);
        w.shared.queue().offer(
            statuses,
            &StatusChanges::All,
            generation,
            None,
            Instant::now(),
        );
        drain(&mut w).await;
    }

    /// review-s22b F5 (1): the Ack of the full config comes while the Nack's writes are in
    /// flight (sent, the API server has not answered). Each programmed object must be written
    /// once more, under the Ack, and only those: the statuses that do not depend on the
    /// answer are not written again, and one move of the gate costs one write per object it
    /// changes, not more.
    #[tokio::test]
    async fn an_ack_while_the_nacks_writes_are_in_flight_rewrites_them_once() {
        let (snapshot, statuses) = conflict_world(2);
        let (on, _) = split_programmed(&statuses);
        assert!(on.contains(&gateway_key()) && on.len() >= 3, "{on:?}");
        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        g.w.options.concurrency = statuses.len();
        g.api.hold(true);
        g.change(|s| s.last_nack = Some((322, vec![EADDRINUSE.into()])));
        g.w.start_writes();
        assert_eq!(g.w.jobs.len(), statuses.len(), "every object in flight");
        g.api.arrived(statuses.len()).await;
        for key in &on {
            let written = g.written(key);
            assert!(says_rejected(&written), "{key:?}: {written:?}");
        }

        // The full config of 322 is applied while those writes are unanswered.
        g.change(|s| s.acked = 322);
        g.w.start_writes();
        assert_eq!(
            g.api.requests(),
            statuses.len(),
            "nothing more before the answers"
        );
        {
            let q = g.w.shared.queue();
            assert!(q.dirty.is_empty() && q.held.is_empty());
            let again: Vec<&ObjectKey> = q
                .entries
                .iter()
                .filter(|(_, e)| e.place == Place::InFlight && e.again)
                .map(|(k, _)| k)
                .collect();
            assert_eq!(again.len(), statuses.len(), "each to be looked at again");
        }
        g.api.hold(false);
        drain(&mut g.w).await;
        let want = add_writes(&kinds(&statuses, |_| true), &programmed_kinds(&statuses));
        assert_eq!(g.api.writes(), want, "the programmed objects once more");
        g.assert_translated(&statuses);
        assert!(g.w.shared.queue().unacked.is_empty());

        // Settled: the same state heard again writes nothing.
        g.step(|_| {}).await;
        assert_eq!(g.api.writes(), want);
    }

    /// review-s22b F5 (1), the other way: 322's Ack is being written (Programmed=True in
    /// flight) when the dataplane restarts (its Hello: acked 0) and rejects the resent 322,
    /// heard as two changes or as one (the watch keeps only the latest state). The writes in
    /// flight land after the gate moved: the programmed objects must end rejected, each
    /// written once more; the others are not written again.
    #[tokio::test]
    async fn a_restart_and_a_nack_while_the_acks_writes_are_in_flight_unprogram_them() {
        let (snapshot, statuses) = conflict_world(2);
        let (on, _) = split_programmed(&statuses);
        for coalesced in [false, true] {
            let mut g = Gated::start(&snapshot, &statuses, 322).await;
            g.w.options.concurrency = statuses.len();
            g.api.hold(true);
            g.change(|s| s.acked = 322);
            g.w.start_writes();
            assert_eq!(g.w.jobs.len(), statuses.len(), "every object in flight");
            g.api.arrived(statuses.len()).await;
            for key in &on {
                let written = g.written(key);
                assert!(says_programmed(&written), "{key:?}: {written:?}");
            }

            let hello = |s: &mut PushState| {
                s.acked = 0;
                s.last_nack = None;
            };
            let nack = |s: &mut PushState| s.last_nack = Some((322, vec![EADDRINUSE.into()]));
            if coalesced {
                g.change(|s| {
                    hello(s);
                    nack(s);
                });
            } else {
                g.change(hello);
                g.change(nack);
            }
            g.w.start_writes();
            assert_eq!(
                g.api.requests(),
                statuses.len(),
                "nothing more before the answers"
            );
            g.api.hold(false);
            drain(&mut g.w).await;
            let every_kind = kinds(&statuses, |_| true);
            let after_nack = add_writes(&every_kind, &programmed_kinds(&statuses));
            assert_eq!(g.api.writes(), after_nack, "coalesced {coalesced}");
            assert_rejected(&g, &statuses);
            assert_eq!(g.w.shared.queue().unacked.len(), statuses.len());

            // The next try is acknowledged: translate's own statuses, once more each.
            g.step(|s| s.acked = 322).await;
            assert_eq!(
                g.api.writes(),
                add_writes(&after_nack, &programmed_kinds(&statuses))
            );
            g.assert_translated(&statuses);
            assert!(g.w.shared.queue().unacked.is_empty());
        }
    }

    /// review-s22b F5 (1), two moves during one write: past the Ack wait the statuses go out
    /// with `Programmed` pending; while those writes are in flight the dataplane rejects the
    /// generation, then acknowledges it (the full config sent again). One more write per
    /// programmed object, with translate's own status: not one per move of the gate.
    #[tokio::test]
    async fn two_moves_of_the_gate_during_a_write_cost_one_more_write() {
        let (snapshot, statuses) = conflict_world(2);
        let (on, _) = split_programmed(&statuses);
        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        g.w.options.concurrency = statuses.len();
        g.w.options.ack_wait = Duration::ZERO;
        g.api.hold(true);
        g.w.start_writes();
        assert_eq!(g.w.jobs.len(), statuses.len(), "every object in flight");
        g.api.arrived(statuses.len()).await;
        for key in &on {
            let written = g.written(key);
            assert!(
                written
                    .iter()
                    .any(|c| c[0] == "Programmed" && c[1] == "Unknown" && c[2] == "Pending"),
                "{key:?}: {written:?}"
            );
        }

        g.change(|s| s.last_nack = Some((322, vec![EADDRINUSE.into()])));
        g.w.start_writes();
        g.change(|s| s.acked = 322);
        g.w.start_writes();
        assert_eq!(
            g.api.requests(),
            statuses.len(),
            "nothing more before the answers"
        );
        g.api.hold(false);
        drain(&mut g.w).await;
        let want = add_writes(&kinds(&statuses, |_| true), &programmed_kinds(&statuses));
        assert_eq!(g.api.writes(), want);
        g.assert_translated(&statuses);
        assert!(g.w.shared.queue().unacked.is_empty());
    }

    /// review-s22b F5 (2): this replica wrote the rejection of 322 (every entry in
    /// `unacked`), then lost the lease. Meanwhile translation 323 adds a route, this
    /// replica's dataplane rejects 323 too, and another replica, whose own dataplane
    /// acknowledged it, leads and writes Programmed=True; this replica's cache sees those
    /// writes. On regaining the lease the rejection must be written again over the other
    /// leader's True, to exactly the programmed objects; the routes (the new one included)
    /// already carry translate's own status and are not written.
    #[tokio::test]
    async fn regaining_the_lease_writes_the_current_gate_over_the_other_leaders_status() {
        let (snapshot, statuses) = conflict_world(2);
        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        g.nack(322).await;
        assert_eq!(g.w.shared.queue().unacked.len(), statuses.len());
        assert_rejected(&g, &statuses);

        g.lease(false);
        assert!(g.w.shared.queue().unacked.is_empty());
        let (snapshot, statuses) = conflict_world(3);
        assert!(
            g.offer(&statuses, 323) > 0,
            "a route more, the Gateway's count"
        );
        g.step(|s| {
            s.submitted = 323;
            s.last_nack = Some((323, vec![EADDRINUSE.into()]));
        })
        .await;
        other_leader(&g.api, &snapshot, &statuses, 323, None).await;
        g.assert_translated(&statuses);
        let before = g.api.writes();
        g.w.objects = Box::new(Cached::with(&snapshot, &g.api.last(), "1000"));

        g.lease(true);
        drain(&mut g.w).await;
        assert_eq!(
            g.api.writes(),
            add_writes(&before, &programmed_kinds(&statuses)),
            "the programmed objects only"
        );
        assert_rejected(&g, &statuses);
        {
            let q = g.w.shared.queue();
            assert_eq!(q.entries.len(), statuses.len());
            assert_eq!(q.unacked.len(), statuses.len());
        }

        // Its dataplane applies the full config of 323: translate's own statuses again.
        g.step(|s| s.acked = 323).await;
        g.assert_translated(&statuses);
        assert!(g.w.shared.queue().unacked.is_empty());
    }

    /// review-s22b F5 (2), with writes in flight: the rejection's writes are unanswered when
    /// this replica loses the lease, and land afterwards (a request already sent is not taken
    /// back); then the other leader writes Programmed=True, and this replica's cache sees it.
    /// What those late writes recorded must not stand for the objects on regaining: the
    /// rejection is written again to the programmed objects.
    #[tokio::test]
    async fn writes_that_land_after_the_lease_is_lost_are_not_trusted_on_regaining() {
        let (snapshot, statuses) = conflict_world(2);
        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        g.w.options.concurrency = statuses.len();
        g.api.hold(true);
        g.change(|s| s.last_nack = Some((322, vec![EADDRINUSE.into()])));
        g.w.start_writes();
        g.api.arrived(statuses.len()).await;

        g.lease(false);
        g.api.hold(false);
        drain(&mut g.w).await;
        assert_rejected(&g, &statuses);
        assert!(g.w.shared.queue().unacked.is_empty());
        other_leader(&g.api, &snapshot, &statuses, 322, None).await;
        g.assert_translated(&statuses);
        let before = g.api.writes();
        g.w.objects = Box::new(Cached::with(&snapshot, &g.api.last(), "1000"));

        g.lease(true);
        drain(&mut g.w).await;
        assert_eq!(
            g.api.writes(),
            add_writes(&before, &programmed_kinds(&statuses))
        );
        assert_rejected(&g, &statuses);
        assert_eq!(g.w.shared.queue().unacked.len(), statuses.len());
    }

    /// The watch cache does not see status-only updates (the watch predicate drops them), so
    /// it does not see what another leader wrote: this replica wrote the rejection of 322 (and
    /// its cache holds it: a relist after those writes), lost the lease, and the other leader,
    /// whose dataplane acknowledged 322, wrote Programmed=True. On regaining the lease the
    /// cache says every status is already right; the rejection must still be written again
    /// over the other leader's True, to exactly the programmed objects, each object read once
    /// (a `get` of its status) and nothing read or written again afterwards.
    #[tokio::test]
    async fn regaining_the_lease_with_a_cache_that_missed_the_other_leaders_writes_writes_over_them(
    ) {
        let (snapshot, statuses) = conflict_world(2);
        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        g.nack(322).await;
        assert_rejected(&g, &statuses);
        g.w.objects = Box::new(Cached::with(&snapshot, &g.api.last(), "2"));

        g.lease(false);
        other_leader(&g.api, &snapshot, &statuses, 322, None).await;
        g.assert_translated(&statuses);
        let (before, reads) = (g.api.writes(), g.api.count("GET"));
        assert_eq!(reads, 0);

        g.lease(true);
        drain(&mut g.w).await;
        assert_eq!(
            g.api.writes(),
            add_writes(&before, &programmed_kinds(&statuses)),
            "the programmed objects only"
        );
        assert_rejected(&g, &statuses);
        assert_eq!(g.api.count("GET"), statuses.len(), "each object read once");

        // Read or written since: trusted again.
        let requests = g.api.requests();
        g.offer(&statuses, 323);
        g.step(|s| s.submitted = 323).await;
        g.step(|s| s.last_nack = Some((323, vec![EADDRINUSE.into()])))
            .await;
        assert_eq!(g.api.requests(), requests, "nothing read or written again");
        let q = g.w.shared.queue();
        assert_eq!(q.entries.len(), statuses.len());
        assert_eq!(q.depth(g.w.jobs.len()), 0);
    }

    /// review-s22b F5 (2), over many lease flaps: while this replica does not lead, its
    /// dataplane's answer moves (an Ack, or a restart that rejects the resent config) and the
    /// other leader writes the status of its own dataplane's answer. Each time this replica
    /// regains the lease, every object must end with the status of this replica's gate, at
    /// the cost of one write per object whose status the other leader left different, and
    /// `unacked` (like every queue) holds at most one record per object however many flaps.
    #[tokio::test]
    async fn across_lease_flaps_the_status_follows_the_current_gate_and_the_queues_stay_bounded() {
        const FLAPS: usize = 24;
        let (snapshot, statuses) = conflict_world(2);
        let (on, _) = split_programmed(&statuses);
        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        g.nack(322).await;
        for flap in 0..FLAPS {
            g.lease(false);
            // Every combination of this replica's answer and the other leader's, in turn.
            let ours_acked = flap % 2 == 0;
            let theirs_acked = (flap / 2) % 2 == 0;
            if ours_acked {
                g.step(|s| s.acked = 322).await;
            } else {
                g.step(|s| {
                    s.acked = 0;
                    s.last_nack = Some((322, vec![EADDRINUSE.into()]));
                })
                .await;
            }
            let nack = (!theirs_acked).then_some(EADDRINUSE);
            other_leader(&g.api, &snapshot, &statuses, 322, nack).await;
            let (before, patched) = (g.api.requests(), g.api.count("PATCH"));
            let read = g.api.count("GET");
            let rv = (before + 1).to_string();
            g.w.objects = Box::new(Cached::with(&snapshot, &g.api.last(), &rv));

            g.lease(true);
            drain(&mut g.w).await;
            let wrote = g.api.count("PATCH") - patched;
            let differ = if ours_acked == theirs_acked {
                0
            } else {
                on.len()
            };
            assert_eq!(
                wrote, differ,
                "flap {flap}: ours {ours_acked}, theirs {theirs_acked}"
            );
            // A gain reads each object the cache alone says is right at most once.
            let reads = g.api.count("GET") - read;
            assert!(
                reads <= statuses.len(),
                "flap {flap}: {reads} GETs for {} objects",
                statuses.len()
            );
            if ours_acked {
                g.assert_translated(&statuses);
            } else {
                assert_rejected(&g, &statuses);
            }
            let q = g.w.shared.queue();
            assert_eq!(q.entries.len(), statuses.len(), "flap {flap}");
            assert_eq!(q.depth(g.w.jobs.len()), 0, "flap {flap}");
            let unacked = if ours_acked { 0 } else { statuses.len() };
            assert_eq!(q.unacked.len(), unacked, "flap {flap}");
            assert!(q.gone.is_empty() && q.retry.is_empty());
            drop(q);
            assert!(g.w.gates.1.len() <= 1, "flap {flap}: {}", g.w.gates.1.len());
        }
    }

    /// A route deleted while its status waits on the gate: it is no longer in the watch cache
    /// when the answer comes (an Ack after the Nack written to it, or the first answer, a
    /// Nack), and the next translation drops it. Nothing is written to it after it went, and
    /// its records (the entry, `unacked`) go with it.
    #[tokio::test]
    async fn a_route_deleted_while_gated_is_not_written_and_leaves_no_record() {
        let (snapshot, statuses) = conflict_world(2);
        let (after, statuses_after) = conflict_world(1);
        let r1 = ObjectKey::new("HTTPRoute", "gateway-conformance-infra", "r1");
        assert!(statuses.contains_key(&r1) && !statuses_after.contains_key(&r1));
        let writes_to = |g: &Gated, key: &ObjectKey| {
            let log = g.api.log.lock().unwrap();
            log.iter()
                .filter(|(m, k, ns, n, _)| m == "PATCH" && ObjectKey::new(k, ns, n) == *key)
                .count()
        };
        for nack_first in [true, false] {
            let mut g = Gated::start(&snapshot, &statuses, 322).await;
            if nack_first {
                // Written under the Nack, then deleted: the Ack finds it gone.
                g.nack(322).await;
                assert_eq!(writes_to(&g, &r1), 1);
                g.w.objects = Box::new(Cached::with(&after, &g.api.last(), "2"));
                g.step(|s| s.acked = 322).await;
            } else {
                // Deleted before any answer: the Nack finds it gone.
                g.w.objects = Box::new(Cached::of(&after));
                g.nack(322).await;
            }
            let written = usize::from(nack_first);
            assert_eq!(writes_to(&g, &r1), written, "nack first: {nack_first}");
            g.offer(&statuses_after, 323);
            g.step(|s| {
                s.submitted = 323;
                s.acked = 323;
            })
            .await;
            assert_eq!(writes_to(&g, &r1), written, "nack first: {nack_first}");
            g.assert_translated(&statuses_after);
            let q = g.w.shared.queue();
            assert!(!q.entries.contains_key(&r1) && !q.unacked.contains_key(&r1));
            assert_eq!(q.entries.len(), statuses_after.len());
            assert!(q.unacked.is_empty(), "{:?}", q.unacked.keys());
            assert_eq!(q.depth(g.w.jobs.len()), 0);
        }
    }

    /// `s` with `uid(key)` as the `metadata.uid` of every object of the status kinds.
    fn with_uids(
        s: &crate::translate::Snapshot,
        uid: impl Fn(&ObjectKey) -> String,
    ) -> crate::translate::Snapshot {
        use kube::Resource as _;
        let mut s = s.clone();
        macro_rules! set {
            ($($kind:literal $field:ident),*) => {$(
                for o in s.$field.iter_mut() {
                    let mut c = (**o).clone();
                    let m = c.meta_mut();
                    let key = ObjectKey::new(
                        $kind,
                        m.namespace.as_deref().unwrap_or_default(),
                        m.name.as_deref().unwrap_or_default(),
                    );
                    m.uid = Some(uid(&key));
                    *o = Arc::new(c);
                }
            )*};
        }
        status_writer::status_kinds!(set!());
        s
    }

    /// `kubectl replace --force` (or a GitOps tool creating an object again): the Gateway and
    /// a route are deleted and created again under the same names with the same specs between
    /// two translations. The new objects (new uids, another resourceVersion) carry no status,
    /// and translate wants for them what it wanted for the old ones, so the offer queues
    /// nothing. Their statuses must be written, to the new objects, once each, from the
    /// watch's journal of created objects, or from every object when that journal lost its
    /// place (a relist); nothing else is written again, and the queue keeps one entry per
    /// object.
    #[tokio::test]
    async fn an_object_deleted_and_created_again_with_the_same_spec_gets_its_status_written() {
        let (snapshot, statuses) = conflict_world(2);
        let r0 = ObjectKey::new("HTTPRoute", "gateway-conformance-infra", "r0");
        let mut recreated = vec![gateway_key(), r0.clone()];
        recreated.sort();
        let old = with_uids(&snapshot, |k| format!("{}-1", k.name));
        let new = with_uids(&snapshot, |k| {
            let n = if recreated.contains(k) { 2 } else { 1 };
            format!("{}-{n}", k.name)
        });
        for relist in [false, true] {
            let (mut g, before) = Gated::start_written(&old, &statuses, 322).await;

            // Deleted and created again: the cache holds the new objects (resourceVersion 7,
            // no status), the others as they were.
            let mut cache = Cached::of(&new);
            let fresh = Cached::with(&new, &HashMap::new(), "7");
            for k in &recreated {
                cache.0.insert(k.clone(), fresh.0[k].clone());
            }
            if relist {
                g.journal.reset();
            } else {
                recreated.iter().for_each(|k| record_created(&g.journal, k));
            }
            g.w.objects = Box::new(cache.journal(&g.journal));
            assert_eq!(g.offer(&statuses, 323), 0, "translate wants what it wanted");
            g.step(|s| {
                s.submitted = 323;
                s.acked = 323;
            })
            .await;
            let mut wrote: Vec<ObjectKey> = g.api.log.lock().unwrap()[before..]
                .iter()
                .map(|(m, k, ns, n, _)| {
                    assert_eq!(m, "PATCH");
                    ObjectKey::new(k, ns, n)
                })
                .collect();
            wrote.sort();
            assert_eq!(
                wrote, recreated,
                "relist {relist}: the new objects, once each"
            );
            g.assert_translated(&statuses);
            // The route's write is conditional on the new object (its resourceVersion).
            let log = g.api.log.lock().unwrap().clone();
            let metadata = g.api.metadata.lock().unwrap().clone();
            let i = (before..log.len())
                .find(|&i| ObjectKey::new(&log[i].1, &log[i].2, &log[i].3) == r0)
                .unwrap();
            assert_eq!(metadata[i]["resourceVersion"], "7", "{}", metadata[i]);

            // Written: the next translation, the same again, writes nothing.
            assert_eq!(g.offer(&statuses, 324), 0);
            g.step(|s| {
                s.submitted = 324;
                s.acked = 324;
            })
            .await;
            assert_eq!(g.api.requests(), before + recreated.len());
            let q = g.w.shared.queue();
            assert_eq!(q.entries.len(), statuses.len());
            assert_eq!(q.depth(g.w.jobs.len()), 0);
            assert!(q.unacked.is_empty() && q.gone.is_empty());
        }
    }

    /// An Ingress's problems are published as Events about it (they have no status field),
    /// and `kubectl describe ingress` lists only the Events whose object reference carries
    /// the Ingress's uid (its field selector includes `involvedObject.uid`): each Event must
    /// name the uid of the object it is about. An Ingress deleted and created again under its
    /// name with the same spec (new uid) has the same problems, so no offer queues them; its
    /// Events must be published again, about the new object, once.
    #[tokio::test]
    async fn an_ingress_created_again_gets_its_events_about_the_new_object() {
        use k8s_openapi::api::networking::v1::Ingress;
        let ingress = |uid: &str| {
            let mut i = Ingress::default();
            i.metadata.namespace = Some("ns".into());
            i.metadata.name = Some("ing".into());
            i.metadata.uid = Some(uid.into());
            Arc::new(i)
        };
        let snapshot = |uid: &str| crate::translate::Snapshot {
            ingresses: vec![ingress(uid)],
            ..Default::default()
        };
        let events_key = ObjectKey::new(crate::translate::ingress::EVENT_KIND, "ns", "ing");
        let statuses: Statuses = [(events_key, conditions("HostTaken"))].into();
        let mut g = Gated::start(&snapshot("ing-1"), &statuses, 1).await;
        g.w.writer = StatusWriter::new(g.api.client(), "sweety.dev/gateway-controller")
            .with_events(kube::runtime::events::Reporter {
                controller: "sweety-controller".into(),
                instance: Some("test".into()),
            });
        // The Event about each published: (regarding's kind, name, uid).
        let published = |g: &Gated| -> Vec<[String; 3]> {
            let (log, bodies) = (g.api.log.lock().unwrap(), g.api.bodies.lock().unwrap());
            log.iter()
                .zip(bodies.iter())
                .filter(|(e, _)| e.0 == "POST")
                .map(|(_, b)| {
                    let r = &b["regarding"];
                    ["kind", "name", "uid"].map(|f| r[f].as_str().unwrap_or("").to_string())
                })
                .collect()
        };
        let about = |uid: &str| ["Ingress".to_string(), "ing".into(), uid.into()];
        g.step(|s| s.acked = 1).await;
        assert_eq!(published(&g), [about("ing-1")]);

        // Deleted and created again with the same spec: the cache holds the new object.
        record_created(&g.journal, &ObjectKey::new("Ingress", "ns", "ing"));
        g.w.objects = Box::new(Cached::of(&snapshot("ing-2")).journal(&g.journal));
        assert_eq!(g.offer(&statuses, 2), 0, "translate wants what it wanted");
        g.step(|s| {
            s.submitted = 2;
            s.acked = 2;
        })
        .await;
        assert_eq!(published(&g), [about("ing-1"), about("ing-2")]);

        // Published: the next translation, the same again, publishes nothing.
        assert_eq!(g.offer(&statuses, 3), 0);
        g.step(|s| {
            s.submitted = 3;
            s.acked = 3;
        })
        .await;
        assert_eq!(published(&g).len(), 2);
    }

    /// Session 24's LOW item: route r0 queued by an offer (its write waits for the
    /// dataplane's answer), then deleted and created again under its name before it was
    /// written. The entry wants what the translation of the old object wanted (Accepted,
    /// Programmed once acknowledged), which may be wrong for the new one: nothing may be
    /// written to it until the offer of a translation that saw it; the other objects are
    /// written as usual. That offer then writes r0's status, once, to the new object: the
    /// new spec's status, or the same status again when the spec is the same (no offer
    /// queues it then: the journal does). After a relist between the offer's snapshot and
    /// the write (the journal cannot tell what was created), nothing is written until the
    /// next offer, which writes every object.
    #[tokio::test]
    async fn an_object_queued_and_created_again_before_its_write_waits_for_its_translation() {
        let (snapshot, statuses) = conflict_world(2);
        let (edited, statuses_edited) = conflict_world_where(2, "no-such-listener");
        let r0 = ObjectKey::new("HTTPRoute", "gateway-conformance-infra", "r0");
        assert_ne!(statuses[&r0], statuses_edited[&r0]);
        let old = with_uids(&snapshot, |k| format!("{}-1", k.name));
        for (case, spec, after) in [
            ("another spec", &edited, &statuses_edited),
            ("the same spec", &snapshot, &statuses),
            ("a relist", &snapshot, &statuses),
        ] {
            let new = with_uids(spec, |k| {
                let n = if *k == r0 { 2 } else { 1 };
                format!("{}-{n}", k.name)
            });
            // Offered (every object queued), held for the dataplane's answer.
            let mut g = Gated::start(&old, &statuses, 322).await;
            drain(&mut g.w).await;
            assert_eq!(g.api.requests(), 0);

            // r0 is deleted and created again: the cache holds the new object, its watch
            // journalled it (or relisted); then the dataplane acknowledges 322.
            let journal = g.journal.clone();
            let cache = |s: &crate::translate::Snapshot| {
                let mut cache = Cached::of(s);
                cache.0.insert(
                    r0.clone(),
                    Cached::with(&new, &HashMap::new(), "7").0[&r0].clone(),
                );
                cache.journal(&journal)
            };
            if case == "a relist" {
                g.journal.reset();
            } else {
                record_created(&g.journal, &r0);
            }
            g.w.objects = Box::new(cache(&old));
            g.step(|s| s.acked = 322).await;
            let wrote = |g: &Gated, from: usize| -> Vec<ObjectKey> {
                let mut keys: Vec<ObjectKey> = g.api.log.lock().unwrap()[from..]
                    .iter()
                    .map(|(m, k, ns, n, _)| {
                        assert_eq!(m, "PATCH");
                        ObjectKey::new(k, ns, n)
                    })
                    .collect();
                keys.sort();
                keys
            };
            let mut others: Vec<ObjectKey> =
                statuses.keys().filter(|k| **k != r0).cloned().collect();
            others.sort();
            let held = if case == "a relist" { vec![] } else { others };
            assert_eq!(wrote(&g, 0), held, "{case}: written before the next offer");
            let before = g.api.requests();

            // The translation of the new object: r0's status, once, to the new object, and
            // the objects whose status it changes (all of them after a relist).
            g.w.objects = Box::new(cache(&new));
            g.offer(after, 323);
            g.step(|s| {
                s.submitted = 323;
                s.acked = 323;
            })
            .await;
            let mut changed: Vec<ObjectKey> = after
                .iter()
                .filter(|(k, st)| **k == r0 || case == "a relist" || statuses.get(*k) != Some(*st))
                .map(|(k, _)| k.clone())
                .collect();
            changed.sort();
            assert_eq!(wrote(&g, before), changed, "{case}");
            g.assert_translated(after);
            let log = g.api.log.lock().unwrap().clone();
            let metadata = g.api.metadata.lock().unwrap().clone();
            let i = (before..log.len())
                .find(|&i| ObjectKey::new(&log[i].1, &log[i].2, &log[i].3) == r0)
                .unwrap();
            assert_eq!(
                metadata[i]["resourceVersion"], "7",
                "{case}: the new object"
            );
            let q = g.w.shared.queue();
            assert_eq!(q.entries.len(), after.len());
            assert_eq!(q.depth(g.w.jobs.len()), 0);
        }
    }

    /// Review of 8b6d4ca: route r0 deleted and created again under its name with another
    /// spec (attached to a listener the Gateway does not have), generation 1 like the old
    /// one. Until a translation that saw the new object is offered, the worker must write
    /// nothing to it: the entry of its name still wants the old object's status (Accepted,
    /// and Programmed with the old config acknowledged), which would be wrong for the new
    /// spec. Neither when the worker is woken before the next offer, nor by an offer whose
    /// snapshot was taken before the new object reached the cache. The offer of the new
    /// translation writes the new status, once, to the new object.
    #[tokio::test]
    async fn an_object_created_again_with_another_spec_waits_for_its_translation() {
        let (snapshot, statuses) = conflict_world(2);
        let (edited, statuses_edited) = conflict_world_where(2, "no-such-listener");
        let r0 = ObjectKey::new("HTTPRoute", "gateway-conformance-infra", "r0");
        assert_ne!(statuses[&r0], statuses_edited[&r0]);
        let accepted = |st: &ObjectStatus| {
            translated(st)
                .iter()
                .any(|c| c[0] == "Accepted" && c[1] == "True")
        };
        assert!(accepted(&statuses[&r0]) && !accepted(&statuses_edited[&r0]));
        let old = with_uids(&snapshot, |k| format!("{}-1", k.name));
        let new = with_uids(&edited, |k| {
            let n = if *k == r0 { 2 } else { 1 };
            format!("{}-{n}", k.name)
        });
        let (mut g, before) = Gated::start_written(&old, &statuses, 322).await;

        // A snapshot is taken (its position), then r0 is deleted and created again: the cache
        // holds the new object (resourceVersion 7, no status), its watch journalled it.
        let taken = g.journal.position();
        let mut cache = Cached::of(&new);
        cache.0.insert(
            r0.clone(),
            Cached::with(&new, &HashMap::new(), "7").0[&r0].clone(),
        );
        record_created(&g.journal, &r0);
        g.w.objects = Box::new(cache.journal(&g.journal));
        // The worker is woken (by anything) before the next offer: nothing written.
        drain(&mut g.w).await;
        assert_eq!(
            g.api.requests(),
            before,
            "the old status written to the new object"
        );
        // The offer of that earlier snapshot's translation (the old spec): still nothing.
        assert_eq!(g.offer_at(&statuses, 323, taken), 0);
        g.step(|s| {
            s.submitted = 323;
            s.acked = 323;
        })
        .await;
        assert_eq!(g.api.requests(), before, "written before its translation");

        // The translation of the new spec: its status, once, to the new object.
        assert!(g.offer(&statuses_edited, 324) > 0);
        g.step(|s| {
            s.submitted = 324;
            s.acked = 324;
        })
        .await;
        let log = g.api.log.lock().unwrap().clone();
        let wrote: Vec<ObjectKey> = log[before..]
            .iter()
            .map(|(m, k, ns, n, _)| {
                assert_eq!(m, "PATCH");
                ObjectKey::new(k, ns, n)
            })
            .collect();
        // r0, and the objects whose status the new spec changes (the Gateway's attached
        // routes), each once.
        let mut changed: Vec<ObjectKey> = statuses_edited
            .iter()
            .filter(|(k, st)| statuses.get(*k) != Some(*st))
            .map(|(k, _)| k.clone())
            .collect();
        changed.sort();
        assert!(changed.contains(&r0));
        let mut wrote = wrote;
        wrote.sort();
        assert_eq!(wrote, changed);
        g.assert_translated(&statuses_edited);
        let metadata = g.api.metadata.lock().unwrap().clone();
        let before = (before..log.len())
            .find(|&i| ObjectKey::new(&log[i].1, &log[i].2, &log[i].3) == r0)
            .unwrap();
        assert_eq!(
            metadata[before]["resourceVersion"], "7",
            "{}",
            metadata[before]
        );
        let q = g.w.shared.queue();
        assert_eq!(q.entries.len(), statuses_edited.len());
        assert_eq!(q.depth(g.w.jobs.len()), 0);
    }

    /// An object whose spec changes (its generation 1 -> 2) after its status was written
    /// with `Programmed` pending and before the dataplane answered: the Ack of the config
    /// translated from generation 1 must not make the status of generation 2 programmed
    /// (that config is not applied yet); the Ack of the next config does. Statuses whose
    /// config was acknowledged are written as programmed meanwhile.
    #[tokio::test]
    async fn an_ack_of_the_config_before_an_objects_spec_changed_does_not_program_the_new_spec() {
        let (snapshot, statuses) = conflict_world(2);
        let mut edited = snapshot.clone();
        let i = edited
            .gateways
            .iter()
            .position(|gw| gw.metadata.name.as_deref() == Some(gateway_key().name.as_str()))
            .unwrap();
        let mut gw = (*edited.gateways[i]).clone();
        gw.metadata.generation = Some(2);
        edited.gateways[i] = Arc::new(gw);
        let statuses_edited =
            crate::translate::translate(&edited, &crate::translate::Params::default()).statuses;
        let programmed_of = |v: &serde_json::Value| {
            v["conditions"]
                .as_array()
                .and_then(|l| l.iter().find(|c| c["type"] == "Programmed"))
                .map(|c| (c["status"].clone(), c["observedGeneration"].clone()))
        };

        let mut g = Gated::start(&snapshot, &statuses, 322).await;
        g.w.options.ack_wait = Duration::ZERO;
        drain(&mut g.w).await;
        let gateway = &g.api.last()[&gateway_key()];
        assert_eq!(
            programmed_of(gateway),
            Some((serde_json::json!("Unknown"), serde_json::json!(1)))
        );

        // The spec changes: translation 323, written pending too.
        g.w.objects = Box::new(Cached::with(&edited, &g.api.last(), "2"));
        assert!(g.offer(&statuses_edited, 323) > 0);
        g.step(|s| s.submitted = 323).await;
        let pending2 = Some((serde_json::json!("Unknown"), serde_json::json!(2)));
        assert_eq!(programmed_of(&g.api.last()[&gateway_key()]), pending2);

        // 322 is acknowledged: not the Gateway's generation 2.
        g.step(|s| s.acked = 322).await;
        assert_eq!(programmed_of(&g.api.last()[&gateway_key()]), pending2);
        let entries: Vec<(ObjectKey, u64)> = {
            let q = g.w.shared.queue();
            q.entries
                .iter()
                .map(|(k, e)| (k.clone(), e.generation))
                .collect()
        };
        for (key, generation) in &entries {
            let written = g.written(key);
            if *generation == 322 {
                assert_eq!(written, translated(&statuses_edited[key]), "{key:?}");
            } else {
                assert!(!says_programmed(&written), "{key:?}: {written:?}");
            }
        }

        g.step(|s| s.acked = 323).await;
        assert_eq!(
            programmed_of(&g.api.last()[&gateway_key()]),
            Some((serde_json::json!("True"), serde_json::json!(2)))
        );
        g.assert_translated(&statuses_edited);
        assert!(g.w.shared.queue().unacked.is_empty());
    }

    /// A SweetySite's status is written by the same worker under the same gate (its
    /// `Programmed` condition waits for the dataplane's answer): a Nack of its generation
    /// writes the rejection, and the Ack that follows (the full config sent again) must
    /// replace it with `translate`'s own status.
    #[tokio::test]
    async fn an_ack_after_a_nack_rewrites_a_sweetysites_status() {
        const NACK: &str =
            "config rejected: cannot bind 0.0.0.0:443: Address already in use (os error 98)";
        let (snapshot, _) = crate::translate::Snapshot::from_yaml(include_str!(
            "../testdata/translate/site-configmap.in.yaml"
        ))
        .unwrap();
        let statuses =
            crate::translate::translate(&snapshot, &crate::translate::Params::default()).statuses;
        let site = ObjectKey::new("SweetySite", "web", "www");
        assert!(programmed(&statuses[&site]), "{:?}", statuses.get(&site));
        let mut g = Gated::start(&snapshot, &statuses, 7).await;
        drain(&mut g.w).await;
        assert!(g.api.writes().is_empty(), "{:?}", g.api.writes());

        g.step(|s| s.last_nack = Some((7, vec![NACK.into()]))).await;
        assert_eq!(g.api.writes().get("SweetySite"), Some(&1));
        let written = g.written(&site);
        assert!(says_rejected(&written), "{written:?}");

        g.step(|s| s.acked = 7).await;
        assert_eq!(g.api.writes().get("SweetySite"), Some(&2));
        let written = &g.api.last()[&site];
        assert!(!written.to_string().contains("rejected"), "{written}");
        assert_eq!(conditions_in(written), translated(&statuses[&site]));
        assert!(g.w.shared.queue().unacked.is_empty());
    }

    #[test]
    fn token_bucket_allows_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 3, t0);
        for _ in 0..3 {
            b.take(t0).unwrap();
        }
        let wait = b.take(t0).unwrap_err();
        assert!(wait > Duration::from_millis(90) && wait <= Duration::from_millis(100));
        // 100 ms later: one token, not more.
        let t1 = t0 + Duration::from_millis(100);
        b.take(t1).unwrap();
        assert!(b.take(t1).is_err());
        // An unused token goes back.
        b.refund();
        b.take(t1).unwrap();
        // A long quiet period refills to the burst only.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            b.take(t2).unwrap();
        }
        assert!(b.take(t2).is_err());
    }

    /// `sweety_controller_objects` lines of a /metrics page, sorted.
    fn objects_series(page: &str) -> Vec<String> {
        let mut v: Vec<String> = page
            .lines()
            .filter(|l| l.starts_with("sweety_controller_objects{"))
            .map(String::from)
            .collect();
        v.sort();
        v
    }

    async fn scrape(addr: std::net::SocketAddr) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        out
    }

    #[tokio::test]
    async fn objects_by_condition_follow_the_offers_on_the_metrics_endpoint() {
        use crate::translate::{Params, Snapshot, TranslateCache};
        // A Gateway, a Service, two routes to it and one to a Service that does not exist:
        // translate's statuses, offered as the reconcile loop does, scraped from /metrics.
        let mut y = String::from(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: sweety}\nspec: {controllerName: sweety.dev/gateway-controller}\n---\n\
apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: app}\n\
spec:\n  gatewayClassName: sweety\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n---\n\
apiVersion: v1\nkind: Service\nmetadata: {name: svc, namespace: app}\nspec: {ports: [{name: http, port: 80, targetPort: 8080}]}\n---\n",
        );
        for (name, svc) in [("a", "svc"), ("b", "svc"), ("c", "missing")] {
            y.push_str(&format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: app}}\n\
spec:\n  parentRefs: [{{name: gw}}]\n  hostnames: [{name}.example.com]\n  rules: [{{backendRefs: [{{name: {svc}, port: 80}}]}}]\n---\n"
            ));
        }
        let (mut s, _) = Snapshot::from_yaml(&y).unwrap();
        let params = Params::default();
        let mut cache = TranslateCache::default();
        let metrics = Arc::new(Metrics::default());
        let q = StatusQueue {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                notify: Notify::new(),
            }),
            metrics: metrics.clone(),
            task: tokio::spawn(async {}),
        };
        let t = cache.update(&s, &params);
        assert_eq!(t.status_changes, StatusChanges::All);
        q.offer(&t.statuses, &t.status_changes, 1, None);
        let health = crate::health::Health::new(metrics.clone());
        let (addr, server) = crate::health::serve("127.0.0.1:0".parse().unwrap(), health)
            .await
            .unwrap();
        let line = |kind: &str, condition: &str, status: &str, n: u64| {
            format!("sweety_controller_objects{{kind=\"{kind}\",condition=\"{condition}\",status=\"{status}\"}} {n}")
        };
        let mut want = vec![
            line("Gateway", "Accepted", "True", 1),
            // No address (no Service for it in this snapshot): not programmed.
            line("Gateway", "Programmed", "False", 1),
            line("Gateway", "ResolvedRefs", "True", 1),
            line("GatewayClass", "Accepted", "True", 1),
            line("HTTPRoute", "Accepted", "True", 3),
            line("HTTPRoute", "ResolvedRefs", "False", 1),
            line("HTTPRoute", "ResolvedRefs", "True", 2),
        ];
        want.sort();
        assert_eq!(objects_series(&scrape(addr).await), want);
        // Route c now points at the Service: one changed status (only it is compared), the
        // False series goes.
        let i = s
            .http_routes
            .iter()
            .position(|r| r.metadata.name.as_deref() == Some("c"))
            .unwrap();
        let mut c = (*s.http_routes[i]).clone();
        c.spec.rules.as_mut().unwrap()[0]
            .backend_refs
            .as_mut()
            .unwrap()[0]
            .name = "svc".into();
        s.http_routes[i] = Arc::new(c);
        let t = cache.update(&s, &params);
        assert!(matches!(&t.status_changes, StatusChanges::Only(k) if k.len() <= 3));
        q.offer(&t.statuses, &t.status_changes, 2, None);
        let mut want = vec![
            line("Gateway", "Accepted", "True", 1),
            // No address (no Service for it in this snapshot): not programmed.
            line("Gateway", "Programmed", "False", 1),
            line("Gateway", "ResolvedRefs", "True", 1),
            line("GatewayClass", "Accepted", "True", 1),
            line("HTTPRoute", "Accepted", "True", 3),
            line("HTTPRoute", "ResolvedRefs", "True", 3),
        ];
        want.sort();
        assert_eq!(objects_series(&scrape(addr).await), want);
        // Route a goes: counted out.
        s.http_routes
            .retain(|r| r.metadata.name.as_deref() != Some("a"));
        let t = cache.update(&s, &params);
        q.offer(&t.statuses, &t.status_changes, 3, None);
        let page = scrape(addr).await;
        assert!(
            page.contains(&line("HTTPRoute", "Accepted", "True", 2)),
            "{page}"
        );
        assert!(
            page.contains(&line("HTTPRoute", "ResolvedRefs", "True", 2)),
            "{page}"
        );
        server.abort();
    }
}
