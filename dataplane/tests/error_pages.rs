//! Integration tests of error pages (`error_pages` filter, ingress-nginx's
//! `custom-http-errors` and `default-backend`) with a real application backend and a real
//! error backend on 127.0.0.1, over HTTP/1.1 and HTTP/2 (h2c): a listed status is replaced by
//! the error backend's page with the original status (the headers it received checked one by
//! one), an unlisted one passes, the built-in page without an error backend, a route without
//! endpoints served by the error backend, an error backend that is down or too slow lets the
//! original answer pass, and an error page that is itself an error is never intercepted again.

mod common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sweety_config::*;

/// What the error backend received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    uri: String,
    headers: http::HeaderMap,
    body: String,
}

/// The application: `/<code>…` answers that status with a body and a header that must not
/// reach the client when the status is intercepted; anything else answers 200.
async fn app_backend() -> std::net::SocketAddr {
    spawn_http_backend(|req: http::Request<hyper::body::Incoming>| async move {
        let path = req.uri().path().to_string();
        let status = path
            .get(1..4)
            .and_then(|c| c.parse::<u16>().ok())
            .unwrap_or(200);
        http::Response::builder()
            .status(status)
            .header("content-type", "text/x-stack-trace")
            .header("x-app-secret", "leak")
            .body(Full::new(Bytes::from(format!("app {status} at {path}"))))
            .unwrap()
    })
    .await
}

/// The error backend: records each request and answers `status` (200 unless told) with a
/// page naming the `X-Code` it was asked for, plus headers that must not reach the client.
async fn error_backend(
    seen: Arc<Mutex<Vec<Seen>>>,
    status: u16,
    delay: Duration,
) -> std::net::SocketAddr {
    spawn_http_backend(move |req: http::Request<hyper::body::Incoming>| {
        let seen = seen.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            seen.lock().unwrap().push(Seen {
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
                headers: parts.headers.clone(),
                body: String::from_utf8_lossy(&body).into_owned(),
            });
            tokio::time::sleep(delay).await;
            let code = parts
                .headers
                .get("x-code")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none")
                .to_string();
            http::Response::builder()
                .status(status)
                .header("content-type", "text/html; charset=utf-8")
                .header("content-language", "en")
                .header("set-cookie", "page=1")
                .header("x-page-internal", "1")
                .body(Full::new(Bytes::from(format!("<h1>page {code}</h1>"))))
                .unwrap()
        }
    })
    .await
}

/// [`common::send`] with a body for POST.
async fn send(c: &Client, method: &str, url: &str, headers: &[(&str, &str)]) -> Answer {
    let body = if method == "POST" { "payload" } else { "" };
    common::send(c, method, url, headers, body).await
}

fn fixed(name: &str, value: &str) -> HeaderValue {
    HeaderValue {
        name: name.into(),
        value: value.into(),
    }
}

/// A route of `prefix` to `backend` whose prefix is cut before the backend sees the path, with
/// an `error_pages` filter.
fn paged(prefix: &str, backend: &str, pages: ErrorPages) -> Route {
    let mut r = proxy_route(prefix.trim_matches('/'), prefix, backend);
    r.filters = vec![
        Filter::Rewrite(UrlRewrite {
            host: None,
            path: Some(PathRewrite::Prefix("/".into())),
        }),
        Filter::ErrorPages(pages),
    ];
    r
}

fn pages(codes: &[u16], backend: Option<&str>) -> ErrorPages {
    ErrorPages {
        codes: codes.to_vec(),
        backend: backend.map(Into::into),
        headers: vec![
            fixed("X-Namespace", "team-a"),
            fixed("X-Ingress-Name", "shop"),
            fixed("X-Service-Name", "app"),
            fixed("X-Service-Port", "80"),
        ],
        ..Default::default()
    }
}

#[tokio::test]
async fn error_pages_over_h1_and_h2() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let app = app_backend().await;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let errors = error_backend(seen.clone(), 200, Duration::ZERO).await;
        // An error backend whose pages are themselves errors (a listed status).
        let looped = Arc::new(Mutex::new(Vec::new()));
        let errors_503 = error_backend(looped.clone(), 503, Duration::ZERO).await;
        let slow_seen = Arc::new(Mutex::new(Vec::new()));
        let slow = error_backend(slow_seen.clone(), 200, Duration::from_secs(3)).await;
        // A port nothing listens on.
        let (_refusing, dead) = common::refused_addr();
        let routes = vec![
            paged("/a", "app", pages(&[404, 503], Some("errors"))),
            paged("/builtin", "app", pages(&[404], None)),
            paged("/dead", "app", pages(&[404], Some("dead"))),
            paged(
                "/slow",
                "app",
                ErrorPages {
                    timeout: sweety_config::Duration::from_millis(300),
                    ..pages(&[404], Some("slow"))
                },
            ),
            paged("/loop", "app", pages(&[503], Some("errors-503"))),
            paged(
                "/empty",
                "empty",
                ErrorPages {
                    unavailable: true,
                    ..pages(&[], Some("errors"))
                },
            ),
            paged("/empty-listed", "empty", pages(&[502], Some("errors"))),
            paged(
                "/empty-down",
                "empty",
                ErrorPages {
                    unavailable: true,
                    ..pages(&[], Some("dead"))
                },
            ),
            paged(
                "/empty-none",
                "empty",
                ErrorPages {
                    unavailable: true,
                    ..pages(&[], Some("empty"))
                },
            ),
        ];
        let mut cfg = http_config(vec![vhost("v", &[], routes)]);
        cfg.backends = vec![
            backend("app", app),
            backend("errors", errors),
            backend("errors-503", errors_503),
            backend("slow", slow),
            backend("dead", dead),
            Backend::new("empty", Vec::new()),
        ];
        cfg.validate_structure().expect("the test config is valid");
        let h = Harness::start(cfg).await;
        let web = h.addr("web").await;
        let base = format!("http://{web}");
        for (proto, c) in [("h1", h1_client()), ("h2c", h2c_client())] {
            seen.lock().unwrap().clear();

            // A listed status: the page with the original status, the app's body and headers
            // gone, the page's content headers kept and its other headers not.
            let a = send(
                &c,
                "POST",
                &format!("{base}/a/404/x?q=1"),
                &[
                    ("accept", "application/json"),
                    ("cookie", "session=s1"),
                    ("x-request-id", "client-chosen"),
                    // Forged page-backend headers: each is replaced, never passed on.
                    ("x-code", "200"),
                    ("x-original-uri", "/forged"),
                    ("x-namespace", "other-tenant"),
                    ("x-service-name", "forged"),
                ],
            )
            .await;
            assert_eq!(a.status, 404, "{proto}: the original status");
            assert_eq!(a.body, "<h1>page 404</h1>", "{proto}");
            assert_eq!(
                a.headers["content-type"], "text/html; charset=utf-8",
                "{proto}"
            );
            assert_eq!(a.headers["content-language"], "en", "{proto}");
            for h in ["x-app-secret", "set-cookie", "x-page-internal"] {
                assert!(a.headers.get(h).is_none(), "{proto}: {h} must not pass");
            }
            let request_id = a.headers["x-request-id"].to_str().unwrap().to_string();
            assert_ne!(
                request_id, "client-chosen",
                "{proto}: an untrusted id is replaced"
            );
            let s = {
                let all = seen.lock().unwrap();
                assert_eq!(all.len(), 1, "{proto}: one page request");
                all[0].clone()
            };
            assert_eq!(s.method, "POST", "{proto}: the original method");
            assert_eq!(s.uri, "/", "{proto}: the page is asked for /");
            assert_eq!(s.body, "", "{proto}: without the request body");
            let hv = |n: &str| {
                s.headers
                    .get(n)
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_else(|| panic!("{proto}: {n} not sent"))
            };
            assert_eq!(hv("x-code"), "404", "{proto}");
            assert_eq!(hv("x-format"), "application/json", "{proto}");
            assert_eq!(
                hv("x-original-uri"),
                "/a/404/x?q=1",
                "{proto}: the URI before the route's rewrite"
            );
            assert_eq!(hv("x-namespace"), "team-a", "{proto}");
            assert_eq!(hv("x-ingress-name"), "shop", "{proto}");
            assert_eq!(hv("x-service-name"), "app", "{proto}");
            assert_eq!(hv("x-service-port"), "80", "{proto}");
            assert_eq!(
                hv("x-request-id"),
                request_id,
                "{proto}: the request's own id"
            );
            assert_eq!(hv("host"), web.to_string(), "{proto}: the client's host");
            assert_eq!(
                hv("cookie"),
                "session=s1",
                "{proto}: the client's headers go along"
            );
            assert_eq!(hv("x-forwarded-for"), "127.0.0.1", "{proto}");
            assert!(s.headers.get("content-length").is_none_or(|v| v == "0"));

            // Another listed status; an unlisted error and a success pass untouched.
            let a = send(&c, "GET", &format!("{base}/a/503"), &[]).await;
            assert_eq!(
                (a.status, a.body.as_str()),
                (503, "<h1>page 503</h1>"),
                "{proto}"
            );
            assert!(
                seen.lock().unwrap()[1].headers.get("x-format").is_none(),
                "{proto}: no Accept, no X-Format"
            );
            for (path, status) in [("/a/418", 418), ("/a/500", 500), ("/a/ok", 200)] {
                let a = send(&c, "GET", &format!("{base}{path}"), &[]).await;
                assert_eq!(a.status, status, "{proto} {path}");
                assert_eq!(a.body, format!("app {status} at {}", &path[2..]), "{proto}");
                assert_eq!(a.headers["x-app-secret"], "leak", "{proto} {path}");
            }
            assert_eq!(
                seen.lock().unwrap().len(),
                2,
                "{proto}: asked for listed codes only"
            );

            // HEAD: the page backend is asked with HEAD too.
            let a = send(&c, "HEAD", &format!("{base}/a/404"), &[]).await;
            assert_eq!((a.status, a.body.as_str()), (404, ""), "{proto}");
            assert_eq!(seen.lock().unwrap()[2].method, "HEAD", "{proto}");

            // No error backend: Sweety's own page replaces the app's body.
            let a = send(&c, "GET", &format!("{base}/builtin/404"), &[]).await;
            assert_eq!(
                (a.status, a.body.as_str()),
                (404, "404 Not Found\n"),
                "{proto}"
            );
            assert!(a.headers.get("x-app-secret").is_none(), "{proto}");

            // The error backend is down, or too slow: the original answer passes whole.
            for path in ["/dead/404", "/slow/404"] {
                let started = std::time::Instant::now();
                let a = send(&c, "GET", &format!("{base}{path}"), &[]).await;
                assert_eq!(a.status, 404, "{proto} {path}");
                assert_eq!(a.body, "app 404 at /404", "{proto} {path}");
                assert_eq!(a.headers["x-app-secret"], "leak", "{proto} {path}");
                assert!(
                    started.elapsed() < Duration::from_secs(2),
                    "{proto} {path}: the page request is bounded by its timeout"
                );
            }

            // The page is itself a listed status: it is served (original status), and the
            // error backend is asked once, never for its own page.
            looped.lock().unwrap().clear();
            let a = send(&c, "GET", &format!("{base}/loop/503"), &[]).await;
            assert_eq!(
                (a.status, a.body.as_str()),
                (503, "<h1>page 503</h1>"),
                "{proto}"
            );
            assert_eq!(
                looped.lock().unwrap().len(),
                1,
                "{proto}: no intercept loop"
            );

            // No endpoint: the error backend serves the request itself (path and body as
            // the route made them, X-Code 503) and its answer passes as it is.
            seen.lock().unwrap().clear();
            let a = send(
                &c,
                "POST",
                &format!("{base}/empty/some/where?z=2"),
                &[("accept", "text/html")],
            )
            .await;
            assert_eq!(
                (a.status, a.body.as_str()),
                (200, "<h1>page 503</h1>"),
                "{proto}"
            );
            assert_eq!(
                a.headers["set-cookie"], "page=1",
                "{proto}: passed as it is"
            );
            let s = seen.lock().unwrap()[0].clone();
            assert_eq!(
                (s.method.as_str(), s.uri.as_str()),
                ("POST", "/some/where?z=2")
            );
            assert_eq!(s.body, "payload", "{proto}: the whole request");
            assert_eq!(s.headers["x-code"], "503", "{proto}");
            assert_eq!(s.headers["x-format"], "text/html", "{proto}");
            assert_eq!(s.headers["x-service-name"], "app", "{proto}");
            assert!(s.headers.get("x-original-uri").is_none(), "{proto}");

            // Without `unavailable`, the proxy's own answer (502, no endpoint) is a listed
            // status like any other.
            let a = send(&c, "GET", &format!("{base}/empty-listed/p"), &[]).await;
            assert_eq!(
                (a.status, a.body.as_str()),
                (502, "<h1>page 502</h1>"),
                "{proto}"
            );
            assert_eq!(
                seen.lock().unwrap()[1].headers["x-original-uri"],
                "/empty-listed/p"
            );

            // No endpoint, and the error backend refuses connections: its failure is the
            // answer; with no endpoint of its own it does not take over (the proxy's answer).
            let a = send(&c, "GET", &format!("{base}/empty-down/p"), &[]).await;
            assert_eq!(
                (a.status, a.body.as_str()),
                (502, "502 Bad Gateway: upstream connect error\n"),
                "{proto}"
            );
            let a = send(&c, "GET", &format!("{base}/empty-none/p"), &[]).await;
            assert_eq!(
                (a.status, a.body.as_str()),
                (502, "502 Bad Gateway: no healthy upstream endpoint\n"),
                "{proto}"
            );
        }
        assert!(
            slow_seen.lock().unwrap().len() >= 2,
            "the slow backend was asked"
        );
    })
    .await
    .expect("test finished in time");
}
