//! HTTP clients the tests use against the load-balancer address: curl for HTTP/1.1 and HTTP/2 (a real,
//! independent client; `--resolve` pins the name to the address, `--cacert` trusts only the test CA) and a
//! quinn + h3 client for HTTP/3 (the same construction as the dataplane's tests/h3.rs); `openssl s_client`
//! for the certificate a TLS server presents.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};

use crate::{Error, Result};

/// Largest response body read by the HTTP/3 client (curl gets `--max-filesize`).
pub const MAX_BODY: usize = 1 << 20;
/// Per-request time limit.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Which HTTP version to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// HTTP/1.1 over TCP (curl `--http1.1`).
    H1,
    /// HTTP/2 (curl `--http2`: ALPN h2 over TLS, the h2c upgrade in cleartext).
    H2,
    /// HTTP/3 over QUIC (the suite's own h3 client).
    H3,
}

impl Version {
    /// All three, for loops.
    pub const ALL: [Version; 3] = [Version::H1, Version::H2, Version::H3];
}

/// A response: status, the HTTP version the client reports ("1.1", "2", "3"), body.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code of the response.
    pub status: u16,
    /// HTTP version the client says it spoke ("1.1", "2" or "3").
    pub version: String,
    /// Response body, decoded as UTF-8 (lossy).
    pub body: String,
}

/// One request target.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    /// The load-balancer address.
    pub addr: IpAddr,
    /// Host name sent as Host/:authority and as TLS SNI.
    pub host: &'a str,
    /// Request path with query.
    pub path: &'a str,
    /// Some(CA PEM) for https on port 443, None for http on port 80.
    pub ca_pem: Option<&'a str>,
}

/// GET `target` with `version` (H3 needs `ca_pem`; H2 is only used over TLS).
pub async fn get(
    allowed: &crate::cluster::Cidr,
    version: Version,
    t: &Target<'_>,
) -> Result<Reply> {
    if !allowed.contains(t.addr) {
        return Err(Error::NotAllowed(t.addr));
    }
    match version {
        Version::H1 | Version::H2 => curl(version, t).await,
        Version::H3 => {
            let ca = t.ca_pem.ok_or_else(|| Error::Request {
                client: "h3",
                message: "HTTP/3 needs TLS (a CA)".into(),
            })?;
            tokio::time::timeout(
                REQUEST_TIMEOUT,
                h3_get(SocketAddr::new(t.addr, 443), t.host, t.path, ca),
            )
            .await
            .map_err(|_| Error::Request {
                client: "h3",
                message: format!("no answer in {REQUEST_TIMEOUT:?}"),
            })?
        }
    }
}

async fn curl(version: Version, t: &Target<'_>) -> Result<Reply> {
    let full = curl_full(version, t, &[]).await?;
    Ok(Reply {
        status: full.status,
        version: full.version,
        body: full.body,
    })
}

/// A response with its head, as curl saw it.
#[derive(Debug, Clone)]
pub struct FullReply {
    /// Status code of the (last) response.
    pub status: u16,
    /// HTTP version curl reports ("1.1", "2").
    pub version: String,
    /// The header fields of the last response, names lowercased, in order.
    pub headers: Vec<(String, String)>,
    /// Response body, decoded as UTF-8 (lossy).
    pub body: String,
}

impl FullReply {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One request with curl (`version` H1 or H2) to `t`, with `extra` curl arguments before the URL (request
/// headers `-H`, cookies `-b`, a client certificate `--cert`/`--key`, a body `--data-binary @FILE`; never
/// `-L`: redirects are answers to check). Checks `allowed` like [`get`].
pub async fn request(
    allowed: &crate::cluster::Cidr,
    version: Version,
    t: &Target<'_>,
    extra: &[&str],
) -> Result<FullReply> {
    if !allowed.contains(t.addr) {
        return Err(Error::NotAllowed(t.addr));
    }
    if version == Version::H3 {
        return Err(Error::Request {
            client: "curl",
            message: "HTTP/3 requests go through `get`".into(),
        });
    }
    curl_full(version, t, extra).await
}

async fn curl_full(version: Version, t: &Target<'_>, extra: &[&str]) -> Result<FullReply> {
    let (scheme, port) = if t.ca_pem.is_some() {
        ("https", 443)
    } else {
        ("http", 80)
    };
    let temp = |what: &str| {
        std::env::temp_dir().join(format!(
            "sweety-e2e-{what}-{}-{}",
            std::process::id(),
            NEXT_FILE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ))
    };
    let head_file = temp("head");
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "10",
        "--max-filesize",
        &MAX_BODY.to_string(),
    ])
    .arg(if version == Version::H2 {
        "--http2"
    } else {
        "--http1.1"
    })
    .arg("--resolve")
    .arg(format!("{}:{port}:{}", t.host, t.addr))
    .arg("--dump-header")
    .arg(&head_file)
    .args(["-w", "\n%{http_code} %{http_version}"]);
    let ca_file = match t.ca_pem {
        Some(pem) => {
            let f = temp("ca");
            std::fs::write(&f, pem).map_err(Error::io("writing the CA file for curl"))?;
            cmd.arg("--cacert").arg(&f);
            Some(f)
        }
        None => None,
    };
    cmd.args(extra);
    cmd.arg(format!("{scheme}://{}:{port}{}", t.host, t.path));
    let out = cmd.output().await;
    let head = std::fs::read_to_string(&head_file).unwrap_or_default();
    let _ = std::fs::remove_file(&head_file);
    if let Some(f) = ca_file {
        let _ = std::fs::remove_file(f);
    }
    let out = out.map_err(Error::io("running curl"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(Error::Request {
            client: "curl",
            message: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    let (body, tail) = text.rsplit_once('\n').unwrap_or(("", &text));
    let mut it = tail.split_whitespace();
    let status = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let version = it.next().unwrap_or("").to_string();
    Ok(FullReply {
        status,
        version,
        headers: last_head(&head),
        body: body.to_string(),
    })
}

/// The header fields of the last response head in curl's `--dump-header` output (an interim `100
/// Continue` head comes first), names lowercased.
fn last_head(dump: &str) -> Vec<(String, String)> {
    let dump = dump.replace("\r\n", "\n");
    let last = dump
        .split("\n\n")
        .filter(|b| b.trim_start().starts_with("HTTP/"))
        .last()
        .unwrap_or("");
    last.lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect()
}

/// The SHA-256 fingerprint (lowercase hex) of a PEM certificate chain's first certificate.
pub fn fingerprint(pem: &str) -> Result<String> {
    use rustls_pki_types::pem::PemObject;
    use sha2::Digest;
    let der = rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| {
        Error::Request {
            client: "openssl",
            message: format!("no PEM certificate: {e}"),
        }
    })?;
    Ok(sha2::Sha256::digest(der.as_ref())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The fingerprint ([`fingerprint`]) of the leaf certificate the TLS server on `addr` presents to
/// `openssl s_client` (a real, independent client) sending `sni`, or no SNI at all with `None`.
pub async fn served_fingerprint(
    allowed: &crate::cluster::Cidr,
    addr: SocketAddr,
    sni: Option<&str>,
) -> Result<String> {
    if !allowed.contains(addr.ip()) {
        return Err(Error::NotAllowed(addr.ip()));
    }
    let mut cmd = tokio::process::Command::new("openssl");
    cmd.args(["s_client", "-connect", &addr.to_string()]);
    match sni {
        Some(name) => cmd.args(["-servername", name]),
        None => cmd.arg("-noservername"),
    };
    cmd.stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(REQUEST_TIMEOUT, cmd.output())
        .await
        .map_err(|_| Error::Request {
            client: "openssl",
            message: format!("no handshake with {addr} in {REQUEST_TIMEOUT:?}"),
        })?
        .map_err(Error::io("running openssl s_client"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let begin = text.find("-----BEGIN CERTIFICATE-----");
    let end = text.find("-----END CERTIFICATE-----");
    match (begin, end) {
        (Some(b), Some(e)) if b < e => fingerprint(&text[b..e + "-----END CERTIFICATE-----".len()]),
        _ => Err(Error::Request {
            client: "openssl",
            message: format!(
                "{addr} (SNI {sni:?}) presented no certificate: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }),
    }
}

/// Numbers temporary files (CA, dumped heads; with the pid, unique on the host).
static NEXT_FILE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn quic_client_config(ca_pem: &str) -> Result<quinn::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    let err = |m: String| Error::Request {
        client: "h3",
        message: m,
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let c = c.map_err(|e| err(format!("CA PEM: {e}")))?;
        roots.add(c).map_err(|e| err(format!("CA: {e}")))?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .map_err(|e| err(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto =
        quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| err(e.to_string()))?;
    Ok(quinn::ClientConfig::new(Arc::new(crypto)))
}

/// One HTTP/3 GET on a fresh QUIC connection to `addr` with SNI/authority `host`, trusting only `ca_pem`.
pub async fn h3_get(addr: SocketAddr, host: &str, path: &str, ca_pem: &str) -> Result<Reply> {
    let err = |m: String| Error::Request {
        client: "h3",
        message: m,
    };
    let mut endpoint = quinn::Endpoint::client(SocketAddr::from(([0, 0, 0, 0], 0)))
        .map_err(Error::io("binding the QUIC client socket"))?;
    endpoint.set_default_client_config(quic_client_config(ca_pem)?);
    let conn = endpoint
        .connect(addr, host)
        .map_err(|e| err(e.to_string()))?
        .await
        .map_err(|e| err(format!("QUIC handshake with {addr}: {e}")))?;
    let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
        .await
        .map_err(|e| err(e.to_string()))?;
    let drive = tokio::spawn(async move {
        let _ = driver.wait_idle().await;
    });
    let req = http::Request::builder()
        .uri(format!("https://{host}{path}"))
        .body(())
        .map_err(|e| err(e.to_string()))?;
    let mut stream = send
        .send_request(req)
        .await
        .map_err(|e| err(format!("send_request: {e}")))?;
    stream.finish().await.map_err(|e| err(e.to_string()))?;
    let resp = stream
        .recv_response()
        .await
        .map_err(|e| err(format!("response: {e}")))?;
    let mut body = BytesMut::new();
    while let Some(mut d) = stream.recv_data().await.map_err(|e| err(e.to_string()))? {
        if body.len() + d.remaining() > MAX_BODY {
            return Err(err(format!("body larger than {MAX_BODY} bytes")));
        }
        body.extend_from_slice(&d.copy_to_bytes(d.remaining()));
    }
    conn.close(0u32.into(), b"done");
    drive.abort();
    endpoint.wait_idle().await;
    Ok(Reply {
        status: resp.status().as_u16(),
        version: "3".into(),
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_head_skips_interim_responses_and_lowercases_names() {
        let dump = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nX-Request-Id: a:b\r\n\r\n";
        assert_eq!(
            last_head(dump),
            [
                ("content-length".to_string(), "0".to_string()),
                ("x-request-id".to_string(), "a:b".to_string())
            ]
        );
        assert!(last_head("").is_empty());
    }
}
