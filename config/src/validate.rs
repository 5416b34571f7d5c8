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

    /// [`Config::validate`], except that a virtual host for which `known_good(index)` is true
    /// only has its name checked for uniqueness. For a config built from one that validated
    /// (the dataplane applying a delta): the caller says which virtual hosts are unchanged,
    /// and must pass `|_| false` when listeners or backend names changed, because virtual
    /// hosts are checked against those. An unchanged static root is not checked on disk again.
    pub fn validate_trusting(
        &self,
        known_good: &dyn Fn(usize) -> bool,
    ) -> Result<(), ValidationErrors> {
        Validator::run_trusting(self, true, known_good)
    }

    /// [`Config::validate`] of a config produced by applying a delta to one that validated,
    /// when the listeners and backend names are unchanged: only the virtual hosts at
    /// `changed` (positions) are checked, and the other parts only when `rest` (settings,
    /// listeners or backends changed). Virtual host names must be known unique (the delta's
    /// name index guarantees it). Costs in proportion to what changed, not to the number of
    /// virtual hosts.
    pub fn validate_patch(&self, changed: &[usize], rest: bool) -> Result<(), ValidationErrors> {
        Validator::run_with(self, true, Vhosts::Only(changed), rest)
    }

    #[cfg(test)]
    fn validate_patch_structure(
        &self,
        changed: &[usize],
        rest: bool,
    ) -> Result<(), ValidationErrors> {
        Validator::run_with(self, false, Vhosts::Only(changed), rest)
    }

    #[cfg(test)]
    fn validate_trusting_structure(
        &self,
        known_good: &dyn Fn(usize) -> bool,
    ) -> Result<(), ValidationErrors> {
        Validator::run_trusting(self, false, known_good)
    }
}

/// Largest weight of a backend reference or endpoint (the Gateway API bound).
const MAX_WEIGHT: u32 = 1_000_000;
/// Most retry attempts after the first.
const MAX_RETRY_ATTEMPTS: u32 = 10;
/// Smallest allowed `limits.max_header_bytes`.
const MIN_HEADER_BYTES: u32 = 1024;

/// The kind of PEM block a [`PemSource`] must contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PemKind {
    /// At least one `CERTIFICATE` block (a certificate or a CA bundle).
    Certificate,
    /// An unencrypted private key block (`PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`).
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

/// Which virtual hosts a validation checks.
#[derive(Clone, Copy)]
enum Vhosts<'f> {
    /// All of them, but those for which the function is true only for name uniqueness.
    Trusting(&'f dyn Fn(usize) -> bool),
    /// Only those at these positions, names known unique.
    Only(&'f [usize]),
}

/// Walks the config in document order, collecting errors.
struct Validator<'a> {
    files: bool,
    errors: Vec<ValidationError>,
    /// Backend names (all of them, so references may point forward).
    backends: HashSet<&'a str>,
    /// User set names (`basic_auth.user_set` references).
    user_sets: HashSet<&'a str>,
    /// Listener name to protocol (first occurrence of each name).
    listeners: HashMap<&'a str, ListenerProtocol>,
    /// Sockets bound by listeners seen so far.
    bound: Vec<Bound>,
}

impl<'a> Validator<'a> {
    fn run(cfg: &'a Config, files: bool) -> Result<(), ValidationErrors> {
        Self::run_trusting(cfg, files, &|_| false)
    }

    fn run_trusting(
        cfg: &'a Config,
        files: bool,
        known_good: &dyn Fn(usize) -> bool,
    ) -> Result<(), ValidationErrors> {
        Self::run_with(cfg, files, Vhosts::Trusting(known_good), true)
    }

    fn run_with(
        cfg: &'a Config,
        files: bool,
        vhosts: Vhosts<'_>,
        rest: bool,
    ) -> Result<(), ValidationErrors> {
        let mut listeners = HashMap::new();
        for l in &cfg.listeners {
            listeners.entry(l.name.as_str()).or_insert(l.protocol);
        }
        let mut v = Validator {
            files,
            errors: Vec::new(),
            backends: cfg.backends.iter().map(|b| b.name.as_str()).collect(),
            user_sets: cfg.user_sets.iter().map(|s| s.name.as_str()).collect(),
            listeners,
            bound: Vec::new(),
        };
        v.config(cfg, vhosts, rest);
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

    fn config(&mut self, cfg: &'a Config, vhosts: Vhosts<'_>, rest: bool) {
        if let Vhosts::Only(changed) = vhosts {
            if rest {
                self.rest(cfg, true);
            }
            for &i in changed {
                if let Some(vh) = cfg.virtual_hosts.get(i) {
                    let path = format!("virtual_hosts[{i}]");
                    if vh.name.is_empty() {
                        self.err(format!("{path}.name"), "must not be empty");
                    }
                    self.virtual_host_body(&path, vh);
                }
            }
            if rest {
                self.rest(cfg, false);
            }
            return;
        }
        let known_good = match vhosts {
            Vhosts::Trusting(f) => f,
            Vhosts::Only(_) => unreachable!(),
        };
        self.rest(cfg, true);
        let mut names = HashMap::new();
        for (i, vh) in cfg.virtual_hosts.iter().enumerate() {
            if known_good(i) {
                // Valid before, in the same context: only its uniqueness can have changed.
                let path = format!("virtual_hosts[{i}]");
                self.unique_name(&path, "virtual host", &vh.name, &mut names);
                continue;
            }
            self.virtual_host(&format!("virtual_hosts[{i}]"), vh, &mut names);
        }
        self.rest(cfg, false);
    }

    /// Everything but the virtual hosts: the part before them in document order
    /// (`before`: version and listeners), or the part after them.
    fn rest(&mut self, cfg: &'a Config, before: bool) {
        if before {
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
            return;
        }
        let mut names = HashMap::new();
        for (i, b) in cfg.backends.iter().enumerate() {
            self.backend(&format!("backends[{i}]"), b, &mut names);
        }
        let mut names = HashMap::new();
        for (i, set) in cfg.user_sets.iter().enumerate() {
            let path = format!("user_sets[{i}]");
            self.unique_name(&path, "user set", &set.name, &mut names);
            for (field, msg) in crate::htpasswd::check_users(&set.users) {
                self.err(format!("{path}.{field}"), msg);
            }
        }
        self.limits(cfg);
        if cfg.limits.websocket_idle_timeout.is_zero() {
            self.err("limits.websocket_idle_timeout", "must be greater than 0");
        }
        self.http3(cfg);
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
        if let Some(t) = &cfg.tracing {
            self.tracing(t);
        }
        let found = crate::traffic::check_client_ip(&cfg.client_ip, &cfg.listeners);
        self.problems("client_ip", found);
        self.problems("l4", crate::traffic::check_l4(&cfg.l4));
        if cfg.cache.max_bytes == 0 {
            self.err("cache.max_bytes", "must be greater than 0");
        }
        if cfg.cache.max_entry_bytes == 0 || cfg.cache.max_entry_bytes > cfg.cache.max_bytes {
            self.err(
                "cache.max_entry_bytes",
                "must be greater than 0 and at most cache.max_bytes",
            );
        }
    }

    /// `tracing`: an OTLP endpoint its protocol can reach, its TLS material, and bounded
    /// queue, batch and timers.
    fn tracing(&mut self, t: &crate::Tracing) {
        if let Err(m) = check_otlp_endpoint(&t.otlp_endpoint, t.otlp_protocol) {
            self.err("tracing.otlp_endpoint", m);
        }
        let tls = t.otlp_endpoint.starts_with("https://");
        for (field, src, kind) in [
            ("tracing.otlp_ca", &t.otlp_ca, PemKind::Certificate),
            (
                "tracing.otlp_client_cert",
                &t.otlp_client_cert,
                PemKind::Certificate,
            ),
            (
                "tracing.otlp_client_key",
                &t.otlp_client_key,
                PemKind::PrivateKey,
            ),
        ] {
            let Some(src) = src else { continue };
            if tls {
                self.pem(field, src, kind);
            } else {
                self.err(field, "needs an https:// otlp_endpoint");
            }
        }
        match (&t.otlp_client_cert, &t.otlp_client_key) {
            (Some(_), None) => {
                self.err("tracing.otlp_client_key", "required with otlp_client_cert")
            }
            (None, Some(_)) => {
                self.err("tracing.otlp_client_cert", "required with otlp_client_key")
            }
            _ => {}
        }
        if !(t.sampling_ratio.is_finite() && (0.0..=1.0).contains(&t.sampling_ratio)) {
            self.err("tracing.sampling_ratio", "must be between 0 and 1");
        }
        let name_ok = |b: u8| b.is_ascii_graphic() || b == b' ';
        if t.service_name.is_empty()
            || t.service_name.len() > 255
            || !t.service_name.bytes().all(name_ok)
        {
            self.err(
                "tracing.service_name",
                "must be 1 to 255 printable ASCII characters",
            );
        }
        if t.max_queue_spans == 0 || t.max_queue_spans > MAX_TRACE_QUEUE {
            self.err(
                "tracing.max_queue_spans",
                format!("must be between 1 and {MAX_TRACE_QUEUE}"),
            );
        }
        if t.max_batch_spans == 0 || t.max_batch_spans > MAX_TRACE_BATCH {
            self.err(
                "tracing.max_batch_spans",
                format!("must be between 1 and {MAX_TRACE_BATCH}"),
            );
        }
        for (field, d) in [
            ("tracing.batch_delay", t.batch_delay),
            ("tracing.export_timeout", t.export_timeout),
        ] {
            if d.is_zero() || d.get() > std::time::Duration::from_secs(60) {
                self.err(field, "must be greater than 0 and at most 60s");
            }
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
        // Port 0 asks the OS for a free port (used by tests); it never collides.
        if l.port == 0 {
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
                "only allowed on https, tls and tls_passthrough listeners",
            ),
            (None, P::Tls) if l.l4_routes.iter().any(|r| r.terminate) => self.err(
                format!("{path}.tls"),
                "required on a tls listener with terminating routes",
            ),
            (Some(tls), _) => {
                let tpath = format!("{path}.tls.certificates");
                if tls.certificates.is_empty() {
                    self.err(&tpath, "at least one certificate is required");
                }
                for (k, c) in tls.certificates.iter().enumerate() {
                    self.certificate(&format!("{tpath}[{k}]"), c);
                }
                if let Some(ca) = &tls.client_auth {
                    let cpath = format!("{path}.tls.client_auth");
                    if l.protocol != P::Https {
                        self.err(&cpath, "only allowed on https listeners");
                    }
                    self.pem(&format!("{cpath}.ca"), &ca.ca, PemKind::Certificate);
                }
                self.host_client_auth(&format!("{path}.tls"), tls, l.protocol);
            }
            (None, _) => {}
        }
        if l.max_requests_in_flight == Some(0) {
            self.err(
                format!("{path}.max_requests_in_flight"),
                "must be greater than 0 when set",
            );
        }
        if l.advertised_port == Some(0) {
            self.err(
                format!("{path}.advertised_port"),
                "must be between 1 and 65535 when set",
            );
        }
        let l4 = l.protocol.is_l4();
        // An `https` listener's `l4_routes` are its passthrough hosts: TLS connections whose
        // SNI they name are passed through unterminated, the others are served here.
        let by_sni = matches!(l.protocol, P::TlsPassthrough | P::Tls | P::Https);
        // An L4 listener without routes is valid: it accepts connections and closes them (a
        // Gateway listener that is programmed but has no usable route must not refuse them).
        if !l4 && l.protocol != P::Https && !l.l4_routes.is_empty() {
            self.err(
                format!("{path}.l4_routes"),
                "only allowed on tcp, udp, tls_passthrough, tls and https listeners",
            );
        }
        let mut route_names = HashMap::new();
        for (r, route) in l.l4_routes.iter().enumerate() {
            let rpath = format!("{path}.l4_routes[{r}]");
            self.unique_name(&rpath, "l4 route", &route.name, &mut route_names);
            if !route.hostnames.is_empty() && !by_sni {
                self.err(
                    format!("{rpath}.hostnames"),
                    "only allowed on tls_passthrough, tls and https listeners",
                );
            } else if route.hostnames.is_empty() && l.protocol == P::Https {
                // Without a name every TLS connection would pass through: that is a
                // `tls_passthrough` listener, not an `https` one.
                self.err(
                    format!("{rpath}.hostnames"),
                    "at least one hostname is required on an https listener's passthrough route",
                );
            } else {
                self.hostnames(&format!("{rpath}.hostnames"), &route.hostnames);
            }
            if route.terminate && l.protocol != P::Tls {
                self.err(
                    format!("{rpath}.terminate"),
                    "only allowed on tls listeners",
                );
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

    /// `host_client_auth`: https only, not beside `client_auth`, no host in two entries, a
    /// depth of 1..=[`MAX_VERIFY_DEPTH`], an absolute error page URL a `Location` can carry,
    /// a subject regex that compiles.
    fn host_client_auth(
        &mut self,
        path: &str,
        tls: &crate::ListenerTls,
        protocol: ListenerProtocol,
    ) {
        if tls.host_client_auth.is_empty() {
            return;
        }
        let hpath = format!("{path}.host_client_auth");
        if protocol != ListenerProtocol::Https {
            self.err(&hpath, "only allowed on https listeners");
        }
        if tls.client_auth.is_some() {
            self.err(
                &hpath,
                "not together with client_auth (which asks every client)",
            );
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, a) in tls.host_client_auth.iter().enumerate() {
            let epath = format!("{hpath}[{i}]");
            if a.hostnames.is_empty() {
                self.err(
                    format!("{epath}.hostnames"),
                    "at least one hostname is required",
                );
            }
            self.hostnames(&format!("{epath}.hostnames"), &a.hostnames);
            for (h, name) in a.hostnames.iter().enumerate() {
                let key = name.trim_end_matches('.').to_ascii_lowercase();
                match seen.get(&key) {
                    Some(&other) if other != i => self.err(
                        format!("{epath}.hostnames[{h}]"),
                        format!("{name:?} is also in host_client_auth[{other}]"),
                    ),
                    _ => {
                        seen.insert(key, i);
                    }
                }
            }
            self.pem(&format!("{epath}.ca"), &a.ca, PemKind::Certificate);
            if a.verify_depth == 0 || a.verify_depth > MAX_VERIFY_DEPTH {
                self.err(
                    format!("{epath}.verify_depth"),
                    format!("must be between 1 and {MAX_VERIFY_DEPTH}"),
                );
            }
            if let Some(url) = &a.error_page {
                if let Err(msg) = check_error_page(url) {
                    self.err(format!("{epath}.error_page"), msg);
                }
            }
            if let Some(re) = &a.match_subject {
                if re.len() > MAX_SUBJECT_REGEX {
                    self.err(
                        format!("{epath}.match_subject"),
                        format!("longer than {MAX_SUBJECT_REGEX} bytes"),
                    );
                } else {
                    self.regex(&format!("{epath}.match_subject"), re);
                }
            }
        }
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
        self.virtual_host_body(path, vh);
    }

    /// Everything about a virtual host but the uniqueness of its name.
    fn virtual_host_body(&mut self, path: &str, vh: &'a VirtualHost) {
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
        let (mut basic, mut external) = (false, false);
        for (f, filter) in route.filters.iter().enumerate() {
            let fpath = format!("{path}.filters[{f}]");
            match filter {
                // The dataplane compiles one of each: a second would be skipped, not checked.
                Filter::BasicAuth(_) if std::mem::replace(&mut basic, true) => {
                    self.err(&fpath, "at most one basic_auth filter is allowed per route");
                }
                Filter::ExternalAuth(_) if std::mem::replace(&mut external, true) => {
                    self.err(
                        &fpath,
                        "at most one external_auth filter is allowed per route",
                    );
                }
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
        for (name, d) in [
            ("connect", t.connect),
            ("read_idle", t.read_idle),
            ("send_idle", t.send_idle),
        ] {
            if let Some(d) = d {
                if d.is_zero() || d > crate::model::MAX_IDLE_TIMEOUT {
                    let max = crate::model::MAX_IDLE_TIMEOUT;
                    let msg = format!("must be greater than 0 and at most {max}, got {d}");
                    self.err(format!("{path}.timeouts.{name}"), msg);
                }
            }
        }
        if let (Some(req), Some(be)) = (t.request, t.backend) {
            if be > req && !req.is_zero() {
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
            // ingress-nginx's `proxy-next-upstream-timeout: 0` means no limit, where a budget
            // of 0 would allow no retry at all: a hand-written 0 is refused rather than read
            // either way.
            if retry.budget.is_some_and(crate::Duration::is_zero) {
                let msg = "must be greater than 0 (omit it for no limit; attempts: 0 for no retry)";
                self.err(format!("{path}.retry.budget"), msg.to_string());
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
        for (c, cm) in m.cookies.iter().enumerate() {
            let cpath = format!("{path}.cookies[{c}]");
            if let Err(msg) = check_token(&cm.name, "cookie name") {
                self.err(format!("{cpath}.name"), msg);
            }
            // RFC 6265 cookie-octets: what a client can send as the value.
            let octet =
                |b: u8| matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E);
            if cm.value.is_empty() || !cm.value.bytes().all(octet) {
                let msg = format!(
                    "invalid cookie value {:?}: one or more RFC 6265 cookie-octets",
                    cm.value
                );
                self.err(format!("{cpath}.value"), msg);
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
            Filter::RateLimit(r) => self.problems(
                &format!("{path}.rate_limit"),
                crate::traffic::check_rate_limit(r),
            ),
            Filter::ConcurrencyLimit(c) => self.problems(
                &format!("{path}.concurrency_limit"),
                crate::traffic::check_concurrency_limit(c),
            ),
            Filter::IpAccess(a) => self.problems(
                &format!("{path}.ip_access"),
                crate::traffic::check_ip_access(a),
            ),
            Filter::BasicAuth(a) => {
                for (field, msg) in crate::htpasswd::check_basic_auth(a) {
                    self.err(format!("{path}.basic_auth.{field}"), msg);
                }
                if let Some(set) = &a.user_set {
                    if !self.user_sets.contains(set.as_str()) {
                        self.err(
                            format!("{path}.basic_auth.user_set"),
                            format!("unknown user set {set:?}"),
                        );
                    }
                }
            }
            Filter::ExternalAuth(a) => {
                for (field, msg) in crate::ext_auth::check_external_auth(a) {
                    self.err(format!("{path}.external_auth.{field}"), msg);
                }
            }
            Filter::Compress(c) => self.compress(&format!("{path}.compress"), c),
            Filter::Cache(c) => self.cache_policy(&format!("{path}.cache"), c),
            Filter::Grpc(_) => {}
            Filter::ErrorPages(e) => {
                let fpath = format!("{path}.error_pages");
                if let Some(b) = &e.backend {
                    if !self.backends.contains(b.as_str()) {
                        self.err(format!("{fpath}.backend"), format!("unknown backend {b:?}"));
                    }
                }
                for (field, msg) in crate::error_pages::check_error_pages(e) {
                    self.err(format!("{fpath}.{field}"), msg);
                }
            }
        }
    }

    fn compress(&mut self, path: &str, c: &crate::Compression) {
        if c.enabled && c.algorithms.is_empty() {
            self.err(
                format!("{path}.algorithms"),
                "must list at least one algorithm",
            );
        }
        for (k, a) in c.algorithms.iter().enumerate() {
            if c.algorithms[..k].contains(a) {
                let msg = format!("{:?} is listed more than once", a.token());
                self.err(format!("{path}.algorithms[{k}]"), msg);
            }
        }
        for (k, m) in c.mime_types.iter().enumerate() {
            let ok = m.split_once('/').is_some_and(|(t, s)| {
                check_token(t, "type").is_ok() && (s == "*" || check_token(s, "subtype").is_ok())
            });
            if !ok {
                let msg = format!("{m:?} is not a media type (type/subtype or type/*)");
                self.err(format!("{path}.mime_types[{k}]"), msg);
            }
        }
    }

    fn cache_policy(&mut self, path: &str, c: &crate::CachePolicy) {
        if c.ttl.is_some_and(|t| t.is_zero()) {
            self.err(format!("{path}.ttl"), "must be greater than 0 when set");
        }
        for (k, h) in c.key_headers.iter().enumerate() {
            if let Err(msg) = check_token(h, "header name") {
                self.err(format!("{path}.key_headers[{k}]"), msg);
            }
        }
    }

    /// Reports problems found by the traffic-policy checks under `path`.
    fn problems(&mut self, path: &str, found: crate::traffic::Problems) {
        for (field, msg) in found {
            if field.is_empty() {
                self.err(path, msg);
            } else {
                self.err(format!("{path}.{field}"), msg);
            }
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
            PathRewrite::Regex {
                pattern,
                substitution,
            } => {
                self.regex(&format!("{path}.regex.pattern"), pattern);
                let spath = format!("{path}.regex.substitution");
                self.path_value(&spath, substitution);
                if let Err(msg) = check_substitution(substitution) {
                    self.err(spath, msg);
                }
            }
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
                if let Err(msg) = check_token(v, "token") {
                    self.err(format!("{path}.{list}[{k}]"), msg);
                }
            }
        }
        // `*` with credentials is allowed: the dataplane then echoes the request's origin
        // instead of `*` (browsers reject `*` with credentials), as Gateway API's CORS asks.
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
            if !tls.subject_alt_names.is_empty() && tls.ca.is_none() && !tls.well_known_ca {
                self.err(
                    format!("{tpath}.subject_alt_names"),
                    "requires ca or well_known_ca (without them the backend certificate is \
                     not verified)",
                );
            }
            for (k, san) in tls.subject_alt_names.iter().enumerate() {
                // A URI SAN (`spiffe://…`): scheme, `://`, no spaces or controls.
                let uri = san.split_once("://").is_some_and(|(scheme, rest)| {
                    !scheme.is_empty()
                        && scheme
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
                        && !rest.is_empty()
                        && !rest.bytes().any(|b| b <= 0x20 || b == 0x7f)
                });
                if !uri && san.parse::<IpAddr>().is_err() {
                    if let Err(msg) = check_hostname(san, true) {
                        self.err(format!("{tpath}.subject_alt_names[{k}]"), msg);
                    }
                }
            }
            if let Some(d) = tls.verify_depth {
                if d == 0 || d > MAX_VERIFY_DEPTH {
                    self.err(
                        format!("{tpath}.verify_depth"),
                        format!("must be between 1 and {MAX_VERIFY_DEPTH}"),
                    );
                } else if tls.ca.is_none() && !tls.well_known_ca {
                    self.err(
                        format!("{tpath}.verify_depth"),
                        "requires ca or well_known_ca (without them the backend certificate is \
                         not verified)",
                    );
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
        self.problems(path, crate::traffic::check_backend_traffic(b));
    }

    // ---------------------------------------------------------------- limits

    fn limits(&mut self, cfg: &Config) {
        let l = &cfg.limits;
        // (field, is zero), in the field order of `Limits`; max_header_bytes has its own floor.
        let fields: [(&str, bool); 12] = [
            ("max_connections", l.max_connections == 0),
            ("max_requests_in_flight", l.max_requests_in_flight == 0),
            ("queue_timeout", l.queue_timeout.is_zero()),
            ("retry_after_seconds", l.retry_after_seconds == 0),
            ("max_concurrent_streams", l.max_concurrent_streams == 0),
            (
                "max_pending_reset_streams",
                l.max_pending_reset_streams == 0,
            ),
            ("header_read_timeout", l.header_read_timeout.is_zero()),
            ("body_idle_timeout", l.body_idle_timeout.is_zero()),
            ("send_timeout", l.send_timeout.is_zero()),
            ("idle_timeout", l.idle_timeout.is_zero()),
            ("max_request_body_bytes", l.max_request_body_bytes == 0),
            ("drain_timeout", l.drain_timeout.is_zero()),
        ];
        for (field, zero) in fields {
            if field == "max_request_body_bytes" && l.max_header_bytes < MIN_HEADER_BYTES {
                let msg = format!(
                    "must be at least {MIN_HEADER_BYTES}, got {}",
                    l.max_header_bytes
                );
                self.err("limits.max_header_bytes", msg);
            }
            if zero {
                self.err(format!("limits.{field}"), "must be greater than 0");
            }
        }
        let read_ahead = [
            (
                "static_read_ahead",
                l.static_read_ahead,
                crate::MIN_STATIC_READ_AHEAD,
            ),
            (
                "proxy_read_ahead",
                l.proxy_read_ahead,
                crate::MIN_PROXY_READ_AHEAD,
            ),
        ];
        let buffers = read_ahead
            .into_iter()
            .map(|(f, n, min)| (f, n, min, crate::MAX_READ_AHEAD));
        let write = (
            "http2_write_buffer",
            l.http2_write_buffer,
            crate::MIN_HTTP2_WRITE_BUFFER,
            crate::MAX_HTTP2_WRITE_BUFFER,
        );
        for (field, n, min, max) in buffers.chain([write]) {
            if !(min..=max).contains(&n) {
                let msg = format!("must be between {min} and {max}, got {n}");
                self.err(format!("limits.{field}"), msg);
            }
        }
        let total = l.static_read_ahead_total;
        let (min, max) = (
            u64::from(crate::MIN_STATIC_READ_AHEAD),
            crate::MAX_STATIC_READ_AHEAD_TOTAL,
        );
        if !(min..=max).contains(&total) {
            let msg = format!("must be between {min} and {max}, got {total}");
            self.err("limits.static_read_ahead_total", msg);
        }
    }
}

impl Validator<'_> {
    // ---------------------------------------------------------------- http3

    fn http3(&mut self, cfg: &Config) {
        let h = &cfg.http3;
        if h.max_concurrent_bidi_streams == 0 {
            self.err(
                "http3.max_concurrent_bidi_streams",
                "must be greater than 0",
            );
        }
        let windows = [
            ("stream_receive_window", h.stream_receive_window),
            ("connection_receive_window", h.connection_receive_window),
            ("send_window", h.send_window),
        ];
        for (field, v) in windows {
            if v < MIN_QUIC_WINDOW {
                let msg = format!("must be at least {MIN_QUIC_WINDOW}, got {v}");
                self.err(format!("http3.{field}"), msg);
            }
        }
        if h.send_window > MAX_QUIC_SEND_WINDOW {
            let msg = format!(
                "must be between {MIN_QUIC_WINDOW} and {MAX_QUIC_SEND_WINDOW}, got {}",
                h.send_window
            );
            self.err("http3.send_window", msg);
        }
        if h.send_budget < u64::from(MIN_QUIC_WINDOW) {
            let msg = format!("must be at least {MIN_QUIC_WINDOW}, got {}", h.send_budget);
            self.err("http3.send_budget", msg);
        }
        if h.connection_receive_window < h.stream_receive_window {
            let msg = format!(
                "must be at least stream_receive_window ({}), got {}",
                h.stream_receive_window, h.connection_receive_window
            );
            self.err("http3.connection_receive_window", msg);
        }
        if h.alt_svc_max_age.get().as_secs() == 0 {
            self.err("http3.alt_svc_max_age", "must be at least 1s");
        }
        if !(1200..=65527).contains(&h.initial_mtu) {
            let msg = format!("must be 1200-65527, got {}", h.initial_mtu);
            self.err("http3.initial_mtu", msg);
        }
        if h.mtu_discovery_upper_bound < h.initial_mtu || h.mtu_discovery_upper_bound > 65527 {
            let msg = format!(
                "must be between initial_mtu ({}) and 65527, got {}",
                h.initial_mtu, h.mtu_discovery_upper_bound
            );
            self.err("http3.mtu_discovery_upper_bound", msg);
        }
        if !(1..=1000).contains(&h.ack_eliciting_threshold) {
            let msg = format!("must be 1-1000, got {}", h.ack_eliciting_threshold);
            self.err("http3.ack_eliciting_threshold", msg);
        }
        if !(4096..=131_072).contains(&h.static_chunk_size) {
            let msg = format!("must be 4096-131072, got {}", h.static_chunk_size);
            self.err("http3.static_chunk_size", msg);
        }
    }
}

/// Smallest allowed QUIC flow-control window, bytes.
const MIN_QUIC_WINDOW: u32 = 16 * 1024;

/// Largest allowed `http3.send_window`, bytes (16 MiB: a 1 Gbit/s path at a 128 ms round
/// trip). What a connection keeps for its unacknowledged packets grows with it: the vendored
/// quinn-proto's budget of that state is the window (counted up to 16 MiB) + 256 KiB
/// (vendor/README.md).
const MAX_QUIC_SEND_WINDOW: u32 = 16 * 1024 * 1024;

// -------------------------------------------------------------------- helpers

fn proto_name(p: ListenerProtocol) -> &'static str {
    match p {
        ListenerProtocol::Http => "http",
        ListenerProtocol::Https => "https",
        ListenerProtocol::TlsPassthrough => "tls_passthrough",
        ListenerProtocol::Tls => "tls",
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

/// A regex rewrite's substitution: URI path characters only, `%` only in a whole
/// percent-encoding, `$` only as `$1`…`$9` (no nginx variables).
pub fn check_substitution(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'$' && !b.get(i + 1).is_some_and(|d| (b'1'..=b'9').contains(d)) {
            return Err(format!(
                "{s:?}: `$` must be followed by a group number 1-9 (variables are not supported)"
            ));
        }
        // A percent-encoding is complete here: the result is normalised, and a broken escape
        // would only be found per request (and the path then left un-rewritten).
        if c == b'%'
            && !b
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
        {
            return Err(format!(
                "{s:?}: `%` must start a percent-encoding (two hex digits)"
            ));
        }
        // RFC 3986 path characters (`pchar` and `/`), so the result is a valid URI path.
        if !(c.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&c)) {
            return Err(format!(
                "{s:?}: {:?} is not a URI path character",
                c as char
            ));
        }
    }
    Ok(())
}

fn has_ctl(s: &str) -> bool {
    s.chars().any(|c| c.is_control())
}

/// An HTTP token (RFC 9110 `tchar`s): header names, methods.
pub(crate) fn check_token(s: &str, what: &str) -> Result<(), String> {
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
/// no trailing dot, not an IP address (what a virtual host's `hostnames` and a rewrite's
/// `host` must be).
pub fn check_hostname(name: &str, wildcard: bool) -> Result<(), String> {
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

/// Checks that `text` holds a complete PEM block of the wanted kind (the check the config's
/// inline PEM sources get; the controller runs it on Secret and ConfigMap contents).
pub fn check_pem(text: &str, kind: PemKind) -> Result<(), String> {
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

/// Most finished spans a tracing queue may hold.
pub(crate) const MAX_TRACE_QUEUE: u32 = 1_000_000;
/// Most spans in one OTLP export request.
pub(crate) const MAX_TRACE_BATCH: u32 = 8192;

/// Whether `e` is an OTLP endpoint the dataplane can send to with `protocol`:
/// `http[s]://host[:port][/path]` (for gRPC no path but `/`, no query), printable ASCII, at
/// most 2048 bytes, no user information.
pub(crate) fn check_otlp_endpoint(
    e: &str,
    protocol: crate::OtlpProtocol,
) -> Result<(), &'static str> {
    if e.len() > 2048 || !e.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("must be printable ASCII without spaces, at most 2048 bytes");
    }
    let Some(rest) = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
    else {
        return Err("must be an http:// or https:// URL");
    };
    let (authority, path) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    if authority.contains('@') {
        return Err("must not carry user information");
    }
    if protocol == crate::OtlpProtocol::Grpc && !matches!(path, "" | "/") {
        return Err(
            "a grpc endpoint is scheme://host[:port] without path or query (the method path is fixed)",
        );
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((h, after)) = v6.split_once(']') else {
            return Err("an IPv6 host must be in brackets");
        };
        match after {
            "" => (h, None),
            p => match p.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => return Err("an IPv6 host must be in brackets"),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => return Err("an IPv6 host must be in brackets"),
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("needs a host");
    }
    if port.is_some_and(|p| p.parse::<u16>().map_or(true, |p| p == 0)) {
        return Err("port must be 1 to 65535");
    }
    Ok(())
}

/// The longest client certificate chain `host_client_auth.verify_depth` may allow.
pub const MAX_VERIFY_DEPTH: u8 = 8;

/// The longest `host_client_auth.match_subject` regex, bytes.
const MAX_SUBJECT_REGEX: usize = 1024;

/// An error page a client is redirected to: an absolute `http`/`https` URL of printable ASCII
/// without spaces (it goes into a `Location` header as it is), at most 2048 bytes.
pub fn check_error_page(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("must be an absolute http:// or https:// URL")?;
    if url.len() > 2048 {
        return Err("longer than 2048 bytes".into());
    }
    if rest.is_empty() || rest.starts_with('/') {
        return Err("has no host".into());
    }
    if !url.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("must be printable ASCII without spaces".into());
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    #[test]
    fn regex_rewrite_substitutions_take_groups_and_path_characters_only() {
        for ok in [
            "/",
            "/$1",
            "/api/$2/$1",
            "/a%2Fb/$9",
            "$1",
            "/~user/(x)+;=@:",
        ] {
            assert_eq!(check_substitution(ok), Ok(()), "{ok}");
        }
        // nginx variables, `$0`, `$` at the end, broken escapes, characters that are not in
        // a URI path (space, quote, `?`, `#`, CR/LF, non-ASCII).
        for bad in [
            "/$host",
            "/$0",
            "/x$",
            "/$$1",
            "/%",
            "/%2",
            "/%zz",
            "/a b",
            "/\"q\"",
            "/a?b=1",
            "/a#f",
            "/a\r\nX-Evil: 1",
            "/é",
            "/<x>",
        ] {
            assert!(check_substitution(bad).is_err(), "{bad:?} accepted");
        }
    }

    use super::*;
    use crate::{
        Admin, BackendTls, Congestion, Duration, Endpoint, FixedResponse, HeaderValue, Limits,
        MatchKind, Mirror, ProxyAction, RetryPolicy,
    };
    use std::path::PathBuf;

    const CERT: &str =
        "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n";
    const KEY: &str =
        "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n";

    /// A config using every feature. `@DIR@` is replaced by a directory holding `other.crt`,
    /// `other.key`, `ca.crt` and `www/` (see [`TempDir`]).
    const FULL: &str = r#"
version: 1
generation: 7
listeners:
  - name: http
    port: 8080
    protocol: http
    max_requests_in_flight: 500
  - name: https
    address: "::"
    port: 8443
    protocol: https
    tls:
      min_version: "1.3"
      certificates:
        - hostnames: [example.com, "*.example.com"]
          cert: {pem: "@CERT@"}
          key: {pem: "@KEY@"}
        - hostnames: [other.test]
          cert: {file: "@DIR@/other.crt"}
          key: {file: "@DIR@/other.key"}
  - name: dns
    address: 127.0.0.1
    port: 5353
    protocol: udp
    l4_routes:
      - name: dns
        backends: [{backend: dns}]
  - name: passthrough
    port: 9443
    protocol: tls_passthrough
    l4_routes:
      - name: db
        hostnames: [db.example.com]
        backends: [{backend: db, weight: 2}]
virtual_hosts:
  - name: site
    hostnames: [example.com, "*.example.com"]
    listeners: [http, https]
    routes:
      - name: health
        matches:
          - path: {exact: /healthz}
            method: GET
        action: {fixed: {status: 200, body: ok, content_type: text/plain}}
      - name: api
        matches:
          - path: {prefix: /api}
            headers: [{name: x-tenant, value: "^[a-z]+$", type: regex}]
            query: [{name: debug, value: "1"}]
        filters:
          - request_headers:
              set: [{name: x-from, value: sweety}]
              add: [{name: x-trace, value: "1"}]
              remove: [x-internal]
          - response_headers: {remove: [server]}
          - rewrite: {host: api.internal, path: {prefix: /v1}}
          - mirror: {backend: shadow, percent: 5.5}
          - cors:
              allow_origins: ["https://*.example.com", "http://localhost:3000"]
              allow_methods: [GET, POST]
              allow_headers: ["*"]
              expose_headers: [x-request-id]
              allow_credentials: true
              max_age: 600
        action:
          proxy:
            backends:
              - backend: api-v1
                weight: 90
              - backend: api-v2
                weight: 10
                filters:
                  - request_headers: {set: [{name: x-canary, value: "true"}]}
        timeouts: {request: 30s, backend: 10s}
        retry: {attempts: 2, codes: [502, 503], backoff: 100ms}
      - name: assets
        matches: [{path: {regex: "^/assets/.+\\.(js|css)$"}}]
        action:
          static:
            root: "@DIR@/www"
            index: [index.html]
            try_files: ["$uri", "$uri/", /index.html]
            precompressed: false
            cache_control: "public, max-age=3600"
            strip_prefix: /assets
      - name: old
        matches: [{path: {prefix: /old}}]
        filters:
          - redirect: {scheme: https, host: example.com, port: 8443, path: {prefix: /new}, status: 301}
        action: {fixed: {status: 404}}
backends:
  - name: api-v1
    lb: least_request
    endpoints: [{address: "10.0.0.1:8080"}, {address: "10.0.0.2:8080", weight: 3}]
    connect_timeout: 2s
    outlier: {consecutive_failures: 3, base_ejection_time: 5s, max_ejection_percent: 30}
    max_idle_per_endpoint: 16
  - name: api-v2
    protocol: h2
    tls:
      ca: {file: "@DIR@/ca.crt"}
      sni: api.internal
      subject_alt_names: [api2.internal, 10.0.0.3]
      client_cert: {pem: "@CERT@"}
      client_key: {pem: "@KEY@"}
    endpoints: [{address: "[fd00::3]:8443"}, {address: "api2.internal:8443"}]
  - name: shadow
    protocol: h2c
    endpoints: [{address: "10.0.0.9:80"}]
  - name: dns
    endpoints: [{address: "10.0.0.53:53"}]
  - name: db
    endpoints: [{address: "10.0.0.5:5432"}]
limits:
  max_connections: 1000
  queue_timeout: 50ms
  max_header_bytes: 16384
admin: {address: 127.0.0.1, port: 9901}
access_log: {enabled: true, path: /var/log/sweety/access.log, buffer_lines: 1024}
"#;

    fn full_with_dir(dir: &str) -> Config {
        let text = FULL
            .replace("@DIR@", dir)
            .replace("@CERT@", &CERT.replace('\n', "\\n"))
            .replace("@KEY@", &KEY.replace('\n', "\\n"));
        Config::from_yaml(&text).expect("FULL parses")
    }

    /// The full config with file paths that do not exist (fine for `validate_structure`).
    /// Also used by the parse/serialise tests in `lib.rs`.
    pub(crate) fn full() -> Config {
        full_with_dir("/nonexistent/sweety-config-test")
    }

    /// A scratch directory with the files FULL refers to, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let dir =
                std::env::temp_dir().join(format!("sweety-config-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("www")).unwrap();
            std::fs::write(dir.join("other.crt"), CERT).unwrap();
            std::fs::write(dir.join("other.key"), KEY).unwrap();
            std::fs::write(dir.join("ca.crt"), CERT).unwrap();
            TempDir(dir)
        }
        fn config(&self) -> Config {
            full_with_dir(self.0.to_str().unwrap())
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn route(c: &mut Config, i: usize) -> &mut Route {
        &mut c.virtual_hosts[0].routes[i]
    }

    fn proxy(c: &mut Config) -> &mut ProxyAction {
        match &mut route(c, 1).action {
            Action::Proxy(p) => p,
            other => panic!("route 1 is not a proxy: {other:?}"),
        }
    }

    fn static_site(c: &mut Config) -> &mut StaticSite {
        match &mut route(c, 2).action {
            Action::Static(s) => s,
            other => panic!("route 2 is not static: {other:?}"),
        }
    }

    fn headers(set: &[(&str, &str)], remove: &[&str]) -> HeaderModifier {
        HeaderModifier {
            set: set
                .iter()
                .map(|(n, v)| HeaderValue {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            add: Vec::new(),
            remove: remove.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Applies `edit` to the full config and asserts `validate_structure` reports exactly
    /// `expected` (path, message fragment) errors, in order.
    #[track_caller]
    fn expect(edit: impl FnOnce(&mut Config), expected: &[(&str, &str)]) {
        let mut c = full();
        edit(&mut c);
        let errors = match c.validate_structure() {
            Ok(()) => panic!("expected errors {expected:?}, config passed"),
            Err(e) => e.0,
        };
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        let want: Vec<&str> = expected.iter().map(|(p, _)| *p).collect();
        assert_eq!(paths, want, "errors: {errors:#?}");
        for (e, (_, msg)) in errors.iter().zip(expected) {
            assert!(
                e.message.contains(msg),
                "message of {} is {:?}, expected it to contain {msg:?}",
                e.path,
                e.message
            );
        }
    }

    #[track_caller]
    fn expect_one(edit: impl FnOnce(&mut Config), path: &str, msg: &str) {
        expect(edit, &[(path, msg)]);
    }

    #[track_caller]
    fn expect_ok(edit: impl FnOnce(&mut Config)) {
        let mut c = full();
        edit(&mut c);
        if let Err(e) = c.validate_structure() {
            panic!("expected the config to pass, got {e}");
        }
    }

    // ------------------------------------------------------------ whole config

    #[test]
    fn full_config_passes_structure_and_file_checks() {
        full().validate_structure().unwrap();
        let dir = TempDir::new("full");
        dir.config().validate().unwrap();
        Config::default().validate().unwrap();
    }

    #[test]
    fn file_checks_only_run_in_validate() {
        // The paths in `full()` do not exist: structure passes, full validation does not.
        let c = full();
        c.validate_structure().unwrap();
        let errors = c.validate().unwrap_err().0;
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "listeners[1].tls.certificates[1].cert",
                "listeners[1].tls.certificates[1].key",
                "virtual_hosts[0].routes[2].action.static.root",
                "backends[1].tls.ca",
            ]
        );
        assert!(errors[0]
            .message
            .starts_with("file not found: /nonexistent/"));
        assert!(errors[2]
            .message
            .starts_with("directory not found: /nonexistent/"));
        assert_eq!(
            errors[0].to_string(),
            "listeners[1].tls.certificates[1].cert: file not found: \
             /nonexistent/sweety-config-test/other.crt"
        );
    }

    #[test]
    fn reports_every_error_in_document_order() {
        let mut c = full();
        c.version = 2;
        c.listeners[0].address = "nope".into();
        c.listeners[1].tls = None;
        route(&mut c, 0).matches[0].path = Some(PathMatch::Regex("(".into()));
        route(&mut c, 3).filters[0] = Filter::Redirect(Redirect {
            status: 200,
            ..Redirect::default()
        });
        c.backends[0].connect_timeout = Duration::from_millis(0);
        c.limits.max_header_bytes = 10;
        c.admin = Some(Admin {
            address: "nope".into(),
            port: 1,
        });
        let errors = c.validate_structure().unwrap_err();
        let paths: Vec<&str> = errors.0.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "version",
                "listeners[0].address",
                "listeners[1].tls",
                "virtual_hosts[0].routes[0].matches[0].path.regex",
                "virtual_hosts[0].routes[3].filters[0].redirect.status",
                "backends[0].connect_timeout",
                "limits.max_header_bytes",
                "admin.address",
            ]
        );
        let text = errors.to_string();
        assert!(text.starts_with("8 config error(s):\n"), "{text}");
        assert!(text.contains("  version: unsupported schema version 2, expected 1\n"));
    }

    #[test]
    fn version_must_match() {
        expect_one(|c| c.version = 0, "version", "unsupported schema version 0");
    }

    // ------------------------------------------------------------ listeners

    #[test]
    fn host_client_auth_is_checked() {
        let entry = |hosts: &[&str]| crate::HostClientAuth {
            hostnames: hosts.iter().map(|h| h.to_string()).collect(),
            ca: PemSource::Pem(CERT.into()),
            verify: crate::HostVerify::Require,
            verify_depth: 1,
            pass_certificate: true,
            error_page: None,
            match_subject: None,
        };
        let with = |entries: Vec<crate::HostClientAuth>| {
            let mut c = full();
            c.listeners[1].tls.as_mut().unwrap().host_client_auth = entries;
            c
        };
        with(vec![entry(&["example.com"]), entry(&["*.example.com"])])
            .validate_structure()
            .unwrap();
        let errs = |c: Config| -> Vec<String> {
            c.validate_structure()
                .unwrap_err()
                .0
                .iter()
                .map(|e| e.to_string())
                .collect()
        };
        let p = "listeners[1].tls.host_client_auth";
        assert_eq!(
            errs(with(vec![entry(&["a.test"]), entry(&["a.test"])])),
            [format!(
                "{p}[1].hostnames[0]: \"a.test\" is also in host_client_auth[0]"
            )]
        );
        let mut bad = entry(&[]);
        bad.verify_depth = 0;
        bad.error_page = Some("/relative".into());
        bad.match_subject = Some("CN=(".into());
        bad.ca = PemSource::Pem("not pem".into());
        let e = errs(with(vec![bad]));
        assert_eq!(e.len(), 5, "{e:?}");
        for (i, field) in [
            "hostnames",
            "ca",
            "verify_depth",
            "error_page",
            "match_subject",
        ]
        .iter()
        .enumerate()
        {
            assert!(e[i].starts_with(&format!("{p}[0].{field}: ")), "{e:?}");
        }
        let mut c = with(vec![entry(&["a.test"])]);
        c.listeners[1].tls.as_mut().unwrap().client_auth = Some(crate::ClientAuth {
            ca: PemSource::Pem(CERT.into()),
            mode: crate::ClientAuthMode::Require,
        });
        assert_eq!(
            errs(c),
            [format!(
                "{p}: not together with client_auth (which asks every client)"
            )]
        );
        assert!(check_error_page("https://login.example/denied?x=1").is_ok());
        assert!(check_error_page("https://a b/").is_err());
        assert!(check_error_page("javascript:alert(1)").is_err());
    }

    #[test]
    fn listener_names() {
        expect_one(
            |c| c.listeners[2].name.clear(),
            "listeners[2].name",
            "must not be empty",
        );
        expect_one(
            |c| c.listeners[3].name = "dns".into(),
            "listeners[3].name",
            "duplicate listener name \"dns\" (first used by listeners[2])",
        );
    }

    #[test]
    fn listener_address_and_port() {
        expect_one(
            |c| c.listeners[0].address = "localhost".into(),
            "listeners[0].address",
            "invalid IP address \"localhost\"",
        );
        // Port 0: an ephemeral port chosen at bind time.
        expect_ok(|c| c.listeners[0].port = 0);
    }

    #[test]
    fn listener_bind_collisions() {
        // Same port, both on 0.0.0.0, both TCP.
        expect_one(
            |c| c.listeners[3].port = 8080,
            "listeners[3].port",
            "tcp port 8080 on 0.0.0.0 is already bound by listeners[0] (\"http\")",
        );
        // https with http3 takes UDP on its port, and :: covers 127.0.0.1.
        expect_one(
            |c| c.listeners[2].port = 8443,
            "listeners[2].port",
            "udp port 8443 on 127.0.0.1 is already bound by listeners[1] (\"https\")",
        );
        // Without http3 the same UDP port is free.
        expect_ok(|c| {
            c.listeners[1].http3 = false;
            c.listeners[2].port = 8443;
        });
        // 0.0.0.0 covers every IPv4 address...
        expect_one(
            |c| {
                let mut l = c.listeners[0].clone();
                l.name = "local".into();
                l.address = "127.0.0.1".into();
                c.listeners.push(l);
            },
            "listeners[4].port",
            "already bound by listeners[0]",
        );
        // ...but not IPv6 ones.
        expect_ok(|c| {
            let mut l = c.listeners[0].clone();
            l.name = "local6".into();
            l.address = "::1".into();
            c.listeners.push(l);
        });
        // :: covers IPv4 addresses too.
        expect_one(
            |c| {
                let mut l = c.listeners[3].clone();
                l.name = "tcp".into();
                l.protocol = ListenerProtocol::Tcp;
                l.address = "10.1.2.3".into();
                l.port = 8443;
                l.l4_routes[0].hostnames.clear();
                c.listeners.push(l);
            },
            "listeners[4].port",
            "tcp port 8443 on 10.1.2.3 is already bound by listeners[1]",
        );
        // TCP and UDP on the same port do not collide.
        expect_ok(|c| c.listeners[2].port = 8080);
    }

    #[test]
    fn listener_tls_rules() {
        expect_one(
            |c| c.listeners[1].tls = None,
            "listeners[1].tls",
            "required for https listeners",
        );
        expect_one(
            |c| c.listeners[1].tls.as_mut().unwrap().certificates.clear(),
            "listeners[1].tls.certificates",
            "at least one certificate is required",
        );
        expect_one(
            |c| c.listeners[0].tls = c.listeners[1].tls.clone(),
            "listeners[0].tls",
            "only allowed on https, tls and tls_passthrough listeners",
        );
        expect_ok(|c| c.listeners[3].tls = c.listeners[1].tls.clone());
        expect_one(
            |c| {
                let tls = c.listeners[1].tls.as_mut().unwrap();
                tls.certificates[0].hostnames[1] = "Example.COM".into();
            },
            "listeners[1].tls.certificates[0].hostnames[1]",
            "invalid hostname \"Example.COM\": must be lower-case",
        );
    }

    #[test]
    fn listener_pem_content() {
        fn cert0(c: &mut Config) -> &mut Certificate {
            &mut c.listeners[1].tls.as_mut().unwrap().certificates[0]
        }
        expect_one(
            |c| cert0(c).cert = PemSource::Pem("not pem".into()),
            "listeners[1].tls.certificates[0].cert",
            "no \"-----BEGIN CERTIFICATE-----\" PEM block found",
        );
        expect_one(
            |c| cert0(c).key = PemSource::Pem(CERT.into()),
            "listeners[1].tls.certificates[0].key",
            "PRIVATE KEY-----\" PEM block found",
        );
        expect_one(
            |c| {
                cert0(c).key = PemSource::Pem(
                    "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAA\n-----END ENCRYPTED PRIVATE KEY-----"
                        .into(),
                )
            },
            "listeners[1].tls.certificates[0].key",
            "encrypted private keys are not supported",
        );
        expect_one(
            |c| cert0(c).cert = PemSource::Pem("-----BEGIN CERTIFICATE-----\nMIIB\n".into()),
            "listeners[1].tls.certificates[0].cert",
            "PEM block CERTIFICATE has no END line",
        );
        expect_one(
            |c| cert0(c).cert = PemSource::File(PathBuf::new()),
            "listeners[1].tls.certificates[0].cert",
            "file path must not be empty",
        );
        expect_ok(|c| {
            cert0(c).key = PemSource::Pem(
                "-----BEGIN RSA PRIVATE KEY-----\nAA\n-----END RSA PRIVATE KEY-----\n".into(),
            )
        });
        expect_ok(|c| {
            cert0(c).key = PemSource::Pem(
                "-----BEGIN EC PRIVATE KEY-----\nAA\n-----END EC PRIVATE KEY-----\n".into(),
            )
        });
    }

    #[test]
    fn listener_limits_and_l4_routes() {
        expect_one(
            |c| c.listeners[0].max_requests_in_flight = Some(0),
            "listeners[0].max_requests_in_flight",
            "must be greater than 0",
        );
        expect_one(
            |c| c.listeners[0].advertised_port = Some(0),
            "listeners[0].advertised_port",
            "between 1 and 65535",
        );
        expect_ok(|c| c.listeners[0].advertised_port = Some(443));
        expect_one(
            |c| c.listeners[0].l4_routes = c.listeners[2].l4_routes.clone(),
            "listeners[0].l4_routes",
            "only allowed on tcp, udp, tls_passthrough, tls and https listeners",
        );
        // No route: valid (connections are accepted and closed, datagrams dropped).
        expect_ok(|c| c.listeners[2].l4_routes.clear());
        expect_one(
            |c| c.listeners[3].l4_routes[0].backends[0].backend = "nope".into(),
            "listeners[3].l4_routes[0].backends[0].backend",
            "unknown backend \"nope\"",
        );
        expect_one(
            |c| c.listeners[3].l4_routes[0].backends.clear(),
            "listeners[3].l4_routes[0].backends",
            "at least one backend is required",
        );
        expect_one(
            |c| c.listeners[2].l4_routes[0].hostnames = vec!["a.test".into()],
            "listeners[2].l4_routes[0].hostnames",
            "only allowed on tls_passthrough, tls and https listeners",
        );
        // An https listener's passthrough hosts: named (exact or wildcard), never terminated.
        expect_ok(|c| {
            let mut r = c.listeners[3].l4_routes[0].clone();
            r.hostnames = vec!["db.example.com".into(), "*.db.example.com".into()];
            c.listeners[1].l4_routes = vec![r];
        });
        expect_one(
            |c| {
                let mut r = c.listeners[3].l4_routes[0].clone();
                r.hostnames.clear();
                c.listeners[1].l4_routes = vec![r];
            },
            "listeners[1].l4_routes[0].hostnames",
            "at least one hostname is required on an https listener's passthrough route",
        );
        expect_one(
            |c| {
                let mut r = c.listeners[3].l4_routes[0].clone();
                r.terminate = true;
                c.listeners[1].l4_routes = vec![r];
            },
            "listeners[1].l4_routes[0].terminate",
            "only allowed on tls listeners",
        );
        expect_one(
            |c| {
                c.listeners[3].l4_routes[0]
                    .hostnames
                    .push("db.example.com".into())
            },
            "listeners[3].l4_routes[0].hostnames[1]",
            "duplicate hostname",
        );
        expect_one(
            |c| c.listeners[3].l4_routes[0].name.clear(),
            "listeners[3].l4_routes[0].name",
            "must not be empty",
        );
        expect_one(
            |c| {
                c.listeners[3].l4_routes[0].backends[0].filters =
                    vec![Filter::RequestHeaders(HeaderModifier::default())]
            },
            "listeners[3].l4_routes[0].backends[0].filters",
            "not allowed on l4 routes",
        );
        // Terminating routes: only on `tls` listeners, which then need certificates.
        expect_one(
            |c| c.listeners[3].l4_routes[0].terminate = true,
            "listeners[3].l4_routes[0].terminate",
            "only allowed on tls listeners",
        );
        expect_one(
            |c| {
                c.listeners[3].protocol = ListenerProtocol::Tls;
                c.listeners[3].l4_routes[0].terminate = true;
            },
            "listeners[3].tls",
            "required on a tls listener with terminating routes",
        );
        expect_ok(|c| c.listeners[3].protocol = ListenerProtocol::Tls);
        expect_ok(|c| {
            let tls = c.listeners[1].tls.clone();
            let l = &mut c.listeners[3];
            l.protocol = ListenerProtocol::Tls;
            l.tls = tls;
            let mut plain = l.l4_routes[0].clone();
            plain.name = "plain".into();
            plain.hostnames = vec!["app.example.com".into()];
            plain.terminate = true;
            l.l4_routes.push(plain);
        });
    }

    // ------------------------------------------------------------ admin

    #[test]
    fn admin_rules() {
        expect_one(
            |c| c.admin.as_mut().unwrap().address = "127.0.0.300".into(),
            "admin.address",
            "invalid IP address",
        );
        expect_one(
            |c| c.admin.as_mut().unwrap().port = 8080,
            "admin.port",
            "tcp port 8080 on 127.0.0.1 is already bound by listeners[0] (\"http\")",
        );
        expect_ok(|c| c.admin.as_mut().unwrap().port = 0);
        // The UDP-only listener does not take the TCP port.
        expect_ok(|c| c.admin.as_mut().unwrap().port = 5353);
        expect_ok(|c| c.admin = None);
    }

    // ------------------------------------------------------------ virtual hosts

    #[test]
    fn virtual_host_names_and_listeners() {
        expect_one(
            |c| c.virtual_hosts[0].name.clear(),
            "virtual_hosts[0].name",
            "must not be empty",
        );
        expect_one(
            |c| {
                let mut vh = c.virtual_hosts[0].clone();
                vh.hostnames = vec!["other.test".into()];
                c.virtual_hosts.push(vh);
            },
            "virtual_hosts[1].name",
            "duplicate virtual host name \"site\" (first used by virtual_hosts[0])",
        );
        expect_one(
            |c| c.virtual_hosts[0].listeners.push("nope".into()),
            "virtual_hosts[0].listeners[2]",
            "unknown listener \"nope\"",
        );
        expect_one(
            |c| c.virtual_hosts[0].listeners[0] = "passthrough".into(),
            "virtual_hosts[0].listeners[0]",
            "is a tls_passthrough listener; virtual hosts need http or https",
        );
    }

    #[test]
    fn validate_trusting_skips_known_good_virtual_hosts_but_not_their_names() {
        let mut c = full();
        c.virtual_hosts[0].listeners.push("nope".into());
        let path_err = |r: Result<(), ValidationErrors>| {
            r.err()
                .map(|e| e.0.iter().map(|e| e.path.clone()).collect::<Vec<_>>())
        };
        // Trusted: the (broken) virtual host is not checked again; untrusted, it is.
        assert_eq!(path_err(c.validate_trusting_structure(&|_| true)), None);
        assert_eq!(
            path_err(c.validate_trusting_structure(&|_| false)),
            Some(vec!["virtual_hosts[0].listeners[2]".to_string()])
        );
        // A duplicate name is reported whether trusted or not.
        let mut d = full();
        let mut dup = d.virtual_hosts[0].clone();
        dup.hostnames = vec!["other.test".into()];
        d.virtual_hosts.push(dup);
        for trust in [true, false] {
            assert_eq!(
                path_err(d.validate_trusting_structure(&|_| trust)),
                Some(vec!["virtual_hosts[1].name".to_string()]),
                "trusted {trust}"
            );
        }
    }

    #[test]
    fn validate_patch_checks_only_the_changed_virtual_hosts_and_the_rest_on_request() {
        let mut c = full();
        let mut broken = c.virtual_hosts[0].clone();
        broken.hostnames = vec!["bad host".into()];
        broken.name = "other".into();
        c.virtual_hosts.push(broken);
        let last = c.virtual_hosts.len() - 1;
        let path_err = |r: Result<(), ValidationErrors>| r.err().map(|e| e.0[0].path.clone());
        // Not among the changed ones: not checked. Changed: reported at its position.
        assert_eq!(path_err(c.validate_patch_structure(&[0], false)), None);
        assert_eq!(
            path_err(c.validate_patch_structure(&[0, last], false)),
            Some(format!("virtual_hosts[{last}].hostnames[0]"))
        );
        // Same errors as a full validation for the checked virtual host.
        let full_errs = c.validate_structure().unwrap_err().0;
        let patch_errs = c.validate_patch_structure(&[last], true).unwrap_err().0;
        assert_eq!(patch_errs, full_errs);
        // The rest (settings, listeners, backends) only when asked.
        c.limits.max_connections = 0;
        assert_eq!(path_err(c.validate_patch_structure(&[], false)), None);
        assert_eq!(
            path_err(c.validate_patch_structure(&[], true)).as_deref(),
            Some("limits.max_connections")
        );
        // A changed virtual host without a name.
        let mut c = full();
        c.virtual_hosts[0].name = String::new();
        assert_eq!(
            path_err(c.validate_patch_structure(&[0], false)).as_deref(),
            Some("virtual_hosts[0].name")
        );
    }

    #[test]
    fn virtual_host_hostnames() {
        let cases = [
            ("Example.com", "must be lower-case"),
            ("example.com:8080", "must not include a port"),
            (
                "foo.*.example.com",
                "wildcard is only allowed as the whole first label",
            ),
            ("*example.com", "wildcard is only allowed"),
            ("10.0.0.1", "not an IP address"),
            ("exa_mple.com", "only a-z, 0-9"),
            ("-a.example.com", "must not start or end with \"-\""),
            ("example.com.", "empty label"),
            ("", "must not be empty"),
        ];
        for (name, msg) in cases {
            expect_one(
                |c| c.virtual_hosts[0].hostnames[1] = name.into(),
                "virtual_hosts[0].hostnames[1]",
                msg,
            );
        }
        expect_one(
            |c| c.virtual_hosts[0].hostnames.push("example.com".into()),
            "virtual_hosts[0].hostnames[2]",
            "duplicate hostname \"example.com\" (also at index 0)",
        );
        expect_ok(|c| c.virtual_hosts[0].hostnames = vec!["xn--bcher-kva.example".into()]);
    }

    // ------------------------------------------------------------ routes: matches

    #[test]
    fn route_matches() {
        expect_one(
            |c| route(c, 0).name.clear(),
            "virtual_hosts[0].routes[0].name",
            "must not be empty",
        );
        expect_one(
            |c| route(c, 0).matches[0].path = Some(PathMatch::Exact("healthz".into())),
            "virtual_hosts[0].routes[0].matches[0].path.exact",
            "must start with \"/\"",
        );
        expect_one(
            |c| route(c, 3).matches[0].path = Some(PathMatch::Prefix("old".into())),
            "virtual_hosts[0].routes[3].matches[0].path.prefix",
            "must start with \"/\"",
        );
        expect_one(
            |c| route(c, 2).matches[0].path = Some(PathMatch::Regex("^/assets/(".into())),
            "virtual_hosts[0].routes[2].matches[0].path.regex",
            "invalid regex: ",
        );
        expect_one(
            |c| route(c, 1).matches[0].headers[0].name = "x tenant".into(),
            "virtual_hosts[0].routes[1].matches[0].headers[0].name",
            "invalid header name \"x tenant\": not an HTTP token",
        );
        expect_one(
            |c| route(c, 1).matches[0].headers[0].value = "[a-".into(),
            "virtual_hosts[0].routes[1].matches[0].headers[0].value",
            "invalid regex",
        );
        let cookie = |name: &str, value: &str| {
            let (name, value) = (name.to_string(), value.to_string());
            move |c: &mut Config| {
                route(c, 1).matches[0].cookies = vec![crate::CookieMatch { name, value }]
            }
        };
        expect_ok(cookie("canary", "always"));
        expect_one(
            cookie("a b", "always"),
            "virtual_hosts[0].routes[1].matches[0].cookies[0].name",
            "invalid cookie name \"a b\": not an HTTP token",
        );
        // Separators, quotes, a second pair, CR/LF and empty: no client sends them as a value.
        for bad in ["", "a;b", "a b", "\"q\"", "a,b", "x\r\nSet-Cookie: y", "é"] {
            expect_one(
                cookie("canary", bad),
                "virtual_hosts[0].routes[1].matches[0].cookies[0].value",
                "invalid cookie value",
            );
        }
        // An exact header value is not a regex.
        expect_ok(|c| {
            let h = &mut route(c, 1).matches[0].headers[0];
            h.kind = MatchKind::Exact;
            h.value = "[a-".into();
        });
        expect_one(
            |c| {
                let q = &mut route(c, 1).matches[0].query[0];
                q.kind = MatchKind::Regex;
                q.value = "(?P<".into();
            },
            "virtual_hosts[0].routes[1].matches[0].query[0].value",
            "invalid regex",
        );
        expect_one(
            |c| route(c, 1).matches[0].query[0].name.clear(),
            "virtual_hosts[0].routes[1].matches[0].query[0].name",
            "must not be empty",
        );
        for method in ["get", "GE T", ""] {
            expect_one(
                |c| route(c, 0).matches[0].method = Some(method.into()),
                "virtual_hosts[0].routes[0].matches[0].method",
                "must be an upper-case HTTP token",
            );
        }
        expect_ok(|c| route(c, 0).matches[0].method = Some("PROPFIND".into()));
    }

    #[test]
    fn regex_error_is_one_line() {
        let c = {
            let mut c = full();
            route(&mut c, 2).matches[0].path = Some(PathMatch::Regex("a{2,1}".into()));
            c
        };
        let e = &c.validate_structure().unwrap_err().0[0];
        assert!(!e.message.contains('\n'), "{:?}", e.message);
        assert!(e.message.starts_with("invalid regex: "), "{:?}", e.message);
    }

    // ------------------------------------------------------------ routes: filters

    #[test]
    fn header_modifier_rules() {
        let p = "virtual_hosts[0].routes[1].filters[0].request_headers";
        expect_one(
            |c| route(c, 1).filters[0] = Filter::RequestHeaders(headers(&[("x:y", "1")], &[])),
            &format!("{p}.set[0].name"),
            "not an HTTP token",
        );
        expect_one(
            |c| {
                route(c, 1).filters[0] =
                    Filter::RequestHeaders(headers(&[("x-a", "1\r\nx-evil: 1")], &[]))
            },
            &format!("{p}.set[0].value"),
            "must not contain CR, LF or NUL",
        );
        expect_one(
            |c| {
                route(c, 1).filters[0] =
                    Filter::RequestHeaders(headers(&[("x-a", "1"), ("X-A", "2")], &[]))
            },
            &format!("{p}.set[1].name"),
            "header \"X-A\" is set more than once",
        );
        expect_one(
            |c| route(c, 1).filters[0] = Filter::RequestHeaders(headers(&[("x-a", "1")], &["X-a"])),
            &format!("{p}.remove[0]"),
            "header \"X-a\" is both set and removed",
        );
        expect_one(
            |c| {
                let mut hm = HeaderModifier::default();
                hm.add.push(HeaderValue {
                    name: String::new(),
                    value: "v".into(),
                });
                route(c, 1).filters[1] = Filter::ResponseHeaders(hm);
            },
            "virtual_hosts[0].routes[1].filters[1].response_headers.add[0].name",
            "header name must not be empty",
        );
        // Adding a header that is also set is allowed (set wins, add appends).
        expect_ok(|c| {
            let mut hm = headers(&[("x-a", "1")], &[]);
            hm.add = hm.set.clone();
            route(c, 1).filters[0] = Filter::RequestHeaders(hm);
        });
    }

    #[test]
    fn redirect_rules() {
        fn redirect(c: &mut Config) -> &mut Redirect {
            match &mut route(c, 3).filters[0] {
                Filter::Redirect(r) => r,
                other => panic!("not a redirect: {other:?}"),
            }
        }
        let p = "virtual_hosts[0].routes[3].filters[0].redirect";
        expect_one(
            |c| redirect(c).status = 300,
            &format!("{p}.status"),
            "must be 301, 302, 303, 307 or 308, got 300",
        );
        expect_one(
            |c| redirect(c).scheme = Some("ftp".into()),
            &format!("{p}.scheme"),
            "must be \"http\" or \"https\"",
        );
        expect_one(
            |c| redirect(c).port = Some(0),
            &format!("{p}.port"),
            "must not be 0",
        );
        expect_one(
            |c| redirect(c).host = Some("*.example.com".into()),
            &format!("{p}.host"),
            "wildcards are not allowed here",
        );
        expect_one(
            |c| redirect(c).path = Some(PathRewrite::Full("new".into())),
            &format!("{p}.path.full"),
            "must start with \"/\"",
        );
        expect_one(
            |c| route(c, 3).matches[0].path = Some(PathMatch::Exact("/old".into())),
            &format!("{p}.path.prefix"),
            "requires every match of the route to use a prefix path match, but matches[0]",
        );
        // A full path replacement works with any match.
        expect_ok(|c| {
            route(c, 3).matches[0].path = Some(PathMatch::Exact("/old".into()));
            redirect(c).path = Some(PathRewrite::Full("/new".into()));
        });
        // A match without a path is prefix "/", and so is a route without matches.
        expect_ok(|c| route(c, 3).matches[0].path = None);
        expect_ok(|c| route(c, 3).matches.clear());
    }

    #[test]
    fn rewrite_rules() {
        let p = "virtual_hosts[0].routes[1].filters[2].rewrite";
        expect_one(
            |c| {
                route(c, 1).matches.push(RouteMatch {
                    path: Some(PathMatch::Regex("^/x".into())),
                    ..RouteMatch::default()
                })
            },
            &format!("{p}.path.prefix"),
            "but matches[1] does not",
        );
        expect_one(
            |c| {
                route(c, 1).filters[2] = Filter::Rewrite(UrlRewrite {
                    host: Some("API.internal".into()),
                    path: None,
                })
            },
            &format!("{p}.host"),
            "must be lower-case",
        );
    }

    #[test]
    fn at_most_one_authentication_filter_of_each_kind() {
        // The dataplane compiles one filter of each kind per route: a second is refused
        // rather than silently left unchecked.
        let basic = Filter::BasicAuth(crate::htpasswd::BasicAuth {
            realm: "r".into(),
            users: Vec::new(),
            user_set: None,
        });
        let external =
            Filter::ExternalAuth(crate::ext_auth::ExternalAuth::new("http://auth.example/"));
        let (b, e) = (basic.clone(), external.clone());
        expect_ok(|c| route(c, 3).filters.extend([b, e]));
        let (b1, b2) = (basic.clone(), basic);
        expect_one(
            |c| route(c, 3).filters.extend([b1, b2]),
            "virtual_hosts[0].routes[3].filters[2]",
            "at most one basic_auth filter is allowed per route",
        );
        let (e1, e2) = (external.clone(), external);
        expect_one(
            |c| route(c, 3).filters.extend([e1, e2]),
            "virtual_hosts[0].routes[3].filters[2]",
            "at most one external_auth filter is allowed per route",
        );
    }

    #[test]
    fn basic_auth_user_sets_are_named_unique_valid_and_every_reference_resolves() {
        use crate::htpasswd::{BasicAuth, BasicAuthUser, UserSet};
        let alice = BasicAuthUser {
            name: "alice".into(),
            hash: "{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=".into(),
        };
        let set = |name: &str, users: Vec<BasicAuthUser>| UserSet {
            name: name.into(),
            users,
        };
        let by = |name: &str| {
            Filter::BasicAuth(BasicAuth {
                realm: "r".into(),
                users: Vec::new(),
                user_set: Some(name.into()),
            })
        };
        let (s, f) = (set("staff", vec![alice.clone()]), by("staff"));
        expect_ok(|c| {
            c.user_sets.push(s);
            route(c, 3).filters.push(f);
        });
        // A reference to a set the config lacks refuses the whole config.
        let (s, f) = (set("staff", vec![alice.clone()]), by("ops"));
        expect_one(
            |c| {
                c.user_sets.push(s);
                route(c, 3).filters.push(f);
            },
            "virtual_hosts[0].routes[3].filters[1].basic_auth.user_set",
            "unknown user set \"ops\"",
        );
        // Users and a set at once: which would count is unclear, so neither does.
        let s = set("staff", vec![alice.clone()]);
        let both = Filter::BasicAuth(BasicAuth {
            realm: "r".into(),
            users: vec![alice.clone()],
            user_set: Some("staff".into()),
        });
        expect_one(
            |c| {
                c.user_sets.push(s);
                route(c, 3).filters.push(both);
            },
            "virtual_hosts[0].routes[3].filters[1].basic_auth.users",
            "must be empty when user_set names the users",
        );
        // The sets themselves: a name, unique; entries checked as a filter's.
        let sets = vec![
            set("", vec![alice.clone()]),
            set("a", vec![alice.clone()]),
            set("a", vec![alice.clone()]),
            set(
                "b",
                vec![BasicAuthUser {
                    name: "bob".into(),
                    hash: "plain".into(),
                }],
            ),
        ];
        expect(
            |c| c.user_sets = sets,
            &[
                ("user_sets[0].name", "must not be empty"),
                (
                    "user_sets[2].name",
                    "duplicate user set name \"a\" (first used by user_sets[1])",
                ),
                ("user_sets[3].users[0]", ""),
            ],
        );
    }

    #[test]
    fn at_most_one_redirect_or_rewrite() {
        let redirect = Filter::Redirect(Redirect {
            status: 302,
            ..Redirect::default()
        });
        let rewrite = Filter::Rewrite(UrlRewrite::default());
        let r = redirect.clone();
        expect_one(
            |c| route(c, 3).filters.push(r),
            "virtual_hosts[0].routes[3].filters[1]",
            "at most one redirect filter is allowed per route",
        );
        let r = rewrite.clone();
        expect_one(
            |c| route(c, 1).filters.push(r),
            "virtual_hosts[0].routes[1].filters[5]",
            "at most one rewrite filter is allowed per route",
        );
        let r = rewrite.clone();
        expect_one(
            |c| route(c, 3).filters.push(r),
            "virtual_hosts[0].routes[3].filters[1]",
            "cannot have both a redirect and a rewrite filter",
        );
        expect_one(
            |c| route(c, 1).filters.push(redirect),
            "virtual_hosts[0].routes[1].filters[5]",
            "cannot have both a redirect and a rewrite filter",
        );
    }

    #[test]
    fn error_pages_rules() {
        let p = "virtual_hosts[0].routes[1].filters[3].error_pages";
        let pages = |backend: &str, codes: Vec<u16>| {
            Filter::ErrorPages(crate::ErrorPages {
                codes,
                backend: Some(backend.into()),
                ..Default::default()
            })
        };
        let ok = pages("shadow", vec![404, 503]);
        expect_ok(|c| route(c, 1).filters[3] = ok);
        let e = pages("nope", vec![404]);
        expect_one(
            |c| route(c, 1).filters[3] = e,
            &format!("{p}.backend"),
            "unknown backend \"nope\"",
        );
        let e = pages("shadow", vec![302]);
        expect_one(
            |c| route(c, 1).filters[3] = e,
            &format!("{p}.codes[0]"),
            "302 is not from 400 to 599",
        );
    }

    #[test]
    fn mirror_rules() {
        let p = "virtual_hosts[0].routes[1].filters[3].mirror";
        let mirror = |backend: &str, percent: f64| {
            Filter::Mirror(Mirror {
                backend: backend.into(),
                percent,
            })
        };
        let m = mirror("nope", 10.0);
        expect_one(
            |c| route(c, 1).filters[3] = m,
            &format!("{p}.backend"),
            "unknown backend \"nope\"",
        );
        for percent in [-1.0, 100.5, f64::NAN] {
            let m = mirror("shadow", percent);
            expect_one(
                |c| route(c, 1).filters[3] = m,
                &format!("{p}.percent"),
                "must be between 0 and 100",
            );
        }
        for percent in [0.0, 100.0] {
            let m = mirror("shadow", percent);
            expect_ok(|c| route(c, 1).filters[3] = m);
        }
    }

    #[test]
    fn cors_rules() {
        fn cors(c: &mut Config) -> &mut Cors {
            match &mut route(c, 1).filters[4] {
                Filter::Cors(cors) => cors,
                other => panic!("not cors: {other:?}"),
            }
        }
        let p = "virtual_hosts[0].routes[1].filters[4].cors";
        let bad = [
            ("example.com", "expected \"*\" or \"scheme://host[:port]\""),
            (
                "https://*.*.example.com",
                "at most one \"*\" is allowed in the host",
            ),
            ("https://example.com/path", "the host may only contain"),
            ("https://example.com:0", "invalid port"),
            ("https://", "missing host"),
            ("HTTPS://example.com", "invalid scheme"),
        ];
        for (origin, msg) in bad {
            expect_one(
                |c| cors(c).allow_origins[1] = origin.into(),
                &format!("{p}.allow_origins[1]"),
                msg,
            );
        }
        for origin in ["https://example.com:8443", "http://[::1]:3000", "app://*"] {
            expect_ok(|c| cors(c).allow_origins[1] = origin.into());
        }
        expect_ok(|c| cors(c).allow_origins[1] = "*".into());
        expect_ok(|c| {
            cors(c).allow_origins[1] = "*".into();
            cors(c).allow_credentials = false;
        });
        expect_one(
            |c| cors(c).allow_methods.push("GET POST".into()),
            &format!("{p}.allow_methods[2]"),
            "not an HTTP token",
        );
        expect_ok(|c| cors(c).expose_headers.push("*".into()));
        expect_one(
            |c| cors(c).expose_headers.push("x header".into()),
            &format!("{p}.expose_headers[1]"),
            "not an HTTP token",
        );
    }

    // ------------------------------------------------------------ routes: actions

    #[test]
    fn proxy_action_rules() {
        let p = "virtual_hosts[0].routes[1].action.proxy.backends";
        expect_one(
            |c| proxy(c).backends.clear(),
            p,
            "at least one backend is required",
        );
        expect_one(
            |c| proxy(c).backends[1].backend = "api-v3".into(),
            &format!("{p}[1].backend"),
            "unknown backend \"api-v3\"",
        );
        expect_one(
            |c| proxy(c).backends[0].weight = 1_000_001,
            &format!("{p}[0].weight"),
            "must be at most 1000000",
        );
        // Weight 0 disables a backend; allowed.
        expect_ok(|c| proxy(c).backends[0].weight = 0);
        expect_one(
            |c| {
                proxy(c).backends[1]
                    .filters
                    .push(Filter::Redirect(Redirect {
                        status: 301,
                        ..Redirect::default()
                    }))
            },
            &format!("{p}[1].filters[1]"),
            "only request_headers and response_headers filters are allowed per backend",
        );
        expect_one(
            |c| {
                proxy(c).backends[1].filters[0] =
                    Filter::ResponseHeaders(headers(&[("bad name", "x")], &[]))
            },
            &format!("{p}[1].filters[0].response_headers.set[0].name"),
            "not an HTTP token",
        );
    }

    #[test]
    fn fixed_action_rules() {
        for status in [99, 600] {
            expect_one(
                |c| {
                    route(c, 0).action = Action::Fixed(FixedResponse {
                        status,
                        body: String::new(),
                        content_type: None,
                    })
                },
                "virtual_hosts[0].routes[0].action.fixed.status",
                "must be in 100..=599",
            );
        }
    }

    #[test]
    fn static_action_rules() {
        let p = "virtual_hosts[0].routes[2].action.static";
        expect_one(
            |c| static_site(c).root = PathBuf::new(),
            &format!("{p}.root"),
            "must not be empty",
        );
        expect_one(
            |c| static_site(c).index.push("docs/index.html".into()),
            &format!("{p}.index[1]"),
            "a plain file name, no \"/\"",
        );
        expect_one(
            |c| static_site(c).try_files.push("index.html".into()),
            &format!("{p}.try_files[3]"),
            "must start with \"/\" or \"$uri\"",
        );
        expect_one(
            |c| static_site(c).strip_prefix = Some("assets".into()),
            &format!("{p}.strip_prefix"),
            "must start with \"/\"",
        );
        expect_one(
            |c| static_site(c).cache_control = Some("public\r\nx: y".into()),
            &format!("{p}.cache_control"),
            "control characters",
        );
    }

    // ------------------------------------------------------------ routes: timeouts, retry

    #[test]
    fn timeout_and_retry_rules() {
        let p = "virtual_hosts[0].routes[1]";
        expect_one(
            |c| route(c, 1).timeouts.request = Some(Duration::from_millis(0)),
            &format!("{p}.timeouts.request"),
            "must be greater than 0",
        );
        expect_one(
            |c| route(c, 1).timeouts.backend = Some(Duration::from_millis(0)),
            &format!("{p}.timeouts.backend"),
            "must be greater than 0",
        );
        expect_one(
            |c| route(c, 1).timeouts.backend = Some(Duration::from_secs(60)),
            &format!("{p}.timeouts.backend"),
            "backend timeout 1m exceeds the request timeout 30s",
        );
        expect_ok(|c| route(c, 1).timeouts.request = None);
        type Field = fn(&mut crate::Timeouts) -> &mut Option<Duration>;
        let idle: [(&str, Field); 3] = [
            ("connect", |t| &mut t.connect),
            ("read_idle", |t| &mut t.read_idle),
            ("send_idle", |t| &mut t.send_idle),
        ];
        for (name, field) in idle {
            for (bad, got) in [
                (Duration::from_millis(0), "0ms"),
                (Duration::from_secs(86_401), "86401s"),
            ] {
                expect_one(
                    |c| *field(&mut route(c, 1).timeouts) = Some(bad),
                    &format!("{p}.timeouts.{name}"),
                    &format!("must be greater than 0 and at most 24h, got {got}"),
                );
            }
            // Longer than the request timeout is fine: they are idle clocks, not deadlines.
            expect_ok(|c| *field(&mut route(c, 1).timeouts) = Some(Duration::from_secs(86_400)));
        }
        expect_one(
            |c| route(c, 1).retry.as_mut().unwrap().attempts = 11,
            &format!("{p}.retry.attempts"),
            "must be at most 10, got 11",
        );
        expect_one(
            |c| {
                route(c, 1).retry = Some(RetryPolicy {
                    attempts: 1,
                    codes: vec![503, 200],
                    backoff: None,
                    budget: None,
                })
            },
            &format!("{p}.retry.codes[1]"),
            "must be in 400..=599, got 200",
        );
        expect_one(
            |c| route(c, 1).retry.as_mut().unwrap().budget = Some(Duration::from_millis(0)),
            &format!("{p}.retry.budget"),
            "must be greater than 0 (omit it for no limit; attempts: 0 for no retry)",
        );
        expect_ok(|c| route(c, 1).retry.as_mut().unwrap().budget = Some(Duration::from_millis(1)));
    }

    // ------------------------------------------------------------ backends

    #[test]
    fn backend_names() {
        expect(
            |c| c.backends[4].name.clear(),
            &[
                (
                    "listeners[3].l4_routes[0].backends[0].backend",
                    "unknown backend \"db\"",
                ),
                ("backends[4].name", "must not be empty"),
            ],
        );
        expect_one(
            |c| {
                let b = c.backends[0].clone();
                c.backends.push(b);
            },
            "backends[5].name",
            "duplicate backend name \"api-v1\" (first used by backends[0])",
        );
    }

    #[test]
    fn backend_endpoints() {
        let bad = [
            ("10.0.0.1", "expected \"host:port\""),
            ("::1:80", "IPv6 addresses must be in brackets"),
            ("[::1]:0", "port must not be 0"),
            ("[::1]", "expected \"[ipv6]:port\""),
            ("[fd00::zz]:80", "invalid IPv6 address"),
            ("10.0.0.1:http", "invalid port"),
            ("10.0.0.1:65536", "invalid port"),
            ("bad_host:80", "neither an IP address nor a valid DNS name"),
        ];
        for (address, msg) in bad {
            expect_one(
                |c| c.backends[0].endpoints[0].address = address.into(),
                "backends[0].endpoints[0].address",
                msg,
            );
        }
        for address in ["[::1]:80", "svc.ns.svc.cluster.local:8080", "127.0.0.1:1"] {
            expect_ok(|c| c.backends[0].endpoints[0].address = address.into());
        }
        for weight in [0, 1_000_001] {
            expect_one(
                |c| {
                    c.backends[0].endpoints[1] = Endpoint {
                        address: "10.0.0.2:8080".into(),
                        weight,
                    }
                },
                "backends[0].endpoints[1].weight",
                "must be in 1..=1000000",
            );
        }
    }

    #[test]
    fn backend_tls_rules() {
        expect_one(
            |c| c.backends[0].tls = Some(BackendTls::default()),
            "backends[0].tls",
            "only allowed with the https or h2 protocol",
        );
        expect_ok(|c| {
            c.backends[0].protocol = BackendProtocol::Https;
            c.backends[0].tls = Some(BackendTls::default());
        });
        expect_one(
            |c| c.backends[1].tls.as_mut().unwrap().client_key = None,
            "backends[1].tls.client_key",
            "required when client_cert is set",
        );
        expect_one(
            |c| c.backends[1].tls.as_mut().unwrap().client_cert = None,
            "backends[1].tls.client_cert",
            "required when client_key is set",
        );
        expect_one(
            |c| c.backends[1].tls.as_mut().unwrap().client_key = Some(PemSource::Pem(CERT.into())),
            "backends[1].tls.client_key",
            "PRIVATE KEY-----\" PEM block found",
        );
        expect_one(
            |c| c.backends[1].tls.as_mut().unwrap().ca = Some(PemSource::Pem(KEY.into())),
            "backends[1].tls.ca",
            "no \"-----BEGIN CERTIFICATE-----\"",
        );
        expect_one(
            |c| c.backends[1].tls.as_mut().unwrap().sni = Some("api internal".into()),
            "backends[1].tls.sni",
            "invalid hostname",
        );
        expect_one(
            |c| c.backends[1].tls.as_mut().unwrap().subject_alt_names[0] = "A.b".into(),
            "backends[1].tls.subject_alt_names[0]",
            "must be lower-case",
        );
        expect_ok(|c| c.backends[1].tls.as_mut().unwrap().verify_depth = Some(MAX_VERIFY_DEPTH));
        for bad in [0, MAX_VERIFY_DEPTH + 1] {
            expect_one(
                |c| c.backends[1].tls.as_mut().unwrap().verify_depth = Some(bad),
                "backends[1].tls.verify_depth",
                "must be between 1 and 8",
            );
        }
        expect_one(
            |c| {
                let t = c.backends[1].tls.as_mut().unwrap();
                t.verify_depth = Some(1);
                t.ca = None;
                t.subject_alt_names.clear();
            },
            "backends[1].tls.verify_depth",
            "requires ca or well_known_ca",
        );
    }

    #[test]
    fn backend_timeouts_and_outlier() {
        expect_one(
            |c| c.backends[0].connect_timeout = Duration::from_millis(0),
            "backends[0].connect_timeout",
            "must be greater than 0",
        );
        expect_one(
            |c| c.backends[0].outlier.max_ejection_percent = 101,
            "backends[0].outlier.max_ejection_percent",
            "must be at most 100, got 101",
        );
        expect_one(
            |c| c.backends[0].outlier.base_ejection_time = Duration::from_millis(0),
            "backends[0].outlier.base_ejection_time",
            "must be greater than 0 when outlier detection is on",
        );
        expect_ok(|c| {
            c.backends[0].outlier.consecutive_failures = 0;
            c.backends[0].outlier.base_ejection_time = Duration::from_millis(0);
        });
    }

    // ------------------------------------------------------------ limits, access log

    #[test]
    fn limits_counts_and_timeouts_must_be_positive() {
        type Edit = fn(&mut Limits);
        let cases: [(&str, Edit); 11] = [
            ("max_connections", |l| l.max_connections = 0),
            ("max_requests_in_flight", |l| l.max_requests_in_flight = 0),
            ("queue_timeout", |l| {
                l.queue_timeout = Duration::from_millis(0)
            }),
            ("retry_after_seconds", |l| l.retry_after_seconds = 0),
            ("max_concurrent_streams", |l| l.max_concurrent_streams = 0),
            ("max_pending_reset_streams", |l| {
                l.max_pending_reset_streams = 0
            }),
            ("header_read_timeout", |l| {
                l.header_read_timeout = Duration::from_millis(0)
            }),
            ("body_idle_timeout", |l| {
                l.body_idle_timeout = Duration::from_millis(0)
            }),
            ("idle_timeout", |l| {
                l.idle_timeout = Duration::from_millis(0)
            }),
            ("max_request_body_bytes", |l| l.max_request_body_bytes = 0),
            ("drain_timeout", |l| {
                l.drain_timeout = Duration::from_millis(0)
            }),
        ];
        for (field, edit) in cases {
            expect_one(
                |c| edit(&mut c.limits),
                &format!("limits.{field}"),
                "must be greater than 0",
            );
        }
        expect_one(
            |c| c.limits.max_header_bytes = 1023,
            "limits.max_header_bytes",
            "must be at least 1024, got 1023",
        );
        expect_ok(|c| c.limits.max_header_bytes = 1024);
        expect_one(
            |c| c.limits.static_read_ahead = 16383,
            "limits.static_read_ahead",
            "must be between 16384 and 16777216, got 16383",
        );
        expect_ok(|c| c.limits.static_read_ahead = 16384);
        expect_one(
            |c| c.limits.static_read_ahead = 16 * 1024 * 1024 + 1,
            "limits.static_read_ahead",
            "must be between 16384 and 16777216, got 16777217",
        );
        expect_one(
            |c| c.limits.static_read_ahead_total = 16383,
            "limits.static_read_ahead_total",
            "must be between 16384 and 17179869184, got 16383",
        );
        expect_ok(|c| c.limits.static_read_ahead_total = 16384);
        expect_ok(|c| c.limits.static_read_ahead_total = 16 << 30);
        expect_one(
            |c| c.limits.static_read_ahead_total = (16 << 30) + 1,
            "limits.static_read_ahead_total",
            "must be between 16384 and 17179869184, got 17179869185",
        );
        expect_one(
            |c| c.limits.proxy_read_ahead = 8191,
            "limits.proxy_read_ahead",
            "must be between 8192 and 16777216, got 8191",
        );
        expect_ok(|c| c.limits.proxy_read_ahead = 8192);
        expect_ok(|c| c.limits.proxy_read_ahead = 16 * 1024 * 1024);
        expect_one(
            |c| c.limits.http2_write_buffer = 16383,
            "limits.http2_write_buffer",
            "must be between 16384 and 1048576, got 16383",
        );
        expect_ok(|c| c.limits.http2_write_buffer = 16384);
        expect_one(
            |c| c.limits.http2_write_buffer = 1024 * 1024 + 1,
            "limits.http2_write_buffer",
            "must be between 16384 and 1048576, got 1048577",
        );
        expect_one(
            |c| c.limits.proxy_read_ahead = u32::MAX,
            "limits.proxy_read_ahead",
            "must be between 8192 and 16777216, got 4294967295",
        );
    }

    #[test]
    fn http3_settings_rules() {
        expect_one(
            |c| c.http3.max_concurrent_bidi_streams = 0,
            "http3.max_concurrent_bidi_streams",
            "must be greater than 0",
        );
        expect_one(
            |c| c.http3.send_window = 100,
            "http3.send_window",
            "must be at least 16384, got 100",
        );
        expect_ok(|c| c.http3.send_window = 16 * 1024 * 1024);
        expect_one(
            |c| c.http3.send_window = 16 * 1024 * 1024 + 1,
            "http3.send_window",
            "must be between 16384 and 16777216, got 16777217",
        );
        expect_one(
            |c| c.http3.send_window = u32::MAX,
            "http3.send_window",
            "must be between 16384 and 16777216, got 4294967295",
        );
        expect_one(
            |c| c.http3.send_budget = 16383,
            "http3.send_budget",
            "must be at least 16384, got 16383",
        );
        expect_one(
            |c| c.http3.connection_receive_window = 64 * 1024,
            "http3.connection_receive_window",
            "must be at least stream_receive_window (262144), got 65536",
        );
        expect_one(
            |c| c.http3.alt_svc_max_age = Duration::from_millis(10),
            "http3.alt_svc_max_age",
            "must be at least 1s",
        );
        expect_one(
            |c| c.http3.initial_mtu = 1000,
            "http3.initial_mtu",
            "must be 1200-65527, got 1000",
        );
        expect_one(
            |c| c.http3.mtu_discovery_upper_bound = 1100,
            "http3.mtu_discovery_upper_bound",
            "must be between initial_mtu (1200) and 65527, got 1100",
        );
        expect_one(
            |c| c.http3.ack_eliciting_threshold = 0,
            "http3.ack_eliciting_threshold",
            "must be 1-1000, got 0",
        );
        expect_one(
            |c| c.http3.static_chunk_size = 1024,
            "http3.static_chunk_size",
            "must be 4096-131072, got 1024",
        );
        expect_ok(|c| {
            c.http3.congestion = Congestion::Bbr;
            c.http3.early_data = true;
            c.http3.initial_mtu = 9000;
            c.http3.mtu_discovery_upper_bound = 65527;
            c.http3.ack_eliciting_threshold = 9;
            c.http3.send_fairness = false;
            c.http3.static_chunk_size = 65536;
        });
        let cfg = Config::from_yaml(
            "http3: {congestion: new_reno, early_data: true, stream_receive_window: 65536}\n",
        )
        .unwrap();
        assert_eq!(cfg.http3.congestion, Congestion::NewReno);
        assert!(cfg.http3.early_data);
        assert_eq!(cfg.http3.stream_receive_window, 65536);
        assert_eq!(cfg.http3.max_concurrent_bidi_streams, 64);
    }

    #[test]
    fn access_log_rules() {
        expect_one(
            |c| c.access_log.buffer_lines = 0,
            "access_log.buffer_lines",
            "must be greater than 0",
        );
        expect_one(
            |c| c.access_log.path = Some(PathBuf::new()),
            "access_log.path",
            "must not be empty when set",
        );
    }

    #[test]
    fn tracing_rules() {
        let with = |f: fn(&mut crate::Tracing)| {
            move |c: &mut Config| {
                let mut t = crate::Tracing::to("http://127.0.0.1:4318/v1/traces");
                f(&mut t);
                c.tracing = Some(t);
            }
        };
        expect_ok(with(|_| {}));
        for (f, field, message) in [
            (
                (|t: &mut crate::Tracing| t.otlp_endpoint = "ftp://c:4318/v1/traces".into())
                    as fn(&mut crate::Tracing),
                "tracing.otlp_endpoint",
                "must be an http:// or https:// URL",
            ),
            (
                |t| {
                    t.otlp_protocol = crate::OtlpProtocol::Grpc;
                    t.otlp_endpoint = "grpc://c:4317".into();
                },
                "tracing.otlp_endpoint",
                "must be an http:// or https:// URL",
            ),
            (
                |t| {
                    t.otlp_protocol = crate::OtlpProtocol::Grpc;
                    t.otlp_endpoint = "c:4317".into();
                },
                "tracing.otlp_endpoint",
                "must be an http:// or https:// URL",
            ),
            (
                |t| {
                    t.otlp_protocol = crate::OtlpProtocol::Grpc;
                    t.otlp_endpoint = "http://c:4317/v1/traces".into();
                },
                "tracing.otlp_endpoint",
                "a grpc endpoint is scheme://host[:port] without path or query",
            ),
            (
                |t| {
                    t.otlp_protocol = crate::OtlpProtocol::Grpc;
                    t.otlp_endpoint = "https://c:4317?x=1".into();
                },
                "tracing.otlp_endpoint",
                "a grpc endpoint is scheme://host[:port] without path or query",
            ),
            (
                |t| t.otlp_ca = Some(PemSource::Pem(CERT.into())),
                "tracing.otlp_ca",
                "needs an https:// otlp_endpoint",
            ),
            (
                |t| {
                    t.otlp_endpoint = "https://c:4318/v1/traces".into();
                    t.otlp_ca = Some(PemSource::Pem(KEY.into()));
                },
                "tracing.otlp_ca",
                "CERTIFICATE",
            ),
            (
                |t| {
                    t.otlp_endpoint = "https://c:4318/v1/traces".into();
                    t.otlp_ca = Some(PemSource::File(PathBuf::new()));
                },
                "tracing.otlp_ca",
                "file path must not be empty",
            ),
            (
                |t| {
                    t.otlp_endpoint = "https://c:4318/v1/traces".into();
                    t.otlp_client_cert = Some(PemSource::Pem(CERT.into()));
                },
                "tracing.otlp_client_key",
                "required with otlp_client_cert",
            ),
            (
                |t| {
                    t.otlp_endpoint = "https://c:4318/v1/traces".into();
                    t.otlp_client_cert = Some(PemSource::Pem(CERT.into()));
                    t.otlp_client_key = Some(PemSource::Pem(CERT.into()));
                },
                "tracing.otlp_client_key",
                "PRIVATE KEY",
            ),
            (
                |t| t.otlp_endpoint = "http://user@c:4318/".into(),
                "tracing.otlp_endpoint",
                "must not carry user information",
            ),
            (
                |t| t.otlp_endpoint = "http://c:0/".into(),
                "tracing.otlp_endpoint",
                "port must be 1 to 65535",
            ),
            (
                |t| t.otlp_endpoint = "http:///v1/traces".into(),
                "tracing.otlp_endpoint",
                "needs a host",
            ),
            (
                |t| t.otlp_endpoint = "http://c:4318/a b".into(),
                "tracing.otlp_endpoint",
                "must be printable ASCII without spaces, at most 2048 bytes",
            ),
            (
                |t| t.sampling_ratio = 1.5,
                "tracing.sampling_ratio",
                "must be between 0 and 1",
            ),
            (
                |t| t.sampling_ratio = f64::NAN,
                "tracing.sampling_ratio",
                "must be between 0 and 1",
            ),
            (
                |t| t.service_name = String::new(),
                "tracing.service_name",
                "must be 1 to 255 printable ASCII characters",
            ),
            (
                |t| t.max_queue_spans = 0,
                "tracing.max_queue_spans",
                "must be between 1 and 1000000",
            ),
            (
                |t| t.max_batch_spans = 100_000,
                "tracing.max_batch_spans",
                "must be between 1 and 8192",
            ),
            (
                |t| t.export_timeout = crate::Duration::from_secs(0),
                "tracing.export_timeout",
                "must be greater than 0 and at most 60s",
            ),
            (
                |t| t.batch_delay = crate::Duration::from_secs(3600),
                "tracing.batch_delay",
                "must be greater than 0 and at most 60s",
            ),
        ] {
            expect_one(with(f), field, message);
        }
    }

    #[test]
    fn otlp_endpoints_that_parse() {
        use crate::OtlpProtocol::{Grpc, HttpProtobuf};
        for e in [
            "http://127.0.0.1:4318/v1/traces",
            "http://otel-collector.observability:4318/v1/traces",
            "https://otel-collector.observability:4318/v1/traces",
            "http://[::1]:4318/v1/traces",
            "http://collector",
            "http://[::1]/v1/traces",
        ] {
            assert_eq!(check_otlp_endpoint(e, HttpProtobuf), Ok(()), "{e}");
        }
        for e in [
            "http://otel-collector.observability:4317",
            "https://otel-collector.observability:4317/",
            "http://[::1]:4317",
            "https://collector",
        ] {
            assert_eq!(check_otlp_endpoint(e, Grpc), Ok(()), "{e}");
        }
    }

    #[test]
    fn otlp_tls_material_passes_and_an_unreadable_ca_file_is_refused() {
        let tls = |ca: PemSource| {
            move |c: &mut Config| {
                let mut t = crate::Tracing::to("https://collector.obs:4317");
                t.otlp_protocol = crate::OtlpProtocol::Grpc;
                t.otlp_ca = Some(ca);
                t.otlp_client_cert = Some(PemSource::Pem(CERT.into()));
                t.otlp_client_key = Some(PemSource::Pem(KEY.into()));
                c.tracing = Some(t);
            }
        };
        expect_ok(tls(PemSource::Pem(CERT.into())));
        // A CA file that is not there: structure passes, the file check does not.
        let missing = PathBuf::from("/nonexistent/sweety-config-test/otlp-ca.crt");
        let mut c = Config::default();
        tls(PemSource::File(missing.clone()))(&mut c);
        c.validate_structure().unwrap();
        let errors = c.validate().unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, "tracing.otlp_ca");
        assert_eq!(
            errors[0].message,
            format!("file not found: {}", missing.display())
        );
        // A directory is unreadable as a file.
        let dir = TempDir::new("otlp-ca");
        let mut c = Config::default();
        tls(PemSource::File(dir.0.clone()))(&mut c);
        let errors = c.validate().unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, "tracing.otlp_ca");
        assert!(errors[0].message.starts_with("cannot read "), "{errors:?}");
        // A readable CA file passes.
        std::fs::write(dir.0.join("ca.crt"), CERT).unwrap();
        let mut c = Config::default();
        tls(PemSource::File(dir.0.join("ca.crt")))(&mut c);
        c.validate().unwrap();
    }

    // ------------------------------------------------------------ filesystem

    #[test]
    fn file_checks() {
        let dir = TempDir::new("files");
        let cert_path = "listeners[1].tls.certificates[1].cert";
        let root_path = "virtual_hosts[0].routes[2].action.static.root";

        // A PEM file without the expected block.
        std::fs::write(dir.0.join("other.crt"), "hello").unwrap();
        let errors = dir.config().validate().unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, cert_path);
        assert!(errors[0]
            .message
            .ends_with("other.crt: no \"-----BEGIN CERTIFICATE-----\" PEM block found"));

        // Missing file.
        std::fs::remove_file(dir.0.join("other.crt")).unwrap();
        let errors = dir.config().validate().unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, cert_path);
        assert!(errors[0].message.starts_with("file not found: "));
        std::fs::write(dir.0.join("other.crt"), CERT).unwrap();

        // Static root that is a file, then missing.
        std::fs::remove_dir(dir.0.join("www")).unwrap();
        std::fs::write(dir.0.join("www"), "x").unwrap();
        let errors = dir.config().validate().unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, root_path);
        assert!(errors[0].message.ends_with("www is not a directory"));
        std::fs::remove_file(dir.0.join("www")).unwrap();
        let errors = dir.config().validate().unwrap_err().0;
        assert_eq!(errors[0].path, root_path);
        assert!(errors[0].message.starts_with("directory not found: "));

        // A cert path that is a directory cannot be read.
        let mut c = dir.config();
        c.listeners[1].tls.as_mut().unwrap().certificates[1].cert = PemSource::File(dir.0.clone());
        std::fs::create_dir(dir.0.join("www")).unwrap();
        let errors = c.validate().unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, cert_path);
        assert!(
            errors[0].message.starts_with("cannot read "),
            "{}",
            errors[0].message
        );
    }

    // ------------------------------------------------------------ helpers

    #[test]
    fn overlap_rules() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(overlaps(ip("0.0.0.0"), ip("10.0.0.1")));
        assert!(overlaps(ip("10.0.0.1"), ip("0.0.0.0")));
        assert!(overlaps(ip("::"), ip("10.0.0.1")));
        assert!(overlaps(ip("::1"), ip("::")));
        assert!(overlaps(ip("::"), ip("0.0.0.0")));
        assert!(!overlaps(ip("0.0.0.0"), ip("::1")));
        assert!(!overlaps(ip("10.0.0.1"), ip("10.0.0.2")));
    }

    // ------------------------------------------------------------ content filters (compress, cache, grpc)

    #[test]
    fn edge_filters_and_cache_bounds_report_paths() {
        use crate::{CachePolicy, Compression, CompressionAlgorithm, GrpcOptions};
        expect_ok(|c| {
            route(c, 1)
                .filters
                .push(Filter::Compress(Compression::default()));
            route(c, 1).filters.push(Filter::Cache(CachePolicy {
                ttl: Some(Duration::from_secs(5)),
                key_headers: vec!["x-tenant".into()],
                stale_while_revalidate: None,
                with_credentials: false,
            }));
            route(c, 1)
                .filters
                .push(Filter::Grpc(GrpcOptions { web: true }));
        });
        expect(
            |c| {
                route(c, 1).filters = vec![
                    Filter::Compress(Compression {
                        algorithms: vec![CompressionAlgorithm::Gzip, CompressionAlgorithm::Gzip],
                        mime_types: vec!["text/*".into(), "json".into()],
                        ..Compression::default()
                    }),
                    Filter::Cache(CachePolicy {
                        ttl: Some(Duration::from_millis(0)),
                        key_headers: vec!["bad header".into()],
                        stale_while_revalidate: None,
                        with_credentials: false,
                    }),
                ];
                c.limits.websocket_idle_timeout = Duration::from_millis(0);
                c.cache.max_entry_bytes = c.cache.max_bytes + 1;
            },
            &[
                (
                    "virtual_hosts[0].routes[1].filters[0].compress.algorithms[1]",
                    "\"gzip\" is listed more than once",
                ),
                (
                    "virtual_hosts[0].routes[1].filters[0].compress.mime_types[1]",
                    "\"json\" is not a media type (type/subtype or type/*)",
                ),
                (
                    "virtual_hosts[0].routes[1].filters[1].cache.ttl",
                    "must be greater than 0 when set",
                ),
                (
                    "virtual_hosts[0].routes[1].filters[1].cache.key_headers[0]",
                    "invalid header name \"bad header\": not an HTTP token",
                ),
                ("limits.websocket_idle_timeout", "must be greater than 0"),
                (
                    "cache.max_entry_bytes",
                    "must be greater than 0 and at most cache.max_bytes",
                ),
            ],
        );
        // Per-backend filters stay header modifiers only.
        expect_one(
            |c| {
                proxy(c).backends[0]
                    .filters
                    .push(Filter::Compress(Compression::default()))
            },
            "virtual_hosts[0].routes[1].action.proxy.backends[0].filters[0]",
            "only request_headers and response_headers filters are allowed per backend",
        );
    }
}
