//! The state every request reads: the current config [`Snapshot`] (routes, upstreams, access
//! rules, listener views) behind an atomic pointer in [`Shared`], with what outlives reloads
//! (metrics, backpressure, static files, access log, rate zones, cache). Built and swapped by
//! `reload`; read by the listeners and the pipeline. Imports none of them.

use crate::access_log::AccessLog;
use crate::exec::StreamExecutor;
use crate::limits::{Backpressure, Limit};
use crate::metrics::Metrics;
use crate::proxy::Upstreams;
use crate::router::RouteTable;
use crate::static_files::StaticFiles;
use arc_swap::ArcSwap;
use http::HeaderValue;
use hyper_util::rt::TokioTimer;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Acquire, Release},
};
use std::sync::{Arc, Mutex};
use sweety_config::{Config, Limits, ListenerProtocol};

/// Identifies a listening socket across reloads: its configured address and port, plus the
/// listener name for port 0 (an ephemeral port, used by tests), where the address alone
/// does not identify the socket, and its [`Transport`]: a layer-4 UDP listener and a TCP
/// one may share an address and port (the controller translates a Gateway with an HTTPS
/// and a UDP listener on one port so), and each has a view of its own.
pub type BindKey = (SocketAddr, Option<Arc<str>>, Transport);

/// The transport a listener is bound on, in its [`BindKey`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// TCP: HTTP, HTTPS (and its HTTP/3 endpoint on the same UDP port), TLS, TCP.
    Tcp,
    /// UDP: a layer-4 UDP listener.
    Udp,
}

/// What a request needs to know about the listener it arrived on.
#[derive(Debug)]
pub struct ListenerView {
    /// Listener name.
    pub name: Arc<str>,
    /// Port the listener is bound to.
    pub port: u16,
    /// Protocol.
    pub protocol: ListenerProtocol,
    /// TLS server config for HTTPS listeners.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// `host_client_auth` of an HTTPS listener: the handshake config per SNI and the check
    /// per request ([`crate::client_cert`]).
    pub host_auth: Option<Arc<crate::client_cert::HostAuth>>,
    /// Certificate scopes of HTTPS listeners, for 421 Misdirected Request.
    pub sni_scopes: Option<Arc<crate::tls::SniScopes>>,
    /// The listener's own in-flight cap, if any.
    pub limit: Option<Arc<Limit>>,
    /// `Alt-Svc` value advertised on H1/H2 responses when HTTP/3 is served.
    pub alt_svc: Option<HeaderValue>,
    /// Routes of a layer-4 (`tcp`, `udp`, `tls_passthrough`, `tls`) listener.
    pub l4: Option<Arc<crate::router::l4::L4Listener>>,
    /// Passthrough hosts of an `https` listener: a connection whose ClientHello names one is
    /// passed through unterminated. `None` (no ClientHello is peeked) when it has none.
    pub passthrough: Option<Arc<crate::router::l4::L4Listener>>,
    /// Set when connections start with a PROXY protocol header.
    pub proxy_protocol: Option<Arc<crate::proxy_protocol::Expect>>,
}

/// An immutable, fully built config.
pub struct Snapshot {
    /// The config it was built from, without its virtual hosts and backends: those live on
    /// compiled in `routes` and `upstreams`, and keeping a second copy of thousands of routes
    /// only cost memory. Their counts are in `virtual_host_count` / `backend_count`.
    pub config: Arc<Config>,
    /// Number of virtual hosts of the applied config.
    pub virtual_host_count: usize,
    /// Number of backends of the applied config.
    pub backend_count: usize,
    /// Content hash of the config.
    pub hash: String,
    /// Route table.
    pub routes: RouteTable,
    /// Upstream backends and pools.
    pub upstreams: Arc<Upstreams>,
    /// Listeners by name.
    pub listeners: HashMap<Arc<str>, Arc<ListenerView>, crate::metrics::FnvBuild>,
    /// Listener names by bind key.
    pub(crate) by_key: HashMap<BindKey, Arc<ListenerView>>,
    /// hyper connection builder configured from the limits.
    pub http: hyper_util::server::conn::auto::Builder<StreamExecutor>,
    /// Client-IP rules, IP access lists and rate limits (shared by snapshots whose changes
    /// did not touch them).
    pub access: Arc<crate::access::AccessRules>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("generation", &self.config.generation)
            .field("hash", &self.hash)
            .finish()
    }
}

impl Snapshot {
    /// The listener with this name.
    pub fn listener(&self, name: &str) -> Option<&ListenerView> {
        self.listeners.get(name).map(|v| &**v)
    }

    /// The listener bound under this key.
    pub fn listener_by_key(&self, key: &BindKey) -> Option<&Arc<ListenerView>> {
        self.by_key.get(key)
    }

    pub(crate) fn empty(metrics: Arc<Metrics>) -> Snapshot {
        let config = Config::default();
        Snapshot {
            http: http_builder(&config.limits),
            config: Arc::new(config),
            virtual_host_count: 0,
            backend_count: 0,
            hash: String::new(),
            routes: RouteTable::default(),
            upstreams: Arc::new(
                Upstreams::build(&[], None, metrics, sweety_config::DEFAULT_PROXY_READ_AHEAD)
                    .expect("empty upstreams build"),
            ),
            listeners: HashMap::default(),
            by_key: HashMap::new(),
            access: Arc::default(),
        }
    }
}

/// State shared by every connection and request; outlives reloads.
pub struct Shared {
    pub(crate) current: ArcSwap<Snapshot>,
    /// Counts the stores to `current` (bumped after each): a connection that keeps the
    /// snapshot it loaded reuses it while this has not changed ([`Shared::snapshot_for`]).
    pub(crate) swaps: AtomicU64,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The backpressure core.
    pub backpressure: Backpressure,
    /// The static-file handler and its cache.
    pub static_files: StaticFiles,
    /// The access log.
    pub access_log: AccessLog,
    /// The tracer of the serving config's `tracing` (none: tracing off). Set before the
    /// snapshot that asks for it is published.
    pub tracer: arc_swap::ArcSwapOption<crate::trace::Tracer>,
    /// True once a config has been applied.
    pub ready: AtomicBool,
    /// Rate-limit buckets, kept across reloads.
    pub rate_zones: crate::access::Zones,
    /// The response cache (routes with a `cache` filter); bounds follow `config.cache`.
    pub cache: Arc<crate::cache::Cache>,
    /// Connections held per client address (`limits.max_connections_per_client`).
    pub client_conns: Arc<crate::client_caps::ClientCaps>,
    /// Requests in flight per client address (`limits.max_requests_per_client`).
    pub client_requests: Arc<crate::client_caps::ClientCaps>,
    /// The HTTP/3 send budget (`http3.send_budget`), shared by all QUIC connections.
    pub quic_send_budget: Arc<crate::quic_budget::SendBudget>,
    /// The sent-packet state of all QUIC connections and its budget (`http3.send_budget`,
    /// [`crate::quic_budget`]), in every listener's transport config.
    pub quic_sent_state: Arc<quinn_proto::SentStateTotal>,
    /// The static-file read-ahead of all connections together
    /// (`limits.static_read_ahead_total`), set as each config is published.
    pub read_ahead_total: Arc<crate::static_files::ReadAheadTotal>,
    pub(crate) listener_limits: Mutex<HashMap<String, Arc<Limit>>>,
}

impl Shared {
    /// The current snapshot (pin it for the duration of a request).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The current snapshot through a per-connection memo: `kept` is reused while no new
    /// snapshot was stored since it was loaded (one plain atomic load instead of an
    /// `ArcSwap` load per request); otherwise it is loaded and kept. The keeper drops `kept`
    /// when it goes idle, so that it does not hold an old config alive.
    pub fn snapshot_for(&self, kept: &mut Option<(u64, Arc<Snapshot>)>) -> Arc<Snapshot> {
        let swaps = self.swaps.load(Acquire);
        match kept {
            Some((n, s)) if *n == swaps => s.clone(),
            _ => {
                let s = self.current.load_full();
                *kept = Some((swaps, s.clone()));
                s
            }
        }
    }

    /// Whether a snapshot kept by [`Shared::snapshot_for`] is still the current one.
    pub fn is_current(&self, kept: &Option<(u64, Arc<Snapshot>)>) -> bool {
        kept.as_ref()
            .is_some_and(|(n, _)| *n == self.swaps.load(Acquire))
    }

    pub(crate) fn store(&self, snapshot: Snapshot) {
        self.current.store(Arc::new(snapshot));
        self.swaps.fetch_add(1, Release);
    }
}

/// A hyper connection builder configured from the limits.
pub(crate) fn http_builder(
    limits: &Limits,
) -> hyper_util::server::conn::auto::Builder<StreamExecutor> {
    let mut b = hyper_util::server::conn::auto::Builder::new(StreamExecutor);
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout.get())
        .max_buf_size((limits.max_header_bytes as usize).max(8192))
        .keep_alive(true);
    b.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_pending_accept_reset_streams(limits.max_pending_reset_streams as usize)
        .max_local_error_reset_streams(limits.max_pending_reset_streams as usize)
        .max_header_list_size(limits.max_header_bytes)
        .initial_stream_window_size(256 * 1024)
        .initial_connection_window_size(1024 * 1024)
        .max_send_buf_size(256 * 1024)
        .keep_alive_interval(Some(limits.idle_timeout.get()))
        .keep_alive_timeout(std::time::Duration::from_secs(20))
        // RFC 8441 extended CONNECT, for WebSocket over HTTP/2.
        .enable_connect_protocol();
    b
}
