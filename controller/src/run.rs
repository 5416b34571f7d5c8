//! The reconcile loop: watch events (leading-edge debounced) → snapshot →
//! `TranslateCache::update` (incremental translate) → static content on disk →
//! `Pusher::submit_items_now`
//! → (leader only) per-Gateway Services and statuses, the latter gated by the dataplane's Ack
//! of the submitted generation.
//!
//! Every replica translates and pushes to its own dataplane; only the lease holder writes to the
//! API. A change in the push state (an Ack or a Nack) or in leadership re-runs the status write
//! with the last translation, without translating again.

use crate::gateway_services::GatewayServices;
use crate::health::Health;
use crate::leader::{default_identity, LeaderElector, LeaseOptions};
use crate::metrics::Metrics;
use crate::push::{PushState, Pusher};
use crate::status_writer::{Gate, StatusWriter, FIELD_MANAGER};
use crate::translate::status::Statuses;
use crate::translate::{GatewayService, Params, Snapshot, StaticContent, TranslateCache};
use crate::watch::{object_counts, WatchOptions, Watches};
use crate::Error;
use kube::runtime::events::Reporter;
use kube::Client;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub params: Params,
    pub watch: WatchOptions,
    /// Bursts of watch events within this window become one reconcile.
    pub debounce: Duration,
    /// Leader election; `None` means this replica always writes.
    pub lease: Option<LeaseOptions>,
    /// Longest wait for the initial lists of every watch before the first translate.
    pub initial_sync_timeout: Duration,
}

/// The last translation, kept for status rewrites on Ack and leadership changes.
struct Translated {
    snapshot: Snapshot,
    /// Shared with the translate cache, which updates it in place (dropped before the next
    /// translate so that no copy is made).
    statuses: Arc<Statuses>,
    gateway_services: Vec<GatewayService>,
    generation: u64,
    submitted_at: Instant,
    latency_recorded: bool,
    /// The gate of the last status write for this translation (skip rewrites on no change).
    gate: Option<Gate>,
}

/// Run until `shutdown` resolves.
pub async fn run(
    client: Client,
    options: RunOptions,
    pusher: Pusher,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let metrics = health.metrics.clone();
    let watches = Watches::start(client.clone(), &options.watch).await?;
    if !watches.skipped.is_empty() {
        tracing::info!(kinds = ?watches.skipped, "kinds not served by the cluster are not watched");
    }
    if !watches.wait_ready(options.initial_sync_timeout).await {
        tracing::warn!("not every watch finished its initial list in time; translating anyway");
    }
    let mut changes = watches.changes();
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
    let mut writer = StatusWriter::new(client.clone(), &options.params.controller_name)
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
    let services = GatewayServices::new(
        client.clone(),
        &options.params.namespace,
        options.params.ingress_service.clone(),
        FIELD_MANAGER,
    );
    metrics
        .leader
        .store(u64::from(*is_leader.borrow()), Ordering::Relaxed);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut last: Option<Translated> = None;
    let mut dirty = true;
    // Earliest time the next watch event may reconcile (debounce after the last reconcile).
    let mut next_allowed: Option<Instant> = None;
    // Per-route translations reused across reconciles (see `translate_incremental`).
    let mut cache = TranslateCache::default();
    let mut retry_at: Option<tokio::time::Instant> = None;
    // A closed channel (the pusher or the election task ended) disables its branch.
    let (mut push_open, mut leader_open) = (true, true);
    loop {
        if dirty {
            dirty = false;
            let started = Instant::now();
            next_allowed = Some(started + options.debounce);
            // The last translation's statuses are shared with the cache: let go of them so
            // that the cache updates them in place.
            let prev = last
                .take()
                .map(|p| (p.generation, p.submitted_at, p.latency_recorded));
            let mut t = reconcile(&watches, &options.params, &pusher, &metrics, &mut cache);
            if let Some((_, submitted_at, latency_recorded)) = prev.filter(|p| p.0 == t.generation)
            {
                // Same config, same generation: its push latency is already measured (or pending).
                t.submitted_at = submitted_at;
                t.latency_recorded = latency_recorded;
            }
            last = Some(t);
            let leading = leader_open && *is_leader.borrow();
            metrics.leader.store(u64::from(leading), Ordering::Relaxed);
            if leading {
                let t = last.as_mut().expect("just set");
                let ok_services = sync_services(&services, &t.gateway_services, &metrics).await;
                let state = push_state.borrow().clone();
                let ok_status = write_statuses(&mut writer, t, &state, &metrics).await;
                retry_at = (!(ok_services && ok_status))
                    .then(|| tokio::time::Instant::now() + Duration::from_secs(2));
            }
            metrics.reconcile_duration.observe(started.elapsed());
            metrics.reconciles.fetch_add(1, Ordering::Relaxed);
        }
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut shutdown => break,
            changed = changes.changed() => {
                if changed.is_err() {
                    break;
                }
                // Leading edge: a change after a quiet period is translated at once (the
                // single-change latency); changes within `debounce` of the last reconcile wait
                // for the end of that window, so a burst costs at most one reconcile per window.
                if let Some(at) = next_allowed.filter(|at| *at > Instant::now()) {
                    tokio::time::sleep_until(at.into()).await;
                }
                changes.borrow_and_update();
                dirty = true;
            }
            changed = push_state.changed(), if push_open => {
                if changed.is_err() {
                    tracing::warn!("the push task ended; statuses stay gated on its last state");
                    push_open = false;
                    continue;
                }
                let state = push_state.borrow_and_update().clone();
                if state.acked > 0 {
                    health.ready.store(true, Ordering::Relaxed);
                }
                if let Some(t) = last.as_mut() {
                    if !t.latency_recorded && state.acked >= t.generation {
                        t.latency_recorded = true;
                        metrics.push_latency.observe(t.submitted_at.elapsed());
                    }
                    let gate_changed = t.gate.as_ref() != Some(&Gate::new(&state, t.generation));
                    if leader_open && *is_leader.borrow() && gate_changed {
                        let ok = write_statuses(&mut writer, t, &state, &metrics).await;
                        retry_at = (!ok).then(|| tokio::time::Instant::now() + Duration::from_secs(2));
                    }
                }
            }
            changed = is_leader.changed(), if leader_open => {
                if changed.is_err() {
                    tracing::warn!("the leader election task ended; no longer writing");
                    leader_open = false;
                    writer.forget();
                    continue;
                }
                let leading = *is_leader.borrow_and_update();
                metrics.leader.store(leading as u64, Ordering::Relaxed);
                if leading {
                    tracing::info!("acquired the leader lease; writing statuses and Services");
                    dirty = true;
                } else {
                    tracing::info!("lost the leader lease; no longer writing");
                    writer.forget();
                    retry_at = None;
                    if let Some(t) = last.as_mut() {
                        t.gate = None;
                    }
                }
            }
            _ = retry => {
                retry_at = None;
                dirty = true;
            }
            _ = tick.tick() => {
                health.live.store(watches.running(), Ordering::Relaxed);
            }
        }
    }
    if let Some(l) = leadership {
        l.release().await?;
    }
    Ok(())
}

/// Snapshot → translate → static content → submit.
fn reconcile(
    watches: &Watches,
    params: &Params,
    pusher: &Pusher,
    metrics: &Metrics,
    cache: &mut TranslateCache,
) -> Translated {
    let snapshot = watches.stores.snapshot();
    metrics.set_objects(&object_counts(&snapshot));
    let started = Instant::now();
    let fallback_before = cache.unsupported();
    let output = cache.update(&snapshot, params);
    metrics.translate_duration.observe(started.elapsed());
    metrics.translates.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = write_static_content(&params.content_dir, &output.static_content) {
        tracing::warn!(error = %e, "writing static content failed");
        metrics.error(e.kind());
    }
    collect_static_garbage(&params.content_dir, &output.static_content);
    metrics
        .config_bytes
        .store(output.config.json_len() as u64, Ordering::Relaxed);
    // Bursts are already coalesced by the reconcile loop: no second debounce in the pusher.
    let generation = pusher.submit_items_now(output.config.clone());
    let t = Translated {
        snapshot,
        statuses: output.statuses.clone(),
        gateway_services: output.gateway_services.clone(),
        generation,
        submitted_at: Instant::now(),
        latency_recorded: false,
        gate: None,
    };
    // The cache lives as long as the process: its totals are the counters.
    metrics
        .full_translates
        .store(cache.full_translates(), Ordering::Relaxed);
    metrics
        .plain_translates
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
    t
}

async fn sync_services(
    services: &GatewayServices,
    desired: &[GatewayService],
    metrics: &Metrics,
) -> bool {
    match services.sync(desired).await {
        Ok(report) => {
            if !report.applied.is_empty() || !report.deleted.is_empty() {
                tracing::info!(applied = ?report.applied, deleted = ?report.deleted, "per-Gateway Services synced");
            }
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "syncing per-Gateway Services failed");
            metrics.error(e.kind());
            false
        }
    }
}

async fn write_statuses(
    writer: &mut StatusWriter,
    t: &mut Translated,
    state: &PushState,
    metrics: &Metrics,
) -> bool {
    let gate = Gate::new(state, t.generation);
    let report = writer.write(&t.statuses, &t.snapshot, &gate).await;
    t.gate = (report.errors.is_empty() && !report.not_leader).then_some(gate);
    metrics
        .status_writes
        .fetch_add(report.written.len() as u64, Ordering::Relaxed);
    for (key, e) in &report.errors {
        tracing::warn!(kind = %key.kind, namespace = %key.namespace, name = %key.name, error = %e, "status write failed");
        metrics.error(e.kind());
    }
    report.errors.is_empty()
}

/// Write each static content directory that does not exist yet (directories are named by
/// content hash, so an existing one is complete): files go to a temporary sibling that is then
/// renamed into place. Directories outside `content_dir` and unsafe file names are refused.
pub fn write_static_content(content_dir: &str, content: &[StaticContent]) -> Result<(), Error> {
    let root = Path::new(content_dir);
    for c in content {
        let dir = Path::new(&c.dir);
        if !dir.starts_with(root) || dir.components().any(|p| p.as_os_str() == "..") {
            return Err(io_err(
                &c.dir,
                std::io::Error::other("outside the content directory"),
            ));
        }
        if dir.exists() {
            continue;
        }
        let tmp = std::path::PathBuf::from(format!("{}.tmp{}", c.dir, std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| io_err(&c.dir, e))?;
        for (name, body) in &c.files {
            let safe = !name.is_empty()
                && name != "."
                && name != ".."
                && !name.contains('/')
                && !name.contains('\\');
            if !safe {
                return Err(io_err(
                    name,
                    std::io::Error::other("unsafe static file name"),
                ));
            }
            std::fs::write(tmp.join(name), body).map_err(|e| io_err(name, e))?;
        }
        std::fs::rename(&tmp, dir).map_err(|e| io_err(&c.dir, e))?;
    }
    Ok(())
}

/// Directories each content directory's last reconcile referenced (by content directory).
static REFERENCED: std::sync::Mutex<BTreeMap<String, BTreeSet<String>>> =
    std::sync::Mutex::new(BTreeMap::new());

/// Garbage-collect static content: remove the `<content_dir>/<namespace>/<dir>` directories
/// (and left-over `.tmp` ones) that neither this reconcile's output nor the previous one's
/// references. The previous output's directories are kept for one more reconcile, since the
/// dataplane may still serve that config until it acknowledges the new one. Namespace
/// directories left empty are removed too.
pub fn collect_static_garbage(content_dir: &str, content: &[StaticContent]) {
    let now: BTreeSet<String> = content.iter().map(|c| c.dir.clone()).collect();
    let previous = {
        let mut all = REFERENCED.lock().unwrap_or_else(|p| p.into_inner());
        all.insert(content_dir.to_string(), now.clone())
            .unwrap_or_default()
    };
    let removed = remove_unreferenced(Path::new(content_dir), &now, &previous);
    if removed > 0 {
        tracing::info!(removed, "removed unreferenced static content directories");
    }
}

/// Whether a directory name is one `translate` gives static content (`<name>-<12 hex>`) or a
/// temporary one of [`write_static_content`]: nothing else under the content directory is
/// ever removed, even if it is misconfigured to a shared path.
fn ours(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    let hashed = name.len() > 13
        && name.as_bytes()[name.len() - 13] == b'-'
        && name[name.len() - 12..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let tmp = name.rsplit_once(".tmp").is_some_and(|(head, pid)| {
        !head.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
    });
    hashed || tmp
}

/// Remove `<root>/<ns>/<dir>` not in `keep` or `also_keep`; the number removed.
fn remove_unreferenced(
    root: &Path,
    keep: &BTreeSet<String>,
    also_keep: &BTreeSet<String>,
) -> usize {
    let mut removed = 0;
    let Ok(namespaces) = std::fs::read_dir(root) else {
        return 0;
    };
    for ns in namespaces.flatten() {
        if !ns.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(dirs) = std::fs::read_dir(ns.path()) else {
            continue;
        };
        let mut left = 0;
        for d in dirs.flatten() {
            let path = d.path().to_string_lossy().into_owned();
            if keep.contains(&path) || also_keep.contains(&path) || !ours(&d.file_name()) {
                left += 1;
                continue;
            }
            match std::fs::remove_dir_all(d.path()) {
                Ok(()) => removed += 1,
                Err(e) => {
                    left += 1;
                    tracing::warn!(path, error = %e, "removing static content failed");
                }
            }
        }
        if left == 0 {
            let _ = std::fs::remove_dir(ns.path());
        }
    }
    removed
}

fn io_err(what: &str, source: std::io::Error) -> Error {
    Error::Io {
        what: format!("static content {what}"),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn static_content_is_written_once_and_confined() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().to_str().unwrap();
        let dir = format!("{base}/web/pages.v1-abc123");
        let content = vec![StaticContent {
            dir: dir.clone(),
            files: BTreeMap::from([("index.html".to_string(), "<h1>hi</h1>".to_string())]),
        }];
        write_static_content(base, &content).unwrap();
        assert_eq!(
            std::fs::read_to_string(format!("{dir}/index.html")).unwrap(),
            "<h1>hi</h1>"
        );
        // Already present: left alone.
        std::fs::write(format!("{dir}/index.html"), "kept").unwrap();
        write_static_content(base, &content).unwrap();
        assert_eq!(
            std::fs::read_to_string(format!("{dir}/index.html")).unwrap(),
            "kept"
        );

        let outside = vec![StaticContent {
            dir: "/tmp/elsewhere".into(),
            files: BTreeMap::new(),
        }];
        assert!(write_static_content(base, &outside).is_err());
        let bad_name = vec![StaticContent {
            dir: format!("{base}/def"),
            files: BTreeMap::from([("../x".to_string(), String::new())]),
        }];
        assert!(write_static_content(base, &bad_name).is_err());
    }

    #[test]
    fn unreferenced_static_content_is_collected_after_one_more_reconcile() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().to_str().unwrap();
        let v = |name: &str| StaticContent {
            dir: format!("{base}/web/{name}"),
            files: BTreeMap::from([("index.html".to_string(), name.to_string())]),
        };
        let (v1, v2) = (vec![v("pages-0123456789ab")], vec![v("pages-ba9876543210")]);
        write_static_content(base, &v1).unwrap();
        collect_static_garbage(base, &v1);
        std::fs::create_dir_all(format!("{base}/web/pages-v0.tmp42")).unwrap();
        std::fs::create_dir_all(format!("{base}/web/not-ours")).unwrap();
        write_static_content(base, &v2).unwrap();
        collect_static_garbage(base, &v2);
        // v1 is the previous config's: kept one more reconcile; the stray temp dir is gone.
        assert!(Path::new(&v1[0].dir).exists());
        assert!(!Path::new(&format!("{base}/web/pages-v0.tmp42")).exists());
        collect_static_garbage(base, &v2);
        assert!(!Path::new(&v1[0].dir).exists());
        assert!(Path::new(&v2[0].dir).exists());
        // Nothing referenced any more; what translate never names is left alone.
        std::fs::create_dir_all(format!("{base}/other/app-0123456789ab")).unwrap();
        collect_static_garbage(base, &[]);
        collect_static_garbage(base, &[]);
        assert!(!Path::new(&v2[0].dir).exists());
        assert!(Path::new(&format!("{base}/web/not-ours")).exists());
        assert!(!Path::new(&format!("{base}/other")).exists());
    }
}
