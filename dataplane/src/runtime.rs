//! Hot reload: [`Runtime::apply`] validates a new config, builds everything it needs, binds
//! new listeners, swaps the [`Snapshot`] held in [`Shared`] (both in [`crate::state`]) and
//! drains removed listeners; [`Runtime`] also starts and stops the listeners
//! ([`crate::listen`]).
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
//! * certificates are part of the snapshot, so changed ones apply to new handshakes; a kept
//!   QUIC endpoint gets the new TLS and transport config for its new handshakes.

use crate::access_log::AccessLog;
use crate::limits::{Backpressure, Limit};
use crate::metrics::Metrics;
use crate::proxy::Upstreams;
use crate::router::RouteTable;
use crate::state::{http_builder, BindKey, ListenerView, Shared, Snapshot};
use crate::static_files::StaticFiles;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use sweety_config::{Config, Limits, ListenerProtocol};
use tokio::sync::watch;
use tokio::task::JoinHandle;

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

/// What the caller of [`Runtime::apply_reusing`] knows about the new config relative to the
/// one serving now, so that unchanged parts are neither validated nor compiled again.
pub struct Reuse<'a> {
    /// True for the name of a virtual host that is new or changed; every other virtual host
    /// is equal to the serving one of the same name.
    pub changed_vhost: &'a (dyn Fn(&str) -> bool + Sync),
    /// Listeners and backend names are those of the serving config: unchanged virtual hosts
    /// (checked against them) need no validation.
    pub same_context: bool,
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

struct Running {
    local: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

struct RunningQuic {
    local: SocketAddr,
    endpoint: quinn::Endpoint,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Every running listener socket: TCP, UDP for HTTP/3, and UDP of layer-4 listeners, each
/// by bind key.
#[derive(Default)]
struct Sockets {
    tcp: HashMap<BindKey, Running>,
    udp: HashMap<BindKey, RunningQuic>,
    l4udp: HashMap<BindKey, Running>,
}

/// The dataplane runtime: applies configs and runs listeners.
pub struct Runtime {
    /// Shared state.
    pub shared: Arc<Shared>,
    running: tokio::sync::Mutex<Sockets>,
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
            ready: AtomicBool::new(false),
            rate_zones: crate::access::Zones::default(),
            cache: Arc::new(crate::cache::Cache::new(
                sweety_config::CacheSettings::default(),
                metrics.clone(),
            )),
            client_conns: Arc::default(),
            client_requests: Arc::default(),
            listener_limits: Mutex::new(HashMap::new()),
            metrics,
        });
        Ok(Runtime {
            shared,
            running: tokio::sync::Mutex::new(Sockets::default()),
        })
    }

    /// Validates, builds and applies `config`. On error nothing changes.
    pub async fn apply(&self, config: Config) -> Result<(), ApplyError> {
        self.apply_with_hash(config, None).await
    }

    /// [`Runtime::apply`] with the config's content hash when the caller already has it (the
    /// control socket hashes the `Apply` payload as received), which saves serializing the
    /// whole config again; `None` computes it.
    pub async fn apply_with_hash(
        &self,
        config: Config,
        hash: Option<String>,
    ) -> Result<(), ApplyError> {
        self.apply_reusing(&config, hash, None).await
    }

    /// [`Runtime::apply_with_hash`] for a borrowed config (the runtime keeps a copy of its
    /// settings and listeners only), taking compiled virtual hosts that `reuse` says are
    /// unchanged from the serving snapshot.
    pub async fn apply_reusing(
        &self,
        config: &Config,
        hash: Option<String>,
        reuse: Option<Reuse<'_>>,
    ) -> Result<(), ApplyError> {
        let result = self.apply_inner(config, hash, reuse, None).await;
        self.counted(result)
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

    /// Makes `snapshot` the serving one: from here new connections and requests use it. With
    /// `new_settings` the response cache bounds and the backpressure limits follow its
    /// settings first (a patch keeps the settings of the snapshot it replaces, so it leaves
    /// them alone).
    fn publish(&self, snapshot: Snapshot, new_settings: bool) {
        let generation = snapshot.config.generation;
        let limits = new_settings.then(|| {
            self.shared.cache.configure(&snapshot.config.cache);
            snapshot.config.limits.clone()
        });
        self.shared.store(snapshot);
        if let Some(limits) = limits {
            self.shared.backpressure.resize(
                limits.max_connections as usize,
                limits.max_requests_in_flight as usize,
            );
        }
        self.shared
            .metrics
            .config_generation
            .store(generation, Relaxed);
        self.shared.ready.store(true, Relaxed);
    }

    /// Applies `config`, the serving config with a delta applied that changed neither the
    /// settings nor the listeners nor the backend names: `edit` says how its virtual host list
    /// changed from the serving one, and `backends_changed` whether any backend did. Only
    /// what changed is validated and compiled; listeners, their TLS and sockets, and (unless
    /// backends changed) the upstreams are kept as they are. `hash` is the config's content
    /// hash. On error nothing changes. A reordered list is no patch: apply it with
    /// [`Runtime::apply_reusing`].
    pub async fn apply_patch(
        &self,
        config: &Config,
        hash: String,
        edit: &sweety_config::delta::ListPatch,
        backends_changed: bool,
    ) -> Result<(), ApplyError> {
        let result = self
            .apply_patch_inner(config, hash, edit, backends_changed)
            .await;
        self.counted(result)
    }

    async fn apply_patch_inner(
        &self,
        config: &Config,
        hash: String,
        edit: &sweety_config::delta::ListPatch,
        backends_changed: bool,
    ) -> Result<(), ApplyError> {
        let n = config.virtual_hosts.len();
        let changed = edit.changed_positions(n);
        config.validate_patch(&changed, backends_changed)?;
        // Serialises with other applies (no socket changes here).
        let _sockets = self.running.lock().await;
        let prev = self.shared.snapshot();
        let mut access_touched = false;
        let routes = prev
            .routes
            .patch(config, edit, &mut |e| {
                access_touched |= crate::access::AccessRules::has_route_rules(&e.route)
            })
            .map_err(|e| ApplyError::Invalid(vec![e.to_string()]))?;
        let upstreams = if backends_changed {
            let built = Upstreams::build(
                &config.backends,
                Some(&prev.upstreams),
                self.shared.metrics.clone(),
            )
            .map_err(|e| ApplyError::Invalid(vec![e.to_string()]))?;
            Arc::new(built)
        } else {
            prev.upstreams.clone()
        };
        let access = if access_touched {
            Arc::new(crate::access::AccessRules::build(
                &config.client_ip,
                &routes,
                &self.shared.rate_zones,
            ))
        } else {
            prev.access.clone()
        };
        let mut kept = Config::clone(&prev.config);
        kept.generation = config.generation;
        let snapshot = Snapshot {
            http: http_builder(&kept.limits),
            config: Arc::new(kept),
            virtual_host_count: n,
            backend_count: config.backends.len(),
            hash,
            routes,
            upstreams,
            listeners: prev.listeners.clone(),
            by_key: prev.by_key.clone(),
            access,
        };
        self.publish(snapshot, false);
        if backends_changed {
            self.shared.snapshot().upstreams.start_health_checks();
        }
        Ok(())
    }

    /// [`Runtime::apply_with_hash`] that moves the routes of `config` into the route table
    /// instead of copying them (a full config is then not held twice while it is built).
    /// Afterwards `config`'s virtual hosts have no routes, whether it was applied or not.
    pub async fn apply_taking_routes(
        &self,
        config: &mut Config,
        hash: Option<String>,
    ) -> Result<(), ApplyError> {
        let result = match config.validate() {
            Err(errs) => Err(errs.into()),
            Ok(()) => {
                let routes = config
                    .virtual_hosts
                    .iter_mut()
                    .map(|v| std::mem::take(&mut v.routes))
                    .collect();
                self.apply_inner(config, hash, None, Some(routes)).await
            }
        };
        for v in &mut config.virtual_hosts {
            v.routes = Vec::new();
        }
        self.counted(result)
    }

    /// Validates (unless `taken` holds the routes of an already validated `config`), builds
    /// and swaps.
    async fn apply_inner(
        &self,
        config: &Config,
        hash: Option<String>,
        reuse: Option<Reuse<'_>>,
        taken: Option<Vec<Vec<sweety_config::Route>>>,
    ) -> Result<(), ApplyError> {
        let validated = match (&reuse, &taken) {
            (_, Some(_)) => Ok(()),
            (Some(r), None) if r.same_context => {
                let changed = r.changed_vhost;
                config.validate_trusting(&|i| !changed(&config.virtual_hosts[i].name))
            }
            _ => config.validate(),
        };
        validated?;
        let mut errors = Vec::new();
        let prev = self.shared.snapshot();
        let unchanged = |name: &str| reuse.as_ref().is_some_and(|r| !(r.changed_vhost)(name));
        let previous: Option<(&RouteTable, crate::router::Unchanged<'_>)> = reuse
            .as_ref()
            .map(|_| (&prev.routes, &unchanged as crate::router::Unchanged<'_>));
        let routes = match taken {
            Some(routes) => RouteTable::build_taking(config, routes),
            None => RouteTable::build_reusing(config, previous),
        }
        .map_err(|e| errors.push(e.to_string()))
        .ok();
        let upstreams = Upstreams::build(
            &config.backends,
            Some(&prev.upstreams),
            self.shared.metrics.clone(),
        )
        .map_err(|e| errors.push(e.to_string()))
        .ok();
        let mut views = Vec::new();
        for (i, l) in config.listeners.iter().enumerate() {
            let (tls, quic) = match (&l.protocol, &l.tls) {
                (ListenerProtocol::Https, Some(t)) => {
                    let path = format!("listeners[{i}].tls");
                    let early = l.http3.then_some(config.http3.early_data);
                    match crate::tls::listener_configs(t, &path, early) {
                        Ok(c) => {
                            let quic = c.quic.and_then(|q| {
                                crate::listen::quic::server_config(
                                    q,
                                    &config.http3,
                                    &config.limits,
                                    &path,
                                )
                                .map_err(|e| errors.push(e))
                                .ok()
                            });
                            (Some(c.tcp), quic)
                        }
                        Err(e) => {
                            errors.push(e.to_string());
                            (None, None)
                        }
                    }
                }
                // Terminating routes of a `tls` listener: no ALPN (the bytes inside are not
                // HTTP to us), the listener's certificates chosen by SNI as for HTTPS.
                (ListenerProtocol::Tls, Some(t)) => {
                    let path = format!("listeners[{i}].tls");
                    match crate::tls::server_config(t, &path, &[]) {
                        Ok(c) => (Some(c), None),
                        Err(e) => {
                            errors.push(e.to_string());
                            (None, None)
                        }
                    }
                }
                _ => (None, None),
            };
            views.push((i, l, tls, quic));
        }
        let (Some(routes), Some(upstreams), true) = (routes, upstreams, errors.is_empty()) else {
            return Err(ApplyError::Invalid(errors));
        };

        let mut sockets = self.running.lock().await;
        let running = &sockets.tcp;
        // Bind listeners that are new, before anything is swapped: TCP, then UDP on the same
        // port for HTTP/3 (a new ephemeral-port listener retries until both are free).
        let mut fresh = HashMap::new();
        let mut fresh_udp = HashMap::new();
        let mut fresh_l4udp = HashMap::new();
        for (i, l, _, _) in &views {
            if l.protocol != ListenerProtocol::Udp {
                continue;
            }
            let key = bind_key(l);
            if sockets.l4udp.contains_key(&key) || fresh_l4udp.contains_key(&key) {
                continue;
            }
            let sock = crate::listen::quic::bind_udp(key.0).map_err(|source| ApplyError::Bind {
                index: *i,
                name: l.name.clone(),
                addr: key.0,
                source,
            })?;
            let sock =
                tokio::net::UdpSocket::from_std(sock).map_err(|source| ApplyError::Bind {
                    index: *i,
                    name: l.name.clone(),
                    addr: key.0,
                    source,
                })?;
            fresh_l4udp.insert(key, sock);
        }
        for (i, l, _, quic) in &views {
            if l.protocol == ListenerProtocol::Udp {
                continue; // Bound above.
            }
            let key = bind_key(l);
            let bind_err = |addr, source| ApplyError::Bind {
                index: *i,
                name: l.name.clone(),
                addr,
                source,
            };
            let want_udp =
                quic.is_some() && !sockets.udp.contains_key(&key) && !fresh_udp.contains_key(&key);
            if running.contains_key(&key) || fresh.contains_key(&key) {
                if want_udp {
                    let port = running
                        .get(&key)
                        .map(|r| r.local.port())
                        .or_else(|| fresh.get(&key).and_then(local_port))
                        .unwrap_or(l.port);
                    let addr = SocketAddr::new(key.0.ip(), port);
                    let sock =
                        crate::listen::quic::bind_udp(addr).map_err(|e| bind_err(addr, e))?;
                    fresh_udp.insert(key, sock);
                }
                continue;
            }
            let mut tries = 0;
            let (tcp, udp) = loop {
                let tcp = bind_tcp(key.0).map_err(|e| bind_err(key.0, e))?;
                if !want_udp {
                    break (tcp, None);
                }
                let addr = SocketAddr::new(key.0.ip(), local_port(&tcp).unwrap_or(l.port));
                match crate::listen::quic::bind_udp(addr) {
                    Ok(u) => break (tcp, Some(u)),
                    Err(e) if key.0.port() == 0 && tries < 8 => {
                        tries += 1;
                        tracing::debug!(%addr, error = %e, "UDP port taken; trying another");
                    }
                    Err(e) => return Err(bind_err(addr, e)),
                }
            };
            if let Some(u) = udp {
                fresh_udp.insert(key.clone(), u);
            }
            fresh.insert(key, tcp);
        }
        // Start the new QUIC endpoints (they queue handshakes until their loop runs).
        let mut fresh_quic = HashMap::new();
        for (i, l, _, quic) in &views {
            let key = bind_key(l);
            let (Some(sock), Some(cfg)) = (fresh_udp.remove(&key), quic) else {
                continue;
            };
            let addr = sock.local_addr().unwrap_or(key.0);
            let ep = crate::listen::quic::endpoint(sock, cfg.clone()).map_err(|source| {
                ApplyError::Bind {
                    index: *i,
                    name: l.name.clone(),
                    addr,
                    source,
                }
            })?;
            fresh_quic.insert(key, ep);
        }

        // Build the snapshot.
        let mut listeners = HashMap::default();
        let mut by_key = HashMap::new();
        {
            let mut limits = self
                .shared
                .listener_limits
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for (_, l, tls, quic) in &views {
                let key = bind_key(l);
                let port = running
                    .get(&key)
                    .map(|r| r.local.port())
                    .or_else(|| fresh.get(&key).and_then(local_port))
                    .or_else(|| sockets.l4udp.get(&key).map(|r| r.local.port()))
                    .or_else(|| {
                        fresh_l4udp
                            .get(&key)
                            .and_then(|u| u.local_addr().ok())
                            .map(|a| a.port())
                    })
                    .unwrap_or(l.port);
                let limit = l.max_requests_in_flight.map(|max| {
                    let lim = limits
                        .entry(l.name.clone())
                        .or_insert_with(|| Arc::new(Limit::new(max as usize)));
                    lim.resize(max as usize);
                    lim.clone()
                });
                // Advertise HTTP/3 only where its UDP socket is up.
                let h3_up = quic.is_some()
                    && (sockets.udp.contains_key(&key) || fresh_quic.contains_key(&key));
                let view = Arc::new(ListenerView {
                    name: l.name.as_str().into(),
                    port,
                    protocol: l.protocol,
                    tls: tls.clone(),
                    sni_scopes: l
                        .tls
                        .as_ref()
                        .filter(|_| tls.is_some() && l.protocol == ListenerProtocol::Https)
                        .map(|t| Arc::new(crate::tls::SniScopes::new(&t.certificates))),
                    limit,
                    alt_svc: h3_up.then(|| {
                        crate::listen::quic::alt_svc(
                            l.advertised_port.unwrap_or(port),
                            config.http3.alt_svc_max_age.get(),
                        )
                    }),
                    l4: crate::router::l4::L4Listener::compile(l),
                    proxy_protocol: crate::proxy_protocol::Expect::for_listener(
                        &config.client_ip,
                        &l.name,
                    ),
                });
                by_key.insert(key.clone(), view.clone());
                listeners.insert(view.name.clone(), view);
            }
            limits.retain(|name, _| listeners.contains_key(name.as_str()));
        }
        let mut quic_configs: HashMap<BindKey, quinn::ServerConfig> = views
            .into_iter()
            .filter_map(|(_, l, _, q)| Some((bind_key(l), q?)))
            .collect();
        let access = Arc::new(crate::access::AccessRules::build(
            &config.client_ip,
            &routes,
            &self.shared.rate_zones,
        ));
        let hash = hash.unwrap_or_else(|| config.content_hash());
        let virtual_host_count = config.virtual_hosts.len();
        let backend_count = config.backends.len();
        let mut kept = sweety_config::delta::settings_of(config);
        kept.generation = config.generation;
        kept.listeners = config.listeners.clone();
        let snapshot = Snapshot {
            http: http_builder(&config.limits),
            hash,
            virtual_host_count,
            backend_count,
            routes,
            upstreams: Arc::new(upstreams),
            listeners,
            by_key,
            config: Arc::new(kept),
            access,
        };

        // Swap.
        self.publish(snapshot, true);

        // Start new listeners, stop removed ones.
        for (key, sock) in fresh {
            let local = sock.local_addr().unwrap_or(key.0);
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(crate::listen::tcp::run_tcp(
                self.shared.clone(),
                sock,
                key.clone(),
                stop_rx,
            ));
            sockets.tcp.insert(key, Running { local, stop, task });
        }
        // HTTP/3 endpoints: new ones start, kept ones get the new config for new handshakes
        // (established connections are untouched), removed ones drain.
        sockets.udp.retain(|key, r| match quic_configs.remove(key) {
            Some(cfg) => {
                r.endpoint.set_server_config(Some(cfg));
                true
            }
            None => {
                let _ = r.stop.send(true);
                tracing::info!(addr = %r.local, "HTTP/3 listener removed; draining");
                false
            }
        });
        for (key, endpoint) in fresh_quic {
            let local = endpoint.local_addr().unwrap_or(key.0);
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(crate::listen::quic::run_quic(
                self.shared.clone(),
                endpoint.clone(),
                key.clone(),
                stop_rx,
            ));
            let r = RunningQuic {
                local,
                endpoint,
                stop,
                task,
            };
            sockets.udp.insert(key, r);
        }
        for (key, sock) in fresh_l4udp {
            let local = sock.local_addr().unwrap_or(key.0);
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(crate::listen::l4::udp::run_udp(
                self.shared.clone(),
                Arc::new(sock),
                key.clone(),
                stop_rx,
            ));
            sockets.l4udp.insert(key, Running { local, stop, task });
        }
        let snap = self.shared.snapshot();
        snap.upstreams.start_health_checks();
        let udp_l4 = |k: &BindKey| {
            snap.by_key
                .get(k)
                .is_some_and(|v| v.protocol == ListenerProtocol::Udp)
        };
        sockets.l4udp.retain(|key, r| {
            let keep = udp_l4(key);
            if !keep {
                let _ = r.stop.send(true);
                tracing::info!(addr = %r.local, "UDP listener removed");
            }
            keep
        });
        sockets.tcp.retain(|key, r| {
            let keep = snap.by_key.contains_key(key) && !udp_l4(key);
            if !keep {
                let _ = r.stop.send(true);
                tracing::info!(addr = %r.local, "listener removed; draining");
            }
            keep
        });
        Ok(())
    }

    /// Addresses the listeners are bound to, by listener name.
    pub async fn bound(&self) -> HashMap<String, SocketAddr> {
        let running = self.running.lock().await;
        let snap = self.shared.snapshot();
        snap.by_key
            .iter()
            .filter_map(|(k, v)| {
                running
                    .tcp
                    .get(k)
                    .or_else(|| running.l4udp.get(k))
                    .map(|r| (v.name.to_string(), r.local))
            })
            .collect()
    }

    /// UDP addresses of the listeners serving HTTP/3, by listener name.
    pub async fn bound_quic(&self) -> HashMap<String, SocketAddr> {
        let running = self.running.lock().await;
        let snap = self.shared.snapshot();
        snap.by_key
            .iter()
            .filter_map(|(k, v)| running.udp.get(k).map(|r| (v.name.to_string(), r.local)))
            .collect()
    }

    /// Stops accepting on every listener and waits (up to the drain timeout) for open
    /// connections to finish their requests.
    pub async fn shutdown(&self) {
        let mut running = self.running.lock().await;
        let mut tasks = Vec::new();
        for (_, r) in running.tcp.drain() {
            let _ = r.stop.send(true);
            tasks.push(r.task);
        }
        for (_, r) in running.udp.drain() {
            let _ = r.stop.send(true);
            tasks.push(r.task);
        }
        for (_, r) in running.l4udp.drain() {
            let _ = r.stop.send(true);
            tasks.push(r.task);
        }
        let drain = self.shared.snapshot().config.limits.drain_timeout.get();
        let _ = tokio::time::timeout(
            drain + std::time::Duration::from_secs(1),
            futures_util::future::join_all(tasks),
        )
        .await;
    }
}

fn bind_key(l: &sweety_config::Listener) -> BindKey {
    let ip: IpAddr = l.address.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let name = (l.port == 0).then(|| Arc::<str>::from(l.name.as_str()));
    (SocketAddr::new(ip, l.port), name)
}

fn local_port(l: &tokio::net::TcpListener) -> Option<u16> {
    l.local_addr().ok().map(|a| a.port())
}

fn bind_tcp(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sock.set_reuse_address(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(4096)?;
    tokio::net::TcpListener::from_std(sock.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sweety_config::delta::ListPatch;

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

    /// Every way in (full, full taking routes, patch) counts its reload once, maps
    /// validation errors to `path: message` lines and publishes its snapshot.
    #[tokio::test]
    async fn every_apply_path_counts_maps_errors_and_publishes() {
        let rt = runtime();
        assert_eq!(counters(&rt), (0, 0, 0, false));
        rt.apply(config(1, &["a", "b"])).await.unwrap();
        assert_eq!(counters(&rt), (1, 0, 1, true));

        let mut bad = config(2, &["a"]);
        bad.virtual_hosts[0].routes[0].name = String::new();
        let err = rt.apply(bad.clone()).await.unwrap_err();
        assert!(
            err.messages()[0].starts_with("virtual_hosts[0].routes[0].name"),
            "{err}"
        );
        assert_eq!(counters(&rt), (1, 1, 1, true));
        let err = rt.apply_taking_routes(&mut bad, None).await.unwrap_err();
        assert!(
            err.messages()[0].starts_with("virtual_hosts[0].routes[0].name"),
            "{err}"
        );
        assert_eq!(counters(&rt), (1, 2, 1, true));
        let mut good = config(3, &["a", "b"]);
        rt.apply_taking_routes(&mut good, None).await.unwrap();
        assert_eq!(counters(&rt), (2, 2, 3, true));

        // A patch: `b` replaced (new hostname), `c` appended.
        let mut next = config(4, &["a", "b", "c"]);
        next.virtual_hosts[1].hostnames = vec!["b2.test".into()];
        let edit = ListPatch {
            replaced: vec![1],
            removed: vec![],
            appended: 1,
        };
        rt.apply_patch(&next, next.content_hash(), &edit, false)
            .await
            .unwrap();
        assert_eq!(counters(&rt), (3, 2, 4, true));
        let snap = rt.shared.snapshot();
        assert_eq!(snap.config.generation, 4);
        assert_eq!(snap.hash, next.content_hash());
        assert_eq!(snap.routes.vhost_name("web", "b2.test"), Some("b"));
        assert_eq!(snap.routes.vhost_name("web", "c.test"), Some("c"));
        assert_eq!(snap.virtual_host_count, 3);

        // An invalid patch: counted, mapped, and the last good snapshot keeps serving.
        let mut broken = next.clone();
        broken.generation = 5;
        broken.virtual_hosts[2].routes[0].name = String::new();
        let edit = ListPatch {
            replaced: vec![2],
            ..ListPatch::default()
        };
        let err = rt
            .apply_patch(&broken, broken.content_hash(), &edit, false)
            .await
            .unwrap_err();
        assert!(
            err.messages()[0].starts_with("virtual_hosts[2].routes[0].name"),
            "{err}"
        );
        assert_eq!(counters(&rt), (3, 3, 4, true));
        assert_eq!(rt.shared.snapshot().config.generation, 4);
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
}
