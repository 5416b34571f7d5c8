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

use crate::filters::CompiledFilters;
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;
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
    /// Its filters, compiled.
    pub filters: CompiledFilters,
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
#[derive(Debug, Default)]
pub struct RouteTable {
    /// Compiled routes of each virtual host, indexed like `Config::virtual_hosts`.
    vhosts: Vec<Arc<CompiledVhost>>,
    /// Number of routes over all virtual hosts.
    len: usize,
    /// Host selection per listener name.
    listeners: HashMap<Box<str>, HostIndex>,
    /// Host selection for a listener name the config does not mention: only the virtual hosts
    /// attached to every listener.
    any_listener: HostIndex,
}

/// Host selection for one listener; values are virtual host indexes.
#[derive(Debug, Default)]
struct HostIndex {
    /// Exact hostnames.
    exact: HashMap<Box<str>, usize>,
    /// `*.example.com` keyed by `example.com`.
    wildcard: HashMap<Box<str>, usize>,
    /// The first virtual host without hostnames.
    catch_all: Option<usize>,
}

impl HostIndex {
    fn add(&mut self, vhost: usize, hostnames: &[String]) {
        if hostnames.is_empty() {
            self.catch_all.get_or_insert(vhost);
        }
        for h in hostnames {
            let h = h.trim_end_matches('.').to_ascii_lowercase();
            if h == "*" {
                self.catch_all.get_or_insert(vhost);
            } else if let Some(suffix) = h.strip_prefix("*.") {
                self.wildcard.entry(suffix.into()).or_insert(vhost);
            } else {
                self.exact.entry(h.into()).or_insert(vhost);
            }
        }
    }

    fn select(&self, host: &str) -> Option<usize> {
        if let Some(&v) = self.exact.get(host) {
            return Some(v);
        }
        if !self.wildcard.is_empty() && !host.starts_with('.') {
            // Longest suffix first: drop one label at a time from the left. The host itself
            // is never looked up, so `*.example.com` does not match `example.com`.
            let mut rest = host;
            while let Some(dot) = rest.find('.') {
                rest = &rest[dot + 1..];
                if let Some(&v) = self.wildcard.get(rest) {
                    return Some(v);
                }
            }
        }
        self.catch_all
    }
}

/// One virtual host, compiled: its routes and their rules.
#[derive(Debug)]
struct CompiledVhost {
    /// Its name (the key under which the next build may reuse it).
    name: Arc<str>,
    /// Its routes, in config order.
    entries: Vec<RouteEntry>,
    routes: VhostRoutes,
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
        Reverse(headers.len()),
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
        let old: HashMap<&str, &Arc<CompiledVhost>> = match previous {
            Some((prev, _)) => prev.vhosts.iter().map(|v| (&*v.name, v)).collect(),
            None => HashMap::new(),
        };
        let mut vhosts = Vec::with_capacity(cfg.virtual_hosts.len());
        let mut len = 0;
        for (vi, vh) in cfg.virtual_hosts.iter().enumerate() {
            let reused = previous
                .filter(|(_, unchanged)| unchanged(&vh.name))
                .and_then(|_| old.get(vh.name.as_str()))
                .map(|v| Arc::clone(v));
            let compiled = match reused {
                Some(v) => v,
                None => Arc::new(compile_vhost(vi, vh)?),
            };
            len += compiled.entries.len();
            vhosts.push(compiled);
        }
        let mut listener_names: Vec<&str> = cfg.listeners.iter().map(|l| l.name.as_str()).collect();
        listener_names.extend(
            cfg.virtual_hosts
                .iter()
                .flat_map(|v| v.listeners.iter().map(String::as_str)),
        );
        let mut listeners: HashMap<Box<str>, HostIndex> = HashMap::new();
        for name in listener_names {
            if listeners.contains_key(name) {
                continue;
            }
            let mut index = HostIndex::default();
            for (vi, vh) in cfg.virtual_hosts.iter().enumerate() {
                if vh.listeners.is_empty() || vh.listeners.iter().any(|l| l == name) {
                    index.add(vi, &vh.hostnames);
                }
            }
            listeners.insert(name.into(), index);
        }
        let mut any_listener = HostIndex::default();
        for (vi, vh) in cfg.virtual_hosts.iter().enumerate() {
            if vh.listeners.is_empty() {
                any_listener.add(vi, &vh.hostnames);
            }
        }

        Ok(RouteTable {
            vhosts,
            len,
            listeners,
            any_listener,
        })
    }

    /// Finds the route for a request.
    pub fn lookup<'a>(&'a self, req: &RequestHead<'_>) -> Lookup<'a> {
        let Some(vi) = self.vhost_index(req.listener, req.host) else {
            return Lookup::NoHost;
        };
        let vhost = &self.vhosts[vi];
        match vhost.routes.lookup(req) {
            Some(rule) => Lookup::Matched(Matched {
                entry: &vhost.entries[rule.entry],
                prefix: rule.prefix(),
            }),
            None => Lookup::NoRoute,
        }
    }

    /// The index of the virtual host that would serve `host` on `listener`, used to detect
    /// misdirected requests (Host served by another vhost than the TLS SNI).
    ///
    /// The index is the position of the virtual host in `Config::virtual_hosts`.
    pub fn vhost_index(&self, listener: &str, host: &str) -> Option<usize> {
        let index = self.listeners.get(listener).unwrap_or(&self.any_listener);
        index.select(&normalize_host(host))
    }

    /// Number of routes in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the table has no routes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Each virtual host's name and compiled routes, in config order.
    pub fn vhost_entries(&self) -> impl Iterator<Item = (&str, &[RouteEntry])> {
        self.vhosts.iter().map(|v| (&*v.name, v.entries.as_slice()))
    }

    /// All routes, in config order (virtual hosts, then routes).
    pub fn entries(&self) -> impl Iterator<Item = &RouteEntry> {
        self.vhosts.iter().flat_map(|v| v.entries.iter())
    }
}

/// Compiles the routes of the virtual host at `vi`.
fn compile_vhost(vi: usize, vh: &VirtualHost) -> Result<CompiledVhost, BuildError> {
    let vhost_name: Arc<str> = vh.name.as_str().into();
    let mut entries = Vec::with_capacity(vh.routes.len());
    let mut keyed: Vec<(RuleKey, Rule)> = Vec::new();
    for (ri, r) in vh.routes.iter().enumerate() {
        let entry = entries.len();
        let filters = CompiledFilters::compile(&r.filters).map_err(|message| BuildError {
            path: format!("virtual_hosts[{vi}].routes[{ri}].filters"),
            message,
        })?;
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
            route: Arc::new(r.clone()),
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
        entries,
        routes,
    })
}

#[cfg(test)]
mod tests;
