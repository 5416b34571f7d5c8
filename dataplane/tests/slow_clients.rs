//! Slow clients cannot hold the house (issue 16): clients from one address (127.0.0.2) that ask
//! for a large response and never read it hold at most their per-client share of connections
//! and request slots while a normal client (127.0.0.1) is still served; `send_timeout` then
//! closes their connections and frees what they held. HTTP/1.1 and HTTP/2 on both engines
//! (HTTP/3: `h3.rs`); on Sweety's HTTP/2 engine also a client that keeps its flow-control
//! windows at zero. Bounded in time and count.

mod common;

use common::h2 as raw2;
use common::*;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use sweety_config::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{from}:0").parse().unwrap()).unwrap();
    s.connect(to).await.unwrap()
}

/// Whether the server closed `s` within `within` (EOF or reset), reading and dropping what
/// it sent.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = vec![0u8; 1 << 16];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// A static site with `big.bin` (48 MiB: far more than the socket buffers of both ends take)
/// and `small.txt` (`small\n`), served by a config of one plain HTTP listener.
fn big_site() -> (tempfile::TempDir, Config) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big.bin"), vec![7u8; 48 << 20]).unwrap();
    std::fs::write(dir.path().join("small.txt"), b"small\n").unwrap();
    let cfg = static_config(dir.path());
    (dir, cfg)
}

#[tokio::test]
async fn hostile_slow_readers_hold_their_share_and_a_normal_client_is_served() {
    let (_dir, mut cfg) = big_site();
    cfg.limits.max_requests_in_flight = 6;
    cfg.limits.queue_timeout = sweety_config::Duration::from_millis(50);
    cfg.limits.max_connections_per_client = 4;
    cfg.limits.max_requests_per_client = 3;
    cfg.limits.send_timeout = sweety_config::Duration::from_secs(3);
    // The connection answered 429 is kept alive; it goes once idle.
    cfg.limits.idle_timeout = sweety_config::Duration::from_secs(2);
    cfg.limits.header_read_timeout = sweety_config::Duration::from_secs(2);
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;

    // Six hostile connections: two are closed at once (connection cap); of the four left,
    // three hold a request slot each with a response they never read, the fourth gets 429.
    let mut hostile = Vec::new();
    for _ in 0..6 {
        let mut s = connect_from("127.0.0.2", addr).await;
        let _ = s
            .write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        hostile.push(s);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held = h
        .runtime
        .shared
        .client_requests
        .held("127.0.0.2".parse().unwrap());
    assert_eq!(held, 3, "the hostile address holds its request cap");
    assert_eq!(
        h.runtime
            .shared
            .client_conns
            .held("127.0.0.2".parse().unwrap()),
        4,
        "the hostile address holds its connection cap"
    );
    assert!(limit_hits(&h, "client_connections") >= 2);
    assert!(limit_hits(&h, "client_requests") >= 1);

    // A normal client is served meanwhile.
    for _ in 0..3 {
        let (status, body) = get(&h1_client(), &format!("http://{addr}/small.txt"), None)
            .await
            .unwrap();
        assert_eq!((status, body.as_str()), (200, "small\n"));
    }

    // send_timeout closes the stalled connections (whose responses stopped moving) and
    // frees their slots, while the clients still hold their sockets open.
    let shared = h.runtime.shared.clone();
    let freed = tokio::time::timeout(Duration::from_secs(20), async {
        while shared.client_conns.held("127.0.0.2".parse().unwrap()) > 0
            || shared.client_requests.held("127.0.0.2".parse().unwrap()) > 0
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        freed.is_ok(),
        "send_timeout freed the hostile connections and slots"
    );
    assert_eq!(shared.client_conns.addresses(), 0);
    // The two refused at once see their connection closed without a response.
    let mut refused = 0;
    for s in hostile.iter_mut() {
        if closed_within(s, Duration::from_millis(200)).await {
            refused += 1;
        }
    }
    assert!(refused >= 2, "{refused}");
}

/// A backend that answers every request with a 64 MiB body and writes it until its
/// connection fails; counts the connections that ended (the proxy closed them).
async fn endless_backend() -> (SocketAddr, Arc<AtomicUsize>) {
    let ended = Arc::new(AtomicUsize::new(0));
    let count = ended.clone();
    let addr = spawn_backend(move |mut s| {
        let count = count.clone();
        async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 67108864\r\n\r\n")
                .await;
            let chunk = vec![b'z'; 64 * 1024];
            for _ in 0..1024 {
                if s.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            count.fetch_add(1, Ordering::SeqCst);
        }
    })
    .await;
    (addr, ended)
}

/// HTTP/2 on Sweety's engine: a client that keeps its stream windows at zero while it
/// answers the server's keep-alive PINGs (so the socket is never stalled and the
/// connection-level `send_timeout` never fires) holds its response streams for
/// `send_timeout`, then each is reset with CANCEL, which frees its request slot and closes
/// its upstream connection; a normal client is served meanwhile and the hostile connection
/// itself still serves a request whose window it opens. (hyper's engine has no such
/// deadline: docs/security.md.)
#[tokio::test]
async fn h2_zero_window_streams_are_reset_after_send_timeout_and_free_their_slots() {
    let (be, ended) = endless_backend().await;
    let mut cfg = http_config(vec![vhost(
        "v",
        &[],
        vec![
            proxy_route("big", "/big", "b"),
            fixed_route("small", "/small", "small\n"),
        ],
    )]);
    cfg.backends = vec![backend("b", be)];
    cfg.limits.http2_engine = Http2Engine::Sweety;
    cfg.limits.max_requests_per_client = 2;
    cfg.limits.send_timeout = sweety_config::Duration::from_secs(2);
    // The server PINGs a silent client after 1 s; the client answers.
    cfg.limits.idle_timeout = sweety_config::Duration::from_secs(1);
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    let hostile_ip = "127.0.0.2".parse().unwrap();

    // INITIAL_WINDOW_SIZE 0: no response byte may be sent until the client says so.
    let (mut rd, mut wr) = raw2::open_from("127.0.0.2", addr, &[(0x4, 0)]).await;
    let mut out = Vec::new();
    for id in [1u32, 3, 5] {
        out.extend(raw2::frame(
            raw2::HEADERS,
            raw2::END_STREAM | raw2::END_HEADERS,
            id,
            &raw2::request_block("/big"),
        ));
    }
    wr.write_all(&out).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut statuses = std::collections::BTreeMap::new();
    let mut resets = std::collections::BTreeMap::new();
    let mut pings = 0;
    let mut served_meanwhile = false;
    let deadline = started + Duration::from_secs(20);
    // Every stream waits for window, the 429's small body too: all three are reset.
    while resets.len() < 3 {
        let f = match rd.next(deadline).await {
            raw2::Event::Frame(f) => f,
            other => panic!("{other:?} (statuses {statuses:?}, resets {resets:?})"),
        };
        match f.ty {
            raw2::SETTINGS if f.flags & raw2::ACK == 0 => {
                wr.write_all(&raw2::frame(raw2::SETTINGS, raw2::ACK, 0, &[]))
                    .await
                    .unwrap();
            }
            raw2::PING if f.flags & raw2::ACK == 0 => {
                pings += 1;
                wr.write_all(&raw2::frame(raw2::PING, raw2::ACK, 0, &f.payload))
                    .await
                    .unwrap();
            }
            raw2::HEADERS => {
                statuses.insert(f.stream, f.status.unwrap());
            }
            raw2::DATA => panic!("DATA on stream {} with a zero window", f.stream),
            raw2::RST_STREAM => {
                resets.insert(f.stream, (f.error_code(), started.elapsed()));
            }
            raw2::GOAWAY => panic!("GOAWAY {}", f.error_code()),
            _ => {}
        }
        if !served_meanwhile && statuses.len() == 3 {
            // The hostile address holds its cap: two streams held, the third refused.
            assert_eq!(
                h.runtime.shared.client_requests.held(hostile_ip),
                2,
                "{statuses:?}"
            );
            let (status, body) = get(&h2c_client(), &format!("http://{addr}/small"), None)
                .await
                .unwrap();
            assert_eq!((status, body.as_str()), (200, "small\n"));
            served_meanwhile = true;
        }
    }
    let want: std::collections::BTreeMap<u32, u16> = [(1, 200), (3, 200), (5, 429)].into();
    assert_eq!(statuses, want);
    assert!(served_meanwhile);
    for (id, (code, after)) in &resets {
        assert_eq!(*code, raw2::CANCEL, "stream {id}");
        assert!(
            *after >= Duration::from_secs(2),
            "stream {id} reset after {after:?}"
        );
    }
    assert!(
        pings >= 1,
        "the client answered the server's keep-alive PINGs"
    );
    assert_eq!(limit_hits(&h, "h2_send_timeout"), 3);
    // The slots are free and both upstream connections were closed, not pooled.
    let shared = h.runtime.shared.clone();
    let freed = tokio::time::timeout(Duration::from_secs(10), async {
        while shared.client_requests.held(hostile_ip) > 0 || ended.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        freed.is_ok(),
        "slots held {}, upstream connections ended {}",
        shared.client_requests.held(hostile_ip),
        ended.load(Ordering::SeqCst)
    );
    // The connection itself still serves a stream whose window the client opens.
    let mut out = raw2::frame(
        raw2::HEADERS,
        raw2::END_STREAM | raw2::END_HEADERS,
        7,
        &raw2::request_block("/small"),
    );
    out.extend(raw2::frame(
        raw2::WINDOW_UPDATE,
        0,
        7,
        &1024u32.to_be_bytes(),
    ));
    wr.write_all(&out).await.unwrap();
    rd.until(&mut wr, "stream 7's body", |e| {
        matches!(e, raw2::Event::Frame(f) if f.stream == 7 && f.ty == raw2::DATA
            && f.flags & raw2::END_STREAM != 0)
    })
    .await;
}

/// HTTP/2 on both engines: the H1 test's hostile clients speak h2c and open their
/// flow-control windows wide (so what stalls is the socket, not a window): past
/// `max_connections_per_client` a connection is closed at once, past
/// `max_requests_per_client` a stream gets 429; a normal client is served meanwhile; then
/// `send_timeout` closes the stalled connections and frees every slot.
#[tokio::test]
async fn h2_hostile_slow_readers_hold_their_share_on_both_engines() {
    for engine in [Http2Engine::Sweety, Http2Engine::Hyper] {
        h2_slow_readers(engine).await;
    }
}

async fn h2_slow_readers(engine: Http2Engine) {
    let (_dir, mut cfg) = big_site();
    cfg.limits.http2_engine = engine;
    cfg.limits.max_connections_per_client = 2;
    cfg.limits.max_requests_per_client = 3;
    cfg.limits.send_timeout = sweety_config::Duration::from_secs(3);
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    let ip = "127.0.0.2".parse().unwrap();
    let shared = h.runtime.shared.clone();

    // Windows as wide as they go, then two requests per connection.
    let mut hello = raw2::PREFACE.to_vec();
    let mut params = 0x4u16.to_be_bytes().to_vec();
    params.extend_from_slice(&0x7fff_ffffu32.to_be_bytes());
    hello.extend(raw2::frame(raw2::SETTINGS, 0, 0, &params));
    hello.extend(raw2::frame(
        raw2::WINDOW_UPDATE,
        0,
        0,
        &(0x7fff_ffffu32 - 65_535).to_be_bytes(),
    ));
    for id in [1u32, 3] {
        hello.extend(raw2::frame(
            raw2::HEADERS,
            raw2::END_STREAM | raw2::END_HEADERS,
            id,
            &raw2::request_block("/big.bin"),
        ));
    }
    let mut hostile = Vec::new();
    for _ in 0..3 {
        let mut s = connect_from("127.0.0.2", addr).await;
        let _ = s.write_all(&hello).await;
        hostile.push(s);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Two connections held (the third closed at once), three streams held, the fourth 429.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while shared.client_requests.held(ip) < 3 || limit_hits(&h, "client_requests") < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{engine:?}: {} requests held, {} refused",
            shared.client_requests.held(ip),
            limit_hits(&h, "client_requests")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(shared.client_requests.held(ip), 3, "{engine:?}");
    assert_eq!(shared.client_conns.held(ip), 2, "{engine:?}");
    assert!(limit_hits(&h, "client_connections") >= 1, "{engine:?}");

    // A normal client is served meanwhile.
    for _ in 0..3 {
        let (status, body) = get(&h2c_client(), &format!("http://{addr}/small.txt"), None)
            .await
            .unwrap();
        assert_eq!((status, body.as_str()), (200, "small\n"), "{engine:?}");
    }

    // send_timeout closes the stalled connections and frees their slots while the clients
    // still hold their sockets open.
    let freed = tokio::time::timeout(Duration::from_secs(20), async {
        while shared.client_conns.held(ip) > 0 || shared.client_requests.held(ip) > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        freed.is_ok(),
        "{engine:?}: send_timeout freed the connections and slots"
    );
    for (i, s) in hostile.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(5)).await,
            "{engine:?}: hostile connection {i} closed"
        );
    }
}
