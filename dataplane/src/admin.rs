//! The admin listener, on its own port (127.0.0.1 by default):
//!
//! * `GET /healthz`: 200 while the process runs;
//! * `GET /readyz`: 200 once a config has been applied, 503 before;
//! * `GET /metrics`: Prometheus text format (the metrics, and the serving config's upstream
//!   connection pools);
//! * `GET /config`: generation and content hash of the config being served;
//! * `POST` or `DELETE /cache/purge?host=H&prefix=/P`: drops response-cache entries of host
//!   `H` (any when absent) whose path starts with `/P` (any when absent); answers
//!   `{"purged": N}`.
//!
//! The mutating endpoint (cache purge) is refused with 403 unless the request comes from a
//! loopback address or carries `Authorization: Bearer T` where `T` is the value of the
//! `SWEETY_ADMIN_TOKEN` environment variable (when set, non-empty): a chart that binds the admin
//! port on the pod address for metrics does not let other pods purge the cache.

use crate::body::{full, text_response, Body};
use crate::state::Shared;
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
            let mut scrape = shared.metrics.exposition();
            shared.snapshot().upstreams.expose_connections(&mut scrape);
            let mut r = Response::new(full(scrape.render()));
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

/// Whether a request from `peer` may use a mutating endpoint: from loopback, or with the
/// bearer `token` (compared in constant time over its length).
pub fn may_mutate<B>(peer: std::net::IpAddr, token: Option<&str>, req: &Request<B>) -> bool {
    if peer.to_canonical().is_loopback() {
        return true;
    }
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return false;
    };
    let Some(given) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
    else {
        return false;
    };
    given.len() == token.len()
        && given
            .iter()
            .zip(token.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Binds the admin listener and serves it in the background. Returns the bound address.
pub async fn serve(shared: Arc<Shared>, addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let token: Option<Arc<str>> = std::env::var("SWEETY_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .map(Arc::from);
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            let shared = shared.clone();
            let token = token.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let r = if req.uri().path() == "/cache/purge"
                        && !may_mutate(peer.ip(), token.as_deref(), &req)
                    {
                        text_response(
                            StatusCode::FORBIDDEN,
                            "403 Forbidden: purge only from loopback or with the admin token\n",
                        )
                    } else {
                        respond(&shared, &req)
                    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutation_needs_loopback_or_the_token() {
        let req = |auth: Option<&str>| {
            let mut b = Request::post("/cache/purge");
            if let Some(a) = auth {
                b = b.header(header::AUTHORIZATION, a);
            }
            b.body(()).unwrap()
        };
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let lo6: std::net::IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let pod: std::net::IpAddr = "10.1.2.3".parse().unwrap();
        assert!(may_mutate(lo, None, &req(None)));
        assert!(may_mutate(lo6, None, &req(None)));
        assert!(!may_mutate(pod, None, &req(None)));
        assert!(!may_mutate(pod, None, &req(Some("Bearer x"))));
        assert!(!may_mutate(pod, Some(""), &req(Some("Bearer "))));
        assert!(!may_mutate(
            pod,
            Some("secret"),
            &req(Some("Bearer secreT"))
        ));
        assert!(!may_mutate(
            pod,
            Some("secret"),
            &req(Some("Bearer secret2"))
        ));
        assert!(may_mutate(pod, Some("secret"), &req(Some("Bearer secret"))));
    }
}
