//! Pure request/response rewriting for forwarding, and the retry decision table.
//!
//! * Hop-by-hop headers are removed both ways: `Connection` and every header it names,
//!   `Keep-Alive`, `Proxy-Connection`, `TE` (except the value `trailers`), `Trailer`,
//!   `Transfer-Encoding` and `Upgrade`. Protocol upgrades are therefore not tunnelled by this
//!   module: the pipeline hands WebSocket upgrades to `crate::websocket` instead.
//! * The client IP is appended to `X-Forwarded-For`; `X-Forwarded-Proto`, `X-Forwarded-Host`
//!   and `X-Real-IP` are set; a `Forwarded: for=…;proto=…;host=…` element is appended
//!   (RFC 7239, IPv6 quoted and bracketed). A client that is not a trusted proxy cannot add to
//!   them: the pipeline drops its [`CLIENT_FORWARDING`] fields first.
//! * The client's Host (after any rewrite) is kept: as `Host` for HTTP/1.1 backends and as
//!   `:authority` for HTTP/2 backends. HTTP/2 clients send no Host; their URI authority is used.

use super::error::ProxyError;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Uri};
use std::net::IpAddr;
use sweety_config::RetryPolicy;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// The forwarding fields a client may send to claim another address, host or scheme: dropped
/// from a request whose TCP peer is not a trusted proxy (`client_ip.trusted_proxies`), before
/// anything reads them, so that only Sweety's own values reach a backend.
pub const CLIENT_FORWARDING: [&str; 9] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-scheme",
    "x-forwarded-server",
    "x-real-ip",
];

/// Removes [`CLIENT_FORWARDING`] from a request that did not come through a trusted proxy.
///
/// One pass over the names the request has (a few), removing only those present: removing
/// each of the nine names by string would parse and hash it every request (about 3,000
/// instructions per request, most of an HTTP/2 cache hit's pipeline), for a request that
/// usually has none of them.
pub fn drop_client_forwarding(headers: &mut HeaderMap) {
    let mut present: Option<Vec<HeaderName>> = None;
    for name in headers.keys() {
        if is_client_forwarding(name) {
            present.get_or_insert_with(Vec::new).push(name.clone());
        }
    }
    for name in present.into_iter().flatten() {
        headers.remove(name);
    }
}

/// Whether `name` is one of [`CLIENT_FORWARDING`] (names are lower case in a `HeaderName`).
fn is_client_forwarding(name: &HeaderName) -> bool {
    let n = name.as_str();
    (n.starts_with("x-") || n == "forwarded") && CLIENT_FORWARDING.contains(&n)
}

/// Removes hop-by-hop headers (see the module docs): the connection-specific fields
/// ([`crate::conn_headers`], `TE: trailers` survives) and `Trailer` (hop-by-hop in RFC 2616).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    crate::conn_headers::strip(headers, crate::conn_headers::Te::KeepTrailers);
    headers.remove(header::TRAILER);
}

/// Joins the Cookie fields of a request into one, with "; " (RFC 9113 §8.2.3, RFC 9114
/// §4.2.1): HTTP/2 and HTTP/3 clients may split cookies into one field per crumb, and an
/// HTTP/1.1 backend must get a single Cookie header (RFC 6265 §5.4). One field is left as it is.
pub fn join_cookies(headers: &mut HeaderMap) {
    let mut values = headers.get_all(header::COOKIE).iter();
    let (Some(first), Some(_)) = (values.next(), values.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    for v in headers.get_all(header::COOKIE).iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(v.as_bytes());
    }
    // The parts were valid field values, and "; " is too, so this cannot fail; keep the
    // fields as they were if it ever did.
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, v);
    }
}

/// The host the client asked for: the Host header, else the URI authority (HTTP/2).
pub fn client_host(headers: &HeaderMap, uri: &Uri) -> Option<HeaderValue> {
    headers.get(header::HOST).cloned().or_else(|| {
        uri.authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    })
}

/// RFC 9110 `tchar` by octet: a table, as every proxied request checks its host with it.
const TCHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    t
};

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| TCHAR[usize::from(b)])
}

/// Appends `s` as an RFC 7239 value: as it is when it is a token, else quoted with `"` and `\`
/// escaped (copied in runs between the octets to escape: a host with a port is quoted).
#[cfg(test)]
fn push_token_or_quoted(out: &mut String, s: &str) {
    put_token_or_quoted(
        &mut |b: &[u8]| out.push_str(std::str::from_utf8(b).unwrap_or_default()),
        s,
    );
}

/// [`push_token_or_quoted`] into any sink of text pieces.
fn put_token_or_quoted(put: &mut impl FnMut(&[u8]), s: &str) {
    if is_token(s) {
        put(s.as_bytes());
        return;
    }
    put(b"\"");
    let mut rest = s;
    while let Some(i) = rest.bytes().position(|b| b == b'"' || b == b'\\') {
        put(&rest.as_bytes()[..i]);
        put(b"\\");
        // An ASCII octet.
        put(&rest.as_bytes()[i..=i]);
        rest = &rest[i + 1..];
    }
    put(rest.as_bytes());
    put(b"\"");
}

/// The client address as the forwarding fields carry it (`client` canonical already: an
/// IPv4-mapped IPv6 address is IPv4). IPv4 is written octet by octet (this runs for every
/// proxied request; `Display` costs several times more), IPv6 by its `Display`.
fn client_text(client: IpAddr) -> String {
    match client {
        IpAddr::V4(v4) => {
            let mut b = [0u8; 15];
            let n = write_v4(&mut b, v4);
            String::from_utf8_lossy(&b[..n]).into_owned()
        }
        IpAddr::V6(v6) => v6.to_string(),
    }
}

/// One RFC 7239 `Forwarded` element.
pub fn forwarded_element(client: IpAddr, proto: &str, host: Option<&str>) -> String {
    let client = client.to_canonical();
    forwarded_for(&client_text(client), client.is_ipv6(), proto, host)
}

/// [`forwarded_element`] of a client address written already (`ip`, [`client_text`]).
fn forwarded_for(ip: &str, v6: bool, proto: &str, host: Option<&str>) -> String {
    let mut s = Vec::with_capacity(
        "for=\"[]\";proto=;host=\"\"".len() + ip.len() + proto.len() + host.map_or(0, str::len),
    );
    put_forwarded(
        &mut |b: &[u8]| s.extend_from_slice(b),
        ip.as_bytes(),
        v6,
        proto,
        host,
    );
    // The pieces are the address's text, `proto`, `host` and ASCII punctuation, each `host`
    // piece cut at an ASCII octet (`put_token_or_quoted`): the whole is UTF-8, checked once
    // here rather than once per piece (eight checks per proxied request to an HTTP/2 backend).
    String::from_utf8(s).unwrap_or_default()
}

/// The pieces of [`forwarded_for`]'s element, in order, into `put`.
fn put_forwarded(
    put: &mut impl FnMut(&[u8]),
    ip: &[u8],
    v6: bool,
    proto: &str,
    host: Option<&str>,
) {
    put(b"for=");
    if v6 {
        put(b"\"[");
        put(ip);
        put(b"]\"");
    } else {
        put(ip);
    }
    put(b";proto=");
    put(proto.as_bytes());
    if let Some(h) = host {
        put(b";host=");
        put_token_or_quoted(put, h);
    }
}

/// `X-Forwarded-Proto`'s value: the two schemes there are without an allocation.
fn scheme_value(scheme: &str) -> Option<HeaderValue> {
    match scheme {
        "http" => Some(HeaderValue::from_static("http")),
        "https" => Some(HeaderValue::from_static("https")),
        other => HeaderValue::from_str(other).ok(),
    }
}

/// Adds `X-Forwarded-For` (appended), `X-Forwarded-Proto`, `X-Forwarded-Host` and a
/// `Forwarded` element for a request from `client` over `scheme` for `host`. The client
/// address is written once and shared by `X-Forwarded-For`, `X-Real-IP` and `Forwarded`.
pub fn add_forwarding_headers(
    headers: &mut HeaderMap,
    client: IpAddr,
    scheme: &str,
    host: Option<&HeaderValue>,
) {
    let (ip, forwarded) = forwarding_values(client, scheme, host);
    insert_forwarding(headers, ip, forwarded, scheme, host);
}

/// The values [`add_forwarding_headers`] makes from its arguments alone: the client address
/// (`X-Forwarded-For`'s last element and `X-Real-IP`) and the `Forwarded` element; `None` for
/// one that is no field value.
fn forwarding_values(
    client: IpAddr,
    scheme: &str,
    host: Option<&HeaderValue>,
) -> (Option<HeaderValue>, Option<HeaderValue>) {
    let client = client.to_canonical();
    let ip = client_text(client);
    let host_str = host.and_then(|h| h.to_str().ok());
    let forwarded = forwarded_for(&ip, client.is_ipv6(), scheme, host_str);
    // An address's text is a valid field value (shared by X-Forwarded-For and X-Real-IP).
    let ip = HeaderValue::from_maybe_shared(bytes::Bytes::from(ip)).ok();
    let forwarded = HeaderValue::from_maybe_shared(bytes::Bytes::from(forwarded)).ok();
    (ip, forwarded)
}

/// [`add_forwarding_headers`] with its values made already ([`forwarding_values`]).
fn insert_forwarding(
    headers: &mut HeaderMap,
    ip_value: Option<HeaderValue>,
    forwarded: Option<HeaderValue>,
    scheme: &str,
    host: Option<&HeaderValue>,
) {
    let ip = ip_value
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // X-Forwarded-For found (or its place) with one look-up: the name is hashed once.
    match headers.entry(&X_FORWARDED_FOR) {
        http::header::Entry::Occupied(mut e) => {
            let prior: Vec<&str> = e
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .collect();
            let xff = if prior.is_empty() {
                None
            } else {
                HeaderValue::from_str(&format!("{}, {ip}", prior.join(", "))).ok()
            };
            if let Some(v) = xff.or_else(|| ip_value.clone()) {
                e.insert(v);
            }
        }
        http::header::Entry::Vacant(e) => {
            if let Some(v) = ip_value.clone() {
                e.insert(v);
            }
        }
    }
    if let Some(v) = scheme_value(scheme) {
        headers.insert(&X_FORWARDED_PROTO, v);
    }
    match host {
        Some(h) => {
            headers.insert(&X_FORWARDED_HOST, h.clone());
        }
        None => {
            headers.remove(&X_FORWARDED_HOST);
        }
    }
    if let Some(v) = forwarded {
        headers.append(header::FORWARDED, v);
    }
    // The client address as ingress-nginx sets it (`X-Real-IP: $remote_addr`, the client
    // after trusted proxies).
    if let Some(v) = ip_value {
        headers.insert(&X_REAL_IP, v);
    }
}

/// [`add_forwarding_headers`] through `cache`: the client address's value and the `Forwarded`
/// element (which depend on the client, the scheme and the host only) are the ones the
/// connection's last request made when these are the same, else made and kept (the text of
/// the address, the element's pieces, two allocations and two checks of every octet: about
/// 800 instructions per request to an HTTP/2 backend). The map is changed as
/// `add_forwarding_headers` changes it.
pub fn add_forwarding_headers_cached(
    headers: &mut HeaderMap,
    cache: &ForwardingCache,
    client: IpAddr,
    scheme: &'static str,
    host: Option<&HeaderValue>,
) {
    let host_bytes = host.map(HeaderValue::as_bytes);
    let hit = locked(&cache.values)
        .as_ref()
        .filter(|c| c.from.is(client, scheme, host_bytes))
        .map(|c| (c.ip.clone(), c.forwarded.clone()));
    let (ip, forwarded) = match hit {
        Some(v) => v,
        None => {
            let (ip, forwarded) = forwarding_values(client, scheme, host);
            if host_bytes.is_none_or(|h| h.len() <= CACHED_LINES_AT_MOST) {
                *locked(&cache.values) = Some(CachedValues {
                    from: Made::new(client, scheme, host_bytes),
                    ip: ip.clone(),
                    forwarded: forwarded.clone(),
                });
            }
            (ip, forwarded)
        }
    };
    insert_forwarding(headers, ip, forwarded, scheme, host);
}

/// [`add_forwarding_headers`] for a request whose head is written by Sweety's HTTP/1.1 client:
/// the same fields with the same values, written as field lines into `out` (sent after the
/// map's fields, [`sweety_h1::client::head::ExtraFields`]) instead of being inserted into the
/// map, which costs a look-up and an insertion each (about 1,500 instructions per request).
///
/// The map loses the fields these replace (`X-Forwarded-For`, whose values the new one
/// carries first, `X-Forwarded-Proto`, `X-Forwarded-Host`, `X-Real-IP`: present only when a
/// trusted proxy sent them, the pipeline drops them otherwise) and keeps its `Forwarded`
/// elements, ours following them. The fields come in the order `add_forwarding_headers`
/// inserts new ones; one whose value a field may not carry is left out, as there.
pub fn write_forwarding_fields(
    headers: &mut HeaderMap,
    out: &mut sweety_h1::client::head::ExtraFields,
    client: IpAddr,
    scheme: &str,
    host: Option<&HeaderValue>,
) {
    let present = replaced_present(headers);
    write_lines(headers, present, out, client, scheme, host);
}

/// Which of [`REPLACED`] `headers` has, in its order: found by one pass over the names present
/// (a few, usually none of these).
fn replaced_present(headers: &HeaderMap) -> [bool; 4] {
    let mut present = [false; 4];
    for name in headers.keys() {
        let n = name.as_str();
        if !n.starts_with("x-") {
            continue;
        }
        if let Some(i) = REPLACED.iter().position(|r| r.as_str() == n) {
            present[i] = true;
        }
    }
    present
}

/// A [`ForwardingCache`] keeps lines of forwarding fields at most this long (an IPv4 client's
/// with a short host take about 170 bytes), and values for a host at most this long.
const CACHED_LINES_AT_MOST: usize = 512;

/// The forwarding fields of a connection's last proxied request, kept in its
/// [`crate::ctx::ConnInfo`] with what they were made from (the client address, the scheme and
/// the host): as lines for an HTTP/1.1 backend ([`forwarding_lines`]) and as values for a map
/// ([`add_forwarding_headers_cached`]). The next request of the connection with the same host
/// (the usual keep-alive request) takes a copy instead of writing them again: for the lines
/// (when the request has none of the fields they replace) about 2,000 instructions per
/// request (five fields, the client's address three times, the host twice, each value checked
/// octet by octet). A copy of the connection info (a client resolved behind a trusted proxy)
/// starts empty. One entry of each kind per connection, for a host of at most
/// `CACHED_LINES_AT_MOST` bytes (and at most as many bytes of lines).
#[derive(Debug, Default)]
pub struct ForwardingCache {
    lines: std::sync::Mutex<Option<CachedLines>>,
    values: std::sync::Mutex<Option<CachedValues>>,
}

/// What the forwarding fields are made from: the client address, the scheme and the host.
#[derive(Debug)]
struct Made {
    client: IpAddr,
    scheme: &'static str,
    host: Option<Box<[u8]>>,
}

impl Made {
    fn new(client: IpAddr, scheme: &'static str, host: Option<&[u8]>) -> Made {
        Made {
            client,
            scheme,
            host: host.map(Box::from),
        }
    }

    fn is(&self, client: IpAddr, scheme: &str, host: Option<&[u8]>) -> bool {
        self.client == client && self.scheme == scheme && self.host.as_deref() == host
    }
}

#[derive(Debug)]
struct CachedLines {
    from: Made,
    lines: sweety_h1::client::head::ExtraFields,
}

#[derive(Debug)]
struct CachedValues {
    from: Made,
    ip: Option<HeaderValue>,
    forwarded: Option<HeaderValue>,
}

impl Clone for ForwardingCache {
    /// Empty: a copy of a connection's info may be another client's.
    fn clone(&self) -> Self {
        ForwardingCache::default()
    }
}

/// The value under `m`. Nothing that panics runs under these locks; a poisoned one holds a
/// complete value.
fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`write_forwarding_fields`] into a new [`ExtraFields`](sweety_h1::client::head::ExtraFields)
/// of `capacity` bytes, through `cache`: the lines are those `write_forwarding_fields` writes
/// for these arguments, taken from the cache when it has them for the same client, scheme and
/// host and `headers` has none of the fields they replace (they then depend on nothing else).
pub fn forwarding_lines(
    headers: &mut HeaderMap,
    cache: &ForwardingCache,
    capacity: usize,
    client: IpAddr,
    scheme: &'static str,
    host: Option<&HeaderValue>,
) -> sweety_h1::client::head::ExtraFields {
    let present = replaced_present(headers);
    let cacheable = present == [false; 4];
    let host_bytes = host.map(HeaderValue::as_bytes);
    if cacheable {
        if let Some(c) = &*locked(&cache.lines) {
            if c.from.is(client, scheme, host_bytes) {
                return c.lines.clone();
            }
        }
    }
    let mut out = sweety_h1::client::head::ExtraFields::with_capacity(capacity);
    write_lines(headers, present, &mut out, client, scheme, host);
    if cacheable && out.as_bytes().len() <= CACHED_LINES_AT_MOST {
        *locked(&cache.lines) = Some(CachedLines {
            from: Made::new(client, scheme, host_bytes),
            // Shared: a hit is a reference count, not a copy of the lines.
            lines: out.share(),
        });
    }
    out
}

/// [`write_forwarding_fields`] with the fields it replaces found already (`present`).
fn write_lines(
    headers: &mut HeaderMap,
    present: [bool; 4],
    out: &mut sweety_h1::client::head::ExtraFields,
    client: IpAddr,
    scheme: &str,
    host: Option<&HeaderValue>,
) {
    let client = client.to_canonical();
    let mut v4 = [0u8; 15];
    let v6;
    let ip: &[u8] = match client {
        IpAddr::V4(a) => {
            let n = write_v4(&mut v4, a);
            &v4[..n]
        }
        IpAddr::V6(a) => {
            v6 = a.to_string();
            v6.as_bytes()
        }
    };
    // The fields replaced (`present`) are each removed by name, at the end, only when there.
    {
        let mut line = out.line(&X_FORWARDED_FOR);
        if present[0] {
            // A trusted proxy's list first (its non-empty elements, trimmed), then ours.
            for v in headers
                .get_all(&X_FORWARDED_FOR)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
            {
                line.put(v.as_bytes()).put(b", ");
            }
        }
        line.put(ip);
        line.finish();
    }
    out.push(&X_FORWARDED_PROTO, scheme.as_bytes());
    if let Some(h) = host {
        out.push(&X_FORWARDED_HOST, h.as_bytes());
    }
    {
        let mut line = out.line(&header::FORWARDED);
        let host_str = host.and_then(|h| h.to_str().ok());
        put_forwarded(
            &mut |b: &[u8]| {
                line.put(b);
            },
            ip,
            client.is_ipv6(),
            scheme,
            host_str,
        );
        line.finish();
    }
    out.push(&X_REAL_IP, ip);
    for (name, _) in REPLACED.iter().zip(present).filter(|(_, p)| *p) {
        headers.remove(*name);
    }
}

/// The fields [`write_forwarding_fields`] writes in place of the map's own, in the order of
/// its `present` marks.
static REPLACED: [&HeaderName; 4] = [
    &X_FORWARDED_FOR,
    &X_FORWARDED_PROTO,
    &X_FORWARDED_HOST,
    &X_REAL_IP,
];

/// An IPv4 address as text into `out` (at most 15 bytes); its length.
fn write_v4(out: &mut [u8; 15], a: std::net::Ipv4Addr) -> usize {
    let mut n = 0;
    for (i, o) in a.octets().into_iter().enumerate() {
        if i > 0 {
            out[n] = b'.';
            n += 1;
        }
        if o >= 100 {
            out[n] = b'0' + o / 100;
            n += 1;
        }
        if o >= 10 {
            out[n] = b'0' + o / 10 % 10;
            n += 1;
        }
        out[n] = b'0' + o % 10;
        n += 1;
    }
    n
}

/// GET, HEAD, OPTIONS, PUT, DELETE and TRACE.
pub fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

/// What one try produced.
#[derive(Debug)]
pub enum TryOutcome<'a> {
    /// A response head with this status.
    Status(u16),
    /// An error.
    Error(&'a ProxyError),
}

/// Whether to try again after `tries` tries (1 after the first). `replayable`: the method is
/// idempotent and the request has no body. Without a policy nothing is retried.
///
/// | outcome                          | retried when                    |
/// |----------------------------------|---------------------------------|
/// | connect / connect timeout / TLS  | always (nothing was sent)       |
/// | local overload                   | always (nothing was sent)       |
/// | timeout, protocol error          | replayable                      |
/// | status listed in `codes`         | replayable                      |
/// | no endpoint / no backend / other | never                           |
pub fn should_retry(
    policy: Option<&RetryPolicy>,
    tries: u32,
    outcome: TryOutcome<'_>,
    replayable: bool,
) -> bool {
    let Some(p) = policy else {
        return false;
    };
    if tries > p.attempts {
        return false;
    }
    match outcome {
        TryOutcome::Status(s) => replayable && p.codes.contains(&s),
        TryOutcome::Error(e) => e.retry_safe(replayable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::time::Duration;

    #[test]
    fn cookie_crumbs_are_joined_into_one_field() {
        let mut h = hm(&[
            ("cookie", "a=1"),
            ("x", "y"),
            ("cookie", "b=2"),
            ("cookie", "c=3"),
        ]);
        join_cookies(&mut h);
        let all: Vec<_> = h.get_all(header::COOKIE).iter().collect();
        assert_eq!(all, vec!["a=1; b=2; c=3"]);
        assert_eq!(h.get("x").unwrap(), "y");
        let mut one = hm(&[("cookie", "a=1;b=2")]);
        join_cookies(&mut one);
        assert_eq!(
            one.get_all(header::COOKIE).iter().collect::<Vec<_>>(),
            vec!["a=1;b=2"]
        );
        let mut none = hm(&[("x", "y")]);
        join_cookies(&mut none);
        assert!(none.get(header::COOKIE).is_none());
    }

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

    #[test]
    fn hop_by_hop_stripped() {
        let mut h = hm(&[
            ("connection", "keep-alive, X-Secret"),
            ("connection", "close"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "gzip"),
            ("trailer", "x-checksum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("x-keep", "yes"),
            ("host", "example.com"),
        ]);
        strip_hop_by_hop(&mut h);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, vec!["host", "x-keep"]);
    }

    #[test]
    fn xff_appended_and_forwarded_built() {
        let mut h = hm(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
        ]);
        let host = HeaderValue::from_static("example.com");
        add_forwarding_headers(
            &mut h,
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            "https",
            Some(&host),
        );
        assert_eq!(
            h.get("x-forwarded-for").unwrap(),
            "1.1.1.1, 2.2.2.2, 10.0.0.1"
        );
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "https");
        assert_eq!(h.get("x-forwarded-host").unwrap(), "example.com");
        assert_eq!(
            h.get("forwarded").unwrap(),
            "for=10.0.0.1;proto=https;host=example.com"
        );
        assert_eq!(h.get("x-real-ip").unwrap(), "10.0.0.1");
    }

    #[test]
    fn client_forwarding_fields_are_dropped() {
        let mut h = hm(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("forwarded", "for=6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
            ("x-forwarded-host", "evil"),
            ("x-forwarded-proto", "https"),
            ("x-keep", "1"),
        ]);
        drop_client_forwarding(&mut h);
        add_forwarding_headers(
            &mut h,
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            "http",
            None,
        );
        assert_eq!(h.get("x-forwarded-for").unwrap(), "192.0.2.1");
        assert_eq!(h.get("x-real-ip").unwrap(), "192.0.2.1");
        assert_eq!(h.get_all("forwarded").iter().count(), 1);
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
        assert!(h.get("x-forwarded-host").is_none());
        assert_eq!(h.get("x-keep").unwrap(), "1");
    }

    #[test]
    fn every_client_forwarding_field_is_dropped_in_every_repetition() {
        let mut fields: Vec<(&str, &str)> = Vec::new();
        for n in CLIENT_FORWARDING {
            fields.push((n, "6.6.6.6"));
            fields.push((n, "7.7.7.7"));
        }
        fields.push(("x-forwarded", "1"));
        fields.push(("x-keep", "1"));
        let mut h = hm(&fields);
        drop_client_forwarding(&mut h);
        for n in CLIENT_FORWARDING {
            assert!(h.get(n).is_none(), "{n} was kept");
        }
        assert_eq!(h.len(), 2, "only the others are left: {h:?}");
        let mut none = hm(&[("accept", "*/*")]);
        drop_client_forwarding(&mut none);
        assert_eq!(none.len(), 1);
    }

    #[test]
    fn forwarded_quotes_ipv6_and_ports() {
        assert_eq!(
            forwarded_element(IpAddr::V6(Ipv6Addr::LOCALHOST), "http", Some("a.test:8080")),
            "for=\"[::1]\";proto=http;host=\"a.test:8080\""
        );
        let mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 7).to_ipv6_mapped());
        assert_eq!(
            forwarded_element(mapped, "http", None),
            "for=192.0.2.7;proto=http"
        );
        let mut h = HeaderMap::new();
        add_forwarding_headers(&mut h, mapped, "http", None);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "192.0.2.7");
        assert!(h.get("x-forwarded-host").is_none());
    }

    #[test]
    fn client_host_prefers_header_then_authority() {
        let uri: Uri = "https://h2.example/x".parse().unwrap();
        assert_eq!(client_host(&HeaderMap::new(), &uri).unwrap(), "h2.example");
        let h = hm(&[("host", "h1.example")]);
        assert_eq!(client_host(&h, &uri).unwrap(), "h1.example");
        assert!(client_host(&HeaderMap::new(), &"/x".parse().unwrap()).is_none());
    }

    #[test]
    fn the_token_table_is_rfc_9110_tchar() {
        for b in 0..=255u8 {
            let tchar = b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            assert_eq!(TCHAR[usize::from(b)], tchar, "octet {b}");
        }
        let mut out = String::new();
        push_token_or_quoted(&mut out, "a\\b\"c:1");
        assert_eq!(out, "\"a\\\\b\\\"c:1\"");
    }

    #[test]
    fn idempotent_methods() {
        for m in ["GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"] {
            assert!(is_idempotent(&m.parse().unwrap()), "{m}");
        }
        for m in ["POST", "PATCH", "CONNECT"] {
            assert!(!is_idempotent(&m.parse().unwrap()), "{m}");
        }
    }

    #[test]
    fn retry_decision_table() {
        let p = RetryPolicy {
            attempts: 2,
            codes: vec![503],
            backoff: None,
            budget: None,
        };
        let connect = ProxyError::Connect {
            addr: "a".into(),
            source: "refused".into(),
        };
        let tls = ProxyError::Tls {
            addr: "a".into(),
            source: "bad".into(),
        };
        let timeout = ProxyError::Timeout {
            addr: "a".into(),
            after: Duration::from_secs(1),
        };
        let protocol = ProxyError::Protocol {
            addr: "a".into(),
            source: "reset".into(),
        };
        let no_ep = ProxyError::NoEndpoint {
            backend: "b".into(),
        };
        use TryOutcome::*;
        let rows: Vec<(TryOutcome, bool, bool)> = vec![
            // outcome, replayable, expected
            (Error(&connect), false, true),
            (Error(&connect), true, true),
            (Error(&tls), false, true),
            (Error(&timeout), false, false),
            (Error(&timeout), true, true),
            (Error(&protocol), false, false),
            (Error(&protocol), true, true),
            (Error(&no_ep), true, false),
            (Status(503), true, true),
            (Status(503), false, false),
            (Status(502), true, false),
            (Status(200), true, false),
        ];
        for (i, (o, replayable, want)) in rows.into_iter().enumerate() {
            let dbg = format!("{o:?}");
            assert_eq!(
                should_retry(Some(&p), 1, o, replayable),
                want,
                "row {i}: {dbg}"
            );
        }
        // Attempts exhausted, or no policy at all.
        assert!(should_retry(Some(&p), 2, Error(&connect), true));
        assert!(!should_retry(Some(&p), 3, Error(&connect), true));
        assert!(!should_retry(None, 1, Error(&connect), true));
        assert!(!should_retry(None, 1, Status(503), true));
    }

    /// The forwarding fields as they were written before they were written once (with
    /// `Display` and `format!` for every field): the reference the faster code must match.
    fn reference_forwarding_headers(
        headers: &mut HeaderMap,
        client: IpAddr,
        scheme: &str,
        host: Option<&HeaderValue>,
    ) {
        fn quote_if_needed(s: &str) -> String {
            if is_token(s) {
                s.to_string()
            } else {
                let escaped: String = s
                    .chars()
                    .flat_map(|c| match c {
                        '"' | '\\' => vec!['\\', c],
                        c => vec![c],
                    })
                    .collect();
                format!("\"{escaped}\"")
            }
        }
        let ip = client.to_canonical().to_string();
        let prior: Vec<&str> = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .collect();
        let xff = if prior.is_empty() {
            ip
        } else {
            format!("{}, {ip}", prior.join(", "))
        };
        if let Ok(v) = HeaderValue::from_str(&xff) {
            headers.insert(&X_FORWARDED_FOR, v);
        }
        if let Ok(v) = HeaderValue::from_str(scheme) {
            headers.insert(&X_FORWARDED_PROTO, v);
        }
        let host_str = host.and_then(|h| h.to_str().ok());
        match host {
            Some(h) => {
                headers.insert(&X_FORWARDED_HOST, h.clone());
            }
            None => {
                headers.remove(&X_FORWARDED_HOST);
            }
        }
        let for_ = match client.to_canonical() {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("\"[{v6}]\""),
        };
        let mut element = format!("for={for_};proto={scheme}");
        if let Some(h) = host_str {
            element.push_str(";host=");
            element.push_str(&quote_if_needed(h));
        }
        if let Ok(v) = HeaderValue::from_str(&element) {
            headers.append(header::FORWARDED, v);
        }
        if let Ok(v) = HeaderValue::from_str(&client.to_canonical().to_string()) {
            headers.insert(&X_REAL_IP, v);
        }
    }

    fn fields(h: &HeaderMap) -> Vec<(String, Vec<u8>)> {
        h.iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    proptest::proptest! {
        /// A backend's response head parsed by our HTTP/1.1 client has exactly the fields (each
        /// name's values in their order; the strip's removals reorder the names) that parsing
        /// every field and then [`strip_hop_by_hop`] (what the proxy did to hyper's responses)
        /// leaves: the hop-by-hop names in any case, the names
        /// `Connection` lists, `TE` (kept as `te: trailers` when it names trailers).
        #[test]
        fn response_heads_lose_what_the_strip_removed(
            fields in proptest::collection::vec((
                proptest::sample::select(vec![
                    "Connection", "connection", "keep-alive", "Keep-Alive", "proxy-connection",
                    "te", "TE", "trailer", "upgrade", "x-a", "X-A", "x-b", "set-cookie",
                    "content-type", "close",
                ]),
                proptest::sample::select(vec![
                    "keep-alive", "close", "x-a", "X-B, close", " x-b ,, te", "trailers",
                    "gzip, trailers;q=1", "a", "", "content-type",
                ]),
            ), 0..10),
        ) {
            let mut raw = String::from("HTTP/1.1 200 OK\r\n");
            for (n, v) in &fields {
                raw.push_str(&format!("{n}: {v}\r\n"));
            }
            raw.push_str("content-length: 0\r\n\r\n");
            let ours = match sweety_h1::client::head::parse_response(raw.as_bytes(), false) {
                Ok(sweety_h1::client::head::Parsed::Final(_, h)) => h.response.into_parts().0.headers,
                other => panic!("{raw:?}: {other:?}"),
            };
            let mut reference = HeaderMap::new();
            for (n, v) in fields.iter().chain([("content-length", "0")].iter()) {
                reference.append(
                    HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    HeaderValue::from_str(v.trim()).unwrap(),
                );
            }
            strip_hop_by_hop(&mut reference);
            proptest::prop_assert_eq!(fields_of(&ours), fields_of(&reference), "{}", raw);
        }
    }

    proptest::proptest! {
        /// The fields written as lines for Sweety's HTTP/1.1 client (the map's own and the
        /// lines) are those `add_forwarding_headers` leaves in the map, each name's values in
        /// the same order, for any client address, scheme, host and prior fields (a trusted
        /// proxy's `X-Forwarded-*`, `X-Real-IP` and `Forwarded`).
        #[test]
        fn forwarding_lines_are_the_map_fields(
            client in clients(),
            scheme in proptest::sample::select(vec!["http", "https", "h t"]),
            host in hosts(),
            prior in priors(),
            others in proptest::collection::vec(
                proptest::sample::select(vec![
                    "x-forwarded-proto", "x-forwarded-host", "x-real-ip", "forwarded",
                    "x-forwarded-port", "x-other",
                ]), 0..4),
        ) {
            let mut start = start_map(&prior);
            for (i, n) in others.iter().enumerate() {
                start.append(
                    HeaderName::from_static(n),
                    HeaderValue::from_str(&format!("v{i}")).unwrap(),
                );
            }
            let (mut direct, mut reference) = (start.clone(), start);
            let mut lines = sweety_h1::client::head::ExtraFields::default();
            write_forwarding_fields(&mut direct, &mut lines, client, scheme, host.as_ref());
            add_forwarding_headers(&mut reference, client, scheme, host.as_ref());
            for (n, v) in lines.iter() {
                direct.append(
                    HeaderName::from_bytes(n).unwrap(),
                    HeaderValue::from_bytes(v).unwrap(),
                );
            }
            proptest::prop_assert_eq!(fields_of(&direct), fields_of(&reference));
        }
    }

    proptest::proptest! {
        /// Through one connection's cache, every request of a sequence (clients, schemes,
        /// hosts, a trusted proxy's fields or none) gets the lines and the map that
        /// `write_forwarding_fields` makes for it alone, whether the cache had them or not.
        #[test]
        fn cached_lines_are_the_written_ones(
            requests in proptest::collection::vec(
                (
                    few_clients(),
                    proptest::sample::select(vec!["http", "https"]),
                    hosts(),
                    priors(),
                    proptest::option::of(proptest::sample::select(vec![
                        "x-forwarded-proto", "x-forwarded-host", "x-real-ip", "forwarded",
                    ])),
                ),
                1..8,
            ),
        ) {
            let cache = ForwardingCache::default();
            for (client, scheme, host, prior, other) in requests {
                let mut start = start_map(&prior);
                if let Some(n) = other {
                    start.append(HeaderName::from_static(n), HeaderValue::from_static("v"));
                }
                let (mut cached, mut fresh) = (start.clone(), start);
                let got = forwarding_lines(&mut cached, &cache, 64, client, scheme, host.as_ref());
                let mut want = sweety_h1::client::head::ExtraFields::default();
                write_forwarding_fields(&mut fresh, &mut want, client, scheme, host.as_ref());
                proptest::prop_assert_eq!(got.as_bytes(), want.as_bytes());
                proptest::prop_assert_eq!(fields_of(&cached), fields_of(&fresh));
            }
        }
    }

    proptest::proptest! {
        /// Through one connection's cache, every request of a sequence (clients, schemes,
        /// hosts, a trusted proxy's fields or none) gets the map `add_forwarding_headers`
        /// makes for it alone, whether the cache had its values or not.
        #[test]
        fn cached_values_are_the_made_ones(
            requests in proptest::collection::vec(
                (
                    few_clients(),
                    proptest::sample::select(vec!["http", "https"]),
                    hosts(),
                    priors(),
                ),
                1..8,
            ),
        ) {
            let cache = ForwardingCache::default();
            for (client, scheme, host, prior) in requests {
                let (mut cached, mut fresh) = (start_map(&prior), start_map(&prior));
                add_forwarding_headers_cached(&mut cached, &cache, client, scheme, host.as_ref());
                add_forwarding_headers(&mut fresh, client, scheme, host.as_ref());
                proptest::prop_assert_eq!(fields_of(&cached), fields_of(&fresh));
            }
        }
    }

    /// The second request of a connection with the same host takes the first one's lines;
    /// another host, a trusted proxy's `X-Forwarded-For`, or a copy of the connection's cache
    /// (another client) does not.
    #[test]
    fn lines_are_cached_per_connection_host_and_client() {
        let cache = ForwardingCache::default();
        let client = IpAddr::from([192, 0, 2, 7]);
        let host = HeaderValue::from_static("a.test");
        let mut h = start_map(&[]);
        let first = forwarding_lines(&mut h, &cache, 64, client, "http", Some(&host));
        assert!(locked(&cache.lines).is_some());
        let again = forwarding_lines(&mut start_map(&[]), &cache, 64, client, "http", Some(&host));
        assert_eq!(first.as_bytes(), again.as_bytes());
        // Kept: the entry is the one the first request made.
        let kept = |c: &ForwardingCache| locked(&c.lines).as_ref().map(|c| c.from.host.clone());
        assert_eq!(kept(&cache), Some(Some(Box::from(&b"a.test"[..]))));
        let other = HeaderValue::from_static("b.test");
        let b = forwarding_lines(
            &mut start_map(&[]),
            &cache,
            64,
            client,
            "http",
            Some(&other),
        );
        assert!(std::str::from_utf8(b.as_bytes())
            .unwrap()
            .contains("x-forwarded-host: b.test\r\n"));
        assert_eq!(kept(&cache), Some(Some(Box::from(&b"b.test"[..]))));
        // A trusted proxy's field: written, not cached (the entry stays b.test's).
        let mut prior = start_map(&["10.0.0.1"]);
        let p = forwarding_lines(&mut prior, &cache, 64, client, "http", Some(&other));
        assert!(std::str::from_utf8(p.as_bytes())
            .unwrap()
            .contains("x-forwarded-for: 10.0.0.1, 192.0.2.7\r\n"));
        assert!(prior.get(&X_FORWARDED_FOR).is_none());
        assert_eq!(kept(&cache), Some(Some(Box::from(&b"b.test"[..]))));
        // Another client on the same cache: its own lines.
        let c2 = forwarding_lines(
            &mut start_map(&[]),
            &cache,
            64,
            IpAddr::from([192, 0, 2, 8]),
            "http",
            Some(&other),
        );
        assert!(std::str::from_utf8(c2.as_bytes())
            .unwrap()
            .contains("x-real-ip: 192.0.2.8\r\n"));
        assert!(locked(&cache.clone().lines).is_none());
        // The values for a map: kept per client and host too.
        let mut m = start_map(&[]);
        add_forwarding_headers_cached(&mut m, &cache, client, "https", Some(&host));
        let kept = locked(&cache.values).as_ref().map(|c| c.forwarded.clone());
        assert_eq!(
            kept,
            Some(Some(HeaderValue::from_static(
                "for=192.0.2.7;proto=https;host=a.test"
            )))
        );
        let mut again = start_map(&[]);
        add_forwarding_headers_cached(&mut again, &cache, client, "https", Some(&host));
        assert_eq!(fields_of(&again), fields_of(&m));
        let mut other = start_map(&[]);
        add_forwarding_headers_cached(
            &mut other,
            &cache,
            IpAddr::from([192, 0, 2, 8]),
            "https",
            None,
        );
        assert_eq!(other.get(&X_REAL_IP).unwrap(), "192.0.2.8");
        assert!(other.get(&X_FORWARDED_HOST).is_none());
    }

    /// The client addresses the forwarding proptests draw: IPv4, IPv6 and IPv4-mapped IPv6.
    fn clients() -> impl proptest::strategy::Strategy<Value = IpAddr> {
        use proptest::strategy::Strategy;
        (
            proptest::prelude::any::<[u8; 4]>(),
            proptest::prelude::any::<[u16; 8]>(),
            0u8..3,
        )
            .prop_map(|(v4, v6, kind)| match kind {
                0 => IpAddr::from(v4),
                1 => IpAddr::from(v6),
                _ => IpAddr::V6(std::net::Ipv4Addr::from(v4).to_ipv6_mapped()),
            })
    }

    /// The clients of the cache proptests: two IPv4 addresses and an IPv6 one, few enough
    /// for a sequence of requests to meet the same one again (a cache hit).
    fn few_clients() -> impl proptest::strategy::Strategy<Value = IpAddr> {
        proptest::sample::select(vec![
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from([10, 0, 0, 2]),
            IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
        ])
    }

    /// Hosts of tokens, quoting-worthy octets and obs-text (none where the octets are no
    /// field value).
    fn hosts() -> impl proptest::strategy::Strategy<Value = Option<HeaderValue>> {
        use proptest::strategy::Strategy;
        proptest::option::of(proptest::collection::vec(
            proptest::sample::select(b"aZ09.-:[]\"\\ ;,=\x80\xff".to_vec()),
            0..12,
        ))
        .prop_map(|h| h.and_then(|h| HeaderValue::from_bytes(&h).ok()))
    }

    /// A trusted proxy's `X-Forwarded-For` values: empty, padded, a list, an invalid octet.
    fn priors() -> impl proptest::strategy::Strategy<Value = Vec<&'static str>> {
        proptest::collection::vec(
            proptest::sample::select(vec!["", " 10.0.0.1 ", "a, b", "\u{7f}"]),
            0..3,
        )
    }

    /// A request's map before the forwarding fields: a Host and the `prior` values (those
    /// that are field values) as `X-Forwarded-For`.
    fn start_map(prior: &[&str]) -> HeaderMap {
        let mut start = HeaderMap::new();
        start.insert(header::HOST, HeaderValue::from_static("a.test"));
        for p in prior {
            if let Ok(v) = HeaderValue::from_str(p) {
                start.append(&X_FORWARDED_FOR, v);
            }
        }
        start
    }

    /// The fields by name (stable: each name's values keep their order).
    fn fields_of(h: &HeaderMap) -> Vec<(String, Vec<u8>)> {
        let mut f: Vec<_> = h
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect();
        f.sort_by(|a, b| a.0.cmp(&b.0));
        f
    }

    proptest::proptest! {
        /// The same fields, values and order as the reference, for any client address (IPv4,
        /// IPv6, IPv4-mapped), scheme, host (tokens, quoted, obs-text) and prior fields.
        #[test]
        fn forwarding_fields_are_the_reference_ones(
            client in clients(),
            scheme in proptest::sample::select(vec!["http", "https", "h t"]),
            host in hosts(),
            prior in priors(),
        ) {
            let mut start = start_map(&prior);
            start.insert(&X_FORWARDED_HOST, HeaderValue::from_static("old"));
            let (mut ours, mut reference) = (start.clone(), start);
            add_forwarding_headers(&mut ours, client, scheme, host.as_ref());
            reference_forwarding_headers(&mut reference, client, scheme, host.as_ref());
            proptest::prop_assert_eq!(fields(&ours), fields(&reference));
            proptest::prop_assert_eq!(
                forwarded_element(client, scheme, host.as_ref().and_then(|h| h.to_str().ok())),
                reference.get(header::FORWARDED).unwrap().to_str().unwrap()
            );
        }
    }
}
