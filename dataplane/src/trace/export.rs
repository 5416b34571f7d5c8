//! The OTLP exporter task: takes finished spans off the bounded queue and sends them in
//! batches as one `ExportTraceServiceRequest` each, one request at a time, each abandoned after
//! `export_timeout`, with the proxy's connection pool ([`crate::proxy::pool`]: the same hyper
//! client, resolver, TLS and keep-alive as a backend's):
//!
//! * `http/protobuf`: `POST` of the protobuf (`application/x-protobuf`) to the endpoint URL over
//!   HTTP/1.1 (one idle connection kept); a 2xx answer is success.
//! * `grpc`: the unary call `opentelemetry.proto.collector.trace.v1.TraceService/Export` over
//!   HTTP/2 (one multiplexed connection, h2c for `http://`, h2 by ALPN for `https://`): the
//!   message length-prefixed, `content-type: application/grpc`, `te: trailers`, `grpc-timeout`
//!   from `export_timeout`. Success is HTTP 200 with `grpc-status: 0` in the trailers (or in
//!   the head of a trailers-only answer); anything else (UNAVAILABLE from a collector shutting
//!   down, a missing status, a malformed answer) fails the export.
//! * `https://`: rustls with `otlp_ca` as the only trust when given, else the well-known public
//!   CAs; SNI and the verified name are the endpoint's host; optional client certificate.
//!
//! Either way the answer's `ExportTraceServiceResponse` is read ([`super::reply`]): spans in
//! its `partial_success.rejected_spans` are counted as `rejected`, the rest as `exported`
//! (OTLP: such an answer is a success and must not be retried).
//!
//! A batch goes out when it has `max_batch_spans` spans or its first span has waited
//! `batch_delay`. A failed or timed-out export is not retried (the spans are counted as
//! `failed`): while the receiver is away the queue fills and later spans are dropped and
//! counted, so a dead receiver costs memory bounded by the queue and one export at a time,
//! and never a request's time. A failure or rejection is logged at `warn` at most once per
//! [`LOG_EVERY`] (with how many happened since), every one at `debug`. The receiver's answer
//! is read up to [`MAX_RESPONSE`] bytes.
//!
//! No address policy: the endpoint is operator input (a SweetyProxyConfig named by a class,
//! or the standalone file), and a collector next to the pod on 127.0.0.1 is a normal setup.

use super::{otlp, reply};
use crate::metrics::Metrics;
use crate::proxy::pool::{Connector, Pool};
use http::{header, HeaderMap, HeaderValue, Request};
use http_body_util::{BodyExt, Limited};
use prost::Message;
use std::sync::Arc;
use std::time::{Duration, Instant};
use sweety_config::{BackendProtocol, OtlpProtocol, Tracing};
use tokio::sync::mpsc::Receiver;

/// Most bytes of the receiver's answer read (an `ExportTraceServiceResponse` is small).
pub(super) const MAX_RESPONSE: usize = 64 * 1024;
/// A failing or rejecting receiver is logged at `warn` at most this often.
pub(super) const LOG_EVERY: Duration = Duration::from_secs(60);
/// The gRPC method's path.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Where exports go: the parts of a valid `http://` or `https://` endpoint URL.
#[derive(Debug)]
pub(super) struct Endpoint {
    /// `host:port` to connect to (port 80 or 443 when the URL names none).
    address: String,
    /// The URL's authority: the `Host` field (HTTP/1.1) or `:authority` (HTTP/2).
    authority: HeaderValue,
    /// The request URI: the URL's path and query (HTTP/1.1), or the absolute URI of the gRPC
    /// method (HTTP/2).
    target: http::Uri,
    /// `https://`.
    tls: bool,
    grpc: bool,
}

impl Endpoint {
    /// The endpoint of `uri` for `protocol`, when it is an `http://` or `https://` URL with a
    /// host.
    pub(super) fn of(uri: &http::Uri, protocol: OtlpProtocol) -> Option<Endpoint> {
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return None,
        };
        let authority = uri.authority()?;
        let grpc = protocol == OtlpProtocol::Grpc;
        let target = if grpc {
            let scheme = if tls { "https" } else { "http" };
            format!("{scheme}://{authority}{GRPC_EXPORT}")
                .parse()
                .ok()?
        } else {
            uri.path_and_query()
                .map_or("/", |p| p.as_str())
                .parse()
                .ok()?
        };
        Some(Endpoint {
            address: format!(
                "{}:{}",
                authority.host(),
                authority.port_u16().unwrap_or(if tls { 443 } else { 80 })
            ),
            authority: HeaderValue::from_str(authority.as_str()).ok()?,
            target,
            tls,
            grpc,
        })
    }

    /// How to connect: HTTP/1.1 or HTTP/2, TLS by `config`'s CA and client certificate.
    pub(super) fn connector(&self, config: &Tracing) -> Result<Connector, String> {
        let protocol = match (self.grpc, self.tls) {
            (false, false) => BackendProtocol::Http1,
            (false, true) => BackendProtocol::Https,
            (true, false) => BackendProtocol::H2c,
            (true, true) => BackendProtocol::H2,
        };
        let tls = if self.tls {
            let settings = sweety_config::BackendTls {
                ca: config.otlp_ca.clone(),
                well_known_ca: config.otlp_ca.is_none(),
                client_cert: config.otlp_client_cert.clone(),
                client_key: config.otlp_client_key.clone(),
                ..sweety_config::BackendTls::default()
            };
            Some(crate::proxy::tls::client_config(&settings, self.grpc)?)
        } else {
            None
        };
        Ok(Connector {
            protocol,
            tls,
            sni: None,
            external: false,
            read_ahead: sweety_config::DEFAULT_PROXY_READ_AHEAD,
            h2_client: sweety_config::Http2Client::default(),
        })
    }
}

/// Spawns the exporter of `rx` (ends when every sender is gone and the queue is sent).
pub(super) fn spawn(
    config: &Tracing,
    endpoint: Endpoint,
    connector: Connector,
    rx: Receiver<otlp::Span>,
    m: Arc<Metrics>,
) {
    let resource = otlp::Resource {
        attributes: vec![
            otlp::KeyValue::string("service.name", config.service_name.as_str()),
            otlp::KeyValue::string("service.version", env!("CARGO_PKG_VERSION")),
            otlp::KeyValue::string("telemetry.sdk.name", "sweety"),
            otlp::KeyValue::string("telemetry.sdk.language", "rust"),
        ],
    };
    let timeout = config.export_timeout.get();
    let exporter = Exporter {
        endpoint,
        connector,
        pool: Arc::new(Pool::new(1)),
        resource,
        max_batch: config.max_batch_spans.max(1) as usize,
        batch_delay: config.batch_delay.get(),
        timeout,
        // At most 60 s (validation), so at most 5 digits of milliseconds.
        grpc_timeout: HeaderValue::from_str(&format!("{}m", timeout.as_millis().max(1)))
            .expect("digits"),
        metrics: m,
        complaints: Complaints::default(),
    };
    tokio::spawn(exporter.run(rx));
}

struct Exporter {
    endpoint: Endpoint,
    connector: Connector,
    pool: Arc<Pool>,
    resource: otlp::Resource,
    max_batch: usize,
    batch_delay: Duration,
    timeout: Duration,
    grpc_timeout: HeaderValue,
    metrics: Arc<Metrics>,
    complaints: Complaints,
}

/// Rate limit of the `warn` lines about a failing or rejecting receiver.
#[derive(Debug, Default)]
struct Complaints {
    /// When the last `warn` was written.
    last: Option<Instant>,
    /// Problems since then, not written at `warn`.
    quiet: u64,
}

impl Complaints {
    /// Counts one problem; returns how many went unwritten before it when this one should be
    /// written at `warn` (the first one, then one per [`LOG_EVERY`]).
    fn note(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < LOG_EVERY => {
                self.quiet += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.quiet))
            }
        }
    }
}

/// An error and its causes, `: `-separated (TLS and connect errors keep the reason there).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

impl Exporter {
    async fn run(mut self, mut rx: Receiver<otlp::Span>) {
        let mut batch = Vec::with_capacity(self.max_batch.min(1024));
        loop {
            if rx.recv_many(&mut batch, self.max_batch).await == 0 {
                return;
            }
            let deadline = tokio::time::Instant::now() + self.batch_delay;
            let mut closed = false;
            while batch.len() < self.max_batch {
                let room = self.max_batch - batch.len();
                tokio::select! {
                    n = rx.recv_many(&mut batch, room) => if n == 0 { closed = true; break },
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
            let spans = std::mem::take(&mut batch);
            let n = spans.len() as u64;
            let outcome = match tokio::time::timeout(self.timeout, self.export(spans)).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {:?}", self.timeout)),
            };
            match outcome {
                Ok((0, _)) => self.metrics.trace_spans.add(&"exported", n),
                Ok((rejected, why)) => {
                    let rejected = rejected.min(n);
                    self.metrics.trace_spans.add(&"exported", n - rejected);
                    self.metrics.trace_spans.add(&"rejected", rejected);
                    let problem = format!("the receiver rejected {rejected} of {n} spans: {why}");
                    self.complain(&problem, n);
                }
                Err(e) => {
                    self.metrics.trace_spans.add(&"failed", n);
                    self.complain(&format!("trace export failed: {e}"), n);
                }
            }
            if closed {
                return;
            }
        }
    }

    /// Logs a failed or partly rejected export: at `debug` always, at `warn` when the rate
    /// limit lets it.
    fn complain(&mut self, problem: &str, spans: u64) {
        let endpoint = self.endpoint.authority.to_str().unwrap_or("-");
        tracing::debug!(endpoint, spans, "{problem}");
        if let Some(quiet) = self.complaints.note(Instant::now()) {
            tracing::warn!(
                endpoint,
                spans,
                problems_not_logged = quiet,
                "{problem} (logged at most once per {}s)",
                LOG_EVERY.as_secs()
            );
        }
    }

    /// Sends one batch. Ok: the spans the receiver rejected and why.
    async fn export(&self, spans: Vec<otlp::Span>) -> Result<(u64, String), String> {
        let message = otlp::ExportTraceServiceRequest {
            resource_spans: vec![otlp::ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![otlp::ScopeSpans {
                    scope: Some(otlp::InstrumentationScope {
                        name: "sweety-dataplane".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                    }),
                    spans,
                }],
            }],
        };
        let body = if self.endpoint.grpc {
            let len = message.encoded_len();
            let mut b = Vec::with_capacity(5 + len);
            b.push(0);
            b.extend_from_slice(
                &u32::try_from(len)
                    .map_err(|_| "batch too large")?
                    .to_be_bytes(),
            );
            message.encode(&mut b).map_err(|e| e.to_string())?;
            b
        } else {
            message.encode_to_vec()
        };
        let mut req = Request::new(crate::body::full(body));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = self.endpoint.target.clone();
        if self.endpoint.grpc {
            *req.version_mut() = http::Version::HTTP_2;
        }
        let h = req.headers_mut();
        h.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("sweety-dataplane/", env!("CARGO_PKG_VERSION"))),
        );
        if self.endpoint.grpc {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            h.insert(header::TE, HeaderValue::from_static("trailers"));
            h.insert("grpc-timeout", self.grpc_timeout.clone());
        } else {
            h.insert(header::HOST, self.endpoint.authority.clone());
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-protobuf"),
            );
        }
        let conn = self
            .pool
            .acquire(&self.endpoint.address, &self.connector)
            .await
            .map_err(|e| chain(&e))?;
        let (resp, _stream) = conn
            .send(&self.pool, req)
            .await
            .map_err(|e| chain(&*e.error))?;
        let (head, body) = resp.into_parts();
        if self.endpoint.grpc {
            if head.status != http::StatusCode::OK {
                return Err(format!("receiver answered HTTP {}", head.status));
            }
            // A trailers-only answer carries the status in its head.
            if let Some(status) = head.headers.get("grpc-status") {
                let _ = Limited::new(body, MAX_RESPONSE).collect().await;
                return grpc_outcome(status, &head.headers, None);
            }
            let answer = Limited::new(body, MAX_RESPONSE)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?;
            let trailers = answer.trailers().cloned().unwrap_or_default();
            let message = answer.to_bytes();
            let Some(status) = trailers.get("grpc-status") else {
                return Err("the answer has no grpc-status".into());
            };
            grpc_outcome(status, &trailers, Some(&message))
        } else {
            // Read (boundedly) so the connection can be reused.
            let answer = Limited::new(body, MAX_RESPONSE).collect().await;
            if !head.status.is_success() {
                return Err(format!("receiver answered HTTP {}", head.status));
            }
            // The status decides; a readable partial success refines it.
            Ok(answer
                .ok()
                .and_then(|a| reply::partial_success(&a.to_bytes()))
                .unwrap_or_default())
        }
    }
}

/// A gRPC answer's outcome by its `grpc-status` (from `fields`, the trailers or the head of a
/// trailers-only answer) and, on OK, its message.
fn grpc_outcome(
    status: &HeaderValue,
    fields: &HeaderMap,
    body: Option<&[u8]>,
) -> Result<(u64, String), String> {
    let text = || {
        fields
            .get("grpc-message")
            .map(|m| reply::grpc_message_text(m.as_bytes()))
            .unwrap_or_default()
    };
    match reply::grpc_status(status.as_bytes()) {
        Some(0) => match body {
            // Trailers-only with OK: no message, nothing rejected.
            None => Ok((0, String::new())),
            Some(b) => reply::grpc_unary_message(b)
                .and_then(reply::partial_success)
                .ok_or_else(|| "malformed ExportTraceServiceResponse".into()),
        },
        Some(code) => Err(format!("grpc-status {code} {}", text())),
        None => Err(format!("unreadable grpc-status {status:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_parts() {
        let e = |s: &str, p| Endpoint::of(&s.parse().unwrap(), p);
        let http = OtlpProtocol::HttpProtobuf;
        let one = e("http://collector.obs:4318/v1/traces", http).unwrap();
        assert_eq!(one.address, "collector.obs:4318");
        assert_eq!(one.authority, "collector.obs:4318");
        assert_eq!(one.target, "/v1/traces");
        assert!(!one.tls && !one.grpc);
        let v6 = e("http://[::1]/v1/traces?x=1", http).unwrap();
        assert_eq!(v6.address, "[::1]:80");
        assert_eq!(v6.authority, "[::1]");
        assert_eq!(v6.target, "/v1/traces?x=1");
        assert_eq!(e("http://c", http).unwrap().target, "/");
        let tls = e("https://c/v1/traces", http).unwrap();
        assert_eq!((tls.address.as_str(), tls.tls), ("c:443", true));
        assert!(e("/v1/traces", http).is_none());
        assert!(e("ftp://c/v1/traces", http).is_none());

        let grpc = e("http://collector.obs:4317", OtlpProtocol::Grpc).unwrap();
        assert_eq!(grpc.address, "collector.obs:4317");
        assert_eq!(
            grpc.target,
            "http://collector.obs:4317/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        assert!(grpc.grpc && !grpc.tls);
        let grpcs = e("https://[::1]/", OtlpProtocol::Grpc).unwrap();
        assert_eq!(grpcs.address, "[::1]:443");
        assert_eq!(
            grpcs.target,
            "https://[::1]/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
    }

    #[test]
    fn connectors_by_protocol_and_scheme() {
        let c = |url: &str, p| {
            let t = Tracing {
                otlp_protocol: p,
                ..Tracing::to(url)
            };
            Endpoint::of(&url.parse().unwrap(), p)
                .unwrap()
                .connector(&t)
                .unwrap()
        };
        let grpc = OtlpProtocol::Grpc;
        let http = OtlpProtocol::HttpProtobuf;
        assert_eq!(c("http://c:4317", grpc).protocol, BackendProtocol::H2c);
        assert_eq!(
            c("http://c:4318/v1/traces", http).protocol,
            BackendProtocol::Http1
        );
        let h2 = c("https://c:4317", grpc);
        assert_eq!(h2.protocol, BackendProtocol::H2);
        assert_eq!(h2.tls.unwrap().alpn_protocols, vec![b"h2".to_vec()]);
        let https = c("https://c:4318/v1/traces", http);
        assert_eq!(https.protocol, BackendProtocol::Https);
        assert_eq!(
            https.tls.unwrap().alpn_protocols,
            vec![b"http/1.1".to_vec()]
        );
        // A CA that is not one fails to start.
        let t = Tracing {
            otlp_ca: Some(sweety_config::PemSource::Pem("not pem".into())),
            ..Tracing::to("https://c:4318/v1/traces")
        };
        let e = Endpoint::of(&t.otlp_endpoint.parse().unwrap(), http).unwrap();
        assert!(e.connector(&t).unwrap_err().contains("ca"));
    }

    #[test]
    fn grpc_outcomes() {
        let v = |s: &str| HeaderValue::from_str(s).unwrap();
        let mut fields = HeaderMap::new();
        fields.insert("grpc-message", v("collector%20is%20shutting%20down"));
        assert_eq!(
            grpc_outcome(&v("14"), &fields, None),
            Err("grpc-status 14 collector is shutting down".into())
        );
        assert_eq!(
            grpc_outcome(&v("x"), &fields, None),
            Err("unreadable grpc-status \"x\"".into())
        );
        assert_eq!(grpc_outcome(&v("0"), &fields, None), Ok((0, String::new())));
        let msg = otlp::ExportTraceServiceResponse {
            partial_success: Some(otlp::ExportTracePartialSuccess {
                rejected_spans: 2,
                error_message: "too old".into(),
            }),
        }
        .encode_to_vec();
        let mut framed = vec![0];
        framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        framed.extend_from_slice(&msg);
        assert_eq!(
            grpc_outcome(&v("0"), &fields, Some(&framed)),
            Ok((2, "too old".into()))
        );
        assert!(
            grpc_outcome(&v("0"), &fields, Some(b"")).is_err(),
            "no message"
        );
    }

    #[test]
    fn complaints_are_rate_limited() {
        let mut c = Complaints::default();
        let t0 = Instant::now();
        assert_eq!(c.note(t0), Some(0));
        assert_eq!(c.note(t0 + Duration::from_secs(1)), None);
        assert_eq!(c.note(t0 + Duration::from_secs(59)), None);
        assert_eq!(c.note(t0 + LOG_EVERY), Some(2));
        assert_eq!(c.note(t0 + LOG_EVERY + Duration::from_secs(1)), None);
    }
}
