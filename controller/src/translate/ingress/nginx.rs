//! ingress-nginx migration: a safe subset of `nginx.ingress.kubernetes.io/*` annotations
//! mapped onto sweety-config.
//!
//! Supported: `use-regex` (case-insensitive, start-anchored regexes, nginx's `~*`
//! locations, [`anchor_regex`]), `rewrite-target` (a target without `$` on a prefix path: a
//! prefix rewrite, case-insensitive like its match in a regex host; capture groups `$1`…`$9`, the `<prefix>(/|$)(.*)` + `/$2` idiom included, a
//! regex rewrite of the whole path with the route's own case-insensitive regex, as nginx's
//! `rewrite` runs on the location's match; nginx variables are reported and the path is not
//! rewritten), `ssl-redirect` (HTTP→HTTPS, 308, for hosts with TLS; on unless
//! an Ingress sets it to `"false"` or the operator turns `Params::ssl_redirect` off, as in
//! ingress-nginx; paths under `Params::no_tls_redirect_locations` are never redirected),
//! `force-ssl-redirect` (also for hosts without TLS here),
//! `backend-protocol` (HTTP, HTTPS, GRPC→h2c, GRPCS→h2), `enable-cors` with `cors-allow-origin`,
//! `-methods`, `-headers`, `-credentials`, `-max-age`, `-expose-headers`,
//! `permanent-redirect`(`-code`), `temporal-redirect`, `app-root`,
//! `upstream-vhost` (the `Host` the backend receives: a rewrite host) and `x-forwarded-prefix`
//! (an `X-Forwarded-Prefix` request header), each refused with an `InvalidAnnotation` Event
//! when it is not a host name / a header value or uses an nginx variable, `server-alias`
//! (the first rule host's routes under more names) and `from-to-www-redirect` (308 between
//! `www.<host>` and `<host>`), both only for names no rule or site names and no other
//! namespace claimed first ([`extra_hosts`], weak claims of `ownership`), `proxy-read-timeout`,
//! `proxy-send-timeout` and `proxy-connect-timeout` (seconds, at most a day: the route's
//! `timeouts.read_idle`, `send_idle` and `connect`, nginx's idle clocks between two reads from
//! / writes to the backend and its connect timeout; unset ones stay unset), `canary` +
//! `canary-weight` (+ `canary-weight-total`): a weighted split with the primary Ingress's route
//! for the same host and path, and `canary-by-header` (`always`/`never`, or `-value`, or
//! `-pattern`) and `canary-by-cookie` (`always`/`never`): routes beside the primary's with one
//! more header match, header before cookie before weight ([`CanarySelect`]). `limit-rps` / `limit-rpm` (× `limit-burst-multiplier`, default
//! 5) become per-client-IP `rate_limit` filters whose zone is shared by the Ingress's paths
//! (refusals answer 503 as nginx, or the class's `limit-req-status-code`, [`ClassSettings`]),
//! `limit-connections` a per-client-IP `concurrency_limit` (requests in flight), all three
//! with `limit-whitelist` / `limit-allowlist` as their `exempt` networks (an entry that cannot
//! be parsed exempts no one, with an Event: not an access rule, nothing fails closed),
//! `whitelist-source-range` (or `allowlist-source-range`) and `denylist-source-range` an
//! `ip_access` filter (CIDRs with host bits are masked as nginx does, [`masked_cidr`]; an
//! entry that cannot be parsed fails closed, see below, and an allowlist left with no usable
//! entry answers 403 even when the operator ignores such entries). `affinity: cookie` (with
//! `session-cookie-name`, default `INGRESSCOOKIE`, `-path`, `-max-age`/`-expires`, `-secure`,
//! `-samesite`) becomes cookie session persistence, and `upstream-hash-by` (`$remote_addr`,
//! `$binary_remote_addr`, `$http_<header>`, `$cookie_<name>`) a ring hash, each on a variant
//! of the backend (named `<backend>~affinity…` / `~hash…`) so other Ingresses of the same
//! Service are unaffected.
//!
//! **Error pages.** `custom-http-errors` ([`sweety_config::error_pages::parse_codes`]: 400-599,
//! else `InvalidAnnotation` and ignored) and `default-backend` (a Service name of the Ingress's
//! own namespace, its first port as ingress-nginx) become an `error_pages` filter on every path
//! (`super::error_pages` resolves the Service; each path names its own Service and port in
//! `X-Service-Name` / `X-Service-Port`): the annotation's Service, else the controller's
//! default backend, else the dataplane's built-in page, serves the listed statuses, and the
//! annotation's Service also serves paths whose backends have no endpoint. A missing Service is
//! ignored with a `DefaultBackendNotFound` Event.
//!
//! **Basic authentication.** `auth-type: basic` with `auth-secret` (`name` or `namespace/name`,
//! the Ingress's own namespace only), `auth-secret-type` (`auth-file`: the htpasswd text under
//! the key `auth`, the default; `auth-map`: one user per key) and `auth-realm` becomes a
//! `basic_auth` filter on every path ([`sweety_config::htpasswd`]: bcrypt, `$apr1$`, `{SHA}`;
//! other entries are refused one by one with an `AuthEntryRefused` Event) naming the Secret's
//! users as one of the config's user sets ([`user_set_name`]: one per Secret and secret type,
//! however many Ingresses and paths read it). A missing Secret, another namespace's, a
//! missing `auth` key, an unknown `auth-type`/`auth-secret-type`, a realm with control
//! characters, too many users or no usable entry fails closed: every path answers 503 with
//! the reason (`AuthSecretInvalid`), as ingress-nginx denies such locations, whatever
//! `ignore_unsupported_security_annotations` says. `auth-type: digest` is not implemented
//! (503). `auth-secret`/`auth-realm` without `auth-type` are ignored, as in ingress-nginx.
//!
//! **External authentication.** `auth-url` (with `auth-method`, `auth-signin`,
//! `auth-signin-redirect-param`, `auth-response-headers`, `auth-request-redirect`,
//! `auth-always-set-cookie`) becomes an `external_auth` filter on every path
//! ([`sweety_config::ext_auth`]; the dataplane's `ext_auth` sends the subrequest) whose
//! addresses are restricted like an ExternalName's (`restrict_addresses`; an address literal
//! the policy refuses is refused here already). A URL or setting that cannot be honoured
//! (nginx variables in `auth-url` other than `$host`, which is the rule's host, an unknown variable in `auth-signin`, a framing header in
//! `auth-response-headers`, …) fails closed: every path answers 503 with the reason
//! (`AuthInvalid`), whatever `ignore_unsupported_security_annotations` says. The settings
//! without `auth-url` are ignored, as in ingress-nginx; `auth-cache-*` and `auth-keepalive*`
//! are ignored (every request is asked; connections are kept alive anyway);
//! `auth-proxy-set-headers` is refused (403) and `auth-snippet` refuses the Ingress (503).
//!
//! **Client certificates.** `auth-tls-secret` (`name` or `namespace/name`, the Ingress's own
//! namespace only; its `ca.crt`) with `auth-tls-verify-client` (`on`, `optional`,
//! `optional_no_ca`; `off` asks for nothing), `auth-tls-verify-depth`,
//! `auth-tls-pass-certificate-to-upstream`, `auth-tls-error-page` and `auth-tls-match-cn` become
//! a `host_client_auth` entry of the `ingress-https` listener for each host of the Ingress
//! ([`client_tls`]; the dataplane's `client_cert` asks for the certificate when the SNI is the
//! host and checks every request for the host). A missing Secret, another namespace's, a
//! `ca.crt` that is not usable CA PEM, an unknown `auth-tls-verify-client` or a bad
//! `auth-tls-match-cn` fails closed (503, `AuthTLSInvalid`); so does a protected host without
//! TLS here, and the Ingress's rules without a host. The settings without `auth-tls-secret` are
//! ignored, as in ingress-nginx.
//!
//! **SSL passthrough.** `ssl-passthrough: "true"` is read only on a class whose
//! SweetyProxyConfig sets `ingress.sslPassthrough` ([`ClassSettings::ssl_passthrough`],
//! ingress-nginx's `--enable-ssl-passthrough`); elsewhere (or unreadable) the Ingress is refused,
//! 403 (`SSLPassthroughNotEnabled`). The translator (`super::translate`) passes the TLS of the
//! rule hosts through to each rule's `/` Service and reports the rest as ignored.
//!
//! **Fail closed.** Security annotations Sweety does not implement (`auth-*`, `modsecurity`,
//! `satisfy`, …; [`is_security`]) and allow/deny list entries that cannot be honoured make
//! every path of the Ingress answer 403 with a body naming them
//! (`UnsupportedSecurityAnnotation` / `InvalidAnnotation`), unless
//! `Params::ignore_unsupported_security_annotations`. A `*-snippet` annotation (raw nginx
//! configuration, never run) refuses the whole Ingress: 503 (`SnippetRefused`), unless
//! `Params::ignore_snippets` (`SnippetIgnored`). `proxy-body-size` ([`nginx_size`]; `0`: no
//! limit) becomes the route's `max_request_body_bytes`, `service-upstream` a backend whose
//! one endpoint is the Service's ClusterIP ([`Annotations::service_upstream_variant`]),
//! `client-body-buffer-size` is only checked (bodies stream, never spooled),
//! `proxy-next-upstream` (+ `-tries`) its
//! `retry` ([`next_upstream`]: safe retries only, `non_idempotent` refused; `-timeout` its
//! `budget`). Everything else not listed is reported
//! as `UnsupportedAnnotation` and ignored.

use super::{PathRoute, Report};
use crate::translate::ownership::Hosts;
use crate::translate::regex_escape;
use crate::translate::{Builder, Params};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::Ingress;
use std::collections::BTreeMap;
use std::sync::Arc;
use sweety_config::htpasswd;
use sweety_config::{
    Action, BackendProtocol, BackendTls, BasicAuth, Cidr, ConcurrencyLimit, CookieMatch, Cors,
    Duration, ExternalAuth, Filter, FixedResponse, HashAlgorithm, HashOn, HashPolicy, HeaderMatch,
    HostClientAuth, HostVerify, IpAccess, MatchKind, PathMatch, PathRewrite, PemSource,
    ProxyAction, RateLimit, RateLimitKey, Redirect, RetryPolicy, Route, RouteMatch, SessionKind,
    SessionPersistence, UrlRewrite, WeightedBackend,
};

/// Annotation prefix of ingress-nginx.
pub const PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// The annotations of one Ingress that change its translation.
#[derive(Clone, Debug, Default)]
pub struct Annotations {
    /// `use-regex`: the Ingress's paths are regular expressions.
    pub use_regex: bool,
    /// `rewrite-target`: the path the backend receives, with `$n` capture references.
    pub rewrite_target: Option<String>,
    /// `ssl-redirect`: plain-HTTP requests for a host with TLS go to HTTPS (unset: the
    /// controller's `Params::ssl_redirect`, on by default as in ingress-nginx).
    pub ssl_redirect: Option<bool>,
    /// `force-ssl-redirect`: plain-HTTP requests go to HTTPS even without TLS on the Ingress.
    pub force_ssl_redirect: bool,
    /// `backend-protocol`: how the backend is spoken to (HTTP, HTTPS, GRPC, GRPCS, H2C).
    pub backend_protocol: Option<BackendProtocol>,
    /// `enable-cors` and the `cors-*` settings.
    pub cors: Option<Cors>,
    /// `permanent-redirect` / `temporal-redirect`: answer every path with this redirect.
    pub redirect: Option<Redirect>,
    /// `app-root`: where a request for `/` is redirected.
    pub app_root: Option<String>,
    /// `proxy-connect-timeout`, `proxy-read-timeout` and `proxy-send-timeout`: the route's
    /// `timeouts.connect`, `read_idle` and `send_idle` (its other timeouts stay unset).
    pub proxy_timeouts: sweety_config::Timeouts,
    /// `canary`: this Ingress is a weighted variant of another Ingress's paths.
    pub canary: bool,
    /// `canary-weight`: the canary's share, out of `canary_weight_total`.
    pub canary_weight: u32,
    /// `canary-weight-total`: the whole of the weights (default 100).
    pub canary_weight_total: u32,
    /// `canary-by-header` (+ `-value` / `-pattern`) and `canary-by-cookie`.
    pub canary_select: CanarySelect,
    /// `limit-rps` / `limit-rpm`, per client IP.
    pub rate_limits: Vec<RateLimit>,
    /// `limit-connections`, per client IP, shared by the Ingress's paths.
    pub concurrency: Option<ConcurrencyLimit>,
    /// `whitelist-source-range` / `denylist-source-range`.
    pub ip_access: Option<IpAccess>,
    /// `affinity: cookie` and its `session-cookie-*` settings.
    pub session: Option<SessionPersistence>,
    /// `upstream-hash-by`.
    pub hash: Option<HashPolicy>,
    /// `auth-type: basic` with `auth-secret` (+ `auth-secret-type`, `auth-realm`): the filter
    /// names the Secret's user set ([`Annotations::user_set`]) instead of copying its users.
    pub basic_auth: Option<BasicAuth>,
    /// The users of the `auth-secret`, as the config's user set `basic_auth` names (one per
    /// Secret and `auth-secret-type`, however many Ingresses and paths use it).
    pub user_set: Option<sweety_config::UserSet>,
    /// `proxy-body-size`: the largest request body, bytes (`0`: no limit).
    pub body_size: Option<u64>,
    /// `service-upstream: "true"`: the backend is the Service's ClusterIP and port, one
    /// endpoint ([`Annotations::service_upstream_variant`]).
    pub service_upstream: bool,
    /// `proxy-next-upstream` (+ `-tries`, `-timeout`): the route's retry policy
    /// ([`next_upstream`]); None without them, with `off` or with a single try.
    pub retry: Option<RetryPolicy>,
    /// `auth-url` and its `auth-*` settings.
    pub external_auth: Option<ExternalAuth>,
    /// `auth-tls-secret` and its `auth-tls-*` settings: client certificates for the
    /// Ingress's hosts (the entry without `hostnames`; [`super::translate`] fills them).
    pub client_tls: Option<HostClientAuth>,
    /// `upstream-vhost`: the `Host` the backend receives (a lower-case DNS name).
    pub upstream_vhost: Option<String>,
    /// `x-forwarded-prefix`: the `X-Forwarded-Prefix` value the backend receives.
    pub forwarded_prefix: Option<String>,
    /// `proxy-ssl-secret` and its `proxy-ssl-*` settings: TLS towards the backend, applied
    /// when it is spoken to over TLS (`backend-protocol: HTTPS`/`GRPCS`,
    /// [`Annotations::backend_tls_variant`]).
    pub proxy_ssl: Option<BackendTls>,
    /// `custom-http-errors`: the statuses replaced by an error page (sorted, distinct).
    pub custom_errors: Vec<u16>,
    /// `default-backend`: a Service of the Ingress's namespace that serves the error pages
    /// and the paths whose backends have no endpoint.
    pub default_backend: Option<String>,
    /// The `error_pages` filter both make ([`super::translate`] resolves the Service; each
    /// path adds its own `X-Service-Name` / `X-Service-Port`).
    pub error_pages: Option<sweety_config::ErrorPages>,
    /// `ssl-passthrough: "true"` on a class that allows it ([`ClassSettings::ssl_passthrough`]):
    /// the TLS connections of the Ingress's rule hosts pass through to the Service of each
    /// rule's `/` path ([`super::translate`]).
    pub ssl_passthrough: bool,
    /// Fail closed: every route of the Ingress answers this status and body instead (a
    /// security annotation Sweety does not implement, an access list entry it cannot honour:
    /// 403; a snippet: 503, the whole Ingress is refused).
    pub refuse: Option<(u16, String)>,
}

/// The settings of an Ingress's class that shape its annotations' translation: the
/// SweetyProxyConfig `ingress` section its IngressClass's `spec.parameters` name
/// (`crate::translate::proxy_settings::ingress_settings`), the equivalent of ingress-nginx's
/// ConfigMap keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassSettings {
    /// `limit-req-status-code`: what `limit-rps` / `limit-rpm` answer past the limit.
    pub limit_req_status: u16,
    /// `limit-conn-status-code`: what `limit-connections` answers past the limit.
    pub limit_conn_status: u16,
    /// `proxy-read-timeout`, `proxy-send-timeout` and `proxy-connect-timeout` of the class's
    /// Ingresses without the annotations: the route's `timeouts.read_idle`, `send_idle` and
    /// `connect` (`connect` unset: the backend's own; the other timeouts stay unset).
    pub proxy_timeouts: sweety_config::Timeouts,
    /// `ingress.sslPassthrough` (ingress-nginx's `--enable-ssl-passthrough`): the class's
    /// Ingresses may use `ssl-passthrough`; off, an Ingress asking for it is refused (403).
    pub ssl_passthrough: bool,
}

/// nginx's `limit_req_status` and `limit_conn_status` default, which ingress-nginx keeps.
pub const NGINX_LIMIT_STATUS: u16 = 503;

/// nginx's `proxy_read_timeout` and `proxy_send_timeout` default, which ingress-nginx keeps
/// (its `proxy-read-timeout` / `proxy-send-timeout` ConfigMap keys default to 60): an
/// Ingress that sets neither the annotation nor its class gets this idle clock, so a backend
/// that stops sending or reading holds a request for a minute at most, as under
/// ingress-nginx.
pub const NGINX_PROXY_IDLE: Duration = Duration::from_secs(60);

impl Default for ClassSettings {
    fn default() -> Self {
        ClassSettings {
            limit_req_status: NGINX_LIMIT_STATUS,
            limit_conn_status: NGINX_LIMIT_STATUS,
            // The backend's own connect timeout (5 s), as nginx's `proxy_connect_timeout`.
            proxy_timeouts: sweety_config::Timeouts {
                read_idle: Some(NGINX_PROXY_IDLE),
                send_idle: Some(NGINX_PROXY_IDLE),
                ..Default::default()
            },
            ssl_passthrough: false,
        }
    }
}

/// How Sweety treats one ingress-nginx annotation: the one table the translator's fail-closed
/// rule ([`is_security`]), the migration report (`crate::migrate_report`) and the annotation
/// table of docs/migrating-from-ingress-nginx.md read (a test checks each entry against what
/// [`Annotations::parse`] does with its example value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Support {
    /// Applied as ingress-nginx applies it.
    Honoured,
    /// Applied, with a difference the note says.
    HonouredDifferently,
    /// Not implemented, and a protection: the Ingress's paths are refused (403; 503 for
    /// snippets) rather than served without it.
    RefusedFailClosed,
    /// Not applied, reported as an Event; not a protection.
    IgnoredHarmless,
}

impl Support {
    /// The words used in the report and the docs.
    pub fn label(self) -> &'static str {
        match self {
            Support::Honoured => "honoured",
            Support::HonouredDifferently => "honoured differently",
            Support::RefusedFailClosed => "refused (fail closed)",
            Support::IgnoredHarmless => "ignored (harmless)",
        }
    }
}

/// One row of [`ANNOTATIONS`]: a name without the prefix (`x-*`: every name starting with
/// `x-`; `*-x`: every name ending in `-x`), how it is treated, a note, and a value the table
/// test tries.
#[derive(Debug)]
pub struct AnnotationSpec {
    /// The annotation name without [`PREFIX`], or a `*` pattern.
    pub name: &'static str,
    /// How it is treated.
    pub support: Support,
    /// What differs, or why it is refused or ignored.
    pub note: &'static str,
    /// A value the table test gives it.
    pub example: &'static str,
    /// It restricts who reaches the backend, or how often, and is enforced on requests Sweety
    /// terminates: it cannot hold on a connection passed through untouched, so beside
    /// `ssl-passthrough` it fails closed ([`passthrough_protections`]).
    pub guards_terminated: bool,
}

const fn spec(
    name: &'static str,
    support: Support,
    note: &'static str,
    example: &'static str,
) -> AnnotationSpec {
    AnnotationSpec {
        name,
        support,
        note,
        example,
        guards_terminated: false,
    }
}

/// [`spec`] of an annotation that guards access on terminated requests
/// ([`AnnotationSpec::guards_terminated`]).
const fn guard(
    name: &'static str,
    support: Support,
    note: &'static str,
    example: &'static str,
) -> AnnotationSpec {
    AnnotationSpec {
        guards_terminated: true,
        ..spec(name, support, note, example)
    }
}

use Support::{
    HonouredDifferently as Differently, IgnoredHarmless as Ignored, RefusedFailClosed as Refused,
};

/// Every ingress-nginx annotation Sweety knows, in the order of the docs table. Names not in
/// it are ignored (reported as `UnsupportedAnnotation`).
pub const ANNOTATIONS: &[AnnotationSpec] = &[
    spec("app-root", Support::Honoured, "`/` redirects (302) to the root", "/app"),
    spec("affinity", Support::Honoured, "`cookie` only", "cookie"),
    spec("affinity-mode", Differently, "accepted; sessions stick as in `balanced` mode", "persistent"),
    spec("session-cookie-name", Support::Honoured, "default `INGRESSCOOKIE`", "route"),
    spec("session-cookie-path", Support::Honoured, "", "/"),
    spec("session-cookie-max-age", Support::Honoured, "", "3600"),
    spec("session-cookie-expires", Support::Honoured, "", "3600"),
    spec("session-cookie-secure", Support::Honoured, "", "true"),
    spec("session-cookie-samesite", Support::Honoured, "", "Lax"),
    spec("upstream-hash-by", Differently, "`$remote_addr`, `$binary_remote_addr`, `$http_<header>`, `$cookie_<name>` only (ring hash); other variables are ignored", "$remote_addr"),
    spec("backend-protocol", Support::Honoured, "HTTP, HTTPS, GRPC (h2c), GRPCS, H2C; AJP and FCGI are ignored", "GRPC"),
    spec("canary", Support::Honoured, "weighted canaries", "true"),
    spec("canary-weight", Support::Honoured, "", "10"),
    spec("canary-weight-total", Support::Honoured, "", "100"),
    spec("canary-by-header", Support::Honoured, "`always` / `never`, before the cookie and the weights", "X-Canary"),
    spec("canary-by-header-value", Support::Honoured, "exact value; any other value falls through to the cookie and the weights", "beta"),
    spec("canary-by-header-pattern", Differently, "RE2 syntax (Rust `regex`), found anywhere in the value; ignored when `canary-by-header-value` is set", "^(beta|rc)$"),
    spec("canary-by-cookie", Support::Honoured, "`always` / `never` (the first cookie of the name), after the header and before the weights", "canary"),
    spec("enable-cors", Support::Honoured, "", "true"),
    spec("cors-allow-origin", Support::Honoured, "origins that are not `*` or `scheme://host[:port]` are dropped", "https://a.example"),
    spec("cors-allow-methods", Support::Honoured, "", "GET, POST"),
    spec("cors-allow-headers", Support::Honoured, "", "X-Token"),
    spec("cors-allow-credentials", Support::Honoured, "not with origin `*`", "true"),
    spec("cors-max-age", Support::Honoured, "", "600"),
    spec("cors-expose-headers", Support::Honoured, "", "X-Id"),
    spec("permanent-redirect", Support::Honoured, "", "https://new.example/"),
    spec("permanent-redirect-code", Support::Honoured, "", "308"),
    spec("temporal-redirect", Support::Honoured, "", "https://new.example/"),
    spec("rewrite-target", Differently, "capture groups `$1`…`$9` replace the whole path as nginx's `rewrite` does, with the route's case-insensitive regex (a `$` target makes an `ImplementationSpecific` path a regex); nginx variables (`$scheme`…) are refused (Event, path not rewritten); a target without `$` on a prefix path replaces the prefix (ignoring case in a `use-regex` host, as its match does)", "/"),
    spec("use-regex", Differently, "case-insensitive and anchored at the start like nginx's `~*` locations (RE2 syntax, Rust `regex`); as in ingress-nginx every other path of the host becomes a case-insensitive regex too (an `Exact` path stays exact, ignoring case; nginx makes it a start-anchored regex)", "true"),
    spec("ssl-redirect", Support::Honoured, "on by default for hosts with TLS; `/.well-known/acme-challenge` is never redirected", "false"),
    spec("force-ssl-redirect", Differently, "also redirects hosts without TLS here", "true"),
    spec("proxy-read-timeout", Support::Honoured, "nginx's idle time between two reads from the backend: until the response head (504), then between two body chunks (the response is aborted); a WebSocket of the path is closed after that long with no byte either way (nginx: no byte from the backend); at most 86400; unset or invalid: the class's SweetyProxyConfig `ingress.proxyReadTimeout`, else 60 as ingress-nginx", "60"),
    spec("proxy-send-timeout", Support::Honoured, "nginx's idle time between two writes of the request to the backend (504); at most 86400; unset or invalid: the class's `ingress.proxySendTimeout`, else 60 as ingress-nginx", "60"),
    spec("proxy-connect-timeout", Support::Honoured, "the connect timeout alone (504); at most 86400; unset or invalid: the class's `ingress.proxyConnectTimeout`, else the backend's (5 s, as ingress-nginx)", "5"),
    guard("limit-rps", Support::Honoured, "per client IP; answers 503 as nginx, or the class's SweetyProxyConfig `ingress.limitReqStatusCode` (ingress-nginx's `limit-req-status-code`)", "10"),
    guard("limit-rpm", Support::Honoured, "as `limit-rps`", "600"),
    spec("limit-burst-multiplier", Support::Honoured, "", "5"),
    guard("limit-connections", Differently, "requests in flight per client IP (nginx: connections); answers 503 as nginx, or the class's SweetyProxyConfig `ingress.limitConnStatusCode` (ingress-nginx's `limit-conn-status-code`)", "10"),
    spec("limit-whitelist", Support::Honoured, "client networks (comma-separated addresses or CIDRs, host bits cleared as nginx does) that `limit-rps`, `limit-rpm` and `limit-connections` of the Ingress do not count; not an access rule: an entry that cannot be parsed exempts no one (an `InvalidAnnotation` Event; the other entries still do, the limits still apply to everyone else); without a `limit-*` it has nothing to exempt", "10.0.0.0/8, 192.168.1.7"),
    spec("limit-allowlist", Support::Honoured, "as `limit-whitelist` (both: every entry of either)", "10.0.0.0/8"),
    guard("whitelist-source-range", Support::Honoured, "entries that cannot be parsed fail closed (403)", "10.0.0.0/8"),
    guard("allowlist-source-range", Support::Honoured, "as `whitelist-source-range`", "10.0.0.0/8"),
    guard("denylist-source-range", Support::Honoured, "entries that cannot be parsed fail closed (403)", "192.0.2.0/24"),
    guard("auth-type", Differently, "`basic` only (`digest` fails closed, 503); a missing or unusable Secret fails closed (503)", "basic"),
    spec("auth-secret", Differently, "the Ingress's own namespace only; htpasswd bcrypt, `$apr1$` and `{SHA}` entries (others are refused one by one)", "basic-auth"),
    spec("auth-secret-type", Support::Honoured, "`auth-file` or `auth-map`", "auth-file"),
    spec("auth-realm", Support::Honoured, "", "Staff"),
    guard("auth-url", Differently, "a subrequest as ingress-nginx sends it (original method and headers, no body); `$host`, `$http_host` and `$best_http_host` are the rule's host (no port; a rule without a host or with a wildcard host fails closed, 503), other nginx variables fail closed (503); loopback, link-local, metadata and the dataplane's own addresses are refused (500); `https` is verified against the public CAs; 5 s timeout; a service that cannot be asked answers 500", "http://auth.example/verify"),
    spec("auth-signin", Differently, "a 302 with the original URL in `rd` as ingress-nginx adds it; variables: `$host`, `$http_host`, `$best_http_host`, `$scheme`, `$pass_access_scheme`, `$request_uri`, `$escaped_request_uri` only (others fail closed, 503)", "https://auth.example/start"),
    spec("auth-signin-redirect-param", Support::Honoured, "", "next"),
    spec("auth-method", Support::Honoured, "", "GET"),
    spec("auth-response-headers", Differently, "the client's own copies are removed before the backend sees the request; `Host`, `Content-Length`, `Transfer-Encoding` and other framing headers fail closed (503)", "X-User"),
    spec("auth-request-redirect", Support::Honoured, "", "/"),
    spec("auth-always-set-cookie", Support::Honoured, "", "true"),
    spec("auth-cache-key", Ignored, "auth answers are not cached: every request is asked (stricter)", "$remote_user"),
    spec("auth-cache-duration", Ignored, "see `auth-cache-key`", "200 202 401 5m"),
    spec("auth-keepalive*", Ignored, "connections to the auth service are kept alive (16 idle per path) anyway", "10"),
    spec("auth-proxy-set-headers", Refused, "not implemented: the auth service would not get the headers it asks for", "ns/cm"),
    spec("global-auth-url", Refused, "no cluster-wide external authentication", "http://auth.example/"),
    guard("auth-tls-secret", Differently, "the Ingress's own namespace only; `ca.crt` must hold usable certificates, else the Ingress's paths answer 503; applies to the whole host (as nginx's server-level setting; the oldest Ingress's settings win), which must have TLS here (else 503); plain-HTTP requests for the host are redirected to HTTPS whatever `ssl-redirect` says (`no-tls-redirect-locations` aside)", "ca"),
    spec("auth-tls-verify-client", Differently, "`on` (default), `optional`, `optional_no_ca`, `off`; the certificate is asked for only when the TLS server name (SNI) is the host, and a request for the host on a connection made for another name, without SNI or over HTTP/3 answers 421; a missing (`on`) or unverifiable (`on`, `optional`) certificate answers 400 after the handshake as nginx does", "optional"),
    spec("auth-tls-verify-depth", Support::Honoured, "default 1; more than 8 is taken as 8", "2"),
    spec("auth-tls-pass-certificate-to-upstream", Support::Honoured, "`ssl-client-cert` (URL-escaped PEM); `ssl-client-verify`, `ssl-client-subject-dn`, `ssl-client-issuer-dn` are always sent, as ingress-nginx does; the client's own copies of the four are removed", "true"),
    spec("auth-tls-error-page", Differently, "an absolute `http(s)` URL, answered with a 302 instead of the 400; anything else is ignored (Event)", "https://login.example/cert"),
    spec("auth-tls-match-cn", Differently, "a regex (Rust `regex`) searched in the RFC 2253 subject DN (`CN=client,O=Example`); 403 otherwise", "CN=client"),
    spec("auth-tls-*", Refused, "other `auth-tls-*` settings are not implemented", "on"),
    spec("satisfy", Refused, "not implemented", "any"),
    spec("ssl-passthrough", Differently, "only when the IngressClass's SweetyProxyConfig sets `ingress.sslPassthrough: true` (ingress-nginx's `--enable-ssl-passthrough`; without it the Ingress's paths answer 403 rather than Sweety terminating TLS the backend was to terminate). TLS connections for each rule host go by SNI, untouched, to the endpoints of the Service of the rule's `/` path (ingress-nginx: the Service's ClusterIP); plain HTTP for the host is redirected (308) to HTTPS (ingress-nginx serves the paths over HTTP); the Ingress's other paths, `spec.tls`, default backend and other annotations are ignored with an `SSLPassthroughIgnored` Event, except access rules, authentication, client certificates and rate limits (`*-source-range`, `auth-type`, `auth-url`, `auth-tls-secret`, `limit-rps`/`-rpm`/`-connections`), which a passed-through connection cannot have: then the Ingress is not passed through and its paths answer 403 (`SSLPassthroughUnprotected`; ingress-nginx drops them silently); rules without a host, wildcard hosts, rules without a `/` path, and any passthrough when the HTTPS listener has no certificate at all (no default certificate, no Ingress TLS: plain HTTP still redirects) are refused (`SSLPassthroughInvalid`); a host another Ingress already serves stays the oldest's (`SSLPassthroughConflict`); HTTP/3 refuses the host (clients use TCP)", "true"),
    spec("enable-modsecurity", Refused, "no WAF", "true"),
    spec("enable-owasp-core-rules", Refused, "no WAF", "true"),
    spec("modsecurity-transaction-id", Refused, "no WAF", "x"),
    spec("modsecurity-*", Refused, "no WAF", "x"),
    spec("proxy-ssl-secret", Differently, "`namespace/name` (or `name`) of the Ingress's own namespace only; `ca.crt` is required and must hold usable CA certificates, `tls.crt` + `tls.key` (both or neither) are the client certificate shown to the backend; a missing Secret, another namespace's, bad PEM, a key that does not fit its certificate or a `ca.crl` (CRLs are not implemented) fail closed: the Ingress's paths answer 503; applies when the backend is spoken to over TLS (`backend-protocol: HTTPS`/`GRPCS`), else ignored with an Event as in ingress-nginx", "ca"),
    spec("proxy-ssl-verify", Support::Honoured, "`off` (default, as ingress-nginx: the backend's certificate is not verified) or `on`; anything else, or `on` without `proxy-ssl-secret`, fails closed (503)", "off"),
    spec("proxy-ssl-verify-depth", Differently, "default 1; 1: the backend's certificate is issued by a certificate of `ca.crt` directly, each more allows one intermediate (as `auth-tls-verify-depth`; stricter than OpenSSL's count by one); more than 8 is taken as 8", "2"),
    spec("proxy-ssl-name", Differently, "the name the backend's certificate is verified against, always sent as SNI; a value that is not a DNS name fails closed (503); unset: the endpoint's address is verified (nginx: the upstream's name)", "api.internal"),
    spec("proxy-ssl-server-name", Differently, "`proxy-ssl-name` is always sent as SNI (nginx sends it only with `on`)", "on"),
    spec("proxy-ssl-protocols", Differently, "`TLSv1.3` alone: TLS 1.3 only; a list with `TLSv1.2`: TLS 1.2 and 1.3 (1.3 also offered); older versions are never offered (ignored with an Event)", "TLSv1.2 TLSv1.3"),
    spec("proxy-ssl-ciphers", Refused, "`DEFAULT` only (rustls' AEAD suites with forward secrecy); any other OpenSSL cipher list cannot be expressed and fails closed (503)", "ECDHE-RSA-AES128-GCM-SHA256"),
    spec("proxy-ssl-*", Refused, "other `proxy-ssl-*` settings are not implemented", "on"),
    spec("*-snippet", Refused, "raw nginx configuration is never run: the whole Ingress answers 503 (unless the operator sets ignoreSnippets)", "return 200;"),
    spec("server-alias", Differently, "more names for the Ingress's first rule host; an alias that is a host of an Ingress rule or a SweetySite, or that another namespace already claims, is ignored with an Event (ingress-nginx also ignores one already in use); invalid names are refused one by one", "alias.example"),
    spec("from-to-www-redirect", Support::Honoured, "308 from `www.<host>` to `<host>` or back, keeping scheme, path and query, only when the other name is no rule's host and no other namespace claims it", "true"),
    spec("upstream-vhost", Differently, "the `Host` the backend receives; a DNS name only (no port, no nginx variable): anything else is refused with an `InvalidAnnotation` Event and the client's Host is sent", "internal.example"),
    spec("x-forwarded-prefix", Differently, "the `X-Forwarded-Prefix` value sent upstream (replacing the client's); a header value without nginx variables, at most 1 KiB (else refused with an `InvalidAnnotation` Event)", "/app"),
    spec("custom-http-errors", Differently, "statuses 400-599, comma-separated (anything else: an `InvalidAnnotation` Event, the annotation ignored); the page comes from the `default-backend` annotation's Service, else the controller's default backend (`--default-backend`), else Sweety's own short page, asked for `/` with ingress-nginx's `X-Code`, `X-Format`, `X-Original-URI`, `X-Namespace`, `X-Ingress-Name`, `X-Service-Name`, `X-Service-Port`, `X-Request-ID`, the request's method and headers and no body, within 5 s; the client gets the ORIGINAL status with the page's body and content headers (ingress-nginx: the page's status); a page backend that does not answer lets the original answer pass; a page is never intercepted again; only the backend's answers (and the proxy's own 502/504) are replaced, not Sweety's refusals; a Service without endpoints answers 502 here (ingress-nginx: 503)", "404,503"),
    spec("default-backend", Differently, "a Service of the Ingress's own namespace, its first port as ingress-nginx; serves the paths whose backends have no ready endpoint (the request as it is, with `X-Code: 503` and the `X-*` headers; its answer unchanged) when it has endpoints itself, and the `custom-http-errors` pages; a name that is not a Service name (another namespace's `ns/name` included) or a Service that does not exist or has no port is ignored with an Event", "errors"),
    spec("service-upstream", Support::Honoured, "the paths' backends are the Service's ClusterIP and port, one endpoint (kube-proxy balances; `affinity` and `upstream-hash-by` then choose among one endpoint and mean nothing); a Service without a ClusterIP (headless, ExternalName) keeps its endpoints with a `ServiceUpstreamIgnored` Event, as ingress-nginx falls back; the `default-backend` annotation's Service and `ssl-passthrough` keep endpoints", "true"),
    spec("proxy-next-upstream", Differently, "`error`, `timeout` and `invalid_header` retry the request on another endpoint after a connect, TLS, timeout or protocol error, `http_500`/`502`/`503`/`504`/`403`/`404`/`429` after that status; only idempotent requests without a body or with a body of at most 64 KiB (kept to be sent again) are retried, other requests only when their request never reached the backend (a connect or TLS error), as nginx without `non_idempotent`; `non_idempotent` is refused (an `InvalidAnnotation` Event; non-idempotent requests are never sent twice), other unknown tokens too; errors are retried whenever a policy is set (a list of statuses alone also retries errors); `off`: no retry. Without any `proxy-next-upstream*` annotation nothing is retried (ingress-nginx's default is `error timeout` with 3 tries: set the annotation to keep that)", "error timeout http_502"),
    spec("proxy-next-upstream-tries", Differently, "the tries in all (the first included, default 3, with `proxy-next-upstream`'s default `error timeout` when only this or `-timeout` is set); `1`: no retry; `0` (nginx: no limit) and more than 11 are taken as 11", "3"),
    spec("proxy-next-upstream-timeout", Support::Honoured, "whole seconds, at most 86400: no further try starts once that long has passed since the first began (the retry's wait counted); `0`: no limit, the default; anything else is an `InvalidAnnotation` Event (no limit); alone it also retries with the defaults, as `-tries`", "10"),
    spec("client-body-buffer-size", Differently, "request bodies stream to the backend as they arrive and are never spooled to disk, so there is no buffer to size (the only body kept in memory is an idempotent request's of at most 64 KiB on a path with `proxy-next-upstream`, to send it again); a size (bytes or `k`/`m`/`g`) is accepted, anything else is an `InvalidAnnotation` Event", "16k"),
    spec("proxy-body-size", Support::Honoured, "`0` lifts the limit; bytes or `k`/`m`/`g`; replaces the dataplane-wide `limits.max_request_body_bytes` for the Ingress's paths (413 past it)", "8m"),
];

/// The row of [`ANNOTATIONS`] for `name` (without the prefix): exact first, then patterns.
pub fn annotation_spec(name: &str) -> Option<&'static AnnotationSpec> {
    ANNOTATIONS.iter().find(|s| s.name == name).or_else(|| {
        ANNOTATIONS.iter().find(|s| {
            if let Some(p) = s.name.strip_suffix('*') {
                name.starts_with(p)
            } else if let Some(x) = s.name.strip_prefix('*') {
                name.ends_with(x)
            } else {
                false
            }
        })
    })
}

/// The annotation table of docs/migrating-from-ingress-nginx.md, from [`ANNOTATIONS`].
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| Annotation (`nginx.ingress.kubernetes.io/…`) | Sweety | Notes |\n|---|---|---|\n",
    );
    for s in ANNOTATIONS {
        let passthrough = if s.guards_terminated {
            "; beside `ssl-passthrough` the Ingress is not passed through and its paths answer \
             403 (`SSLPassthroughUnprotected`)"
        } else {
            ""
        };
        out.push_str(&format!(
            "| `{}` | {} | {}{passthrough} |\n",
            s.name,
            s.support.label(),
            s.note.replace('|', "\\|")
        ));
    }
    out.push_str(
        "| anything else | ignored (harmless) | reported as an `UnsupportedAnnotation` Event |\n",
    );
    out
}

/// Whether an annotation (without the prefix) asks for a protection Sweety does not implement
/// (refused in [`ANNOTATIONS`], snippets aside).
fn is_security(name: &str) -> bool {
    annotation_spec(name).is_some_and(|s| s.support == Refused && !s.name.ends_with("snippet"))
}

/// Fail closed on `ssl-passthrough` beside a protection it would silently drop
/// (the [`AnnotationSpec::guards_terminated`] rows of [`ANNOTATIONS`]): the Ingress is not passed through and its paths answer 403
/// (an `SSLPassthroughUnprotected` Event says which annotations), unless the operator chose to
/// ignore what cannot be honoured, when it passes through without them (and the Event says so).
fn passthrough_protections(
    ing: &Ingress,
    params: &Params,
    a: &mut Annotations,
    report: &mut Report,
) {
    let mut dropped: Vec<&str> = ing
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter_map(|(k, _)| k.strip_prefix(PREFIX))
        .filter(|n| annotation_spec(n).is_some_and(|s| s.guards_terminated))
        .collect();
    if dropped.is_empty() {
        return;
    }
    dropped.sort_unstable();
    let list = dropped.join(", ");
    if params.ignore_unsupported_security_annotations {
        report.warn(
            "SSLPassthroughUnprotected",
            format!(
                "ssl-passthrough: {list} cannot apply to TLS passed through untouched; the \
                 operator chose to serve the Ingress WITHOUT them"
            ),
        );
        return;
    }
    report.warn(
        "SSLPassthroughUnprotected",
        format!(
            "ssl-passthrough: {list} cannot apply to TLS passed through untouched (Sweety \
             never sees the requests); the Ingress is not passed through and its paths answer \
             403 until these annotations or ssl-passthrough are removed"
        ),
    );
    let ns = ing.metadata.namespace.as_deref().unwrap_or("");
    let name = ing.metadata.name.as_deref().unwrap_or("");
    a.ssl_passthrough = false;
    a.refuse = Some((
        403,
        format!(
            "forbidden: Ingress {ns}/{name} asks for ssl-passthrough and for {list}, which a \
             connection passed through cannot have; refusing rather than serving unprotected\n"
        ),
    ));
}

/// An nginx allow/deny list entry as nginx reads it: an address, or `address/prefix` whose
/// host bits below the prefix are cleared (nginx accepts `10.0.0.1/8` as `10.0.0.0/8`), as
/// the canonical `address/prefix` text sweety-config validates ([`Cidr::parse_masked`]).
pub fn masked_cidr(entry: &str) -> Result<String, String> {
    Cidr::parse_masked(entry.trim()).map(|c| c.to_string())
}

const CORS_METHODS: &str = "GET, PUT, POST, DELETE, PATCH, OPTIONS";
const CORS_HEADERS: &str = "DNT,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Range,Authorization";

/// `canary-by-header` (+ `-value` or `-pattern`) and `canary-by-cookie`: requests that pick
/// the canary, or refuse it, before the weights apply (ingress-nginx's order: header, cookie,
/// weight).
#[derive(Debug, Clone, Default)]
pub struct CanarySelect {
    /// The header's name (lower case).
    pub header: Option<String>,
    /// Send to the canary when the header has exactly this value.
    pub header_value: Option<String>,
    /// Send to the canary when the header's value contains a match of this regex.
    pub header_pattern: Option<String>,
    /// The cookie's name.
    pub cookie: Option<String>,
}

/// One condition a canary rule adds to each of the primary's matches.
#[derive(Debug, Clone)]
enum CanaryCondition {
    Header(HeaderMatch),
    Cookie(CookieMatch),
}

impl CanarySelect {
    /// The conditions that decide for a request, in precedence order, each with where it
    /// sends the request: `true` the canary, `false` the primary only.
    fn conditions(&self) -> Vec<(&'static str, CanaryCondition, bool)> {
        let mut out = Vec::new();
        if let Some(h) = &self.header {
            let exact = |v: &str| {
                CanaryCondition::Header(HeaderMatch {
                    name: h.clone(),
                    value: v.to_string(),
                    kind: MatchKind::Exact,
                })
            };
            if let Some(v) = &self.header_value {
                out.push(("by-header", exact(v), true));
            } else if let Some(p) = &self.header_pattern {
                // nginx searches (`ngx.re.match`); the router matches the whole value.
                let m = HeaderMatch {
                    name: h.clone(),
                    value: format!("(?s:.*)(?:{p})(?s:.*)"),
                    kind: MatchKind::Regex,
                };
                out.push(("by-header", CanaryCondition::Header(m), true));
            } else {
                out.push(("by-header", exact("always"), true));
                out.push(("by-header-never", exact("never"), false));
            }
        }
        if let Some(c) = &self.cookie {
            // The router's cookie match reads the first cookie of the name, as nginx's
            // `$cookie_<name>` does.
            let pair = |v: &str| {
                CanaryCondition::Cookie(CookieMatch {
                    name: c.clone(),
                    value: v.into(),
                })
            };
            out.push(("by-cookie", pair("always"), true));
            out.push(("by-cookie-never", pair("never"), false));
        }
        out
    }
}

fn truthy(v: &str) -> Option<bool> {
    match v.trim() {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A conservative check of a CORS origin (`*` or `scheme://host[:port]`, lower case).
fn origin_ok(o: &str) -> bool {
    if o == "*" {
        return true;
    }
    let Some((scheme, rest)) = o.split_once("://") else {
        return false;
    };
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (rest, None),
    };
    matches!(scheme, "http" | "https")
        && port.is_none_or(|p| matches!(p.parse::<u16>(), Ok(n) if n != 0))
        && !host.is_empty()
        && host.matches('*').count() <= 1
        && host
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.*".contains(&b))
}

/// Parse `http(s)://host[:port][/path]` into a redirect to exactly that URL (the path, `/`
/// when absent, replaces the request's path).
pub fn parse_redirect_url(url: &str, status: u16) -> Option<Redirect> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    if authority.is_empty() || url.contains(['?', '#', ' ']) {
        return None;
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse::<u16>().ok().filter(|n| *n != 0)?)),
        None => (authority, None),
    };
    let host_ok = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if host.is_empty() || !host_ok {
        return None;
    }
    Some(Redirect {
        scheme: Some(scheme.into()),
        host: Some(host.to_ascii_lowercase()),
        port,
        path: Some(PathRewrite::Full(path.unwrap_or("/").into())),
        status,
    })
}

/// An nginx size (`client_max_body_size`): bytes, or a number with `k`, `m` or `g`
/// (either case); `0` is no limit. `None` for anything else or an overflow.
pub fn nginx_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, mult) = match v.as_bytes().last()? {
        b'k' | b'K' => (&v[..v.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&v[..v.len() - 1], 1 << 20),
        b'g' | b'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) || num.len() > 20 {
        return None;
    }
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// At most this many characters of a tenant's value are quoted back in a message.
const QUOTE_CHARS: usize = 64;

/// A tenant's value, cut for quoting in a status message.
fn truncate(v: &str) -> String {
    if v.chars().count() <= QUOTE_CHARS {
        v.to_string()
    } else {
        let mut s: String = v.chars().take(QUOTE_CHARS).collect();
        s.push('…');
        s
    }
}

/// The Secret an `auth-secret` value names: `name` or `namespace/name` in the Ingress's own
/// namespace (another namespace's Secret is never read for a tenant).
pub fn auth_secret_ref(value: &str, namespace: &str) -> Result<String, String> {
    let v = value.trim();
    let (ns, name) = match v.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (namespace, v),
    };
    let dns = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if !dns(name) || !dns(ns) {
        return Err(format!("{:?} is not a Secret name", truncate(value)));
    }
    if ns != namespace {
        return Err(format!(
            "the Secret {ns}/{name} is in another namespace; only the Ingress's own namespace \
             is read"
        ));
    }
    Ok(name.to_string())
}

/// The annotations that name a Secret of the Ingress's namespace.
pub const SECRET_ANNOTATIONS: [&str; 3] = ["auth-secret", "auth-tls-secret", "proxy-ssl-secret"];

/// The Secrets (names in the Ingress's namespace `namespace`) that the Ingress's
/// [`SECRET_ANNOTATIONS`] name, each once, in annotation order; a value that names no Secret of
/// the namespace ([`auth_secret_ref`]) names none (the translator reports it). The watch keeps
/// these Secrets in the snapshot and `migrate-report` reads them.
pub fn secret_refs(annotations: Option<&BTreeMap<String, String>>, namespace: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for a in SECRET_ANNOTATIONS {
        let value = annotations.and_then(|m| m.get(&format!("{PREFIX}{a}")));
        if let Some(Ok(name)) = value.map(|v| auth_secret_ref(v, namespace)) {
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

/// The Secret an annotation (`auth-secret`, `auth-tls-secret`, `proxy-ssl-secret`) names, with
/// its name: one of the Ingress's own namespace only ([`auth_secret_ref`]), and one that exists.
fn own_secret<'s>(
    annotation: &str,
    value: &str,
    namespace: &str,
    secrets: &'s [Arc<Secret>],
) -> Result<(String, &'s Secret), String> {
    let name =
        auth_secret_ref(value, namespace).map_err(|e| format!("{PREFIX}{annotation}: {e}"))?;
    let secret = secrets
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.metadata.name.as_deref() == Some(name.as_str())
        })
        .ok_or_else(|| format!("the Secret {namespace}/{name} does not exist"))?;
    Ok((name, secret))
}

/// `auth-tls-verify-depth` / `proxy-ssl-verify-depth`: default 1, more than
/// [`sweety_config::MAX_VERIFY_DEPTH`] taken as that; anything but a positive whole number is
/// 1 with an `InvalidAnnotation` Event (as ingress-nginx).
fn verify_depth<'a>(get: &impl Fn(&str) -> Option<&'a str>, key: &str, report: &mut Report) -> u8 {
    let max = sweety_config::MAX_VERIFY_DEPTH;
    match get(key).map(str::trim) {
        None => 1,
        Some(v) => match v.parse::<u32>() {
            Ok(n @ 1..) => u8::try_from(n.min(u32::from(max))).unwrap_or(max),
            _ => {
                report.warn(
                    "InvalidAnnotation",
                    format!(
                        "{PREFIX}{key}: {:?} is not a positive whole number; 1 is used (as \
                         ingress-nginx)",
                        truncate(v)
                    ),
                );
                1
            }
        },
    }
}

/// Most rejected htpasswd lines listed one by one in a status or Event.
pub(crate) const MAX_REJECTED_REPORTED: usize = 10;

/// The name of the config's user set holding the users of Secret `namespace/name` read as
/// `kind` (`auth-file` or `auth-map`): the same Secret read the same way is the same users.
/// (SweetySecurityPolicies name theirs `secret/...`: a Secret both read is two sets.)
pub fn user_set_name(namespace: &str, name: &str, kind: &str) -> String {
    format!("ingress/{namespace}/{name}/{kind}")
}

/// The `basic_auth` filter of `auth-type: basic` and the user set it names, or why they
/// cannot be made (fails closed).
fn basic_auth<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    namespace: &str,
    secrets: &[Arc<Secret>],
    report: &mut Report,
) -> Result<(BasicAuth, sweety_config::UserSet), String> {
    let realm = get("auth-realm").unwrap_or("").to_string();
    if let Err(e) = htpasswd::check_realm(&realm) {
        return Err(format!("{PREFIX}auth-realm {e}"));
    }
    let Some(value) = get("auth-secret") else {
        return Err(format!("{PREFIX}auth-secret is not set"));
    };
    let (name, secret) = own_secret("auth-secret", value, namespace, secrets)?;
    let data = secret.data.clone().unwrap_or_default();
    let kind = get("auth-secret-type")
        .map(str::trim)
        .unwrap_or("auth-file");
    let parsed = match kind {
        "auth-file" => {
            let auth = data
                .get("auth")
                .ok_or_else(|| format!("the Secret {namespace}/{name} has no key \"auth\""))?;
            let text = std::str::from_utf8(&auth.0)
                .map_err(|_| format!("the Secret {namespace}/{name}'s \"auth\" is not UTF-8"))?;
            htpasswd::parse(text)
        }
        "auth-map" => {
            let mut entries = Vec::new();
            for (k, v) in &data {
                let v = std::str::from_utf8(&v.0).map_err(|_| {
                    format!("the Secret {namespace}/{name}'s key {k:?} is not UTF-8")
                })?;
                entries.push((k.as_str(), v));
            }
            htpasswd::parse_map(entries)
        }
        other => {
            return Err(format!(
                "{PREFIX}auth-secret-type {:?} is not auth-file or auth-map",
                truncate(other)
            ))
        }
    };
    for r in parsed.rejected.iter().take(MAX_REJECTED_REPORTED) {
        report.warn(
            "AuthEntryRefused",
            format!(
                "the Secret {namespace}/{name}, entry {}{}: {}; this user cannot log in",
                r.line,
                r.user
                    .as_deref()
                    .map(|u| format!(" ({:?})", truncate(u)))
                    .unwrap_or_default(),
                r.reason
            ),
        );
    }
    if parsed.rejected.len() > MAX_REJECTED_REPORTED {
        report.warn(
            "AuthEntryRefused",
            format!(
                "the Secret {namespace}/{name}: {} more entries refused",
                parsed.rejected.len() - MAX_REJECTED_REPORTED
            ),
        );
    }
    if parsed.users.is_empty() {
        return Err(format!(
            "the Secret {namespace}/{name} has no usable htpasswd entry (bcrypt, $apr1$ or {{SHA}})"
        ));
    }
    // What the dataplane would refuse (too many users) must not reach it: a set is checked
    // with the whole config, so here, where it fails this Ingress only.
    if let Some((field, m)) = htpasswd::check_users(&parsed.users).into_iter().next() {
        return Err(format!(
            "the Secret {namespace}/{name}'s htpasswd entries: {field} {m}"
        ));
    }
    let set = user_set_name(namespace, &name, kind);
    Ok((
        BasicAuth {
            realm,
            users: Vec::new(),
            user_set: Some(set.clone()),
        },
        sweety_config::UserSet {
            name: set,
            users: parsed.users,
        },
    ))
}

/// The `auth-tls-*` annotations read with `auth-tls-secret` ([`client_tls`]).
const AUTH_TLS: &[&str] = &[
    "auth-tls-secret",
    "auth-tls-verify-client",
    "auth-tls-verify-depth",
    "auth-tls-pass-certificate-to-upstream",
    "auth-tls-error-page",
    "auth-tls-match-cn",
];

/// Whether `pem` holds certificates the dataplane can trust as client CAs (the checks its
/// verifier makes: PEM that decodes, at least one certificate, each usable as a trust anchor),
/// so that one tenant's bad `ca.crt` fails that Ingress closed instead of the whole config.
pub fn check_client_ca(pem: &str) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    for (i, c) in certs.iter().enumerate() {
        webpki::anchor_from_trusted_cert(c)
            .map_err(|e| format!("certificate {} cannot be a CA here: {e}", i + 1))?;
    }
    Ok(())
}

/// The client certificate settings of `auth-tls-secret` and the other `auth-tls-*`
/// annotations (None: `auth-tls-verify-client: off`), or why they cannot be honoured (fails
/// closed). Settings that only change how a refusal looks are ignored with an Event when bad.
fn client_tls<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    namespace: &str,
    secrets: &[Arc<Secret>],
    report: &mut Report,
) -> Result<Option<HostClientAuth>, String> {
    let verify = match get("auth-tls-verify-client").map(str::trim).unwrap_or("on") {
        "on" => HostVerify::Require,
        "optional" => HostVerify::Optional,
        "optional_no_ca" => HostVerify::OptionalNoCa,
        "off" => {
            report.warn(
                "AuthTLSOff",
                format!(
                    "{PREFIX}auth-tls-verify-client is off: no client certificate is asked for"
                ),
            );
            return Ok(None);
        }
        other => {
            return Err(format!(
                "{PREFIX}auth-tls-verify-client {:?} is not on, optional, optional_no_ca or off",
                truncate(other)
            ))
        }
    };
    let value = get("auth-tls-secret").unwrap_or("");
    let (name, secret) = own_secret("auth-tls-secret", value, namespace, secrets)?;
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .ok_or_else(|| format!("the Secret {namespace}/{name} has no key \"ca.crt\""))?;
    let ca = String::from_utf8(ca.0.clone())
        .map_err(|_| format!("the Secret {namespace}/{name}'s ca.crt is not PEM text"))?;
    check_client_ca(&ca).map_err(|e| format!("the Secret {namespace}/{name}'s ca.crt {e}"))?;
    let verify_depth = verify_depth(get, "auth-tls-verify-depth", report);
    let pass_certificate = match get("auth-tls-pass-certificate-to-upstream") {
        None => false,
        Some(v) => truthy(v).unwrap_or_else(|| {
            report.warn(
                "InvalidAnnotation",
                format!(
                    "{PREFIX}auth-tls-pass-certificate-to-upstream: {:?} is not \"true\" or \
                     \"false\"; the certificate is not passed",
                    truncate(v)
                ),
            );
            false
        }),
    };
    let error_page = get("auth-tls-error-page")
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .and_then(|v| match sweety_config::check_error_page(v) {
            Ok(()) => Some(v.to_string()),
            Err(why) => {
                report.warn(
                    "InvalidAnnotation",
                    format!(
                        "{PREFIX}auth-tls-error-page: {:?} {why}; refused requests get the 400 \
                         instead",
                        truncate(v)
                    ),
                );
                None
            }
        });
    let match_subject = get("auth-tls-match-cn")
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    let entry = HostClientAuth {
        hostnames: vec!["probe.invalid".into()],
        ca: PemSource::Pem(ca),
        verify,
        verify_depth,
        pass_certificate,
        error_page,
        match_subject,
    };
    // The dataplane's own checks (the subject regex), on a probe listener.
    let probe = sweety_config::Config {
        listeners: vec![sweety_config::Listener {
            name: "probe".into(),
            address: "127.0.0.1".into(),
            port: 8443,
            protocol: sweety_config::ListenerProtocol::Https,
            tls: Some(sweety_config::ListenerTls {
                certificates: vec![sweety_config::Certificate {
                    hostnames: vec![],
                    cert: PemSource::Pem(
                        "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n".into(),
                    ),
                    key: PemSource::Pem(
                        "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n".into(),
                    ),
                }],
                min_version: Default::default(),
                client_auth: None,
                host_client_auth: vec![entry.clone()],
            }),
            http3: false,
            max_requests_in_flight: None,
            advertised_port: None,
            l4_routes: Vec::new(),
        }],
        ..Default::default()
    };
    if let Err(e) = probe.validate_structure() {
        let why: Vec<String> =
            e.0.iter()
                .map(|e| {
                    let field = e.path.rsplit('.').next().unwrap_or("");
                    let name = if field == "match_subject" {
                        "auth-tls-match-cn"
                    } else {
                        field
                    };
                    format!("{name}: {}", e.message)
                })
                .collect();
        return Err(why.join("; "));
    }
    Ok(Some(HostClientAuth {
        hostnames: Vec::new(),
        ..entry
    }))
}

/// The `proxy-ssl-*` annotations read with `proxy-ssl-secret` ([`proxy_ssl`]).
const PROXY_SSL: &[&str] = &[
    "proxy-ssl-secret",
    "proxy-ssl-verify",
    "proxy-ssl-verify-depth",
    "proxy-ssl-name",
    "proxy-ssl-server-name",
    "proxy-ssl-protocols",
    "proxy-ssl-ciphers",
];

/// Whether a client certificate and key are ones the dataplane can present (the checks its
/// backend TLS builder makes: certificates that decode, a private key that decodes and fits
/// them), so that one tenant's bad `tls.crt`/`tls.key` fails that Ingress closed instead of
/// the whole config.
pub fn check_client_pair(cert: &str, key: &str) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    let chain = rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls.crt is not PEM: {e}"))?;
    if chain.is_empty() {
        return Err("tls.crt holds no PEM certificate".into());
    }
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())
        .map_err(|e| format!("tls.key is not a PEM private key: {e}"))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(chain, key)
        .map(|_| ())
        .map_err(|e| format!("tls.crt and tls.key cannot be used: {e}"))
}

/// `proxy-ssl-ciphers`: None when it asks for nothing rustls does not do (absent or
/// `DEFAULT`), else why it cannot be honoured (fails closed, with or without
/// `proxy-ssl-secret`: a cipher list is a restriction, and dropping it would be looser).
fn proxy_ssl_ciphers(value: Option<&str>) -> Option<String> {
    match value.map(str::trim) {
        None | Some("" | "DEFAULT") => None,
        Some(v) => Some(format!(
            "{PREFIX}proxy-ssl-ciphers {:?} cannot be expressed: only DEFAULT (rustls' AEAD \
             suites with forward secrecy) is supported",
            truncate(v)
        )),
    }
}

/// TLS towards the backend from `proxy-ssl-secret` and the other `proxy-ssl-*` annotations
/// (ingress-nginx's `proxyssl` parser: `proxy_ssl_trusted_certificate`, `proxy_ssl_verify`,
/// `_verify_depth`, `_name`, `_protocols`, `proxy_ssl_certificate`), or why they cannot be
/// honoured (fails closed). The Secret is the tenant's own: only the Ingress's namespace.
fn proxy_ssl<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    namespace: &str,
    secrets: &[Arc<Secret>],
    report: &mut Report,
) -> Result<BackendTls, String> {
    let verify = match get("proxy-ssl-verify").map(str::trim) {
        None | Some("off") => false,
        Some("on") => true,
        Some(other) => {
            return Err(format!(
                "{PREFIX}proxy-ssl-verify {:?} is not on or off",
                truncate(other)
            ))
        }
    };
    let value = get("proxy-ssl-secret").unwrap_or("");
    let (name, secret) = own_secret("proxy-ssl-secret", value, namespace, secrets)?;
    let data = secret.data.clone().unwrap_or_default();
    let text = |key: &str| -> Result<Option<String>, String> {
        data.get(key)
            .map(|v| {
                String::from_utf8(v.0.clone())
                    .map_err(|_| format!("the Secret {namespace}/{name}'s {key} is not PEM text"))
            })
            .transpose()
    };
    let ca = text("ca.crt")?
        .ok_or_else(|| format!("the Secret {namespace}/{name} has no key \"ca.crt\""))?;
    check_client_ca(&ca).map_err(|e| format!("the Secret {namespace}/{name}'s ca.crt {e}"))?;
    if data.contains_key("ca.crl") {
        return Err(format!(
            "the Secret {namespace}/{name} has a ca.crl: revocation lists are not implemented"
        ));
    }
    let (client_cert, client_key) = match (text("tls.crt")?, text("tls.key")?) {
        (Some(c), Some(k)) => {
            check_client_pair(&c, &k).map_err(|e| format!("the Secret {namespace}/{name}: {e}"))?;
            (Some(PemSource::Pem(c)), Some(PemSource::Pem(k)))
        }
        (None, None) => (None, None),
        _ => {
            return Err(format!(
                "the Secret {namespace}/{name} has only one of tls.crt and tls.key"
            ))
        }
    };
    let sni = match get("proxy-ssl-name").map(str::trim) {
        None | Some("") => None,
        Some(v) => {
            let host = v.trim_end_matches('.').to_ascii_lowercase();
            if v.contains('$') {
                return Err(format!(
                    "{PREFIX}proxy-ssl-name {:?} uses an nginx variable, which Sweety does not \
                     expand",
                    truncate(v)
                ));
            }
            sweety_config::check_hostname(&host, false).map_err(|e| {
                format!(
                    "{PREFIX}proxy-ssl-name {:?} is not a host name: {e}",
                    truncate(v)
                )
            })?;
            Some(host)
        }
    };
    if let Some(v) = get("proxy-ssl-server-name").map(str::trim) {
        if v != "on" && v != "off" {
            report.warn(
                "InvalidAnnotation",
                format!(
                    "{PREFIX}proxy-ssl-server-name: {:?} is not on or off; ignored (the name of \
                     proxy-ssl-name is sent as SNI either way)",
                    truncate(v)
                ),
            );
        }
    }
    let mut min_version = None;
    if let Some(v) = get("proxy-ssl-protocols") {
        let (mut tls12, mut tls13) = (false, false);
        for p in v.split_whitespace() {
            match p {
                "TLSv1.2" => tls12 = true,
                "TLSv1.3" => tls13 = true,
                other => report.warn(
                    "InvalidAnnotation",
                    format!(
                        "{PREFIX}proxy-ssl-protocols: {:?} is never offered (TLS 1.2 and 1.3 \
                         only)",
                        truncate(other)
                    ),
                ),
            }
        }
        if tls13 && !tls12 {
            min_version = Some(sweety_config::TlsVersion::Tls13);
        }
    }
    let verify_depth = verify_depth(get, "proxy-ssl-verify-depth", report);
    if !verify {
        report.warn(
            "ProxySSLVerifyOff",
            format!(
                "{PREFIX}proxy-ssl-verify is off (ingress-nginx's default): the backend's \
                 certificate is not verified; set it to \"on\" to verify it against the Secret \
                 {namespace}/{name}'s ca.crt"
            ),
        );
    }
    Ok(BackendTls {
        ca: verify.then_some(PemSource::Pem(ca)),
        sni,
        subject_alt_names: Vec::new(),
        client_cert,
        client_key,
        well_known_ca: false,
        verify_depth: verify.then_some(verify_depth),
        min_version,
    })
}

/// Why an auth service address is one a tenant may not aim the subrequest at (the dataplane
/// refuses the same, and names that resolve there, after resolution): said early for an
/// address literal.
fn refused_auth_host(host: &str) -> Option<&'static str> {
    let ip: std::net::IpAddr = host.parse().ok()?;
    let ip = match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
        v4 => v4,
    };
    match ip {
        _ if ip.is_loopback() => Some("a loopback address"),
        _ if ip.is_unspecified() => Some("an unspecified address"),
        std::net::IpAddr::V4(v4) if v4.is_link_local() => {
            Some("a link-local (or cloud metadata) address")
        }
        std::net::IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => {
            Some("a link-local address")
        }
        std::net::IpAddr::V6(v6) if v6.segments() == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] => {
            Some("a cloud metadata address")
        }
        _ if ip.is_multicast() => Some("not a unicast address"),
        _ => None,
    }
}

/// The `external_auth` filter of `auth-url` and its settings, or why it cannot be made (fails
/// closed). The URL is a tenant's: the filter restricts the addresses it may reach.
fn external_auth<'a>(get: &impl Fn(&str) -> Option<&'a str>) -> Result<ExternalAuth, String> {
    let template = get("auth-url").unwrap_or("").trim();
    // `$host` (the oauth2-proxy pattern): checked here with a stand-in host, expanded per rule
    // host by `apply` ([`auth_url_for_host`]).
    let url = if auth_url_names_host(template)? {
        expand_auth_url(template, AUTH_URL_PROBE_HOST)
    } else {
        template.to_string()
    };
    let parsed = sweety_config::ext_auth::parse_auth_url(&url)
        .map_err(|e| format!("{PREFIX}auth-url {:?} {e}", truncate(template)))?;
    if let Some(why) = refused_auth_host(&parsed.host) {
        return Err(format!(
            "{PREFIX}auth-url {:?} names {why}, which an auth service of a tenant may not be",
            truncate(template)
        ));
    }
    let mut f = ExternalAuth::new(&url);
    f.restrict_addresses = true;
    f.method = get("auth-method").map(|m| m.trim().to_string());
    f.signin = get("auth-signin").map(|s| s.trim().to_string());
    if let Some(p) = get("auth-signin-redirect-param") {
        f.signin_redirect_param = p.trim().to_string();
    }
    f.response_headers = get("auth-response-headers").map(list).unwrap_or_default();
    f.request_redirect = get("auth-request-redirect")
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty());
    if let Some(v) = get("auth-always-set-cookie") {
        f.always_set_cookie = truthy(v).ok_or_else(|| {
            format!(
                "{PREFIX}auth-always-set-cookie {:?} is not \"true\" or \"false\"",
                truncate(v)
            )
        })?;
    }
    let problems = sweety_config::ext_auth::check_external_auth(&f);
    if !problems.is_empty() {
        let field = |f: &str| match f.split('[').next().unwrap_or(f) {
            "url" => "auth-url",
            "method" => "auth-method",
            "signin" => "auth-signin",
            "signin_redirect_param" => "auth-signin-redirect-param",
            "response_headers" => "auth-response-headers",
            "request_redirect" => "auth-request-redirect",
            _ => "auth-url",
        };
        return Err(problems
            .iter()
            .map(|(f, m)| format!("{PREFIX}{} {m}", field(f)))
            .collect::<Vec<_>>()
            .join("; "));
    }
    f.url = template.to_string();
    Ok(f)
}

/// The nginx variables `auth-url` may name: the host of the rule being served (nginx's `$host`;
/// `$http_host` and `$best_http_host` are the same here: the rule's host, without a port).
const AUTH_URL_HOST_VARS: [&str; 3] = ["host", "http_host", "best_http_host"];
/// The stand-in host `external_auth` checks a `$host` auth URL with (a reserved name).
const AUTH_URL_PROBE_HOST: &str = "auth-url-host.invalid";

/// The `$name`s of an auth URL, in order (`$` then `[A-Za-z0-9_]*`).
fn auth_url_vars(url: &str) -> impl Iterator<Item = (usize, &str)> {
    url.match_indices('$').map(move |(i, _)| {
        let rest = &url[i + 1..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        (i, &rest[..len])
    })
}

/// Whether `auth-url` names the rule's host ([`AUTH_URL_HOST_VARS`]); any other variable is
/// refused, naming it.
fn auth_url_names_host(url: &str) -> Result<bool, String> {
    let mut any = false;
    for (_, name) in auth_url_vars(url) {
        if !AUTH_URL_HOST_VARS.contains(&name) {
            return Err(format!(
                "{PREFIX}auth-url {:?} uses the nginx variable ${name}; only $host, $http_host \
                 and $best_http_host (the rule's host) are supported in the auth URL",
                truncate(url)
            ));
        }
        any = true;
    }
    Ok(any)
}

/// `url` with every [`AUTH_URL_HOST_VARS`] variable replaced by `host`.
fn expand_auth_url(url: &str, host: &str) -> String {
    let mut out = String::with_capacity(url.len() + host.len());
    let mut last = 0;
    for (i, name) in auth_url_vars(url) {
        out.push_str(&url[last..i]);
        out.push_str(host);
        last = i + 1 + name.len();
    }
    out.push_str(&url[last..]);
    out
}

/// The `external_auth` filter `f` for a rule of host `host`: `f` itself when its URL names no
/// variable, else with `$host` expanded, the result checked as `auth-url` is; a rule without a
/// host or with a wildcard host has no host to ask (fails closed).
fn auth_url_for_host(f: &ExternalAuth, host: &str) -> Result<ExternalAuth, String> {
    if !f.url.contains('$') {
        return Ok(f.clone());
    }
    if host.is_empty() || host.starts_with('*') {
        return Err(format!(
            "{PREFIX}auth-url {:?} names the request's host, and a rule {} has none to ask",
            truncate(&f.url),
            if host.is_empty() {
                "without a host".to_string()
            } else {
                format!("of the wildcard host {host:?}")
            }
        ));
    }
    let url = expand_auth_url(&f.url, host);
    let parsed = sweety_config::ext_auth::parse_auth_url(&url)
        .map_err(|e| format!("{PREFIX}auth-url {:?} {e}", truncate(&url)))?;
    if let Some(why) = refused_auth_host(&parsed.host) {
        return Err(format!(
            "{PREFIX}auth-url {:?} names {why}, which an auth service of a tenant may not be",
            truncate(&url)
        ));
    }
    Ok(ExternalAuth { url, ..f.clone() })
}

/// Most `server-alias` names taken per Ingress.
const MAX_ALIASES: usize = 32;

/// `server-alias`: the valid names (lower-cased DNS names, a leading `*.` allowed, at most
/// [`MAX_ALIASES`]) and, for each refused one, why.
pub fn server_aliases(ing: &Ingress) -> (Vec<String>, Vec<String>) {
    let (mut ok, mut bad) = (Vec::new(), Vec::new());
    let Some(v) = annotation(ing, "server-alias") else {
        return (ok, bad);
    };
    for name in list(v) {
        let h = name.trim_end_matches('.').to_ascii_lowercase();
        match sweety_config::check_hostname(&h, true) {
            _ if ok.len() >= MAX_ALIASES => {
                bad.push(format!("{name:?}: more than {MAX_ALIASES} aliases"))
            }
            Ok(()) if !ok.contains(&h) => ok.push(h),
            Ok(()) => {}
            Err(e) => bad.push(e),
        }
    }
    (ok, bad)
}

/// `from-to-www-redirect`: the other name of `host` (`www.` added or removed), for a plain DNS
/// name (no wildcard; not `www.` alone).
pub fn www_other(host: &str) -> Option<String> {
    if host.is_empty() || host.starts_with("*.") {
        return None;
    }
    let other = match host.strip_prefix("www.") {
        Some(rest) => rest.to_string(),
        None => format!("www.{host}"),
    };
    sweety_config::check_hostname(&other, false).ok()?;
    Some(other)
}

/// The value of annotation `name` (without the prefix) on `ing`.
fn annotation<'a>(ing: &'a Ingress, name: &str) -> Option<&'a str> {
    ing.metadata
        .annotations
        .as_ref()?
        .get(&format!("{PREFIX}{name}"))
        .map(String::as_str)
}

/// Whether `from-to-www-redirect` is on.
pub fn from_to_www(ing: &Ingress) -> bool {
    annotation(ing, "from-to-www-redirect").and_then(truthy) == Some(true)
}

/// The names an Ingress asks for besides its rule hosts: its `server-alias` names and the www
/// names of `from-to-www-redirect` (weak claims, [`crate::translate::ownership`]).
pub fn extra_hosts(ing: &Ingress) -> Vec<String> {
    let mut out = server_aliases(ing).0;
    if from_to_www(ing) {
        out.extend(
            super::super::ownership::ingress_hosts(ing)
                .iter()
                .filter_map(|h| www_other(h)),
        );
    }
    out
}

/// Longest `x-forwarded-prefix` value taken, bytes.
const MAX_FORWARDED_PREFIX: usize = 1024;

/// `upstream-vhost`: the `Host` header the backend receives (`proxy_set_header Host` in
/// ingress-nginx), a DNS name as sweety-config's rewrite `host` takes it (lower-cased; no port,
/// no nginx variable, no IP address: the dataplane sends the name as written).
fn upstream_vhost(value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.contains('$') {
        return Err("uses an nginx variable, which Sweety does not expand".into());
    }
    let host = v.to_ascii_lowercase();
    sweety_config::check_hostname(&host, false).map_err(|e| format!("is not a host name: {e}"))?;
    Ok(host)
}

/// `x-forwarded-prefix`: a header value (visible ASCII, spaces and tabs inside; no control
/// character, CR or LF; at most [`MAX_FORWARDED_PREFIX`] bytes), without nginx variables.
fn forwarded_prefix(value: &str) -> Result<String, String> {
    let v = value.trim_matches([' ', '\t']);
    if v.is_empty() {
        return Err("is empty".into());
    }
    if v.len() > MAX_FORWARDED_PREFIX {
        return Err(format!("is longer than {MAX_FORWARDED_PREFIX} bytes"));
    }
    if !v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) {
        return Err("is not a header value (control characters, CR, LF or non-ASCII)".into());
    }
    if v.contains('$') {
        return Err("uses an nginx variable, which Sweety does not expand".into());
    }
    Ok(v.to_string())
}

impl Annotations {
    /// Read the `nginx.ingress.kubernetes.io/*` annotations, reporting the ones not applied.
    pub(crate) fn parse(
        ing: &Ingress,
        params: &Params,
        class: &ClassSettings,
        secrets: &[Arc<Secret>],
        report: &mut Report,
    ) -> Annotations {
        let mut a = Annotations {
            canary_weight_total: 100,
            // The class's (or nginx's) idle clocks; each annotation replaces its own.
            proxy_timeouts: class.proxy_timeouts,
            ..Default::default()
        };
        let empty = BTreeMap::new();
        let all = ing.metadata.annotations.as_ref().unwrap_or(&empty);
        let get = |k: &str| all.get(&format!("{PREFIX}{k}")).map(String::as_str);
        let mut cors_enabled = false;
        let mut redirect_code: Option<u16> = None;
        let mut rps: Option<u32> = None;
        let mut rpm: Option<u32> = None;
        let mut burst_multiplier: u32 = 5;
        let mut access = IpAccess::default();
        let mut affinity = false;
        let mut connections: Option<u32> = None;
        // `limit-whitelist` / `limit-allowlist`: client networks the limits do not count.
        let mut limit_exempt: Vec<String> = Vec::new();
        // Fail-closed findings: (annotation, why).
        let mut unsupported_security: Vec<String> = Vec::new();
        // `ssl-passthrough` asked for where the class does not allow it: why.
        let mut passthrough_refused: Option<String> = None;
        let mut bad_access: Vec<String> = Vec::new();
        // Allow lists left without a usable entry: refused whatever the operator's setting.
        let mut empty_allow: Vec<String> = Vec::new();
        let mut snippets: Vec<String> = Vec::new();
        // `auth-type: basic` asked for; why its setup failed (fails closed, 503).
        let mut basic = false;
        let mut auth_failures: Vec<String> = Vec::new();
        for (key, value) in all {
            let Some(name) = key.strip_prefix(PREFIX) else {
                continue;
            };
            let bad = |report: &mut Report, why: &str| {
                report.warn(
                    "InvalidAnnotation",
                    format!("{key}: {value:?} {why}; ignored"),
                );
            };
            let flag = |report: &mut Report| {
                let v = truthy(value);
                if v.is_none() {
                    bad(report, "is not \"true\" or \"false\"");
                }
                v.unwrap_or(false)
            };
            // Bounded as the config bounds route timeouts (`MAX_IDLE_TIMEOUT`).
            let max = sweety_config::MAX_IDLE_TIMEOUT.get().as_secs();
            let seconds = |report: &mut Report| match value.trim().parse::<u64>() {
                Ok(n) if n > 0 && n <= max => Some(Duration::from_secs(n)),
                Ok(n) if n > max => {
                    bad(report, &format!("is more than {max} seconds"));
                    None
                }
                _ => {
                    bad(report, "is not a positive number of seconds");
                    None
                }
            };
            match name {
                "use-regex" => a.use_regex = flag(report),
                "rewrite-target" => a.rewrite_target = Some(value.clone()),
                "ssl-redirect" => {
                    a.ssl_redirect = truthy(value).or_else(|| {
                        bad(report, "is not \"true\" or \"false\"");
                        None
                    })
                }
                "force-ssl-redirect" => a.force_ssl_redirect = flag(report),
                "backend-protocol" => {
                    a.backend_protocol = match value.trim().to_ascii_uppercase().as_str() {
                        "HTTP" => Some(BackendProtocol::Http1),
                        "HTTPS" => Some(BackendProtocol::Https),
                        "GRPC" | "H2C" => Some(BackendProtocol::H2c),
                        "GRPCS" => Some(BackendProtocol::H2),
                        _ => {
                            bad(report, "is not HTTP, HTTPS, GRPC or GRPCS");
                            None
                        }
                    }
                }
                "enable-cors" => cors_enabled = flag(report),
                "cors-allow-origin"
                | "cors-allow-methods"
                | "cors-allow-headers"
                | "cors-allow-credentials"
                | "cors-max-age"
                | "cors-expose-headers" => {}
                "permanent-redirect" | "temporal-redirect" => {}
                "permanent-redirect-code" => match value.trim().parse::<u16>() {
                    Ok(c @ (301 | 302 | 303 | 307 | 308)) => redirect_code = Some(c),
                    _ => bad(report, "is not 301, 302, 303, 307 or 308"),
                },
                "app-root" => {
                    if value.starts_with('/') && !value.contains(['?', '#', ' ']) {
                        a.app_root = Some(value.clone());
                    } else {
                        bad(report, "is not a path starting with \"/\"");
                    }
                }
                // An invalid value keeps the class's (or nginx's) clock.
                "proxy-read-timeout" => {
                    let t = &mut a.proxy_timeouts;
                    t.read_idle = seconds(report).or(t.read_idle);
                }
                "proxy-send-timeout" => {
                    let t = &mut a.proxy_timeouts;
                    t.send_idle = seconds(report).or(t.send_idle);
                }
                "proxy-connect-timeout" => {
                    let t = &mut a.proxy_timeouts;
                    t.connect = seconds(report).or(t.connect);
                }
                "limit-rps" | "limit-rpm" | "limit-burst-multiplier" | "limit-connections" => {
                    match value.trim().parse::<u32>() {
                        Ok(n) if n > 0 => match name {
                            "limit-rps" => rps = Some(n),
                            "limit-rpm" => rpm = Some(n),
                            "limit-connections" => connections = Some(n),
                            _ => burst_multiplier = n,
                        },
                        _ => bad(report, "is not a positive whole number"),
                    }
                }
                // Not an access rule: an entry that cannot be parsed exempts no one (the limits
                // still apply to it), the others are kept.
                "limit-whitelist" | "limit-allowlist" => {
                    let entries = list(value);
                    if entries.is_empty() {
                        bad(report, "lists no address or network");
                    }
                    for c in entries {
                        match masked_cidr(&c) {
                            Ok(m) if !limit_exempt.contains(&m) => limit_exempt.push(m),
                            Ok(_) => {}
                            Err(e) => report.warn(
                                "InvalidAnnotation",
                                format!(
                                    "{key}: {e}; this entry is not exempt (the limits still \
                                     apply to it), the other entries are"
                                ),
                            ),
                        }
                    }
                }
                "whitelist-source-range" | "allowlist-source-range" | "denylist-source-range" => {
                    let mut ok = Vec::new();
                    let entries = list(value);
                    if entries.is_empty() {
                        report.warn(
                            "InvalidAnnotation",
                            format!("{key}: {value:?} lists no address or network"),
                        );
                    }
                    for c in entries {
                        match masked_cidr(&c) {
                            Ok(m) => ok.push(m),
                            Err(e) => {
                                let fate = if params.ignore_unsupported_security_annotations {
                                    "this entry is ignored (the operator chose to ignore \
                                     what cannot be honoured)"
                                } else {
                                    "the Ingress's paths answer 403 until it is fixed"
                                };
                                report.warn("InvalidAnnotation", format!("{key}: {e}; {fate}"));
                                bad_access.push(format!("{key} entry {c:?}"));
                            }
                        }
                    }
                    if name == "denylist-source-range" {
                        access.deny.extend(ok);
                    } else if ok.is_empty() {
                        // Dropping every entry of an allow list would leave no list: everyone
                        // allowed. That is never what was asked, so this refuses even when the
                        // operator chose to ignore entries that cannot be honoured.
                        report.warn(
                            "InvalidAnnotation",
                            format!(
                                "{key}: no usable entry in {value:?}; the Ingress's paths answer \
                                 403 until it is fixed"
                            ),
                        );
                        empty_allow.push(key.clone());
                    } else {
                        access.allow.extend(ok);
                    }
                }
                "affinity" => match value.trim() {
                    "cookie" => affinity = true,
                    "" | "none" => {}
                    _ => bad(report, "is not \"cookie\""),
                },
                "affinity-mode"
                | "session-cookie-name"
                | "session-cookie-path"
                | "session-cookie-max-age"
                | "session-cookie-expires"
                | "session-cookie-secure"
                | "session-cookie-samesite" => {}
                "upstream-hash-by" => {
                    let v = value.trim();
                    let on = match v {
                        "$remote_addr" | "$binary_remote_addr" => Some(HashOn::ClientIp),
                        _ => v
                            .strip_prefix("$http_")
                            .map(|h| HashOn::Header(h.replace('_', "-").to_ascii_lowercase()))
                            .or_else(|| {
                                v.strip_prefix("$cookie_")
                                    .map(|c| HashOn::Cookie(c.to_string()))
                            }),
                    };
                    match on {
                        Some(HashOn::Header(n) | HashOn::Cookie(n)) if !is_token(&n) => {
                            bad(report, "does not name a valid header or cookie")
                        }
                        Some(on) => {
                            a.hash = Some(HashPolicy {
                                on,
                                algorithm: HashAlgorithm::RingHash,
                            })
                        }
                        None => report.warn(
                            "UnsupportedAnnotation",
                            format!(
                                "{key}: {v:?} is not supported (only $remote_addr, \
                                 $binary_remote_addr, $http_<header> and $cookie_<name>); ignored"
                            ),
                        ),
                    }
                }
                "auth-type" => match value.trim() {
                    "basic" => basic = true,
                    "digest" => {
                        report.warn(
                            "UnsupportedSecurityAnnotation",
                            format!(
                                "{key}: digest authentication is not implemented; the Ingress's \
                                 paths answer 503 rather than being served without it"
                            ),
                        );
                        auth_failures.push(format!("{key}: digest is not implemented"));
                    }
                    _ => {
                        report.warn(
                            "InvalidAnnotation",
                            format!(
                                "{key}: {:?} is not \"basic\" or \"digest\"; the Ingress's paths \
                                 answer 503 rather than being served without authentication",
                                truncate(value)
                            ),
                        );
                        auth_failures.push(format!("{key} is not basic or digest"));
                    }
                },
                // Read with `auth-type` (below).
                "auth-secret" | "auth-secret-type" | "auth-realm" => {}
                // Read with `auth-tls-secret` (below).
                n if AUTH_TLS.contains(&n) => {}
                // Read with `proxy-ssl-secret` (below).
                n if PROXY_SSL.contains(&n) => {}
                // Read with `auth-url` (below).
                "auth-url"
                | "auth-method"
                | "auth-signin"
                | "auth-signin-redirect-param"
                | "auth-response-headers"
                | "auth-request-redirect"
                | "auth-always-set-cookie" => {}
                "auth-cache-key" | "auth-cache-duration" => report.warn(
                    "UnsupportedAnnotation",
                    format!(
                        "{key} is not applied: auth answers are not cached, every request is \
                         asked (stricter than the cache)"
                    ),
                ),
                n if n.starts_with("auth-keepalive") => report.warn(
                    "UnsupportedAnnotation",
                    format!(
                        "{key} is not applied: connections to the auth service are kept alive \
                         anyway"
                    ),
                ),
                "canary" => a.canary = flag(report),
                "canary-weight" => match value.trim().parse::<u32>() {
                    Ok(w) => a.canary_weight = w,
                    Err(_) => bad(report, "is not a whole number"),
                },
                "canary-weight-total" => match value.trim().parse::<u32>() {
                    Ok(w) if w > 0 => a.canary_weight_total = w,
                    _ => bad(report, "is not a positive whole number"),
                },
                "canary-by-header" => match http::HeaderName::from_bytes(value.trim().as_bytes()) {
                    Ok(h) => a.canary_select.header = Some(h.as_str().to_string()),
                    Err(_) => bad(report, "is not a header name"),
                },
                "canary-by-header-value" => {
                    if value.is_empty() || http::HeaderValue::from_str(value).is_err() {
                        bad(report, "is not a header value");
                    } else {
                        a.canary_select.header_value = Some(value.clone());
                    }
                }
                // Compiled with the route: one that does not compile is reported there.
                "canary-by-header-pattern" => a.canary_select.header_pattern = Some(value.clone()),
                "canary-by-cookie" => {
                    let v = value.trim();
                    // An RFC 6265 cookie name is a token, as `session-cookie-name` checks.
                    if is_token(v) {
                        a.canary_select.cookie = Some(v.to_string());
                    } else {
                        bad(report, "is not a cookie name");
                    }
                }
                n if n.ends_with("snippet") => {
                    if params.ignore_snippets {
                        report.warn(
                            "SnippetIgnored",
                            format!(
                                "{key} is not applied: snippets inject raw proxy configuration, \
                                 which Sweety never runs; the operator chose to serve the \
                                 Ingress without it"
                            ),
                        );
                    } else {
                        report.warn(
                            "SnippetRefused",
                            format!(
                                "{key}: snippets inject raw proxy configuration, which Sweety \
                                 never runs; the whole Ingress answers 503 until the annotation \
                                 is removed (or the operator sets ignoreSnippets)"
                            ),
                        );
                        snippets.push(key.clone());
                    }
                }
                // Allowed per class, as ingress-nginx's `--enable-ssl-passthrough`; asked for
                // on a class that does not allow it (or unreadable), the Ingress is refused
                // rather than Sweety terminating TLS the backend was to terminate.
                "ssl-passthrough" => match truthy(value) {
                    Some(false) => {}
                    Some(true) if class.ssl_passthrough => a.ssl_passthrough = true,
                    v => {
                        let why = if v.is_none() {
                            format!("{key}: {value:?} is not \"true\" or \"false\"")
                        } else {
                            format!(
                                "{key} is not enabled for the Ingress's class (its \
                                 SweetyProxyConfig's ingress.sslPassthrough, as ingress-nginx's \
                                 --enable-ssl-passthrough)"
                            )
                        };
                        if params.ignore_unsupported_security_annotations {
                            report.warn(
                                "SSLPassthroughNotEnabled",
                                format!(
                                    "{why}; the operator chose to serve the Ingress with TLS \
                                     terminated here instead"
                                ),
                            );
                        } else {
                            report.warn(
                                "SSLPassthroughNotEnabled",
                                format!(
                                    "{why}; the Ingress's paths answer 403 rather than TLS the \
                                     backend was to terminate being terminated here"
                                ),
                            );
                            passthrough_refused = Some(why);
                        }
                    }
                },
                // A security annotation set to "false" (`enable-modsecurity`, ingress-nginx's
                // default) asks for nothing; any other value asks for what Sweety does not
                // implement, an unreadable one too.
                n if is_security(n) && truthy(value) != Some(false) => {
                    if params.ignore_unsupported_security_annotations {
                        report.warn(
                            "UnsupportedSecurityAnnotation",
                            format!(
                                "{key} is not implemented by Sweety; the operator chose to serve \
                                 the Ingress WITHOUT this protection"
                            ),
                        );
                    } else {
                        report.warn(
                            "UnsupportedSecurityAnnotation",
                            format!(
                                "{key} is not implemented by Sweety; the Ingress's paths answer \
                                 403 rather than being served without this protection"
                            ),
                        );
                        unsupported_security.push(key.clone());
                    }
                }
                n if is_security(n) => {}
                // Read by the translator with the Ingress's hosts (ownership decides).
                "server-alias" => {
                    for why in server_aliases(ing).1 {
                        report.warn(
                            "InvalidAnnotation",
                            format!("{key}: {why}; this alias is ignored"),
                        );
                    }
                }
                "from-to-www-redirect" => {
                    flag(report);
                }
                "upstream-vhost" => match upstream_vhost(value) {
                    Ok(h) => a.upstream_vhost = Some(h),
                    Err(why) => bad(report, &why),
                },
                "x-forwarded-prefix" => match forwarded_prefix(value) {
                    Ok(v) => a.forwarded_prefix = Some(v),
                    Err(why) => bad(report, &why),
                },
                "custom-http-errors" => match sweety_config::error_pages::parse_codes(value) {
                    Ok(codes) => a.custom_errors = codes,
                    Err(why) => report.warn(
                        "InvalidAnnotation",
                        format!("{key}: {:?}: {why}; ignored", truncate(value)),
                    ),
                },
                "default-backend" => match service_name(value) {
                    Ok(n) => a.default_backend = Some(n),
                    Err(why) => report.warn(
                        "InvalidAnnotation",
                        format!("{key}: {:?} {why}; ignored", truncate(value)),
                    ),
                },
                "service-upstream" => a.service_upstream = flag(report),
                // Read together (below, [`next_upstream`]).
                "proxy-next-upstream"
                | "proxy-next-upstream-tries"
                | "proxy-next-upstream-timeout" => {}
                // Request bodies stream to the backend and are never spooled to disk: there is
                // no buffer to size. The value is checked so that a typo is reported.
                "client-body-buffer-size" => {
                    if nginx_size(value).is_none() {
                        bad(report, "is not a size (bytes, or a number with k, m or g)");
                    }
                }
                "proxy-body-size" => match nginx_size(value) {
                    Some(n) => a.body_size = Some(n),
                    None => bad(report, "is not a size (bytes, or a number with k, m or g)"),
                },
                _ => report.warn(
                    "UnsupportedAnnotation",
                    format!("{key} is not supported and is ignored"),
                ),
            }
        }
        let sel = &mut a.canary_select;
        if sel.header.is_none() && (sel.header_value.is_some() || sel.header_pattern.is_some()) {
            report.warn(
                "InvalidAnnotation",
                format!(
                    "{PREFIX}canary-by-header-value and -pattern need {PREFIX}canary-by-header \
                     (the header's name); ignored"
                ),
            );
            sel.header_value = None;
            sel.header_pattern = None;
        } else if sel.header_value.is_some() && sel.header_pattern.take().is_some() {
            report.warn(
                "InvalidAnnotation",
                format!(
                    "{PREFIX}canary-by-header-pattern is ignored: \
                     {PREFIX}canary-by-header-value is set (as in ingress-nginx)"
                ),
            );
        }
        if cors_enabled {
            let mut cors = Cors {
                allow_origins: list(get("cors-allow-origin").unwrap_or("*")),
                allow_methods: list(get("cors-allow-methods").unwrap_or(CORS_METHODS)),
                allow_headers: list(get("cors-allow-headers").unwrap_or(CORS_HEADERS)),
                expose_headers: list(get("cors-expose-headers").unwrap_or("")),
                allow_credentials: get("cors-allow-credentials")
                    .and_then(truthy)
                    .unwrap_or(true),
                max_age: Some(1_728_000),
            };
            if let Some(v) = get("cors-max-age") {
                match v.trim().parse::<u64>() {
                    Ok(n) => cors.max_age = Some(n),
                    Err(_) => report.warn(
                        "InvalidAnnotation",
                        format!("{PREFIX}cors-max-age: {v:?} is not a number of seconds; ignored"),
                    ),
                }
            }
            let (ok, bad): (Vec<_>, Vec<_>) =
                cors.allow_origins.into_iter().partition(|o| origin_ok(o));
            cors.allow_origins = ok;
            if !bad.is_empty() {
                report.warn(
                    "InvalidAnnotation",
                    format!("{PREFIX}cors-allow-origin: origins {bad:?} are not \"*\" or scheme://host[:port]; ignored"),
                );
            }
            for l in [
                &mut cors.allow_methods,
                &mut cors.allow_headers,
                &mut cors.expose_headers,
            ] {
                l.retain(|t| is_token(t));
            }
            if cors.allow_credentials && cors.allow_origins.iter().any(|o| o == "*") {
                // Browsers refuse credentials with a wildcard origin anyway.
                cors.allow_credentials = false;
                if get("cors-allow-credentials").and_then(truthy) == Some(true) {
                    report.warn(
                        "InvalidAnnotation",
                        format!("{PREFIX}cors-allow-credentials is ignored with origin \"*\""),
                    );
                }
            }
            if cors.allow_origins.is_empty() {
                report.warn(
                    "InvalidAnnotation",
                    "no valid CORS origin; CORS not enabled",
                );
            } else {
                a.cors = Some(cors);
            }
        }
        for (k, default_code) in [("permanent-redirect", 301), ("temporal-redirect", 302)] {
            if let Some(url) = get(k) {
                let code = if k == "permanent-redirect" {
                    redirect_code.unwrap_or(default_code)
                } else {
                    default_code
                };
                match parse_redirect_url(url.trim(), code) {
                    Some(r) if a.redirect.is_none() => a.redirect = Some(r),
                    Some(_) => report.warn(
                        "InvalidAnnotation",
                        format!("{PREFIX}{k} ignored: permanent-redirect is already set"),
                    ),
                    None => report.warn(
                        "InvalidAnnotation",
                        format!(
                            "{PREFIX}{k}: {url:?} is not http(s)://host[:port][/path]; ignored"
                        ),
                    ),
                }
            }
        }
        let ns = ing.metadata.namespace.as_deref().unwrap_or("default");
        let ing_name = ing.metadata.name.as_deref().unwrap_or("");
        for (n, period, unit) in [(rps, 1, "rps"), (rpm, 60, "rpm")] {
            let Some(n) = n else { continue };
            a.rate_limits.push(RateLimit {
                key: RateLimitKey::ClientIp,
                requests: n,
                period: Duration::from_secs(period),
                // ingress-nginx allows a burst of rate × multiplier, without delay.
                burst: n.saturating_mul(burst_multiplier).saturating_sub(n),
                max_keys: 65_536,
                zone: Some(format!("ingress-nginx/{ns}/{ing_name}/{unit}")),
                status: class.limit_req_status,
                exempt: limit_exempt.clone(),
            });
        }
        if !access.allow.is_empty() || !access.deny.is_empty() {
            a.ip_access = Some(access);
        }
        a.concurrency = connections.map(|max| ConcurrencyLimit {
            key: RateLimitKey::ClientIp,
            max,
            zone: Some(format!("ingress-nginx/{ns}/{ing_name}/connections")),
            status: class.limit_conn_status,
            exempt: limit_exempt.clone(),
        });
        if affinity {
            a.session = Some(session_cookie(&get, report));
        }
        a.retry = next_upstream(&get, report);
        if get("auth-url").is_some() {
            match external_auth(&get) {
                Ok(f) => a.external_auth = Some(f),
                Err(why) => {
                    report.warn(
                        "AuthInvalid",
                        format!(
                            "external authentication: {why}; the Ingress's paths answer 503 \
                             until it is fixed"
                        ),
                    );
                    auth_failures.push(why);
                }
            }
        } else if let Some(k) = all.keys().find(|k| {
            matches!(
                k.strip_prefix(PREFIX),
                Some(
                    "auth-method"
                        | "auth-signin"
                        | "auth-signin-redirect-param"
                        | "auth-response-headers"
                        | "auth-request-redirect"
                        | "auth-always-set-cookie"
                )
            )
        }) {
            report.warn(
                "UnsupportedAnnotation",
                format!(
                    "{k} without {PREFIX}auth-url is ignored (as ingress-nginx does): no \
                     external authentication is set up"
                ),
            );
        }
        if basic {
            match basic_auth(&get, ns, secrets, report) {
                Ok((f, set)) => {
                    a.basic_auth = Some(f);
                    a.user_set = Some(set);
                }
                Err(why) => {
                    report.warn(
                        "AuthSecretInvalid",
                        format!(
                            "{PREFIX}auth-type basic: {why}; the Ingress's paths answer 503 \
                             until it is fixed"
                        ),
                    );
                    auth_failures.push(why);
                }
            }
        } else if all.keys().any(|k| {
            matches!(
                k.strip_prefix(PREFIX),
                Some("auth-secret" | "auth-secret-type" | "auth-realm")
            )
        }) && get("auth-type").is_none()
        {
            report.warn(
                "UnsupportedAnnotation",
                format!(
                    "{PREFIX}auth-secret/auth-realm without auth-type are ignored (as \
                     ingress-nginx does): no authentication is set up"
                ),
            );
        }
        if get("auth-tls-secret").is_some() {
            match client_tls(&get, ns, secrets, report) {
                Ok(c) => a.client_tls = c,
                Err(why) => {
                    report.warn(
                        "AuthTLSInvalid",
                        format!(
                            "client certificates (auth-tls-*): {why}; the Ingress's paths \
                             answer 503 until it is fixed"
                        ),
                    );
                    auth_failures.push(why);
                }
            }
        } else if all.keys().any(|k| {
            k.strip_prefix(PREFIX)
                .is_some_and(|n| AUTH_TLS.contains(&n))
        }) {
            report.warn(
                "AuthTLSIgnored",
                format!(
                    "{PREFIX}auth-tls-* without auth-tls-secret are ignored (as ingress-nginx \
                     does): no client certificate is asked for"
                ),
            );
        }
        // `proxy-ssl-*`: a failure fails closed whatever the backend protocol, as ingress-nginx
        // denies the location when its parser fails.
        let mut tls_failures: Vec<String> = Vec::new();
        if let Some(why) = proxy_ssl_ciphers(get("proxy-ssl-ciphers")) {
            tls_failures.push(why);
        }
        if get("proxy-ssl-secret").is_some() {
            match proxy_ssl(&get, ns, secrets, report) {
                Ok(t) => a.proxy_ssl = Some(t),
                Err(why) => tls_failures.push(why),
            }
        } else if get("proxy-ssl-verify").map(str::trim) == Some("on") {
            tls_failures.push(format!(
                "{PREFIX}proxy-ssl-verify is on without {PREFIX}proxy-ssl-secret (whose ca.crt \
                 the backend is verified against)"
            ));
        } else if let Some(k) = all.keys().find(|k| {
            k.strip_prefix(PREFIX)
                .is_some_and(|n| PROXY_SSL.contains(&n) && n != "proxy-ssl-ciphers")
        }) {
            report.warn(
                "ProxySSLIgnored",
                format!(
                    "{k} without {PREFIX}proxy-ssl-secret is ignored (as ingress-nginx does): no \
                     backend TLS setting is applied"
                ),
            );
        }
        for why in &tls_failures {
            report.warn(
                "ProxySSLInvalid",
                format!(
                    "backend TLS (proxy-ssl-*): {why}; the Ingress's paths answer 503 until it is \
                     fixed"
                ),
            );
        }
        if !snippets.is_empty() {
            a.refuse = Some((
                503,
                format!(
                    "Ingress {ns}/{ing_name} is refused: {} carries raw proxy configuration, \
                     which Sweety never runs\n",
                    snippets.join(", ")
                ),
            ));
        } else if !auth_failures.is_empty() {
            a.refuse = Some((
                503,
                format!(
                    "Ingress {ns}/{ing_name} is refused: its authentication cannot be set up \
                     ({}); refusing rather than serving unprotected\n",
                    auth_failures.join("; ")
                ),
            ));
        } else if !tls_failures.is_empty() {
            a.refuse = Some((
                503,
                format!(
                    "Ingress {ns}/{ing_name} is refused: its backend TLS cannot be set up ({}); \
                     refusing rather than speaking to the backend without it\n",
                    tls_failures.join("; ")
                ),
            ));
        } else {
            let mut why: Vec<String> = Vec::new();
            if !params.ignore_unsupported_security_annotations {
                why.extend(
                    unsupported_security
                        .iter()
                        .map(|k| format!("{k} is not implemented")),
                );
                why.extend(bad_access.iter().map(|e| format!("{e} cannot be honoured")));
                why.extend(passthrough_refused);
            }
            why.extend(
                empty_allow
                    .iter()
                    .map(|k| format!("{k} has no usable entry")),
            );
            if !why.is_empty() {
                a.refuse = Some((
                    403,
                    format!(
                        "forbidden: Ingress {ns}/{ing_name} asks for protection this proxy \
                         cannot give ({}); refusing rather than serving unprotected\n",
                        why.join("; ")
                    ),
                ));
            }
        }
        if a.ssl_passthrough && a.refuse.is_none() {
            passthrough_protections(ing, params, &mut a, report);
        }
        a
    }

    /// Fail closed: when the Ingress is refused, `route` answers the refusal instead (its
    /// match is kept, its filters and backends are dropped).
    pub(crate) fn guard(&self, route: &mut Route) {
        if let Some((status, body)) = &self.refuse {
            route.filters.clear();
            route.timeouts = Default::default();
            route.retry = None;
            route.action = Action::Fixed(FixedResponse {
                status: *status,
                body: body.clone(),
                content_type: Some("text/plain; charset=utf-8".into()),
            });
        }
    }

    /// Apply IP lists, rate limits, rewrite, CORS, redirect and timeout to one path's route of
    /// a rule of `host` (empty: a rule without a host).
    pub(crate) fn apply(&self, route: &mut Route, host: &str, report: &mut Report) {
        if let Some(a) = &self.ip_access {
            route.filters.push(Filter::IpAccess(a.clone()));
        }
        for r in &self.rate_limits {
            route.filters.push(Filter::RateLimit(r.clone()));
        }
        if let Some(c) = &self.concurrency {
            route.filters.push(Filter::ConcurrencyLimit(c.clone()));
        }
        if let Some(b) = &self.basic_auth {
            route.filters.push(Filter::BasicAuth(b.clone()));
        }
        if let Some(e) = &self.external_auth {
            match auth_url_for_host(e, host) {
                Ok(f) => route.filters.push(Filter::ExternalAuth(f)),
                Err(why) => {
                    report.warn(
                        "AuthInvalid",
                        format!("external authentication: {why}; the rule's paths answer 503"),
                    );
                    let body = format!(
                        "{} is refused: its authentication cannot be set up ({why}); refusing \
                         rather than serving unprotected\n",
                        route.name
                    );
                    super::refuse_route(route, body);
                    return;
                }
            }
        }
        if let Some(target) = &self.rewrite_target {
            let m = route.matches.first_mut().and_then(|m| m.path.as_mut());
            let rewrite = match m {
                // nginx's `rewrite`: the groups of the match the router made (the same
                // case-insensitive regex, so `/API/x` is rewritten as it is routed).
                Some(PathMatch::Regex(r)) if target.contains('$') => {
                    sweety_config::check_substitution(target).map(|()| {
                        let rewrite = PathRewrite::Regex {
                            pattern: format!("^(?:{r})"),
                            substitution: target.clone(),
                        };
                        (None, rewrite)
                    })
                }
                _ if target.contains('$') => {
                    Err("capture groups need a regex path (pathType ImplementationSpecific)".into())
                }
                Some(PathMatch::Exact(_) | PathMatch::Regex(_)) => {
                    Ok((None, PathRewrite::Full(target.clone())))
                }
                _ => Ok((None, PathRewrite::Prefix(target.clone()))),
            };
            match rewrite {
                Ok((new_match, path)) => {
                    if let Some(nm) = new_match {
                        route.matches[0].path = Some(nm);
                    }
                    if target.starts_with('/') {
                        route.filters.push(Filter::Rewrite(UrlRewrite {
                            host: self.upstream_vhost.clone(),
                            path: Some(path),
                        }));
                    } else {
                        report.warn(
                            "InvalidAnnotation",
                            format!("{PREFIX}rewrite-target: {target:?} does not start with \"/\"; ignored"),
                        );
                    }
                }
                Err(why) => report.warn(
                    "UnsupportedAnnotation",
                    format!("{PREFIX}rewrite-target {target:?}: {why}; the path is not rewritten"),
                ),
            }
        }
        // `upstream-vhost` without a path rewrite (with one, it is part of that filter); a
        // redirect answers without asking the backend, so there is no Host to set.
        let rewrites = route
            .filters
            .iter()
            .any(|f| matches!(f, Filter::Rewrite(_)));
        if let (Some(h), false, None) = (&self.upstream_vhost, rewrites, &self.redirect) {
            route.filters.push(Filter::Rewrite(UrlRewrite {
                host: Some(h.clone()),
                path: None,
            }));
        }
        if let Some(v) = &self.forwarded_prefix {
            route
                .filters
                .push(Filter::RequestHeaders(sweety_config::HeaderModifier {
                    set: vec![sweety_config::HeaderValue {
                        name: "x-forwarded-prefix".into(),
                        value: v.clone(),
                    }],
                    ..Default::default()
                }));
        }
        if let Some(c) = &self.cors {
            route.filters.push(Filter::Cors(c.clone()));
        }
        if let Some(r) = &self.redirect {
            route.filters.push(Filter::Redirect(r.clone()));
        }
        let t = &self.proxy_timeouts;
        route.timeouts.connect = t.connect;
        route.timeouts.read_idle = t.read_idle;
        route.timeouts.send_idle = t.send_idle;
        if self.body_size.is_some() {
            route.max_request_body_bytes = self.body_size;
        }
        if self.retry.is_some() {
            route.retry = self.retry.clone();
        }
        self.guard(route);
    }
}

/// ingress-nginx's `proxy-next-upstream` default (its ConfigMap's), used when only `-tries`
/// or `-timeout` is set.
const NEXT_UPSTREAM_DEFAULT: &str = "error timeout";

/// ingress-nginx's `proxy-next-upstream-tries` default (its ConfigMap's).
const NEXT_UPSTREAM_TRIES_DEFAULT: u32 = 3;

/// The most tries of a request (the first included): the dataplane's most retry attempts
/// (sweety-config's validation, 10) plus the first.
pub const MAX_NEXT_UPSTREAM_TRIES: u32 = 11;

/// The route's retry policy from `proxy-next-upstream` (space-separated nginx tokens),
/// `proxy-next-upstream-tries` (the tries in all) and `proxy-next-upstream-timeout` (the
/// policy's `budget`), read through `get`; None when none is set, with `off`, with a single try, or when no token asks for anything.
///
/// | nginx token                          | Sweety                                          |
/// |--------------------------------------|-------------------------------------------------|
/// | `error`, `timeout`, `invalid_header` | connect / TLS / timeout / protocol errors       |
/// | `http_500` … `http_429`              | that status ([`RetryPolicy::codes`])            |
/// | `non_idempotent`                     | refused (Event): never sends a POST twice       |
/// | `off`                                | no retry                                        |
///
/// The dataplane retries a request only when that is safe: an idempotent one whose body it
/// could keep, or any request that never reached the backend. It cannot retry on statuses
/// without also retrying errors, so any policy retries errors. No backoff (nginx has none).
fn next_upstream<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    report: &mut Report,
) -> Option<RetryPolicy> {
    let (tokens, tries) = (get("proxy-next-upstream"), get("proxy-next-upstream-tries"));
    let timeout = get("proxy-next-upstream-timeout");
    if tokens.is_none() && tries.is_none() && timeout.is_none() {
        return None;
    }
    let max = sweety_config::MAX_IDLE_TIMEOUT.get().as_secs();
    let budget = match timeout.map(str::trim) {
        None => None,
        Some(v) => match v.parse::<u64>() {
            Ok(0) => None,
            Ok(n) if n <= max => Some(Duration::from_secs(n)),
            _ => {
                report.warn(
                    "InvalidAnnotation",
                    format!(
                        "{PREFIX}proxy-next-upstream-timeout: {:?} is not a whole number of \
                         seconds up to {max}; the tries have no time limit",
                        truncate(v)
                    ),
                );
                None
            }
        },
    };
    let tries = match tries.map(str::trim) {
        None => NEXT_UPSTREAM_TRIES_DEFAULT,
        // nginx: no limit; the dataplane's most.
        Some("0") => MAX_NEXT_UPSTREAM_TRIES,
        // A count past u32 is still a count: the most.
        Some(v) if !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()) => v
            .parse::<u32>()
            .map_or(MAX_NEXT_UPSTREAM_TRIES, |n| n.min(MAX_NEXT_UPSTREAM_TRIES)),
        Some(v) => {
            report.warn(
                "InvalidAnnotation",
                format!(
                    "{PREFIX}proxy-next-upstream-tries: {:?} is not a whole number; \
                     {NEXT_UPSTREAM_TRIES_DEFAULT} is used (as ingress-nginx)",
                    truncate(v)
                ),
            );
            NEXT_UPSTREAM_TRIES_DEFAULT
        }
    };
    let mut errors = false;
    let mut off = false;
    let mut codes: Vec<u16> = Vec::new();
    for t in tokens.unwrap_or(NEXT_UPSTREAM_DEFAULT).split_whitespace() {
        match t {
            "error" | "timeout" | "invalid_header" => errors = true,
            "http_500" | "http_502" | "http_503" | "http_504" | "http_403" | "http_404"
            | "http_429" => {
                let code: u16 = t["http_".len()..].parse().expect("three digits");
                if !codes.contains(&code) {
                    codes.push(code);
                }
            }
            "off" => off = true,
            "non_idempotent" => report.warn(
                "InvalidAnnotation",
                format!(
                    "{PREFIX}proxy-next-upstream: non_idempotent is refused: a request that is \
                     not idempotent (POST, PATCH) is never sent twice (only when it never reached \
                     the backend); the other tokens apply"
                ),
            ),
            other => report.warn(
                "InvalidAnnotation",
                format!(
                    "{PREFIX}proxy-next-upstream: {:?} is not error, timeout, invalid_header, \
                     http_500, http_502, http_503, http_504, http_403, http_404, http_429 or \
                     off; ignored",
                    truncate(other)
                ),
            ),
        }
    }
    if off {
        if errors || !codes.is_empty() {
            report.warn(
                "InvalidAnnotation",
                format!(
                    "{PREFIX}proxy-next-upstream: off is given with other tokens; nothing is \
                     retried"
                ),
            );
        }
        return None;
    }
    if (!errors && codes.is_empty()) || tries <= 1 {
        return None;
    }
    codes.sort_unstable();
    Some(RetryPolicy {
        attempts: tries - 1,
        codes,
        backoff: None,
        budget,
    })
}

/// The cookie session persistence of `affinity: cookie` from the `session-cookie-*`
/// annotations (read through `get`); invalid values are reported and left at the default.
fn session_cookie<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    report: &mut Report,
) -> SessionPersistence {
    let mut s = SessionPersistence {
        kind: SessionKind::Cookie,
        name: "INGRESSCOOKIE".into(),
        ttl: None,
        path: None,
        secure: false,
        http_only: true,
        same_site: None,
    };
    let mut warn = |k: &str, v: &str, why: &str| {
        report.warn(
            "InvalidAnnotation",
            format!("{PREFIX}{k}: {v:?} {why}; ignored"),
        )
    };
    if let Some(v) = get("session-cookie-name") {
        if is_token(v.trim()) {
            s.name = v.trim().to_string();
        } else {
            warn("session-cookie-name", v, "is not a valid cookie name");
        }
    }
    if let Some(v) = get("session-cookie-path") {
        if v.starts_with('/') && !v.contains([';', ' ', ',']) {
            s.path = Some(v.to_string());
        } else {
            warn("session-cookie-path", v, "is not a path");
        }
    }
    for k in ["session-cookie-max-age", "session-cookie-expires"] {
        if let Some(v) = get(k) {
            match v.trim().parse::<u64>() {
                Ok(n) if n > 0 => s.ttl = s.ttl.or(Some(Duration::from_secs(n))),
                _ => warn(k, v, "is not a positive number of seconds"),
            }
        }
    }
    if let Some(v) = get("session-cookie-secure") {
        s.secure = truthy(v).unwrap_or(false);
    }
    if let Some(v) = get("session-cookie-samesite") {
        match v.trim() {
            "None" | "Lax" | "Strict" => s.same_site = Some(v.trim().to_string()),
            _ => warn("session-cookie-samesite", v, "is not None, Lax or Strict"),
        }
    }
    s
}

impl Annotations {
    /// `service-upstream: "true"`: a variant of the backend `name` (the Service
    /// `namespace/service`, port `port`) whose one endpoint is the Service's ClusterIP and
    /// port, as ingress-nginx's `proxy_pass` to the Service (kube-proxy balances); named
    /// `<name>~service-upstream` so other Ingresses of the Service keep its endpoints. A Service
    /// without a ClusterIP (headless, ExternalName) keeps its endpoints, with a
    /// `ServiceUpstreamIgnored` Event, as ingress-nginx falls back.
    pub(crate) fn service_upstream_variant(
        &self,
        b: &mut Builder<'_>,
        (namespace, service, port): (&str, &str, Option<&crate::translate::backends::PortRef>),
        name: String,
        report: &mut Report,
    ) -> String {
        if !self.service_upstream {
            return name;
        }
        let Ok((svc, sp)) = b.services.port(namespace, service, port) else {
            return name;
        };
        let (Some(base), Ok(port)) = (b.backends.get(&name), u16::try_from(sp.port)) else {
            return name;
        };
        let ip = svc
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok());
        let Some(ip) = ip else {
            report.warn(
                "ServiceUpstreamIgnored",
                format!(
                    "{PREFIX}service-upstream: the Service {namespace}/{service} has no ClusterIP \
                     (headless or ExternalName); its endpoints are used (as ingress-nginx does)"
                ),
            );
            return name;
        };
        let mut variant = base.clone();
        variant.name = format!("{name}~service-upstream");
        variant.endpoints = vec![sweety_config::Endpoint {
            address: std::net::SocketAddr::new(ip, port).to_string(),
            weight: 1,
        }];
        let variant_name = variant.name.clone();
        b.backends.insert(variant);
        variant_name
    }

    /// `proxy-ssl-*`: a variant of the backend `name` with the Ingress's backend TLS (named
    /// `<backend>~proxy-ssl-<digest of the settings>`, so Ingresses of the same Service with
    /// other settings are unaffected), when the backend is spoken to over TLS; otherwise
    /// (ingress-nginx only applies `proxy_ssl_*` to `https://` upstreams) `name` unchanged and
    /// an Event.
    pub(crate) fn backend_tls_variant(
        &self,
        b: &mut Builder<'_>,
        name: String,
        report: &mut Report,
    ) -> String {
        let Some(tls) = &self.proxy_ssl else {
            return name;
        };
        let Some(base) = b.backends.get(&name) else {
            return name;
        };
        if !matches!(base.protocol, BackendProtocol::Https | BackendProtocol::H2) {
            report.warn(
                "ProxySSLIgnored",
                format!(
                    "{PREFIX}proxy-ssl-* apply to backends spoken to over TLS; {name} is not \
                     ({PREFIX}backend-protocol is not HTTPS or GRPCS), so they are not used (as \
                     in ingress-nginx)"
                ),
            );
            return name;
        }
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(format!("{tls:?}").as_bytes());
        let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        let mut variant = base.clone();
        variant.tls = Some(tls.clone());
        variant.name = format!("{name}~proxy-ssl-{hex}");
        let variant_name = variant.name.clone();
        b.backends.insert(variant);
        variant_name
    }

    /// The backend to use for `name` given the affinity and hash annotations: `name` itself,
    /// or a variant of it registered with session persistence (preferred) or a hash policy.
    /// Variants differing in cookie settings get distinct names.
    pub(crate) fn balanced_backend(&self, b: &mut Builder<'_>, name: String) -> String {
        if self.session.is_none() && self.hash.is_none() {
            return name;
        }
        let Some(base) = b.backends.get(&name) else {
            return name;
        };
        let mut variant = base.clone();
        let variant_name = if let Some(s) = &self.session {
            variant.session_persistence = Some(s.clone());
            let attrs = format!("{:?}", (s.ttl, &s.path, s.secure, &s.same_site));
            let h = attrs
                .bytes()
                .fold(0u32, |h, c| h.wrapping_mul(31).wrapping_add(u32::from(c)));
            format!("{name}~affinity={}~{h:08x}", s.name)
        } else {
            let h = self.hash.as_ref().expect("checked above");
            variant.hash = Some(h.clone());
            match &h.on {
                HashOn::ClientIp => format!("{name}~hash=client-ip"),
                HashOn::Header(n) => format!("{name}~hash=header:{n}"),
                HashOn::Cookie(n) => format!("{name}~hash=cookie:{n}"),
            }
        };
        variant.name = variant_name.clone();
        b.backends.insert(variant);
        variant_name
    }
}

/// The Service name of a `default-backend` annotation: a DNS-1035 label (ingress-nginx's
/// `ValidateServiceName`), read in the Ingress's own namespace only.
fn service_name(value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.contains('/') {
        return Err(
            "names a Service of another namespace; only the Ingress's own namespace \
                    is used"
                .into(),
        );
    }
    let ok = !v.is_empty()
        && v.len() <= 63
        && v.starts_with(|c: char| c.is_ascii_lowercase())
        && !v.ends_with('-')
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(v.to_string())
    } else {
        Err("is not a Service name".into())
    }
}

/// The HTTP→HTTPS redirect of `ssl-redirect` (308, as ingress-nginx).
pub fn https_redirect() -> Redirect {
    Redirect {
        scheme: Some("https".into()),
        status: 308,
        ..Default::default()
    }
}

/// The regex flag of nginx's `~*` locations, which ingress-nginx writes for every path of a
/// host with a regex path: case-insensitive.
pub const CASE_INSENSITIVE: &str = "(?i)";

/// An ingress-nginx regex location (`location ~* "^<path>"`): case-insensitive, matched from
/// the start of the path only (the router matches whole paths, so `.*` is added unless the
/// regex ends in `$`).
pub fn anchor_regex(path: &str) -> String {
    if path.ends_with('$') {
        format!("{CASE_INSENSITIVE}{path}")
    } else {
        format!("{CASE_INSENSITIVE}{path}.*")
    }
}

/// `from-to-www-redirect`: every request for `from` is redirected to `to`, keeping the
/// scheme, port, path and query, with ingress-nginx's `http-redirect-code` default, 308.
pub(crate) fn www_redirect_route(from: &str, to: &str) -> Route {
    redirect_route(
        format!("ingress/www-redirect/{from}"),
        Redirect {
            host: Some(to.to_string()),
            status: 308,
            ..Default::default()
        },
    )
}

/// A route of every path that answers `redirect` (its status is the fixed answer's too).
pub(crate) fn redirect_route(name: String, redirect: Redirect) -> Route {
    let status = redirect.status;
    Route {
        name,
        matches: Vec::new(),
        filters: vec![Filter::Redirect(redirect)],
        action: Action::Fixed(FixedResponse {
            status,
            body: String::new(),
            content_type: None,
        }),
        timeouts: Default::default(),
        retry: None,
        max_request_body_bytes: None,
    }
}

/// `app-root`: `/` redirects (302) to the application root.
pub(crate) fn app_root_route(ns: &str, name: &str, rule: usize, root: &str) -> PathRoute {
    PathRoute {
        route: Route {
            name: format!("ingress/{ns}/{name}/rule-{rule}/app-root"),
            matches: vec![RouteMatch {
                path: Some(PathMatch::Exact("/".into())),
                ..Default::default()
            }],
            filters: vec![Filter::Redirect(Redirect {
                path: Some(PathRewrite::Full(root.into())),
                status: 302,
                ..Default::default()
            })],
            action: Action::Fixed(FixedResponse {
                status: 302,
                body: String::new(),
                content_type: None,
            }),
            timeouts: Default::default(),
            retry: None,
            max_request_body_bytes: None,
        },
        http_redirect: None,
        force_redirect: false,
        path: "/".into(),
        path_type: "Exact".into(),
        regex: false,
        namespace: ns.into(),
    }
}

/// In a host with a regex path, every prefix path becomes a regex too and routes are ordered
/// by path length, longest first (ingress-nginx's order), so prefixes do not shadow regexes.
pub(crate) fn order_regex_host(routes: &mut [PathRoute]) {
    if !routes.iter().any(|r| r.regex) {
        return;
    }
    for r in routes.iter_mut() {
        // A prefix rewrite (`rewrite-target` without `$`) follows its match: the same
        // case-insensitive prefix, as a regex rewrite ([`case_insensitive_prefix_rewrite`]).
        let prefix = match r.route.matches.first().and_then(|m| m.path.as_ref()) {
            Some(PathMatch::Prefix(p)) => Some(p.clone()),
            _ => None,
        };
        for f in &mut r.route.filters {
            if let (
                Some(p),
                Filter::Rewrite(UrlRewrite {
                    path: Some(rw @ PathRewrite::Prefix(_)),
                    ..
                }),
            ) = (&prefix, f)
            {
                if let PathRewrite::Prefix(target) = rw {
                    if let Some(regex) = case_insensitive_prefix_rewrite(p, target) {
                        *rw = regex;
                    }
                }
            }
        }
        for m in &mut r.route.matches {
            // Case-insensitive like the host's regex paths (nginx's `~*` for every location
            // of the host), so `/ADMIN` reaches the `/admin` route and its access rules.
            match &m.path {
                Some(PathMatch::Prefix(p)) => {
                    let trimmed = p.trim_end_matches('/');
                    m.path = Some(PathMatch::Regex(if trimmed.is_empty() {
                        "/.*".to_string()
                    } else {
                        format!("{CASE_INSENSITIVE}{}(/.*)?", regex_escape(trimmed))
                    }));
                    r.regex = true;
                }
                // nginx makes an Exact path `~* "^<path>"` there too; it stays exact here,
                // but without regard to case.
                Some(PathMatch::Exact(p)) => {
                    m.path = Some(PathMatch::Regex(format!(
                        "{CASE_INSENSITIVE}{}",
                        regex_escape(p)
                    )));
                    r.regex = true;
                }
                _ => {}
            }
        }
    }
    routes.sort_by_key(|r| std::cmp::Reverse(r.path.len()));
}

/// The prefix rewrite of `prefix` to `target` (the dataplane's `PathRewrite::Prefix`: `/v1/x`
/// with `/v1` → `/v2` becomes `/v2/x`, with `/v1` → `/` becomes `/x`) as a regex rewrite of
/// the whole path with the case-insensitive match [`order_regex_host`] gives the prefix, so
/// `/V1/x` is routed and rewritten alike (to `/v2/x`). None when `target` is no valid
/// substitution (it then stays a prefix rewrite).
fn case_insensitive_prefix_rewrite(prefix: &str, target: &str) -> Option<PathRewrite> {
    let p = regex_escape(prefix.trim_end_matches('/'));
    let t = target.trim_end_matches('/');
    let (pattern, substitution) = if t.is_empty() {
        // The rest without its leading `/`, so `/v1` and `/v1/` become `/`, `/v1/x` `/x`.
        (
            format!("^{CASE_INSENSITIVE}{p}(?:/(.*))?$"),
            "/$1".to_string(),
        )
    } else {
        (format!("^{CASE_INSENSITIVE}{p}(/.*)?$"), format!("{t}$1"))
    };
    sweety_config::check_substitution(&substitution).ok()?;
    Some(PathRewrite::Regex {
        pattern,
        substitution,
    })
}

/// Merge a canary Ingress into the primary routes of the same host and path.
pub(crate) fn merge_canary(
    b: &mut Builder<'_>,
    ing: &Ingress,
    ann: &Annotations,
    owners: &Hosts,
    hosts: &mut BTreeMap<String, Vec<PathRoute>>,
    report: &mut Report,
) {
    let ns = ing.metadata.namespace.clone().unwrap_or_default();
    if ann.refuse.is_some() {
        report.warn(
            "CanaryIgnored",
            "the canary is refused (see its other warnings); no traffic is sent to it",
        );
        return;
    }
    let total = ann.canary_weight_total;
    let weight = ann.canary_weight.min(total);
    let spec = ing.spec.clone().unwrap_or_default();
    for rule in spec.rules.as_deref().unwrap_or_default() {
        let host = rule.host.clone().unwrap_or_default();
        for p in rule
            .http
            .as_ref()
            .map(|h| h.paths.as_slice())
            .unwrap_or_default()
        {
            let path = p.path.clone().unwrap_or_else(|| "/".into());
            let host = host.to_ascii_lowercase();
            if let Err(r) = owners.ingress_may_serve(&host, &ns) {
                report.warn(
                    "CanaryWithoutPrimary",
                    format!(
                        "{}; a canary attaches only to a primary Ingress of its own namespace; \
                         canary ignored",
                        r.message
                    ),
                );
                continue;
            }
            let routes = hosts.get_mut(&host);
            let at = routes.as_ref().and_then(|routes| {
                routes
                    .iter()
                    .position(|r| r.path == path && r.path_type == p.path_type && r.namespace == ns)
            });
            let (Some(routes), Some(at)) = (routes, at) else {
                report.warn(
                    "CanaryWithoutPrimary",
                    format!(
                        "no primary Ingress of namespace {ns} serves host {host:?} path {path:?} \
                         ({}); canary ignored",
                        p.path_type
                    ),
                );
                continue;
            };
            let before = routes[at].clone();
            let Action::Proxy(proxy) = &mut routes[at].route.action else {
                report.warn(
                    "CanaryWithoutPrimary",
                    format!("the primary route for {host:?} {path:?} has no working backend; canary ignored"),
                );
                continue;
            };
            if proxy.backends.len() != 1 {
                report.warn(
                    "CanaryConflict",
                    format!("{host:?} {path:?} already has a canary; this one is ignored"),
                );
                continue;
            }
            match super::resolve_backend(b, &ns, &p.backend, ann, report) {
                Ok(name) => {
                    proxy.backends[0].weight = total - weight;
                    proxy.backends.push(WeightedBackend {
                        backend: name.clone(),
                        weight,
                        filters: Vec::new(),
                    });
                    // Header and cookie rules sit right after the primary: more header matches
                    // win over it in the router, and among them the earlier route wins.
                    let variants = canary_variants(&before, &name, &ann.canary_select, report);
                    for (k, v) in variants.into_iter().enumerate() {
                        routes.insert(at + 1 + k, v);
                    }
                }
                Err(why) => report.warn(
                    "CanaryIgnored",
                    format!("canary for {host:?} {path:?} ignored: {why}"),
                ),
            }
        }
    }
}

/// The routes `canary-by-header` / `canary-by-cookie` add beside `primary` (still with one
/// backend): the primary's matches each with one more header match, sending to `canary` or,
/// for `never`, to the primary's backend only. A rule the dataplane would refuse (a pattern
/// that does not compile) is left out and reported.
fn canary_variants(
    primary: &PathRoute,
    canary: &str,
    select: &CanarySelect,
    report: &mut Report,
) -> Vec<PathRoute> {
    let Action::Proxy(proxy) = &primary.route.action else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (suffix, condition, to_canary) in select.conditions() {
        let mut route = primary.route.clone();
        route.name = format!("{}/canary-{suffix}", primary.route.name);
        if route.matches.is_empty() {
            route.matches.push(RouteMatch::default());
        }
        for m in &mut route.matches {
            match &condition {
                CanaryCondition::Header(h) => m.headers.push(h.clone()),
                CanaryCondition::Cookie(c) => m.cookies.push(c.clone()),
            }
        }
        let backend = if to_canary {
            WeightedBackend {
                backend: canary.to_string(),
                weight: 1,
                filters: Vec::new(),
            }
        } else {
            WeightedBackend {
                weight: 1,
                ..proxy.backends[0].clone()
            }
        };
        route.action = Action::Proxy(ProxyAction {
            backends: vec![backend],
        });
        let warn = &mut |m: String| {
            report.warn(
                "CanaryIgnored",
                format!("canary-{suffix}: {m}; requests are not sent by it"),
            )
        };
        if let Some(route) = super::checked_route(route, warn) {
            out.push(PathRoute {
                route,
                ..primary.clone()
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backends the real dataplane router picks for a request (`name=weight`, joined).
    fn served_by(
        table: &sweety_dataplane::router::RouteTable,
        listener: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> String {
        let mut h = http::HeaderMap::new();
        for (k, v) in headers {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        let req = sweety_dataplane::router::RequestHead {
            listener,
            host,
            method: &http::Method::GET,
            path,
            query: None,
            headers: &h,
        };
        let sweety_dataplane::router::Lookup::Matched(m) = table.lookup(&req) else {
            panic!("{host}{path} {headers:?}: no route");
        };
        let Action::Proxy(p) = &m.entry.route.action else {
            panic!("{host}{path}: not a proxy route");
        };
        let b: Vec<String> = p
            .backends
            .iter()
            .map(|b| format!("{}={}", b.backend, b.weight))
            .collect();
        b.join(",")
    }

    #[test]
    fn canary_selectors_choose_by_header_then_cookie_then_weight() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/translate/ing-nginx-canary-by-header.in.yaml"
        ))
        .unwrap();
        let (snapshot, _) = crate::translate::Snapshot::from_yaml(&text).unwrap();
        let out = crate::translate::translate(&snapshot, &Params::default());
        let table = sweety_dataplane::router::RouteTable::build(&out.config).unwrap();
        let l = out.config.listeners[0].name.as_str();
        let at = |host: &str, path: &str, headers: &[(&str, &str)]| {
            served_by(&table, l, host, path, headers)
        };
        let (canary, primary, split) = (
            "app/web-v2:80=1",
            "app/web:80=1",
            "app/web:80=80,app/web-v2:80=20",
        );
        let app = "app.example.com";
        assert_eq!(at(app, "/", &[]), split);
        assert_eq!(at(app, "/x", &[("x-canary", "always")]), canary);
        assert_eq!(at(app, "/x", &[("x-canary", "never")]), primary);
        // Exact values only; anything else falls through to the cookie, then the weights.
        assert_eq!(at(app, "/", &[("x-canary", "ALWAYS")]), split);
        assert_eq!(
            at(
                app,
                "/",
                &[("x-canary", "maybe"), ("cookie", "a=1; canary=always")]
            ),
            canary
        );
        // The header decides before the cookie, both ways.
        assert_eq!(
            at(
                app,
                "/",
                &[("x-canary", "never"), ("cookie", "canary=always")]
            ),
            primary
        );
        assert_eq!(
            at(
                app,
                "/",
                &[("x-canary", "always"), ("cookie", "canary=never")]
            ),
            canary
        );
        assert_eq!(at(app, "/", &[("cookie", "canary=never; b=2")]), primary);
        // The first cookie of the name decides (nginx's `$cookie_canary`), quotes aside.
        assert_eq!(
            at(app, "/", &[("cookie", "canary=never; canary=always")]),
            primary
        );
        assert_eq!(at(app, "/", &[("cookie", "canary=\"always\"")]), canary);
        // One pair per Cookie header, as HTTP/2 clients send them.
        assert_eq!(
            at(app, "/", &[("cookie", "a=1"), ("cookie", "canary=always")]),
            canary
        );
        // Another cookie's name or value that merely contains ours does not count.
        assert_eq!(at(app, "/", &[("cookie", "xcanary=always")]), split);
        assert_eq!(at(app, "/", &[("cookie", "canary=alwaysx")]), split);
        assert_eq!(at(app, "/", &[("cookie", "a=canary=always")]), split);
        // canary-by-header-value: that value only, no `never`; no weight given: 0.
        let v = "value.example.com";
        assert_eq!(at(v, "/api", &[("x-tier", "beta")]), canary);
        assert_eq!(
            at(v, "/api", &[("x-tier", "always")]),
            "app/web:80=100,app/web-v2:80=0"
        );
        assert_eq!(
            at(v, "/api", &[("x-tier", "never")]),
            "app/web:80=100,app/web-v2:80=0"
        );
        // A pattern that does not compile adds no rule; the weighted split stays.
        let p = "pattern.example.com";
        assert_eq!(
            at(p, "/", &[("x-tier", "(beta")]),
            "app/web:80=95,app/web-v2:80=5"
        );
        let warned = |who: &str, reason: &str| {
            let key = crate::translate::status::ObjectKey {
                kind: "IngressEvent".into(),
                namespace: "app".into(),
                name: who.into(),
            };
            matches!(out.statuses.get(&key), Some(crate::translate::status::ObjectStatus::Conditions(c))
                if c.iter().any(|c| c.reason == reason))
        };
        assert!(warned("canary-pattern", "CanaryIgnored"));
        assert!(warned("canary-value", "InvalidAnnotation"));
        assert!(warned("canary-no-header", "InvalidAnnotation"));
        assert!(!warned("canary", "InvalidAnnotation") && !warned("canary", "CanaryIgnored"));
    }

    /// use-regex is case-insensitive (nginx's `~*`) for every path of the host, and the
    /// router, the rewrite's captures and the route's access rules agree on one match: the
    /// dataplane's own router and filters run over the translated config. Fails when the
    /// regexes are case-sensitive (`/ADMIN` then reaches the open catch-all, the rewrite of
    /// `/API/V2/x` does not happen).
    #[test]
    fn regex_hosts_match_without_regard_to_case() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/translate/ing-nginx-use-regex-case.in.yaml"
        ))
        .unwrap();
        let (snapshot, _) = crate::translate::Snapshot::from_yaml(&text).unwrap();
        let out = crate::translate::translate(&snapshot, &Params::default());
        let table = sweety_dataplane::router::RouteTable::build(&out.config).unwrap();
        let l = out.config.listeners[0].name.as_str();
        let host = "r.example.com";
        // The route a path reaches, whether it carries the allow list, and the path its
        // backend receives.
        let route = |path: &str| {
            let h = http::HeaderMap::new();
            let req = sweety_dataplane::router::RequestHead {
                listener: l,
                host,
                method: &http::Method::GET,
                path,
                query: None,
                headers: &h,
            };
            let sweety_dataplane::router::Lookup::Matched(m) = table.lookup(&req) else {
                panic!("{path}: no route");
            };
            let r = &m.entry.route;
            let guarded = r.filters.iter().any(|f| matches!(f, Filter::IpAccess(_)));
            let filters = sweety_dataplane::filters::CompiledFilters::compile(&r.filters).unwrap();
            let (mut parts, ()) = http::Request::get(path).body(()).unwrap().into_parts();
            let _ = filters.on_request(&mut parts, "http", 80, None);
            (r.name.clone(), guarded, parts.uri.path().to_string())
        };
        let admin = "ingress/app/admin/rule-0/path-0";
        let login = "ingress/app/admin/rule-0/path-1";
        let api = "ingress/app/guarded/rule-0/path-0";
        let open = "ingress/app/site/rule-0/path-0";
        for p in ["/admin", "/ADMIN", "/Admin/users", "/aDmIn/"] {
            assert_eq!(route(p), (admin.into(), true, p.into()), "{p}");
        }
        for p in ["/Login", "/login", "/LOGIN"] {
            assert_eq!(route(p), (login.into(), true, p.into()), "{p}");
        }
        assert_eq!(route("/api/v2/items"), (api.into(), true, "/items".into()));
        assert_eq!(route("/API/V2/Items"), (api.into(), true, "/Items".into()));
        assert_eq!(route("/Api/v10/a/b"), (api.into(), true, "/a/b".into()));
        // Not the guarded paths: the open catch-all, unchanged.
        for p in [
            "/administrator",
            "/login/x",
            "/apis",
            "/",
            "/stripped",
            "/v10",
        ] {
            assert_eq!(route(p), (open.into(), false, p.into()), "{p}");
        }
        // A prefix rewrite-target (no `$`) follows the same case-insensitive match: routed
        // and rewritten alike, with its access rules.
        let strip = "ingress/app/strip/rule-0/path-0";
        for (p, to) in [("/strip", "/"), ("/STRIP/", "/"), ("/Strip/A/b", "/A/b")] {
            assert_eq!(route(p), (strip.into(), true, to.into()), "{p}");
        }
        let moved = "ingress/app/moved/rule-0/path-0";
        for (p, to) in [("/v1", "/v2"), ("/V1/Items", "/v2/Items")] {
            assert_eq!(route(p), (moved.into(), false, to.into()), "{p}");
        }
    }

    /// `upstream-vhost` and `x-forwarded-prefix` reach the backend's request through the
    /// dataplane's own filters (with and without a rewrite-target); refused values leave the
    /// client's Host and no prefix header. Fails when either annotation is not applied.
    #[test]
    fn upstream_vhost_and_forwarded_prefix_reach_the_backend() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/translate/ing-nginx-upstream-vhost.in.yaml"
        ))
        .unwrap();
        let (snapshot, _) = crate::translate::Snapshot::from_yaml(&text).unwrap();
        let out = crate::translate::translate(&snapshot, &Params::default());
        let table = sweety_dataplane::router::RouteTable::build(&out.config).unwrap();
        let l = out.config.listeners[0].name.as_str();
        // (Host, X-Forwarded-Prefix, path) as the backend would receive them.
        let upstream = |host: &str, path: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(
                "x-forwarded-prefix",
                http::HeaderValue::from_static("/client"),
            );
            let req = sweety_dataplane::router::RequestHead {
                listener: l,
                host,
                method: &http::Method::GET,
                path,
                query: None,
                headers: &h,
            };
            let sweety_dataplane::router::Lookup::Matched(m) = table.lookup(&req) else {
                panic!("{host}{path}: no route");
            };
            let r = &m.entry.route;
            let filters = sweety_dataplane::filters::CompiledFilters::compile(&r.filters).unwrap();
            let (mut parts, ()) = http::Request::get(path)
                .header("host", host)
                .header("x-forwarded-prefix", "/client")
                .body(())
                .unwrap()
                .into_parts();
            let _ = filters.on_request(&mut parts, "http", 80, None);
            let get = |n: &str| {
                parts
                    .headers
                    .get(n)
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default()
            };
            (
                get("host"),
                get("x-forwarded-prefix"),
                parts.uri.path().to_string(),
            )
        };
        let t = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(
            upstream("a.example.com", "/x"),
            t("internal.example.com", "/shop", "/x")
        );
        assert_eq!(
            upstream("b.example.com", "/shop/cart"),
            t("internal.example.com", "/shop", "/cart")
        );
        // Refused values: the client's own Host and header pass unchanged.
        assert_eq!(
            upstream("c.example.com", "/x"),
            t("c.example.com", "/client", "/x")
        );
        assert_eq!(
            upstream("d.example.com", "/x"),
            t("d.example.com", "/client", "/x")
        );
        let events = format!("{:?}", out.statuses);
        for refused in [
            "upstream-vhost: \\\"internal.example.com:8080\\\" is not a host name",
            "x-forwarded-prefix: \\\"/a\\\\r\\\\nX-Evil: 1\\\" is not a header value",
            "upstream-vhost: \\\"$host\\\" uses an nginx variable",
            "x-forwarded-prefix: \\\"$1\\\" uses an nginx variable",
        ] {
            assert!(events.contains(refused), "{refused} in {events}");
        }
    }

    /// `server-alias` names reach the first rule host's routes and `from-to-www-redirect`
    /// answers 308 to the other name keeping path and query, through the dataplane's router
    /// and filters; names another Ingress rules, or another namespace claimed first, are not
    /// taken. Fails when aliases or www names are not served, or served over a rule host.
    #[test]
    fn aliases_and_www_redirects_follow_ownership() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/translate/ing-nginx-server-alias-www.in.yaml"
        ))
        .unwrap();
        let (snapshot, _) = crate::translate::Snapshot::from_yaml(&text).unwrap();
        let out = crate::translate::translate(&snapshot, &Params::default());
        let table = sweety_dataplane::router::RouteTable::build(&out.config).unwrap();
        let l = out.config.listeners[0].name.as_str();
        // (route name, redirect status and Location, if the route answers one).
        let at = |host: &str, path: &str| {
            let h = http::HeaderMap::new();
            let req = sweety_dataplane::router::RequestHead {
                listener: l,
                host,
                method: &http::Method::GET,
                path,
                query: Some("q=1"),
                headers: &h,
            };
            let sweety_dataplane::router::Lookup::Matched(m) = table.lookup(&req) else {
                return ("none".to_string(), None);
            };
            let r = &m.entry.route;
            let filters = sweety_dataplane::filters::CompiledFilters::compile(&r.filters).unwrap();
            let (mut parts, ()) = http::Request::get(format!("{path}?q=1"))
                .header("host", host)
                .body(())
                .unwrap()
                .into_parts();
            let answer = match filters.on_request(&mut parts, "http", 80, None) {
                sweety_dataplane::filters::RequestOutcome::Respond(resp) => Some((
                    resp.status().as_u16(),
                    resp.headers()["location"].to_str().unwrap().to_string(),
                )),
                _ => None,
            };
            (r.name.clone(), answer)
        };
        let main = "ingress/app/main/rule-0/path-0";
        assert_eq!(at("a.example.com", "/x"), (main.into(), None));
        assert_eq!(at("alias.example.com", "/x"), (main.into(), None));
        // b.example.com stays bee's, taken.example.com other's: no alias over a rule host.
        assert_eq!(at("b.example.com", "/b").0, "ingress/app/bee/rule-0/path-0");
        assert_eq!(at("b.example.com", "/x").0, "none");
        assert_eq!(
            at("taken.example.com", "/x").0,
            "ingress/other/owner/rule-0/path-0"
        );
        let redirect = |to: &str| Some((308, format!("http://{to}/p/q?q=1")));
        assert_eq!(
            at("www.a.example.com", "/p/q"),
            (
                "ingress/www-redirect/www.a.example.com".into(),
                redirect("a.example.com")
            )
        );
        assert_eq!(at("c.example.com", "/p/q").1, redirect("www.c.example.com"));
        // Both names are rule hosts: each serves its own rule, no redirect.
        assert_eq!(at("d.example.com", "/").0, "ingress/app/www/rule-1/path-0");
        assert_eq!(
            at("www.d.example.com", "/").0,
            "ingress/app/www/rule-2/path-0"
        );
        assert_eq!(
            at("www.evil.example.com", "/").1,
            redirect("evil.example.com").map(|(s, l)| (s, l.replace("/p/q", "/")))
        );
    }

    #[test]
    fn a_canary_pattern_is_searched_in_the_value() {
        let sel = CanarySelect {
            header: Some("x-tier".into()),
            header_pattern: Some("^beta|rc[0-9]".into()),
            ..CanarySelect::default()
        };
        let m = sel.conditions();
        assert_eq!(m.len(), 1);
        let CanaryCondition::Header(h) = &m[0].1 else {
            panic!("a header condition");
        };
        let re = regex::Regex::new(&format!("^(?:{})$", h.value)).unwrap();
        for (v, hit) in [
            ("beta", true),
            ("beta-2", true),
            ("x-rc1", true),
            ("alpha", false),
            ("xbeta", false),
        ] {
            assert_eq!(re.is_match(v), hit, "{v}");
        }
    }

    #[test]
    fn redirect_urls() {
        let r = parse_redirect_url("https://new.example.com:8443/x/y", 301).unwrap();
        assert_eq!(r.scheme.as_deref(), Some("https"));
        assert_eq!(r.host.as_deref(), Some("new.example.com"));
        assert_eq!(r.port, Some(8443));
        assert_eq!(r.path, Some(PathRewrite::Full("/x/y".into())));
        assert_eq!(r.status, 301);
        let r = parse_redirect_url("http://a.example", 302).unwrap();
        assert_eq!(
            (r.port, r.path),
            (None, Some(PathRewrite::Full("/".into())))
        );
        for bad in [
            "ftp://x",
            "https://",
            "https://a b",
            "https://x/?q=1",
            "https://x:0/",
        ] {
            assert!(parse_redirect_url(bad, 302).is_none(), "{bad}");
        }
    }

    #[test]
    fn anchoring() {
        assert_eq!(anchor_regex("/api/v[0-9]+"), "(?i)/api/v[0-9]+.*");
        assert_eq!(anchor_regex("/exact$"), "(?i)/exact$");
        assert_eq!(regex_escape("/a.b"), "/a\\.b");
    }

    #[test]
    fn cidrs_are_masked_like_nginx() {
        assert_eq!(masked_cidr("10.0.0.1/8").unwrap(), "10.0.0.0/8");
        assert_eq!(masked_cidr(" 192.168.1.7/24 ").unwrap(), "192.168.1.0/24");
        assert_eq!(masked_cidr("10.1.2.3").unwrap(), "10.1.2.3/32");
        assert_eq!(masked_cidr("1.2.3.4/0").unwrap(), "0.0.0.0/0");
        assert_eq!(masked_cidr("2001:db8::1/32").unwrap(), "2001:db8::/32");
        assert_eq!(masked_cidr("::1").unwrap(), "::1/128");
        for bad in [
            "office-vpn",
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "::/129",
            "",
            // Hostile or ambiguous spellings: an address nginx or inet_aton might read
            // differently must not become a different network here.
            "::ffff:10.0.0.0/104",
            "010.0.0.1",
            "10.1",
            "0x0a000001",
            "10.0.0.0/8/8",
            "10.0.0.0/-0",
            "10.0.0.0/08x",
            "10.0.0.1%eth0",
            "[::1]/128",
            "10.0.0.0/4294967304",
        ] {
            assert!(masked_cidr(bad).is_err(), "{bad}");
        }
        assert!(is_security("auth-proxy-set-headers") && is_security("auth-tls-unknown-setting"));
        assert!(!is_security("auth-url") && !is_security("auth-tls-verify-client"));
        assert!(is_security("modsecurity-snippet") && is_security("enable-modsecurity"));
        assert!(!is_security("use-regex") && !is_security("limit-rps"));
        // The proxy-ssl-* settings are read with proxy-ssl-secret; an unknown one is refused.
        assert!(!is_security("proxy-ssl-verify") && !is_security("proxy-ssl-secret"));
        assert!(!is_security("proxy-ssl-name") && is_security("proxy-ssl-unknown-setting"));
        assert!(is_security("proxy-ssl-ciphers"));
    }

    /// Property: any address with any valid prefix masks to a CIDR that sweety-config accepts,
    /// that contains the address, and masking is idempotent.
    #[test]
    fn masking_is_total_and_idempotent() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for i in 0..5_000 {
            let (addr, width): (std::net::IpAddr, u64) = if i % 2 == 0 {
                (std::net::Ipv4Addr::from(next() as u32).into(), 32)
            } else {
                (
                    std::net::Ipv6Addr::from(u128::from(next()) << 64 | u128::from(next())).into(),
                    128,
                )
            };
            let prefix = next() % (width + 1);
            let m = masked_cidr(&format!("{addr}/{prefix}")).unwrap();
            let cidr = Cidr::parse(&m).unwrap();
            assert!(cidr.contains(addr), "{addr}/{prefix} -> {m}");
            assert_eq!(masked_cidr(&m).unwrap(), m);
        }
    }

    /// Every row of ANNOTATIONS says what `Annotations::parse` really does with its example
    /// value: honoured rows raise no Unsupported* Event, ignored ones an UnsupportedAnnotation
    /// Event and no refusal, refused ones refuse the Ingress; a name in no row is ignored.
    #[test]
    fn the_table_is_what_the_parser_does() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let parse = |name: &str, value: &str| {
            let mut annotations: BTreeMap<String, String> =
                [(format!("{PREFIX}{name}"), value.to_string())].into();
            // The basic-auth settings are read with `auth-type: basic` only.
            if matches!(name, "auth-secret" | "auth-secret-type" | "auth-realm") {
                annotations.insert(format!("{PREFIX}auth-type"), "basic".into());
            }
            // The client-certificate settings are read with `auth-tls-secret` only.
            if AUTH_TLS.contains(&name) {
                annotations
                    .entry(format!("{PREFIX}auth-tls-secret"))
                    .or_insert_with(|| "ca".into());
            }
            // The external-auth settings are read with `auth-url` only.
            if name.starts_with("auth-")
                && !name.starts_with("auth-tls")
                && !matches!(
                    name,
                    "auth-type" | "auth-secret" | "auth-secret-type" | "auth-realm"
                )
            {
                annotations
                    .entry(format!("{PREFIX}auth-url"))
                    .or_insert_with(|| "http://auth.example/verify".into());
            }
            let ing = Ingress {
                metadata: ObjectMeta {
                    name: Some("i".into()),
                    namespace: Some("n".into()),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                ..Default::default()
            };
            let mut report = Report::default();
            let a = Annotations::parse(
                &ing,
                &Params::default(),
                &ClassSettings::default(),
                &[],
                &mut report,
            );
            (a, report)
        };
        for s in ANNOTATIONS {
            let name = s.name.replace("*-", "configuration-").replace('*', "x");
            let (a, report) = parse(&name, s.example);
            let unsupported = report
                .conditions
                .iter()
                .any(|c| c.reason.starts_with("Unsupported") && c.message.contains(name.as_str()));
            match s.support {
                Support::Honoured | Support::HonouredDifferently => {
                    assert!(!unsupported, "{name}: {:?}", report.conditions)
                }
                Support::IgnoredHarmless => assert!(
                    unsupported && a.refuse.is_none(),
                    "{name}: {:?}",
                    report.conditions
                ),
                Support::RefusedFailClosed => {
                    assert!(a.refuse.is_some(), "{name}: {:?}", report.conditions)
                }
            }
        }
        let (a, report) = parse("no-such-annotation", "x");
        assert!(a.refuse.is_none());
        assert_eq!(report.conditions[0].reason, "UnsupportedAnnotation");
        assert!(annotation_spec("no-such-annotation").is_none());
        assert_eq!(
            annotation_spec("server-snippet").map(|s| s.support),
            Some(Support::RefusedFailClosed)
        );
    }

    /// Every row flagged `guards_terminated` keeps an Ingress from being passed through (its
    /// paths refused) when it sits beside `ssl-passthrough` on a class that allows it, and a row
    /// without the flag on its own does not; the rows the ssl-passthrough note names (access
    /// rules, authentication, client certificates, rate limits) are the flagged ones.
    #[test]
    fn guard_rows_are_what_keeps_an_ingress_from_passthrough() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let class = ClassSettings {
            ssl_passthrough: true,
            ..Default::default()
        };
        let parse = |name: &str, value: &str| {
            let annotations: BTreeMap<String, String> = [
                (format!("{PREFIX}ssl-passthrough"), "true".to_string()),
                (format!("{PREFIX}{name}"), value.to_string()),
            ]
            .into();
            let ing = Ingress {
                metadata: ObjectMeta {
                    name: Some("i".into()),
                    namespace: Some("n".into()),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                ..Default::default()
            };
            let mut report = Report::default();
            let a = Annotations::parse(&ing, &Params::default(), &class, &[], &mut report);
            (a, report)
        };
        let mut flagged = Vec::new();
        for s in ANNOTATIONS.iter().filter(|s| !s.name.contains('*')) {
            let (a, report) = parse(s.name, s.example);
            if s.guards_terminated {
                flagged.push(s.name);
                // Passed through only without a refusal (ingress.rs, `passes_through`).
                assert!(a.refuse.is_some(), "{}: {:?}", s.name, report.conditions);
                assert!(matches!(
                    s.support,
                    Support::Honoured | Support::HonouredDifferently
                ));
            } else if a.ssl_passthrough {
                assert!(
                    !report
                        .conditions
                        .iter()
                        .any(|c| c.reason == "SSLPassthroughUnprotected"),
                    "{}",
                    s.name
                );
            }
        }
        flagged.sort_unstable();
        let named = |n: &str| {
            n.ends_with("-source-range")
                || matches!(n, "auth-type" | "auth-url" | "auth-tls-secret")
                || matches!(n, "limit-rps" | "limit-rpm" | "limit-connections")
        };
        assert!(flagged.iter().all(|n| named(n)), "{flagged:?}");
        assert_eq!(
            ANNOTATIONS.iter().filter(|s| named(s.name)).count(),
            flagged.len(),
            "{flagged:?}"
        );
    }

    /// `limit-whitelist` / `limit-allowlist`: the exempt networks of every limit of the
    /// Ingress; an unparsable entry exempts no one (an Event), the rest stay, nothing is refused.
    #[test]
    fn limit_whitelist_exempts_networks_and_a_bad_entry_widens_nothing() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let parse = |pairs: &[(&str, &str)]| {
            let ing = Ingress {
                metadata: ObjectMeta {
                    name: Some("i".into()),
                    namespace: Some("n".into()),
                    annotations: Some(
                        pairs
                            .iter()
                            .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
                            .collect(),
                    ),
                    ..Default::default()
                },
                ..Default::default()
            };
            let mut report = Report::default();
            let class = ClassSettings::default();
            let a = Annotations::parse(&ing, &Params::default(), &class, &[], &mut report);
            (a, report)
        };
        let (a, report) = parse(&[
            ("limit-rps", "5"),
            ("limit-rpm", "100"),
            ("limit-connections", "3"),
            ("limit-whitelist", "10.1.2.3/8, not-an-ip, ::1, 10.0.0.0/8"),
        ]);
        let want = vec!["10.0.0.0/8".to_string(), "::1/128".to_string()];
        assert_eq!(a.rate_limits.len(), 2);
        for r in &a.rate_limits {
            assert_eq!(r.exempt, want);
        }
        assert_eq!(a.concurrency.as_ref().map(|c| &c.exempt), Some(&want));
        assert!(a.refuse.is_none() && a.ip_access.is_none());
        let events: Vec<_> = report
            .conditions
            .iter()
            .map(|c| c.reason.as_str())
            .collect();
        assert_eq!(events, ["InvalidAnnotation"]);
        assert!(report.conditions[0].message.contains("not-an-ip"));
        // Nothing parsable: the limits apply to everyone, still not refused.
        let (a, report) = parse(&[("limit-rps", "5"), ("limit-allowlist", "x, y")]);
        assert!(a.rate_limits[0].exempt.is_empty() && a.refuse.is_none());
        assert_eq!(report.conditions.len(), 2);
        // With the operator's fail-closed setting for access lists untouched, an access list's
        // bad entry still refuses: the two are not confused.
        let (a, _) = parse(&[("whitelist-source-range", "bogus, 10.0.0.0/8")]);
        assert!(a.refuse.is_some());
        // Hostile entries: IPv6 with host bits is masked, prefixes past the family's width,
        // negative or unicode are Events (exempt no one), duplicates once, empties skipped.
        let (a, report) = parse(&[
            ("limit-rps", "5"),
            (
                "limit-whitelist",
                "2001:db8::1/64, 10.0.0.0/33, ::1/129, 10.0.0.1/-1, \u{ff11}0.0.0.1, ,,\
                 2001:DB8::/64, 0.0.0.0/0",
            ),
        ]);
        assert_eq!(
            a.rate_limits[0].exempt,
            ["2001:db8::/64".to_string(), "0.0.0.0/0".to_string()]
        );
        assert_eq!(report.conditions.len(), 4, "{:?}", report.conditions);
        assert!(a.refuse.is_none());
    }

    /// `proxy-next-upstream*`: each nginx token maps to a retry the dataplane can make safely
    /// (`non_idempotent` refused, `off` none), tries are the tries in all, bounded.
    #[test]
    fn next_upstream_maps_nginx_tokens_to_a_safe_retry_policy() {
        let run = |tokens: Option<&str>, tries: Option<&str>| {
            let get = |k: &str| match k {
                "proxy-next-upstream" => tokens,
                "proxy-next-upstream-tries" => tries,
                _ => None,
            };
            let mut report = Report::default();
            let p = next_upstream(&get, &mut report);
            let events: Vec<String> = report
                .conditions
                .iter()
                .map(|c| c.message.clone())
                .collect();
            (p.map(|p| (p.attempts, p.codes, p.backoff)), events)
        };
        // Neither annotation: nothing is retried (no default policy).
        assert_eq!(run(None, None), (None, vec![]));
        // ingress-nginx's default: error timeout, 3 tries -> 2 retries, no status.
        assert_eq!(
            run(Some("error timeout"), None),
            (Some((2, vec![], None)), vec![])
        );
        assert_eq!(run(None, Some("3")), (Some((2, vec![], None)), vec![]));
        // Statuses, sorted and distinct; invalid_header is an error.
        assert_eq!(
            run(
                Some("invalid_header http_504 http_502 http_502 http_429"),
                Some("5")
            )
            .0,
            Some((4, vec![429, 502, 504], None))
        );
        // A status list alone still gives a policy (errors retried too, documented).
        assert_eq!(run(Some("http_503"), None).0, Some((2, vec![503], None)));
        // non_idempotent is refused with an Event; the rest applies.
        let (p, ev) = run(Some("error non_idempotent"), None);
        assert_eq!(p, Some((2, vec![], None)));
        assert!(
            ev.len() == 1 && ev[0].contains("non_idempotent is refused"),
            "{ev:?}"
        );
        // non_idempotent alone asks for nothing Sweety does.
        assert_eq!(run(Some("non_idempotent"), None).0, None);
        // off: nothing, with an Event when mixed.
        assert_eq!(run(Some("off"), None), (None, vec![]));
        let (p, ev) = run(Some("off error"), Some("4"));
        assert!(p.is_none() && ev.len() == 1, "{ev:?}");
        // Unknown tokens are reported and ignored.
        let (p, ev) = run(Some("error http_418 updating"), None);
        assert_eq!(p, Some((2, vec![], None)));
        assert_eq!(ev.len(), 2, "{ev:?}");
        // Tries: 1 is no retry, 0 (nginx: unlimited) and too many are the most, junk is 3.
        assert_eq!(run(Some("error"), Some("1")).0, None);
        let most = MAX_NEXT_UPSTREAM_TRIES - 1;
        assert_eq!(run(Some("error"), Some("0")).0, Some((most, vec![], None)));
        assert_eq!(run(Some("error"), Some("99")).0, Some((most, vec![], None)));
        let (p, ev) = run(Some("error"), Some("many"));
        assert_eq!((p, ev.len()), (Some((2, vec![], None)), 1));
        // Hostile counts: past u32 is still the most; negative, fractional, unicode digits
        // and an empty value are not counts (an Event, the default 3); whitespace is trimmed.
        let huge = run(Some("error"), Some("99999999999999999999"));
        assert_eq!(huge.0, Some((most, vec![], None)));
        assert_eq!(
            run(Some("error"), Some(" 4 ")),
            (Some((3, vec![], None)), vec![])
        );
        for v in ["-1", "2.5", "\u{0663}", ""] {
            let (p, ev) = run(Some("error"), Some(v));
            assert_eq!((p, ev.len()), (Some((2, vec![], None)), 1), "{v:?}");
        }
        // Tokens repeated, upper case (nginx's are lower case only: unknown), tabs between.
        let (p, ev) = run(Some("error\terror  HTTP_502 http_502"), None);
        assert_eq!(p, Some((2, vec![502], None)));
        assert_eq!(ev.len(), 1, "{ev:?}");
        // -timeout: the budget; alone it turns the defaults on; 0 is no limit; junk an Event.
        let with_timeout = |t: &str| {
            let get = |k: &str| (k == "proxy-next-upstream-timeout").then_some(t);
            let mut report = Report::default();
            let p = next_upstream(&get, &mut report);
            (p.map(|p| (p.attempts, p.budget)), report.conditions.len())
        };
        assert_eq!(
            with_timeout("10"),
            (Some((2, Some(Duration::from_secs(10)))), 0)
        );
        assert_eq!(with_timeout("0"), (Some((2, None)), 0));
        assert_eq!(with_timeout("86401"), (Some((2, None)), 1));
        assert_eq!(with_timeout("soon"), (Some((2, None)), 1));
        assert_eq!(with_timeout("-5"), (Some((2, None)), 1));
        assert_eq!(with_timeout("99999999999999999999"), (Some((2, None)), 1));
        // The most is what the dataplane accepts.
        let mut route = Route {
            name: "r".into(),
            matches: vec![],
            filters: vec![],
            action: Action::Fixed(FixedResponse {
                status: 200,
                body: String::new(),
                content_type: None,
            }),
            timeouts: Default::default(),
            retry: Some(RetryPolicy {
                attempts: most,
                codes: vec![403, 404, 429, 500, 502, 503, 504],
                backoff: None,
                budget: Some(Duration::from_secs(86400)),
            }),
            max_request_body_bytes: None,
        };
        let valid = |route: &Route| {
            let mut cfg = sweety_config::Config::default();
            cfg.virtual_hosts.push(sweety_config::VirtualHost {
                name: "check".into(),
                hostnames: Vec::new(),
                listeners: Vec::new(),
                routes: vec![route.clone()],
            });
            cfg.validate_structure().is_ok()
        };
        assert!(valid(&route));
        route.retry.as_mut().unwrap().attempts = most + 1;
        assert!(!valid(&route));
    }

    /// docs/migrating-from-ingress-nginx.md carries the table rendered from ANNOTATIONS
    /// (`SWEETY_BLESS=1` rewrites it).
    #[test]
    fn the_docs_table_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/migrating-from-ingress-nginx.md");
        let doc = std::fs::read_to_string(&path).unwrap();
        let (begin, end) = ("<!-- annotations:begin -->\n", "<!-- annotations:end -->");
        let i = doc.find(begin).expect("begin marker") + begin.len();
        let j = doc.find(end).expect("end marker");
        let want = markdown_table();
        if doc[i..j] != want {
            if std::env::var_os("SWEETY_BLESS").is_some() {
                std::fs::write(&path, format!("{}{want}{}", &doc[..i], &doc[j..])).unwrap();
            } else {
                panic!("the annotation table of {} is stale: SWEETY_BLESS=1 cargo test -p sweety-controller the_docs_table", path.display());
            }
        }
    }

    #[test]
    fn auth_url_host_variables() {
        let ok = |u: &str| auth_url_names_host(u).unwrap();
        assert!(!ok("http://auth.example/verify"));
        assert!(ok("https://$host/oauth2/auth"));
        assert!(ok("https://$best_http_host:8443/a?h=$http_host"));
        assert_eq!(
            expand_auth_url("https://$best_http_host:8443/a?h=$http_host", "app.example"),
            "https://app.example:8443/a?h=app.example"
        );
        for bad in [
            "http://$hostname/check",
            "http://auth.example/?u=$request_uri",
            "http://$/x",
            "http://$host$remote_addr/",
        ] {
            let e = auth_url_names_host(bad).unwrap_err();
            assert!(e.contains("only $host"), "{bad}: {e}");
        }
        let f = ExternalAuth::new("https://$host/oauth2/auth");
        assert_eq!(
            auth_url_for_host(&f, "app.example").unwrap().url,
            "https://app.example/oauth2/auth"
        );
        for host in ["", "*.example.com"] {
            assert!(auth_url_for_host(&f, host)
                .unwrap_err()
                .contains("has none to ask"));
        }
        // The expanded URL is checked as auth-url is: a host that is an internal address is
        // refused.
        assert!(auth_url_for_host(&f, "127.0.0.1")
            .unwrap_err()
            .contains("may not be"));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Without `$` nothing is a variable and nothing changes; with only the host variables
        /// between literal parts, the expansion is those parts joined by the host and names no
        /// variable any more.
        #[test]
        fn auth_url_expansion(
            parts in proptest::collection::vec("[^$]{0,12}", 1..5),
            vars in proptest::collection::vec(0usize..3, 4),
            host in "[a-z0-9.-]{1,20}",
        ) {
            let plain = parts.concat();
            proptest::prop_assert_eq!(auth_url_names_host(&plain), Ok(false));
            proptest::prop_assert_eq!(expand_auth_url(&plain, &host), plain.clone());
            // A variable name ends at the first character that is not [A-Za-z0-9_].
            let mut template = String::new();
            let mut want = String::new();
            for (i, p) in parts.iter().enumerate() {
                if i > 0 {
                    template.push('$');
                    template.push_str(AUTH_URL_HOST_VARS[vars[i - 1]]);
                    template.push('/');
                    want.push_str(&host);
                    want.push('/');
                }
                template.push_str(p);
                want.push_str(p);
            }
            proptest::prop_assert_eq!(auth_url_names_host(&template), Ok(parts.len() > 1));
            let got = expand_auth_url(&template, &host);
            proptest::prop_assert_eq!(&got, &want);
            proptest::prop_assert!(!got.contains('$'));
        }
    }

    #[test]
    fn nginx_sizes() {
        for (v, want) in [
            ("0", Some(0)),
            ("1024", Some(1024)),
            ("8m", Some(8 << 20)),
            ("8M", Some(8 << 20)),
            ("512k", Some(512 << 10)),
            (" 1g ", Some(1 << 30)),
            ("", None),
            ("m", None),
            ("-1", None),
            ("1.5m", None),
            ("10mb", None),
            ("+5", None),
            ("99999999999999999999g", None),
            ("18446744073709551615k", None),
        ] {
            assert_eq!(nginx_size(v), want, "{v:?}");
        }
    }

    #[test]
    fn origins() {
        assert!(origin_ok("*"));
        assert!(origin_ok("https://*.example.com"));
        assert!(origin_ok("http://localhost:3000"));
        assert!(!origin_ok("example.com"));
        assert!(!origin_ok("https://Example.com"));
        assert!(!origin_ok("https://a.example/path"));
    }
}
