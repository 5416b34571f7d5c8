//! Session affinity (cookie and header), consistent hashing (ring hash and Maglev by header
//! and client IP) and active health checks, against real HTTP backends on 127.0.0.1.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use sweety_config::*;

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("test took too long")
}

/// An HTTP backend answering its `tag`; `/health` answers 200 while `healthy`, else 503.
async fn named(tag: &'static str, healthy: Arc<AtomicBool>) -> SocketAddr {
    spawn_backend(move |s| {
        let healthy = healthy.clone();
        async move {
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let healthy = healthy.clone();
                    async move {
                        let mut r = http::Response::new(Full::new(Bytes::from(tag)));
                        if req.uri().path() == "/health" && !healthy.load(Ordering::SeqCst) {
                            *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                        }
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                .await;
        }
    })
    .await
}

async fn three() -> (Vec<SocketAddr>, Vec<Arc<AtomicBool>>) {
    let flags: Vec<_> = (0..3).map(|_| Arc::new(AtomicBool::new(true))).collect();
    let mut addrs = Vec::new();
    for (i, tag) in ["A", "B", "C"].into_iter().enumerate() {
        addrs.push(named(tag, flags[i].clone()).await);
    }
    (addrs, flags)
}

fn multi(addrs: &[SocketAddr]) -> Backend {
    let mut b = backend("be", addrs[0]);
    b.endpoints = addrs
        .iter()
        .map(|a| Endpoint {
            address: a.to_string(),
            weight: 1,
        })
        .collect();
    b
}

fn config(b: Backend) -> Config {
    let mut cfg = http_config(vec![vhost("v", &[], vec![proxy_route("r", "/", "be")])]);
    cfg.backends = vec![b];
    cfg
}

/// GET / with headers; returns (status, body, response headers).
async fn req(c: &Client, url: &str, headers: &[(&str, String)]) -> (u16, String, http::HeaderMap) {
    let mut b = http::Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, v.as_str());
    }
    let resp = c
        .request(b.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned(), headers)
}

#[tokio::test]
async fn cookie_affinity_sticks_and_falls_back_when_the_endpoint_goes() {
    bounded(async {
        let (addrs, _) = three().await;
        let mut b = multi(&addrs);
        b.session_persistence = Some(SessionPersistence {
            kind: SessionKind::Cookie,
            name: "route".into(),
            ttl: Some(sweety_config::Duration::from_secs(600)),
            path: None,
            secure: false,
            http_only: true,
            same_site: Some("Lax".into()),
        });
        let cfg = config(b.clone());
        let h = Harness::start(cfg).await;
        let url = format!("http://{}/", h.addr("web").await);
        let c = h1_client();
        let (_, first, headers) = req(&c, &url, &[]).await;
        let set = headers["set-cookie"].to_str().unwrap().to_string();
        assert!(
            set.starts_with("route=") && set.contains("Max-Age=600; HttpOnly; SameSite=Lax"),
            "{set}"
        );
        let cookie = set.split(';').next().unwrap().to_string();
        // Twenty requests with the cookie: same endpoint, no new cookie.
        for _ in 0..20 {
            let (_, who, headers) = req(&c, &url, &[("cookie", format!("a=b; {cookie}"))]).await;
            assert_eq!(who, first);
            assert!(headers.get("set-cookie").is_none());
        }
        // Without a cookie, round robin spreads.
        let mut seen = HashSet::new();
        for _ in 0..6 {
            seen.insert(req(&c, &url, &[]).await.1);
        }
        assert_eq!(seen.len(), 3);
        // The endpoint leaves the config: the request goes elsewhere and gets a new cookie.
        let mut gone = b.clone();
        gone.endpoints.retain(|e| {
            let i = addrs
                .iter()
                .position(|a| a.to_string() == e.address)
                .unwrap();
            ["A", "B", "C"][i] != first
        });
        let mut cfg2 = config(gone);
        cfg2.generation = 2;
        h.runtime.apply(cfg2).await.unwrap();
        let (s, who, headers) = req(&c, &url, &[("cookie", cookie.clone())]).await;
        assert_eq!(s, 200);
        assert_ne!(who, first);
        let new_cookie = headers["set-cookie"].to_str().unwrap();
        assert_ne!(new_cookie.split(';').next().unwrap(), cookie);
        // A forged token is ignored the same way.
        let (s, _, headers) = req(&c, &url, &[("cookie", "route=ffffffffffffffff".into())]).await;
        assert_eq!(s, 200);
        assert!(headers.get("set-cookie").is_some());
    })
    .await;
}

#[tokio::test]
async fn header_session_persistence_round_trips_the_token() {
    bounded(async {
        let (addrs, _) = three().await;
        let mut b = multi(&addrs);
        b.session_persistence = Some(SessionPersistence {
            kind: SessionKind::Header,
            name: "x-session".into(),
            ttl: None,
            path: None,
            secure: false,
            http_only: true,
            same_site: None,
        });
        let h = Harness::start(config(b)).await;
        let url = format!("http://{}/", h.addr("web").await);
        let c = h1_client();
        let (_, first, headers) = req(&c, &url, &[]).await;
        let token = headers["x-session"].to_str().unwrap().to_string();
        assert_eq!(token.len(), 16);
        for _ in 0..10 {
            let (_, who, _) = req(&c, &url, &[("x-session", token.clone())]).await;
            assert_eq!(who, first);
        }
    })
    .await;
}

#[tokio::test]
async fn consistent_hashing_by_header_and_client_ip() {
    bounded(async {
        let (addrs, _) = three().await;
        for algorithm in [HashAlgorithm::RingHash, HashAlgorithm::Maglev] {
            let mut b = multi(&addrs);
            b.hash = Some(HashPolicy {
                on: HashOn::Header("x-user".into()),
                algorithm,
            });
            let h = Harness::start(config(b.clone())).await;
            let url = format!("http://{}/", h.addr("web").await);
            let c = h1_client();
            let mut owner = HashMap::new();
            for round in 0..3 {
                for u in 0..30 {
                    let user = format!("user-{u}");
                    let (_, who, _) = req(&c, &url, &[("x-user", user.clone())]).await;
                    let prev = owner.insert(user, who.clone());
                    if round > 0 {
                        assert_eq!(prev, Some(who), "{algorithm:?}: a key moved");
                    }
                }
            }
            let used: HashSet<_> = owner.values().collect();
            assert_eq!(
                used.len(),
                3,
                "{algorithm:?}: keys spread over every endpoint"
            );
            h.runtime.shutdown().await;

            // By client IP: every request from 127.0.0.1 lands on one endpoint.
            b.hash = Some(HashPolicy {
                on: HashOn::ClientIp,
                algorithm,
            });
            let h = Harness::start(config(b)).await;
            let url = format!("http://{}/", h.addr("web").await);
            let mut seen = HashSet::new();
            for _ in 0..10 {
                seen.insert(req(&c, &url, &[]).await.1);
            }
            assert_eq!(seen.len(), 1, "{algorithm:?}: {seen:?}");
            h.runtime.shutdown().await;
        }
    })
    .await;
}

#[tokio::test]
async fn active_health_checks_skip_down_endpoints_and_bring_them_back() {
    bounded(async {
        let (addrs, flags) = three().await;
        let mut b = multi(&addrs);
        b.hash = Some(HashPolicy {
            on: HashOn::Header("x-user".into()),
            algorithm: HashAlgorithm::RingHash,
        });
        b.health_check = Some(HealthCheck {
            path: "/health".into(),
            interval: sweety_config::Duration::from_millis(50),
            timeout: sweety_config::Duration::from_millis(500),
            healthy_threshold: 2,
            unhealthy_threshold: 2,
            ..HealthCheck::default()
        });
        let h = Harness::start(config(b)).await;
        let url = format!("http://{}/", h.addr("web").await);
        let c = h1_client();
        let mut owner = HashMap::new();
        for u in 0..30 {
            let user = format!("user-{u}");
            owner.insert(user.clone(), req(&c, &url, &[("x-user", user)]).await.1);
        }
        // B's health endpoint starts failing: it is marked down.
        flags[1].store(false, Ordering::SeqCst);
        let snap = || h.runtime.shared.snapshot();
        let b_addr = addrs[1].to_string();
        let mut down = false;
        for _ in 0..200 {
            if snap().upstreams.endpoint_up("be", &b_addr) == Some(false) {
                down = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(down, "B never marked down");
        // No traffic to B; keys of A and C stay put, only B's move.
        for (user, who) in &owner {
            let (s, now, _) = req(&c, &url, &[("x-user", user.clone())]).await;
            assert_eq!(s, 200);
            assert_ne!(now, "B");
            if who != "B" {
                assert_eq!(&now, who, "{user} moved although its endpoint is up");
            }
        }
        for _ in 0..10 {
            assert_ne!(req(&c, &url, &[]).await.1, "B");
        }
        // B recovers and comes back after healthy_threshold passes.
        flags[1].store(true, Ordering::SeqCst);
        let mut up = false;
        for _ in 0..200 {
            if snap().upstreams.endpoint_up("be", &b_addr) == Some(true) {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(up, "B never came back");
        for (user, who) in &owner {
            assert_eq!(&req(&c, &url, &[("x-user", user.clone())]).await.1, who);
        }
        let text = h.runtime.shared.metrics.render();
        assert!(
            text.contains("sweety_health_checks_total{backend=\"be\",result=\"down\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("sweety_health_checks_total{backend=\"be\",result=\"up\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("sweety_health_checks_total{backend=\"be\",result=\"fail\"}"),
            "{text}"
        );

        // Every endpoint down: a clear no-endpoint error rather than a dead backend.
        for f in &flags {
            f.store(false, Ordering::SeqCst);
        }
        let mut all_down = false;
        for _ in 0..200 {
            if addrs
                .iter()
                .all(|a| snap().upstreams.endpoint_up("be", &a.to_string()) == Some(false))
            {
                all_down = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(all_down);
        let (s, body, _) = req(&c, &url, &[]).await;
        assert_eq!(
            (s, body.as_str()),
            (502, "502 Bad Gateway: no healthy upstream endpoint\n")
        );
    })
    .await;
}
