//! OpenTelemetry tracing (issue 21; docs/observability.md "Tracing"): W3C trace context
//! propagation and spans exported over OTLP (HTTP/protobuf or gRPC, plain or TLS).
//!
//! With `tracing` in the config, every request takes part in the trace context
//! ([`Tracer::begin`]): the incoming `traceparent`/`tracestate` are read strictly
//! ([`context`]) and replaced, and the backend receives a `traceparent` naming the request's
//! upstream span as its parent, under the client's trace id (or a new one when the client sent
//! no valid context). A sampled request ends as a SERVER span (the whole request, parent: the
//! client's span) and, when it was proxied, a CLIENT span (the proxy call: backend, endpoint,
//! status, retries; parent: the server span); [`RequestTrace::finish`] queues them.
//!
//! Sampling: parent-based (a valid incoming `traceparent` decides by its sampled flag) when
//! `parent_based` is on, else, and for new traces, by `sampling_ratio` over the trace id's low
//! 63 bits (OpenTelemetry's `TraceIdRatioBased`, so every hop with the same ratio agrees).
//!
//! Bounded: the queue holds `max_queue_spans` (a full queue drops the span and counts it in
//! `sweety_trace_spans_total{outcome="dropped"}`; the request never waits), the exporter
//! ([`export`]) sends batches of `max_batch_spans` one at a time, each abandoned after
//! `export_timeout`. Off (no `tracing`), the pipeline only tests an `Option`: no allocation,
//! no field is read or written.

pub mod context;
mod export;
pub mod otlp;
pub mod reply;

use crate::metrics::Metrics;
use crate::proxy::UpstreamInfo;
use http::{HeaderMap, HeaderValue, Method};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use sweety_config::Tracing;

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
#[error("tracing.otlp_endpoint {endpoint:?}: {reason}")]
pub struct TraceError {
    endpoint: String,
    reason: String,
}

/// The tracer of one `tracing` config: sampler, span queue and its exporter task.
#[derive(Debug)]
pub struct Tracer {
    config: Tracing,
    /// Sampled when the trace id's low 63 bits are below this.
    threshold: u64,
    queue: tokio::sync::mpsc::Sender<otlp::Span>,
    metrics: Arc<Metrics>,
}

/// The `TraceIdRatioBased` threshold of `ratio` over 63 bits.
fn threshold(ratio: f64) -> u64 {
    if ratio >= 1.0 {
        u64::MAX
    } else {
        // Exact for the ratios a config can hold (at most 53 significant bits).
        (ratio.max(0.0) * (1u64 << 63) as f64) as u64
    }
}

/// Whether `trace_id` falls under the ratio's `threshold`.
fn ratio_sampled(trace_id: &[u8; 16], threshold: u64) -> bool {
    let low = u64::from_be_bytes(trace_id[8..].try_into().expect("8 bytes"));
    threshold == u64::MAX || (low >> 1) < threshold
}

fn nonzero_u64() -> u64 {
    loop {
        let n = fastrand::u64(..);
        if n != 0 {
            return n;
        }
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Tracer {
    /// Starts the tracer of `config` and its exporter task. Must be called inside a tokio
    /// runtime. The exporter ends once the tracer and every request holding it are gone,
    /// after sending what was queued.
    pub fn start(config: &Tracing, metrics: Arc<Metrics>) -> Result<Arc<Tracer>, TraceError> {
        let (endpoint, connector) = config
            .otlp_endpoint
            .parse::<http::Uri>()
            .map_err(|e| e.to_string())
            .and_then(|uri| {
                export::Endpoint::of(&uri, config.otlp_protocol)
                    .ok_or_else(|| "not an http:// or https:// URL with a host".into())
            })
            .and_then(|e| e.connector(config).map(|c| (e, c)))
            .map_err(|reason| TraceError {
                endpoint: config.otlp_endpoint.clone(),
                reason,
            })?;
        let (queue, rx) = tokio::sync::mpsc::channel(config.max_queue_spans.max(1) as usize);
        export::spawn(config, endpoint, connector, rx, metrics.clone());
        Ok(Arc::new(Tracer {
            threshold: threshold(config.sampling_ratio),
            config: config.clone(),
            queue,
            metrics,
        }))
    }

    /// The config it was started from.
    pub fn config(&self) -> &Tracing {
        &self.config
    }

    /// Takes part in the trace context of one request: reads and removes the incoming
    /// `traceparent`/`tracestate` of `headers`, decides sampling, and sets the `traceparent`
    /// (and valid `tracestate`) the backend gets. Returns the request's trace when sampled.
    /// `start`: when the request was read.
    pub fn begin(
        self: &Arc<Self>,
        headers: &mut HeaderMap,
        method: &Method,
        start: Instant,
    ) -> Option<Box<RequestTrace>> {
        let incoming = context::take_incoming(headers);
        let trace_id = match &incoming.parent {
            Some(p) => p.trace_id,
            None => {
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&nonzero_u64().to_be_bytes());
                id[8..].copy_from_slice(&fastrand::u64(..).to_be_bytes());
                id
            }
        };
        let sampled = match &incoming.parent {
            Some(p) if self.config.parent_based => p.sampled(),
            _ => ratio_sampled(&trace_id, self.threshold),
        };
        let upstream_span = nonzero_u64().to_be_bytes();
        headers.insert(
            context::TRACEPARENT.clone(),
            context::traceparent_value(&trace_id, &upstream_span, sampled),
        );
        if let Some(ts) = &incoming.tracestate {
            headers.insert(context::TRACESTATE.clone(), ts.clone());
        }
        if !sampled {
            return None;
        }
        let text = |name: http::header::HeaderName| {
            headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        Some(Box::new(RequestTrace {
            tracer: self.clone(),
            trace_id,
            server_span: nonzero_u64().to_be_bytes(),
            upstream_span,
            parent: incoming.parent.map(|p| p.parent_id),
            tracestate: incoming.tracestate,
            start,
            start_unix_nanos: unix_nanos(SystemTime::now()),
            method: method.clone(),
            user_agent: text(http::header::USER_AGENT),
            host: String::new(),
            path: String::new(),
            request_id: None,
            upstream: None,
        }))
    }

    /// Queues a finished span, or drops and counts it when the queue is full.
    fn push(&self, span: otlp::Span) {
        if self.queue.try_send(span).is_err() {
            self.metrics.trace_spans.inc(&"dropped");
        }
    }
}

/// A sampled request's trace, from [`Tracer::begin`] to [`RequestTrace::finish`].
#[derive(Debug)]
pub struct RequestTrace {
    tracer: Arc<Tracer>,
    trace_id: [u8; 16],
    server_span: [u8; 8],
    /// The proxy call's span: the parent the backend was told.
    upstream_span: [u8; 8],
    /// The client's span, when it sent a valid `traceparent`.
    parent: Option<[u8; 8]>,
    tracestate: Option<HeaderValue>,
    start: Instant,
    start_unix_nanos: u64,
    method: Method,
    user_agent: Option<String>,
    host: String,
    path: String,
    request_id: Option<HeaderValue>,
    /// What the proxy did, set at the response head of a proxied request.
    pub upstream: Option<UpstreamInfo>,
}

/// What the pipeline knows when a traced request is finished.
#[derive(Debug)]
pub struct Finished<'a> {
    /// The route's name (`-` when none matched).
    pub route: &'a str,
    /// The listener.
    pub listener: &'a str,
    /// `http` or `https`.
    pub scheme: &'static str,
    /// `1.1`, `2` or `3`.
    pub protocol_version: &'static str,
    /// The real client address.
    pub client: IpAddr,
    /// The response status.
    pub status: u16,
    /// Response body bytes sent.
    pub bytes_sent: u64,
}

impl RequestTrace {
    /// Nanoseconds since the Unix epoch of `t`, by the request's start.
    fn at(&self, t: Instant) -> u64 {
        let d = t.saturating_duration_since(self.start);
        self.start_unix_nanos
            .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Records what the request asked for: its host (without port), path (without the
    /// query: it may carry secrets) and request id.
    pub fn set_target(&mut self, host: String, path: String, request_id: HeaderValue) {
        self.host = host;
        self.path = path;
        self.request_id = Some(request_id);
    }

    /// The span ids of this request (trace, server span, upstream span), for tests and logs.
    pub fn ids(&self) -> ([u8; 16], [u8; 8], [u8; 8]) {
        (self.trace_id, self.server_span, self.upstream_span)
    }

    /// Queues the request's spans: the server span and, for a proxied request, the upstream
    /// span. Never blocks.
    pub fn finish(self, f: Finished<'_>) {
        use otlp::KeyValue as Kv;
        let end = Instant::now();
        let trace_state = self
            .tracestate
            .as_ref()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        let method = self.method.as_str();
        // Bits 8 and 9 of OTLP's span flags: "has parent is-remote" and "parent is remote".
        const REMOTE_KNOWN: u32 = 0x100;
        const REMOTE: u32 = 0x200;
        if let Some(u) = &self.upstream {
            let ok = u.status.is_some_and(|s| s < 400);
            let mut attributes = vec![
                Kv::string("http.request.method", method),
                Kv::string("sweety.backend", u.backend.as_str()),
                Kv::int("http.request.resend_count", i64::from(u.retries)),
            ];
            if let Some(addr) = &u.address {
                let (host, port) = match addr.rsplit_once(':') {
                    Some((h, p)) => (h, p.parse::<i64>().ok()),
                    None => (addr.as_str(), None),
                };
                attributes.push(Kv::string("server.address", host.trim_matches(['[', ']'])));
                if let Some(p) = port {
                    attributes.push(Kv::int("server.port", p));
                }
            }
            if let Some(s) = u.status {
                attributes.push(Kv::int("http.response.status_code", i64::from(s)));
            }
            if let Some(e) = u.error {
                attributes.push(Kv::string("error.type", e));
            }
            let end = u
                .header_us
                .map_or(end, |us| u.started + std::time::Duration::from_micros(us));
            self.tracer.push(otlp::Span {
                trace_id: self.trace_id.to_vec(),
                span_id: self.upstream_span.to_vec(),
                trace_state: trace_state.clone(),
                parent_span_id: self.server_span.to_vec(),
                name: format!("proxy {}", u.backend),
                kind: otlp::SPAN_KIND_CLIENT,
                start_time_unix_nano: self.at(u.started),
                end_time_unix_nano: self.at(end),
                attributes,
                status: Some(otlp::Status {
                    message: if ok {
                        String::new()
                    } else {
                        u.error.map_or_else(
                            || format!("upstream status {}", u.status.unwrap_or(0)),
                            str::to_owned,
                        )
                    },
                    code: if ok {
                        otlp::STATUS_UNSET
                    } else {
                        otlp::STATUS_ERROR
                    },
                }),
                flags: u32::from(context::FLAG_SAMPLED) | REMOTE_KNOWN,
            });
        }
        let mut attributes = vec![
            Kv::string("http.request.method", method),
            Kv::string("url.scheme", f.scheme),
            Kv::string("url.path", self.path.as_str()),
            Kv::string("server.address", self.host.as_str()),
            Kv::string("network.protocol.name", "http"),
            Kv::string("network.protocol.version", f.protocol_version),
            Kv::string("client.address", f.client.to_string()),
            Kv::int("http.response.status_code", i64::from(f.status)),
            Kv::int(
                "http.response.body.size",
                i64::try_from(f.bytes_sent).unwrap_or(i64::MAX),
            ),
            Kv::string("sweety.route", f.route),
            Kv::string("sweety.listener", f.listener),
        ];
        if let Some(id) = &self.request_id {
            attributes.push(Kv::string(
                "sweety.request_id",
                String::from_utf8_lossy(id.as_bytes()),
            ));
        }
        if let Some(ua) = &self.user_agent {
            attributes.push(Kv::string("user_agent.original", ua.as_str()));
        }
        let error = f.status >= 500;
        self.tracer.push(otlp::Span {
            trace_id: self.trace_id.to_vec(),
            span_id: self.server_span.to_vec(),
            trace_state,
            parent_span_id: self.parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: format!("{method} {}", f.route),
            kind: otlp::SPAN_KIND_SERVER,
            start_time_unix_nano: self.start_unix_nanos,
            end_time_unix_nano: self.at(end),
            attributes,
            status: Some(otlp::Status {
                message: if error {
                    format!("status {}", f.status)
                } else {
                    String::new()
                },
                code: if error {
                    otlp::STATUS_ERROR
                } else {
                    otlp::STATUS_UNSET
                },
            }),
            flags: u32::from(context::FLAG_SAMPLED)
                | REMOTE_KNOWN
                | if self.parent.is_some() { REMOTE } else { 0 },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_threshold_bounds() {
        let id = |low: u64| {
            let mut t = [1u8; 16];
            t[8..].copy_from_slice(&low.to_be_bytes());
            t
        };
        assert!(!ratio_sampled(&id(0), threshold(0.0)));
        assert!(!ratio_sampled(&id(u64::MAX), threshold(0.0)));
        assert!(ratio_sampled(&id(u64::MAX), threshold(1.0)));
        assert!(ratio_sampled(&id(0), threshold(1.0)));
        // Half: the low 63 bits below 2^62.
        assert!(ratio_sampled(&id((1 << 63) - 2), threshold(0.5)));
        assert!(!ratio_sampled(&id(1 << 63), threshold(0.5)));
        assert!(ratio_sampled(&id(0), threshold(0.01)));
    }

    #[test]
    fn a_ratio_samples_about_its_share() {
        let t = threshold(0.25);
        let n = 20_000;
        let hits = (0..n)
            .filter(|_| {
                let mut id = [0u8; 16];
                id[8..].copy_from_slice(&fastrand::u64(..).to_be_bytes());
                ratio_sampled(&id, t)
            })
            .count();
        // 25 % ± 2 % (a 7-sigma band for 20,000 draws).
        assert!((4_600..=5_400).contains(&hits), "{hits}");
    }
}
