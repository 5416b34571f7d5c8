//! The OTLP/HTTP exporter task: takes finished spans off the bounded queue, sends them in
//! batches as `ExportTraceServiceRequest` protobuf (`POST`, `application/x-protobuf`) with
//! the proxy's connection pool ([`crate::proxy::pool`]: the same HTTP/1.1 client, resolver and
//! keep-alive as a backend's, one idle connection kept), one request at a time, each abandoned
//! after `export_timeout`.
//!
//! A batch goes out when it has `max_batch_spans` spans or its first span has waited
//! `batch_delay`. A failed or timed-out export is not retried (the spans are counted as
//! `failed`): while the receiver is away the queue fills and later spans are dropped and
//! counted, so a dead receiver costs memory bounded by the queue and one export at a time,
//! and never a request's time. The receiver's answer is read up to [`MAX_RESPONSE`] bytes.
//!
//! No address policy: the endpoint is operator input (a SweetyProxyConfig named by a class,
//! or the standalone file), and a collector next to the pod on 127.0.0.1 is a normal setup.

use super::otlp;
use crate::metrics::Metrics;
use crate::proxy::pool::{Connector, Pool};
use http::{header, HeaderValue, Request};
use http_body_util::{BodyExt, Limited};
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use sweety_config::Tracing;
use tokio::sync::mpsc::Receiver;

/// Most bytes of the receiver's answer read (an `ExportTraceServiceResponse` is small).
pub(super) const MAX_RESPONSE: usize = 64 * 1024;

/// Where exports go: the parts of a valid `http://` endpoint URL.
#[derive(Debug)]
pub(super) struct Endpoint {
    /// `host:port` to connect to (port 80 when the URL names none).
    address: String,
    /// The `Host` field: the URL's authority.
    host: HeaderValue,
    /// The request target: the URL's path and query.
    target: http::Uri,
}

impl Endpoint {
    /// The endpoint of `uri`, when it is an `http://` URL with a host.
    pub(super) fn of(uri: &http::Uri) -> Option<Endpoint> {
        let authority = uri
            .authority()
            .filter(|_| uri.scheme_str() == Some("http"))?;
        Some(Endpoint {
            address: format!(
                "{}:{}",
                authority.host(),
                authority.port_u16().unwrap_or(80)
            ),
            host: HeaderValue::from_str(authority.as_str()).ok()?,
            target: uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .parse()
                .ok()?,
        })
    }
}

/// Spawns the exporter of `rx` (ends when every sender is gone and the queue is sent).
pub(super) fn spawn(
    config: &Tracing,
    endpoint: Endpoint,
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
    let exporter = Exporter {
        endpoint,
        pool: Arc::new(Pool::new(1)),
        resource,
        max_batch: config.max_batch_spans.max(1) as usize,
        batch_delay: config.batch_delay.get(),
        timeout: config.export_timeout.get(),
        metrics: m,
    };
    tokio::spawn(exporter.run(rx));
}

struct Exporter {
    endpoint: Endpoint,
    pool: Arc<Pool>,
    resource: otlp::Resource,
    max_batch: usize,
    batch_delay: Duration,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Exporter {
    async fn run(self, mut rx: Receiver<otlp::Span>) {
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
            match tokio::time::timeout(self.timeout, self.export(spans)).await {
                Ok(Ok(())) => self.metrics.trace_spans.add(&"exported", n),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, spans = n, "trace export failed");
                    self.metrics.trace_spans.add(&"failed", n);
                }
                Err(_) => {
                    tracing::debug!(spans = n, "trace export timed out");
                    self.metrics.trace_spans.add(&"failed", n);
                }
            }
            if closed {
                return;
            }
        }
    }

    async fn export(&self, spans: Vec<otlp::Span>) -> Result<(), String> {
        let body = otlp::ExportTraceServiceRequest {
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
        }
        .encode_to_vec();
        let mut req = Request::new(crate::body::full(body));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = self.endpoint.target.clone();
        let h = req.headers_mut();
        h.insert(header::HOST, self.endpoint.host.clone());
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        let connector = Connector {
            protocol: sweety_config::BackendProtocol::Http1,
            tls: None,
            sni: None,
            external: false,
            read_ahead: sweety_config::DEFAULT_PROXY_READ_AHEAD,
        };
        let conn = self
            .pool
            .acquire(&self.endpoint.address, &connector)
            .await
            .map_err(|e| e.to_string())?;
        let (resp, _) = conn
            .send(&self.pool, req)
            .await
            .map_err(|e| e.error.to_string())?;
        let status = resp.status();
        // Read (boundedly) so the connection can be reused.
        let _ = Limited::new(resp.into_body(), MAX_RESPONSE).collect().await;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("receiver answered {status}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoint;

    #[test]
    fn endpoint_parts() {
        let e = |s: &str| Endpoint::of(&s.parse().unwrap());
        let one = e("http://collector.obs:4318/v1/traces").unwrap();
        assert_eq!(one.address, "collector.obs:4318");
        assert_eq!(one.host, "collector.obs:4318");
        assert_eq!(one.target, "/v1/traces");
        let v6 = e("http://[::1]/v1/traces?x=1").unwrap();
        assert_eq!(v6.address, "[::1]:80");
        assert_eq!(v6.host, "[::1]");
        assert_eq!(v6.target, "/v1/traces?x=1");
        assert_eq!(e("http://c").unwrap().target, "/");
        assert!(e("https://c/v1/traces").is_none());
        assert!(e("/v1/traces").is_none());
    }
}
