//! The admin listener, on its own port (127.0.0.1 by default):
//!
//! * `GET /healthz`: 200 while the process runs;
//! * `GET /readyz`: 200 once a config has been applied, 503 before;
//! * `GET /metrics`: Prometheus text format;
//! * `GET /config`: generation and content hash of the config being served;
//! * `POST` or `DELETE /cache/purge?host=H&prefix=/P`: drops response-cache entries of host
//!   `H` (any when absent) whose path starts with `/P` (any when absent); answers
//!   `{"purged": N}`.

use crate::body::{full, text_response, Body};
use crate::runtime::Shared;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Answers one admin request.
pub fn respond<B>(shared: &Shared, req: &Request<B>) -> Response<Body> {
    if req.uri().path() == "/cache/purge" {
        return purge(shared, req);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match req.uri().path() {
        "/healthz" => text_response(StatusCode::OK, "ok\n"),
        "/readyz" => {
            if shared.ready.load(Relaxed) {
                text_response(StatusCode::OK, "ready\n")
            } else {
                text_response(StatusCode::SERVICE_UNAVAILABLE, "no config applied yet\n")
            }
        }
        "/metrics" => {
            let mut r = Response::new(full(shared.metrics.render()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/config" => {
            let snap = shared.snapshot();
            let body = serde_json::json!({
                "generation": snap.config.generation,
                "hash": snap.hash,
                "listeners": snap.config.listeners.len(),
                "virtual_hosts": snap.virtual_host_count,
                "backends": snap.backend_count,
            });
            let mut r = Response::new(full(body.to_string()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        _ => text_response(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn purge<B>(shared: &Shared, req: &Request<B>) -> Response<Body> {
    if req.method() != Method::POST && req.method() != Method::DELETE {
        return text_response(StatusCode::METHOD_NOT_ALLOWED, "use POST or DELETE\n");
    }
    let mut host = None;
    let mut prefix = None;
    for pair in req.uri().query().unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_encoding::percent_decode_str(v)
            .decode_utf8_lossy()
            .into_owned();
        match k {
            "host" if !v.is_empty() => host = Some(v.to_ascii_lowercase()),
            "prefix" if !v.is_empty() => prefix = Some(v),
            "" | "host" | "prefix" => {}
            _ => return text_response(StatusCode::BAD_REQUEST, "unknown purge parameter\n"),
        }
    }
    if prefix.as_deref().is_some_and(|p| !p.starts_with('/')) {
        return text_response(StatusCode::BAD_REQUEST, "prefix must start with /\n");
    }
    let n = shared.cache.purge(host.as_deref(), prefix.as_deref());
    let mut r = Response::new(full(serde_json::json!({ "purged": n }).to_string()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Binds the admin listener and serves it in the background. Returns the bound address.
pub async fn serve(shared: Arc<Shared>, addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let r = respond(&shared, &req);
                    async move { Ok::<_, Infallible>(r) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(local)
}
