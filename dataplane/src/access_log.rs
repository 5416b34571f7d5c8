//! The access log, written off the request path: one line per request, JSON (the schema in
//! docs/observability.md "Access log") or an ingress-nginx-like text line
//! ([`AccessLogFormat::Combined`]).
//!
//! Requests hand a small [`LogLine`] to a bounded channel with `try_send`; a writer thread
//! formats and writes them. When the writer falls behind the channel fills, lines are dropped
//! and counted in `sweety_access_log_dropped_total`: a request never waits for the log. With
//! the log off nothing is captured or allocated for it (`RequestCtx::log`).
//!
//! Every value from a client (path, authority, user agent, referer…) is escaped so that it
//! cannot break a line: JSON escapes control characters, quotes and backslashes; the text
//! format writes them (and every byte outside printable ASCII) as `\xHH`, as nginx does.

use crate::metrics::Metrics;
use serde::Serialize;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
pub use sweety_config::AccessLogFormat;
use tokio::sync::mpsc;

/// One access log record: the JSON schema (absent fields were not known for the request).
#[derive(Debug, Serialize)]
pub struct LogLine {
    /// When the request started (RFC 3339, UTC, milliseconds).
    #[serde(rename = "time", serialize_with = "ser_time")]
    pub ts_ms: u64,
    /// The request's `X-Request-Id` (see `crate::request_id`).
    pub request_id: String,
    /// Listener name.
    pub listener: Arc<str>,
    /// The connection's peer address.
    pub client_addr: IpAddr,
    /// The connection's peer port.
    pub client_port: u16,
    /// The real client: the peer, or the address trusted proxies named.
    pub real_client_ip: IpAddr,
    /// Protocol (`HTTP/1.1`, `HTTP/2`, `HTTP/3`).
    pub protocol: &'static str,
    /// Method.
    pub method: String,
    /// Host the request was routed by (lower case, no port).
    pub authority: String,
    /// Path and query as received.
    pub path: String,
    /// Response status.
    pub status: u16,
    /// Route name (`-` when none matched).
    pub route: Arc<str>,
    /// Response body bytes sent.
    pub bytes_sent: u64,
    /// Request body bytes received (read by the proxy; 0 without a body or when the route
    /// does not proxy).
    pub bytes_received: u64,
    /// Microseconds from request start to the end of the response body.
    pub duration_us: u64,
    /// The backend the proxy chose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The endpoint of the proxy's last try.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_addr: Option<String>,
    /// The status the endpoint answered (absent: no answer, e.g. connect error or timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    /// Microseconds from the proxy's first try to the response head (or the failure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_header_us: Option<u64>,
    /// Microseconds the proxy's last try took to get its connection (pooled: about 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_connect_us: Option<u64>,
    /// Microseconds from the proxy's first try to the end of the response body (a backend
    /// answered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_response_us: Option<u64>,
    /// The proxy's tries after the first.
    pub retries: u32,
    /// Whether the connection is TLS (or QUIC).
    pub tls: bool,
    /// TLS server name the client sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sni: Option<Arc<str>>,
    /// Negotiated TLS version (`TLSv1.2`, `TLSv1.3`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_version: Option<&'static str>,
    /// Negotiated cipher suite (rustls' name), when known (not over QUIC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cipher: Option<&'static str>,
    /// `User-Agent`, when sent (invalid UTF-8 replaced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    /// `Referer`, when sent (invalid UTF-8 replaced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub referer: Option<String>,
    /// The cache's verdict (`HIT`, `MISS`, `STALE`) on routes that cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<&'static str>,
}

fn ser_time<S: serde::Serializer>(ms: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*ms))
}

/// Days since 1970-01-01 as (year, month, day) (proleptic Gregorian; H. Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `ms` since the epoch as RFC 3339 UTC with milliseconds: `2026-11-27T11:58:03.123Z`.
pub fn rfc3339(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let (y, mo, d) = civil(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        t / 3600,
        t / 60 % 60,
        t % 60,
        ms % 1000
    )
}

/// `ms` since the epoch as nginx's `$time_local` in UTC: `27/Nov/2026:11:58:03 +0000`.
fn time_local(ms: u64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = (ms / 1000) as i64;
    let (y, mo, d) = civil(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    format!(
        "{d:02}/{}/{y:04}:{:02}:{:02}:{:02} +0000",
        MONTHS[(mo - 1) as usize],
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// Appends `s` with `"`, `\`, and every byte outside printable ASCII as `\xHH`.
fn escaped(out: &mut Vec<u8>, s: &str) {
    for &b in s.as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            out.push(b);
        } else {
            let _ = write!(out, "\\x{b:02X}");
        }
    }
}

/// A value or `-`, escaped.
fn field(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) if !s.is_empty() => escaped(out, s),
        _ => out.push(b'-'),
    }
}

/// The text line: nginx's `combined` followed by ingress-nginx's "upstreaminfo" additions,
/// `$remote_addr - - [$time_local] "$request" $status $bytes_sent "$referer" "$user_agent"
/// $request_time [$route] [$backend] $upstream_addr $upstream_status
/// $upstream_header_time $retries $cache $request_id` (times in seconds, `-` when unknown).
pub fn combined(l: &LogLine, out: &mut Vec<u8>) {
    let _ = write!(out, "{} - - [{}] \"", l.real_client_ip, time_local(l.ts_ms));
    escaped(out, &l.method);
    out.push(b' ');
    escaped(out, &l.path);
    out.push(b' ');
    escaped(out, l.protocol);
    let _ = write!(out, "\" {} {} \"", l.status, l.bytes_sent);
    field(out, l.referer.as_deref());
    out.extend_from_slice(b"\" \"");
    field(out, l.user_agent.as_deref());
    let _ = write!(out, "\" {:.3} [", l.duration_us as f64 / 1e6);
    escaped(out, &l.route);
    out.extend_from_slice(b"] [");
    field(out, l.backend.as_deref());
    out.extend_from_slice(b"] ");
    field(out, l.upstream_addr.as_deref());
    match l.upstream_status {
        Some(s) => {
            let _ = write!(out, " {s}");
        }
        None => out.extend_from_slice(b" -"),
    }
    match l.upstream_header_us {
        Some(us) => {
            let _ = write!(out, " {:.3}", us as f64 / 1e6);
        }
        None => out.extend_from_slice(b" -"),
    }
    let _ = write!(out, " {} ", l.retries);
    field(out, l.cache);
    out.push(b' ');
    escaped(out, &l.request_id);
}

/// One line in `format`, with its newline.
pub fn format_line(l: &LogLine, format: AccessLogFormat, out: &mut Vec<u8>) {
    match format {
        AccessLogFormat::Json => {
            let _ = serde_json::to_writer(&mut *out, l);
        }
        AccessLogFormat::Combined => combined(l, out),
    }
    out.push(b'\n');
}

/// The sending half of the access log. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AccessLog {
    tx: Option<mpsc::Sender<LogLine>>,
    metrics: Arc<Metrics>,
}

impl AccessLog {
    /// A logger that drops everything (access log disabled).
    pub fn disabled(metrics: Arc<Metrics>) -> AccessLog {
        AccessLog { tx: None, metrics }
    }

    /// Starts a writer task appending to `path` (standard output when `None`), queueing at
    /// most `buffer` lines. Must be called inside a tokio runtime.
    pub fn start(
        path: Option<PathBuf>,
        buffer: usize,
        format: AccessLogFormat,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<AccessLog> {
        let out: Box<dyn Write + Send> = match &path {
            Some(p) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            ),
            None => Box::new(std::io::stdout()),
        };
        let (tx, rx) = mpsc::channel(buffer.max(1));
        // The writer does blocking writes, so it runs on its own thread, not on a runtime worker.
        std::thread::Builder::new()
            .name("sweety-access-log".into())
            .spawn(move || writer(rx, out, format))?;
        Ok(AccessLog {
            tx: Some(tx),
            metrics,
        })
    }

    /// True when lines are being written.
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues a line, or drops and counts it when the writer is behind.
    pub fn log(&self, line: LogLine) {
        if let Some(tx) = &self.tx {
            if tx.try_send(line).is_err() {
                self.metrics.access_log_dropped.fetch_add(1, Relaxed);
            }
        }
    }
}

fn writer(mut rx: mpsc::Receiver<LogLine>, out: Box<dyn Write + Send>, format: AccessLogFormat) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    let mut buf = Vec::with_capacity(1024);
    while let Some(line) = rx.blocking_recv() {
        let mut write_one = |l: &LogLine| {
            buf.clear();
            format_line(l, format, &mut buf);
            let _ = out.write_all(&buf);
        };
        write_one(&line);
        // Drain what is queued before flushing, so bursts are written in one go.
        while let Ok(l) = rx.try_recv() {
            write_one(&l);
        }
        let _ = out.flush();
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(i: u16) -> LogLine {
        LogLine {
            ts_ms: 1_764_244_683_123,
            request_id: "0123abcd".into(),
            listener: "web".into(),
            client_addr: "127.0.0.1".parse().unwrap(),
            client_port: 5000,
            real_client_ip: "192.0.2.7".parse().unwrap(),
            protocol: "HTTP/1.1",
            method: "GET".into(),
            authority: "example.com".into(),
            path: format!("/p/{i}"),
            status: 200,
            route: "r".into(),
            bytes_sent: 12,
            bytes_received: 0,
            duration_us: 1500,
            backend: Some("app/web:80".into()),
            upstream_addr: Some("10.0.0.1:8080".into()),
            upstream_status: Some(200),
            upstream_header_us: Some(1000),
            upstream_connect_us: Some(10),
            upstream_response_us: Some(1400),
            retries: 0,
            tls: false,
            sni: None,
            tls_version: None,
            tls_cipher: None,
            user_agent: None,
            referer: None,
            cache: None,
        }
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_764_244_683_123), "2025-11-27T11:58:03.123Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(time_local(1_764_244_683_123), "27/Nov/2025:11:58:03 +0000");
    }

    #[test]
    fn combined_line_has_the_nginx_fields() {
        let mut l = line(1);
        l.user_agent = Some("curl/8".into());
        l.cache = Some("HIT");
        let mut out = Vec::new();
        format_line(&l, AccessLogFormat::Combined, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "192.0.2.7 - - [27/Nov/2025:11:58:03 +0000] \"GET /p/1 HTTP/1.1\" 200 12 \"-\" \
             \"curl/8\" 0.002 [r] [app/web:80] 10.0.0.1:8080 200 0.001 0 HIT 0123abcd\n"
        );
    }

    /// Whatever bytes a client puts into a header or the path, each format writes one line:
    /// nothing unescaped that ends it or closes a quoted field.
    #[test]
    fn hostile_values_stay_in_one_line() {
        let hostile = "a\"b\\c\nd\re\tf\u{1b}[31mg\u{7f}h\u{0}i ü \" - - [x] \"";
        let mut l = line(1);
        l.path = format!("/{hostile}");
        l.authority = hostile.into();
        l.user_agent = Some(hostile.into());
        l.referer = Some(hostile.into());
        l.method = hostile.into();
        let mut json = Vec::new();
        format_line(&l, AccessLogFormat::Json, &mut json);
        assert_eq!(json.iter().filter(|&&b| b == b'\n').count(), 1);
        assert!(
            !json.iter().any(|&b| b < 0x20 && b != b'\n'),
            "raw control byte"
        );
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["user_agent"], hostile);
        assert_eq!(v["path"], format!("/{hostile}"));
        let mut text = Vec::new();
        format_line(&l, AccessLogFormat::Combined, &mut text);
        assert_eq!(text.iter().filter(|&&b| b == b'\n').count(), 1);
        assert!(text[..text.len() - 1]
            .iter()
            .all(|b| (0x20..0x7f).contains(b)));
        // Exactly the format's own quotes: 3 pairs (request, referer, user agent).
        assert_eq!(text.iter().filter(|&&b| b == b'"').count(), 6);
        let s = String::from_utf8(text).unwrap();
        assert!(
            s.contains("a\\x22b\\x5Cc\\x0Ad\\x0De\\x09f\\x1B[31mg\\x7Fh\\x00i \\xC3\\xBC"),
            "{s}"
        );
    }

    proptest::proptest! {
        /// Any user agent and path: one line in either format, the JSON one parses back.
        #[test]
        fn any_value_gives_one_line(ua in ".{0,64}", path in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let mut l = line(1);
            l.user_agent = Some(ua.clone());
            l.path = String::from_utf8_lossy(&path).into_owned();
            for f in [AccessLogFormat::Json, AccessLogFormat::Combined] {
                let mut out = Vec::new();
                format_line(&l, f, &mut out);
                proptest::prop_assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
                proptest::prop_assert_eq!(out.last(), Some(&b'\n'));
            }
            let mut out = Vec::new();
            format_line(&l, AccessLogFormat::Json, &mut out);
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            proptest::prop_assert_eq!(v["user_agent"].as_str(), Some(ua.as_str()));
        }
    }

    #[tokio::test]
    async fn writes_json_lines_to_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("access.log");
        let m = Arc::new(Metrics::default());
        let log = AccessLog::start(Some(p.clone()), 16, AccessLogFormat::Json, m).unwrap();
        log.log(line(1));
        log.log(line(2));
        drop(log);
        let mut text = String::new();
        for _ in 0..100 {
            text = std::fs::read_to_string(&p).unwrap_or_default();
            if text.lines().count() == 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["path"], "/p/2");
        assert_eq!(lines[0]["status"], 200);
        assert_eq!(lines[0]["time"], "2025-11-27T11:58:03.123Z");
        assert_eq!(lines[0]["upstream_addr"], "10.0.0.1:8080");
        assert!(lines[0].get("sni").is_none(), "unknown fields are left out");
    }

    #[tokio::test]
    async fn drops_and_counts_when_the_writer_is_behind() {
        let m = Arc::new(Metrics::default());
        // A channel nobody reads: the second line cannot be queued.
        let (tx, _rx) = mpsc::channel(1);
        let log = AccessLog {
            tx: Some(tx),
            metrics: m.clone(),
        };
        log.log(line(1));
        log.log(line(2));
        log.log(line(3));
        assert_eq!(m.access_log_dropped.load(Relaxed), 2);
    }
}
