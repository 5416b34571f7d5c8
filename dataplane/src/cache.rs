//! The in-memory response cache behind the `cache` route filter.
//!
//! * **Key**: method (HEAD is looked up as GET), host, path and query, plus the route's
//!   `key_headers`; responses with `Vary` are stored per value of the named request headers
//!   (a secondary key), `Vary: *` is never stored.
//! * **Freshness**: the route's `ttl` when set, else `s-maxage`, `max-age`, then
//!   `Expires − Date`. Responses with `no-store`, `private`, `no-cache` or `Set-Cookie`, other
//!   statuses than 200/203/204/301/404/410, and requests with `Authorization` or
//!   `Cache-Control: no-store` bypass the cache; a request's `no-cache`/`max-age=0` skips the
//!   lookup but may refresh the entry.
//! * **Bounded**: total bytes (`cache.max_bytes`) and per entry (`cache.max_entry_bytes`);
//!   past the bound the least recently used entries are evicted, in one pass down to 90%.
//!   Responses are streamed to the client while being copied; a body that outgrows the entry
//!   bound, fails, or ends with trailers is simply not stored.
//! * **Coalescing**: while one request fetches a key, concurrent misses for it wait (bounded)
//!   for that fetch and are then served from the cache.
//! * **Stale-while-revalidate**: an expired entry within its stale window is served with
//!   `X-Cache: STALE` while one background request refreshes it.
//! * Every cacheable response carries `X-Cache: HIT`, `MISS` or `STALE` and hits an `Age`.
//! * [`Cache::purge`] drops entries by host and path prefix (admin `POST /cache/purge`).

use crate::body::{Body, BoxError};
use crate::metrics::Metrics;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body::{Frame, SizeHint};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};
use sweety_config::{CachePolicy, CacheSettings};
use tokio::sync::watch;

static X_CACHE: HeaderName = HeaderName::from_static("x-cache");
/// How long a request waits for a concurrent fetch of the same key before fetching itself.
pub const COALESCE_WAIT: Duration = Duration::from_secs(30);
/// Most `Vary` variants kept per key; older ones are replaced.
pub const MAX_VARIANTS: usize = 16;

/// A stored response.
#[derive(Debug)]
pub struct Entry {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    stored: Instant,
    /// `Age` the response already had when stored, seconds.
    initial_age: u64,
    fresh_for: Duration,
    stale_for: Duration,
    size: u64,
    host: String,
    path: String,
    /// The stored headers HPACK-encoded, for Sweety's HTTP/2 engine: built on its first hit
    /// there (never for entries only other protocols read).
    encoded: OnceLock<sweety_h2::Encoded>,
    /// The stored fields can go out ahead of a hit's `age` and `x-cache` as they are: none of
    /// them is `age`, `x-cache` or connection-specific (see [`StoredHead`]).
    plain_head: bool,
    has_date: bool,
    has_content_length: bool,
}

impl Entry {
    fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.stored) + Duration::from_secs(self.initial_age)
    }

    fn encoded(&self) -> &sweety_h2::Encoded {
        self.encoded
            .get_or_init(|| sweety_h2::Encoded::new(&self.headers))
    }
}

/// Whether a stored head can be sent ahead of a hit's own fields unchanged: none of its fields
/// is one a hit replaces (`age`, `x-cache`) or one an HTTP/2 response must not carry.
fn plain_head(headers: &HeaderMap) -> bool {
    !headers
        .keys()
        .any(|n| n == header::AGE || n == X_CACHE || crate::conn_headers::may_strip(n))
}

/// A cache hit's head for Sweety's HTTP/2 engine, left out of the response's header map: the
/// stored fields (HPACK-encoded once per entry), then `age` and `x-cache`. The fields of the
/// response's own map (empty from the cache; the response phase may add fields the stored head
/// does not have) follow them. [`StoredHead::materialize`] turns it into the map a hit has on
/// every other path, field for field; the engine sends the same bytes either way.
#[derive(Debug)]
pub struct StoredHead {
    entry: Arc<Entry>,
    age: u64,
    how: &'static str,
}

impl StoredHead {
    /// The stored fields, HPACK-encoded without the dynamic table.
    pub fn block(&self) -> &[u8] {
        self.entry.encoded().block()
    }

    /// The hit's `age`, seconds.
    pub fn age(&self) -> u64 {
        self.age
    }

    /// The hit's `x-cache` value.
    pub fn x_cache(&self) -> &'static str {
        self.how
    }

    /// Whether the head has a field `name` (stored, `age` or `x-cache`).
    pub fn contains(&self, name: &HeaderName) -> bool {
        if name == header::DATE {
            return self.entry.has_date;
        }
        if name == header::CONTENT_LENGTH {
            return self.entry.has_content_length;
        }
        name == header::AGE || name == X_CACHE || self.entry.headers.contains_key(name)
    }

    /// Puts the head into the response's header map, exactly as a hit answered with a map
    /// has it, ahead of the fields already there. `hpack`: the response goes out over HTTP/2;
    /// attach the stored fields' encoding (Sweety's engine sends it as is if the map still
    /// starts with those fields).
    pub fn materialize(self, resp: &mut Response<Body>, hpack: bool) {
        let extra = std::mem::take(resp.headers_mut());
        *resp.headers_mut() = hit_headers(&self.entry, self.age, self.how, false);
        let h = resp.headers_mut();
        let mut last = None;
        for (name, value) in extra {
            if let Some(n) = name {
                last = Some(n);
            }
            if let Some(n) = &last {
                h.append(n, value);
            }
        }
        if hpack {
            resp.extensions_mut().insert(self.entry.encoded().clone());
        }
    }
}

impl sweety_h2::EncodedHead for StoredHead {
    /// The stored fields, then `age` and `x-cache`: the fields a hit's map starts with.
    fn encode(&self, dst: &mut BytesMut) {
        dst.extend_from_slice(self.block());
        hit_fields(dst, self.age, self.how);
    }

    fn contains(&self, name: &HeaderName) -> bool {
        StoredHead::contains(self, name)
    }
}

/// Appends the HPACK encoding of `age: {age}` and `x-cache: {how}`. Hits within a second of
/// each other mostly have the same pair: its encoding is kept per thread.
fn hit_fields(dst: &mut bytes::BytesMut, age: u64, how: &'static str) {
    use std::cell::RefCell;
    thread_local! {
        static LAST: RefCell<(u64, &'static str, Vec<u8>)> = const { RefCell::new((0, "", Vec::new())) };
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != age || last.1 != how || last.2.is_empty() {
            let mut b = bytes::BytesMut::new();
            let mut digits = [0u8; 20];
            sweety_h2::hpack::Encoder::field(&mut b, b"age", decimal(age, &mut digits), false);
            sweety_h2::hpack::Encoder::field(&mut b, b"x-cache", how.as_bytes(), false);
            *last = (age, how, b.to_vec());
        }
        dst.extend_from_slice(&last.2);
    });
}

/// `n` in decimal ASCII, written into `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

struct Slot {
    entry: Arc<Entry>,
    used: u64,
}

#[derive(Default)]
struct Store {
    entries: HashMap<String, Slot>,
    /// Primary key → the request headers its responses vary on.
    vary: HashMap<String, Arc<[HeaderName]>>,
    tick: u64,
    bytes: u64,
}

/// What a lookup found.
#[derive(Debug)]
pub enum Found {
    /// A fresh entry.
    Fresh(Arc<Entry>),
    /// An expired entry still inside its stale-while-revalidate window.
    Stale(Arc<Entry>),
    /// Nothing usable.
    Miss,
}

/// The process-wide response cache; survives config reloads.
pub struct Cache {
    store: Mutex<Store>,
    limits: Mutex<CacheSettings>,
    inflight: Mutex<HashMap<String, watch::Receiver<bool>>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").finish_non_exhaustive()
    }
}

/// Releases a key's in-flight mark (waking waiters) when dropped.
pub struct Inflight {
    cache: Arc<Cache>,
    key: String,
    tx: watch::Sender<bool>,
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.cache
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
        let _ = self.tx.send(true);
    }
}

/// A cacheable request's identity.
#[derive(Debug, Clone)]
pub struct RequestKey {
    /// `GET\0host\0path?query` and the key headers.
    primary: String,
    /// End of the host in `primary` (it starts at 4).
    host_end: usize,
    /// End of the path (without query) in `primary`.
    path_end: usize,
    head: bool,
    lookup: bool,
}

impl RequestKey {
    /// The key limited to one scope (scheme, listener port and route, see the pipeline): the
    /// same host and path on another listener, scheme or route is another entry.
    /// Appends `\0\u{1}scheme port route` without formatting machinery (it runs on every
    /// cacheable request).
    pub fn scoped(mut self, scheme: &str, port: u16, route: &str) -> RequestKey {
        let mut buf = [0u8; 20];
        let port = decimal(u64::from(port), &mut buf);
        self.primary
            .reserve(4 + scheme.len() + port.len() + route.len());
        self.primary.push_str("\0\u{1}");
        self.primary.push_str(scheme);
        self.primary.push(' ');
        self.primary.extend(port.iter().map(|&d| char::from(d)));
        self.primary.push(' ');
        self.primary.push_str(route);
        self
    }

    /// The request host.
    fn host(&self) -> &str {
        &self.primary[4..self.host_end]
    }

    /// The request path, without the query.
    fn path(&self) -> &str {
        &self.primary[self.host_end + 1..self.path_end]
    }
}

/// Whether the request may use the cache, and its key. `None`: bypass.
pub fn request_key(
    policy: &CachePolicy,
    method: &Method,
    host: &str,
    uri: &http::Uri,
    headers: &HeaderMap,
) -> Option<RequestKey> {
    let head = *method == Method::HEAD;
    if *method != Method::GET && !head {
        return None;
    }
    if !policy.with_credentials
        && (headers.contains_key(header::AUTHORIZATION) || headers.contains_key(header::COOKIE))
    {
        return None;
    }
    let mut lookup = true;
    for (name, value) in directives(headers.get_all(header::CACHE_CONTROL).iter()) {
        if name.eq_ignore_ascii_case("no-store") {
            return None;
        }
        if name.eq_ignore_ascii_case("no-cache")
            || (name.eq_ignore_ascii_case("max-age") && value == Some("0"))
        {
            lookup = false;
        }
    }
    if headers
        .get(header::PRAGMA)
        .is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"no-cache"))
    {
        lookup = false;
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    // Room for the scope the pipeline appends (`RequestKey::scoped`) as well.
    let mut primary = String::with_capacity(40 + host.len() + path.len());
    primary.push_str("GET\0");
    primary.push_str(host);
    let host_end = primary.len();
    primary.push('\0');
    primary.push_str(path);
    let path_end = host_end + 1 + path.find('?').unwrap_or(path.len());
    for name in &policy.key_headers {
        primary.push('\0');
        primary.push_str(name);
        primary.push('=');
        for v in headers.get_all(name.as_str()) {
            primary.push_str(&String::from_utf8_lossy(v.as_bytes()));
            primary.push(',');
        }
    }
    Some(RequestKey {
        primary,
        host_end,
        path_end,
        head,
        lookup,
    })
}

/// Cache-Control directives: name (compare without regard to case) and optional unquoted
/// value, borrowed from the header values (nothing is allocated).
fn directives<'a>(
    values: impl Iterator<Item = &'a HeaderValue>,
) -> impl Iterator<Item = (&'a str, Option<&'a str>)> {
    values
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|d| {
            let d = d.trim();
            if d.is_empty() {
                return None;
            }
            Some(match d.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
                None => (d, None),
            })
        })
}

/// How long a response may be stored and served fresh, and its stale window; `None` when it
/// must not be stored.
pub fn storable(
    policy: &CachePolicy,
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
) -> Option<(Duration, Duration)> {
    if !matches!(status.as_u16(), 200 | 203 | 204 | 301 | 404 | 410) {
        return None;
    }
    if headers.contains_key(header::SET_COOKIE) {
        return None;
    }
    if headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim() == "*")
    {
        return None;
    }
    let mut max_age = None;
    let mut s_maxage = None;
    let mut swr = None;
    for (n, v) in directives(headers.get_all(header::CACHE_CONTROL).iter()) {
        let secs = || v.and_then(|s| s.parse::<u64>().ok());
        let is = |name: &str| n.eq_ignore_ascii_case(name);
        if is("no-store") || is("private") || is("no-cache") {
            return None;
        } else if is("max-age") {
            max_age = secs();
        } else if is("s-maxage") {
            s_maxage = secs();
        } else if is("stale-while-revalidate") {
            swr = secs();
        }
    }
    let fresh = match policy.ttl {
        Some(t) => t.get(),
        None => match s_maxage.or(max_age) {
            Some(s) => Duration::from_secs(s),
            None => {
                let expires = headers
                    .get(header::EXPIRES)
                    .and_then(|v| httpdate::parse_http_date(v.to_str().ok()?).ok())?;
                let date = headers
                    .get(header::DATE)
                    .and_then(|v| httpdate::parse_http_date(v.to_str().ok()?).ok())
                    .unwrap_or(now);
                expires.duration_since(date).unwrap_or(Duration::ZERO)
            }
        },
    };
    let stale = policy
        .stale_while_revalidate
        .map(|d| d.get())
        .unwrap_or_default()
        .max(Duration::from_secs(swr.unwrap_or(0)));
    if fresh.is_zero() && stale.is_zero() {
        return None;
    }
    Some((fresh, stale))
}

fn entry_size(key: &str, headers: &HeaderMap, body: usize) -> u64 {
    let h: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 32)
        .sum();
    (key.len() * 2 + h + body + 256) as u64
}

fn vary_names(headers: &HeaderMap) -> Vec<HeaderName> {
    let mut v: Vec<HeaderName> = headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    v.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    v.dedup();
    v
}

fn full_key(primary: &str, vary: &[HeaderName], req: &HeaderMap) -> String {
    if vary.is_empty() {
        return primary.to_string();
    }
    let mut k = String::with_capacity(primary.len() + 32);
    k.push_str(primary);
    k.push_str("\0vary");
    for n in vary {
        k.push('\0');
        if *n == header::ACCEPT_ENCODING {
            // The codings and their weights, not the header's spelling: clients that accept
            // the same codings share a variant ("gzip, br" and "br,gzip" are one).
            let mut codings: Vec<(&str, u16)> = req
                .get_all(n)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(crate::compress::accept_codings)
                .collect();
            codings.sort_by(|a, b| lower(a.0).cmp(lower(b.0)).then(a.1.cmp(&b.1)));
            codings.dedup_by(|a, b| a.0.eq_ignore_ascii_case(b.0) && a.1 == b.1);
            for (c, q) in codings {
                k.extend(lower(c).map(char::from));
                // Writing into a String cannot fail.
                let _ = write!(k, "={q},");
            }
            continue;
        }
        for v in req.get_all(n) {
            k.push_str(&String::from_utf8_lossy(v.as_bytes()));
            k.push(',');
        }
    }
    k
}

/// `s` in ASCII lower case, without allocating.
fn lower(s: &str) -> impl Iterator<Item = u8> + '_ {
    s.bytes().map(|b| b.to_ascii_lowercase())
}

impl Cache {
    /// An empty cache with the given bounds.
    pub fn new(settings: CacheSettings, metrics: Arc<Metrics>) -> Cache {
        Cache {
            store: Mutex::new(Store::default()),
            limits: Mutex::new(settings),
            inflight: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Applies new bounds (on config reload), evicting at once if the cache is now too big.
    pub fn configure(&self, settings: &CacheSettings) {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner()) = settings.clone();
        let mut s = self.store.lock().unwrap_or_else(|p| p.into_inner());
        self.evict(&mut s, settings.max_bytes);
    }

    fn settings(&self) -> CacheSettings {
        self.limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Looks `key` up for a request with headers `req`.
    pub fn lookup(&self, key: &RequestKey, req: &HeaderMap, now: Instant) -> Found {
        let mut s = self.store.lock().unwrap_or_else(|p| p.into_inner());
        // No key varies (the common case): one hash of the key, not two.
        let vary = if s.vary.is_empty() {
            None
        } else {
            s.vary.get(&key.primary)
        };
        let full: std::borrow::Cow<'_, str> = match vary {
            Some(v) => full_key(&key.primary, v, req).into(),
            None => key.primary.as_str().into(),
        };
        s.tick += 1;
        let tick = s.tick;
        let Some(slot) = s.entries.get_mut(&*full) else {
            return Found::Miss;
        };
        let age = now.saturating_duration_since(slot.entry.stored);
        if age < slot.entry.fresh_for {
            slot.used = tick;
            Found::Fresh(slot.entry.clone())
        } else if age < slot.entry.fresh_for + slot.entry.stale_for {
            slot.used = tick;
            Found::Stale(slot.entry.clone())
        } else {
            let gone = s
                .entries
                .remove(&*full)
                .map(|sl| sl.entry.size)
                .unwrap_or(0);
            s.bytes -= gone;
            self.sync_gauges(&s);
            Found::Miss
        }
    }

    /// Stores a response under `key` (for a request with headers `req`).
    #[allow(clippy::too_many_arguments)]
    pub fn insert(
        &self,
        key: &RequestKey,
        req: &HeaderMap,
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        fresh_for: Duration,
        stale_for: Duration,
    ) -> bool {
        let limits = self.settings();
        let vary = vary_names(&headers);
        let full = full_key(&key.primary, &vary, req);
        let size = entry_size(&full, &headers, body.len());
        if size > limits.max_entry_bytes {
            return false;
        }
        let initial_age = headers
            .get(header::AGE)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(0);
        let headers = compact_values(headers);
        let entry = Arc::new(Entry {
            status,
            encoded: OnceLock::new(),
            plain_head: plain_head(&headers),
            has_date: headers.contains_key(header::DATE),
            has_content_length: headers.contains_key(header::CONTENT_LENGTH),
            headers,
            body,
            stored: Instant::now(),
            initial_age,
            fresh_for,
            stale_for,
            size,
            host: key.host().to_string(),
            path: key.path().to_string(),
        });
        let mut s = self.store.lock().unwrap_or_else(|p| p.into_inner());
        // A change of the Vary set makes the older entries of this key unreachable (the plain
        // one or the variants): drop them.
        let old_vary = s.vary.get(&key.primary).cloned();
        if old_vary.as_deref().unwrap_or_default() != vary.as_slice() {
            self.remove_where(&mut s, |k, _| {
                k == key.primary
                    || (k.starts_with(key.primary.as_str())
                        && k.as_bytes().get(key.primary.len()..key.primary.len() + 5)
                            == Some(b"\0vary"))
            });
            if vary.is_empty() {
                s.vary.remove(&key.primary);
            } else {
                s.vary.insert(key.primary.clone(), vary.into());
            }
        }
        if s.vary.contains_key(&key.primary) {
            let prefix = format!("{}\0vary", key.primary);
            let variants = s.entries.keys().filter(|k| k.starts_with(&prefix)).count();
            if variants >= MAX_VARIANTS {
                self.remove_where(&mut s, |k, _| k.starts_with(&prefix));
            }
        }
        s.tick += 1;
        let used = s.tick;
        if let Some(old) = s.entries.insert(full, Slot { entry, used }) {
            s.bytes -= old.entry.size;
        }
        s.bytes += size;
        self.evict(&mut s, limits.max_bytes);
        self.sync_gauges(&s);
        true
    }

    fn remove_where(&self, s: &mut Store, pred: impl Fn(&str, &Entry) -> bool) -> u64 {
        let doomed: Vec<String> = s
            .entries
            .iter()
            .filter(|(k, slot)| pred(k, &slot.entry))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &doomed {
            if let Some(slot) = s.entries.remove(k) {
                s.bytes -= slot.entry.size;
            }
        }
        doomed.len() as u64
    }

    /// Evicts least recently used entries until at most 90% of `max` is used (only when
    /// over `max`).
    fn evict(&self, s: &mut Store, max: u64) {
        if s.bytes <= max {
            return;
        }
        let target = max / 10 * 9;
        let mut order: Vec<(u64, String)> = s
            .entries
            .iter()
            .map(|(k, slot)| (slot.used, k.clone()))
            .collect();
        order.sort_unstable();
        for (_, k) in order {
            if s.bytes <= target {
                break;
            }
            if let Some(slot) = s.entries.remove(&k) {
                s.bytes -= slot.entry.size;
                self.metrics.edge.cache_evictions.fetch_add(1, Relaxed);
            }
        }
        self.sync_gauges(s);
    }

    fn sync_gauges(&self, s: &Store) {
        self.metrics.edge.cache_bytes.store(s.bytes as i64, Relaxed);
        self.metrics
            .edge
            .cache_entries
            .store(s.entries.len() as i64, Relaxed);
    }

    /// Removes entries whose host equals `host` (any when `None`) and whose path starts with
    /// `path_prefix` (any when `None`). Returns how many were removed.
    pub fn purge(&self, host: Option<&str>, path_prefix: Option<&str>) -> u64 {
        let mut s = self.store.lock().unwrap_or_else(|p| p.into_inner());
        let n = self.remove_where(&mut s, |_, e| {
            host.is_none_or(|h| e.host.eq_ignore_ascii_case(h))
                && path_prefix.is_none_or(|p| e.path.starts_with(p))
        });
        self.sync_gauges(&s);
        self.metrics.edge.cache_purged.fetch_add(n, Relaxed);
        n
    }

    /// Entries and bytes held.
    pub fn usage(&self) -> (usize, u64) {
        let s = self.store.lock().unwrap_or_else(|p| p.into_inner());
        (s.entries.len(), s.bytes)
    }

    /// Marks `key` as being fetched. `Err(rx)`: someone else is; wait on `rx`.
    fn begin(self: &Arc<Self>, primary: &str) -> Result<Inflight, watch::Receiver<bool>> {
        let mut m = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rx) = m.get(primary) {
            return Err(rx.clone());
        }
        let (tx, rx) = watch::channel(false);
        m.insert(primary.to_string(), rx);
        Ok(Inflight {
            cache: self.clone(),
            key: primary.to_string(),
            tx,
        })
    }

    /// Serves a cacheable request: from the cache, or through `fetch` (storing the
    /// response while streaming it). `refresh` fetches the same request again in the
    /// background for stale-while-revalidate. `first`: what [`Cache::fresh_hit`] already
    /// found for this request (not looked up again).
    #[allow(clippy::too_many_arguments)]
    pub async fn serve<F, Fut, R, RFut>(
        self: &Arc<Self>,
        policy: &CachePolicy,
        key: RequestKey,
        parts: http::request::Parts,
        body: Body,
        first: Option<Found>,
        fetch: F,
        refresh: R,
    ) -> Response<Body>
    where
        F: FnOnce(http::request::Parts, Body) -> Fut,
        Fut: Future<Output = Response<Body>>,
        R: FnOnce(&http::request::Parts) -> RFut,
        RFut: Future<Output = Response<Body>> + Send + 'static,
    {
        let mut waited = false;
        let mut first = first;
        let guard = loop {
            if key.lookup {
                let now = Instant::now();
                let found = match first.take() {
                    Some(f) => f,
                    None => self.lookup(&key, &parts.headers, now),
                };
                match found {
                    Found::Fresh(e) => {
                        self.metrics.edge.cache_hits.fetch_add(1, Relaxed);
                        return respond(&e, key.head, "HIT", now);
                    }
                    Found::Stale(e) => {
                        self.metrics.edge.cache_stale.fetch_add(1, Relaxed);
                        if let Ok(g) = self.begin(&key.primary) {
                            let this = self.clone();
                            let policy = policy.clone();
                            let key = key.clone();
                            let fut = refresh(&parts);
                            let req_headers = parts.headers.clone();
                            tokio::spawn(async move {
                                let resp = fut.await;
                                let resp = this.store_streamed(&policy, &key, req_headers, resp, g);
                                let mut body = resp.into_body();
                                while let Some(Ok(_)) =
                                    http_body_util::BodyExt::frame(&mut body).await
                                {
                                }
                            });
                        }
                        return respond(&e, key.head, "STALE", now);
                    }
                    Found::Miss => {}
                }
            }
            if key.head {
                // HEAD misses are passed through: there is no body to store.
                self.metrics.edge.cache_misses.fetch_add(1, Relaxed);
                let mut r = fetch(parts, body).await;
                r.headers_mut()
                    .insert(&X_CACHE, HeaderValue::from_static("MISS"));
                return r;
            }
            match self.begin(&key.primary) {
                Ok(g) => break Some(g),
                Err(mut rx) if !waited => {
                    waited = true;
                    let _ = tokio::time::timeout(COALESCE_WAIT, rx.wait_for(|done| *done)).await;
                }
                Err(_) => break None,
            }
        };
        self.metrics.edge.cache_misses.fetch_add(1, Relaxed);
        let req_headers = guard.as_ref().map(|_| parts.headers.clone());
        let resp = fetch(parts, body).await;
        let mut resp = match (guard, req_headers) {
            (Some(g), Some(h)) => self.store_streamed(policy, &key, h, resp, g),
            _ => resp,
        };
        resp.headers_mut()
            .insert(&X_CACHE, HeaderValue::from_static("MISS"));
        resp
    }

    /// The answer from a fresh entry for `key` (`X-Cache: HIT`, counted as a hit) at `now`.
    /// Otherwise what the lookup found (`None`: the request skips the lookup), for
    /// [`Cache::serve`] to go on with (stale entries, coalescing, the fetch) without looking
    /// the key up again. Lets the pipeline answer a hit before it builds anything for the
    /// upstream path. `hpack`: the response goes out over HTTP/2, where the head can stay a
    /// [`StoredHead`] beside the map (when the entry's head allows it and the request is no
    /// HEAD) or comes with its encoding attached.
    pub fn fresh_hit(
        &self,
        key: &RequestKey,
        req: &HeaderMap,
        now: Instant,
        hpack: bool,
    ) -> Result<(Response<Body>, Option<StoredHead>), Option<Found>> {
        if !key.lookup {
            return Err(None);
        }
        match self.lookup(key, req, now) {
            Found::Fresh(e) => {
                self.metrics.edge.cache_hits.fetch_add(1, Relaxed);
                if hpack && e.plain_head && !key.head {
                    let mut r = Response::new(crate::body::full(e.body.clone()));
                    *r.status_mut() = e.status;
                    let age = e.age(now).as_secs();
                    return Ok((
                        r,
                        Some(StoredHead {
                            entry: e,
                            age,
                            how: "HIT",
                        }),
                    ));
                }
                let mut r = respond(&e, key.head, "HIT", now);
                if hpack {
                    // Sweety's engine sends the stored fields' encoding as is when the response
                    // still starts with them unchanged (it checks).
                    r.extensions_mut().insert(e.encoded().clone());
                }
                Ok((r, None))
            }
            other => Err(Some(other)),
        }
    }

    /// Wraps the response body so that it is stored when complete (if storable).
    fn store_streamed(
        self: &Arc<Self>,
        policy: &CachePolicy,
        key: &RequestKey,
        req_headers: HeaderMap,
        resp: Response<Body>,
        guard: Inflight,
    ) -> Response<Body> {
        let Some((fresh, stale)) =
            storable(policy, resp.status(), resp.headers(), SystemTime::now())
        else {
            return resp;
        };
        let max_entry = self.settings().max_entry_bytes;
        if resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_some_and(|n| n > max_entry)
        {
            return resp;
        }
        let (parts, body) = resp.into_parts();
        let mut stored_headers = parts.headers.clone();
        stored_headers.remove(&X_CACHE);
        let pending = Pending {
            cache: self.clone(),
            key: key.clone(),
            req_headers,
            status: parts.status,
            headers: stored_headers,
            fresh,
            stale,
            _guard: guard,
        };
        if http_body::Body::is_end_stream(&body) {
            // An empty body is never polled: store it now.
            pending.store(BytesMut::new());
            return Response::from_parts(parts, body);
        }
        let tee = TeeBody {
            inner: body,
            buf: Some(BytesMut::new()),
            max: max_entry as usize,
            done: Some(pending),
        };
        Response::from_parts(parts, crate::body::boxed(tee))
    }
}

/// The same header map with every value a slice of one buffer: a hit clones the map, and
/// its values then share one reference count (one cache line) instead of one each.
fn compact_values(headers: HeaderMap) -> HeaderMap {
    let total: usize = headers.values().map(|v| v.len()).sum();
    let mut buf = BytesMut::with_capacity(total);
    for v in headers.values() {
        buf.extend_from_slice(v.as_bytes());
    }
    let buf = buf.freeze();
    let mut out = HeaderMap::with_capacity(headers.len());
    let mut at = 0;
    let mut last = None;
    for (name, v) in headers {
        let name = name
            .or_else(|| last.clone())
            .expect("the first field has a name");
        let end = at + v.len();
        let compact = HeaderValue::from_maybe_shared(buf.slice(at..end));
        // The bytes are the value's own, so they are valid; keep the value if not.
        let mut nv = compact.unwrap_or_else(|_| v.clone());
        nv.set_sensitive(v.is_sensitive());
        out.append(&name, nv);
        last = Some(name);
        at = end;
    }
    out
}

fn respond(e: &Entry, head: bool, how: &'static str, now: Instant) -> Response<Body> {
    let mut r = Response::new(if head {
        crate::body::empty()
    } else {
        crate::body::full(e.body.clone())
    });
    *r.status_mut() = e.status;
    *r.headers_mut() = hit_headers(e, e.age(now).as_secs(), how, head);
    r
}

/// A hit's header map: the stored fields, `age`, `x-cache` and for HEAD the length.
fn hit_headers(e: &Entry, age: u64, how: &'static str, head: bool) -> HeaderMap {
    let mut h = e.headers.clone();
    h.insert(header::AGE, HeaderValue::from(age));
    h.insert(&X_CACHE, HeaderValue::from_static(how));
    if head {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(e.body.len()));
    }
    h
}

struct Pending {
    cache: Arc<Cache>,
    key: RequestKey,
    req_headers: HeaderMap,
    status: StatusCode,
    headers: HeaderMap,
    fresh: Duration,
    stale: Duration,
    _guard: Inflight,
}

pin_project_lite::pin_project! {
    /// Passes a response body through while copying it (up to the entry bound) for the cache.
    struct TeeBody {
        #[pin]
        inner: Body,
        buf: Option<BytesMut>,
        max: usize,
        done: Option<Pending>,
    }
}

impl Pending {
    fn store(self, body: BytesMut) {
        self.cache.insert(
            &self.key,
            &self.req_headers,
            self.status,
            self.headers,
            body.freeze(),
            self.fresh,
            self.stale,
        );
    }
}

impl http_body::Body for TeeBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let r = this.inner.as_mut().poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => match f.data_ref() {
                Some(d) => {
                    let over = this
                        .buf
                        .as_ref()
                        .is_some_and(|b| b.len() + d.len() > *this.max);
                    if over {
                        *this.buf = None;
                    } else if let Some(b) = this.buf.as_mut() {
                        b.extend_from_slice(d);
                    }
                    // HTTP/1.1 stops polling once Content-Length bytes are out: store as soon
                    // as the inner body knows it is complete.
                    if this.inner.is_end_stream() {
                        if let (Some(p), Some(b)) = (this.done.take(), this.buf.take()) {
                            p.store(b);
                        }
                    }
                }
                // Trailers are not stored: a response that has them is not cached.
                None => *this.buf = None,
            },
            Poll::Ready(None) => {
                if let (Some(p), Some(b)) = (this.done.take(), this.buf.take()) {
                    p.store(b);
                }
            }
            Poll::Ready(Some(Err(_))) => {
                *this.buf = None;
                this.done.take();
            }
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.done.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn compacted_headers_are_the_same_fields_in_the_same_order() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        h.append("set-cookie", HeaderValue::from_static("a=1"));
        h.append("set-cookie", HeaderValue::from_static("b=2"));
        let mut secret = HeaderValue::from_static("s");
        secret.set_sensitive(true);
        h.insert("authorization", secret);
        let c = compact_values(h.clone());
        let before: Vec<_> = h
            .iter()
            .map(|(n, v)| (n.clone(), v.clone(), v.is_sensitive()))
            .collect();
        let after: Vec<_> = c
            .iter()
            .map(|(n, v)| (n.clone(), v.clone(), v.is_sensitive()))
            .collect();
        assert_eq!(before, after);
        // One buffer: the values are adjacent slices of it.
        let a = c.get("content-type").unwrap().as_bytes().as_ptr() as usize;
        let b = c
            .get_all("set-cookie")
            .iter()
            .next()
            .unwrap()
            .as_bytes()
            .as_ptr() as usize;
        assert_eq!(b - a, "text/plain".len());
    }

    use super::*;

    #[test]
    fn accept_encoding_variants_are_keyed_on_codings_not_spelling() {
        let vary = [header::ACCEPT_ENCODING];
        let key = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
            }
            full_key("GET h /", &vary, &h)
        };
        assert_eq!(key(&["gzip, deflate, br"]), key(&["br,GZIP ,deflate"]));
        assert_eq!(key(&["gzip", "br"]), key(&["br, gzip"]));
        assert_ne!(key(&["gzip, br"]), key(&["gzip"]));
        assert_ne!(key(&["gzip;q=0.5, br"]), key(&["gzip, br"]));
        assert_ne!(key(&["gzip"]), key(&[]));
    }
    use http_body_util::BodyExt;
    use std::sync::atomic::AtomicUsize;

    fn hm(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn key(path: &str, req: &HeaderMap) -> RequestKey {
        request_key(
            &CachePolicy::default(),
            &Method::GET,
            "a.test",
            &path.parse().unwrap(),
            req,
        )
        .unwrap()
    }

    fn cache(max: u64, entry: u64) -> Arc<Cache> {
        Arc::new(Cache::new(
            CacheSettings {
                max_bytes: max,
                max_entry_bytes: entry,
            },
            Arc::new(Metrics::default()),
        ))
    }

    /// The HPACK bytes of a hit's fields (after `:status`) as the engine sends them.
    fn engine_fields(resp: &Response<Body>, stored: Option<&StoredHead>) -> BytesMut {
        let mut b = BytesMut::new();
        sweety_h2::encode_fields(&mut b, resp.headers(), resp.extensions(), stored);
        b
    }

    /// Every field of a map encoded one by one, no shortcut.
    fn plain_fields(h: &HeaderMap) -> BytesMut {
        let mut b = BytesMut::new();
        for (n, v) in h {
            crate::hpack::Encoder::field(
                &mut b,
                n.as_str().as_bytes(),
                v.as_bytes(),
                v.is_sensitive(),
            );
        }
        b
    }

    #[test]
    fn an_engine_hit_keeps_its_stored_head_and_sends_the_same_fields() {
        let c = cache(1 << 20, 1 << 16);
        let req = HeaderMap::new();
        let k = key("/h", &req);
        let mut secret = HeaderValue::from_static("token");
        secret.set_sensitive(true);
        let mut stored = hm(&[
            ("server", "origin"),
            ("content-type", "text/plain"),
            ("x-multi", "1"),
            ("x-multi", "2"),
            ("content-length", "5"),
            ("date", "Sun, 22 Nov 2026 13:37:43 GMT"),
        ]);
        stored.insert("x-secret", secret);
        let (fresh, stale) = (Duration::from_secs(60), Duration::ZERO);
        assert!(c.insert(
            &k,
            &req,
            StatusCode::OK,
            stored,
            Bytes::from_static(b"hello"),
            fresh,
            stale
        ));
        let now = Instant::now() + Duration::from_secs(7);

        // Other protocols: the whole head in the map, no encoding attached.
        let (plain, none) = c.fresh_hit(&k, &req, now, false).unwrap();
        assert!(none.is_none());
        assert!(plain.extensions().get::<sweety_h2::Encoded>().is_none());
        assert_eq!(plain.headers()["age"], "7");
        assert_eq!(plain.headers()["x-cache"], "HIT");
        assert_eq!(
            plain
                .headers()
                .keys()
                .map(|n| n.as_str())
                .collect::<Vec<_>>(),
            [
                "server",
                "content-type",
                "x-multi",
                "content-length",
                "date",
                "x-secret",
                "age",
                "x-cache"
            ]
        );

        // The engine: an empty map and the stored head beside it.
        let (lazy, head) = c.fresh_hit(&k, &req, now, true).unwrap();
        let head = head.expect("a stored head for the engine");
        assert!(lazy.headers().is_empty());
        assert_eq!(lazy.status(), StatusCode::OK);
        for name in ["date", "content-length", "age", "x-cache", "x-secret"] {
            assert!(head.contains(&HeaderName::from_static(name)), "{name}");
        }
        assert!(!head.contains(&header::ALT_SVC));
        let want = plain_fields(plain.headers());
        assert_eq!(engine_fields(&lazy, Some(&head)), want);
        // Fields the response phase adds come after the head, as in a map.
        let mut lazy2 = Response::new(crate::body::empty());
        lazy2
            .headers_mut()
            .insert(header::ALT_SVC, HeaderValue::from_static("h3=\":443\""));
        let mut plain2 = Response::new(crate::body::empty());
        *plain2.headers_mut() = plain.headers().clone();
        plain2
            .headers_mut()
            .insert(header::ALT_SVC, HeaderValue::from_static("h3=\":443\""));
        assert_eq!(
            engine_fields(&lazy2, Some(&head)),
            plain_fields(plain2.headers())
        );

        // Materialized (for the response filters): the same map, plus the encoding for the
        // engine, which then sends the same bytes again.
        let mut m = lazy;
        head.materialize(&mut m, true);
        assert_eq!(
            m.headers().iter().collect::<Vec<_>>(),
            plain.headers().iter().collect::<Vec<_>>()
        );
        assert!(m.headers()["x-secret"].is_sensitive());
        assert!(m.extensions().get::<sweety_h2::Encoded>().is_some());
        assert_eq!(engine_fields(&m, None), want);

        // HEAD gets its length in the map: no stored head.
        let hk = request_key(
            &CachePolicy::default(),
            &Method::HEAD,
            "a.test",
            &"/h".parse().unwrap(),
            &req,
        )
        .unwrap();
        let (h, none) = c.fresh_hit(&hk, &req, now, true).unwrap();
        assert!(none.is_none());
        assert_eq!(h.headers()["content-length"], "5");
        assert_eq!(engine_fields(&h, None), plain_fields(h.headers()));

        // A stored head with a field a hit replaces stays in the map.
        let k2 = key("/aged", &req);
        let aged = hm(&[("content-type", "text/plain"), ("age", "30")]);
        assert!(c.insert(
            &k2,
            &req,
            StatusCode::OK,
            aged,
            Bytes::from_static(b"x"),
            fresh,
            stale
        ));
        let later = Instant::now() + Duration::from_secs(7);
        let (r, none) = c.fresh_hit(&k2, &req, later, true).unwrap();
        assert!(none.is_none());
        assert_eq!(r.headers()["age"], "37");
        assert_eq!(engine_fields(&r, None), plain_fields(r.headers()));

        // What else a lookup finds goes on to `serve`; skipped lookups say so.
        assert!(matches!(
            c.fresh_hit(&key("/none", &req), &req, now, true),
            Err(Some(Found::Miss))
        ));
        let mut nc = key("/h", &req);
        nc.lookup = false;
        assert!(matches!(c.fresh_hit(&nc, &req, now, true), Err(None)));
        assert_eq!(c.metrics.edge.cache_hits.load(Relaxed), 4);
    }

    #[test]
    fn storable_honours_cache_control_and_expires() {
        let p = CachePolicy::default();
        let now = SystemTime::now();
        let s = |h: &[(&str, &str)]| storable(&p, StatusCode::OK, &hm(h), now);
        assert_eq!(
            s(&[("cache-control", "public, max-age=60")]),
            Some((Duration::from_secs(60), Duration::ZERO))
        );
        assert_eq!(
            s(&[(
                "cache-control",
                "max-age=60, s-maxage=5, stale-while-revalidate=7"
            )]),
            Some((Duration::from_secs(5), Duration::from_secs(7)))
        );
        assert_eq!(s(&[("cache-control", "max-age=60, private")]), None);
        assert_eq!(s(&[("cache-control", "no-store")]), None);
        assert_eq!(s(&[("cache-control", "no-cache, max-age=60")]), None);
        assert_eq!(s(&[]), None);
        assert_eq!(s(&[("cache-control", "max-age=60"), ("vary", "*")]), None);
        assert_eq!(
            s(&[("cache-control", "max-age=60"), ("set-cookie", "a=b")]),
            None
        );
        let date = httpdate::fmt_http_date(now);
        let exp = httpdate::fmt_http_date(now + Duration::from_secs(120));
        assert_eq!(
            s(&[("date", &date), ("expires", &exp)]),
            Some((Duration::from_secs(120), Duration::ZERO))
        );
        assert_eq!(
            storable(
                &p,
                StatusCode::INTERNAL_SERVER_ERROR,
                &hm(&[("cache-control", "max-age=9")]),
                now
            ),
            None
        );
        // The route TTL overrides, but never no-store / private.
        let ttl = CachePolicy {
            ttl: Some(sweety_config::Duration::from_secs(3)),
            stale_while_revalidate: Some(sweety_config::Duration::from_secs(10)),
            ..CachePolicy::default()
        };
        assert_eq!(
            storable(
                &ttl,
                StatusCode::OK,
                &hm(&[("cache-control", "max-age=600")]),
                now
            ),
            Some((Duration::from_secs(3), Duration::from_secs(10)))
        );
        assert_eq!(
            storable(
                &ttl,
                StatusCode::OK,
                &hm(&[("cache-control", "private")]),
                now
            ),
            None
        );
    }

    #[test]
    fn request_side_bypass_and_keys() {
        let p = CachePolicy {
            key_headers: vec!["x-tenant".into()],
            ..CachePolicy::default()
        };
        let uri: http::Uri = "/a?b=1".parse().unwrap();
        let k = |m: Method, h: &[(&str, &str)]| request_key(&p, &m, "a.test", &uri, &hm(h));
        assert!(k(Method::POST, &[]).is_none());
        assert!(k(Method::GET, &[("authorization", "x")]).is_none());
        assert!(k(Method::GET, &[("cookie", "session=1")]).is_none());
        let opted = CachePolicy {
            with_credentials: true,
            ..p.clone()
        };
        assert!(request_key(
            &opted,
            &Method::GET,
            "a.test",
            &uri,
            &hm(&[("cookie", "s=1")])
        )
        .is_some());
        let scoped = |scheme: &str, port: u16, route: &str| {
            request_key(&p, &Method::GET, "a.test", &uri, &hm(&[]))
                .unwrap()
                .scoped(scheme, port, route)
        };
        assert_ne!(
            scoped("http", 80, "r").primary,
            scoped("https", 443, "r").primary
        );
        assert_ne!(
            scoped("http", 80, "r").primary,
            scoped("http", 80, "q").primary
        );
        assert_ne!(
            scoped("http", 80, "r").primary,
            scoped("http", 8, "0 r").primary
        );
        assert_eq!(scoped("http", 80, "r").host(), "a.test");
        assert_eq!(scoped("http", 80, "r").path(), "/a");
        // The scope's bytes: the separator, then scheme, port and route joined by spaces.
        let unscoped = request_key(&p, &Method::GET, "a.test", &uri, &hm(&[])).unwrap();
        for (scheme, port, route) in [
            ("http", 0, "r"),
            ("https", 65535, "ns/route-1"),
            ("http", 8080, ""),
        ] {
            assert_eq!(
                scoped(scheme, port, route).primary,
                format!("{}\0\u{1}{scheme} {port} {route}", unscoped.primary)
            );
        }
        assert!(k(Method::GET, &[("cache-control", "no-store")]).is_none());
        assert!(
            !k(Method::GET, &[("cache-control", "no-cache")])
                .unwrap()
                .lookup
        );
        assert!(
            !k(Method::GET, &[("cache-control", "max-age=0")])
                .unwrap()
                .lookup
        );
        let a = k(Method::GET, &[("x-tenant", "a")]).unwrap();
        let b = k(Method::GET, &[("x-tenant", "b")]).unwrap();
        assert_ne!(a.primary, b.primary);
        let head = k(Method::HEAD, &[("x-tenant", "a")]).unwrap();
        assert_eq!(head.primary, a.primary);
        assert!(head.head);
        assert_eq!((a.host(), a.path()), ("a.test", "/a"));
        let bare = request_key(
            &p,
            &Method::GET,
            "b.test",
            &"/x/y".parse().unwrap(),
            &hm(&[]),
        );
        let bare = bare.unwrap();
        assert_eq!((bare.host(), bare.path()), ("b.test", "/x/y"));
    }

    #[test]
    fn vary_variants_lru_eviction_and_purge() {
        let c = cache(4000, 2000);
        let gzip = hm(&[("accept-encoding", "gzip")]);
        let plain = hm(&[]);
        let k = key("/v", &gzip);
        let vary = hm(&[("vary", "Accept-Encoding")]);
        let d = Duration::from_secs(60);
        assert!(c.insert(
            &k,
            &gzip,
            StatusCode::OK,
            vary.clone(),
            Bytes::from_static(b"G"),
            d,
            Duration::ZERO
        ));
        assert!(matches!(c.lookup(&k, &gzip, Instant::now()), Found::Fresh(e) if e.body == "G"));
        assert!(matches!(c.lookup(&k, &plain, Instant::now()), Found::Miss));
        assert!(c.insert(
            &k,
            &plain,
            StatusCode::OK,
            vary,
            Bytes::from_static(b"P"),
            d,
            Duration::ZERO
        ));
        assert!(matches!(c.lookup(&k, &plain, Instant::now()), Found::Fresh(e) if e.body == "P"));
        assert!(matches!(c.lookup(&k, &gzip, Instant::now()), Found::Fresh(e) if e.body == "G"));

        // The key stops varying: the variants go, the plain entry replaces them.
        let k2 = key("/v2", &plain);
        c.insert(
            &k2,
            &gzip,
            StatusCode::OK,
            hm(&[("vary", "accept-encoding")]),
            Bytes::from_static(b"V"),
            d,
            Duration::ZERO,
        );
        let (n_before, _) = c.usage();
        c.insert(
            &k2,
            &plain,
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from_static(b"N"),
            d,
            Duration::ZERO,
        );
        assert_eq!(c.usage().0, n_before);
        assert!(matches!(c.lookup(&k2, &gzip, Instant::now()), Found::Fresh(e) if e.body == "N"));
        c.purge(None, Some("/v2"));

        // Too large for one entry.
        let big = Bytes::from(vec![b'x'; 2500]);
        assert!(!c.insert(
            &key("/big", &plain),
            &plain,
            StatusCode::OK,
            HeaderMap::new(),
            big,
            d,
            Duration::ZERO
        ));

        // Fill: the least recently used go first.
        let body = Bytes::from(vec![b'y'; 700]);
        for i in 0..5 {
            let kk = key(&format!("/f{i}"), &plain);
            c.insert(
                &kk,
                &plain,
                StatusCode::OK,
                HeaderMap::new(),
                body.clone(),
                d,
                Duration::ZERO,
            );
            // Keep /f0 hot.
            let _ = c.lookup(&key("/f0", &plain), &plain, Instant::now());
        }
        let (_, bytes) = c.usage();
        assert!(bytes <= 4000, "{bytes}");
        assert!(matches!(
            c.lookup(&key("/f0", &plain), &plain, Instant::now()),
            Found::Fresh(_)
        ));
        assert!(matches!(
            c.lookup(&key("/f1", &plain), &plain, Instant::now()),
            Found::Miss
        ));
        assert!(c.metrics.edge.cache_evictions.load(Relaxed) > 0);

        // Purge by prefix.
        let n = c.purge(Some("A.TEST"), Some("/f"));
        assert!(n >= 1);
        assert!(matches!(
            c.lookup(&key("/f0", &plain), &plain, Instant::now()),
            Found::Miss
        ));
        assert_eq!(c.purge(Some("other.test"), None), 0);
    }

    #[test]
    fn expiry_and_stale_window() {
        let c = cache(1 << 20, 1 << 16);
        let h = HeaderMap::new();
        let k = key("/s", &h);
        c.insert(
            &k,
            &h,
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from_static(b"s"),
            Duration::from_secs(10),
            Duration::from_secs(10),
        );
        let t0 = Instant::now();
        assert!(matches!(c.lookup(&k, &h, t0), Found::Fresh(_)));
        assert!(matches!(
            c.lookup(&k, &h, t0 + Duration::from_secs(15)),
            Found::Stale(_)
        ));
        assert!(matches!(
            c.lookup(&k, &h, t0 + Duration::from_secs(25)),
            Found::Miss
        ));
        assert_eq!(c.usage().0, 0);
    }

    fn origin(n: &Arc<AtomicUsize>, cc: &'static str) -> Response<Body> {
        n.fetch_add(1, Relaxed);
        Response::builder()
            .header("cache-control", cc)
            .body(crate::body::full("hello world!"))
            .unwrap()
    }

    #[tokio::test]
    async fn concurrent_misses_make_one_fetch() {
        let c = cache(1 << 20, 1 << 16);
        let calls = Arc::new(AtomicUsize::new(0));
        let p = CachePolicy::default();
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let c = c.clone();
            let calls = calls.clone();
            let p = p.clone();
            tasks.push(tokio::spawn(async move {
                let k = key("/co", &HeaderMap::new());
                let calls2 = calls.clone();
                let (parts, body) = http::Request::new(crate::body::empty()).into_parts();
                let r = c
                    .serve(
                        &p,
                        k,
                        parts,
                        body,
                        None,
                        |_, _| async move {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            origin(&calls, "max-age=60")
                        },
                        move |_| async move { origin(&calls2, "max-age=60") },
                    )
                    .await;
                let x = r.headers()["x-cache"].to_str().unwrap().to_string();
                let b = r.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(b, "hello world!");
                x
            }));
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        assert_eq!(calls.load(Relaxed), 1, "{results:?}");
        assert_eq!(results.iter().filter(|x| *x == "MISS").count(), 1);
        assert_eq!(results.iter().filter(|x| *x == "HIT").count(), 19);
    }

    #[test]
    fn hit_fields_are_encoded_as_a_map_would_have_them() {
        for (age, how) in [
            (0, "HIT"),
            (7, "HIT"),
            (7, "HIT"),
            (7, "STALE"),
            (123_456, "HIT"),
            (0, "HIT"),
        ] {
            let mut want = bytes::BytesMut::new();
            let mut map = http::HeaderMap::new();
            map.insert(http::header::AGE, http::HeaderValue::from(age));
            map.insert("x-cache", http::HeaderValue::from_static(how));
            for (n, v) in &map {
                sweety_h2::encode_field(&mut want, n, v);
            }
            let mut got = bytes::BytesMut::from(&b"prefix"[..]);
            hit_fields(&mut got, age, how);
            assert_eq!(&got[..6], b"prefix");
            assert_eq!(&got[6..], &want[..], "{age} {how}");
        }
    }
}
