//! The reconcile loop: watch events (paced by [`Pacer`]: a lone change is reconciled at once,
//! a burst in a bounded number of reconciles) → snapshot →
//! `TranslateCache::update` (incremental translate) → static content on disk →
//! `Pusher::submit` → the statuses offered to the status worker and the per-Gateway
//! Services to their own task. Config first: no API write happens inside a reconcile, so a
//! change is pushed without waiting for any status write.
//!
//! Every replica translates and pushes to its own dataplane; only the lease holder writes to the
//! API: the status worker ([`crate::status_worker`]) writes statuses (coalesced per object,
//! rate-limited, `Programmed` gated by the dataplane's Ack of the submitted generation), and a
//! small task syncs the per-Gateway Services after each reconcile (one sync at a time, the
//! latest wanted set). Status writes of our own do not wake the loop: the watches ignore
//! status-only updates ([`crate::watch`]).

use crate::default_certificate::SharedDefaultCertificate;
use crate::gateway_services::GatewayServices;
use crate::health::Health;
use crate::leader::{default_identity, LeaderElector, LeaseOptions};
use crate::metrics::Metrics;
use crate::push::Pusher;
use crate::static_content::{write_static_content, Garbage};
use crate::status_worker::{StatusOptions, StatusQueue};
use crate::status_writer::{StatusWriter, FIELD_MANAGER};
use crate::translate::{GatewayService, Params, TranslateCache};
use crate::watch::{object_counts, WatchOptions, Watches, ROUTE_KINDS};
use crate::Error;
use kube::runtime::events::Reporter;
use kube::Client;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The installation's settings that shape the translated config.
    pub params: Params,
    /// Which namespaces and extra objects are watched.
    pub watch: WatchOptions,
    /// Past the first [`BURST`] reconciles at once, at most one reconcile per this window
    /// ([`Pacer`]): the watch events of a longer burst are coalesced.
    pub debounce: Duration,
    /// Leader election; `None` means this replica always writes.
    pub lease: Option<LeaseOptions>,
    /// Longest wait for the initial lists of every watch before the first translate.
    pub initial_sync_timeout: Duration,
    /// How statuses are written.
    pub status: StatusOptions,
    /// The self-signed default certificate shared by every replica through a Secret
    /// ([`crate::default_certificate`]): read (or created) before the first translation, then
    /// followed like a configured default-certificate Secret, and kept usable by the leader.
    /// `None`: [`Params::default_certificate`] and its Secret as given.
    pub shared_default_certificate: Option<SharedDefaultCertificate>,
}

/// Reconciles the loop may start one right after the other before [`Pacer`] spaces them by
/// the debounce window.
pub const BURST: u32 = 4;

/// When the reconcile loop may start the next reconcile: a token bucket of [`BURST`]
/// reconciles that gains one per `window` (the generic cell rate algorithm). A lone change, or
/// a few in quick succession (a route and its ReferenceGrant, a change right after another),
/// is reconciled as soon as it is seen; a longer burst gets one reconcile per `window`, which
/// covers every watch event that came meanwhile. Bounded: at most `BURST + t / window`
/// reconciles start in any span `t`, and an event waits at most one `window` (plus the
/// reconcile running when it came) before a reconcile that covers it starts.
#[derive(Debug)]
struct Pacer {
    window: Duration,
    /// When the bucket would be full again (the algorithm's theoretical arrival time);
    /// `None` before the first reconcile.
    full_at: Option<Instant>,
}

impl Pacer {
    fn new(window: Duration) -> Pacer {
        Pacer {
            window,
            full_at: None,
        }
    }

    /// The earliest a reconcile asked for at `now` may start: `now` while a token is left.
    fn allowed_at(&self, now: Instant) -> Instant {
        let Some(full_at) = self.full_at else {
            return now;
        };
        let slack = self.window * (BURST - 1);
        full_at.checked_sub(slack).map_or(now, |at| at.max(now))
    }

    /// A reconcile started at `at` takes a token.
    fn started(&mut self, at: Instant) {
        let from = self.full_at.map_or(at, |t| t.max(at));
        self.full_at = Some(from + self.window);
    }
}

/// The config generation last submitted, for the latency metrics.
struct Submitted {
    generation: u64,
    at: Instant,
    /// The first watch event the reconcile covered.
    event_at: Option<Instant>,
    /// Its Ack was seen (latencies recorded).
    recorded: bool,
}

/// Run until `shutdown` resolves.
pub async fn run(
    client: Client,
    options: RunOptions,
    pusher: Pusher,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let mut options = options;
    if let Some(shared) = &options.shared_default_certificate {
        options.params.default_certificate = Some(shared.at_start(&client).await?);
        options.params.default_certificate_secret = Some(shared.key());
        options.watch.default_certificate_secret =
            Some((shared.namespace.clone(), shared.name.clone()));
    }
    let metrics = health.metrics.clone();
    let watches = Watches::start(client.clone(), &options.watch).await?;
    let _ = metrics.watch.set(watches.activity.clone());
    if !watches.skipped.is_empty() {
        tracing::info!(kinds = ?watches.skipped, "kinds not served by the cluster yet: watched once discovery finds them");
    }
    if !watches.wait_ready(options.initial_sync_timeout).await {
        tracing::warn!("not every watch finished its initial list in time; translating anyway");
    }
    let mut changes = watches.changes();
    // The initial lists are in the first snapshot: their end is no change.
    changes.borrow_and_update();
    watches.activity.take_first();
    let mut push_state = pusher.state();
    let (leadership, mut is_leader, _always) = match &options.lease {
        Some(lease) => {
            let l = LeaderElector::new(client.clone(), lease.clone()).spawn();
            let rx = l.watch();
            (Some(l), rx, None)
        }
        None => {
            let (tx, rx) = watch::channel(true);
            (None, rx, Some(tx))
        }
    };
    let writer = StatusWriter::new(client.clone(), &options.params.controller_name)
        .with_leadership(is_leader.clone())
        .with_events(Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(
                options
                    .lease
                    .as_ref()
                    .map(|l| l.identity.clone())
                    .unwrap_or_else(default_identity),
            ),
        });
    let statuses = StatusQueue::spawn(
        writer,
        watches.stores.clone(),
        pusher.state(),
        is_leader.clone(),
        metrics.clone(),
        options.status.clone(),
    );
    let services = GatewayServices::new(
        client.clone(),
        &options.params.namespace,
        options.params.ingress_service.clone(),
        FIELD_MANAGER,
    );
    // `None` until the first reconcile: leading before it (the lease is often won while the
    // initial lists load) must not sync an empty wanted set, which deletes every Service.
    let (services_tx, services_rx) = watch::channel(None);
    let _services_task = AbortOnDrop(tokio::spawn(sync_services_task(
        services,
        services_rx,
        is_leader.clone(),
        metrics.clone(),
    )));
    let _keep_default_certificate = options
        .shared_default_certificate
        .clone()
        .map(|shared| AbortOnDrop(tokio::spawn(shared.keep(client.clone(), is_leader.clone()))));
    metrics.leader.set(u64::from(*is_leader.borrow()));
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut cause: Option<&'static str> = Some("start");
    let mut pacer = Pacer::new(options.debounce);
    let mut carried = Carried::default();
    let mut garbage = Garbage::new(&options.params.content_dir);
    let mut last: Option<Submitted> = None;
    // Watch events of other kinds than routes at the last Services notification.
    let mut services_seen: Option<u64> = None;
    // A closed channel (the pusher or the election task ended) disables its branch.
    let (mut push_open, mut leader_open) = (true, true);
    loop {
        if let Some(why) = cause.take() {
            let started = Instant::now();
            pacer.started(started);
            let first = watches.activity.take_first();
            let why = match (why, first) {
                ("watch", Some((_, kind))) => kind,
                _ => why,
            };
            let (generation, gateway_services) = reconcile(
                &watches,
                &options.params,
                &pusher,
                &metrics,
                &mut carried,
                &mut garbage,
                &statuses,
            )
            .await;
            let submitted_at = Instant::now();
            match last.as_mut().filter(|l| l.generation == generation) {
                // Same config: nothing new to measure.
                Some(_) => {}
                None => {
                    last = Some(Submitted {
                        generation,
                        at: submitted_at,
                        event_at: first.map(|(at, _)| at),
                        recorded: false,
                    })
                }
            }
            // The Services task syncs (it lists the Services and EndpointSlices it owns and
            // applies what differs) only when the wanted Services changed or a watch event of
            // another kind than a route came (a Service, an EndpointSlice, a Gateway...): a
            // route change alone cannot change what it syncs, and costs no API request there.
            let others = watches.activity.passed_except(&ROUTE_KINDS);
            services_tx.send_if_modified(|s| {
                let due = services_seen != Some(others) || s.as_ref() != Some(&gateway_services);
                if due {
                    *s = Some(gateway_services);
                }
                due
            });
            services_seen = Some(others);
            metrics.reconcile_duration.observe(started.elapsed());
            metrics.reconciled(why);
            record_ack(&push_state.borrow(), &mut last, &metrics);
        }
        tokio::select! {
            _ = &mut shutdown => break,
            changed = changes.changed() => {
                if changed.is_err() {
                    break;
                }
                // A change is reconciled at once while the pacer has a token (a lone
                // change always); in a longer burst it waits for the next one, and the
                // events that come meanwhile are in that reconcile too.
                let now = Instant::now();
                let at = pacer.allowed_at(now);
                if at > now {
                    tokio::time::sleep_until(at.into()).await;
                }
                changes.borrow_and_update();
                cause = Some("watch");
            }
            changed = push_state.changed(), if push_open => {
                if changed.is_err() {
                    tracing::warn!("the push task ended; statuses stay gated on its last state");
                    push_open = false;
                    continue;
                }
                let state = push_state.borrow_and_update().clone();
                garbage.collect(state.acked);
                if state.acked > 0 {
                    health.ready.store(true, Ordering::Relaxed);
                }
                record_ack(&state, &mut last, &metrics);
            }
            changed = is_leader.changed(), if leader_open => {
                if changed.is_err() {
                    tracing::warn!("the leader election task ended; no longer writing");
                    leader_open = false;
                    metrics.leader.set(0);
                    continue;
                }
                let leading = *is_leader.borrow_and_update();
                metrics.leader.set(leading as u64);
                if leading {
                    tracing::info!("acquired the leader lease; writing statuses and Services");
                } else {
                    tracing::info!("lost the leader lease; no longer writing");
                }
            }
            _ = tick.tick() => {
                health.live.store(watches.running(), Ordering::Relaxed);
            }
        }
    }
    drop(statuses);
    if let Some(l) = leadership {
        l.release().await?;
    }
    Ok(())
}

/// Record the push latencies of the last submitted generation once the dataplane acked it.
fn record_ack(state: &crate::push::PushState, last: &mut Option<Submitted>, metrics: &Metrics) {
    metrics.submitted_generation.set(state.submitted);
    metrics.acked_generation.set(state.acked);
    metrics.dataplane_connected.set(u64::from(state.connected));
    let Some(s) = last.as_mut().filter(|s| !s.recorded) else {
        return;
    };
    if state.acked < s.generation {
        return;
    }
    s.recorded = true;
    // The pusher's clock reading of the Ack; a Hello saying the generation runs already
    // (no Ack) counts as now.
    let acked_at = state
        .acked_at
        .filter(|at| *at >= s.at)
        .unwrap_or_else(Instant::now);
    metrics
        .push_latency
        .observe(acked_at.saturating_duration_since(s.at));
    if let Some(event) = s.event_at {
        metrics
            .event_to_ack
            .observe(acked_at.saturating_duration_since(event));
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the reconcile loop carries from one reconcile to the next.
#[derive(Default)]
struct Carried {
    /// Per-route translations reused across reconciles (see `translate_incremental`).
    cache: TranslateCache,
    /// The route journal's position of the last snapshot (the next lists what changed since).
    routes_at: Option<u64>,
}

/// Snapshot → translate → static content → submit → offer the statuses. The submitted
/// generation and the per-Gateway Services wanted.
async fn reconcile(
    watches: &Watches,
    params: &Params,
    pusher: &Pusher,
    metrics: &Metrics,
    carried: &mut Carried,
    garbage: &mut Garbage,
    statuses: &StatusQueue,
) -> (u64, Vec<GatewayService>) {
    let snapshot = watches.stores.snapshot_since(carried.routes_at);
    carried.routes_at = snapshot.routes_at;
    let cache = &mut carried.cache;
    metrics.set_objects(&object_counts(&snapshot));
    let started = Instant::now();
    let fallback_before = cache.unsupported();
    let output = cache.update(&snapshot, params);
    metrics.translate_duration.observe(started.elapsed());
    metrics.translates.inc();
    if let Err(e) = write_static_content(&params.content_dir, &output.static_content) {
        tracing::warn!(error = %e, "writing static content failed");
        metrics.error(e.kind());
    }
    metrics.config_bytes.set(output.config.json_len() as u64);
    // Bursts are coalesced before this (the loop's pacer); the pusher sends at once.
    let generation = pusher.submit(output.config.clone());
    // The pusher task, just woken, runs before anything else this task wakes (the status
    // worker, the Services task): otherwise the last task woken runs first on this worker
    // and the pusher waits behind it, or for another worker thread to be woken to take it.
    tokio::task::yield_now().await;
    // Directories only configs older than the one the dataplane runs named go now; the rest
    // when it acknowledges a newer one (the push-state branch of the loop).
    garbage.submitted(generation, &output.static_content);
    garbage.collect(pusher.state().borrow().acked);
    // After the push: the statuses go to the worker (it keeps what changed; the translate
    // cache's statuses are let go before the next translate, which updates them in place).
    // With the created journal's position of the snapshot: the worker writes objects created
    // again under a name only once a translation that saw them is offered.
    statuses.offer(
        &output.statuses,
        &output.status_changes,
        generation,
        snapshot.created_at,
    );
    let gateway_services = output.gateway_services.clone();
    // The cache lives as long as the process: its totals are the counters.
    metrics
        .full_translates
        .inner()
        .store(cache.full_translates(), Ordering::Relaxed);
    metrics
        .plain_translates
        .inner()
        .store(cache.plain_translates(), Ordering::Relaxed);
    match (fallback_before, cache.unsupported()) {
        (before, Some(cause)) if before != Some(cause) => tracing::info!(
            cause = cause.name(),
            in_world = cause.in_world(),
            "incremental translation: plain translation serves (every route is translated)"
        ),
        (Some(_), None) => {
            tracing::info!("incremental translation: the per-virtual-host memo serves again")
        }
        _ => {}
    }
    (generation, gateway_services)
}

/// Sync the per-Gateway Services after each reconcile while leading: one sync at a time, with
/// the latest wanted set; a failure is retried after 2 s. Nothing is synced while `desired` is
/// `None` (no translation yet), whatever the leadership says.
pub async fn sync_services_task(
    services: GatewayServices,
    mut desired: watch::Receiver<Option<Vec<GatewayService>>>,
    mut leading: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) {
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut pending = false;
    loop {
        if pending && *leading.borrow() {
            retry_at = None;
            let want = desired.borrow_and_update().clone();
            if let Some(want) = want {
                metrics.service_syncs.inc();
                match services.sync(&want).await {
                    Ok(report) => {
                        if !report.applied.is_empty() || !report.deleted.is_empty() {
                            tracing::info!(applied = ?report.applied, deleted = ?report.deleted, "per-Gateway Services synced");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "syncing per-Gateway Services failed");
                        metrics.error(e.kind());
                        retry_at = Some(tokio::time::Instant::now() + Duration::from_secs(2));
                    }
                }
            }
        }
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = desired.changed() => {
                if changed.is_err() {
                    return;
                }
                pending = true;
            }
            changed = leading.changed() => {
                if changed.is_err() {
                    return;
                }
                pending = *leading.borrow_and_update();
            }
            _ = retry => pending = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reconcile loop's pacing, with event times as given: the start times of the
    /// reconciles for watch events at `events` (sorted), each reconcile taking `took`. As in
    /// [`run`]: an event seen while the loop is idle asks the pacer; one that comes during a
    /// reconcile is seen when it ends; a reconcile covers every event up to its start.
    fn reconciles(window: Duration, events: &[Instant], took: Duration) -> Vec<Instant> {
        let mut pacer = Pacer::new(window);
        let (mut starts, mut idle_from, mut i) = (Vec::new(), events[0], 0);
        while i < events.len() {
            let at = pacer.allowed_at(events[i].max(idle_from));
            pacer.started(at);
            starts.push(at);
            i += events[i..].partition_point(|e| *e <= at);
            idle_from = at + took;
        }
        starts
    }

    /// A change that comes soon after the previous reconcile (here 5 ms after it, within the
    /// 20 ms window) is reconciled as soon as it is seen, and so are the next few. With
    /// `BURST = 1` (a reconcile per window, what the loop did before) the second change waits
    /// until 20 ms after the first reconcile and this test fails.
    #[test]
    fn a_change_soon_after_another_is_reconciled_at_once() {
        let (t0, ms) = (Instant::now(), Duration::from_millis);
        let events = [t0, t0 + ms(5), t0 + ms(9), t0 + ms(14)];
        let starts = reconciles(ms(20), &events, ms(2));
        assert_eq!(starts, events, "one reconcile per change, none waited");
        // After a quiet window the pacer is ready again.
        let mut pacer = Pacer::new(ms(20));
        for e in events {
            pacer.started(e);
        }
        assert_eq!(pacer.allowed_at(t0 + ms(200)), t0 + ms(200));
        // A window of 0 never waits.
        let burst: Vec<Instant> = (0..100).map(|i| t0 + Duration::from_micros(i)).collect();
        assert_eq!(reconciles(Duration::ZERO, &burst, Duration::ZERO), burst);
    }

    /// A burst (one event per millisecond for 2 s, as when thousands of routes are created)
    /// costs at most `BURST` + one reconcile per 20 ms window, and no event waits more than a
    /// window plus the reconcile running when it came.
    #[test]
    fn a_burst_is_coalesced_into_a_bounded_number_of_reconciles() {
        let (t0, ms) = (Instant::now(), Duration::from_millis);
        let (window, took) = (ms(20), ms(2));
        let events: Vec<Instant> = (0..2000).map(|i| t0 + ms(i)).collect();
        let starts = reconciles(window, &events, took);
        let bound = BURST as usize + 2000 / 20;
        assert!(
            starts.len() <= bound,
            "{} reconciles for 2,000 events, bound {bound}",
            starts.len()
        );
        assert!(starts.len() >= 2000 / 20, "{} reconciles", starts.len());
        for e in &events {
            let covered = starts
                .iter()
                .find(|s| *s >= e)
                .expect("every event is covered");
            assert!(
                *covered - *e <= window + took,
                "an event waited {:?}",
                *covered - *e
            );
        }
        // In any window past the first ones, at most one reconcile starts.
        for pair in starts[BURST as usize..].windows(2) {
            assert!(pair[1] - pair[0] >= window, "{:?}", pair[1] - pair[0]);
        }
    }

    #[test]
    fn push_latency_runs_from_submit_to_the_ack_and_is_recorded_once() {
        let metrics = Metrics::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut last = Some(Submitted {
            generation: 3,
            at: t0,
            event_at: Some(t0 - ms(10)),
            recorded: false,
        });
        let state = |acked, acked_at| crate::push::PushState {
            acked,
            acked_at: Some(acked_at),
            ..Default::default()
        };
        // An Ack of an earlier generation says nothing about this one.
        record_ack(&state(2, t0 + ms(5)), &mut last, &metrics);
        assert_eq!(metrics.push_latency.count(), 0);
        // Its Ack, as the pusher received it 40 ms after the submit (not when this runs).
        record_ack(&state(3, t0 + ms(40)), &mut last, &metrics);
        assert_eq!(metrics.push_latency.count(), 1);
        assert_eq!(metrics.push_latency.sum(), ms(40));
        assert_eq!(metrics.event_to_ack.sum(), ms(50));
        // Later push-state changes (a later Ack, a reconnect) do not record it again.
        record_ack(&state(4, t0 + ms(90)), &mut last, &metrics);
        assert_eq!(metrics.push_latency.count(), 1);
        assert_eq!(metrics.event_to_ack.count(), 1);
        // The gauges follow every push-state change: an alert compares them.
        let behind = crate::push::PushState {
            connected: true,
            submitted: 6,
            acked: 4,
            ..Default::default()
        };
        record_ack(&behind, &mut last, &metrics);
        let text = metrics.render();
        for line in [
            "sweety_controller_submitted_generation 6\n",
            "sweety_controller_acked_generation 4\n",
            "sweety_controller_dataplane_connected 1\n",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
    }
}
