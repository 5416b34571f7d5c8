//! External authentication: the `external_auth` route filter ([`ExternalAuth`], the
//! oauth2-proxy pattern of ingress-nginx's `auth-url`) and the parsers of its two URLs, which
//! are tenant input.
//!
//! - [`parse_auth_url`]: the URL the dataplane sends each request's subrequest to:
//!   `http(s)://host[:port][/path][?query]`, visible ASCII only, no user info, no fragment and
//!   no nginx variables (`$host`: the subrequest's target would then follow the client's Host).
//! - [`parse_signin`]: where a client without credentials is sent (302) — an absolute
//!   `http(s)` URL that may name a closed set of request variables ([`Var`]), substituted by the
//!   dataplane per request from the same normalised host and path the router used; any other
//!   `$name` is refused (nothing else is templated).
//!
//! Both refuse rather than guess: a value they do not accept is a validation error naming why,
//! and the controller fails the Ingress closed with it.

use crate::Duration;
use serde::{Deserialize, Serialize};

/// Longest auth or signin URL, bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// Most `response_headers` one filter may copy.
pub const MAX_RESPONSE_HEADERS: usize = 32;
/// Longest subrequest timeout accepted.
pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Most subrequests one filter may have in flight (`max_in_flight`).
pub const MAX_IN_FLIGHT: u32 = 65_536;
/// The methods `method` may name (ingress-nginx's list for `auth-method`).
pub const METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE",
];
/// Response headers that may not be copied into the upstream request: they frame or route the
/// request, so an auth response must not set them.
pub const FORBIDDEN_RESPONSE_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// Ask an authentication service about every request before serving it (ingress-nginx
/// `auth-url`, nginx's `auth_request`): a subrequest with the original request's headers and
/// no body goes to `url`; 2xx lets the request through with `response_headers` copied from the
/// answer into it (a client's own copies of those headers are always removed first); 401 is
/// answered 401, or with `signin` a 302 there; 403 is answered 403; anything else, a timeout or
/// an unreachable service is answered 500. Checked after the IP lists, limits and basic
/// authentication, before every other request filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalAuth {
    /// The auth service ([`parse_auth_url`]).
    pub url: String,
    /// The subrequest's method; default: the original request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Where a 401 sends the client (302), with [`Var`]s substituted ([`parse_signin`]); the
    /// original URL is added as `signin_redirect_param` unless the URL already has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signin: Option<String>,
    /// The query parameter of `signin` carrying the original URL (default `rd`).
    #[serde(default = "default_redirect_param")]
    pub signin_redirect_param: String,
    /// Headers of a 2xx auth answer copied into the upstream request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub response_headers: Vec<String>,
    /// The `X-Auth-Request-Redirect` value sent to the auth service (default: the request URI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<String>,
    /// Pass the auth answer's `Set-Cookie` to the client whatever the final status (default:
    /// only with 2xx and 3xx final statuses, as nginx's `add_header` does).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub always_set_cookie: bool,
    /// The whole subrequest (connect, answer, draining its body) takes at most this long;
    /// past it the request is answered 500.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
    /// Subrequests of this filter in flight at most; a request that finds none free is
    /// answered 503 (with `Retry-After`) at once.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: u32,
    /// The URL is tenant input: refuse loopback, link-local, cloud metadata, unspecified and
    /// the dataplane's own addresses after resolution, as for an ExternalName backend.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restrict_addresses: bool,
}

fn default_redirect_param() -> String {
    "rd".into()
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_max_in_flight() -> u32 {
    256
}

impl ExternalAuth {
    /// A filter for `url` with every other field at its default.
    pub fn new(url: impl Into<String>) -> ExternalAuth {
        ExternalAuth {
            url: url.into(),
            method: None,
            signin: None,
            signin_redirect_param: default_redirect_param(),
            response_headers: Vec::new(),
            request_redirect: None,
            always_set_cookie: false,
            timeout: default_timeout(),
            max_in_flight: default_max_in_flight(),
            restrict_addresses: false,
        }
    }
}

/// A parsed auth URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthUrl {
    /// `https`.
    pub tls: bool,
    /// Host: a lower-case DNS name, an IPv4 address, or an IPv6 address (without brackets).
    pub host: String,
    /// Port (the scheme's default when absent).
    pub port: u16,
    /// Path (starting with `/`) and query, as given.
    pub path_and_query: String,
}

impl AuthUrl {
    /// `host:port` for connecting (IPv6 bracketed).
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The `Host` header value: the host, with the port unless it is the scheme's default.
    pub fn authority(&self) -> String {
        let default = if self.tls { 443 } else { 80 };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

/// Splits `http(s)://authority/rest` into (tls, authority, rest), checking the characters.
fn split_url(url: &str) -> Result<(bool, &str, &str), String> {
    if url.len() > MAX_URL_BYTES {
        return Err(format!("is longer than {MAX_URL_BYTES} bytes"));
    }
    if let Some(b) = url.bytes().find(|b| !(0x21..=0x7e).contains(b)) {
        return Err(format!(
            "contains the byte 0x{b:02x} (only visible ASCII is accepted)"
        ));
    }
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "is not an absolute http:// or https:// URL".to_string())?;
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "http" => false,
        "https" => true,
        _ => return Err(format!("has the scheme {scheme:?} (only http and https)")),
    };
    if rest.contains('#') {
        return Err("has a fragment (#)".into());
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.contains('@') {
        return Err("has user information (user@host)".into());
    }
    Ok((tls, authority, tail))
}

/// Host and port of an authority (`host`, `host:port`, `[v6]`, `[v6]:port`).
fn split_authority(authority: &str, tls: bool) -> Result<(String, u16), String> {
    let default = if tls { 443 } else { 80 };
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (v6, after) = rest
            .split_once(']')
            .ok_or_else(|| "has an unclosed '[' in its host".to_string())?;
        let v6: std::net::Ipv6Addr = v6
            .parse()
            .map_err(|_| format!("has {v6:?}, which is not an IPv6 address"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| "has text after its IPv6 host".to_string())?,
            ),
        };
        (v6.to_string(), port)
    } else {
        let (h, p) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        (h.to_ascii_lowercase(), p)
    };
    let port = match port {
        None => default,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(format!("has the port {p:?} (1-65535)")),
        },
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    // Only a bracketed host is an IPv6 address; any other must be a host name or IPv4 address
    // (an unbracketed `a:b:8` is not taken as host `a:b`).
    if !authority.starts_with('[') {
        let labels_ok = host.len() <= 253
            && host.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            });
        if !labels_ok {
            return Err(format!("has {host:?}, which is not a host name or address"));
        }
    }
    Ok((host, port))
}

/// Parses the auth service URL (see the module docs).
pub fn parse_auth_url(url: &str) -> Result<AuthUrl, String> {
    if url.contains('$') {
        return Err(
            "uses nginx variables ($…), which are not supported in the auth URL: name the auth \
             service directly"
                .into(),
        );
    }
    let (tls, authority, tail) = split_url(url)?;
    let (host, port) = split_authority(authority, tls)?;
    let path_and_query = if tail.is_empty() {
        "/".to_string()
    } else if tail.starts_with('?') {
        format!("/{tail}")
    } else {
        tail.to_string()
    };
    Ok(AuthUrl {
        tls,
        host,
        port,
        path_and_query,
    })
}

/// A request variable a signin URL may name (nginx's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    /// `$host`: the request's host, normalised, without port.
    Host,
    /// `$http_host`, `$best_http_host`: the request's authority, normalised, with its port
    /// if it had one.
    HttpHost,
    /// `$scheme`, `$pass_access_scheme`: `http` or `https`.
    Scheme,
    /// `$request_uri`: the path and query, as routed.
    RequestUri,
    /// `$escaped_request_uri`: [`escape`] of the path and query.
    EscapedRequestUri,
}

impl Var {
    fn from_name(n: &str) -> Option<Var> {
        Some(match n {
            "host" => Var::Host,
            "http_host" | "best_http_host" => Var::HttpHost,
            "scheme" | "pass_access_scheme" => Var::Scheme,
            "request_uri" => Var::RequestUri,
            "escaped_request_uri" => Var::EscapedRequestUri,
            _ => return None,
        })
    }
}

/// One piece of a signin URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Literal text.
    Text(String),
    /// A request variable.
    Var(Var),
}

/// A parsed signin URL: its pieces, and whether its query already carries the redirect
/// parameter (then the original URL is not added).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signin {
    /// Literal text and variables, in order.
    pub parts: Vec<Part>,
    /// The query has `<signin_redirect_param>=`.
    pub has_redirect_param: bool,
    /// The URL has a query (`?`): the parameter is added with `&`.
    pub has_query: bool,
}

/// Parses a signin URL for the redirect parameter `param` (see the module docs).
pub fn parse_signin(url: &str, param: &str) -> Result<Signin, String> {
    check_redirect_param(param)?;
    let (_, authority, _) = split_url(url)?;
    if authority.is_empty() {
        return Err("has no host".into());
    }
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut rest = url;
    while let Some(i) = rest.find('$') {
        text.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, next) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .ok_or_else(|| "has an unclosed ${".to_string())?;
            (&braced[..end], &braced[end + 1..])
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        let var = Var::from_name(name).ok_or_else(|| {
            format!(
                "names the variable ${name}, which is not supported (only $host, $http_host, \
                 $best_http_host, $scheme, $pass_access_scheme, $request_uri and \
                 $escaped_request_uri)"
            )
        })?;
        if !text.is_empty() {
            parts.push(Part::Text(std::mem::take(&mut text)));
        }
        parts.push(Part::Var(var));
        rest = next;
    }
    text.push_str(rest);
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    let query = url.split_once('?').map(|(_, q)| q);
    let has_redirect_param = query.is_some_and(|q| {
        q.split('&')
            .any(|kv| kv.split_once('=').map_or(kv, |(k, _)| k) == param)
    });
    Ok(Signin {
        parts,
        has_redirect_param,
        has_query: query.is_some(),
    })
}

/// A redirect parameter name: 1-64 of `A-Za-z0-9_-`.
pub fn check_redirect_param(param: &str) -> Result<(), String> {
    if param.is_empty()
        || param.len() > 64
        || !param
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "{param:?} is not a query parameter name (1-64 of A-Z a-z 0-9 _ -)"
        ));
    }
    Ok(())
}

/// Percent-encodes everything but RFC 3986's unreserved characters (`A-Za-z0-9-._~`), as
/// nginx's `set_escape_uri` does for `$escaped_request_uri`.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3 / 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether `name` is a header name that may be copied from an auth answer.
fn check_response_header(name: &str) -> Result<(), String> {
    let token = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Err(format!("{name:?} is not a header name"));
    }
    if FORBIDDEN_RESPONSE_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "{name:?} frames or routes the request and cannot be copied from an auth answer"
        ));
    }
    Ok(())
}

/// Problems of an [`ExternalAuth`] filter (field, message), for validation.
pub fn check_external_auth(a: &ExternalAuth) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Err(e) = parse_auth_url(&a.url) {
        out.push(("url".into(), e));
    }
    if let Some(m) = &a.method {
        if !METHODS.contains(&m.as_str()) {
            out.push((
                "method".into(),
                format!("{m:?} is not one of {}", METHODS.join(", ")),
            ));
        }
    }
    if let Err(e) = check_redirect_param(&a.signin_redirect_param) {
        out.push(("signin_redirect_param".into(), e));
    } else if let Some(s) = &a.signin {
        if let Err(e) = parse_signin(s, &a.signin_redirect_param) {
            out.push(("signin".into(), e));
        }
    }
    if a.response_headers.len() > MAX_RESPONSE_HEADERS {
        out.push((
            "response_headers".into(),
            format!("more than {MAX_RESPONSE_HEADERS} headers"),
        ));
    }
    for (i, h) in a.response_headers.iter().enumerate() {
        if let Err(e) = check_response_header(h) {
            out.push((format!("response_headers[{i}]"), e));
        }
    }
    if let Some(r) = &a.request_redirect {
        if r.len() > MAX_URL_BYTES || r.bytes().any(|b| !(0x20..=0x7e).contains(&b)) {
            out.push((
                "request_redirect".into(),
                format!("must be at most {MAX_URL_BYTES} bytes of printable ASCII"),
            ));
        }
    }
    let t = a.timeout.get();
    if t.is_zero() || t > MAX_TIMEOUT {
        out.push((
            "timeout".into(),
            format!("must be more than 0 and at most {}s", MAX_TIMEOUT.as_secs()),
        ));
    }
    if a.max_in_flight == 0 || a.max_in_flight > MAX_IN_FLIGHT {
        out.push((
            "max_in_flight".into(),
            format!("must be 1 to {MAX_IN_FLIGHT}"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_urls() {
        let u = parse_auth_url("http://oauth2-proxy.auth.svc.cluster.local/oauth2/auth").unwrap();
        assert_eq!(
            u,
            AuthUrl {
                tls: false,
                host: "oauth2-proxy.auth.svc.cluster.local".into(),
                port: 80,
                path_and_query: "/oauth2/auth".into()
            }
        );
        assert_eq!(u.address(), "oauth2-proxy.auth.svc.cluster.local:80");
        assert_eq!(u.authority(), "oauth2-proxy.auth.svc.cluster.local");
        let u = parse_auth_url("HTTPS://Auth.Example:8443?x=1").unwrap();
        assert_eq!((u.tls, u.port), (true, 8443));
        assert_eq!(u.path_and_query, "/?x=1");
        assert_eq!(u.authority(), "auth.example:8443");
        let u = parse_auth_url("http://[::1]:9000/v").unwrap();
        assert_eq!((u.host.as_str(), u.address()), ("::1", "[::1]:9000".into()));
        assert_eq!(u.authority(), "[::1]:9000");
        // An `@` after the authority is a path (or query) character, not user information.
        let u = parse_auth_url("http://auth/o1@x?u=a@b").unwrap();
        assert_eq!(
            (u.host.as_str(), u.path_and_query.as_str()),
            ("auth", "/o1@x?u=a@b")
        );
        for bad in [
            "https://$host/oauth2/auth",
            "ftp://a/",
            "auth.example/verify",
            "http://user@auth/",
            "http://user@auth",
            "http://u:p@auth?x",
            "http://auth/#frag",
            "http://auth:0/",
            "http://auth:99999/",
            "http://auth:+80/",
            "http://:80/",
            "http://a b/",
            "http://auth/\u{e9}",
            "http://-a.example/",
            "http://a..b/",
            "http://[::1/",
            "http://[zz]/",
            "http://[::1]x/",
            "http://a:b:8/",
            "http://::1/",
            "http://oaut`:-pth.s:vchttp:8//c",
        ] {
            assert!(parse_auth_url(bad).is_err(), "{bad}");
        }
        assert!(parse_auth_url(&format!("http://a/{}", "x".repeat(MAX_URL_BYTES))).is_err());
    }

    #[test]
    fn signin_urls() {
        let s = parse_signin("https://$host/oauth2/start?rd=$escaped_request_uri", "rd").unwrap();
        assert!(s.has_redirect_param && s.has_query);
        assert_eq!(
            s.parts,
            vec![
                Part::Text("https://".into()),
                Part::Var(Var::Host),
                Part::Text("/oauth2/start?rd=".into()),
                Part::Var(Var::EscapedRequestUri),
            ]
        );
        let s = parse_signin("https://auth.example/start", "rd").unwrap();
        assert!(!s.has_redirect_param && !s.has_query);
        let s = parse_signin("https://auth.example/start?x=1&rdx=2", "rd").unwrap();
        assert!(!s.has_redirect_param && s.has_query);
        let s = parse_signin("https://a/start?${scheme}", "rd").unwrap();
        assert_eq!(s.parts[1], Part::Var(Var::Scheme));
        for bad in [
            "https://a/?x=$remote_addr",
            "https://a/?x=${host",
            "/relative",
            "https:///x",
            "javascript://a/",
        ] {
            assert!(parse_signin(bad, "rd").is_err(), "{bad}");
        }
        assert!(parse_signin("https://a/", "r d").is_err());
    }

    #[test]
    fn escaping_is_nginx_set_escape_uri() {
        assert_eq!(escape("/a b?x=1&y=ü~"), "%2Fa%20b%3Fx%3D1%26y%3D%C3%BC~");
    }

    #[test]
    fn filter_checks() {
        let mut a = ExternalAuth::new("http://auth.example/verify");
        assert!(check_external_auth(&a).is_empty());
        a.method = Some("get".into());
        a.response_headers = vec!["X-Auth-Request-User".into(), "Content-Length".into()];
        a.timeout = Duration::from_secs(0);
        a.max_in_flight = 0;
        a.request_redirect = Some("a\nb".into());
        a.signin = Some("https://a/?$remote_user".into());
        let fields: Vec<String> = check_external_auth(&a).into_iter().map(|p| p.0).collect();
        assert_eq!(
            fields,
            [
                "method",
                "signin",
                "response_headers[1]",
                "request_redirect",
                "timeout",
                "max_in_flight"
            ]
        );
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any text: parse_auth_url never panics, and what it accepts rebuilds to a URL it
            /// accepts again with the same meaning; the host never carries a variable, user
            /// information or a control character.
            #[test]
            fn auth_url_round_trip(text in "(?s).{0,200}") {
                if let Ok(u) = parse_auth_url(&text) {
                    prop_assert!(!u.host.contains(['$', '@', '/', '?', '#']));
                    let again = format!(
                        "{}://{}{}", if u.tls { "https" } else { "http" }, u.authority(),
                        u.path_and_query
                    );
                    prop_assert_eq!(parse_auth_url(&again), Ok(u));
                }
            }

            /// URL-shaped input built from hostile pieces.
            #[test]
            fn auth_url_pieces(
                scheme in prop_oneof![Just("http"), Just("https"), Just("HTTP"), Just("ftp")],
                host in "[a-z0-9.:\\[\\]@$-]{0,20}",
                tail in "[/a-z?=&$#%]{0,20}",
            ) {
                let url = format!("{scheme}://{host}{tail}");
                if let Ok(u) = parse_auth_url(&url) {
                    prop_assert!(!url.contains(['$', '#', '@']));
                    prop_assert!(u.port != 0);
                    prop_assert!(u.path_and_query.starts_with('/'));
                }
            }

            /// Signin: never panics; the parts rebuild the text (variables as `$name`), and
            /// every variable is one of the supported set.
            #[test]
            fn signin_parts_rebuild(text in "(?s)https?://[a-z$.{}]{0,12}[/?=&a-z_${}]{0,40}") {
                if let Ok(s) = parse_signin(&text, "rd") {
                    let mut rebuilt = String::new();
                    for p in &s.parts {
                        match p {
                            Part::Text(t) => { prop_assert!(!t.contains('$')); rebuilt.push_str(t) }
                            Part::Var(_) => rebuilt.push('$'),
                        }
                    }
                    prop_assert_eq!(rebuilt.matches('$').count(), text.matches('$').count());
                }
            }

            /// Escaping leaves only unreserved characters and `%XX`, and decodes back.
            #[test]
            fn escape_decodes_back(text in "(?s).{0,64}") {
                let e = escape(&text);
                prop_assert!(e.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b)));
                let mut out = Vec::new();
                let b = e.as_bytes();
                let mut i = 0;
                while i < b.len() {
                    if b[i] == b'%' {
                        let h = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                        out.push(u8::from_str_radix(h, 16).unwrap());
                        i += 3;
                    } else {
                        out.push(b[i]);
                        i += 1;
                    }
                }
                prop_assert_eq!(out, text.as_bytes());
            }
        }
    }
}
