//! A minimal kubelet-style HTTPS endpoint (default 10.244.0.1:10250) so the apiserver can proxy
//! `kubectl logs`: only `GET /containerLogs/{namespace}/{pod}/{container}` (query `tailLines`, `limitBytes`),
//! served from the agent's log files. Self-signed certificate (the apiserver does not verify kubelet certs
//! unless started with --kubelet-certificate-authority); NO client authentication or authorisation: anything
//! that can reach the bridge address can read logs. `follow`, `previous` and timestamps are not supported.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::{Error, Result};

/// Binds `addr` and serves until the task is dropped.
pub async fn serve(addr: SocketAddr, logs_root: PathBuf) -> Result<()> {
    let ck =
        rcgen::generate_simple_self_signed(vec![addr.ip().to_string()]).map_err(Error::Cert)?;
    let cert = CertificateDer::from(ck.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(Error::Tls)?
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .map_err(Error::Tls)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(Error::io(format!("binding {addr}")))?;
    tracing::info!(%addr, "kubelet API listening");
    let root = Arc::new(logs_root);
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let root = root.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let svc = service_fn(move |req| {
                let root = root.clone();
                async move { Ok::<_, Infallible>(handle(&req, &root)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        });
    }
}

fn text(code: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    r
}

fn handle(req: &Request<Incoming>, root: &Path) -> Response<Full<Bytes>> {
    if req.method() != http::Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    let parts: Vec<&str> = req.uri().path().trim_matches('/').split('/').collect();
    let ["containerLogs", ns, pod, container] = parts.as_slice() else {
        return text(
            StatusCode::NOT_FOUND,
            "only /containerLogs/{namespace}/{pod}/{container}\n",
        );
    };
    let query: Vec<(&str, &str)> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let num = |k: &str| {
        query
            .iter()
            .find(|(n, _)| *n == k)
            .and_then(|(_, v)| v.parse::<usize>().ok())
    };
    match read_log(
        root,
        ns,
        pod,
        container,
        num("tailLines"),
        num("limitBytes"),
    ) {
        Some(body) => text(StatusCode::OK, body),
        None => text(
            StatusCode::NOT_FOUND,
            format!("no log for {ns}/{pod}/{container}\n"),
        ),
    }
}

fn safe(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\\'])
}

/// The log of the newest Pod instance `<ns>_<pod>_<uid>` under `root`.
pub fn read_log(
    root: &Path,
    ns: &str,
    pod: &str,
    container: &str,
    tail_lines: Option<usize>,
    limit_bytes: Option<usize>,
) -> Option<Vec<u8>> {
    if !(safe(ns) && safe(pod) && safe(container)) {
        return None;
    }
    let prefix = format!("{ns}_{pod}_");
    let dir = std::fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())?;
    let mut data = std::fs::read(dir.path().join(format!("{container}.log"))).ok()?;
    if let Some(n) = tail_lines {
        let mut seen = 0;
        let mut cut = 0;
        let body = data.strip_suffix(b"\n").unwrap_or(&data);
        for (i, b) in body.iter().enumerate().rev() {
            if *b == b'\n' {
                seen += 1;
                if seen == n {
                    cut = i + 1;
                    break;
                }
            }
        }
        if n == 0 {
            cut = data.len();
        }
        data.drain(..cut);
    }
    if let Some(l) = limit_bytes {
        data.truncate(l);
    }
    Some(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_newest_instance_with_tail_and_limit() {
        let root =
            std::env::temp_dir().join(format!("sweety-node-agent-logs-{}", std::process::id()));
        let d = root.join("ns_web_uid1");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("c.log"), "a\nb\nc\n").unwrap();
        assert_eq!(
            read_log(&root, "ns", "web", "c", None, None).unwrap(),
            b"a\nb\nc\n"
        );
        assert_eq!(
            read_log(&root, "ns", "web", "c", Some(2), None).unwrap(),
            b"b\nc\n"
        );
        assert_eq!(
            read_log(&root, "ns", "web", "c", Some(9), None).unwrap(),
            b"a\nb\nc\n"
        );
        assert_eq!(
            read_log(&root, "ns", "web", "c", None, Some(3)).unwrap(),
            b"a\nb"
        );
        assert!(read_log(&root, "ns", "web", "..", None, None).is_none());
        assert!(read_log(&root, "ns", "we", "c", None, None).is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
