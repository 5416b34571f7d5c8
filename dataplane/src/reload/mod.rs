//! Hot reload, through one entry point: [`Runtime::apply`] takes a [`Change`] (a config file,
//! a whole config pushed by the controller, or a delta on the one pushed last), validates and
//! builds what it needs (`build`), binds the listeners it adds (`sockets`), swaps the
//! [`Snapshot`] held in [`Shared`] (both in [`crate::state`]), starts the new listeners
//! ([`crate::listen`]) and drains the removed ones. It keeps the base of the next delta: the
//! config last pushed whole or by delta, while it is the one serving.
//!
//! Hot reload guarantees:
//! * a config is validated and fully built before anything changes; any error rejects it
//!   whole, every error is reported, and the last good config keeps serving;
//! * the swap is one atomic store: new requests use the new snapshot, in-flight requests
//!   finish on the one they pinned;
//! * listener sockets are keyed by bind address, so a listener kept across reloads keeps its
//!   socket and its established connections; only removed listeners are closed, gracefully;
//!   the same holds for the UDP (QUIC) socket of an HTTPS listener serving HTTP/3, which is
//!   bound on the listener's TCP port and added or removed with the listener or its `http3`;
//! * a removed listener's TCP socket is closed before the apply that removes it returns (its
//!   connections drain on their own sockets), so the next config can bind its port at once; a
//!   removed HTTP/3 endpoint keeps its UDP socket while its connections (which share it) drain,
//!   unless a later config binds an address that contends with it: then the reload closes it,
//!   ending them, right before that bind. A port held by another process is a bind error;
//! * certificates are part of the snapshot, so changed ones apply to new handshakes; a kept
//!   QUIC endpoint gets the new TLS and transport config for its new handshakes;
//! * a delta applies only onto the config it was made from, still serving; the result must
//!   hash to what the delta says, then it is validated, built and swapped like a whole config
//!   (only what it changed is validated and compiled when it keeps the listeners, the
//!   settings and the backend names).

mod build;
mod sockets;

use crate::access_log::AccessLog;
use crate::limits::Backpressure;
use crate::metrics::Metrics;
use crate::state::{Shared, Snapshot};
use crate::static_files::StaticFiles;
use arc_swap::ArcSwap;
use sockets::Sockets;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use sweety_config::delta::{ConfigDelta, Digests, HashCache, ListEdit, NameIndex};
use sweety_config::{Config, Limits, Route};

/// Options fixed for the life of the process.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Access log settings.
    pub access_log: sweety_config::AccessLog,
    /// Bytes of small static files kept in memory.
    pub static_cache_bytes: usize,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            access_log: sweety_config::AccessLog::default(),
            static_cache_bytes: 32 * 1024 * 1024,
        }
    }
}

/// What [`Runtime::apply_config`] is told about the new config relative to the one serving
/// now, so that unchanged parts are neither validated nor compiled again.
struct Reuse<'a> {
    /// True for the name of a virtual host that is new or changed; every other virtual host
    /// is equal to the serving one of the same name.
    changed_vhost: &'a (dyn Fn(&str) -> bool + Sync),
    /// Listeners and backend names are those of the serving config: unchanged virtual hosts
    /// (checked against them) need no validation.
    same_context: bool,
}

/// Why a config was rejected. The running config is untouched in every case.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Validation or build errors, every one of them, each `path: message`.
    #[error("config rejected:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
    /// A new listener could not be bound.
    #[error("config rejected: listeners[{index}] ({name}): cannot bind {addr}: {source}")]
    Bind {
        /// Listener index.
        index: usize,
        /// Listener name.
        name: String,
        /// Address.
        addr: SocketAddr,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl From<sweety_config::ValidationErrors> for ApplyError {
    fn from(errs: sweety_config::ValidationErrors) -> ApplyError {
        ApplyError::Invalid(errs.0.iter().map(|e| e.to_string()).collect())
    }
}

impl ApplyError {
    /// Every error as `path: message` lines.
    pub fn messages(&self) -> Vec<String> {
        match self {
            ApplyError::Invalid(v) => v.clone(),
            other => vec![other.to_string()],
        }
    }
}

/// A change to the serving config: what [`Runtime::apply`] takes.
#[derive(Debug)]
pub enum Change {
    /// A whole config from a file (or a test): validated in full and applied. It does not
    /// become the base of a delta.
    File(Box<Config>),
    /// A whole config pushed by the controller (`Apply`), as `generation`: its routes move
    /// into the route table (it is not held twice while it is built), and once it serves it
    /// is the base of the next [`Change::Delta`].
    Full {
        /// The generation it is applied as.
        generation: u64,
        /// The config.
        config: Box<Config>,
    },
    /// A delta pushed by the controller (`ApplyDelta`) onto generation `base`, as
    /// `generation`. Refused unless `base` is the config last pushed and still serving.
    Delta {
        /// The generation of the result.
        generation: u64,
        /// The generation it applies onto.
        base: u64,
        /// The delta.
        delta: Box<ConfigDelta>,
    },
}

impl From<Config> for Change {
    fn from(config: Config) -> Change {
        Change::File(Box::new(config))
    }
}

/// What an applied change may have taken out of the config, for the metrics' labels
/// ([`Runtime::forget_labels`]).
enum Gone {
    /// A whole config was built: any route or backend may be gone.
    Any,
    /// A patch ([`build::patched`]), which keeps the backend names: the names of the routes
    /// of its changed virtual hosts that the new ones do not have.
    Patch(Vec<Arc<str>>),
}

/// The config last pushed with its digests: the base of a [`Change::Delta`], which consumes
/// it (unchanged items are moved into the result, not copied). Its virtual hosts carry no
/// routes: the serving route table holds those (compiled, with the route itself), so keeping
/// a second copy of thousands of routes would only cost memory; they are taken back from the
/// table when a whole config is needed ([`with_routes`]). Its generation is
/// `config.generation` ([`Base::generation`]).
struct Base {
    config: Config,
    digests: Digests,
    /// Position of each virtual host by name, kept in step with `config` by
    /// [`ConfigDelta::apply_indexed`](sweety_config::delta::ConfigDelta::apply_indexed).
    index: NameIndex,
    /// Chunk digests of the tree hash, kept in step with `digests`.
    cache: HashCache,
    /// The serving snapshot's config when this one was applied: the base is only used while
    /// that is still what serves.
    serving: Arc<Config>,
}

impl Base {
    /// The generation it was applied as.
    fn generation(&self) -> u64 {
        self.config.generation
    }
}

/// The dataplane runtime: applies changes and runs listeners.
pub struct Runtime {
    /// Shared state.
    pub shared: Arc<Shared>,
    running: tokio::sync::Mutex<Sockets>,
    /// The base of the next delta.
    base: Mutex<Option<Base>>,
}

impl Runtime {
    /// Creates a runtime serving nothing until the first [`Runtime::apply`]. Must be called
    /// inside a tokio runtime.
    pub fn new(opts: RuntimeOptions) -> std::io::Result<Runtime> {
        let metrics = Arc::new(Metrics::default());
        let limits = Limits::default();
        let access_log = if opts.access_log.enabled {
            AccessLog::start(
                opts.access_log.path.clone(),
                opts.access_log.buffer_lines as usize,
                opts.access_log.format,
                metrics.clone(),
            )?
        } else {
            AccessLog::disabled(metrics.clone())
        };
        let shared = Arc::new(Shared {
            current: ArcSwap::from_pointee(Snapshot::empty(metrics.clone())),
            swaps: AtomicU64::new(0),
            backpressure: Backpressure::new(
                limits.max_connections as usize,
                limits.max_requests_in_flight as usize,
                metrics.clone(),
            ),
            static_files: StaticFiles::new(opts.static_cache_bytes),
            access_log,
            tracer: arc_swap::ArcSwapOption::empty(),
            ready: AtomicBool::new(false),
            rate_zones: crate::access::Zones::default(),
            cache: Arc::new(crate::cache::Cache::new(
                sweety_config::CacheSettings::default(),
                metrics.clone(),
            )),
            client_conns: Arc::default(),
            client_requests: Arc::default(),
            quic_send_budget: Arc::default(),
            quic_sent_state: Arc::new(quinn_proto::SentStateTotal::new(
                sweety_config::Http3::default().send_budget,
            )),
            read_ahead_total: Arc::new(crate::static_files::ReadAheadTotal::new(
                limits.static_read_ahead_total,
            )),
            listener_limits: Mutex::new(HashMap::new()),
            metrics,
        });
        Ok(Runtime {
            shared,
            running: tokio::sync::Mutex::new(Sockets::default()),
            base: Mutex::new(None),
        })
    }

    /// Applies `change` (a [`Config`] converts into [`Change::File`]): validates and builds
    /// the new config, binds its new listeners, swaps it in, starts and drains listeners. On
    /// error nothing changes and the last good config keeps serving. Every call is counted
    /// once in the reload metrics.
    pub async fn apply(&self, change: impl Into<Change>) -> Result<(), ApplyError> {
        let started = std::time::Instant::now();
        let result = match change.into() {
            Change::File(config) => self
                .apply_config(&config, None, None, None)
                .await
                .map(|()| Gone::Any),
            Change::Full { generation, config } => self
                .apply_full(generation, config)
                .await
                .map(|()| Gone::Any),
            Change::Delta {
                generation,
                base,
                delta,
            } => self.apply_delta(generation, base, *delta).await,
        };
        self.shared
            .metrics
            .config_apply
            .0
            .observe(started.elapsed());
        if let Ok(gone) = &result {
            self.forget_labels(gone);
        }
        self.counted(result.map(|_| ()))
    }

    /// After a config serves: drops the request series of the routes it no longer has, and
    /// (over the backend label cap) the labels of the backends it no longer has, so that the
    /// caps count what is served. Both passes look at the whole config, so a patch (which
    /// keeps the backend names) has the routes' pass only when it took out a route that has
    /// a series: a one-route change of a 5,000-route config then costs no pass over the 5,000
    /// routes and no emptied lookup map (before, every apply had both once 500 routes had
    /// had traffic, which filled the route label cap). A series made after its route was taken
    /// out (by a request still in flight then) stays until the next pass.
    fn forget_labels(&self, gone: &Gone) {
        let m = &self.shared.metrics;
        let (routes, backends) = match gone {
            Gone::Any => (true, true),
            Gone::Patch(routes) => (routes.iter().any(|r| m.requests.has_route(r)), false),
        };
        if backends && m.backend_labels_full() {
            let snap = self.shared.snapshot();
            m.retain_backend_labels(&snap.upstreams.names().collect());
        }
        if routes {
            let snap = self.shared.snapshot();
            let live: std::collections::HashSet<&str> =
                snap.routes.entries().map(|e| &*e.name).collect();
            m.requests.retain_routes(&live);
        }
    }

    /// A copy of the whole config last pushed (the base of the next delta), with its
    /// generation; `None` before the first one, after a rejected delta, or once another
    /// config serves.
    pub fn applied_config(&self) -> Option<Config> {
        let slot = self.base.lock().unwrap_or_else(|e| e.into_inner());
        let b = slot.as_ref()?;
        let serving = self.shared.snapshot();
        let mut config = b.config.clone();
        with_routes(&mut config, &serving.routes, &|_| true);
        Some(config)
    }

    /// Counts an apply's outcome in the reload metrics, and passes it on.
    fn counted(&self, result: Result<(), ApplyError>) -> Result<(), ApplyError> {
        let m = &self.shared.metrics;
        match &result {
            Ok(()) => m.reloads_ok.fetch_add(1, Relaxed),
            Err(_) => m.reloads_failed.fetch_add(1, Relaxed),
        };
        result
    }

    /// Records the end of validity of every certificate `config` serves, for the metrics.
    fn record_certificates(&self, config: &Config) {
        let mut out = Vec::new();
        for l in &config.listeners {
            let Some(tls) = &l.tls else { continue };
            for c in &tls.certificates {
                let at = crate::tls::read_pem(&c.cert, "")
                    .ok()
                    .and_then(|pem| crate::tls::not_after(&pem));
                if let Some(at) = at {
                    let host = c.hostnames.first().cloned().unwrap_or_else(|| "-".into());
                    out.push((l.name.clone(), host, at));
                }
            }
        }
        out.sort();
        out.dedup();
        out.truncate(crate::metrics::MAX_CERTIFICATES);
        *self
            .shared
            .metrics
            .certificates
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = out;
    }

    /// Starts, replaces or stops the tracer to match `wanted` (an equal config keeps the
    /// running tracer and its queue). A replaced tracer's exporter sends what it queued and
    /// ends when the last request holding it finishes.
    fn configure_tracing(&self, wanted: Option<&sweety_config::Tracing>) {
        let slot = &self.shared.tracer;
        if slot.load().as_deref().map(crate::trace::Tracer::config) == wanted {
            return;
        }
        let next = wanted.and_then(|t| {
            crate::trace::Tracer::start(t, self.shared.metrics.clone())
                .map_err(|e| tracing::warn!(error = %e, "tracing not started"))
                .ok()
        });
        slot.store(next);
    }

    /// Makes `snapshot` the serving one: from here new connections and requests use it. With
    /// `new_settings` the response cache bounds and the backpressure limits follow its
    /// settings first (a patch keeps the settings of the snapshot it replaces, so it leaves
    /// them alone).
    fn publish(&self, snapshot: Snapshot, new_settings: bool) {
        let generation = snapshot.config.generation;
        let limits = new_settings.then(|| {
            self.record_certificates(&snapshot.config);
            self.configure_tracing(snapshot.config.tracing.as_ref());
            self.shared.metrics.retain_listeners(
                &snapshot
                    .config
                    .listeners
                    .iter()
                    .map(|l| l.name.as_str())
                    .collect(),
            );
            self.shared.cache.configure(&snapshot.config.cache);
            snapshot.config.limits.clone()
        });
        self.shared.store(snapshot);
        if let Some(limits) = limits {
            self.shared.backpressure.resize(
                limits.max_connections as usize,
                limits.max_requests_in_flight as usize,
            );
            self.shared
                .read_ahead_total
                .set_limit(limits.static_read_ahead_total);
        }
        self.shared
            .metrics
            .config_generation
            .store(generation, Relaxed);
        self.shared.ready.store(true, Relaxed);
    }

    /// [`Change::Full`]: the routes of `config` move into the route table instead of being
    /// copied; once it serves, it is kept (without its routes) as the base of the next delta.
    async fn apply_full(&self, generation: u64, mut config: Box<Config>) -> Result<(), ApplyError> {
        config.generation = generation;
        let digests = Digests::of(&config);
        let hash = digests.hash();
        let result = match config.validate() {
            Err(errs) => Err(errs.into()),
            Ok(()) => {
                let routes = config
                    .virtual_hosts
                    .iter_mut()
                    .map(|v| std::mem::take(&mut v.routes))
                    .collect();
                self.apply_config(&config, Some(hash), None, Some(routes))
                    .await
            }
        };
        for v in &mut config.virtual_hosts {
            v.routes = Vec::new();
        }
        result?;
        // Validated: names are unique.
        let index = NameIndex::of("virtual_hosts", &config.virtual_hosts).ok();
        let index = index.map(|i| (i, HashCache::of(&digests)));
        // Kept as the base of the next delta: without the spare capacity of decoding.
        config.virtual_hosts.shrink_to_fit();
        for v in &mut config.virtual_hosts {
            v.hostnames.shrink_to_fit();
            v.listeners.shrink_to_fit();
        }
        self.keep_base(generation, *config, digests, index);
        Ok(())
    }

    /// [`Change::Delta`]: applies `delta` onto the base when that is generation `base` and
    /// still serving. A delta that keeps the listeners, the settings and the backend names is
    /// a patch ([`Runtime::apply_patch`]); any other is applied as a whole config reusing
    /// the unchanged virtual hosts. The result is the next base.
    async fn apply_delta(
        &self,
        generation: u64,
        base: u64,
        delta: ConfigDelta,
    ) -> Result<Gone, ApplyError> {
        // The base must be the config serving now, pushed here (not merely one with the same
        // generation number).
        let serving = self.shared.snapshot().config.clone();
        let taken = {
            let mut slot = self.base.lock().unwrap_or_else(|e| e.into_inner());
            let usable = slot
                .as_ref()
                .is_some_and(|b| b.generation() == base && Arc::ptr_eq(&b.serving, &serving));
            if usable {
                slot.take()
            } else {
                None
            }
        };
        let Some(b) = taken else {
            return Err(ApplyError::Invalid(vec![format!(
                "delta against generation {base}, but the serving config (generation {}) \
                 is not that one as applied over this socket; send the full config",
                serving.generation
            )]));
        };
        // From here the delta consumes the base: if anything below fails, the next delta
        // is refused too, and the controller sends the full config after this Nack.
        let Base {
            mut config,
            mut digests,
            mut index,
            mut cache,
            ..
        } = b;
        let same_context = same_context(&delta, &config);
        let upserted = delta.upserted_vhost_names();
        let applied = delta
            .apply_indexed(&mut config, &mut digests, &mut index, &mut cache)
            .map_err(|e| ApplyError::Invalid(vec![format!("delta: {e}")]))?;
        config.generation = generation;
        let patch = match &applied.virtual_hosts {
            ListEdit::Patch(p) if same_context && !applied.changed.settings => Some(p),
            _ => None,
        };
        let gone = if let Some(edit) = patch {
            // Only what the delta carried is validated and compiled.
            let gone = self
                .apply_patch(&config, applied.hash, edit, applied.changed.backends)
                .await?;
            for i in edit.changed_positions(config.virtual_hosts.len()) {
                config.virtual_hosts[i].routes = Vec::new();
            }
            gone
        } else {
            if !same_context {
                // Every virtual host is validated again: give the unchanged ones their
                // routes.
                let serving = self.shared.snapshot();
                with_routes(&mut config, &serving.routes, &|name| {
                    !upserted.contains(name)
                });
            }
            let reuse = Reuse {
                changed_vhost: &|name| upserted.contains(name),
                same_context,
            };
            self.apply_config(&config, Some(applied.hash), Some(reuse), None)
                .await?;
            for v in &mut config.virtual_hosts {
                v.routes = Vec::new();
            }
            Gone::Any
        };
        self.keep_base(generation, config, digests, Some((index, cache)));
        Ok(gone)
    }

    /// Keeps `config` (applied as `generation`, without its routes) as the base of the next
    /// delta, if it is what serves now.
    fn keep_base(
        &self,
        generation: u64,
        mut config: Config,
        digests: Digests,
        index: Option<(NameIndex, HashCache)>,
    ) {
        config.generation = generation;
        let serving = self.shared.snapshot().config.clone();
        if let (true, Some((index, cache))) = (serving.generation == generation, index) {
            *self.base.lock().unwrap_or_else(|e| e.into_inner()) = Some(Base {
                config,
                digests,
                index,
                cache,
                serving,
            });
        }
    }

    /// Applies `config`, the serving config with a delta applied that changed neither the
    /// settings nor the listeners nor the backend names: `edit` says how its virtual host list
    /// changed from the serving one, and `backends_changed` whether any backend did. Only
    /// what changed is validated and compiled; listeners, their TLS and sockets, and (unless
    /// backends changed) the upstreams are kept as they are. `hash` is the config's content
    /// hash. On error nothing changes. A reordered list is no patch: apply it with
    /// [`Runtime::apply_config`].
    async fn apply_patch(
        &self,
        config: &Config,
        hash: String,
        edit: &sweety_config::delta::ListPatch,
        backends_changed: bool,
    ) -> Result<Gone, ApplyError> {
        let changed = edit.changed_positions(config.virtual_hosts.len());
        config.validate_patch(&changed, backends_changed)?;
        // Serialises with other applies (no socket changes here).
        let _sockets = self.running.lock().await;
        let prev = self.shared.snapshot();
        let (snapshot, routes) =
            build::patched(&self.shared, &prev, config, hash, edit, backends_changed)?;
        self.publish(snapshot, false);
        if backends_changed {
            self.shared.snapshot().upstreams.start_health_checks();
        }
        Ok(Gone::Patch(routes))
    }

    /// Validates (unless `taken` holds the routes of an already validated `config`), builds,
    /// binds the new listeners, swaps, then starts the new listeners and drains the removed
    /// ones. `hash` is the config's content hash when the caller has it; `reuse` says which
    /// virtual hosts of the serving snapshot can be taken as they are.
    async fn apply_config(
        &self,
        config: &Config,
        hash: Option<String>,
        reuse: Option<Reuse<'_>>,
        taken: Option<Vec<Vec<sweety_config::Route>>>,
    ) -> Result<(), ApplyError> {
        let prev = self.shared.snapshot();
        let build::Compiled {
            routes,
            upstreams,
            views,
        } = build::compile(&self.shared, &prev, config, reuse.as_ref(), taken)?;

        let mut sockets = self.running.lock().await;
        let fresh = sockets.bind_new(&views)?;
        let listeners = build::listener_views(
            &self.shared,
            config,
            &views,
            &|key, configured| sockets.port(&fresh, key, configured),
            &|key| sockets.quic_up(&fresh, key),
        );
        let quic_configs: HashMap<_, quinn::ServerConfig> = views
            .into_iter()
            .filter_map(|(_, l, _, q, _)| Some((sockets::bind_key(l), q?)))
            .collect();
        let snapshot = build::snapshot(&self.shared, config, hash, routes, upstreams, listeners);

        // Swap.
        self.publish(snapshot, true);

        // Start new listeners, stop removed ones.
        sockets.start(&self.shared, fresh, quic_configs);
        let snap = self.shared.snapshot();
        snap.upstreams.start_health_checks();
        sockets.drain_removed(&snap);
        Ok(())
    }

    /// Addresses the listeners are bound to, by listener name.
    pub async fn bound(&self) -> HashMap<String, SocketAddr> {
        let running = self.running.lock().await;
        let snap = self.shared.snapshot();
        snap.by_key
            .iter()
            .filter_map(|(k, v)| running.local(k).map(|a| (v.name.to_string(), a)))
            .collect()
    }

    /// UDP addresses of the listeners serving HTTP/3, by listener name.
    pub async fn bound_quic(&self) -> HashMap<String, SocketAddr> {
        let running = self.running.lock().await;
        let snap = self.shared.snapshot();
        snap.by_key
            .iter()
            .filter_map(|(k, v)| running.local_quic(k).map(|a| (v.name.to_string(), a)))
            .collect()
    }

    /// Stops accepting on every listener and waits (up to the drain timeout) for open
    /// connections to finish their requests.
    pub async fn shutdown(&self) {
        let mut running = self.running.lock().await;
        let tasks = running.stop_all();
        let drain = self.shared.snapshot().config.limits.drain_timeout.get();
        let _ = tokio::time::timeout(
            drain + std::time::Duration::from_secs(1),
            futures_util::future::join_all(tasks),
        )
        .await;
    }
}

/// True when `delta` keeps the listeners, the backend names and the user set names of
/// `base` (backends and user sets may be replaced, not added or removed): then unchanged
/// virtual hosts, checked against those, need no validation. Linear in the backends, the
/// user sets and the delta's upserts.
fn same_context(delta: &ConfigDelta, base: &Config) -> bool {
    if !delta.listeners.is_empty() || !delta.backends.remove.is_empty() {
        return false;
    }
    if let Some(settings) = &delta.settings {
        let names = |c: &Config| -> Vec<String> {
            let mut n: Vec<String> = c.user_sets.iter().map(|s| s.name.clone()).collect();
            n.sort_unstable();
            n
        };
        if names(settings) != names(base) {
            return false;
        }
    }
    if delta.backends.upsert.is_empty() {
        return true;
    }
    let names: std::collections::HashSet<&str> =
        base.backends.iter().map(|b| b.name.as_str()).collect();
    delta
        .backends
        .upsert
        .iter()
        .all(|u| names.contains(u.name.as_str()))
}

/// Fills in the routes of the virtual hosts for which `fill(name)` is true from the compiled
/// virtual host of the same name in `table`.
fn with_routes(
    config: &mut Config,
    table: &crate::router::RouteTable,
    fill: &dyn Fn(&str) -> bool,
) {
    let compiled: std::collections::HashMap<&str, &[crate::router::RouteEntry]> =
        table.vhost_entries().collect();
    for v in &mut config.virtual_hosts {
        if let Some(entries) = compiled.get(v.name.as_str()).filter(|_| fill(&v.name)) {
            v.routes = entries.iter().map(|e| Route::clone(&e.route)).collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sweety_config::Backend;

    fn runtime() -> Runtime {
        Runtime::new(RuntimeOptions {
            access_log: sweety_config::AccessLog {
                enabled: false,
                ..sweety_config::AccessLog::default()
            },
            ..RuntimeOptions::default()
        })
        .unwrap()
    }

    fn config(generation: u64, vhosts: &[&str]) -> Config {
        let mut c = Config::from_yaml(
            "listeners: [{name: web, address: 127.0.0.1, port: 0, protocol: http, http3: false}]\n\
             virtual_hosts: [{name: t, hostnames: [t.test], routes: [{name: r, \
             action: {fixed: {status: 200, body: x}}}]}]",
        )
        .unwrap();
        let template = c.virtual_hosts.pop().unwrap();
        c.virtual_hosts = vhosts
            .iter()
            .map(|n| {
                let mut v = template.clone();
                v.name = n.to_string();
                v.hostnames = vec![format!("{n}.test")];
                v
            })
            .collect();
        c.generation = generation;
        c
    }

    /// (reloads ok, reloads failed, published generation, ready).
    fn counters(rt: &Runtime) -> (u64, u64, u64, bool) {
        let m = &rt.shared.metrics;
        (
            m.reloads_ok.load(Relaxed),
            m.reloads_failed.load(Relaxed),
            m.config_generation.load(Relaxed),
            rt.shared.ready.load(Relaxed),
        )
    }

    /// Every way in (a file, a pushed config, a delta: patch or not, and a delta refused before
    /// it is built) counts its reload once, maps validation errors to `path: message` lines
    /// and publishes its snapshot.
    #[tokio::test]
    async fn every_change_counts_maps_errors_and_publishes() {
        let rt = runtime();
        assert_eq!(counters(&rt), (0, 0, 0, false));
        rt.apply(config(1, &["a", "b"])).await.unwrap();
        assert_eq!(counters(&rt), (1, 0, 1, true));
        assert!(rt.applied_config().is_none(), "a file is no delta base");

        let mut bad = config(2, &["a"]);
        bad.virtual_hosts[0].routes[0].name = String::new();
        let err = rt.apply(bad.clone()).await.unwrap_err();
        assert!(
            err.messages()[0].starts_with("virtual_hosts[0].routes[0].name"),
            "{err}"
        );
        assert_eq!(counters(&rt), (1, 1, 1, true));
        let full = |generation, config: &Config| Change::Full {
            generation,
            config: Box::new(config.clone()),
        };
        let err = rt.apply(full(2, &bad)).await.unwrap_err();
        assert!(
            err.messages()[0].starts_with("virtual_hosts[0].routes[0].name"),
            "{err}"
        );
        assert_eq!(counters(&rt), (1, 2, 1, true));
        let good = config(3, &["a", "b"]);
        rt.apply(full(3, &good)).await.unwrap();
        assert_eq!(counters(&rt), (2, 2, 3, true));
        assert_eq!(rt.applied_config(), Some(good.clone()));

        // A delta that patches: `b` replaced (new hostname), `c` appended.
        let mut next = config(4, &["a", "b", "c"]);
        next.virtual_hosts[1].hostnames = vec!["b2.test".into()];
        let delta = |from: &Config, to: &Config| {
            let (fd, td) = (Digests::of(from), Digests::of(to));
            Box::new(ConfigDelta::between(from, &fd, to, &td).unwrap())
        };
        let d = delta(&good, &next);
        assert!(same_context(&d, &good));
        rt.apply(Change::Delta {
            generation: 4,
            base: 3,
            delta: d,
        })
        .await
        .unwrap();
        assert_eq!(counters(&rt), (3, 2, 4, true));
        let snap = rt.shared.snapshot();
        assert_eq!(snap.config.generation, 4);
        assert_eq!(snap.hash, next.content_hash());
        assert_eq!(snap.routes.vhost_name("web", "b2.test"), Some("b"));
        assert_eq!(snap.routes.vhost_name("web", "c.test"), Some("c"));
        assert_eq!(snap.virtual_host_count, 3);
        assert_eq!(rt.applied_config(), Some(next.clone()));

        // An invalid patch: counted, mapped, and the last good snapshot keeps serving.
        let mut broken = next.clone();
        broken.generation = 5;
        broken.virtual_hosts[2].routes[0].name = String::new();
        let err = rt
            .apply(Change::Delta {
                generation: 5,
                base: 4,
                delta: delta(&next, &broken),
            })
            .await
            .unwrap_err();
        assert!(
            err.messages()[0].starts_with("virtual_hosts[2].routes[0].name"),
            "{err}"
        );
        assert_eq!(counters(&rt), (3, 3, 4, true));
        assert_eq!(rt.shared.snapshot().config.generation, 4);

        // The rejected delta consumed the base: the next one is refused before it is built,
        // and counted once.
        let err = rt
            .apply(Change::Delta {
                generation: 5,
                base: 4,
                delta: delta(&next, &next),
            })
            .await
            .unwrap_err();
        assert!(err.messages()[0].contains("send the full config"), "{err}");
        assert_eq!(counters(&rt), (3, 4, 4, true));

        // A delta that adds a listener is no patch: applied as a whole config, reusing the
        // unchanged virtual hosts.
        rt.apply(full(6, &next)).await.unwrap();
        let mut wider = next.clone();
        let mut l = wider.listeners[0].clone();
        l.name = "web2".into();
        wider.listeners.push(l);
        let d = delta(&next, &wider);
        assert!(!same_context(&d, &next));
        rt.apply(Change::Delta {
            generation: 7,
            base: 6,
            delta: d,
        })
        .await
        .unwrap();
        assert_eq!(counters(&rt), (5, 4, 7, true));
        assert_eq!(rt.bound().await.len(), 2);
        let mut want = wider.clone();
        want.generation = 7;
        assert_eq!(rt.applied_config(), Some(want));
        rt.shutdown().await;
    }

    /// A user set is part of the settings: a delta that drops one an unchanged virtual host
    /// names is validated against every virtual host and refused (the serving config stays);
    /// one that only replaces a set's users keeps the context and applies.
    #[tokio::test]
    async fn a_delta_dropping_a_user_set_an_unchanged_virtual_host_names_is_refused() {
        use sweety_config::{BasicAuth, BasicAuthUser, Filter, UserSet};
        let rt = runtime();
        let set = |name: &str, user: &str| UserSet {
            name: name.into(),
            users: vec![BasicAuthUser {
                name: user.into(),
                hash: "{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=".into(),
            }],
        };
        let mut good = config(1, &["a", "b"]);
        good.user_sets = vec![set("staff", "alice")];
        good.virtual_hosts[0].routes[0].filters = vec![Filter::BasicAuth(BasicAuth {
            realm: "r".into(),
            users: Vec::new(),
            user_set: Some("staff".into()),
        })];
        let full = |generation, config: &Config| Change::Full {
            generation,
            config: Box::new(config.clone()),
        };
        let delta = |from: &Config, to: &Config| {
            let (fd, td) = (Digests::of(from), Digests::of(to));
            Box::new(ConfigDelta::between(from, &fd, to, &td).unwrap())
        };
        rt.apply(full(1, &good)).await.unwrap();
        // Only `b` changes, and the set `a` names is renamed away.
        let mut next = good.clone();
        next.generation = 2;
        next.user_sets = vec![set("ops", "alice")];
        next.virtual_hosts[1].hostnames = vec!["b2.test".into()];
        let d = delta(&good, &next);
        assert!(!same_context(&d, &good));
        let err = rt
            .apply(Change::Delta {
                generation: 2,
                base: 1,
                delta: d,
            })
            .await
            .unwrap_err();
        assert!(
            err.messages().iter().any(|m| m
                .starts_with("virtual_hosts[0].routes[0].filters[0].basic_auth.user_set")
                && m.contains("unknown user set \"staff\"")),
            "{err}"
        );
        assert_eq!(rt.shared.snapshot().config.generation, 1);
        // The same name with other users: the same context, applied.
        rt.apply(full(3, &good)).await.unwrap();
        let mut other = good.clone();
        other.generation = 4;
        other.user_sets = vec![set("staff", "bob")];
        let d = delta(&good, &other);
        assert!(same_context(&d, &good));
        rt.apply(Change::Delta {
            generation: 4,
            base: 3,
            delta: d,
        })
        .await
        .unwrap();
        assert_eq!(
            rt.shared.snapshot().config.user_sets[0].users[0].name,
            "bob"
        );
        rt.shutdown().await;
    }

    /// One plain HTTP listener `name` on 127.0.0.1:`port` whose one route does `action`
    /// (YAML), with backend `b` at `backend`.
    fn one_listener(name: &str, port: u16, action: &str, backend: SocketAddr) -> Config {
        Config::from_yaml(&format!(
            "listeners: [{{name: {name}, address: 127.0.0.1, port: {port}, protocol: http, \
             http3: false}}]\n\
             virtual_hosts: [{{name: t, hostnames: [t.test], routes: [{{name: r, \
             action: {action}}}]}}]\n\
             backends: [{{name: b, endpoints: [{{address: \"{backend}\"}}]}}]"
        ))
        .unwrap()
    }

    /// Reads from `s` until what was read ends with `end`; what was read. Panics on EOF
    /// before.
    async fn read_until(s: &mut tokio::net::TcpStream, end: &[u8]) -> String {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.ends_with(end) {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "EOF after {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(got).unwrap()
    }

    /// A listener removed by one apply has its port free when that apply returns: the next
    /// apply, right after it and with no chance for the removed listener's accept task to run
    /// in between (this runtime has one thread, and neither apply yields to it), gives the port
    /// to another listener, which serves. A request in flight on a connection of the removed
    /// listener (held at the backend across both applies) still completes: only the
    /// listening socket was closed. Before, that task closed the socket once it ran, and the
    /// second apply failed with "address in use" (a CI conformance failure: the controller
    /// gives a freed Gateway port to another listener at once).
    #[tokio::test]
    async fn a_port_freed_by_one_apply_is_bound_by_the_next_at_once() {
        use tokio::io::AsyncWriteExt;
        use tokio::net::{TcpListener, TcpStream};
        let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = backend.local_addr().unwrap();
        let proxy = "{proxy: {backends: [{backend: b}]}}";
        let rt = runtime();
        rt.apply(one_listener("a", 0, proxy, at)).await.unwrap();
        let port = rt.bound().await["a"].port();
        // A keep-alive connection of `a` with a request held at the backend.
        let mut old = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        old.write_all(b"GET /old HTTP/1.1\r\nhost: t.test\r\n\r\n")
            .await
            .unwrap();
        let (mut upstream, _) = backend.accept().await.unwrap();
        read_until(&mut upstream, b"\r\n\r\n").await;

        // `a` taken out, then its port given to `c`, back to back.
        rt.apply(one_listener("other", 0, proxy, at)).await.unwrap();
        let fixed = "{fixed: {status: 200, body: new}}";
        rt.apply(one_listener("c", port, fixed, at)).await.unwrap();
        assert_eq!(rt.shared.metrics.reloads_failed.load(Relaxed), 0);
        assert_eq!(rt.bound().await["c"].port(), port);

        // The old request completes on its draining connection.
        upstream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nold")
            .await
            .unwrap();
        let got = read_until(&mut old, b"old").await;
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        // The new listener serves the port.
        let mut new = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        new.write_all(b"GET / HTTP/1.1\r\nhost: t.test\r\n\r\n")
            .await
            .unwrap();
        let got = read_until(&mut new, b"new").await;
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        rt.shutdown().await;
    }

    /// GET `/` for host t.test on a new connection to 127.0.0.1:`port`; the whole response.
    async fn get_once(port: u16) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nhost: t.test\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).await.unwrap();
        String::from_utf8(got).unwrap()
    }

    /// The reverse order, in one apply: a listener whose bind key changes to one that contends
    /// with its old socket (here from port 0 to the port it was given; likewise 0.0.0.0:P to
    /// 127.0.0.1:P) has its old socket closed before the new one is bound, and serves on the
    /// port. Before, the new bind came first and failed with "address in use". When the config
    /// is rejected after that close (another listener's port is held by a foreign socket),
    /// the old socket is bound again and serves the last good config: its accept loop, which
    /// waited on the socket closed, is woken.
    #[tokio::test]
    async fn a_listener_moved_onto_a_contending_address_binds_it_in_the_same_apply() {
        let foreign = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = foreign.local_addr().unwrap();
        let fixed = |body: &str| format!("{{fixed: {{status: 200, body: {body}}}}}");
        let rt = runtime();
        rt.apply(one_listener("web", 0, &fixed("a"), taken))
            .await
            .unwrap();
        let port = rt.bound().await["web"].port();
        // The accept loop has served, and waits on the socket.
        assert!(get_once(port).await.ends_with("a"));

        // Rejected: `web` moves onto its port, but `x` cannot bind.
        let mut rejected = one_listener("web", port, &fixed("b"), taken);
        let mut x = rejected.listeners[0].clone();
        x.name = "x".into();
        x.port = taken.port();
        rejected.listeners.push(x);
        let err = rt.apply(rejected).await.unwrap_err();
        assert!(
            matches!(&err, ApplyError::Bind { name, .. } if name == "x"),
            "{err}"
        );
        assert_eq!(rt.bound().await["web"].port(), port);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), get_once(port))
            .await
            .expect("the socket put back accepts");
        assert!(
            got.starts_with("HTTP/1.1 200") && got.ends_with("a"),
            "{got}"
        );

        // Applied: `web` alone moves onto its port.
        rt.apply(one_listener("web", port, &fixed("b"), taken))
            .await
            .unwrap();
        assert_eq!(rt.bound().await["web"].port(), port);
        let got = get_once(port).await;
        assert!(
            got.starts_with("HTTP/1.1 200") && got.ends_with("b"),
            "{got}"
        );
        rt.shutdown().await;
    }

    /// A port held by a socket that is not the dataplane's is still a bind error: the config
    /// is rejected whole, naming the listener and the address, and the last good one keeps
    /// serving.
    #[tokio::test]
    async fn a_port_held_by_another_socket_is_still_a_bind_error() {
        let foreign = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = foreign.local_addr().unwrap().port();
        // The backend is never used (the route answers itself).
        let unused = foreign.local_addr().unwrap();
        let fixed = "{fixed: {status: 200, body: x}}";
        let rt = runtime();
        let mut first = one_listener("a", 0, fixed, unused);
        first.generation = 1;
        rt.apply(first).await.unwrap();
        let before = rt.bound().await["a"];
        let mut next = one_listener("c", port, fixed, unused);
        next.generation = 2;
        let err = rt.apply(next).await.unwrap_err();
        match &err {
            ApplyError::Bind {
                name, addr, source, ..
            } => {
                assert_eq!((name.as_str(), addr.port()), ("c", port));
                assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse, "{err}");
            }
            other => panic!("{other}"),
        }
        assert_eq!(rt.shared.snapshot().config.generation, 1);
        assert_eq!(rt.bound().await["a"], before);
        rt.shutdown().await;
    }

    #[tokio::test]
    async fn a_kept_snapshot_is_reused_until_a_reload() {
        let rt = Runtime::new(RuntimeOptions::default()).unwrap();
        let mut kept = None;
        assert!(!rt.shared.is_current(&kept));
        let a = rt.shared.snapshot_for(&mut kept);
        assert!(rt.shared.is_current(&kept));
        let b = rt.shared.snapshot_for(&mut kept);
        assert!(Arc::ptr_eq(&a, &b));
        let cfg = Config {
            generation: 7,
            ..Config::default()
        };
        rt.apply(cfg).await.unwrap();
        // The reload is seen at once: the kept one is stale, the next request gets the new.
        assert!(!rt.shared.is_current(&kept));
        let c = rt.shared.snapshot_for(&mut kept);
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(Arc::ptr_eq(&c, &rt.shared.snapshot()));
        assert_eq!(c.config.generation, 7);
        assert!(rt.shared.is_current(&kept));
    }

    #[test]
    fn same_context_means_same_listeners_and_backend_names() {
        let base = Config {
            backends: (0..500)
                .map(|i| Backend::new(format!("b{i}"), Vec::new()))
                .collect(),
            ..Config::default()
        };
        let empty = ConfigDelta {
            settings: None,
            listeners: Default::default(),
            virtual_hosts: Default::default(),
            backends: Default::default(),
            hash: String::new(),
        };
        assert!(same_context(&empty, &base));
        // Replacing existing backends (any number) keeps the context.
        let mut d = empty.clone();
        d.backends.upsert = (0..500)
            .rev()
            .map(|i| Backend::new(format!("b{i}"), vec![]))
            .collect();
        assert!(same_context(&d, &base));
        // A new backend, a removed one or a listener change does not.
        d.backends.upsert.push(Backend::new("new", vec![]));
        assert!(!same_context(&d, &base));
        let mut d = empty.clone();
        d.backends.remove.push("b3".into());
        assert!(!same_context(&d, &base));
        let mut d = empty.clone();
        d.listeners.remove.push("web".into());
        assert!(!same_context(&d, &base));
        // Virtual host changes alone keep it.
        let mut d = empty.clone();
        d.virtual_hosts.remove.push("v".into());
        assert!(same_context(&d, &base));
    }

    /// `names`, each a virtual host `NAME` (host `NAME.test`) with one route `NAME-r`, except
    /// that names in `shared` all get the route name `shared`.
    fn named_routes(generation: u64, names: &[String], shared: &[&str]) -> Config {
        let mut c = config(generation, &[]);
        let template = config(generation, &["t"]).virtual_hosts.pop().unwrap();
        c.virtual_hosts = names
            .iter()
            .map(|n| {
                let mut v = template.clone();
                v.name = n.clone();
                v.hostnames = vec![format!("{n}.test")];
                v.routes[0].name = if shared.contains(&n.as_str()) {
                    "shared".into()
                } else {
                    format!("{n}-r")
                };
                v
            })
            .collect();
        c
    }

    /// One request counted for `route` on listener `web` (no backend).
    fn count(rt: &Runtime, route: &str) {
        let (listener, backend) = (Arc::from("web"), Arc::from(crate::metrics::NO_BACKEND));
        rt.shared.metrics.requests.record(&crate::metrics::Record {
            listener: &listener,
            route: &Arc::from(route),
            backend: &backend,
            method: 0,
            status: 200,
            elapsed: std::time::Duration::ZERO,
            upstream: None,
        });
    }

    /// Applies `to` (generation `to.generation`) as a delta on `from`, which `rt` serves.
    async fn apply_patch(rt: &Runtime, from: &Config, to: &Config) {
        let (fd, td) = (Digests::of(from), Digests::of(to));
        rt.apply(Change::Delta {
            generation: to.generation,
            base: from.generation,
            delta: Box::new(ConfigDelta::between(from, &fd, to, &td).unwrap()),
        })
        .await
        .unwrap();
    }

    /// A config of `MAX_ROUTES` + 2 virtual hosts with a request counted on each of the first
    /// `MAX_ROUTES` routes (the route label cap is reached, as on a dataplane after a sweep
    /// over every host of a large config).
    async fn at_the_route_label_cap() -> (Runtime, Config) {
        use crate::metrics::series::MAX_ROUTES;
        let rt = runtime();
        let mut names: Vec<String> = (0..MAX_ROUTES + 2).map(|i| format!("v{i}")).collect();
        names.push("x1".into());
        names.push("x2".into());
        let c = named_routes(1, &names, &["x1", "x2"]);
        rt.apply(Change::Full {
            generation: 1,
            config: Box::new(c.clone()),
        })
        .await
        .unwrap();
        count(&rt, "shared");
        for n in &names[..MAX_ROUTES - 1] {
            count(&rt, &format!("{n}-r"));
        }
        assert!(rt.shared.metrics.requests.full());
        (rt, c)
    }

    /// A patch that takes out no route with a series (here a new hostname for one virtual
    /// host; the convergence benchmark's changes edit a route's filters) makes no pass over
    /// the route table for the request series: their lookup map is not emptied. Before,
    /// every apply at the route label cap made that pass and emptied the map (this test then
    /// fails: the map is empty after the patch).
    #[tokio::test]
    async fn a_patch_taking_out_no_counted_route_leaves_the_request_series_alone() {
        let (rt, c) = at_the_route_label_cap().await;
        let m = &rt.shared.metrics;
        let before = m.requests.lookup_len();
        assert_eq!(before, crate::metrics::series::MAX_ROUTES);
        let mut next = c.clone();
        next.generation = 2;
        next.virtual_hosts[7].hostnames = vec!["moved.test".into()];
        apply_patch(&rt, &c, &next).await;
        assert_eq!(
            rt.shared.snapshot().routes.vhost_name("web", "moved.test"),
            Some("v7")
        );
        assert_eq!(
            m.requests.lookup_len(),
            before,
            "the lookup map was emptied"
        );
        assert!(m.requests.has_route("v7-r"));
        rt.shutdown().await;
    }

    /// A patch that takes out a route with a series drops that series (freeing its place
    /// under the cap for a route counted under `other` so far), and keeps the series of a
    /// route name another virtual host still serves.
    #[tokio::test]
    async fn a_patch_taking_out_a_counted_route_drops_its_series_only() {
        let (rt, c) = at_the_route_label_cap().await;
        let m = &rt.shared.metrics;
        // Over the cap: counted under `other`.
        count(&rt, "v501-r");
        assert_eq!(m.requests.get("web", "v501-r", "-", "GET", 200), 0);
        let mut next = c.clone();
        next.generation = 2;
        next.virtual_hosts
            .retain(|v| v.name != "v3" && v.name != "x1");
        apply_patch(&rt, &c, &next).await;
        assert!(!m.requests.has_route("v3-r"), "v3-r is no longer served");
        assert_eq!(m.requests.get("web", "v3-r", "-", "GET", 200), 0);
        assert!(m.requests.has_route("shared"), "x2 still serves `shared`");
        assert!(m.requests.has_route("v4-r"));
        count(&rt, "v501-r");
        assert_eq!(m.requests.get("web", "v501-r", "-", "GET", 200), 1);
        rt.shutdown().await;
    }

    /// One-route patches of a 5,000-virtual-host config with the route label cap reached (as
    /// the e2e convergence benchmark leaves the dataplane after its sweep over every host),
    /// for callgrind (instructions, which do not depend on the machine's load):
    /// `valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*bench_patches*'
    /// TESTBINARY --ignored --exact reload::tests::bench_one_route_patches_at_5000_routes`;
    /// the window's Ir / 20 is one patch's apply (delta onto the base, validate, build, swap,
    /// the labels' upkeep; not the decoding).
    #[tokio::test]
    #[ignore]
    async fn bench_one_route_patches_at_5000_routes() {
        let rt = runtime();
        let names: Vec<String> = (0..5000).map(|i| format!("v{i}")).collect();
        let mut cur = named_routes(1, &names, &[]);
        rt.apply(Change::Full {
            generation: 1,
            config: Box::new(cur.clone()),
        })
        .await
        .unwrap();
        for n in &names[..crate::metrics::series::MAX_ROUTES] {
            count(&rt, &format!("{n}-r"));
        }
        assert!(rt.shared.metrics.requests.full());
        let mut cur_d = Digests::of(&cur);
        let mut deltas = Vec::new();
        for k in 0..20u64 {
            let mut next = cur.clone();
            next.generation = k + 2;
            let i = (k as usize * 797) % names.len();
            next.virtual_hosts[i].hostnames = vec![format!("changed-{k}.test")];
            let next_d = Digests::reuse(&next, &cur, &cur_d);
            deltas.push(ConfigDelta::between(&cur, &cur_d, &next, &next_d).unwrap());
            (cur, cur_d) = (next, next_d);
        }
        bench_patches(&rt, deltas).await;
        assert_eq!(rt.shared.snapshot().config.generation, 21);
        rt.shutdown().await;
    }

    #[inline(never)]
    async fn bench_patches(rt: &Runtime, deltas: Vec<ConfigDelta>) {
        for (k, delta) in (0u64..).zip(deltas) {
            rt.apply(Change::Delta {
                generation: k + 2,
                base: k + 1,
                delta: Box::new(delta),
            })
            .await
            .unwrap();
        }
    }
}
