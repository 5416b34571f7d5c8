//! Passthrough hosts of an `https` listener (ingress-nginx `ssl-passthrough`), with real
//! sockets on 127.0.0.1: a TLS backend with its own certificate behind a listener that also
//! terminates another host. The passthrough name reaches the backend's handshake (the client
//! verifies the backend's certificate and gets its answer), the other name, a client without
//! SNI and a fragmented ClientHello are served here, a fragmented hello for the passthrough
//! name still passes through, a ClientHello that never completes is closed at
//! `l4.peek_timeout`, HTTP/3 refuses the passthrough name, and reloads add and remove
//! passthrough hosts on the kept sockets.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use sweety_config::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test took too long")
}

/// A rustls client config trusting only `ca_pem` (TLS 1.2 and 1.3), sending SNI or not.
fn client_config(ca_pem: &str, sni: bool) -> Arc<rustls::ClientConfig> {
    let mut cfg = client_config_trusting(ca_pem).with_no_client_auth();
    cfg.enable_sni = sni;
    Arc::new(cfg)
}

/// TLS to `addr` for `name` (trusting only `ca_pem`; SNI sent when `sni`), writes `msg`,
/// reads to the end. Err when the handshake fails.
async fn tls_exchange(
    addr: SocketAddr,
    name: &str,
    ca_pem: &str,
    sni: bool,
    msg: &[u8],
) -> Result<String, String> {
    let connector = tokio_rustls::TlsConnector::from(client_config(ca_pem, sni));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let server = rustls_pki_types::ServerName::try_from(name.to_string()).unwrap();
    let mut tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(server, tcp))
        .await
        .map_err(|_| "handshake timeout".to_string())?
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(msg).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The same over a blocking socket, with the ClientHello re-framed into records of at most
/// `fragment` handshake bytes, each record written on its own (TCP_NODELAY, a pause between
/// them): the listener must reassemble it. The rest of the handshake is rustls's own.
fn fragmented_exchange(
    addr: SocketAddr,
    name: &str,
    ca_pem: &str,
    fragment: usize,
    msg: &[u8],
) -> Result<String, String> {
    let server = rustls_pki_types::ServerName::try_from(name.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(client_config(ca_pem, true), server).unwrap();
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    sock.set_nodelay(true).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    assert_eq!(hello[0], 0x16, "a handshake record");
    let body = &hello[5..];
    assert_eq!(
        body.len(),
        usize::from(u16::from_be_bytes([hello[3], hello[4]]))
    );
    for part in body.chunks(fragment) {
        let mut record = vec![0x16, 0x03, 0x01];
        record.extend_from_slice(&(part.len() as u16).to_be_bytes());
        record.extend_from_slice(part);
        sock.write_all(&record).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    tls.write_all(msg).map_err(|e| format!("handshake: {e}"))?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        // The backend's answer, then a close without close_notify is still its answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
        Err(e) => return Err(e.to_string()),
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// An HTTPS listener "web" (HTTP/3 on) terminating `site.test` (one route answering
/// "sweety") with `pt.test` as a passthrough host to the backend `pt`.
fn config(pt: SocketAddr, site: Certificate) -> Config {
    let mut web = listener("web", ListenerProtocol::Https);
    web.tls = Some(ListenerTls {
        certificates: vec![site],
        min_version: TlsVersion::Tls12,
        client_auth: None,
        host_client_auth: Vec::new(),
    });
    web.http3 = true;
    web.l4_routes = vec![L4Route {
        name: "pt".into(),
        hostnames: vec!["pt.test".into()],
        terminate: false,
        backends: vec![WeightedBackend {
            backend: "pt".into(),
            weight: 1,
            filters: vec![],
        }],
    }];
    let mut cfg = http_config(vec![vhost(
        "site",
        &["site.test"],
        vec![fixed_route("r", "/", "sweety")],
    )]);
    cfg.listeners = vec![web];
    cfg.virtual_hosts[0].listeners = vec!["web".into()];
    cfg.backends = vec![backend("pt", pt)];
    cfg
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nhost: site.test\r\nconnection: close\r\n\r\n";

#[tokio::test]
async fn passthrough_hosts_reach_their_backend_and_the_others_are_served_here() {
    bounded(async {
        let (pt, pem_pt) = tls_backend("pt.test", "B").await;
        let (site, pem_site) = cert_for("site.test");
        let h = Harness::start(config(pt, site)).await;
        let addr = h.addr("web").await;

        // The passthrough name: the client verifies the BACKEND's certificate (it trusts only
        // that one) and reads the backend's answer to its bytes.
        assert_eq!(
            tls_exchange(addr, "pt.test", &pem_pt, true, b"ping").await,
            Ok("B:ping".into())
        );
        // Sweety's certificate is not what it gets for that name.
        assert!(tls_exchange(addr, "pt.test", &pem_site, true, b"ping")
            .await
            .is_err());

        // The other name is terminated here, over HTTP/1.1 and HTTP/2.
        for alpn in [&b"http/1.1"[..], b"h2"] {
            let (negotiated, status, body) = tls_get(addr, "site.test", &pem_site, &[alpn], "/")
                .await
                .unwrap();
            assert_eq!((&negotiated[..], status, &body[..]), (alpn, 200, "sweety"));
        }
        // The backend's certificate does not verify there: it is Sweety's handshake.
        assert!(tls_exchange(addr, "site.test", &pem_pt, true, GET)
            .await
            .is_err());
        // A request for the passthrough host on a connection made for another name (what
        // HTTP/2 connection reuse does under a certificate covering both): 421, connect again.
        let reply = tls_exchange(
            addr,
            "site.test",
            &pem_site,
            true,
            b"GET / HTTP/1.1\r\nhost: PT.test\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        assert!(reply.starts_with("HTTP/1.1 421"), "{reply}");
        // No SNI: served here with the listener's certificate.
        let reply = tls_exchange(addr, "site.test", &pem_site, false, GET)
            .await
            .unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.ends_with("sweety"), "{reply}");

        // Fragmented ClientHellos (records of 40 and of 1 handshake bytes), both ways.
        for fragment in [40, 1] {
            let pem = pem_pt.clone();
            let got = tokio::task::spawn_blocking(move || {
                fragmented_exchange(addr, "pt.test", &pem, fragment, b"frag")
            })
            .await
            .unwrap();
            assert_eq!(got, Ok("B:frag".into()), "fragment {fragment}");
            let pem = pem_site.clone();
            let got = tokio::task::spawn_blocking(move || {
                fragmented_exchange(addr, "site.test", &pem, fragment, GET)
            })
            .await
            .unwrap()
            .unwrap();
            assert!(
                got.starts_with("HTTP/1.1 200"),
                "fragment {fragment}: {got}"
            );
            assert!(got.ends_with("sweety"), "fragment {fragment}: {got}");
        }

        // Not TLS: refused by the handshake as on any https listener (nothing reached the
        // backend: its answers above are the only ones).
        let mut raw = TcpStream::connect(addr).await.unwrap();
        raw.write_all(GET).await.unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut buf)).await;
        assert!(!String::from_utf8_lossy(&buf).contains("sweety"));

        let text = h.runtime.shared.metrics.render();
        assert!(
            text.contains("kind=\"https_passthrough\"} 4"),
            "two whole and two fragmented passthrough connections: {text}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_client_hello_that_never_completes_is_closed_at_the_peek_timeout() {
    bounded(async {
        let (pt, _) = tls_backend("pt.test", "B").await;
        let (site, _) = cert_for("site.test");
        let mut cfg = config(pt, site);
        cfg.l4.peek_timeout = sweety_config::Duration::from_millis(200);
        let h = Harness::start(cfg).await;
        let addr = h.addr("web").await;
        // Half a ClientHello for the passthrough name, then nothing: closed by the listener
        // (EOF or reset, never an answer), counted as a peek timeout.
        let hello = {
            let server = rustls_pki_types::ServerName::try_from("pt.test").unwrap();
            let mut conn = rustls::ClientConnection::new(client_config("", true), server).unwrap();
            let mut out = Vec::new();
            conn.write_tls(&mut out).unwrap();
            out
        };
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&hello[..hello.len() / 2]).await.unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut buf))
            .await
            .expect("closed by the listener");
        assert!(buf.is_empty(), "{read:?} {buf:?}");
        let text = h.runtime.shared.metrics.render();
        assert!(text.contains("kind=\"tls_peek_timeout\"} 1"), "{text}");
        assert!(!text.contains("https_passthrough"), "{text}");
    })
    .await;
}

#[tokio::test]
async fn the_peek_and_the_tls_handshake_share_one_handshake_timeout() {
    bounded(async {
        let (pt, _) = tls_backend("pt.test", "B").await;
        let (site, _) = cert_for("site.test");
        let mut cfg = config(pt, site);
        // A peek timeout far beyond the test's wait: only the handshake bound (300 ms) can
        // close a client that trickles half a hello and stops.
        cfg.l4.peek_timeout = sweety_config::Duration::from_secs(120);
        cfg.limits.header_read_timeout = sweety_config::Duration::from_millis(300);
        let h = Harness::start(cfg).await;
        let addr = h.addr("web").await;
        let hello = {
            let server = rustls_pki_types::ServerName::try_from("site.test").unwrap();
            let mut conn = rustls::ClientConnection::new(client_config("", true), server).unwrap();
            let mut out = Vec::new();
            conn.write_tls(&mut out).unwrap();
            out
        };
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&hello[..hello.len() / 2]).await.unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut buf))
            .await
            .expect("closed at the handshake bound, not at the 120 s peek timeout");
        assert!(buf.is_empty(), "{read:?} {buf:?}");
        let text = h.runtime.shared.metrics.render();
        assert!(text.contains("kind=\"tls_peek_timeout\"} 1"), "{text}");
    })
    .await;
}

/// A QUIC handshake (ALPN h3, trusting only `ca`) with `addr` for `name`.
async fn quic_handshake(addr: SocketAddr, name: &str, ca: String) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    let r = ep.connect(addr, name).unwrap().await;
    r.map(|c| c.close(0u32.into(), b"done"))
        .map_err(|e| e.to_string())
}

/// Sweety's certificate for site.test that would also be valid for pt.test, and its PEM.
fn site_cert_covering_both() -> (Certificate, String) {
    let (c, k) = sweety_dataplane::tls::self_signed(&["site.test", "pt.test"]).unwrap();
    (
        Certificate {
            hostnames: vec![],
            cert: PemSource::Pem(c.clone()),
            key: PemSource::Pem(k),
        },
        c,
    )
}

/// Hot reload: passthrough hosts added to and removed from an https listener take effect on
/// the kept TCP and UDP sockets, for TCP (peek or not) and QUIC (refused or not) alike.
#[tokio::test]
async fn reloads_add_and_remove_passthrough_hosts_on_the_kept_sockets() {
    bounded(async {
        let (pt, pem_pt) = tls_backend("pt.test", "B").await;
        let (site, pem_site) = site_cert_covering_both();
        let with = config(pt, site);
        let mut without = with.clone();
        without.listeners[0].l4_routes.clear();
        let h = Harness::start(without.clone()).await;
        let (tcp, quic) = (h.addr("web").await, h.runtime.bound_quic().await["web"]);
        let terminated = |h3: Result<(), String>, tcp: Result<String, String>| {
            assert_eq!(h3, Ok(()));
            let reply = tcp.unwrap();
            assert!(!reply.contains("B:"), "{reply}");
        };
        terminated(
            quic_handshake(quic, "pt.test", pem_site.clone()).await,
            tls_exchange(tcp, "pt.test", &pem_site, true, GET).await,
        );
        let mut next = with.clone();
        next.generation = 2;
        h.runtime.apply(next).await.unwrap();
        assert_eq!(
            (h.addr("web").await, h.runtime.bound_quic().await["web"]),
            (tcp, quic),
            "sockets kept"
        );
        assert_eq!(
            tls_exchange(tcp, "pt.test", &pem_pt, true, b"ping").await,
            Ok("B:ping".into())
        );
        assert!(quic_handshake(quic, "pt.test", pem_site.clone())
            .await
            .is_err());
        assert_eq!(
            quic_handshake(quic, "site.test", pem_site.clone()).await,
            Ok(())
        );
        without.generation = 3;
        h.runtime.apply(without).await.unwrap();
        terminated(
            quic_handshake(quic, "pt.test", pem_site.clone()).await,
            tls_exchange(tcp, "pt.test", &pem_site, true, GET).await,
        );
    })
    .await;
}

/// QUIC cannot be passed through by SNI here: HTTP/3 refuses the passthrough name at its
/// handshake (no certificate of ours is offered for it), so the client falls back to TCP,
/// which passes through; the other name is served over HTTP/3 as before.
#[tokio::test]
async fn http3_refuses_the_passthrough_name() {
    bounded(async {
        let (pt, pem_pt) = tls_backend("pt.test", "B").await;
        // Sweety's own certificate would even be valid for the passthrough name.
        let (site, pem_site) = site_cert_covering_both();
        let h = Harness::start(config(pt, site)).await;
        let quic = h.runtime.bound_quic().await["web"];
        let connect = |name: &'static str, ca: String| quic_handshake(quic, name, ca);
        assert_eq!(connect("site.test", pem_site.clone()).await, Ok(()));
        // Whichever certificate the client trusts, no handshake completes for the name.
        let err = connect("pt.test", pem_pt.clone()).await.unwrap_err();
        assert!(err.contains("handshake") || err.contains("TLS"), "{err}");
        let err = connect("pt.test", pem_site.clone()).await.unwrap_err();
        assert!(err.contains("handshake") || err.contains("TLS"), "{err}");
        // Over TCP the name still passes through to the backend.
        let addr = h.addr("web").await;
        assert_eq!(
            tls_exchange(addr, "pt.test", &pem_pt, true, b"tcp").await,
            Ok("B:tcp".into())
        );
        assert!(tls_exchange(addr, "pt.test", &pem_site, true, b"tcp")
            .await
            .is_err());
    })
    .await;
}
