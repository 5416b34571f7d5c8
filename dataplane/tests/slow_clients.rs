//! Slow clients cannot hold the house (issue 16): clients from one address (127.0.0.2) that ask
//! for a large response and never read it hold at most their per-client share of connections
//! and request slots while a normal client (127.0.0.1) is still served; `send_timeout` then
//! closes their connections and frees what they held. Bounded in time and count.

mod common;

use common::*;
use std::net::SocketAddr;
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

#[tokio::test]
async fn hostile_slow_readers_hold_their_share_and_a_normal_client_is_served() {
    let dir = tempfile::tempdir().unwrap();
    // Far more than the socket buffers of both ends take.
    std::fs::write(dir.path().join("big.bin"), vec![7u8; 48 << 20]).unwrap();
    std::fs::write(dir.path().join("small.txt"), b"small\n").unwrap();
    let route = Route {
        action: Action::Static(StaticSite {
            root: dir.path().to_path_buf(),
            index: vec![],
            try_files: vec![],
            precompressed: false,
            cache_control: None,
            strip_prefix: None,
            hide_dotfiles: true,
        }),
        ..fixed_route("files", "/", "")
    };
    let mut cfg = http_config(vec![vhost("v", &[], vec![route])]);
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
