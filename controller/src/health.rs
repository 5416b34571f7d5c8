//! The controller's tiny HTTP server: `/metrics` (Prometheus text), `/healthz` (the process is
//! alive and its watches are running) and `/readyz` (the dataplane acknowledged a config).

use crate::metrics::Metrics;
use crate::Error;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// What the probes report.
pub struct Health {
    /// The registry `/metrics` renders.
    pub metrics: Arc<Metrics>,
    /// Set while the watches run.
    pub live: AtomicBool,
    /// Set once the dataplane acknowledged a config.
    pub ready: AtomicBool,
}

impl Health {
    /// Probe state of a starting process: live, not ready until the first Ack.
    pub fn new(metrics: Arc<Metrics>) -> Arc<Health> {
        Arc::new(Health {
            metrics,
            live: AtomicBool::new(true),
            ready: AtomicBool::new(false),
        })
    }

    fn respond(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        let (status, body) = match (req.method(), req.uri().path()) {
            (&Method::GET, "/metrics") => (StatusCode::OK, self.metrics.render()),
            (&Method::GET, "/healthz") if self.live.load(Ordering::Relaxed) => {
                (StatusCode::OK, "ok\n".into())
            }
            (&Method::GET, "/healthz") => {
                (StatusCode::SERVICE_UNAVAILABLE, "watches stopped\n".into())
            }
            (&Method::GET, "/readyz") if self.ready.load(Ordering::Relaxed) => {
                (StatusCode::OK, "ok\n".into())
            }
            (&Method::GET, "/readyz") => (
                StatusCode::SERVICE_UNAVAILABLE,
                "waiting for the dataplane's first ack\n".into(),
            ),
            _ => (StatusCode::NOT_FOUND, "not found\n".into()),
        };
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        let ct = if req.uri().path() == "/metrics" {
            "text/plain; version=0.0.4"
        } else {
            "text/plain"
        };
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(ct),
        );
        resp
    }
}

/// Bind `address` and serve the probes in the background; returns the bound address.
pub async fn serve(
    address: SocketAddr,
    health: Arc<Health>,
) -> Result<(SocketAddr, JoinHandle<()>), Error> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| Error::Io {
            what: format!("bind metrics address {address}"),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| Error::Io {
        what: "metrics address".into(),
        source,
    })?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let health = health.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let resp = health.respond(&req);
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn probes_and_metrics() {
        let health = Health::new(Arc::new(Metrics::default()));
        health.metrics.reconciled("start");
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), health.clone())
            .await
            .unwrap();
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        health.ready.store(true, Ordering::Relaxed);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        health.live.store(false, Ordering::Relaxed);
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 503"));
        let m = get(addr, "/metrics").await;
        assert!(
            m.contains("sweety_controller_reconciles_total{cause=\"start\"} 1\n"),
            "{m}"
        );
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        task.abort();
    }
}
