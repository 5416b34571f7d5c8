//! The OTLP/HTTP exporter task: takes finished spans off the bounded queue, sends them in
//! batches as `ExportTraceServiceRequest` protobuf (`POST`, `application/x-protobuf`) with
//! the hyper client, one request at a time, each abandoned after `export_timeout`.
//!
//! A batch goes out when it has `max_batch_spans` spans or its first span has waited
//! `batch_delay`. A failed or timed-out export is not retried (the spans are counted as
//! `failed`): while the receiver is away the queue fills and later spans are dropped and
//! counted, so a dead receiver costs memory bounded by the queue and one export at a time,
//! and never a request's time. The receiver's answer is read up to [`MAX_RESPONSE`] bytes.

use super::otlp;
use crate::metrics::Metrics;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use sweety_config::Tracing;
use tokio::sync::mpsc::Receiver;

/// Most bytes of the receiver's answer read (an `ExportTraceServiceResponse` is small).
pub(super) const MAX_RESPONSE: usize = 64 * 1024;

/// Spawns the exporter of `rx` (ends when every sender is gone and the queue is sent).
pub(super) fn spawn(config: &Tracing, uri: http::Uri, rx: Receiver<otlp::Span>, m: Arc<Metrics>) {
    let resource = otlp::Resource {
        attributes: vec![
            otlp::KeyValue::string("service.name", config.service_name.as_str()),
            otlp::KeyValue::string("service.version", env!("CARGO_PKG_VERSION")),
            otlp::KeyValue::string("telemetry.sdk.name", "sweety"),
            otlp::KeyValue::string("telemetry.sdk.language", "rust"),
        ],
    };
    let exporter = Exporter {
        uri,
        resource,
        max_batch: config.max_batch_spans.max(1) as usize,
        batch_delay: config.batch_delay.get(),
        timeout: config.export_timeout.get(),
        metrics: m,
    };
    tokio::spawn(exporter.run(rx));
}

struct Exporter {
    uri: http::Uri,
    resource: otlp::Resource,
    max_batch: usize,
    batch_delay: Duration,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Exporter {
    async fn run(self, mut rx: Receiver<otlp::Span>) {
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.set_connect_timeout(Some(self.timeout));
        http.set_nodelay(true);
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(http);
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
            match tokio::time::timeout(self.timeout, self.export(&client, spans)).await {
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

    async fn export(
        &self,
        client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
        spans: Vec<otlp::Span>,
    ) -> Result<(), String> {
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
        let req = http::Request::post(self.uri.clone())
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
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
