//! The upstream half of a protocol upgrade (WebSocket): one fresh HTTP/1.1 connection (plain or
//! TLS) per upgrade, never pooled, carrying the client's `Upgrade` request. The caller gets the
//! backend's response head; on `101` it takes the upgraded stream with `hyper::upgrade::on`.
//!
//! Endpoint choice, outlier accounting and the backend's connect timeout are the same as for
//! ordinary requests; the route's backend timeout bounds the wait for the `101`.

use super::error::ProxyError;
use super::head::Head;
use super::{Affinity, Upstreams};
use crate::body::Body;
use crate::ctx::RequestCtx;
use http::header::{self, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use std::time::Duration;
use sweety_config::{BackendProtocol, ProxyAction, Route};

/// One fresh HTTP/1.1 connection to `addr` (TLS when the backend has it) whose sender can upgrade.
async fn open(
    addr: &str,
    connector: &super::pool::Connector,
) -> Result<http1::SendRequest<Body>, ProxyError> {
    let tcp = super::pool::connect_tcp(addr, connector.external)
        .await
        .map_err(|e| ProxyError::Connect {
            addr: addr.to_string(),
            source: e.into(),
        })?;
    match &connector.tls {
        None => handshake(addr, TokioIo::new(tcp)).await,
        // The backend config offers h2 for `h2` backends only; upgrades need HTTP/1.1.
        Some(cfg) => {
            let stream = super::pool::connect_tls(addr, connector, cfg, tcp).await?;
            handshake(addr, TokioIo::new(stream)).await
        }
    }
}

/// The HTTP/1.1 handshake, with the connection driven (upgrades allowed) on its own task.
async fn handshake<T>(addr: &str, io: T) -> Result<http1::SendRequest<Body>, ProxyError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (send, conn) = http1::Builder::new()
        .handshake::<_, Body>(io)
        .await
        .map_err(|e| ProxyError::Connect {
            addr: addr.to_string(),
            source: e.into(),
        })?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(send)
}

impl Upstreams {
    /// Sends an upgrade request (`parts` already carries the client's `Upgrade` value in
    /// `upgrade`) to one of `action`'s HTTP/1.1 backends and returns the response head.
    pub async fn upgrade(
        &self,
        parts: http::request::Parts,
        upgrade: HeaderValue,
        action: &ProxyAction,
        route: &Route,
        ctx: &RequestCtx,
    ) -> Result<Response<Incoming>, ProxyError> {
        let (wb, backend) = self.choose_backend(action)?;
        if !matches!(
            backend.config.protocol,
            BackendProtocol::Http1 | BackendProtocol::Https
        ) {
            return Err(ProxyError::NoBackend {
                reason: format!(
                    "backend {:?} is not HTTP/1.1: upgrades need an http1 or https backend",
                    wb.backend
                ),
            });
        }
        let affinity = Affinity::of(backend, &parts.headers, ctx);
        let head = Head::prepare(parts, ctx, Some(wb), false);
        let idx = affinity
            .pick(backend, 0, &[])
            .ok_or_else(|| ProxyError::NoEndpoint {
                backend: backend.config.name.clone(),
            })?;
        let addr = backend.endpoints[idx].state.address.clone();
        let connect_limit = route
            .timeouts
            .connect
            .unwrap_or(backend.config.connect_timeout)
            .get();
        let mut sender =
            match tokio::time::timeout(connect_limit, open(&addr, &backend.connector)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    backend.record(idx, false);
                    return Err(e);
                }
                Err(_) => {
                    backend.record(idx, false);
                    return Err(ProxyError::ConnectTimeout {
                        addr,
                        after: connect_limit,
                    });
                }
            };
        let mut req: Request<Body> = head.build(
            crate::body::empty(),
            &addr,
            false,
            backend.connector.tls.is_some(),
        );
        req.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        req.headers_mut().insert(header::UPGRADE, upgrade);
        let wait = route
            .timeouts
            .backend
            .map(|d| d.get())
            .unwrap_or(Duration::from_secs(60));
        let sent = tokio::time::timeout(wait, sender.send_request(req)).await;
        match sent {
            Ok(Ok(mut resp)) => {
                backend.record(idx, resp.status().as_u16() < 500);
                affinity.issue(backend, idx, resp.headers_mut());
                Ok(resp)
            }
            Ok(Err(e)) => {
                backend.record(idx, false);
                Err(ProxyError::Protocol {
                    addr,
                    source: e.into(),
                })
            }
            Err(_) => {
                backend.record(idx, false);
                Err(ProxyError::Timeout { addr, after: wait })
            }
        }
    }

    /// The reply for a proxy error (counted in metrics), as [`Upstreams::forward`] sends it.
    pub fn error_reply(&self, e: &ProxyError) -> Response<Body> {
        self.fail(e)
    }
}
