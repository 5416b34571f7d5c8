//! nginx's `proxy_read_timeout` / `proxy_send_timeout` semantics (`route.timeouts.read_idle` /
//! `send_idle`): idle clocks between two successive reads from / writes to the backend, not
//! deadlines. A real runtime on 127.0.0.1, a raw HTTP/1.1 backend whose pauses the test
//! scripts, HTTP/1.1 and h2c clients (and a raw HTTP/1.1 client for uploads).
//!
//! With both clocks at 1 s: a response trickled a byte every 300 ms for 2 s arrives whole; a
//! head 1.5 s late is 504; a body that pauses 1.5 s after its head is aborted; an upload the
//! backend takes slowly (pauses of 300 ms, 2.4 s in all) goes through; one the backend stops
//! taking is 504. Outcomes are asserted, never durations; every wait is bounded.

mod common;

use common::*;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test took too long")
}

const PAUSE: Duration = Duration::from_millis(300);
const STALL: Duration = Duration::from_millis(1500);

/// Reads a request head; returns its path, its `content-length` and the body bytes read
/// past the head.
async fn read_head(s: &mut TcpStream) -> Option<(String, usize, usize)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > 64 * 1024 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let path = head.split(' ').nth(1)?.to_string();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap_or(0));
    Some((path, len, buf.len() - end))
}

/// The backend: what it does depends on the path.
async fn backend_conn(mut s: TcpStream) {
    let Some((path, len, mut got)) = read_head(&mut s).await else {
        return;
    };
    let head =
        |n: usize| format!("HTTP/1.1 200 OK\r\ncontent-length: {n}\r\nconnection: close\r\n\r\n");
    match path.as_str() {
        "/trickle" => {
            let _ = s.write_all(head(7).as_bytes()).await;
            for b in b"trickle" {
                tokio::time::sleep(PAUSE).await;
                if s.write_all(&[*b]).await.is_err() {
                    return;
                }
            }
        }
        "/late" => {
            tokio::time::sleep(STALL).await;
            let _ = s.write_all(format!("{}ok", head(2)).as_bytes()).await;
        }
        "/stall" => {
            let _ = s.write_all(format!("{}abc", head(6)).as_bytes()).await;
            tokio::time::sleep(STALL).await;
            let _ = s.write_all(b"def").await;
        }
        "/upload-slow" => {
            // Takes the body 2 MiB at a time with a pause after each, 8 times (2.4 s of
            // pauses), then the rest at once: the proxy's socket buffers, full when the last
            // chunk is handed over, drain at once, as the read clock expects of a backend.
            let mut buf = vec![0u8; 64 * 1024];
            let (mut since_pause, mut pauses) = (0, 0);
            while got < len {
                let Ok(n) = s.read(&mut buf).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                got += n;
                since_pause += n;
                if since_pause >= 2 << 20 && pauses < 8 {
                    since_pause = 0;
                    pauses += 1;
                    tokio::time::sleep(PAUSE).await;
                }
            }
            let body = format!("got {got}");
            let _ = s
                .write_all(format!("{}{body}", head(body.len())).as_bytes())
                .await;
        }
        "/upload-stuck" => {
            // Never reads the body; lets go after a while.
            tokio::time::sleep(Duration::from_secs(20)).await;
        }
        _ => {}
    }
    let _ = s.shutdown().await;
    // Let the proxy read what was written before the socket goes.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// A runtime proxying everything to the scripted backend with both idle clocks at 1 s.
async fn start() -> (Harness, SocketAddr) {
    let backend_addr = spawn_backend(backend_conn).await;
    let mut route = proxy_route("r", "/", "b");
    route.timeouts.read_idle = Some(sweety_config::Duration::from_secs(1));
    route.timeouts.send_idle = Some(sweety_config::Duration::from_secs(1));
    let mut cfg = http_config(vec![vhost("v", &[], vec![route])]);
    cfg.backends = vec![backend("b", backend_addr)];
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    (h, addr)
}

#[tokio::test]
async fn trickled_response_is_read_whole_h1_and_h2() {
    bounded(async {
        let (_h, addr) = start().await;
        for client in [h1_client(), h2c_client()] {
            let got = get(&client, &format!("http://{addr}/trickle"), None).await;
            assert_eq!(got, Ok((200, "trickle".to_string())));
        }
    })
    .await;
}

#[tokio::test]
async fn late_head_is_504_h1_and_h2() {
    bounded(async {
        let (_h, addr) = start().await;
        for client in [h1_client(), h2c_client()] {
            let (status, body) = get(&client, &format!("http://{addr}/late"), None)
                .await
                .unwrap();
            assert_eq!(status, 504, "{body}");
        }
    })
    .await;
}

#[tokio::test]
async fn stalled_body_after_head_is_aborted_h1_and_h2() {
    bounded(async {
        let (_h, addr) = start().await;
        for client in [h1_client(), h2c_client()] {
            let got = get(&client, &format!("http://{addr}/stall"), None).await;
            assert!(got.is_err(), "the response was not aborted: {got:?}");
        }
    })
    .await;
}

/// Uploads `len` bytes to `path` over raw HTTP/1.1 and returns the response's first bytes.
async fn upload(addr: SocketAddr, path: &str, len: usize) -> String {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = s.into_split();
    let head = format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n");
    w.write_all(head.as_bytes()).await.unwrap();
    let writer = tokio::spawn(async move {
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0;
        while sent < len {
            let n = chunk.len().min(len - sent);
            if w.write_all(&chunk[..n]).await.is_err() {
                return;
            }
            sent += n;
        }
        // Keep the write half open until the test ends.
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    // The response: its head, then as many bytes as its content-length says (or up to EOF).
    let mut resp = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => resp.extend_from_slice(&buf[..n]),
        }
        let Some(end) = resp.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&resp[..end]).to_ascii_lowercase();
        let want = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok());
        if want.is_some_and(|n| resp.len() >= end + 4 + n) || resp.len() > 64 * 1024 {
            break;
        }
    }
    writer.abort();
    String::from_utf8_lossy(&resp).into_owned()
}

#[tokio::test]
async fn upload_taken_slowly_goes_through() {
    bounded(async {
        let (_h, addr) = start().await;
        let len = 40 << 20;
        let resp = upload(addr, "/upload-slow", len).await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        assert!(resp.ends_with(&format!("got {len}")), "{resp}");
    })
    .await;
}

#[tokio::test]
async fn upload_the_backend_stops_taking_is_504() {
    bounded(async {
        let (_h, addr) = start().await;
        let resp = upload(addr, "/upload-stuck", 60 << 20).await;
        assert!(resp.starts_with("HTTP/1.1 504"), "{resp}");
    })
    .await;
}
