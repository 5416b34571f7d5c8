//! Integration tests of external authentication (`external_auth` filter, ingress-nginx's
//! `auth-url`) with a real auth service and a real backend started here on 127.0.0.1, driven
//! over HTTP/1.1 and HTTP/2 (h2c): allowed (headers copied, `Set-Cookie` passed), 401 with
//! and without a signin URL, 403, other statuses, a timeout, an unreachable service and an
//! oversized answer (500), forged auth headers stripped, the request body never sent to the
//! auth service, the subrequest bound (503), and the address policy of a tenant's URL.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sweety_config::*;

/// What the auth service received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    uri: String,
    headers: http::HeaderMap,
    body_len: usize,
}

struct AuthService {
    seen: Mutex<Vec<Seen>>,
    /// Requests with `session=hold` wait for a permit here.
    hold: tokio::sync::Semaphore,
    /// Signalled when a `session=hold` request arrived.
    entered: tokio::sync::Notify,
}

impl AuthService {
    fn new() -> Arc<AuthService> {
        Arc::new(AuthService {
            seen: Mutex::new(Vec::new()),
            hold: tokio::sync::Semaphore::new(0),
            entered: tokio::sync::Notify::new(),
        })
    }
}

/// The test auth service: decides by the `session` cookie of the original request.
async fn auth_service(state: Arc<AuthService>) -> std::net::SocketAddr {
    spawn_http_backend(move |req: http::Request<hyper::body::Incoming>| {
        let state = state.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body_len = body
                .collect()
                .await
                .map(|b| b.to_bytes().len())
                .unwrap_or(0);
            state.seen.lock().unwrap().push(Seen {
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
                headers: parts.headers.clone(),
                body_len,
            });
            let cookie = parts
                .headers
                .get("cookie")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let session = cookie
                .split(';')
                .find_map(|c| c.trim().strip_prefix("session="))
                .unwrap_or("")
                .to_string();
            let mut r = http::Response::builder();
            let body = match session.as_str() {
                "ok" => {
                    r = r
                        .status(200)
                        .header("x-auth-request-user", "alice")
                        .header("x-auth-request-email", "alice@example.com")
                        .header("x-not-listed", "leak")
                        .header("set-cookie", "refreshed=1; Path=/");
                    "yes"
                }
                "ok-nouser" => {
                    r = r.status(204);
                    ""
                }
                "forbidden" => {
                    r = r.status(403).header("set-cookie", "denied=1");
                    "no"
                }
                "teapot" => {
                    r = r.status(418);
                    "?"
                }
                "redirect" => {
                    r = r.status(302).header("location", "http://elsewhere/");
                    ""
                }
                "slow" => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    r = r.status(200);
                    ""
                }
                "bighead" => {
                    r = r
                        .status(200)
                        .header("x-auth-request-user", "x".repeat(70 * 1024));
                    ""
                }
                "bigbody" => {
                    r = r.status(200).header("x-auth-request-user", "bob");
                    return r.body(Full::new(Bytes::from(vec![b'b'; 1 << 20]))).unwrap();
                }
                "hold" => {
                    state.entered.notify_one();
                    let _ = state.hold.acquire().await.map(|p| p.forget());
                    r = r.status(200).header("x-auth-request-user", "held");
                    ""
                }
                _ => {
                    r = r
                        .status(401)
                        .header("www-authenticate", "Bearer realm=\"test\"")
                        .header("set-cookie", "cleared=1");
                    "who?"
                }
            };
            r.body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap()
        }
    })
    .await
}

/// A backend answering with what it received: method, path, the auth headers and the body
/// length, one per line.
async fn echo_backend(hits: Arc<AtomicUsize>) -> std::net::SocketAddr {
    spawn_http_backend(move |req: http::Request<hyper::body::Incoming>| {
        let hits = hits.clone();
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            let (parts, body) = req.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            let all = |n: &str| {
                parts
                    .headers
                    .get_all(n)
                    .iter()
                    .map(|v| v.to_str().unwrap_or("?").to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            http::Response::new(Full::new(Bytes::from(format!(
                "{} {}\nuser={}\nemail={}\nnot-listed={}\nbody={}\n",
                parts.method,
                parts.uri.path(),
                all("x-auth-request-user"),
                all("x-auth-request-email"),
                all("x-not-listed"),
                String::from_utf8_lossy(&body),
            ))))
        }
    })
    .await
}

fn ext(url: String, f: impl FnOnce(&mut ExternalAuth)) -> Filter {
    let mut a = ExternalAuth::new(url);
    a.response_headers = vec!["X-Auth-Request-User".into(), "X-Auth-Request-Email".into()];
    a.timeout = sweety_config::Duration::from_millis(700);
    f(&mut a);
    Filter::ExternalAuth(a)
}

fn guarded(name: &str, prefix: &str, filter: Filter) -> Route {
    let mut r = proxy_route(name, prefix, "app");
    r.filters = vec![filter];
    r
}

fn cookie(v: &str) -> String {
    format!("session={v}")
}

#[tokio::test]
async fn external_auth_decisions_over_h1_and_h2() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let auth = AuthService::new();
        let auth_addr = auth_service(auth.clone()).await;
        let hits = Arc::new(AtomicUsize::new(0));
        let app = echo_backend(hits.clone()).await;
        // A port nothing listens on.
        let (_refusing, dead) = common::refused_addr();
        let url = format!("http://{auth_addr}/oauth2/auth?from=sweety");
        let routes = vec![
            guarded("app", "/app", ext(url.clone(), |_| {})),
            guarded(
                "signin",
                "/signin",
                ext(url.clone(), |a| {
                    a.signin = Some("https://login.example/start".into());
                    a.always_set_cookie = true;
                }),
            ),
            guarded(
                "signin-var",
                "/var",
                ext(url.clone(), |a| {
                    a.signin = Some("https://$host/oauth2/start?rd=$escaped_request_uri".into());
                    a.method = Some("GET".into());
                }),
            ),
            guarded("dead", "/dead", ext(format!("http://{dead}/auth"), |_| {})),
            guarded(
                "restricted",
                "/restricted",
                ext(url.clone(), |a| a.restrict_addresses = true),
            ),
        ];
        let mut cfg = http_config(vec![vhost("v", &[], routes)]);
        cfg.backends = vec![backend("app", app)];
        cfg.validate_structure().expect("the test config is valid");
        let h = Harness::start(cfg).await;
        let web = h.addr("web").await;
        let base = format!("http://{web}");
        for (proto, c) in [("h1", h1_client()), ("h2c", h2c_client())] {
            let seen_before = auth.seen.lock().unwrap().len();
            let hits_before = hits.load(Ordering::SeqCst);

            // Allowed: the listed headers are copied (a client's forged copy is gone), others
            // are not; the answer's Set-Cookie reaches the client; the body reaches the backend
            // but not the auth service, which got the original method without a body.
            let ok = cookie("ok");
            let a = send(
                &c,
                "POST",
                &format!("{base}/app/x/../y?q=1"),
                &[
                    ("cookie", &ok),
                    ("x-auth-request-user", "mallory"),
                    ("x-auth-request-email", "mallory@evil"),
                ],
                "secret-body",
            )
            .await;
            assert_eq!(a.status, 200, "{proto}: {}", a.body);
            assert_eq!(
                a.body,
                "POST /app/y\nuser=alice\nemail=alice@example.com\nnot-listed=\nbody=secret-body\n",
                "{proto}"
            );
            assert_eq!(a.headers["set-cookie"], "refreshed=1; Path=/", "{proto}");
            let s = auth.seen.lock().unwrap().last().cloned().unwrap();
            assert_eq!(s.method, "POST", "{proto}: the original method");
            assert_eq!(s.uri, "/oauth2/auth?from=sweety", "{proto}");
            assert_eq!(s.body_len, 0, "{proto}: no body to the auth service");
            assert!(
                s.headers.get("content-length").is_none_or(|v| v == "0"),
                "{proto}"
            );
            assert!(s.headers.get("transfer-encoding").is_none(), "{proto}");
            assert_eq!(s.headers["host"], auth_addr.to_string(), "{proto}");
            // The normalised path the router matched, not the raw one.
            assert_eq!(
                s.headers["x-original-url"],
                format!("http://{web}/app/y?q=1"),
                "{proto}"
            );
            assert_eq!(s.headers["x-original-method"], "POST", "{proto}");
            assert_eq!(
                s.headers["x-auth-request-redirect"], "/app/y?q=1",
                "{proto}"
            );
            assert_eq!(s.headers["x-forwarded-for"], "127.0.0.1", "{proto}");
            assert_eq!(s.headers["x-forwarded-proto"], "http", "{proto}");
            assert_eq!(
                s.headers["cookie"], ok,
                "{proto}: the client's headers go along"
            );
            assert!(
                s.headers.get("x-auth-request-user").is_none(),
                "{proto}: a forged copy is not shown to the auth service either"
            );

            // Allowed without the header: the client's forged copy is still removed.
            let a = send(
                &c,
                "GET",
                &format!("{base}/app/n"),
                &[
                    ("cookie", &cookie("ok-nouser")),
                    ("x-auth-request-user", "mallory"),
                ],
                "",
            )
            .await;
            assert_eq!(
                (a.status, a.body.lines().nth(1)),
                (200, Some("user=")),
                "{proto}"
            );
            assert!(a.headers.get("set-cookie").is_none(), "{proto}");

            // A large answer body is read up to the cap, discarded, and the request passes.
            let a = send(
                &c,
                "GET",
                &format!("{base}/app/b"),
                &[("cookie", &cookie("bigbody"))],
                "",
            )
            .await;
            assert_eq!(
                (a.status, a.body.lines().nth(1)),
                (200, Some("user=bob")),
                "{proto}"
            );

            let hits_allowed = hits.load(Ordering::SeqCst);
            assert_eq!(hits_allowed - hits_before, 3, "{proto}");

            // 401 without signin: 401 with the service's challenge; its Set-Cookie is not
            // passed (401 is not one of add_header's statuses).
            let a = send(&c, "GET", &format!("{base}/app/z"), &[], "").await;
            assert_eq!(a.status, 401, "{proto}");
            assert_eq!(
                a.headers["www-authenticate"], "Bearer realm=\"test\"",
                "{proto}"
            );
            assert!(a.headers.get("set-cookie").is_none(), "{proto}");

            // 401 with signin: 302 to it with the original URL escaped in `rd`; with
            // always_set_cookie the answer's cookie goes along.
            let a = send(&c, "GET", &format!("{base}/signin/p?a=1&b=2"), &[], "").await;
            assert_eq!(a.status, 302, "{proto}");
            assert_eq!(
                a.headers["location"],
                format!("https://login.example/start?rd=http://{web}%2Fsignin%2Fp%3Fa%3D1%26b%3D2"),
                "{proto}"
            );
            assert_eq!(a.headers["set-cookie"], "cleared=1", "{proto}");
            // Variables of the signin URL: the router's host, the escaped URI; its own `rd`
            // is kept. With auth-method set, X-Original-URI and X-Scheme are sent too.
            let a = send(&c, "POST", &format!("{base}/var/q%20r"), &[], "body").await;
            assert_eq!(a.status, 302, "{proto}");
            assert_eq!(
                a.headers["location"], "https://127.0.0.1/oauth2/start?rd=%2Fvar%2Fq%2520r",
                "{proto}"
            );
            let s = auth.seen.lock().unwrap().last().cloned().unwrap();
            assert_eq!((s.method.as_str(), s.body_len), ("GET", 0), "{proto}");
            assert_eq!(s.headers["x-original-uri"], "/var/q%20r", "{proto}");
            assert_eq!(s.headers["x-scheme"], "http", "{proto}");

            // 403, then everything else fails closed with 500.
            let a = send(
                &c,
                "GET",
                &format!("{base}/app/f"),
                &[("cookie", &cookie("forbidden"))],
                "",
            )
            .await;
            assert_eq!(a.status, 403, "{proto}");
            assert!(a.headers.get("set-cookie").is_none(), "{proto}");
            for session in ["teapot", "redirect", "bighead", "slow"] {
                let a = send(
                    &c,
                    "GET",
                    &format!("{base}/app/e"),
                    &[("cookie", &cookie(session))],
                    "",
                )
                .await;
                assert_eq!(a.status, 500, "{proto} {session}: {}", a.body);
            }
            // Unreachable service.
            let a = send(&c, "GET", &format!("{base}/dead/x"), &[("cookie", &ok)], "").await;
            assert_eq!(a.status, 500, "{proto}: {}", a.body);

            // A tenant's URL (restrict_addresses) may not aim at loopback: 500, and the auth
            // service never hears of it.
            let before = auth.seen.lock().unwrap().len();
            let a = send(
                &c,
                "GET",
                &format!("{base}/restricted/x"),
                &[("cookie", &ok)],
                "",
            )
            .await;
            assert_eq!(a.status, 500, "{proto}");
            assert_eq!(auth.seen.lock().unwrap().len(), before, "{proto}");

            // No refused request reached the backend.
            assert_eq!(hits.load(Ordering::SeqCst), hits_allowed, "{proto}");
            assert!(auth.seen.lock().unwrap().len() > seen_before);
        }
    })
    .await
    .expect("test finished in time");
}

#[tokio::test]
async fn subrequests_in_flight_are_bounded() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let auth = AuthService::new();
        let auth_addr = auth_service(auth.clone()).await;
        let hits = Arc::new(AtomicUsize::new(0));
        let app = echo_backend(hits.clone()).await;
        let filter = ext(format!("http://{auth_addr}/auth"), |a| {
            a.max_in_flight = 1;
            a.timeout = sweety_config::Duration::from_secs(20);
        });
        let mut cfg = http_config(vec![vhost("v", &[], vec![guarded("app", "/", filter)])]);
        cfg.backends = vec![backend("app", app)];
        let h = Harness::start(cfg).await;
        let base = format!("http://{}", h.addr("web").await);
        for (proto, c) in [("h1", h1_client()), ("h2c", h2c_client())] {
            let held = {
                let c = c.clone();
                let url = format!("{base}/held");
                tokio::spawn(async move {
                    send(&c, "GET", &url, &[("cookie", "session=hold")], "").await
                })
            };
            auth.entered.notified().await;
            // The one slot is taken: answered 503 at once, without asking the service.
            let before = auth.seen.lock().unwrap().len();
            let a = send(
                &c,
                "GET",
                &format!("{base}/second"),
                &[("cookie", "session=ok")],
                "",
            )
            .await;
            assert_eq!(a.status, 503, "{proto}: {}", a.body);
            assert!(a.headers.contains_key("retry-after"), "{proto}");
            assert_eq!(auth.seen.lock().unwrap().len(), before, "{proto}");
            auth.hold.add_permits(1);
            let a = held.await.unwrap();
            assert_eq!(
                (a.status, a.body.lines().nth(1)),
                (200, Some("user=held")),
                "{proto}"
            );
            // The slot is free again.
            let a = send(
                &c,
                "GET",
                &format!("{base}/third"),
                &[("cookie", "session=ok")],
                "",
            )
            .await;
            assert_eq!(a.status, 200, "{proto}");
        }
    })
    .await
    .expect("test finished in time");
}

/// An auth service that closes a keep-alive connection when a second request arrives on it,
/// without answering: what a pooled connection looks like when the service's idle timeout
/// fires as the subrequest is written. The subrequest has no body and is sent again on a
/// new connection, as the proxy does for a replayable request (`proxy::backend`), so the
/// client is not answered 500 for the auth service's housekeeping.
#[tokio::test]
async fn a_pooled_connection_the_auth_service_closed_is_not_a_refusal() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::time::timeout(Duration::from_secs(60), async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let auth_addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // Answer the first request head, then close on the second.
                    for answered in [false, true] {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.clear();
                        if answered {
                            return;
                        }
                        let _ = s
                            .write_all(
                                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nx-auth-request-user: alice\r\n\r\n",
                            )
                            .await;
                    }
                });
            }
        });
        let hits = Arc::new(AtomicUsize::new(0));
        let app = echo_backend(hits.clone()).await;
        let filter = ext(format!("http://{auth_addr}/auth"), |a| {
            a.timeout = sweety_config::Duration::from_secs(10);
        });
        let mut cfg = http_config(vec![vhost("v", &[], vec![guarded("app", "/", filter)])]);
        cfg.backends = vec![backend("app", app)];
        let h = Harness::start(cfg).await;
        let base = format!("http://{}", h.addr("web").await);
        let c = h1_client();
        for (i, method) in ["GET", "POST", "GET"].into_iter().enumerate() {
            let a = send(&c, method, &format!("{base}/r{i}"), &[], "").await;
            assert_eq!(
                (a.status, a.body.lines().nth(1)),
                (200, Some("user=alice")),
                "request {i} ({method}): {}",
                a.body
            );
            // Let the answered connection go back to the pool before the next request.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Each later request found the pooled connection closed under it and opened a new one.
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        assert_eq!(hits.load(Ordering::SeqCst), 3);
    })
    .await
    .expect("test finished in time");
}
