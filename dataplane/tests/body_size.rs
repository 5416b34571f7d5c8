//! Integration tests of the per-route request body limit (`Route.max_request_body_bytes`,
//! ingress-nginx's `proxy-body-size`) with a real backend on 127.0.0.1, over HTTP/1.1 and
//! HTTP/2 (h2c): a route's limit replaces the dataplane-wide one, lower or higher; `0` lifts
//! it; a declared length over the limit is answered 413 before the backend is asked, and a
//! chunked body that grows past it is cut (the backend never receives it whole).

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn post(client: &Client, url: &str, len: usize) -> (u16, String) {
    let req = http::Request::post(url)
        .body(Full::new(Bytes::from(vec![b'x'; len])))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn route_body_limits_replace_the_global_one() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let app = spawn_http_backend(move |req: http::Request<hyper::body::Incoming>| {
            let hits = counted.clone();
            async move {
                hits.fetch_add(1, Ordering::SeqCst);
                let n = match req.into_body().collect().await {
                    Ok(b) => b.to_bytes().len(),
                    Err(_) => usize::MAX,
                };
                http::Response::new(Full::new(Bytes::from(format!("got {n}"))))
            }
        })
        .await;
        let mut small = proxy_route("small", "/small", "app");
        small.max_request_body_bytes = Some(10);
        let mut unlimited = proxy_route("unlimited", "/unlimited", "app");
        unlimited.max_request_body_bytes = Some(0);
        let mut large = proxy_route("large", "/large", "app");
        large.max_request_body_bytes = Some(4096);
        let global = proxy_route("global", "/global", "app");
        let mut cfg = http_config(vec![vhost("v", &[], vec![small, unlimited, large, global])]);
        cfg.backends = vec![backend("app", app)];
        cfg.limits.max_request_body_bytes = 1024;
        cfg.validate_structure().expect("valid");
        let h = Harness::start(cfg).await;
        let web = h.addr("web").await;
        let base = format!("http://{web}");
        for (proto, c) in [("h1", h1_client()), ("h2c", h2c_client())] {
            let before = hits.load(Ordering::SeqCst);
            for (path, len, want) in [
                ("/small", 10, (200, "got 10")),
                ("/small", 11, (413, "")),
                ("/global", 1024, (200, "got 1024")),
                ("/global", 1025, (413, "")),
                ("/large", 4096, (200, "got 4096")),
                ("/large", 4097, (413, "")),
                ("/unlimited", 300_000, (200, "got 300000")),
            ] {
                let (status, body) = post(&c, &format!("{base}{path}"), len).await;
                assert_eq!(status, want.0, "{proto} {path} {len}: {body}");
                if want.0 == 200 {
                    assert_eq!(body, want.1, "{proto} {path} {len}");
                }
            }
            // The declared lengths over a limit never reached the backend.
            assert_eq!(hits.load(Ordering::SeqCst) - before, 4, "{proto}");
        }
        // A chunked HTTP/1.1 body (no declared length) is cut at the route's limit.
        let mut s = tokio::net::TcpStream::connect(web).await.unwrap();
        s.write_all(
            b"POST /small HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n14\r\nxxxxxxxxxxxxxxxxxxxx\r\n0\r\n\r\n",
        )
        .await
        .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        let text = String::from_utf8_lossy(&out);
        // The backend never gets the 20 bytes: the stream is cut at 10 and the exchange fails
        // (502 once the head went upstream, as for the dataplane-wide limit).
        assert!(!text.contains("got 20"), "{text}");
        assert!(
            text.starts_with("HTTP/1.1 413") || text.starts_with("HTTP/1.1 502"),
            "{text}"
        );
    })
    .await
    .expect("test finished in time");
}
