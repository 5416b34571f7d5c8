//! The backend oracle (issue 16): a table of hostile requests sent over HTTP/1.1 (raw bytes),
//! HTTP/2 (raw frames, both engines) and HTTP/3 (quinn + h3) to a two-host config whose
//! backend is a raw recording server. The backend parses what arrives strictly (httparse,
//! its own chunked decoder) and records every violation of what an edge must guarantee:
//!
//! * one backend request per client request (none for a refused one);
//! * a body exactly as long as its `Content-Length` (a stalled short body is a desync: the
//!   next request on a pooled connection would become its body), never `Transfer-Encoding`
//!   with `Content-Length`, only `chunked`;
//! * one `Host`, equal to the authority the request was routed by (each vhost's route sets
//!   `x-route` to its own host name; the backend compares);
//! * a path already in normal form (no dot segments, no repeated slashes, no encoded
//!   unreserved characters) that no backend normalisation turns into the denied `/admin`;
//! * no hop-by-hop fields (nor `x-hop`, which the hostile rows name in `Connection`).
//!
//! After every row a canary request on a fresh connection must reach the backend as its own
//! request (a poisoned pooled connection would make it something else). Every row is bounded
//! in time; each test collects all failing rows and lists them.

mod common;

use bytes::{Buf, Bytes, BytesMut};
use common::h2 as raw2;
use common::*;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sweety_config::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long the backend waits for more bytes of a request it started to read.
const STALL: Duration = Duration::from_millis(1500);
/// How long a client waits for the outcome of one row.
const ROW: Duration = Duration::from_secs(6);

/// One request as the backend saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    host: String,
    body: usize,
}

#[derive(Default)]
struct Log {
    seen: Vec<Seen>,
    violations: Vec<String>,
}

type Shared = Arc<Mutex<Log>>;

/// The raw recording backend.
async fn recording_backend(log: Shared) -> SocketAddr {
    spawn_backend(move |s| backend_conn(s, log.clone())).await
}

/// Reads more bytes into `buf`: Ok(false) at EOF, Err on a stall of [`STALL`].
async fn fill(s: &mut TcpStream, buf: &mut BytesMut, wait: Duration) -> Result<bool, ()> {
    match tokio::time::timeout(wait, s.read_buf(buf)).await {
        Err(_) => Err(()),
        Ok(Ok(0)) | Ok(Err(_)) => Ok(false),
        Ok(Ok(_)) => Ok(true),
    }
}

async fn backend_conn(mut s: TcpStream, log: Shared) {
    let mut buf = BytesMut::new();
    let violation = |why: String| log.lock().unwrap().violations.push(why);
    loop {
        // The head.
        let (head_len, seen, framing) = loop {
            let mut fields = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut fields);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(n)) => {
                    match check_head(&req) {
                        Ok((seen, framing)) => break (n, seen, framing),
                        Err(why) => {
                            violation(why);
                            return;
                        }
                    };
                }
                Ok(httparse::Status::Partial) => {}
                Err(e) => {
                    violation(format!(
                        "unparseable head ({e}): {:?}",
                        String::from_utf8_lossy(&buf)
                    ));
                    return;
                }
            }
            // Between requests the proxy may keep the connection idle; within one, a stall
            // is a violation.
            let wait = if buf.is_empty() {
                Duration::from_secs(120)
            } else {
                STALL
            };
            match fill(&mut s, &mut buf, wait).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(()) => {
                    if !buf.is_empty() {
                        violation("request head stalled".into());
                    }
                    return;
                }
            }
        };
        buf.advance(head_len);
        // The body.
        let body = match framing {
            Framing::None => 0,
            Framing::Length(n) => {
                while buf.len() < n {
                    match fill(&mut s, &mut buf, STALL).await {
                        Ok(true) => {}
                        // The proxy aborted the request: the connection is gone, nothing is
                        // desynchronised.
                        Ok(false) => return,
                        Err(()) => {
                            violation(format!(
                                "{}: body stalled at {} of Content-Length {n}",
                                seen.path,
                                buf.len()
                            ));
                            return;
                        }
                    }
                }
                buf.advance(n);
                n
            }
            Framing::Chunked => loop {
                match dechunk(&buf) {
                    Ok(Some((consumed, len))) => {
                        buf.advance(consumed);
                        break len;
                    }
                    Ok(None) => match fill(&mut s, &mut buf, STALL).await {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(()) => {
                            violation(format!("{}: chunked body stalled", seen.path));
                            return;
                        }
                    },
                    Err(why) => {
                        violation(format!("{}: bad chunked body: {why}", seen.path));
                        return;
                    }
                }
            },
        };
        log.lock().unwrap().seen.push(Seen { body, ..seen });
        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok";
        if s.write_all(reply).await.is_err() {
            return;
        }
    }
}

enum Framing {
    None,
    Length(usize),
    Chunked,
}

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "trailer",
    "transfer-encoding-x",
    "x-hop",
];

/// What hostile rows put into forwarding fields (`X-Forwarded-*`, `Forwarded`, `X-Real-IP`).
const SPOOF: &str = "6.6.6.6";

/// The raw-path class, sent to `a.test` over every protocol: a backend that decodes and
/// resolves these reads `/admin`, so each must meet the `/admin` deny route (or a 400).
const PATH_ROWS: [(&str, &str, Expect); 10] = [
    ("encoded unreserved", "/%61dmin", Expect::Denied),
    ("double slash", "//admin", Expect::Denied),
    ("dot segment", "/./admin", Expect::Denied),
    ("dot-dot", "/x/../admin", Expect::Denied),
    ("encoded dot-dot", "/x/%2e%2e/admin", Expect::Denied),
    (
        "upper-case encoded dot-dot",
        "/x/%2E%2E/admin",
        Expect::Denied,
    ),
    ("encoded slash", "/%2fadmin", Expect::Denied),
    ("encoded backslash", "/x%5c..%5cadmin", Expect::Denied),
    ("dot-dot above the root", "/../admin", Expect::Denied),
    (
        "dot-dot out of admin",
        "/admin/../x",
        Expect::Served("/x", "a.test", 0),
    ),
];

/// The forwarding fields a hostile client sends to claim another address, host or scheme.
const SPOOFED_FORWARDING: [(&str, &str); 5] = [
    ("x-forwarded-for", SPOOF),
    ("x-real-ip", SPOOF),
    ("forwarded", "for=6.6.6.6;host=6.6.6.6"),
    ("x-forwarded-host", "6.6.6.6"),
    ("x-forwarded-proto", "6.6.6.6"),
];

/// A table row: its name, what it expects and the protocol's request.
type Row<R> = (String, Expect, R);

/// Starts the two-host config on `engine`, sends every row with `send`, judges each against
/// the backend oracle and fails listing every failing row.
async fn run_table<R>(
    label: &str,
    engine: Http2Engine,
    rows: Vec<Row<R>>,
    send: impl AsyncFn(&Env, &R) -> Outcome,
) {
    run_table_on(label, engine, Http1Engine::default(), rows, send).await
}

/// [`run_table`] with the HTTP/1.1 engine `h1`.
async fn run_table_on<R>(
    label: &str,
    engine: Http2Engine,
    h1: Http1Engine,
    rows: Vec<Row<R>>,
    send: impl AsyncFn(&Env, &R) -> Outcome,
) {
    let env = Env::start_on(engine, h1).await;
    let mut fails = Vec::new();
    for (name, expect, req) in &rows {
        let got = send(&env, req).await;
        fails.extend(env.judge(name, *expect, got).await);
    }
    drop(env.h);
    assert!(
        fails.is_empty(),
        "{label}: {} failing rows:\n{}",
        fails.len(),
        fails.join("\n")
    );
}

/// The checks on one request head; the request as seen and its body framing.
fn check_head(req: &httparse::Request<'_, '_>) -> Result<(Seen, Framing), String> {
    let path = req.path.unwrap_or("").to_string();
    let mut hosts = Vec::new();
    let mut route = None;
    let mut lengths = Vec::new();
    let mut te = Vec::new();
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        let value = String::from_utf8_lossy(h.value).into_owned();
        match name.as_str() {
            "host" => hosts.push(value),
            "x-route" => route = Some(value),
            // Every client is 127.0.0.1 and no proxy is trusted: the backend must get
            // Sweety's own forwarding fields only, never what a hostile row claimed.
            "x-forwarded-for" | "x-real-ip" if value != "127.0.0.1" => {
                return Err(format!("{path}: {name}: {value} (the client is 127.0.0.1)"));
            }
            "forwarded" | "x-forwarded-host" | "x-forwarded-proto" if value.contains(SPOOF) => {
                return Err(format!("{path}: the client's {name} reached it: {value}"));
            }
            "content-length" => lengths.push(value),
            "transfer-encoding" => te.push(value),
            n if HOP_BY_HOP.contains(&n) && !(n == "te" && value == "trailers") => {
                return Err(format!("{path}: hop-by-hop field {n}: {value}"));
            }
            _ => {}
        }
    }
    if hosts.len() != 1 {
        return Err(format!("{path}: {} Host fields: {hosts:?}", hosts.len()));
    }
    let host = hosts.remove(0);
    let bare = host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h);
    if route.as_deref() != Some(bare) {
        return Err(format!(
            "{path}: Host {host:?} but routed by the vhost of {route:?}"
        ));
    }
    if !path.starts_with('/') {
        return Err(format!("path {path:?} is not origin-form"));
    }
    if !is_normal(&path) {
        return Err(format!("path {path:?} reached the backend unnormalised"));
    }
    if reaches_admin(&path) {
        return Err(format!(
            "path {path:?} reached the backend and means /admin there"
        ));
    }
    let framing = match (lengths.as_slice(), te.as_slice()) {
        ([], []) => Framing::None,
        ([n], []) => Framing::Length(
            n.parse()
                .map_err(|_| format!("{path}: Content-Length {n:?}"))?,
        ),
        ([], [t]) if t == "chunked" => Framing::Chunked,
        _ => {
            return Err(format!(
                "{path}: framing fields Content-Length {lengths:?}, Transfer-Encoding {te:?}"
            ))
        }
    };
    Ok((
        Seen {
            path,
            host: bare.to_string(),
            body: 0,
        },
        framing,
    ))
}

/// A strict chunked decoder: Ok(None) when more bytes are needed, Ok((bytes consumed,
/// body length)) at the end of the trailers.
fn dechunk(b: &[u8]) -> Result<Option<(usize, usize)>, String> {
    let mut at = 0;
    let mut total = 0;
    let line = |at: usize| -> Option<usize> { b[at..].windows(2).position(|w| w == b"\r\n") };
    loop {
        let Some(end) = line(at) else {
            return Ok(None);
        };
        let size_text = std::str::from_utf8(&b[at..at + end]).map_err(|e| e.to_string())?;
        let size_text = size_text.split(';').next().unwrap_or("");
        if size_text.is_empty() || size_text.len() > 8 {
            return Err(format!("chunk size {size_text:?}"));
        }
        let size = usize::from_str_radix(size_text, 16).map_err(|e| e.to_string())?;
        at += end + 2;
        if size == 0 {
            // Trailers up to the empty line.
            loop {
                let Some(end) = line(at) else {
                    return Ok(None);
                };
                at += end + 2;
                if end == 0 {
                    return Ok(Some((at, total)));
                }
            }
        }
        if b.len() < at + size + 2 {
            return Ok(None);
        }
        if &b[at + size..at + size + 2] != b"\r\n" {
            return Err("chunk not followed by CRLF".into());
        }
        at += size + 2;
        total += size;
    }
}

/// Whether a path is in the normal form the edge forwards: no empty, `.` or `..` segments
/// (a trailing slash aside), no backslash, no percent-encoded unreserved character.
fn is_normal(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or("");
    if path.contains('\\') {
        return false;
    }
    let segs: Vec<&str> = path[1..].split('/').collect();
    for (i, s) in segs.iter().enumerate() {
        if *s == "." || *s == ".." || (s.is_empty() && i + 1 != segs.len()) {
            return false;
        }
    }
    let b = path.as_bytes();
    for i in 0..b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
            {
                if v.is_ascii_alphanumeric() || b"-._~".contains(&v) {
                    return false;
                }
            }
        }
    }
    true
}

/// What a lenient backend makes of a path (decode everything, backslash as slash, merge
/// slashes, resolve dot segments): whether that is the denied `/admin` subtree.
fn reaches_admin(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or("");
    let decoded: String = percent_encoding::percent_decode_str(path)
        .decode_utf8_lossy()
        .replace('\\', "/");
    let mut out: Vec<&str> = Vec::new();
    for s in decoded.split('/') {
        match s {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    out.first().is_some_and(|s| s.eq_ignore_ascii_case("admin"))
}

/// The two-host config: `a.test` denies `/admin` and requests with `x-hop` (a fixed 403) and
/// proxies the rest, `b.test` serves `/files` from `root` (static) and proxies the rest; each
/// proxy route sets `x-route` to its host. A catch-all vhost proxies any other host with an
/// `x-route` no Host matches.
fn config(
    backend_addr: SocketAddr,
    engine: Http2Engine,
    h1: Http1Engine,
    root: &std::path::Path,
) -> (Config, String) {
    let names = ["a.test", "b.test"];
    let (c, k) = sweety_dataplane::tls::self_signed(&names).unwrap();
    let cert = Certificate {
        hostnames: names.iter().map(|s| s.to_string()).collect(),
        cert: PemSource::Pem(c.clone()),
        key: PemSource::Pem(k),
    };
    let tagged = |name: &str, host: &str| Route {
        filters: vec![Filter::RequestHeaders(HeaderModifier {
            set: vec![sweety_config::HeaderValue {
                name: "x-route".into(),
                value: host.into(),
            }],
            ..Default::default()
        })],
        ..proxy_route(name, "/", "be")
    };
    let mut deny = fixed_route("a-admin", "/admin", "denied\n");
    if let Action::Fixed(f) = &mut deny.action {
        f.status = 403;
    }
    // A request still carrying `x-hop` (which hostile rows name in `Connection`) when it is
    // routed meets this deny: hop-by-hop fields must be gone before matching.
    let mut hop = deny.clone();
    hop.name = "a-hop".into();
    hop.matches[0].path = Some(PathMatch::Prefix("/".into()));
    hop.matches[0].headers = vec![HeaderMatch {
        name: "x-hop".into(),
        value: "1".into(),
        kind: MatchKind::Exact,
    }];
    // A static route (a POST there is 405 once routed: a framing refusal must come first).
    let files = Route {
        action: Action::Static(StaticSite {
            root: root.to_path_buf(),
            index: vec![],
            try_files: vec![],
            precompressed: false,
            cache_control: None,
            strip_prefix: Some("/files".into()),
            hide_dotfiles: true,
        }),
        ..fixed_route("b-files", "/files", "")
    };
    let cfg = Config {
        generation: 1,
        listeners: vec![
            listener("web", ListenerProtocol::Http),
            Listener {
                tls: Some(ListenerTls {
                    certificates: vec![cert],
                    min_version: TlsVersion::Tls12,
                    client_auth: None,
                    host_client_auth: Vec::new(),
                }),
                http3: true,
                ..listener("tls", ListenerProtocol::Https)
            },
        ],
        virtual_hosts: vec![
            vhost("a", &["a.test"], vec![deny, hop, tagged("a-all", "a.test")]),
            vhost("b", &["b.test"], vec![files, tagged("b-all", "b.test")]),
            // Any other host (none, or one that lost its identity) is proxied too, tagged
            // with a name no Host can equal: reaching the backend through it is a violation.
            vhost("any", &[], vec![tagged("any-all", "no host")]),
        ],
        backends: vec![backend("be", backend_addr)],
        limits: Limits {
            http2_engine: engine,
            http1_engine: h1,
            ..Limits::default()
        },
        ..Config::default()
    };
    (cfg, c)
}

/// What a row expects.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// A 4xx/5xx, a stream or connection error; nothing reaches the backend.
    Refused,
    /// Answered by the `/admin` deny route (403) or refused; nothing reaches the backend.
    Denied,
    /// 400 (or a stream or connection error), whatever the route would have answered;
    /// nothing reaches the backend.
    BadRequest,
    /// 200, exactly one backend request: this path, this host, this body length.
    Served(&'static str, &'static str, usize),
    /// Only the invariants (and at most one backend request).
    Any,
}

/// What the client saw.
#[derive(Debug)]
enum Outcome {
    Status(u16),
    /// A stream reset, a connection error or close without a response (the text is shown by
    /// `Debug` in failure messages).
    #[allow(dead_code)]
    Error(String),
}

struct Env {
    h: Harness,
    _root: tempfile::TempDir,
    log: Shared,
    web: SocketAddr,
    tls: SocketAddr,
    ca: String,
}

impl Env {
    async fn start_on(engine: Http2Engine, h1: Http1Engine) -> Env {
        let log: Shared = Arc::default();
        let be = recording_backend(log.clone()).await;
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("f.txt"), b"file\n").unwrap();
        let (cfg, ca) = config(be, engine, h1, root.path());
        let h = Harness::start(cfg).await;
        let web = h.addr("web").await;
        let tls = h.addr("tls").await;
        Env {
            h,
            _root: root,
            log,
            web,
            tls,
            ca,
        }
    }

    /// Judges one row against what the backend recorded, then sends the canary; returns the
    /// failures.
    async fn judge(&self, name: &str, expect: Expect, got: Outcome) -> Vec<String> {
        // Let a backend connection the row left half-read report its stall.
        let (seen, violations) = {
            let mut l = self.log.lock().unwrap();
            (
                std::mem::take(&mut l.seen),
                std::mem::take(&mut l.violations),
            )
        };
        let mut fails: Vec<String> = violations
            .into_iter()
            .map(|v| format!("{name}: backend: {v}"))
            .collect();
        let status = match &got {
            Outcome::Status(s) => Some(*s),
            Outcome::Error(_) => None,
        };
        match expect {
            Expect::Refused | Expect::Denied | Expect::BadRequest => {
                let ok_status = match expect {
                    Expect::Denied => status.is_none_or(|s| s == 403 || s == 400),
                    Expect::BadRequest => status.is_none_or(|s| s == 400),
                    _ => status.is_none_or(|s| s >= 400),
                };
                if !ok_status {
                    fails.push(format!("{name}: client got {got:?}, want a refusal"));
                }
                if !seen.is_empty() {
                    fails.push(format!("{name}: reached the backend: {seen:?}"));
                }
            }
            Expect::Served(path, host, body) => {
                if status != Some(200) {
                    fails.push(format!("{name}: client got {got:?}, want 200"));
                }
                match seen.as_slice() {
                    [s] if s.path == path && s.host == host && s.body == body => {}
                    other => fails.push(format!(
                        "{name}: backend saw {other:?}, want one {host} {path} with a {body}-byte body"
                    )),
                }
            }
            Expect::Any => {
                if seen.len() > 1 {
                    fails.push(format!("{name}: {} backend requests: {seen:?}", seen.len()));
                }
            }
        }
        // The canary: its own request on a fresh connection, through the pool.
        let canary = h1_raw(
            self.web,
            b"GET /canary HTTP/1.1\r\nHost: a.test\r\n\r\n".to_vec(),
        )
        .await;
        let (seen, violations) = {
            let mut l = self.log.lock().unwrap();
            (
                std::mem::take(&mut l.seen),
                std::mem::take(&mut l.violations),
            )
        };
        let canary_ok = matches!(canary, Outcome::Status(200))
            && matches!(seen.as_slice(), [s] if s.path == "/canary")
            && violations.is_empty();
        if !canary_ok {
            fails.push(format!(
                "{name}: canary after the row: {canary:?}, backend saw {seen:?}, {violations:?}"
            ));
        }
        fails
    }
}

/// Sends raw HTTP/1.1 bytes on a new connection; the first response's status.
async fn h1_raw(addr: SocketAddr, bytes: Vec<u8>) -> Outcome {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(&bytes).await;
    let mut buf = BytesMut::new();
    let deadline = tokio::time::Instant::now() + ROW;
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut fields);
        if let Ok(httparse::Status::Complete(_)) = resp.parse(&buf) {
            return Outcome::Status(resp.code.unwrap_or(0));
        }
        match tokio::time::timeout_at(deadline, s.read_buf(&mut buf)).await {
            Err(_) => return Outcome::Error("no response in time".into()),
            Ok(Ok(0)) => return Outcome::Error("closed without a response".into()),
            Ok(Err(e)) => return Outcome::Error(format!("read: {e}")),
            Ok(Ok(_)) => {}
        }
    }
}

fn h1_rows() -> Vec<Row<Vec<u8>>> {
    use Expect::*;
    let r = |s: &str| s.as_bytes().to_vec();
    let mut rows: Vec<(&str, Vec<u8>, Expect)> = vec![
        ("baseline", r("GET /x HTTP/1.1\r\nHost: a.test\r\n\r\n"), Served("/x", "a.test", 0)),
        ("body with content-length", r("POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\nhello"), Served("/x", "a.test", 5)),
        ("chunked body", r("POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), Served("/x", "a.test", 5)),
        // Host identity.
        ("duplicate host", r("GET /x HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"), Refused),
        ("missing host", r("GET /x HTTP/1.1\r\n\r\n"), Refused),
        ("absolute-form wins over host", r("GET http://b.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n"), Served("/x", "b.test", 0)),
        ("absolute-form userinfo", r("GET http://u@b.test/x HTTP/1.1\r\nHost: b.test\r\n\r\n"), Refused),
        ("host userinfo", r("GET /x HTTP/1.1\r\nHost: u@b.test\r\n\r\n"), Refused),
        ("host case and trailing dot", r("GET /x HTTP/1.1\r\nHost: B.Test.\r\n\r\n"), Served("/x", "b.test", 0)),
        ("asterisk form", r("OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n"), Any),
        ("query-only target", r("GET ?x HTTP/1.1\r\nHost: a.test\r\n\r\n"), Refused),
        // Smuggling corpus.
        // TE with CL: refused with 400 on every route kind, as HAProxy and nginx do (RFC 9112
        // §6.1; hyper alone would drop the Content-Length and serve the chunked reading).
        ("CL.TE", r("POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG"), BadRequest),
        ("TE.CL", r("POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n"), BadRequest),
        ("TE first then CL", r("POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n"), BadRequest),
        ("CL zero with TE", r("POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), BadRequest),
        ("CL.TE on a fixed reply", r("POST /admin HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), BadRequest),
        ("CL.TE on a static route", r("POST /files/f.txt HTTP/1.1\r\nHost: b.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), BadRequest),
        ("CL.TE GET on a static route", r("GET /files/f.txt HTTP/1.1\r\nHost: b.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), BadRequest),
        ("CL.TE on no route's host", r("POST /x HTTP/1.1\r\nHost: c.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n"), BadRequest),
        ("TE.TE chunked then identity", r("POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), Refused),
        ("TE xchunked with CL", r("POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nTransfer-Encoding: xchunked\r\n\r\nhello"), Refused),
        ("TE space before colon", r("POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"), Refused),
        ("TE tab value", r("POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding:\tchunked\r\n\r\n0\r\n\r\n"), Any),
        ("TE chunked, chunked", r("POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n"), Refused),
        ("TE obs-folded", r("POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 5\r\n\r\nhello"), Refused),
        ("obs-fold", r("GET /x HTTP/1.1\r\nHost: a.test\r\nX-A: one\r\n two\r\n\r\n"), Refused),
        ("two content-lengths", r("POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"), Refused),
        ("content-length list", r("POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5, 6\r\n\r\nhello!"), Refused),
        ("content-length plus sign", r("POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: +5\r\n\r\nhello"), Refused),
        ("oversized chunk size", r("POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFFFF\r\nx\r\n0\r\n\r\n"), Any),
        ("chunk size overflowing 64 bits", r("POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000001\r\nx\r\n0\r\n\r\n"), Any),
        ("bare CR in a value", r("GET /x HTTP/1.1\r\nHost: a.test\r\nX-A: a\rb\r\n\r\n"), Refused),
        ("bare LF line ends", r("GET /x HTTP/1.1\nHost: a.test\n\n"), Any),
        ("NUL in a value", r("GET /x HTTP/1.1\r\nHost: a.test\r\nX-A: a\0b\r\n\r\n"), Refused),
        ("NUL in the target", r("GET /x\0y HTTP/1.1\r\nHost: a.test\r\n\r\n"), Refused),
        ("space in a field name", r("GET /x HTTP/1.1\r\nHost: a.test\r\nX A: b\r\n\r\n"), Refused),
        ("connection-named field", r("GET /x HTTP/1.1\r\nHost: a.test\r\nConnection: x-hop\r\nX-Hop: 1\r\n\r\n"), Served("/x", "a.test", 0)),
        ("pipelined smuggle in a CL body", r("POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 37\r\n\r\nGET /admin HTTP/1.1\r\nHost: a.test\r\n\r\n"), Served("/x", "a.test", 37)),
    ];
    let spoofed: String = SPOOFED_FORWARDING
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    rows.push((
        "spoofed forwarding fields",
        r(&format!("GET /x HTTP/1.1\r\nHost: a.test\r\n{spoofed}\r\n")),
        Served("/x", "a.test", 0),
    ));
    let mut out: Vec<Row<Vec<u8>>> = rows
        .into_iter()
        .map(|(name, bytes, expect)| (name.to_string(), expect, bytes))
        .collect();
    for (name, path, expect) in PATH_ROWS {
        let req = format!("GET {path} HTTP/1.1\r\nHost: a.test\r\n\r\n");
        out.push((format!("{name} {path}"), expect, req.into_bytes()));
    }
    out
}

#[tokio::test]
async fn http1_hostile_requests_meet_the_backend_oracle() {
    let rows = h1_rows();
    run_table_on(
        "HTTP/1.1",
        Http2Engine::Sweety,
        Http1Engine::Sweety,
        rows,
        async |env: &Env, bytes: &Vec<u8>| h1_raw(env.web, bytes.clone()).await,
    )
    .await;
}

/// The same table on hyper's HTTP/1.1 engine (`limits.http1_engine: hyper`): both engines
/// meet the same expectations row by row.
#[tokio::test]
async fn http1_hostile_requests_meet_the_backend_oracle_on_hypers_engine() {
    let rows = h1_rows();
    run_table_on(
        "HTTP/1.1 hyper",
        Http2Engine::Sweety,
        Http1Engine::Hyper,
        rows,
        async |env: &Env, bytes: &Vec<u8>| h1_raw(env.web, bytes.clone()).await,
    )
    .await;
}

/// Every response on one connection until it closes (or [`ROW`] passes): their statuses.
async fn h1_statuses(addr: SocketAddr, bytes: &[u8]) -> Vec<u16> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut buf = BytesMut::new();
    let deadline = tokio::time::Instant::now() + ROW;
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, s.read_buf(&mut buf)).await {
        if n == 0 {
            break;
        }
    }
    let mut out = Vec::new();
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut fields);
        let Ok(httparse::Status::Complete(n)) = resp.parse(&buf) else {
            return out;
        };
        let len: usize = resp
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
            .unwrap_or(0);
        out.push(resp.code.unwrap_or(0));
        buf.advance((n + len).min(buf.len()));
    }
}

/// The framing conflict on a kept-alive connection: the requests before it are served, it
/// is refused with 400 (not answered by its route) and nothing after it is read.
#[tokio::test]
async fn http1_a_framing_conflict_after_served_requests_is_refused_and_ends_the_connection() {
    for h1 in [Http1Engine::Sweety, Http1Engine::Hyper] {
        framing_conflict_after_served_requests(h1).await;
    }
}

async fn framing_conflict_after_served_requests(h1: Http1Engine) {
    let env = Env::start_on(Http2Engine::Sweety, h1).await;
    let pipelined = b"GET /files/f.txt HTTP/1.1\r\nHost: b.test\r\n\r\n\
        POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\nabc\
        POST /files/f.txt HTTP/1.1\r\nHost: b.test\r\nTransfer-Encoding: chunked\r\n\
        Content-Length: 40\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\nHost: a.test\r\n\r\n";
    let statuses = h1_statuses(env.web, pipelined).await;
    let seen = std::mem::take(&mut env.log.lock().unwrap().seen);
    assert_eq!(statuses, [200, 200, 400], "{h1:?}: backend saw {seen:?}");
    assert!(
        matches!(seen.as_slice(), [s] if s.path == "/x" && s.body == 3),
        "{h1:?}: only the second request reaches the backend: {seen:?}"
    );
}

/// On hyper's engine, where the HTTP/1.1 framing tracker stops following a connection (an
/// `Upgrade` not taken, a Content-Length it does not read, such as `3, 3`), that request's
/// answer ends the connection: a request with both framing fields after it is never read, let
/// alone routed. (Sweety's engine reads every head itself: see the next test.)
#[tokio::test]
async fn http1_untracked_heads_end_the_connection_before_a_framing_conflict() {
    let env = Env::start_on(Http2Engine::Sweety, Http1Engine::Hyper).await;
    let conflict = "POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\
        Content-Length: 40\r\n\r\n0\r\n\r\n";
    for first in [
        "GET /files/f.txt HTTP/1.1\r\nHost: b.test\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
        "POST /files/f.txt HTTP/1.1\r\nHost: b.test\r\nContent-Length: 3, 3\r\n\r\nabc",
    ] {
        let statuses = h1_statuses(env.web, format!("{first}{conflict}").as_bytes()).await;
        let seen = std::mem::take(&mut env.log.lock().unwrap().seen);
        assert_eq!(
            statuses.len(),
            1,
            "{first:?}: answered {statuses:?}, backend saw {seen:?}"
        );
        assert!(seen.is_empty(), "{first:?}: backend saw {seen:?}");
    }
}

/// On Sweety's engine an `Upgrade` not taken leaves the connection framed as before: the
/// request after it is read by its own head, and one with both framing fields is refused
/// (400) without reaching the backend; `Content-Length: 3, 3` is refused at once (400) and
/// nothing after it is read.
#[tokio::test]
async fn http1_heads_after_an_upgrade_not_taken_are_still_checked_on_sweetys_engine() {
    let env = Env::start_on(Http2Engine::Sweety, Http1Engine::Sweety).await;
    let conflict = "POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\
        Content-Length: 40\r\n\r\n0\r\n\r\n";
    for (first, want) in [
        (
            "GET /files/f.txt HTTP/1.1\r\nHost: b.test\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
            &[200u16, 400][..],
        ),
        (
            "POST /files/f.txt HTTP/1.1\r\nHost: b.test\r\nContent-Length: 3, 3\r\n\r\nabc",
            &[400][..],
        ),
    ] {
        let statuses = h1_statuses(env.web, format!("{first}{conflict}").as_bytes()).await;
        let seen = std::mem::take(&mut env.log.lock().unwrap().seen);
        assert_eq!(statuses, want, "{first:?}: backend saw {seen:?}");
        assert!(seen.is_empty(), "{first:?}: backend saw {seen:?}");
    }
}

/// One raw HTTP/2 request: pseudo-fields and fields as literals, then DATA frames (the
/// last with END_STREAM; none: END_STREAM on HEADERS).
struct H2Req {
    fields: Vec<(&'static str, &'static [u8])>,
    data: Vec<&'static [u8]>,
}

fn h2_rows() -> Vec<Row<H2Req>> {
    use Expect::*;
    let get = |path: &'static str| -> Vec<(&'static str, &'static [u8])> {
        vec![
            (":method", b"GET"),
            (":scheme", b"http"),
            (":authority", b"a.test"),
            (":path", path.as_bytes()),
        ]
    };
    let post = |extra: Vec<(&'static str, &'static [u8])>| {
        let mut f: Vec<(&'static str, &'static [u8])> = vec![
            (":method", b"POST"),
            (":scheme", b"http"),
            (":authority", b"a.test"),
            (":path", b"/x"),
        ];
        f.extend(extra);
        f
    };
    let with = |mut f: Vec<(&'static str, &'static [u8])>,
                extra: Vec<(&'static str, &'static [u8])>| {
        f.extend(extra);
        f
    };
    let row = |name: &str, fields, data, expect| (name.to_string(), expect, H2Req { fields, data });
    let mut rows = vec![
        row("baseline", get("/x"), vec![], Served("/x", "a.test", 0)),
        row(
            "body with content-length",
            post(vec![("content-length", b"5")]),
            vec![b"hello"],
            Served("/x", "a.test", 5),
        ),
        row(
            "body without content-length",
            post(vec![]),
            vec![b"hel", b"lo"],
            Served("/x", "a.test", 5),
        ),
        // Body framing.
        row(
            "content-length, no DATA",
            post(vec![("content-length", b"5")]),
            vec![],
            Refused,
        ),
        row(
            "content-length above the DATA",
            post(vec![("content-length", b"5")]),
            vec![b"hel"],
            Refused,
        ),
        row(
            "content-length below the DATA",
            post(vec![("content-length", b"2")]),
            vec![b"hello"],
            Refused,
        ),
        row(
            "two content-lengths",
            post(vec![("content-length", b"5"), ("content-length", b"6")]),
            vec![b"hello"],
            Refused,
        ),
        // Connection-specific fields.
        row(
            "te gzip",
            with(get("/x"), vec![("te", b"gzip")]),
            vec![],
            Refused,
        ),
        row(
            "te trailers",
            with(get("/x"), vec![("te", b"trailers")]),
            vec![],
            Served("/x", "a.test", 0),
        ),
        row(
            "connection field",
            with(get("/x"), vec![("connection", b"keep-alive")]),
            vec![],
            Refused,
        ),
        row(
            "transfer-encoding",
            post(vec![("transfer-encoding", b"chunked")]),
            vec![b"0\r\n\r\n"],
            Refused,
        ),
        row(
            "keep-alive field",
            with(get("/x"), vec![("keep-alive", b"timeout=5")]),
            vec![],
            Refused,
        ),
        row(
            "upgrade field",
            with(get("/x"), vec![("upgrade", b"websocket")]),
            vec![],
            Refused,
        ),
        // Host identity.
        row(
            "authority and host disagree",
            with(get("/x"), vec![("host", b"b.test")]),
            vec![],
            Refused,
        ),
        row(
            "authority and host agree",
            with(get("/x"), vec![("host", b"a.test")]),
            vec![],
            Served("/x", "a.test", 0),
        ),
        row(
            "authority and two hosts",
            with(get("/x"), vec![("host", b"a.test"), ("host", b"b.test")]),
            vec![],
            Refused,
        ),
        row(
            "host only",
            vec![
                (":method", b"GET"),
                (":scheme", b"http"),
                (":path", b"/x"),
                ("host", b"b.test"),
            ],
            vec![],
            Served("/x", "b.test", 0),
        ),
        row(
            "two hosts, no authority",
            vec![
                (":method", b"GET"),
                (":scheme", b"http"),
                (":path", b"/x"),
                ("host", b"a.test"),
                ("host", b"b.test"),
            ],
            vec![],
            Refused,
        ),
        row(
            "authority userinfo",
            vec![
                (":method", b"GET"),
                (":scheme", b"http"),
                (":authority", b"u@b.test"),
                (":path", b"/x"),
            ],
            vec![],
            Refused,
        ),
        // Paths.
        row(":path *", get("*"), vec![], Refused),
        row(":path ?x", get("?x"), vec![], Refused),
        row(":path empty", get(""), vec![], Refused),
        // Field values.
        row(
            "NUL in a value",
            with(get("/x"), vec![("x-a", b"a\0b")]),
            vec![],
            Refused,
        ),
        row(
            "CR in a value",
            with(get("/x"), vec![("x-a", b"a\rb")]),
            vec![],
            Refused,
        ),
        row(
            "LF in a value",
            with(get("/x"), vec![("x-a", b"a\nb")]),
            vec![],
            Refused,
        ),
        row(
            "upper-case field name",
            with(get("/x"), vec![("X-A", b"b")]),
            vec![],
            Refused,
        ),
    ];
    let spoofed = SPOOFED_FORWARDING.map(|(n, v)| (n, v.as_bytes()));
    rows.push(row(
        "spoofed forwarding fields",
        with(get("/x"), spoofed.to_vec()),
        vec![],
        Served("/x", "a.test", 0),
    ));
    for (name, path, expect) in PATH_ROWS {
        rows.push(row(&format!("{name} {path}"), get(path), vec![], expect));
    }
    rows
}

/// Sends one row on a new h2c connection (stream 1); the outcome.
async fn h2_raw(addr: SocketAddr, row: &H2Req) -> Outcome {
    let (mut rd, mut wr) = raw2::open(addr).await;
    let mut block = Vec::new();
    for (n, v) in &row.fields {
        raw2::literal_field(&mut block, n, v);
    }
    let flags = raw2::END_HEADERS
        | if row.data.is_empty() {
            raw2::END_STREAM
        } else {
            0
        };
    let mut out = raw2::frame(raw2::HEADERS, flags, 1, &block);
    for (i, d) in row.data.iter().enumerate() {
        let last = i + 1 == row.data.len();
        out.extend(raw2::frame(
            raw2::DATA,
            if last { raw2::END_STREAM } else { 0 },
            1,
            d,
        ));
    }
    let _ = wr.write_all(&out).await;
    let deadline = tokio::time::Instant::now() + ROW;
    loop {
        match rd.next(deadline).await {
            raw2::Event::Frame(f) => {
                if f.ty == raw2::SETTINGS && f.flags & raw2::ACK == 0 {
                    let _ = wr
                        .write_all(&raw2::frame(raw2::SETTINGS, raw2::ACK, 0, &[]))
                        .await;
                } else if f.ty == raw2::HEADERS && f.stream == 1 {
                    return Outcome::Status(f.status.unwrap_or(0));
                } else if f.ty == raw2::RST_STREAM && f.stream == 1 {
                    return Outcome::Error(format!("RST_STREAM {}", f.error_code()));
                } else if f.ty == raw2::GOAWAY {
                    return Outcome::Error(format!("GOAWAY {}", f.error_code()));
                }
            }
            raw2::Event::Closed => return Outcome::Error("closed".into()),
            raw2::Event::Timeout => return Outcome::Error("no response in time".into()),
        }
    }
}

async fn h2_table(engine: Http2Engine) {
    let label = format!("HTTP/2 {engine:?}");
    run_table(&label, engine, h2_rows(), async |env: &Env, req: &H2Req| {
        h2_raw(env.web, req).await
    })
    .await;
}

#[tokio::test]
async fn http2_hostile_requests_meet_the_backend_oracle_on_sweetys_engine() {
    h2_table(Http2Engine::Sweety).await;
}

#[tokio::test]
async fn http2_hostile_requests_meet_the_backend_oracle_on_hyper() {
    h2_table(Http2Engine::Hyper).await;
}

/// An HTTP/3 request: URI (its authority is `:authority`), fields, DATA frames.
struct H3Req {
    method: &'static str,
    uri: String,
    fields: Vec<(&'static str, &'static str)>,
    data: Vec<&'static [u8]>,
}

fn h3_rows() -> Vec<Row<H3Req>> {
    use Expect::*;
    let row = |name: &str, method, uri: &str, fields, data, expect| {
        let uri = uri.to_string();
        (
            name.to_string(),
            expect,
            H3Req {
                method,
                uri,
                fields,
                data,
            },
        )
    };
    let mut rows = vec![
        row(
            "baseline",
            "GET",
            "https://a.test/x",
            vec![],
            vec![],
            Served("/x", "a.test", 0),
        ),
        row(
            "body with content-length",
            "POST",
            "https://a.test/x",
            vec![("content-length", "5")],
            vec![b"hello"],
            Served("/x", "a.test", 5),
        ),
        row(
            "content-length, no DATA",
            "POST",
            "https://a.test/x",
            vec![("content-length", "5")],
            vec![],
            Refused,
        ),
        row(
            "content-length above the DATA",
            "POST",
            "https://a.test/x",
            vec![("content-length", "5")],
            vec![b"hel"],
            Refused,
        ),
        row(
            "content-length below the DATA",
            "POST",
            "https://a.test/x",
            vec![("content-length", "2")],
            vec![b"hello"],
            Refused,
        ),
        row(
            "authority and host disagree",
            "GET",
            "https://a.test/x",
            vec![("host", "b.test")],
            vec![],
            Refused,
        ),
        row(
            "authority and host agree",
            "GET",
            "https://a.test/x",
            vec![("host", "a.test")],
            vec![],
            Served("/x", "a.test", 0),
        ),
        row(
            "authority and two hosts",
            "GET",
            "https://a.test/x",
            vec![("host", "a.test"), ("host", "b.test")],
            vec![],
            Refused,
        ),
        row(
            "two content-lengths",
            "POST",
            "https://a.test/x",
            vec![("content-length", "5"), ("content-length", "6")],
            vec![b"hello"],
            Refused,
        ),
        row(
            "transfer-encoding chunked",
            "POST",
            "https://a.test/x",
            vec![("transfer-encoding", "chunked")],
            vec![b"hello"],
            Refused,
        ),
        row(
            "authority userinfo",
            "GET",
            "https://u@a.test/x",
            vec![],
            vec![],
            Refused,
        ),
        row(
            "te gzip",
            "GET",
            "https://a.test/x",
            vec![("te", "gzip")],
            vec![],
            Refused,
        ),
    ];
    rows.push(row(
        "spoofed forwarding fields",
        "GET",
        "https://a.test/x",
        SPOOFED_FORWARDING.to_vec(),
        vec![],
        Served("/x", "a.test", 0),
    ));
    for (name, path, expect) in PATH_ROWS {
        let uri = format!("https://a.test{path}");
        rows.push(row(
            &format!("{name} {path}"),
            "GET",
            &uri,
            vec![],
            vec![],
            expect,
        ));
    }
    rows
}

fn h3_client(ca_pem: &str) -> quinn::ClientConfig {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    quinn::ClientConfig::new(Arc::new(crypto))
}

/// Sends one row on a new HTTP/3 connection; the outcome.
async fn h3_raw(addr: SocketAddr, ca: &str, row: &H3Req) -> Outcome {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(h3_client(ca));
    let run = async {
        let conn = endpoint
            .connect(addr, "a.test")
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = driver.wait_idle().await;
        });
        let mut b = http::Request::builder()
            .method(row.method)
            .uri(row.uri.as_str());
        for (k, v) in &row.fields {
            b = b.header(*k, *v);
        }
        let mut s = send
            .send_request(b.body(()).map_err(|e| e.to_string())?)
            .await
            .map_err(|e| format!("send_request: {e}"))?;
        for d in &row.data {
            s.send_data(Bytes::from_static(d))
                .await
                .map_err(|e| e.to_string())?;
        }
        s.finish().await.map_err(|e| e.to_string())?;
        let resp = s.recv_response().await.map_err(|e| e.to_string())?;
        Ok::<u16, String>(resp.status().as_u16())
    };
    match tokio::time::timeout(ROW, run).await {
        Ok(Ok(s)) => Outcome::Status(s),
        Ok(Err(e)) => Outcome::Error(e),
        Err(_) => Outcome::Error("no response in time".into()),
    }
}

#[tokio::test]
async fn http3_hostile_requests_meet_the_backend_oracle() {
    run_table(
        "HTTP/3",
        Http2Engine::Sweety,
        h3_rows(),
        async |env: &Env, req: &H3Req| h3_raw(env.tls, &env.ca, req).await,
    )
    .await;
}

#[test]
fn the_oracles_own_helpers() {
    assert!(is_normal("/a/b/"));
    assert!(is_normal("/"));
    assert!(!is_normal("//a"));
    assert!(!is_normal("/a/./b"));
    assert!(!is_normal("/a/%2e%2e/b") || !reaches_admin("/a/%2e%2e/b"));
    assert!(!is_normal("/%61"));
    assert!(is_normal("/%2F"));
    assert!(reaches_admin("/x/%2e%2e/admin"));
    assert!(reaches_admin("//admin/"));
    assert!(reaches_admin("/x%5c..%5cadmin"));
    assert!(!reaches_admin("/administrator-x/../y"));
    assert_eq!(dechunk(b"5\r\nhello\r\n0\r\n\r\n"), Ok(Some((15, 5))));
    assert_eq!(dechunk(b"5\r\nhel"), Ok(None));
    assert!(dechunk(b"5\r\nhelloX\r\n").is_err());
}
