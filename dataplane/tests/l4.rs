//! Layer-4 listeners with real sockets on 127.0.0.1: TCP proxying (weighted backends,
//! half-close, PROXY v2 to the backend (also on UDP, and forwarding a received PROXY
//! header's addresses), the connection limit), TLS passthrough routed by SNI
//! (the backend's own certificate reaches the client), TLS terminated by route beside
//! passthrough on one `tls` listener (plaintext to the backend), UDP sessions with idle expiry and a
//! bounded table, a TCP and a UDP listener on one port, and hot reload keeping the socket and
//! established connections.

mod common;

use common::*;
use std::net::SocketAddr;
use std::time::Duration;
use sweety_config::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test took too long")
}

/// A TCP server that answers each chunk with `<tag>:<chunk>` and closes after EOF. With
/// `proxy_protocol` it first reads a PROXY header and answers
/// `<tag>:from=<source>,to=<destination>|` to it.
async fn tcp_echo(tag: &'static str, proxy_protocol: bool) -> SocketAddr {
    spawn_backend(move |mut s| async move {
        if proxy_protocol {
            let a = sweety_dataplane::proxy_protocol::read_header(&mut s)
                .await
                .unwrap()
                .unwrap();
            let _ = s
                .write_all(format!("{tag}:from={},to={}|", a.source, a.destination).as_bytes())
                .await;
        }
        let mut buf = [0u8; 1024];
        for _ in 0..1000 {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut out = format!("{tag}:").into_bytes();
                    out.extend_from_slice(&buf[..n]);
                    if s.write_all(&out).await.is_err() {
                        break;
                    }
                }
            }
        }
    })
    .await
}

fn wb(name: &str, weight: u32) -> WeightedBackend {
    WeightedBackend {
        backend: name.into(),
        weight,
        filters: vec![],
    }
}

fn l4_listener(name: &str, protocol: ListenerProtocol, routes: Vec<L4Route>) -> Listener {
    let mut l = listener(name, protocol);
    l.l4_routes = routes;
    l
}

fn route(name: &str, hostnames: &[&str], backends: Vec<WeightedBackend>) -> L4Route {
    L4Route {
        name: name.into(),
        hostnames: hostnames.iter().map(|s| s.to_string()).collect(),
        terminate: false,
        backends,
    }
}

/// Sends `msg` and reads one reply chunk.
async fn roundtrip(s: &mut TcpStream, msg: &str) -> String {
    s.write_all(msg.as_bytes()).await.unwrap();
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("reply in time")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn tcp_proxy_weights_half_close_and_hot_reload() {
    bounded(async {
        let a = tcp_echo("A", false).await;
        let b = tcp_echo("B", false).await;
        let gen = |generation, backends| Config {
            generation,
            listeners: vec![l4_listener(
                "tcp",
                ListenerProtocol::Tcp,
                vec![route("r", &[], backends)],
            )],
            backends: vec![backend("a", a), backend("b", b)],
            ..Config::default()
        };
        let h = Harness::start(gen(1, vec![wb("a", 1), wb("b", 0)])).await;
        let addr = h.addr("tcp").await;
        // Weight 0 never gets traffic.
        for _ in 0..5 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            assert_eq!(roundtrip(&mut s, "hi").await, "A:hi");
        }
        // Half-close: our EOF reaches the backend, which closes; we read to the end.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"bye").await.unwrap();
        s.shutdown().await.unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "A:bye");

        // Reload to backend b: the socket is kept, an established connection stays on a, new
        // connections go to b.
        let mut kept = TcpStream::connect(addr).await.unwrap();
        assert_eq!(roundtrip(&mut kept, "1").await, "A:1");
        h.runtime.apply(gen(2, vec![wb("b", 1)])).await.unwrap();
        assert_eq!(h.addr("tcp").await, addr);
        assert_eq!(roundtrip(&mut kept, "2").await, "A:2");
        let mut fresh = TcpStream::connect(addr).await.unwrap();
        assert_eq!(roundtrip(&mut fresh, "3").await, "B:3");
        // Weighted split over many connections: 1:3, so b gets about 60 of 80 (the bounds are
        // about 4 standard deviations from the expected split; uniform picking gives 40).
        h.runtime
            .apply(gen(3, vec![wb("a", 1), wb("b", 3)]))
            .await
            .unwrap();
        let mut counts = std::collections::HashMap::new();
        for _ in 0..80 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            *counts.entry(roundtrip(&mut s, "x").await).or_insert(0u32) += 1;
        }
        let (a, b) = (
            counts.get("A:x").copied().unwrap_or(0),
            counts.get("B:x").copied().unwrap_or(0),
        );
        assert_eq!(a + b, 80, "{counts:?}");
        assert!(
            (5..=35).contains(&a) && b >= 45,
            "not a 1:3 split: {counts:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn tcp_proxy_sends_proxy_v2_and_respects_the_connection_limit() {
    bounded(async {
        let pp = tcp_echo("P", true).await;
        let mut be = backend("pp", pp);
        be.send_proxy_protocol = true;
        let mut cfg = Config {
            generation: 1,
            listeners: vec![l4_listener(
                "tcp",
                ListenerProtocol::Tcp,
                vec![route("r", &[], vec![wb("pp", 1)])],
            )],
            backends: vec![be],
            ..Config::default()
        };
        cfg.limits.max_connections = 1;
        let h = Harness::start(cfg).await;
        let addr = h.addr("tcp").await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        let local = first.local_addr().unwrap();
        let mut buf = [0u8; 256];
        let n = first.read(&mut buf).await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&buf[..n]),
            format!("P:from={local},to={addr}|"),
            "the backend learns the client address and the address it connected to"
        );
        // A second connection waits for the slot held by the first.
        let mut second = TcpStream::connect(addr).await.unwrap();
        let waiting = tokio::time::timeout(Duration::from_millis(300), second.read(&mut buf)).await;
        assert!(waiting.is_err(), "served beyond max_connections");
        drop(first);
        let n = tokio::time::timeout(Duration::from_secs(10), second.read(&mut buf))
            .await
            .expect("served once the slot frees")
            .unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("P:from="));
    })
    .await;
}

/// Behind a proxy that sends PROXY headers, the L4 backend's PROXY v2 header carries the
/// addresses from the received header: the real client and the address it connected to
/// (the front proxy's), not the front proxy's connection to us.
#[tokio::test]
async fn tcp_proxy_forwards_the_addresses_of_a_received_proxy_header() {
    bounded(async {
        let pp = tcp_echo("P", true).await;
        let mut be = backend("pp", pp);
        be.send_proxy_protocol = true;
        let mut cfg = Config {
            generation: 1,
            listeners: vec![l4_listener(
                "tcp",
                ListenerProtocol::Tcp,
                vec![route("r", &[], vec![wb("pp", 1)])],
            )],
            backends: vec![be],
            ..Config::default()
        };
        cfg.client_ip.proxy_protocol = vec!["tcp".into()];
        let h = Harness::start(cfg).await;
        let addr = h.addr("tcp").await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"PROXY TCP4 192.0.2.7 198.51.100.9 40000 443\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&buf[..n]),
            "P:from=192.0.2.7:40000,to=198.51.100.9:443|"
        );
        assert_eq!(roundtrip(&mut s, "x").await, "P:x");
    })
    .await;
}

async fn tls_roundtrip(addr: SocketAddr, sni: &str, ca: &str) -> Result<String, String> {
    let connector = tls_connector(ca, &[]);
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from(sni.to_string()).unwrap();
    let mut tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timeout".to_string())?
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
    let mut out = String::new();
    let _ = tls.read_to_string(&mut out).await;
    Ok(out)
}

#[tokio::test]
async fn tls_passthrough_routes_by_sni_without_terminating() {
    bounded(async {
        let (a, pem_a) = tls_backend("a.test", "A").await;
        let (b, pem_b) = tls_backend("api.b.test", "B").await;
        let cfg = Config {
            generation: 1,
            listeners: vec![l4_listener(
                "pass",
                ListenerProtocol::TlsPassthrough,
                vec![
                    route("a", &["a.test"], vec![wb("a", 1)]),
                    route("b", &["*.b.test"], vec![wb("b", 1)]),
                ],
            )],
            backends: vec![backend("a", a), backend("b", b)],
            ..Config::default()
        };
        let h = Harness::start(cfg).await;
        let addr = h.addr("pass").await;
        // Each client verifies its backend's own certificate: TLS went end to end.
        assert_eq!(
            tls_roundtrip(addr, "a.test", &pem_a).await.unwrap(),
            "A:ping"
        );
        assert_eq!(
            tls_roundtrip(addr, "api.b.test", &pem_b).await.unwrap(),
            "B:ping"
        );
        // A's certificate does not verify for b: the handshake reached B, not A.
        assert!(tls_roundtrip(addr, "api.b.test", &pem_a).await.is_err());
        // No route for this SNI: closed without a handshake.
        assert!(tls_roundtrip(addr, "c.test", &pem_a).await.is_err());
        // Not TLS at all: closed.
        let mut raw = TcpStream::connect(addr).await.unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut buf)).await;
        assert!(buf.is_empty());
        let text = h.runtime.shared.metrics.render();
        assert!(text.contains("kind=\"l4_no_route\"} 1"), "{text}");
        assert!(text.contains("kind=\"tls_peek_invalid\"} 1"), "{text}");
    })
    .await;
}

/// A programmed Gateway listener can have no route (none attached yet, or every backend
/// unresolved): its port must still accept and then close, never refuse (a refused
/// connection is what the Gateway API conformance suite's TLSRoute rejection tests failed on).
#[tokio::test]
async fn l4_listeners_without_routes_accept_and_close() {
    bounded(async {
        let cfg = Config {
            generation: 1,
            listeners: vec![
                l4_listener("pass", ListenerProtocol::TlsPassthrough, vec![]),
                l4_listener("tcp", ListenerProtocol::Tcp, vec![]),
            ],
            ..Config::default()
        };
        let h = Harness::start(cfg).await;
        // TLS: the ClientHello is read, then the connection is closed without a handshake.
        let (_, pem) = cert_for("a.test");
        let err = tls_roundtrip(h.addr("pass").await, "a.test", &pem)
            .await
            .expect_err("no route: no handshake");
        assert!(err.starts_with("handshake"), "{err}");
        // TCP: accepted (connect succeeds), then closed at once.
        let mut raw = TcpStream::connect(h.addr("tcp").await).await.unwrap();
        let mut buf = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut buf))
            .await
            .expect("closed by the listener");
        assert!(n.is_ok() && buf.is_empty(), "{n:?} {buf:?}");
        let text = h.runtime.shared.metrics.render();
        assert!(text.contains("kind=\"l4_no_route\"} 2"), "{text}");
    })
    .await;
}

/// Connects with TLS (trusting `ca`, SNI `sni`), sends `msg`, reads `want` bytes, then closes
/// its sending side and reads on to the end: the proxy must pass the half-close through.
async fn tls_ask(
    addr: SocketAddr,
    sni: &str,
    ca: &str,
    msg: &str,
    want: usize,
) -> Result<(String, String), String> {
    let connector = tls_connector(ca, &[]);
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from(sni.to_string()).unwrap();
    let mut tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timeout".to_string())?
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(msg.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut got = vec![0u8; want];
    tls.read_exact(&mut got).await.map_err(|e| e.to_string())?;
    tls.shutdown().await.map_err(|e| e.to_string())?;
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    Ok((
        String::from_utf8_lossy(&got).into_owned(),
        String::from_utf8_lossy(&rest).into_owned(),
    ))
}

/// A `tls` listener (Gateway API TLSRoute modes Terminate and Mixed): per SNI, one route
/// terminates TLS with the listener's certificate and hands the plaintext to a TCP backend,
/// another passes the TLS bytes through to a backend that completes its own handshake.
#[tokio::test]
async fn tls_listener_terminates_or_passes_through_by_sni() {
    bounded(async {
        let plain = tcp_echo("P", false).await;
        let (pass, pem_pass) = tls_backend("pass.test", "T").await;
        let (gw_cert, pem_gw) = cert_for("term.test");
        let mut terminate = route("term", &["term.test"], vec![wb("plain", 1)]);
        terminate.terminate = true;
        let mut l = l4_listener(
            "tls",
            ListenerProtocol::Tls,
            vec![
                terminate,
                route("pass", &["pass.test"], vec![wb("pass", 1)]),
            ],
        );
        l.tls = Some(ListenerTls {
            certificates: vec![gw_cert],
            min_version: TlsVersion::Tls12,
            client_auth: None,
            host_client_auth: Vec::new(),
        });
        let cfg = Config {
            generation: 1,
            listeners: vec![l],
            backends: vec![backend("plain", plain), backend("pass", pass)],
            ..Config::default()
        };
        let h = Harness::start(cfg).await;
        let addr = h.addr("tls").await;
        // Terminated with the listener's certificate; the backend read the plaintext "ping"
        // (its answer "P:ping" came back encrypted), and the client's close_notify reached it
        // as EOF, so it closed and the client read to the end.
        let (got, rest) = tls_ask(addr, "term.test", &pem_gw, "ping", 6)
            .await
            .unwrap();
        assert_eq!(got, "P:ping");
        assert_eq!(rest, "");
        // Two exchanges on one terminated connection.
        let (got, _) = tls_ask(addr, "term.test", &pem_gw, "abc", 5).await.unwrap();
        assert_eq!(got, "P:abc");
        // The terminating route presents the listener's certificate, not a backend's.
        assert!(tls_ask(addr, "term.test", &pem_pass, "x", 3).await.is_err());
        // Passthrough on the same listener: the backend's own certificate reaches the client.
        assert_eq!(
            tls_roundtrip(addr, "pass.test", &pem_pass).await.unwrap(),
            "T:ping"
        );
        assert!(tls_roundtrip(addr, "pass.test", &pem_gw).await.is_err());
        // No route for the name: closed before any handshake.
        assert!(tls_ask(addr, "other.test", &pem_gw, "x", 3).await.is_err());
        let text = h.runtime.shared.metrics.render();
        assert!(text.contains("kind=\"l4_no_route\"} 1"), "{text}");
        // The failed handshake (client not trusting the listener certificate) is counted.
        assert!(
            text.contains("kind=\"l4_tls_handshake_failed\"} 1"),
            "{text}"
        );
    })
    .await;
}

/// A UDP server answering `<tag>:<sender port>:<data>`.
async fn udp_echo(tag: &'static str) -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = s.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        loop {
            let Ok((n, from)) = s.recv_from(&mut buf).await else {
                return;
            };
            let out = format!(
                "{tag}:{}:{}",
                from.port(),
                String::from_utf8_lossy(&buf[..n])
            );
            let _ = s.send_to(out.as_bytes(), from).await;
        }
    });
    addr
}

/// Every datagram to a UDP backend with `send_proxy_protocol` starts with a PROXY v2 header
/// carrying the client's address; the reply goes back to the client without it.
#[tokio::test]
async fn udp_datagrams_carry_a_proxy_v2_header() {
    bounded(async {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let be_addr = s.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            loop {
                let Ok((n, from)) = s.recv_from(&mut buf).await else {
                    return;
                };
                let mut cur = std::io::Cursor::new(buf[..n].to_vec());
                let a = sweety_dataplane::proxy_protocol::read_header(&mut cur)
                    .await
                    .unwrap()
                    .unwrap();
                let rest = &buf[cur.position() as usize..n];
                let out = format!("from={}:{}", a.source, String::from_utf8_lossy(rest));
                let _ = s.send_to(out.as_bytes(), from).await;
            }
        });
        let mut be = backend("u", be_addr);
        be.send_proxy_protocol = true;
        let cfg = Config {
            generation: 1,
            listeners: vec![l4_listener(
                "udp",
                ListenerProtocol::Udp,
                vec![route("r", &[], vec![wb("u", 1)])],
            )],
            backends: vec![be],
            ..Config::default()
        };
        let h = Harness::start(cfg).await;
        let addr = h.addr("udp").await;
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let me = c.local_addr().unwrap();
        for msg in ["one", "two"] {
            let got = udp_ask(&c, addr, msg, Duration::from_secs(10)).await;
            assert_eq!(got, Some(format!("from={me}:{msg}")));
        }
    })
    .await;
}

async fn udp_ask(s: &UdpSocket, to: SocketAddr, msg: &str, wait: Duration) -> Option<String> {
    s.send_to(msg.as_bytes(), to).await.unwrap();
    let mut buf = [0u8; 2048];
    let (n, _) = tokio::time::timeout(wait, s.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// A UDP listener removed by one apply gives up its port to the next apply, which gives the
/// port to another UDP listener, at once: right after it and with no chance for the removed
/// listener's tasks (its receive loop, and the relay of the session open on it) to run in
/// between (this runtime has one thread, and neither apply yields to them). The new listener
/// relays on the port. Before, those tasks closed the socket once they had all run, and the
/// second apply failed with "address in use".
#[tokio::test]
async fn a_udp_listener_port_freed_by_one_apply_is_bound_by_the_next_at_once() {
    bounded(async {
        let (a, c) = (udp_echo("A").await, udp_echo("C").await);
        let one = |generation: u64, name: &str, port: u16, to: &str| Config {
            generation,
            listeners: vec![Listener {
                port,
                ..l4_listener(
                    name,
                    ListenerProtocol::Udp,
                    vec![route("r", &[], vec![wb(to, 1)])],
                )
            }],
            backends: vec![backend("a", a), backend("c", c)],
            ..Config::default()
        };
        let h = Harness::start(one(1, "a", 0, "a")).await;
        let addr = h.addr("a").await;
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let long = Duration::from_secs(10);
        let got = udp_ask(&client, addr, "one", long).await.unwrap();
        assert!(got.starts_with("A:") && got.ends_with(":one"), "{got}");

        // `a` taken out, then its port given to `c`, back to back.
        h.runtime.apply(one(2, "other", 0, "a")).await.unwrap();
        h.runtime
            .apply(one(3, "c", addr.port(), "c"))
            .await
            .unwrap();
        assert_eq!(h.addr("c").await, addr);
        let got = udp_ask(&client, addr, "two", long).await.unwrap();
        assert!(got.starts_with("C:") && got.ends_with(":two"), "{got}");
    })
    .await;
}

/// A TCP and a UDP listener on one address and port (validation allows it; the controller
/// emits it for a Gateway with TCP and UDP listeners on one port, DNS say) both relay, each
/// with its own view. Before, their bind keys were one: the snapshot kept one listener view
/// for both, and the apply closed the other listener's socket as removed.
#[tokio::test]
async fn a_tcp_and_a_udp_listener_on_one_port_both_relay() {
    bounded(async {
        let (t, u) = (tcp_echo("T", false).await, udp_echo("U").await);
        let on = |generation: u64, port: u16, udp: bool| Config {
            generation,
            listeners: std::iter::once(Listener {
                port,
                ..l4_listener(
                    "tcp",
                    ListenerProtocol::Tcp,
                    vec![route("r", &[], vec![wb("t", 1)])],
                )
            })
            .chain(udp.then(|| Listener {
                port,
                ..l4_listener(
                    "udp",
                    ListenerProtocol::Udp,
                    vec![route("r", &[], vec![wb("u", 1)])],
                )
            }))
            .collect(),
            backends: vec![backend("t", t), backend("u", u)],
            ..Config::default()
        };
        let h = Harness::start(on(1, 0, false)).await;
        let port = h.addr("tcp").await.port();
        h.runtime.apply(on(2, port, true)).await.unwrap();
        let addr = h.addr("tcp").await;
        assert_eq!((addr.port(), h.addr("udp").await), (port, addr));
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert_eq!(roundtrip(&mut s, "hi").await, "T:hi");
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let got = udp_ask(&client, addr, "one", Duration::from_secs(10)).await;
        assert!(
            got.as_ref()
                .is_some_and(|g| g.starts_with("U:") && g.ends_with(":one")),
            "{got:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn udp_sessions_expire_when_idle_and_are_bounded() {
    bounded(async {
        let u = udp_echo("U").await;
        let mut cfg = Config {
            generation: 1,
            listeners: vec![l4_listener(
                "udp",
                ListenerProtocol::Udp,
                vec![route("r", &[], vec![wb("u", 1)])],
            )],
            backends: vec![backend("u", u)],
            ..Config::default()
        };
        cfg.l4.udp_idle_timeout = sweety_config::Duration::from_millis(300);
        cfg.l4.udp_max_sessions = 1;
        let h = Harness::start(cfg.clone()).await;
        let addr = h.addr("udp").await;
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let long = Duration::from_secs(5);
        let r1 = udp_ask(&client, addr, "one", long).await.unwrap();
        let r2 = udp_ask(&client, addr, "two", long).await.unwrap();
        let port = |r: &str| r.split(':').nth(1).unwrap().to_string();
        assert!(r1.starts_with("U:") && r1.ends_with(":one"), "{r1}");
        assert_eq!(port(&r1), port(&r2), "one session, one upstream socket");
        // The table holds one session: another client is dropped meanwhile.
        let other = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        assert_eq!(
            udp_ask(&other, addr, "x", Duration::from_millis(200)).await,
            None
        );
        // After the idle timeout the session is gone; the next datagram opens a new one.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let r3 = udp_ask(&other, addr, "three", long).await.unwrap();
        assert!(r3.ends_with(":three"), "{r3}");
        tokio::time::sleep(Duration::from_millis(700)).await;
        let r4 = udp_ask(&client, addr, "four", long).await.unwrap();
        assert_ne!(
            port(&r1),
            port(&r4),
            "a new session has a new upstream socket"
        );
        let text = h.runtime.shared.metrics.render();
        assert!(text.contains("kind=\"udp_session_limit\"} 1"), "{text}");
        // Hot reload keeps the UDP socket.
        cfg.generation = 2;
        h.runtime.apply(cfg.clone()).await.unwrap();
        assert_eq!(h.addr("udp").await, addr);
        assert!(udp_ask(&client, addr, "five", long).await.is_some());
        // Each session holds a connection slot: with one slot (taken by `client`'s session)
        // a new client is dropped and counted even though the table has room.
        cfg.generation = 3;
        cfg.l4.udp_max_sessions = 10;
        cfg.limits.max_connections = 1;
        h.runtime.apply(cfg).await.unwrap();
        assert!(udp_ask(&client, addr, "six", long).await.is_some());
        let third = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        assert_eq!(
            udp_ask(&third, addr, "y", Duration::from_millis(200)).await,
            None
        );
        let text = h.runtime.shared.metrics.render();
        assert!(text.contains("kind=\"udp_connection_limit\"} 1"), "{text}");
    })
    .await;
}

#[tokio::test]
async fn idle_tcp_proxy_connections_are_closed() {
    bounded(async {
        let a = tcp_echo("A", false).await;
        let mut cfg = Config {
            generation: 1,
            listeners: vec![l4_listener(
                "tcp",
                ListenerProtocol::Tcp,
                vec![route("r", &[], vec![wb("a", 1)])],
            )],
            backends: vec![backend("a", a)],
            ..Config::default()
        };
        cfg.l4.tcp_idle_timeout = sweety_config::Duration::from_millis(300);
        let h = Harness::start(cfg).await;
        let mut s = TcpStream::connect(h.addr("tcp").await).await.unwrap();
        // Activity keeps it open past the idle timeout…
        for i in 0..4 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert_eq!(roundtrip(&mut s, &i.to_string()).await, format!("A:{i}"));
        }
        // …silence closes it.
        let started = std::time::Instant::now();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("closed by the idle timeout");
        assert!(matches!(n, Ok(0) | Err(_)));
        assert!(started.elapsed() >= Duration::from_millis(200));
    })
    .await;
}

#[tokio::test]
async fn tcp_health_checks_keep_connections_off_a_dead_endpoint() {
    bounded(async {
        let a = tcp_echo("A", false).await;
        // A port with nothing listening.
        let (_refusing, dead) = common::refused_addr();
        let mut be = backend("a", a);
        be.endpoints.push(Endpoint {
            address: dead.to_string(),
            weight: 1,
        });
        be.outlier.consecutive_failures = 0;
        be.health_check = Some(HealthCheck {
            kind: HealthCheckKind::Tcp,
            interval: sweety_config::Duration::from_millis(50),
            timeout: sweety_config::Duration::from_millis(500),
            unhealthy_threshold: 1,
            ..HealthCheck::default()
        });
        let cfg = Config {
            generation: 1,
            listeners: vec![l4_listener(
                "tcp",
                ListenerProtocol::Tcp,
                vec![route("r", &[], vec![wb("a", 1)])],
            )],
            backends: vec![be],
            ..Config::default()
        };
        let h = Harness::start(cfg).await;
        let mut down = false;
        for _ in 0..200 {
            let snap = h.runtime.shared.snapshot();
            if snap.upstreams.endpoint_up("a", &dead.to_string()) == Some(false) {
                down = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(down, "the dead endpoint was never marked down");
        assert_eq!(
            h.runtime
                .shared
                .snapshot()
                .upstreams
                .endpoint_up("a", &a.to_string()),
            Some(true)
        );
        let addr = h.addr("tcp").await;
        for i in 0..10 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            assert_eq!(roundtrip(&mut s, &i.to_string()).await, format!("A:{i}"));
        }
    })
    .await;
}

/// An ExternalName backend (`external`) never reaches an internal address on the L4 paths
/// either (TCP and UDP resolve through the same check as HTTP): a TCP connection to it is
/// closed without a byte from the loopback backend, a UDP datagram gets no answer, while the
/// same servers answer through an ordinary backend on another listener.
#[tokio::test]
async fn external_backends_never_reach_loopback_over_l4() {
    bounded(async {
        let t = tcp_echo("T", false).await;
        let u = udp_echo("U").await;
        let ext = |name: &str, addr: String| {
            let mut b = backend(name, t);
            b.endpoints[0].address = addr;
            b.external = true;
            b
        };
        let cfg = Config {
            generation: 1,
            listeners: vec![
                l4_listener(
                    "tcp-ext",
                    ListenerProtocol::Tcp,
                    vec![route("r1", &[], vec![wb("tcp-ext", 1)])],
                ),
                l4_listener(
                    "tcp-name",
                    ListenerProtocol::Tcp,
                    vec![route("r2", &[], vec![wb("tcp-name", 1)])],
                ),
                l4_listener(
                    "udp-ext",
                    ListenerProtocol::Udp,
                    vec![route("r3", &[], vec![wb("udp-ext", 1)])],
                ),
                l4_listener(
                    "udp-ok",
                    ListenerProtocol::Udp,
                    vec![route("r4", &[], vec![wb("udp-ok", 1)])],
                ),
                l4_listener(
                    "tcp-ok",
                    ListenerProtocol::Tcp,
                    vec![route("r5", &[], vec![wb("tcp-ok", 1)])],
                ),
            ],
            backends: vec![
                ext("tcp-ext", t.to_string()),
                ext("tcp-name", format!("localhost:{}", t.port())),
                ext("udp-ext", u.to_string()),
                backend("udp-ok", u),
                backend("tcp-ok", t),
            ],
            ..Config::default()
        };
        let h = Harness::start(cfg).await;
        for l in ["tcp-ext", "tcp-name"] {
            let mut s = TcpStream::connect(h.addr(l).await).await.unwrap();
            let _ = s.write_all(b"hi").await;
            let _ = s.shutdown().await;
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got).await;
            assert!(got.is_empty(), "{l}: {:?}", String::from_utf8_lossy(&got));
        }
        let mut s = TcpStream::connect(h.addr("tcp-ok").await).await.unwrap();
        assert_eq!(roundtrip(&mut s, "hi").await, "T:hi");
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let refused = udp_ask(&c, h.addr("udp-ext").await, "x", Duration::from_millis(500)).await;
        assert_eq!(refused, None);
        let ok = udp_ask(&c, h.addr("udp-ok").await, "y", Duration::from_secs(10)).await;
        assert!(ok.is_some_and(|r| r.starts_with("U:")));
    })
    .await;
}
