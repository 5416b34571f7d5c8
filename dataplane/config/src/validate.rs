//! Validation of a whole [`Config`]: every problem is reported, each with the path of the
//! offending field (`virtual_hosts[0].routes[2].matches[0].path.regex: …`).
//!
//! [`Config::validate_structure`] checks everything that can be checked from the document
//! alone; the controller runs it, since cert files and static roots live only on the
//! dataplane. [`Config::validate`] adds the filesystem checks (PEM files readable and holding
//! the expected block, static roots being directories). Errors come in document order: the
//! walk follows the field order of the types, and a cross-reference or duplicate is reported
//! at the later of the two places.

use crate::{
    Action, Backend, BackendProtocol, Certificate, Config, Cors, Filter, HeaderModifier, Listener,
    ListenerProtocol, PathMatch, PathRewrite, PemSource, Redirect, Route, RouteMatch, StaticSite,
    UrlRewrite, VirtualHost, WeightedBackend,
};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::path::Path;

/// One validation problem and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// Path of the field, e.g. `listeners[1].tls.certificates[0].cert`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found in a config, in document order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} config error(s):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

impl Config {
    /// Checks the whole config, including the filesystem (PEM files exist, are readable and
    /// hold PEM data; static roots are directories), and returns every error found.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        Validator::run(self, true)
    }

    /// Checks everything [`Config::validate`] does except the filesystem, for processes (the
    /// controller) where cert files and static roots do not exist.
    pub fn validate_structure(&self) -> Result<(), ValidationErrors> {
        Validator::run(self, false)
    }
}

/// Largest weight of a backend reference or endpoint (the Gateway API bound).
const MAX_WEIGHT: u32 = 1_000_000;
/// Most retry attempts after the first.
const MAX_RETRY_ATTEMPTS: u32 = 10;
/// Smallest allowed `limits.max_header_bytes`.
const MIN_HEADER_BYTES: u32 = 1024;

/// The kind of PEM block a [`PemSource`] must contain.
#[derive(Clone, Copy)]
enum PemKind {
    Certificate,
    PrivateKey,
}

/// Socket transport, for bind-collision checks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Tcp,
    Udp,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
        })
    }
}

/// A socket already claimed by an earlier listener.
struct Bound {
    ip: IpAddr,
    port: u16,
    transport: Transport,
    listener: usize,
}

/// Walks the config in document order, collecting errors.
struct Validator<'a> {
    files: bool,
    errors: Vec<ValidationError>,
    /// Backend names (all of them, so references may point forward).
    backends: HashSet<&'a str>,
    /// Listener name to protocol (first occurrence of each name).
    listeners: HashMap<&'a str, ListenerProtocol>,
    /// Sockets bound by listeners seen so far.
    bound: Vec<Bound>,
}

impl<'a> Validator<'a> {
    fn run(cfg: &'a Config, files: bool) -> Result<(), ValidationErrors> {
        let mut listeners = HashMap::new();
        for l in &cfg.listeners {
            listeners.entry(l.name.as_str()).or_insert(l.protocol);
        }
        let mut v = Validator {
            files,
            errors: Vec::new(),
            backends: cfg.backends.iter().map(|b| b.name.as_str()).collect(),
            listeners,
            bound: Vec::new(),
        };
        v.config(cfg);
        if v.errors.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors(v.errors))
        }
    }

    fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ValidationError {
            path: path.into(),
            message: message.into(),
        });
    }

    fn config(&mut self, cfg: &'a Config) {
        if cfg.version != crate::SCHEMA_VERSION {
            self.err(
                "version",
                format!(
                    "unsupported schema version {}, expected {}",
                    cfg.version,
                    crate::SCHEMA_VERSION
                ),
            );
        }
        let mut names = HashMap::new();
        for (i, l) in cfg.listeners.iter().enumerate() {
            self.listener(&format!("listeners[{i}]"), i, l, &cfg.listeners, &mut names);
        }
        let mut names = HashMap::new();
        for (i, vh) in cfg.virtual_hosts.iter().enumerate() {
            self.virtual_host(&format!("virtual_hosts[{i}]"), vh, &mut names);
        }
        let mut names = HashMap::new();
        for (i, b) in cfg.backends.iter().enumerate() {
            self.backend(&format!("backends[{i}]"), b, &mut names);
        }
        self.limits(cfg);
        if let Some(admin) = &cfg.admin {
            self.admin(admin, &cfg.listeners);
        }
        let log = &cfg.access_log;
        if log.path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            self.err("access_log.path", "must not be empty when set");
        }
        if log.buffer_lines == 0 {
            self.err("access_log.buffer_lines", "must be greater than 0");
        }
    }

    /// Checks a name is non-empty and unique within `seen` (name → path of first use).
    fn unique_name(
        &mut self,
        path: &str,
        what: &str,
        name: &'a str,
        seen: &mut HashMap<&'a str, String>,
    ) {
        if name.is_empty() {
            self.err(format!("{path}.name"), "must not be empty");
        } else if let Some(first) = seen.get(name) {
            let msg = format!("duplicate {what} name {name:?} (first used by {first})");
            self.err(format!("{path}.name"), msg);
        } else {
            seen.insert(name, path.to_string());
        }
    }

    // ---------------------------------------------------------------- listeners

    fn listener(
        &mut self,
        path: &str,
        index: usize,
        l: &'a Listener,
        all: &[Listener],
        names: &mut HashMap<&'a str, String>,
    ) {
        use ListenerProtocol as P;
        self.unique_name(path, "listener", &l.name, names);
        let ip = match l.address.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                let msg = format!("invalid IP address {:?}", l.address);
                self.err(format!("{path}.address"), msg);
                None
            }
        };
        if l.port == 0 {
            self.err(format!("{path}.port"), "must not be 0");
        } else if let Some(ip) = ip {
            let mut transports = vec![match l.protocol {
                P::Udp => Transport::Udp,
                _ => Transport::Tcp,
            }];
            if l.protocol == P::Https && l.http3 {
                transports.push(Transport::Udp);
            }
            for t in transports {
                if let Some(other) = self
                    .bound
                    .iter()
                    .find(|b| b.port == l.port && b.transport == t && overlaps(b.ip, ip))
                {
                    let msg = format!(
                        "{t} port {} on {ip} is already bound by listeners[{}] ({:?}){}",
                        l.port,
                        other.listener,
                        all[other.listener].name,
                        if t == Transport::Udp && l.protocol == P::Https {
                            " (https with http3 also binds udp)"
                        } else {
                            ""
                        }
                    );
                    self.err(format!("{path}.port"), msg);
                } else {
                    self.bound.push(Bound {
                        ip,
                        port: l.port,
                        transport: t,
                        listener: index,
                    });
                }
            }
        }
        match (&l.tls, l.protocol) {
            (None, P::Https) => self.err(format!("{path}.tls"), "required for https listeners"),
            (Some(_), P::Http | P::Tcp | P::Udp) => self.err(
                format!("{path}.tls"),
                "only allowed on https and tls_passthrough listeners",
            ),
            (Some(tls), _) => {
                let tpath = format!("{path}.tls.certificates");
                if tls.certificates.is_empty() {
                    self.err(&tpath, "at least one certificate is required");
                }
                for (k, c) in tls.certificates.iter().enumerate() {
                    self.certificate(&format!("{tpath}[{k}]"), c);
                }
            }
            (None, _) => {}
        }
        if l.max_requests_in_flight == Some(0) {
            self.err(
                format!("{path}.max_requests_in_flight"),
                "must be greater than 0 when set",
            );
        }
        let l4 = matches!(l.protocol, P::Tcp | P::Udp | P::TlsPassthrough);
        if !l4 && !l.l4_routes.is_empty() {
            self.err(
                format!("{path}.l4_routes"),
                "only allowed on tcp, udp and tls_passthrough listeners",
            );
        } else if l4 && l.l4_routes.is_empty() {
            self.err(
                format!("{path}.l4_routes"),
                format!(
                    "at least one route is required on a {} listener",
                    proto_name(l.protocol)
                ),
            );
        }
        let mut route_names = HashMap::new();
        for (r, route) in l.l4_routes.iter().enumerate() {
            let rpath = format!("{path}.l4_routes[{r}]");
            self.unique_name(&rpath, "l4 route", &route.name, &mut route_names);
            if !route.hostnames.is_empty() && l.protocol != P::TlsPassthrough {
                self.err(
                    format!("{rpath}.hostnames"),
                    "only allowed on tls_passthrough listeners",
                );
            } else {
                self.hostnames(&format!("{rpath}.hostnames"), &route.hostnames);
            }
            if route.backends.is_empty() {
                self.err(
                    format!("{rpath}.backends"),
                    "at least one backend is required",
                );
            }
            for (b, wb) in route.backends.iter().enumerate() {
                let bpath = format!("{rpath}.backends[{b}]");
                self.backend_ref(&bpath, wb);
                if !wb.filters.is_empty() {
                    self.err(format!("{bpath}.filters"), "not allowed on l4 routes");
                }
            }
        }
    }

    fn certificate(&mut self, path: &str, c: &Certificate) {
        self.hostnames(&format!("{path}.hostnames"), &c.hostnames);
        self.pem(&format!("{path}.cert"), &c.cert, PemKind::Certificate);
        self.pem(&format!("{path}.key"), &c.key, PemKind::PrivateKey);
    }

    fn pem(&mut self, path: &str, src: &PemSource, kind: PemKind) {
        match src {
            PemSource::Pem(text) => {
                if let Err(msg) = check_pem(text, kind) {
                    self.err(path, msg);
                }
            }
            PemSource::File(file) => {
                if file.as_os_str().is_empty() {
                    self.err(path, "file path must not be empty");
                } else if self.files {
                    if let Err(msg) = check_pem_file(file, kind) {
                        self.err(path, msg);
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------- admin

    fn admin(&mut self, admin: &crate::Admin, all: &[Listener]) {
        let ip = match admin.address.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                let msg = format!("invalid IP address {:?}", admin.address);
                self.err("admin.address", msg);
                None
            }
        };
        if admin.port == 0 {
            self.err("admin.port", "must not be 0");
        } else if let Some(ip) = ip {
            if let Some(b) = self.bound.iter().find(|b| {
                b.transport == Transport::Tcp && b.port == admin.port && overlaps(b.ip, ip)
            }) {
                let msg = format!(
                    "tcp port {} on {ip} is already bound by listeners[{}] ({:?})",
                    admin.port, b.listener, all[b.listener].name
                );
                self.err("admin.port", msg);
            }
        }
    }

    // ---------------------------------------------------------------- virtual hosts

    fn virtual_host(
        &mut self,
        path: &str,
        vh: &'a VirtualHost,
        names: &mut HashMap<&'a str, String>,
    ) {
        self.unique_name(path, "virtual host", &vh.name, names);
        self.hostnames(&format!("{path}.hostnames"), &vh.hostnames);
        for (i, name) in vh.listeners.iter().enumerate() {
            let lpath = format!("{path}.listeners[{i}]");
            match self.listeners.get(name.as_str()) {
                None => self.err(lpath, format!("unknown listener {name:?}")),
                Some(ListenerProtocol::Http | ListenerProtocol::Https) => {}
                Some(p) => {
                    let msg = format!(
                        "listener {name:?} is a {} listener; virtual hosts need http or https",
                        proto_name(*p)
                    );
                    self.err(lpath, msg);
                }
            }
        }
        for (r, route) in vh.routes.iter().enumerate() {
            self.route(&format!("{path}.routes[{r}]"), route);
        }
    }

    /// Validates each hostname (wildcards allowed) and reports duplicates.
    fn hostnames(&mut self, path: &str, names: &[String]) {
        for (h, name) in names.iter().enumerate() {
            if let Err(msg) = check_hostname(name, true) {
                self.err(format!("{path}[{h}]"), msg);
            } else if let Some(first) = names[..h].iter().position(|n| n == name) {
                let msg = format!("duplicate hostname {name:?} (also at index {first})");
                self.err(format!("{path}[{h}]"), msg);
            }
        }
    }

    // ---------------------------------------------------------------- routes

    fn route(&mut self, path: &str, route: &Route) {
        if route.name.is_empty() {
            self.err(format!("{path}.name"), "must not be empty");
        }
        for (m, rm) in route.matches.iter().enumerate() {
            self.route_match(&format!("{path}.matches[{m}]"), rm);
        }
        let (mut redirect, mut rewrite) = (None, None);
        for (f, filter) in route.filters.iter().enumerate() {
            let fpath = format!("{path}.filters[{f}]");
            match filter {
                Filter::Redirect(_) if redirect.is_some() => {
                    self.err(&fpath, "at most one redirect filter is allowed per route");
                }
                Filter::Redirect(_) if rewrite.is_some() => self.err(
                    &fpath,
                    "a route cannot have both a redirect and a rewrite filter",
                ),
                Filter::Redirect(_) => redirect = Some(f),
                Filter::Rewrite(_) if rewrite.is_some() => {
                    self.err(&fpath, "at most one rewrite filter is allowed per route");
                }
                Filter::Rewrite(_) if redirect.is_some() => self.err(
                    &fpath,
                    "a route cannot have both a redirect and a rewrite filter",
                ),
                Filter::Rewrite(_) => rewrite = Some(f),
                _ => {}
            }
            self.filter(&fpath, filter, Some(&route.matches));
        }
        self.action(&format!("{path}.action"), &route.action);
        let t = &route.timeouts;
        if t.request.is_some_and(|d| d.is_zero()) {
            self.err(format!("{path}.timeouts.request"), "must be greater than 0");
        }
        if t.backend.is_some_and(|d| d.is_zero()) {
            self.err(format!("{path}.timeouts.backend"), "must be greater than 0");
        }
        if let (Some(req), Some(be)) = (t.request, t.backend) {
            if be > req {
                let msg = format!("backend timeout {be} exceeds the request timeout {req}");
                self.err(format!("{path}.timeouts.backend"), msg);
            }
        }
        if let Some(retry) = &route.retry {
            if retry.attempts > MAX_RETRY_ATTEMPTS {
                let msg = format!(
                    "must be at most {MAX_RETRY_ATTEMPTS}, got {}",
                    retry.attempts
                );
                self.err(format!("{path}.retry.attempts"), msg);
            }
            for (c, code) in retry.codes.iter().enumerate() {
                if !(400..=599).contains(code) {
                    let msg = format!("retry status code must be in 400..=599, got {code}");
                    self.err(format!("{path}.retry.codes[{c}]"), msg);
                }
            }
        }
    }

    fn route_match(&mut self, path: &str, m: &RouteMatch) {
        match &m.path {
            Some(PathMatch::Exact(p)) => self.path_value(&format!("{path}.path.exact"), p),
            Some(PathMatch::Prefix(p)) => self.path_value(&format!("{path}.path.prefix"), p),
            Some(PathMatch::Regex(re)) => self.regex(&format!("{path}.path.regex"), re),
            None => {}
        }
        for (h, hm) in m.headers.iter().enumerate() {
            let hpath = format!("{path}.headers[{h}]");
            if let Err(msg) = check_token(&hm.name, "header name") {
                self.err(format!("{hpath}.name"), msg);
            }
            if hm.kind == crate::MatchKind::Regex {
                self.regex(&format!("{hpath}.value"), &hm.value);
            }
        }
        for (q, qm) in m.query.iter().enumerate() {
            let qpath = format!("{path}.query[{q}]");
            if qm.name.is_empty() {
                self.err(format!("{qpath}.name"), "must not be empty");
            }
            if qm.kind == crate::MatchKind::Regex {
                self.regex(&format!("{qpath}.value"), &qm.value);
            }
        }
        if let Some(method) = &m.method {
            if check_token(method, "method").is_err()
                || method.bytes().any(|b| b.is_ascii_lowercase())
            {
                let msg = format!(
                    "invalid method {method:?}: must be an upper-case HTTP token such as GET"
                );
                self.err(format!("{path}.method"), msg);
            }
        }
    }

    fn path_value(&mut self, path: &str, value: &str) {
        if !value.starts_with('/') {
            self.err(path, format!("must start with \"/\", got {value:?}"));
        } else if value.contains(['?', '#']) || has_ctl(value) {
            self.err(
                path,
                format!("invalid path {value:?}: no query, fragment or control characters"),
            );
        }
    }

    fn regex(&mut self, path: &str, re: &str) {
        if let Err(e) = regex::Regex::new(re) {
            // The regex crate's message spans several lines; keep the error on one.
            let msg = e
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            self.err(path, format!("invalid regex: {msg}"));
        }
    }

    /// Checks one filter. `matches` is the route's matches (`None` for per-backend filters,
    /// where only header modifiers are allowed).
    fn filter(&mut self, path: &str, filter: &Filter, matches: Option<&[RouteMatch]>) {
        match filter {
            Filter::RequestHeaders(hm) => {
                self.header_modifier(&format!("{path}.request_headers"), hm)
            }
            Filter::ResponseHeaders(hm) => {
                self.header_modifier(&format!("{path}.response_headers"), hm)
            }
            _ if matches.is_none() => self.err(
                path,
                "only request_headers and response_headers filters are allowed per backend",
            ),
            Filter::Redirect(r) => self.redirect(&format!("{path}.redirect"), r, matches),
            Filter::Rewrite(r) => self.rewrite(&format!("{path}.rewrite"), r, matches),
            Filter::Mirror(m) => {
                if !self.backends.contains(m.backend.as_str()) {
                    let msg = format!("unknown backend {:?}", m.backend);
                    self.err(format!("{path}.mirror.backend"), msg);
                }
                if !(0.0..=100.0).contains(&m.percent) {
                    let msg = format!("must be between 0 and 100, got {}", m.percent);
                    self.err(format!("{path}.mirror.percent"), msg);
                }
            }
            Filter::Cors(c) => self.cors(&format!("{path}.cors"), c),
        }
    }

    fn header_modifier(&mut self, path: &str, hm: &HeaderModifier) {
        let mut set_names: Vec<String> = Vec::new();
        for (list, entries) in [("set", &hm.set), ("add", &hm.add)] {
            for (k, hv) in entries.iter().enumerate() {
                let epath = format!("{path}.{list}[{k}]");
                if let Err(msg) = check_token(&hv.name, "header name") {
                    self.err(format!("{epath}.name"), msg);
                } else if list == "set" {
                    let lower = hv.name.to_ascii_lowercase();
                    if set_names.contains(&lower) {
                        let msg = format!("header {:?} is set more than once", hv.name);
                        self.err(format!("{epath}.name"), msg);
                    } else {
                        set_names.push(lower);
                    }
                }
                if hv.value.contains(['\r', '\n', '\0']) {
                    self.err(
                        format!("{epath}.value"),
                        "header values must not contain CR, LF or NUL",
                    );
                }
            }
        }
        for (k, name) in hm.remove.iter().enumerate() {
            let rpath = format!("{path}.remove[{k}]");
            if let Err(msg) = check_token(name, "header name") {
                self.err(rpath, msg);
            } else if set_names.contains(&name.to_ascii_lowercase()) {
                self.err(rpath, format!("header {name:?} is both set and removed"));
            }
        }
    }

    fn redirect(&mut self, path: &str, r: &Redirect, matches: Option<&[RouteMatch]>) {
        if let Some(scheme) = &r.scheme {
            if scheme != "http" && scheme != "https" {
                let msg = format!("must be \"http\" or \"https\", got {scheme:?}");
                self.err(format!("{path}.scheme"), msg);
            }
        }
        if let Some(host) = &r.host {
            if let Err(msg) = check_hostname(host, false) {
                self.err(format!("{path}.host"), msg);
            }
        }
        if r.port == Some(0) {
            self.err(format!("{path}.port"), "must not be 0");
        }
        if let Some(p) = &r.path {
            self.path_rewrite(&format!("{path}.path"), p, matches);
        }
        if ![301, 302, 303, 307, 308].contains(&r.status) {
            let msg = format!("must be 301, 302, 303, 307 or 308, got {}", r.status);
            self.err(format!("{path}.status"), msg);
        }
    }

    fn rewrite(&mut self, path: &str, r: &UrlRewrite, matches: Option<&[RouteMatch]>) {
        if let Some(host) = &r.host {
            if let Err(msg) = check_hostname(host, false) {
                self.err(format!("{path}.host"), msg);
            }
        }
        if let Some(p) = &r.path {
            self.path_rewrite(&format!("{path}.path"), p, matches);
        }
    }

    fn path_rewrite(&mut self, path: &str, p: &PathRewrite, matches: Option<&[RouteMatch]>) {
        match p {
            PathRewrite::Full(v) => self.path_value(&format!("{path}.full"), v),
            PathRewrite::Prefix(v) => {
                let ppath = format!("{path}.prefix");
                self.path_value(&ppath, v);
                // No matches, or a match without a path, means prefix "/": allowed.
                let bad = matches.unwrap_or_default().iter().position(|m| {
                    matches!(m.path, Some(PathMatch::Exact(_) | PathMatch::Regex(_)))
                });
                if let Some(m) = bad {
                    let msg = format!(
                        "a prefix rewrite requires every match of the route to use a prefix \
                         path match, but matches[{m}] does not"
                    );
                    self.err(ppath, msg);
                }
            }
        }
    }

    fn cors(&mut self, path: &str, c: &Cors) {
        for (o, origin) in c.allow_origins.iter().enumerate() {
            if let Err(msg) = check_origin(origin) {
                self.err(format!("{path}.allow_origins[{o}]"), msg);
            }
        }
        for (list, entries) in [
            ("allow_methods", &c.allow_methods),
            ("allow_headers", &c.allow_headers),
            ("expose_headers", &c.expose_headers),
        ] {
            for (k, v) in entries.iter().enumerate() {
                if v == "*" && list != "expose_headers" {
                    continue;
                }
                if let Err(msg) = check_token(v, "token") {
                    self.err(format!("{path}.{list}[{k}]"), msg);
                }
            }
        }
        if c.allow_credentials && c.allow_origins.iter().any(|o| o == "*") {
            self.err(
                format!("{path}.allow_credentials"),
                "cannot be combined with the \"*\" origin (browsers reject it); list the origins",
            );
        }
    }

    // ---------------------------------------------------------------- actions

    fn action(&mut self, path: &str, action: &Action) {
        match action {
            Action::Proxy(p) => {
                let bpath = format!("{path}.proxy.backends");
                if p.backends.is_empty() {
                    self.err(&bpath, "at least one backend is required");
                }
                for (b, wb) in p.backends.iter().enumerate() {
                    let path = format!("{bpath}[{b}]");
                    self.backend_ref(&path, wb);
                    for (f, filter) in wb.filters.iter().enumerate() {
                        self.filter(&format!("{path}.filters[{f}]"), filter, None);
                    }
                }
            }
            Action::Static(s) => self.static_site(&format!("{path}.static"), s),
            Action::Fixed(f) => {
                if !(100..=599).contains(&f.status) {
                    let msg = format!("must be in 100..=599, got {}", f.status);
                    self.err(format!("{path}.fixed.status"), msg);
                }
                if f.content_type.as_ref().is_some_and(|t| has_ctl(t)) {
                    self.err(
                        format!("{path}.fixed.content_type"),
                        "must not contain control characters",
                    );
                }
            }
        }
    }

    fn backend_ref(&mut self, path: &str, wb: &WeightedBackend) {
        if !self.backends.contains(wb.backend.as_str()) {
            self.err(
                format!("{path}.backend"),
                format!("unknown backend {:?}", wb.backend),
            );
        }
        if wb.weight > MAX_WEIGHT {
            let msg = format!("must be at most {MAX_WEIGHT}, got {}", wb.weight);
            self.err(format!("{path}.weight"), msg);
        }
    }

    fn static_site(&mut self, path: &str, s: &StaticSite) {
        let root = format!("{path}.root");
        if s.root.as_os_str().is_empty() {
            self.err(&root, "must not be empty");
        } else if self.files {
            match std::fs::metadata(&s.root) {
                Ok(md) if md.is_dir() => {}
                Ok(_) => self.err(&root, format!("{} is not a directory", s.root.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.err(&root, format!("directory not found: {}", s.root.display()))
                }
                Err(e) => self.err(&root, format!("cannot access {}: {e}", s.root.display())),
            }
        }
        for (k, name) in s.index.iter().enumerate() {
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                let msg = format!("invalid index file name {name:?}: a plain file name, no \"/\"");
                self.err(format!("{path}.index[{k}]"), msg);
            }
        }
        for (k, entry) in s.try_files.iter().enumerate() {
            if !entry.starts_with('/') && !entry.starts_with("$uri") {
                let msg = format!("must start with \"/\" or \"$uri\", got {entry:?}");
                self.err(format!("{path}.try_files[{k}]"), msg);
            }
        }
        if s.cache_control.as_ref().is_some_and(|v| has_ctl(v)) {
            self.err(
                format!("{path}.cache_control"),
                "must not contain control characters",
            );
        }
        if let Some(prefix) = &s.strip_prefix {
            self.path_value(&format!("{path}.strip_prefix"), prefix);
        }
    }

    // ---------------------------------------------------------------- backends

    fn backend(&mut self, path: &str, b: &'a Backend, names: &mut HashMap<&'a str, String>) {
        self.unique_name(path, "backend", &b.name, names);
        if let Some(tls) = &b.tls {
            let tpath = format!("{path}.tls");
            if !matches!(b.protocol, BackendProtocol::Https | BackendProtocol::H2) {
                self.err(&tpath, "only allowed with the https or h2 protocol");
            }
            if let Some(ca) = &tls.ca {
                self.pem(&format!("{tpath}.ca"), ca, PemKind::Certificate);
            }
            if let Some(sni) = &tls.sni {
                if let Err(msg) = check_hostname(sni, false) {
                    self.err(format!("{tpath}.sni"), msg);
                }
            }
            for (k, san) in tls.subject_alt_names.iter().enumerate() {
                if san.parse::<IpAddr>().is_err() {
                    if let Err(msg) = check_hostname(san, true) {
                        self.err(format!("{tpath}.subject_alt_names[{k}]"), msg);
                    }
                }
            }
            match (&tls.client_cert, &tls.client_key) {
                (Some(cert), Some(key)) => {
                    self.pem(&format!("{tpath}.client_cert"), cert, PemKind::Certificate);
                    self.pem(&format!("{tpath}.client_key"), key, PemKind::PrivateKey);
                }
                (Some(_), None) => self.err(
                    format!("{tpath}.client_key"),
                    "required when client_cert is set",
                ),
                (None, Some(_)) => self.err(
                    format!("{tpath}.client_cert"),
                    "required when client_key is set",
                ),
                (None, None) => {}
            }
        }
        for (e, ep) in b.endpoints.iter().enumerate() {
            let epath = format!("{path}.endpoints[{e}]");
            if let Err(msg) = check_endpoint(&ep.address) {
                self.err(format!("{epath}.address"), msg);
            }
            if ep.weight == 0 || ep.weight > MAX_WEIGHT {
                let msg = format!("must be in 1..={MAX_WEIGHT}, got {}", ep.weight);
                self.err(format!("{epath}.weight"), msg);
            }
        }
        if b.connect_timeout.is_zero() {
            self.err(format!("{path}.connect_timeout"), "must be greater than 0");
        }
        let o = &b.outlier;
        if o.consecutive_failures > 0 && o.base_ejection_time.is_zero() {
            self.err(
                format!("{path}.outlier.base_ejection_time"),
                "must be greater than 0 when outlier detection is on",
            );
        }
        if o.max_ejection_percent > 100 {
            let msg = format!("must be at most 100, got {}", o.max_ejection_percent);
            self.err(format!("{path}.outlier.max_ejection_percent"), msg);
        }
    }

    // ---------------------------------------------------------------- limits

    fn limits(&mut self, cfg: &Config) {
        let l = &cfg.limits;
        let counts: [(&str, u64); 6] = [
            ("max_connections", l.max_connections.into()),
            ("max_requests_in_flight", l.max_requests_in_flight.into()),
            ("retry_after_seconds", l.retry_after_seconds.into()),
            ("max_concurrent_streams", l.max_concurrent_streams.into()),
            (
                "max_pending_reset_streams",
                l.max_pending_reset_streams.into(),
            ),
            ("max_request_body_bytes", l.max_request_body_bytes),
        ];
        let timeouts = [
            ("queue_timeout", l.queue_timeout),
            ("header_read_timeout", l.header_read_timeout),
            ("body_idle_timeout", l.body_idle_timeout),
            ("idle_timeout", l.idle_timeout),
            ("drain_timeout", l.drain_timeout),
        ];
        // Report in the field order of `Limits`.
        let order = [
            "max_connections",
            "max_requests_in_flight",
            "queue_timeout",
            "retry_after_seconds",
            "max_concurrent_streams",
            "max_pending_reset_streams",
            "header_read_timeout",
            "body_idle_timeout",
            "idle_timeout",
            "max_header_bytes",
            "max_request_body_bytes",
            "drain_timeout",
        ];
        for field in order {
            let zero = counts.iter().any(|(n, v)| *n == field && *v == 0)
                || timeouts.iter().any(|(n, d)| *n == field && d.is_zero());
            if zero {
                self.err(format!("limits.{field}"), "must be greater than 0");
            }
            if field == "max_header_bytes" && l.max_header_bytes < MIN_HEADER_BYTES {
                let msg = format!(
                    "must be at least {MIN_HEADER_BYTES}, got {}",
                    l.max_header_bytes
                );
                self.err("limits.max_header_bytes", msg);
            }
        }
    }
}

// -------------------------------------------------------------------- helpers

fn proto_name(p: ListenerProtocol) -> &'static str {
    match p {
        ListenerProtocol::Http => "http",
        ListenerProtocol::Https => "https",
        ListenerProtocol::TlsPassthrough => "tls_passthrough",
        ListenerProtocol::Tcp => "tcp",
        ListenerProtocol::Udp => "udp",
    }
}

/// Whether two bind addresses take a common socket: equal, or one is a wildcard covering the
/// other (`0.0.0.0` covers IPv4, `::` covers everything since it is bound dual-stack).
fn overlaps(a: IpAddr, b: IpAddr) -> bool {
    fn covers(w: IpAddr, x: IpAddr) -> bool {
        match w {
            IpAddr::V6(v6) => v6.is_unspecified(),
            IpAddr::V4(v4) => v4.is_unspecified() && x.is_ipv4(),
        }
    }
    a == b || covers(a, b) || covers(b, a)
}

fn has_ctl(s: &str) -> bool {
    s.chars().any(|c| c.is_control())
}

/// An HTTP token (RFC 9110 `tchar`s): header names, methods.
fn check_token(s: &str, what: &str) -> Result<(), String> {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if s.is_empty() {
        Err(format!("{what} must not be empty"))
    } else if !s.bytes().all(tchar) {
        Err(format!("invalid {what} {s:?}: not an HTTP token"))
    } else {
        Ok(())
    }
}

/// A lower-case DNS name, optionally with a leading `*.` when `wildcard` is allowed; no port,
/// no trailing dot, not an IP address.
fn check_hostname(name: &str, wildcard: bool) -> Result<(), String> {
    let bad = |why: &str| Err(format!("invalid hostname {name:?}: {why}"));
    if name.is_empty() {
        return bad("must not be empty");
    }
    if name.contains(':') {
        return bad("must not include a port");
    }
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return bad("must be lower-case");
    }
    if name.len() > 253 {
        return bad("longer than 253 characters");
    }
    let rest = match name.strip_prefix("*.") {
        Some(rest) if wildcard => rest,
        Some(_) => return bad("wildcards are not allowed here"),
        None => name,
    };
    if rest.contains('*') {
        return bad("a wildcard is only allowed as the whole first label (\"*.example.com\")");
    }
    if rest.parse::<IpAddr>().is_ok() {
        return bad("must be a DNS name, not an IP address");
    }
    for label in rest.split('.') {
        if label.is_empty() {
            return bad("empty label");
        }
        if label.len() > 63 {
            return bad("label longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return bad("only a-z, 0-9, \"-\" and \".\" are allowed");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("labels must not start or end with \"-\"");
        }
    }
    Ok(())
}

/// `host:port`, with IPv6 hosts in brackets (`[::1]:80`) and a non-zero port.
fn check_endpoint(addr: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("invalid endpoint {addr:?}: {why}"));
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let Some((ip, port)) = rest.split_once("]:") else {
            return bad("expected \"[ipv6]:port\"");
        };
        if ip.parse::<std::net::Ipv6Addr>().is_err() {
            return bad("invalid IPv6 address");
        }
        (None, port)
    } else {
        let Some((host, port)) = addr.rsplit_once(':') else {
            return bad("expected \"host:port\"");
        };
        if host.contains(':') {
            return bad("IPv6 addresses must be in brackets, e.g. \"[::1]:80\"");
        }
        (Some(host), port)
    };
    match port.parse::<u16>() {
        Ok(0) => return bad("port must not be 0"),
        Ok(_) => {}
        Err(_) => return bad("invalid port"),
    }
    if let Some(host) = host {
        if host.parse::<std::net::Ipv4Addr>().is_err() && check_hostname(host, false).is_err() {
            return bad("host is neither an IP address nor a valid DNS name");
        }
    }
    Ok(())
}

/// A CORS origin: `*`, or `scheme://host[:port]` with at most one `*` in the host.
fn check_origin(origin: &str) -> Result<(), String> {
    if origin == "*" {
        return Ok(());
    }
    let bad = |why: &str| Err(format!("invalid origin {origin:?}: {why}"));
    let Some((scheme, rest)) = origin.split_once("://") else {
        return bad("expected \"*\" or \"scheme://host[:port]\"");
    };
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_lowercase())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
    if !scheme_ok {
        return bad("invalid scheme");
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !rest.starts_with('[') || h.ends_with(']') => (h, Some(p)),
        _ => (rest, None),
    };
    if let Some(p) = port {
        if !matches!(p.parse::<u16>(), Ok(n) if n != 0) {
            return bad("invalid port");
        }
    }
    if host.is_empty() {
        return bad("missing host");
    }
    if host.matches('*').count() > 1 {
        return bad("at most one \"*\" is allowed in the host");
    }
    if let Some(ip6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return match ip6.parse::<std::net::Ipv6Addr>() {
            Ok(_) => Ok(()),
            Err(_) => bad("invalid IPv6 address"),
        };
    }
    let host_ok = host
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.*".contains(&b));
    if !host_ok {
        return bad("the host may only contain a-z, 0-9, \"-\", \".\" and one \"*\"");
    }
    Ok(())
}

/// Finds the PEM block labels (`-----BEGIN <label>-----`) in `text`.
fn pem_labels(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter_map(|line| {
        line.trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
    })
}

/// Checks that `text` holds a complete PEM block of the wanted kind.
fn check_pem(text: &str, kind: PemKind) -> Result<(), String> {
    let wanted = |label: &str| match kind {
        PemKind::Certificate => label == "CERTIFICATE",
        PemKind::PrivateKey => label.ends_with("PRIVATE KEY") && label != "ENCRYPTED PRIVATE KEY",
    };
    let label = pem_labels(text).find(|l| wanted(l));
    match (label, kind) {
        (Some(label), _) if text.contains(&format!("-----END {label}-----")) => Ok(()),
        (Some(label), _) => Err(format!("PEM block {label} has no END line")),
        (None, PemKind::Certificate) => {
            Err("no \"-----BEGIN CERTIFICATE-----\" PEM block found".into())
        }
        (None, PemKind::PrivateKey) if pem_labels(text).any(|l| l == "ENCRYPTED PRIVATE KEY") => {
            Err("encrypted private keys are not supported".into())
        }
        (None, PemKind::PrivateKey) => {
            Err("no \"-----BEGIN … PRIVATE KEY-----\" PEM block found".into())
        }
    }
}

/// Reads a PEM file and checks its content.
fn check_pem_file(file: &Path, kind: PemKind) -> Result<(), String> {
    match std::fs::read(file) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            check_pem(&text, kind).map_err(|e| format!("{}: {e}", file.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("file not found: {}", file.display()))
        }
        Err(e) => Err(format!("cannot read {}: {e}", file.display())),
    }
}
