//! A minimal kubelet-style HTTPS endpoint (default 10.244.0.1:10250) so the apiserver can proxy
//! `kubectl logs`: only `GET /containerLogs/{namespace}/{pod}/{container}` (query `tailLines`, `limitBytes`,
//! `sinceTime`, `sinceSeconds`, `timestamps`), served from the agent's log files (see [`crate::logs`]). Self-signed certificate (the apiserver does not verify kubelet certs
//! unless started with --kubelet-certificate-authority); NO client authentication or authorisation: anything
//! that can reach the bridge address can read logs. `follow` and `previous` are not supported.

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
use k8s_openapi::jiff::Timestamp;
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
    let q = log_query(req.uri().query());
    match read_log(root, ns, pod, container, &q) {
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

/// The log of the newest Pod instance `<ns>_<pod>_<uid>` under `root`, rendered for `q` (at most the last
/// [`crate::logs::MAX_READ`] bytes of the file are read).
pub fn read_log(
    root: &Path,
    ns: &str,
    pod: &str,
    container: &str,
    q: &crate::logs::Query,
) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    if !(safe(ns) && safe(pod) && safe(container)) {
        return None;
    }
    let prefix = format!("{ns}_{pod}_");
    let dir = std::fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())?;
    let mut f = std::fs::File::open(dir.path().join(format!("{container}.log"))).ok()?;
    let len = f.metadata().ok()?.len();
    let start = len.saturating_sub(crate::logs::MAX_READ);
    f.seek(SeekFrom::Start(start)).ok()?;
    let mut data = Vec::new();
    f.take(crate::logs::MAX_READ).read_to_end(&mut data).ok()?;
    if start > 0 {
        // Drop the partial first line.
        let cut = data
            .iter()
            .position(|b| *b == b'\n')
            .map_or(data.len(), |i| i + 1);
        data.drain(..cut);
    }
    Some(crate::logs::render(&data, q))
}

/// The `kubectl logs` options of a request's query string (form-encoded, as the apiserver sends
/// them); unknown keys and unparsable values are ignored.
fn log_query(query: Option<&str>) -> crate::logs::Query {
    let query: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    let get = |k: &str| query.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
    let num = |k: &str| get(k).and_then(|v| v.parse::<usize>().ok());
    let since_time = get("sinceTime").and_then(|v| v.parse::<Timestamp>().ok());
    let since_seconds = get("sinceSeconds")
        .and_then(|v| v.parse::<i64>().ok())
        .and_then(|s| {
            Timestamp::now()
                .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                .ok()
        });
    crate::logs::Query {
        tail_lines: num("tailLines"),
        limit_bytes: num("limitBytes"),
        since: since_time.or(since_seconds),
        timestamps: get("timestamps") == Some("true"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_newest_instance_with_tail_and_limit() {
        use crate::logs::{record, Query};
        let root =
            std::env::temp_dir().join(format!("sweety-node-agent-logs-{}", std::process::id()));
        let d = root.join("ns_web_uid1");
        std::fs::create_dir_all(&d).unwrap();
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        let mut f = record(t("2026-01-01T00:00:01Z"), "stdout", true, b"a");
        f.extend(record(t("2026-01-01T00:00:02Z"), "stdout", true, b"b"));
        f.extend(record(t("2026-01-01T00:00:03Z"), "stderr", true, b"c"));
        std::fs::write(d.join("c.log"), f).unwrap();
        let q = |tail, limit| Query {
            tail_lines: tail,
            limit_bytes: limit,
            ..Default::default()
        };
        assert_eq!(
            read_log(&root, "ns", "web", "c", &q(None, None)).unwrap(),
            b"a\nb\nc\n"
        );
        assert_eq!(
            read_log(&root, "ns", "web", "c", &q(Some(2), None)).unwrap(),
            b"b\nc\n"
        );
        assert_eq!(
            read_log(&root, "ns", "web", "c", &q(Some(9), None)).unwrap(),
            b"a\nb\nc\n"
        );
        assert_eq!(
            read_log(&root, "ns", "web", "c", &q(None, Some(3))).unwrap(),
            b"a\nb"
        );
        let since = Query {
            since: Some(t("2026-01-01T00:00:02Z")),
            ..Default::default()
        };
        assert_eq!(
            read_log(&root, "ns", "web", "c", &since).unwrap(),
            b"b\nc\n"
        );
        assert!(read_log(&root, "ns", "web", "..", &q(None, None)).is_none());
        assert!(read_log(&root, "ns", "we", "c", &q(None, None)).is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn reads_log_options_from_the_query() {
        let q = log_query(Some(
            "sinceTime=2026-01-01T00%3A00%3A02Z&tailLines=5&timestamps=true&x=%zz",
        ));
        assert_eq!(q.since, Some("2026-01-01T00:00:02Z".parse().unwrap()));
        assert_eq!(q.tail_lines, Some(5));
        assert_eq!(q.limit_bytes, None);
        assert!(q.timestamps);
        let none = log_query(None);
        assert_eq!(
            (none.since, none.tail_lines, none.timestamps),
            (None, None, false)
        );
    }
}
