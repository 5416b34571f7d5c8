//! The route table: built once per config from [`sweety_config::Config`], then matched per
//! request with Gateway API precedence. Pure: no I/O, no clock, no globals.
//!
//! Lookup is two steps:
//!
//! 1. **Host selection**, per listener: an exact hostname (hash lookup), else the wildcard
//!    `*.suffix` with the longest suffix (one hash lookup per label of the host), else the
//!    listener's catch-all virtual host (one with no hostnames). There is no fall-through: once
//!    a virtual host is chosen, a request none of its routes match is [`Lookup::NoRoute`].
//! 2. **Route selection** inside the virtual host, per (route, match) pair, in Gateway API
//!    HTTPRoute precedence: exact path, then the longest path prefix, then regular expressions;
//!    then a method match before none; then more header matches; then more query matches; then
//!    route order in the config; then match order within the route. Exact paths are found by
//!    a hash lookup; the rest is a scan of a list sorted by that precedence at build time, so
//!    the first pair that matches wins.
//!
//! Each virtual host is compiled on its own (shared behind an `Arc`), so
//! [`RouteTable::build_reusing`] can take unchanged ones from the previous table: a config
//! delta that changes one route recompiles one virtual host, not all of them.

pub mod l4;

use crate::filters::CompiledFilters;
use hashbrown::HashTable;
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::HashMap;
use std::hash::{BuildHasher as _, RandomState};
use std::sync::Arc;
use sweety_config::delta::ListPatch;
use sweety_config::{
    Config, HeaderMatch, MatchKind, PathMatch, QueryMatch, Route, RouteMatch, VirtualHost,
};

/// One route of the table, with its compiled filters.
#[derive(Debug)]
pub struct RouteEntry {
    /// Route name (for metrics and logs).
    pub name: Arc<str>,
    /// Name of the virtual host it belongs to.
    pub vhost: Arc<str>,
    /// The route as configured.
    pub route: Arc<Route>,
    /// Its filters, compiled (one shared empty set for the many routes without filters: a
    /// compiled set is hundreds of bytes).
    pub filters: Arc<CompiledFilters>,
}

/// The compiled filters of a route without filters, shared by all of them.
fn no_filters() -> Arc<CompiledFilters> {
    static EMPTY: std::sync::OnceLock<Arc<CompiledFilters>> = std::sync::OnceLock::new();
    EMPTY
        .get_or_init(|| Arc::new(CompiledFilters::compile(&[]).expect("no filters always compile")))
        .clone()
}

/// The parts of a request that routing looks at.
#[derive(Debug)]
pub struct RequestHead<'a> {
    /// Listener name the request arrived on.
    pub listener: &'a str,
    /// Host without port, lower-cased (from `:authority` or `Host`).
    pub host: &'a str,
    /// Method.
    pub method: &'a http::Method,
    /// Path (no query), as received.
    pub path: &'a str,
    /// Raw query string, if any.
    pub query: Option<&'a str>,
    /// Request headers.
    pub headers: &'a http::HeaderMap,
}

/// A successful match.
#[derive(Debug, Clone, Copy)]
pub struct Matched<'a> {
    /// The route.
    pub entry: &'a RouteEntry,
    /// The prefix that a `prefix` path match matched (for prefix rewrites and redirects).
    ///
    /// It is the configured prefix without its trailing slashes (`/foo/` gives `/foo`), and
    /// `/` for a prefix of `/` or a route without matches. `None` for exact and regex matches.
    pub prefix: Option<&'a str>,
}

/// Result of a lookup.
#[derive(Debug, Clone, Copy)]
pub enum Lookup<'a> {
    /// A route matched.
    Matched(Matched<'a>),
    /// No virtual host on this listener serves the host.
    NoHost,
    /// A virtual host matched but none of its routes did.
    NoRoute,
}

/// Errors building the table (invalid regexes and filters).
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct BuildError {
    /// Config path of the offending field.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// Says whether the virtual host of this name is unchanged since the previous build.
pub type Unchanged<'a> = &'a (dyn Fn(&str) -> bool + Sync);

/// The immutable route table.
///
/// Cloning is cheap (shared chunks and shards), and [`RouteTable::patch`] derives the table
/// of a config that differs in a few virtual hosts from this one in time proportional to
/// those (plus about √N shard and chunk pointers), not to the number of virtual hosts N.
#[derive(Debug, Default, Clone)]
pub struct RouteTable {
    /// Compiled virtual hosts in config order, each with its order key.
    vhosts: Chunked<Slot>,
    /// Number of routes over all virtual hosts.
    len: usize,
    /// Host selection per listener name, looked up for every request by the listener it came
    /// on: the names are the config's, keyed as `Upstreams`' backend names are (foldhash).
    listeners: HashMap<Box<str>, HostIndex, foldhash::fast::RandomState>,
    /// Host selection for a listener name the config does not mention: only the virtual hosts
    /// attached to every listener.
    any_listener: HostIndex,
    /// Shards per host map (a power of two, about √N), fixed until the next full build.
    shards: usize,
}

/// A virtual host in the table with its order key: keys grow along the config order, so the
/// smallest key among the virtual hosts claiming a hostname is the first one in the config.
#[derive(Debug, Clone)]
struct Slot {
    key: u64,
    vhost: Arc<CompiledVhost>,
}

/// Gap between the order keys of consecutive virtual hosts of a full build.
const KEY_STEP: u64 = 1 << 20;

/// A list split into shared chunks: cloning copies one pointer per chunk, and editing an
/// item copies only its chunk.
#[derive(Debug, Clone)]
struct Chunked<T> {
    chunks: Vec<Arc<Vec<T>>>,
    len: usize,
    /// Most items per chunk (appends start a new chunk beyond it).
    cap: usize,
}

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked {
            chunks: Vec::new(),
            len: 0,
            cap: 16,
        }
    }
}

impl<T: Clone> Chunked<T> {
    fn from_vec(items: Vec<T>) -> Chunked<T> {
        let len = items.len();
        let cap = sqrt_pow2(len).max(16);
        let mut chunks = Vec::with_capacity(len.div_ceil(cap));
        let mut it = items.into_iter().peekable();
        while it.peek().is_some() {
            chunks.push(Arc::new(it.by_ref().take(cap).collect()));
        }
        Chunked { chunks, len, cap }
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    /// The chunk and offset of `pos`.
    fn locate(&self, mut pos: usize) -> Option<(usize, usize)> {
        for (c, chunk) in self.chunks.iter().enumerate() {
            if pos < chunk.len() {
                return Some((c, pos));
            }
            pos -= chunk.len();
        }
        None
    }

    fn get(&self, pos: usize) -> Option<&T> {
        let (c, o) = self.locate(pos)?;
        self.chunks[c].get(o)
    }

    fn last(&self) -> Option<&T> {
        self.chunks.last().and_then(|c| c.last())
    }

    fn set(&mut self, pos: usize, item: T) {
        if let Some((c, o)) = self.locate(pos) {
            Arc::make_mut(&mut self.chunks[c])[o] = item;
        }
    }

    fn remove(&mut self, pos: usize) {
        if let Some((c, o)) = self.locate(pos) {
            let chunk = Arc::make_mut(&mut self.chunks[c]);
            chunk.remove(o);
            if chunk.is_empty() {
                self.chunks.remove(c);
            }
            self.len -= 1;
        }
    }

    fn push(&mut self, item: T) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < self.cap => Arc::make_mut(last).push(item),
            _ => self.chunks.push(Arc::new(vec![item])),
        }
        self.len += 1;
    }
}

/// The power of two nearest above √n (at least 1).
fn sqrt_pow2(n: usize) -> usize {
    let mut p = 1;
    while p * p < n {
        p *= 2;
    }
    p
}

/// The virtual hosts claiming one hostname (or the catch-all) on one listener, ascending by
/// order key: the first one serves it.
type Claims = Vec<Slot>;

fn claim(claims: &mut Claims, slot: &Slot) {
    let at = claims.partition_point(|c| c.key < slot.key);
    if claims.get(at).is_some_and(|c| c.key == slot.key) {
        claims[at] = slot.clone();
    } else {
        claims.insert(at, slot.clone());
    }
}

fn unclaim(claims: &mut Claims, key: u64) {
    claims.retain(|c| c.key != key);
}

/// A hash map from hostname to claims, split into shards shared between tables: a change
/// copies the shard pointers and the one shard it touches.
///
/// A hostname is hashed once: its 64-bit hash picks the shard (bits 32 and up) and finds the
/// entry inside the shard's table (which keeps each entry's hash and never hashes again).
/// The hasher is keyed (std's `RandomState`, random per map and kept by its clones), so
/// hostnames that tenants choose cannot be made to collide.
#[derive(Debug, Clone, Default)]
struct HostMap {
    shards: Vec<Arc<HashTable<HostEntry>>>,
    /// Keys over all shards: `is_empty` is asked on every request that misses the exact
    /// hosts, and must not walk the shards.
    keys: usize,
    hasher: RandomState,
}

/// One hostname of a [`HostMap`] with its hash and its claims.
#[derive(Debug, Clone)]
struct HostEntry {
    hash: u64,
    key: Box<str>,
    claims: Claims,
}

impl HostMap {
    fn new(shards: usize) -> HostMap {
        HostMap {
            shards: (0..shards).map(|_| Arc::default()).collect(),
            keys: 0,
            hasher: RandomState::new(),
        }
    }

    /// The hash of `key` and the shard it picks. The shard takes bits the shard's table uses
    /// for neither the bucket (low bits) nor the tag (top 7 bits), so the keys of one shard
    /// still spread over its buckets.
    fn locate(&self, key: &str) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        (hash, ((hash >> 32) as usize) & (self.shards.len() - 1))
    }

    fn first(&self, key: &str) -> Option<&Slot> {
        if self.shards.is_empty() {
            return None;
        }
        let (hash, s) = self.locate(key);
        self.shards[s]
            .find(hash, |e| &*e.key == key)?
            .claims
            .first()
    }

    fn is_empty(&self) -> bool {
        self.keys == 0
    }

    fn claim(&mut self, key: &str, slot: &Slot) {
        let (hash, s) = self.locate(key);
        let shard = Arc::make_mut(&mut self.shards[s]);
        match shard.find_mut(hash, |e| &*e.key == key) {
            Some(e) => claim(&mut e.claims, slot),
            None => {
                let entry = HostEntry {
                    hash,
                    key: key.into(),
                    claims: vec![slot.clone()],
                };
                shard.insert_unique(hash, entry, |e| e.hash);
                self.keys += 1;
            }
        }
    }

    fn unclaim(&mut self, key: &str, order: u64) {
        let (hash, s) = self.locate(key);
        let eq = |e: &HostEntry| &*e.key == key;
        if self.shards[s].find(hash, eq).is_none() {
            return;
        }
        let shard = Arc::make_mut(&mut self.shards[s]);
        if let Ok(mut entry) = shard.find_entry(hash, eq) {
            let claims = &mut entry.get_mut().claims;
            unclaim(claims, order);
            if claims.is_empty() {
                entry.remove();
                self.keys -= 1;
            }
        }
    }
}

/// Host selection for one listener.
#[derive(Debug, Clone, Default)]
struct HostIndex {
    /// Exact hostnames.
    exact: HostMap,
    /// `*.example.com` keyed by `example.com`.
    wildcard: HostMap,
    /// Virtual hosts without hostnames (or with `*`).
    catch_all: Claims,
}

/// Where a (normalized) hostname goes in a [`HostIndex`].
enum HostKey<'a> {
    CatchAll,
    Wildcard(&'a str),
    Exact(&'a str),
}

fn host_key(h: &str) -> HostKey<'_> {
    if h == "*" {
        HostKey::CatchAll
    } else if let Some(suffix) = h.strip_prefix("*.") {
        HostKey::Wildcard(suffix)
    } else {
        HostKey::Exact(h)
    }
}

impl HostIndex {
    fn new(shards: usize) -> HostIndex {
        HostIndex {
            exact: HostMap::new(shards),
            wildcard: HostMap::new(shards),
            catch_all: Vec::new(),
        }
    }

    fn add(&mut self, slot: &Slot) {
        if slot.vhost.hostnames.is_empty() {
            claim(&mut self.catch_all, slot);
        }
        for h in slot.vhost.hostnames.iter() {
            match host_key(h) {
                HostKey::CatchAll => claim(&mut self.catch_all, slot),
                HostKey::Wildcard(s) => self.wildcard.claim(s, slot),
                HostKey::Exact(h) => self.exact.claim(h, slot),
            }
        }
    }

    fn remove(&mut self, slot: &Slot) {
        if slot.vhost.hostnames.is_empty() {
            unclaim(&mut self.catch_all, slot.key);
        }
        for h in slot.vhost.hostnames.iter() {
            match host_key(h) {
                HostKey::CatchAll => unclaim(&mut self.catch_all, slot.key),
                HostKey::Wildcard(s) => self.wildcard.unclaim(s, slot.key),
                HostKey::Exact(h) => self.exact.unclaim(h, slot.key),
            }
        }
    }

    fn select(&self, host: &str) -> Option<&Slot> {
        if let Some(v) = self.exact.first(host) {
            return Some(v);
        }
        if !host.starts_with('.') && !self.wildcard.is_empty() {
            // Longest suffix first: drop one label at a time from the left. The host itself
            // is never looked up, so `*.example.com` does not match `example.com`.
            let mut rest = host;
            while let Some(dot) = rest.find('.') {
                rest = &rest[dot + 1..];
                if let Some(v) = self.wildcard.first(rest) {
                    return Some(v);
                }
            }
        }
        self.catch_all.first()
    }
}

/// One virtual host, compiled: its routes and their rules.
#[derive(Debug)]
struct CompiledVhost {
    /// Its name (the key under which the next build may reuse it).
    name: Arc<str>,
    /// Its hostnames, normalized (lower case, no trailing dot).
    hostnames: Box<[Box<str>]>,
    /// The listeners it is attached to (empty: all).
    listeners: Box<[Box<str>]>,
    /// Its routes, in config order.
    entries: Vec<RouteEntry>,
    routes: VhostRoutes,
}

impl CompiledVhost {
    /// True when it is served on `listener`.
    fn on(&self, listener: &str) -> bool {
        self.listeners.is_empty() || self.listeners.iter().any(|l| &**l == listener)
    }
}

/// The compiled rules of one virtual host.
#[derive(Debug, Default)]
struct VhostRoutes {
    /// Exact-path rules by path, each list in precedence order.
    exact: HashMap<Box<str>, Vec<Rule>>,
    /// Prefix then regex rules, in precedence order.
    scan: Vec<Rule>,
}

/// One (route, match) pair, compiled.
#[derive(Debug)]
struct Rule {
    /// Index into the virtual host's `entries`.
    entry: usize,
    path: PathRule,
    method: Option<Box<str>>,
    headers: Vec<HeaderRule>,
    query: Vec<QueryRule>,
    /// (name, value): the first cookie of that name has exactly that value.
    cookies: Vec<(Box<str>, Box<str>)>,
}

#[derive(Debug)]
enum PathRule {
    Exact(Box<str>),
    /// `trimmed` has no trailing slash (empty for `/`); `reported` is what
    /// [`Matched::prefix`] gives.
    Prefix {
        trimmed: Box<str>,
        reported: Box<str>,
    },
    Regex(regex::Regex),
}

#[derive(Debug)]
enum ValueRule {
    Exact(Box<str>),
    Regex(regex::Regex),
}

impl ValueRule {
    fn matches(&self, v: &[u8]) -> bool {
        match self {
            ValueRule::Exact(e) => e.as_bytes() == v,
            ValueRule::Regex(r) => std::str::from_utf8(v).is_ok_and(|s| r.is_match(s)),
        }
    }
}

#[derive(Debug)]
struct HeaderRule {
    name: http::HeaderName,
    value: ValueRule,
}

#[derive(Debug)]
struct QueryRule {
    name: Box<str>,
    value: ValueRule,
}

/// Precedence sort key of a rule: smaller sorts first.
type RuleKey = (
    u8,
    Reverse<usize>,
    u8,
    Reverse<usize>,
    Reverse<usize>,
    usize,
    usize,
);

fn compile_regex(re: &str, path: impl FnOnce() -> String) -> Result<regex::Regex, BuildError> {
    regex::Regex::new(&format!("^(?:{re})$")).map_err(|e| BuildError {
        path: path(),
        message: format!("invalid regular expression: {e}"),
    })
}

fn compile_value(
    kind: MatchKind,
    value: &str,
    path: impl FnOnce() -> String,
) -> Result<ValueRule, BuildError> {
    Ok(match kind {
        MatchKind::Exact => ValueRule::Exact(value.into()),
        MatchKind::Regex => ValueRule::Regex(compile_regex(value, path)?),
    })
}

/// The implicit match of a route without matches: prefix `/`.
static DEFAULT_MATCH: RouteMatch = RouteMatch {
    path: None,
    headers: Vec::new(),
    query: Vec::new(),
    method: None,
    cookies: Vec::new(),
};

/// The config path of a route match, formatted only when an error needs it.
struct MatchPath {
    vhost: usize,
    route: usize,
    index: usize,
}

impl std::fmt::Display for MatchPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "virtual_hosts[{}].routes[{}].matches[{}]",
            self.vhost, self.route, self.index
        )
    }
}

fn compile_rule(
    entry: usize,
    m: &RouteMatch,
    at: &MatchPath,
) -> Result<(RuleKey, Rule), BuildError> {
    let (kind, len, path) = match &m.path {
        None => (1, 1, prefix_rule("/")),
        Some(PathMatch::Prefix(p)) => (1, p.chars().count(), prefix_rule(p)),
        Some(PathMatch::Exact(p)) => (0, 0, PathRule::Exact(p.as_str().into())),
        Some(PathMatch::Regex(r)) => (
            2,
            0,
            PathRule::Regex(compile_regex(r, || format!("{at}.path.regex"))?),
        ),
    };
    let headers = m
        .headers
        .iter()
        .enumerate()
        .map(|(i, h): (usize, &HeaderMatch)| {
            let name = http::HeaderName::from_bytes(h.name.as_bytes()).map_err(|e| BuildError {
                path: format!("{at}.headers[{i}].name"),
                message: format!("invalid header name {:?}: {e}", h.name),
            })?;
            let value = compile_value(h.kind, &h.value, || format!("{at}.headers[{i}].value"))?;
            Ok(HeaderRule { name, value })
        })
        .collect::<Result<Vec<_>, BuildError>>()?;
    let query = m
        .query
        .iter()
        .enumerate()
        .map(|(i, q): (usize, &QueryMatch)| {
            let value = compile_value(q.kind, &q.value, || format!("{at}.query[{i}].value"))?;
            Ok(QueryRule {
                name: q.name.as_str().into(),
                value,
            })
        })
        .collect::<Result<Vec<_>, BuildError>>()?;
    let key = (
        kind,
        Reverse(len),
        u8::from(m.method.is_none()),
        // Cookies are header matches too (`Cookie`), counted with them.
        Reverse(headers.len() + m.cookies.len()),
        Reverse(query.len()),
        at.route,
        at.index,
    );
    Ok((
        key,
        Rule {
            entry,
            path,
            method: m.method.as_deref().map(Into::into),
            headers,
            query,
            cookies: m
                .cookies
                .iter()
                .map(|c| (c.name.as_str().into(), c.value.as_str().into()))
                .collect(),
        },
    ))
}

fn prefix_rule(p: &str) -> PathRule {
    let trimmed = p.trim_end_matches('/');
    PathRule::Prefix {
        trimmed: trimmed.into(),
        reported: if trimmed.is_empty() { "/" } else { trimmed }.into(),
    }
}

/// Lower-cases `host` (when needed) and strips one trailing dot.
fn normalize_host(host: &str) -> Cow<'_, str> {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

/// A query parameter: decoded name and decoded value.
type Param<'a> = (Cow<'a, str>, Cow<'a, [u8]>);

/// The query parameters of a request, decoded on first use.
struct Query<'a> {
    raw: Option<&'a str>,
    parsed: Option<Vec<Param<'a>>>,
}

impl<'a> Query<'a> {
    /// The percent-decoded value of the first parameter called `name`.
    fn first(&mut self, name: &str) -> Option<&[u8]> {
        let raw = self.raw;
        let params = self.parsed.get_or_insert_with(|| {
            raw.unwrap_or("")
                .split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (
                        percent_encoding::percent_decode_str(k).decode_utf8_lossy(),
                        Cow::from(percent_encoding::percent_decode_str(v)),
                    )
                })
                .collect()
        });
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_ref())
    }
}

impl Rule {
    /// Whether everything but an exact path matches.
    fn matches_rest(&self, req: &RequestHead<'_>, query: &mut Query<'_>) -> bool {
        if let Some(m) = &self.method {
            if req.method.as_str() != &**m {
                return false;
            }
        }
        let headers_ok = self.headers.iter().all(|h| {
            req.headers
                .get_all(&h.name)
                .iter()
                .any(|v| h.value.matches(v.as_bytes()))
        });
        headers_ok
            && self.cookies.iter().all(|(name, value)| {
                crate::proxy::affinity::cookie(req.headers, name) == Some(&**value)
            })
            && self
                .query
                .iter()
                .all(|q| query.first(&q.name).is_some_and(|v| q.value.matches(v)))
    }

    fn path_matches(&self, path: &str) -> bool {
        match &self.path {
            PathRule::Exact(p) => &**p == path,
            PathRule::Prefix { trimmed, .. } => {
                trimmed.is_empty()
                    || path
                        .strip_prefix(&**trimmed)
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            }
            PathRule::Regex(r) => r.is_match(path),
        }
    }

    fn prefix(&self) -> Option<&str> {
        match &self.path {
            PathRule::Prefix { reported, .. } => Some(reported),
            _ => None,
        }
    }
}

impl VhostRoutes {
    fn lookup<'t>(&'t self, req: &RequestHead<'_>) -> Option<&'t Rule> {
        let mut query = Query {
            raw: req.query,
            parsed: None,
        };
        if let Some(rules) = self.exact.get(req.path) {
            if let Some(r) = rules.iter().find(|r| r.matches_rest(req, &mut query)) {
                return Some(r);
            }
        }
        self.scan
            .iter()
            .find(|r| r.path_matches(req.path) && r.matches_rest(req, &mut query))
    }
}

impl RouteTable {
    /// Builds the table from a (validated) config.
    pub fn build(cfg: &Config) -> Result<RouteTable, BuildError> {
        Self::build_reusing(cfg, None)
    }

    /// Builds the table, taking the compiled virtual host of the same name from `previous`
    /// for every virtual host for which `unchanged(name)` is true (the caller knows it is
    /// equal to the one `previous` was built from).
    pub fn build_reusing(
        cfg: &Config,
        previous: Option<(&RouteTable, Unchanged<'_>)>,
    ) -> Result<RouteTable, BuildError> {
        Self::build_with(cfg, previous, None)
    }

    /// [`RouteTable::build`] from a config whose routes were taken out of it: `routes[i]` are
    /// the routes of `cfg.virtual_hosts[i]` (whose own `routes` are ignored). The routes are
    /// moved into the table, not copied, so a large config is not held twice while its
    /// table is built.
    pub fn build_taking(cfg: &Config, routes: Vec<Vec<Route>>) -> Result<RouteTable, BuildError> {
        Self::build_with(cfg, None, Some(routes))
    }

    fn build_with(
        cfg: &Config,
        previous: Option<(&RouteTable, Unchanged<'_>)>,
        taken: Option<Vec<Vec<Route>>>,
    ) -> Result<RouteTable, BuildError> {
        let mut taken = taken.map(Vec::into_iter);
        let old: HashMap<&str, &Arc<CompiledVhost>> = match previous {
            Some((prev, _)) => prev
                .vhosts
                .iter()
                .map(|s| (&*s.vhost.name, &s.vhost))
                .collect(),
            None => HashMap::new(),
        };
        let mut slots = Vec::with_capacity(cfg.virtual_hosts.len());
        let mut len = 0;
        for (vi, vh) in cfg.virtual_hosts.iter().enumerate() {
            let reused = previous
                .filter(|(_, unchanged)| unchanged(&vh.name))
                .and_then(|_| old.get(vh.name.as_str()))
                .map(|v| Arc::clone(v));
            let own = taken.as_mut().map(|t| t.next().unwrap_or_default());
            let compiled = match (reused, own) {
                (Some(v), _) => v,
                (None, Some(routes)) => Arc::new(compile_parts(vi, vh, routes, true)?),
                (None, None) => Arc::new(compile_vhost(vi, vh)?),
            };
            len += compiled.entries.len();
            slots.push(Slot {
                key: (vi as u64 + 1) * KEY_STEP,
                vhost: compiled,
            });
        }
        drop(old);
        let shards = sqrt_pow2(slots.len());
        let mut listeners: HashMap<Box<str>, HostIndex, foldhash::fast::RandomState> =
            HashMap::default();
        let names = cfg.listeners.iter().map(|l| l.name.as_str()).chain(
            cfg.virtual_hosts
                .iter()
                .flat_map(|v| v.listeners.iter().map(String::as_str)),
        );
        for name in names {
            if listeners.contains_key(name) {
                continue;
            }
            let mut index = HostIndex::new(shards);
            for slot in slots.iter().filter(|s| s.vhost.on(name)) {
                index.add(slot);
            }
            listeners.insert(name.into(), index);
        }
        let mut any_listener = HostIndex::new(shards);
        for slot in slots.iter().filter(|s| s.vhost.listeners.is_empty()) {
            any_listener.add(slot);
        }
        Ok(RouteTable {
            vhosts: Chunked::from_vec(slots),
            len,
            listeners,
            any_listener,
            shards,
        })
    }

    /// The table of `cfg`, which is the config this table was built from with the virtual
    /// host list edited as `edit` says (positions in `edit` are those of the old list) and
    /// the same listeners. Only the replaced, removed and appended virtual hosts are compiled
    /// or unindexed; `touched` sees every route of those, old and new. Falls back to a full
    /// build (reusing every unchanged virtual host) when a new virtual host names a listener
    /// the table does not know, or the table outgrew its shards. A reordered list is no
    /// [`ListPatch`]: its table is built with [`RouteTable::build_reusing`].
    pub fn patch(
        &self,
        cfg: &Config,
        edit: &ListPatch,
        touched: &mut dyn FnMut(&RouteEntry),
    ) -> Result<RouteTable, BuildError> {
        let ListPatch {
            replaced,
            removed,
            appended,
        } = edit;
        let n = cfg.virtual_hosts.len();
        let fits = n <= 4 * self.shards * self.shards
            && self.vhosts.len + appended == n + removed.len()
            && replaced.iter().chain(removed).all(|&p| p < self.vhosts.len)
            && {
                let new_at = |p: usize| p - removed.partition_point(|&r| r < p);
                replaced
                    .iter()
                    .map(|&p| new_at(p))
                    .chain(n - appended..n)
                    .all(|i| {
                        cfg.virtual_hosts[i]
                            .listeners
                            .iter()
                            .all(|l| self.listeners.contains_key(l.as_str()))
                    })
            };
        if !fits {
            return self.rebuild(cfg, edit, touched);
        }
        let mut t = self.clone();
        for &p in replaced {
            let vi = p - removed.partition_point(|&r| r < p);
            let old = t.vhosts.get(p).cloned().expect("checked above");
            let vhost = Arc::new(compile_vhost(vi, &cfg.virtual_hosts[vi])?);
            let new = Slot {
                key: old.key,
                vhost,
            };
            t.unindex(&old, touched);
            t.index(&new, touched);
            t.vhosts.set(p, new);
        }
        for &p in removed.iter().rev() {
            let old = t.vhosts.get(p).cloned().expect("checked above");
            t.unindex(&old, touched);
            t.vhosts.remove(p);
        }
        for vi in n - appended..n {
            let vhost = Arc::new(compile_vhost(vi, &cfg.virtual_hosts[vi])?);
            let key = t.vhosts.last().map_or(0, |s| s.key) + KEY_STEP;
            let new = Slot { key, vhost };
            t.index(&new, touched);
            t.vhosts.push(new);
        }
        Ok(t)
    }

    /// [`RouteTable::patch`]'s fallback: a full build reusing every virtual host the edit did
    /// not touch.
    fn rebuild(
        &self,
        cfg: &Config,
        edit: &ListPatch,
        touched: &mut dyn FnMut(&RouteEntry),
    ) -> Result<RouteTable, BuildError> {
        let n = cfg.virtual_hosts.len();
        let mut changed: std::collections::HashSet<&str> = edit
            .replaced
            .iter()
            .chain(&edit.removed)
            .filter_map(|&p| self.vhosts.get(p).map(|s| &*s.vhost.name))
            .collect();
        changed.extend(
            cfg.virtual_hosts[n.saturating_sub(edit.appended)..]
                .iter()
                .map(|v| &*v.name),
        );
        for s in self
            .vhosts
            .iter()
            .filter(|s| changed.contains(&*s.vhost.name))
        {
            s.vhost.entries.iter().for_each(&mut *touched);
        }
        let unchanged = |name: &str| !changed.contains(name);
        let t = Self::build_reusing(cfg, Some((self, &unchanged)))?;
        for s in t.vhosts.iter().filter(|s| changed.contains(&*s.vhost.name)) {
            s.vhost.entries.iter().for_each(&mut *touched);
        }
        Ok(t)
    }

    /// Adds a virtual host's claims to the host indexes it serves.
    fn index(&mut self, slot: &Slot, touched: &mut dyn FnMut(&RouteEntry)) {
        slot.vhost.entries.iter().for_each(&mut *touched);
        self.len += slot.vhost.entries.len();
        for (name, index) in self.listeners.iter_mut() {
            if slot.vhost.on(name) {
                index.add(slot);
            }
        }
        if slot.vhost.listeners.is_empty() {
            self.any_listener.add(slot);
        }
    }

    /// Removes a virtual host's claims from the host indexes.
    fn unindex(&mut self, slot: &Slot, touched: &mut dyn FnMut(&RouteEntry)) {
        slot.vhost.entries.iter().for_each(&mut *touched);
        self.len -= slot.vhost.entries.len();
        for (name, index) in self.listeners.iter_mut() {
            if slot.vhost.on(name) {
                index.remove(slot);
            }
        }
        if slot.vhost.listeners.is_empty() {
            self.any_listener.remove(slot);
        }
    }

    /// Finds the route for a request.
    pub fn lookup<'a>(&'a self, req: &RequestHead<'_>) -> Lookup<'a> {
        let Some(slot) = self.select(req.listener, req.host) else {
            return Lookup::NoHost;
        };
        let vhost = &slot.vhost;
        match vhost.routes.lookup(req) {
            Some(rule) => Lookup::Matched(Matched {
                entry: &vhost.entries[rule.entry],
                prefix: rule.prefix(),
            }),
            None => Lookup::NoRoute,
        }
    }

    fn select(&self, listener: &str, host: &str) -> Option<&Slot> {
        let index = self.listeners.get(listener).unwrap_or(&self.any_listener);
        index.select(&normalize_host(host))
    }

    /// The name of the virtual host that would serve `host` on `listener`.
    pub fn vhost_name(&self, listener: &str, host: &str) -> Option<&str> {
        self.select(listener, host).map(|s| &*s.vhost.name)
    }

    /// Number of routes in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the table has no routes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of virtual hosts.
    pub fn vhost_count(&self) -> usize {
        self.vhosts.len
    }

    /// Each virtual host's name and compiled routes, in config order.
    pub fn vhost_entries(&self) -> impl Iterator<Item = (&str, &[RouteEntry])> {
        self.vhosts
            .iter()
            .map(|s| (&*s.vhost.name, s.vhost.entries.as_slice()))
    }

    /// All routes, in config order (virtual hosts, then routes).
    pub fn entries(&self) -> impl Iterator<Item = &RouteEntry> {
        self.vhosts.iter().flat_map(|s| s.vhost.entries.iter())
    }
}

/// Compiles the routes of the virtual host at `vi`.
fn compile_vhost(vi: usize, vh: &VirtualHost) -> Result<CompiledVhost, BuildError> {
    compile_parts(vi, vh, vh.routes.clone(), false)
}

/// Compiles the virtual host at `vi` with `routes` (moved into the table) as its routes.
/// With `compact`, each route is stored as a copy (whose lists have no spare capacity, unlike
/// lists grown while decoding) and the original is dropped at once, so the table holds no
/// decoding slack and a config is never held twice.
fn compile_parts(
    vi: usize,
    vh: &VirtualHost,
    routes: Vec<Route>,
    compact: bool,
) -> Result<CompiledVhost, BuildError> {
    let vhost_name: Arc<str> = vh.name.as_str().into();
    let mut entries = Vec::with_capacity(routes.len());
    let mut keyed: Vec<(RuleKey, Rule)> = Vec::new();
    for (ri, r) in routes.into_iter().enumerate() {
        let entry = entries.len();
        let filters = if r.filters.is_empty() {
            no_filters()
        } else {
            Arc::new(
                CompiledFilters::compile(&r.filters).map_err(|message| BuildError {
                    path: format!("virtual_hosts[{vi}].routes[{ri}].filters"),
                    message,
                })?,
            )
        };
        let at = |index| MatchPath {
            vhost: vi,
            route: ri,
            index,
        };
        if r.matches.is_empty() {
            keyed.push(compile_rule(entry, &DEFAULT_MATCH, &at(0))?);
        }
        for (mi, m) in r.matches.iter().enumerate() {
            keyed.push(compile_rule(entry, m, &at(mi))?);
        }
        entries.push(RouteEntry {
            name: r.name.as_str().into(),
            vhost: vhost_name.clone(),
            route: Arc::new(if compact { r.clone() } else { r }),
            filters,
        });
    }
    keyed.sort_by_key(|(k, _)| *k);
    let mut routes = VhostRoutes::default();
    for (_, rule) in keyed {
        match &rule.path {
            PathRule::Exact(p) => routes.exact.entry(p.clone()).or_default().push(rule),
            _ => routes.scan.push(rule),
        }
    }
    Ok(CompiledVhost {
        name: vhost_name,
        hostnames: vh
            .hostnames
            .iter()
            .map(|h| h.trim_end_matches('.').to_ascii_lowercase().into())
            .collect(),
        listeners: vh.listeners.iter().map(|l| l.as_str().into()).collect(),
        entries,
        routes,
    })
}

#[cfg(test)]
mod tests;
