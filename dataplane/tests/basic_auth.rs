//! Integration tests of basic authentication (`basic_auth` filter) with real sockets on
//! 127.0.0.1, over HTTP/1.1 and HTTP/2 (h2c, Sweety's own engine): each htpasswd format
//! (bcrypt, `$apr1$`, `{SHA}`), the right password, a wrong one, no header, malformed headers
//! and another route's user; a refused request never reaches the backend (or a mirror), and
//! the backend receives the `Authorization` header of an accepted one. HTTP/3 is covered in
//! tests/h3.rs (`basic_auth_over_h3`).

mod common;

use base64::Engine as _;
use bytes::Bytes;
use common::*;
use http_body_util::Full;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use sweety_config::*;

const APR1: &str = "$apr1$sL5yBeMm$Ru3.Rv6KbPb.NJWjCDVKo1"; // "secret"
const SHA: &str = "{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ="; // "secret"

fn auth(realm: &str, users: &[(&str, &str)]) -> Filter {
    Filter::BasicAuth(BasicAuth {
        realm: realm.into(),
        users: users
            .iter()
            .map(|(n, h)| BasicAuthUser {
                name: n.to_string(),
                hash: h.to_string(),
            })
            .collect(),
        user_set: None,
    })
}

fn basic(user_pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(user_pass)
    )
}

/// GET with headers: (status, WWW-Authenticate, body).
async fn fetch(
    client: &Client,
    url: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, String) {
    get_headers(client, url, headers, "www-authenticate").await
}

/// A backend answering 200 with the `Authorization` it received, counting requests.
async fn echo_auth_backend(hits: Arc<AtomicUsize>) -> std::net::SocketAddr {
    spawn_backend(move |s| {
        let hits = hits.clone();
        async move {
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    hits.fetch_add(1, Ordering::SeqCst);
                    let auth = req
                        .headers()
                        .get("authorization")
                        .map(|v| v.to_str().unwrap_or("?").to_string())
                        .unwrap_or_default();
                    async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(format!("backend saw {auth}")),
                        )))
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                .await;
        }
    })
    .await
}

#[tokio::test]
async fn basic_auth_formats_and_refusals_over_h1_and_h2() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let hits = Arc::new(AtomicUsize::new(0));
        let mirrored = Arc::new(AtomicUsize::new(0));
        let backend_addr = echo_auth_backend(hits.clone()).await;
        let mirror_addr = echo_auth_backend(mirrored.clone()).await;
        // Cost 4 keeps the test quick; the format is the one `htpasswd -B` writes.
        let bcrypt = bcrypt::hash("s3cret:with colon", 4)
            .unwrap()
            .replace("$2b$", "$2y$");
        let mut protected = proxy_route("bcrypt", "/bcrypt", "app");
        protected.filters = vec![
            auth("ops \"team\"", &[("alice", &bcrypt), ("carol", SHA)]),
            Filter::Mirror(Mirror {
                backend: "mirror".into(),
                percent: 100.0,
            }),
        ];
        let mut apr1 = fixed_route("apr1", "/apr1", "apr1 ok");
        apr1.filters = vec![auth("", &[("bob", APR1)])];
        let mut sha = fixed_route("sha", "/sha", "sha ok");
        sha.filters = vec![auth("sha", &[("carol", SHA)])];
        let mut cfg = http_config(vec![vhost(
            "v",
            &[],
            vec![protected, apr1, sha, fixed_route("open", "/open", "open")],
        )]);
        cfg.backends = vec![backend("app", backend_addr), backend("mirror", mirror_addr)];
        let h = Harness::start(cfg).await;
        let base = format!("http://{}", h.addr("web").await);
        for (proto, c) in [("h1", h1_client()), ("h2c", h2c_client())] {
            let before = hits.load(Ordering::SeqCst);
            // Right passwords, each format.
            let good = basic("alice:s3cret:with colon");
            let (s, _, body) =
                fetch(&c, &format!("{base}/bcrypt"), &[("authorization", &good)]).await;
            assert_eq!(s, 200, "{proto} bcrypt: {body}");
            assert_eq!(
                body,
                format!("backend saw {good}"),
                "{proto}: Authorization passed on"
            );
            let (s, _, body) = fetch(
                &c,
                &format!("{base}/apr1/x"),
                &[("authorization", &basic("bob:secret"))],
            )
            .await;
            assert_eq!((s, body.as_str()), (200, "apr1 ok"), "{proto} apr1");
            let (s, _, body) = fetch(
                &c,
                &format!("{base}/sha"),
                &[("authorization", &basic("carol:secret"))],
            )
            .await;
            assert_eq!((s, body.as_str()), (200, "sha ok"), "{proto} sha");
            let (s, _, _) = fetch(
                &c,
                &format!("{base}/bcrypt"),
                &[("authorization", &basic("carol:secret"))],
            )
            .await;
            assert_eq!(s, 200, "{proto}: a second user of the same route");
            assert_eq!(hits.load(Ordering::SeqCst), before + 2);

            // Refusals: 401 with the escaped realm, and the backend is not reached.
            let wrong = [
                ("wrong bcrypt password", "/bcrypt", basic("alice:s3cret")),
                (
                    "bcrypt password cut at the colon",
                    "/bcrypt",
                    basic("alice:s3cret:with"),
                ),
                ("wrong apr1 password", "/apr1", basic("bob:Secret")),
                ("wrong sha password", "/sha", basic("carol:secret ")),
                ("unknown user", "/sha", basic("mallory:secret")),
                ("another route's user", "/sha", basic("bob:secret")),
                ("empty user", "/sha", basic(":secret")),
                ("no colon", "/sha", basic("carolsecret")),
                ("bad base64", "/sha", "Basic !!!!".to_string()),
                ("other scheme", "/sha", "Bearer abc".to_string()),
                ("no credentials", "/sha", "Basic".to_string()),
                ("huge", "/sha", format!("Basic {}", "QUFB".repeat(2000))),
                (
                    "non-UTF-8 user",
                    "/sha",
                    format!(
                        "Basic {}",
                        base64::engine::general_purpose::STANDARD.encode(b"carol\xff:secret")
                    ),
                ),
                (
                    "two credentials in one header",
                    "/sha",
                    format!("{}, {}", basic("carol:secret"), basic("carol:secret")),
                ),
                ("NUL in the password", "/sha", basic("carol:secret\0")),
            ];
            for (what, path, header) in &wrong {
                let (s, challenge, _) =
                    fetch(&c, &format!("{base}{path}"), &[("authorization", header)]).await;
                assert_eq!(s, 401, "{proto} {what}");
                assert!(
                    challenge.is_some_and(|v| v.starts_with("Basic realm=")),
                    "{proto} {what}"
                );
            }
            let (s, challenge, _) = fetch(&c, &format!("{base}/bcrypt"), &[]).await;
            assert_eq!(s, 401, "{proto}: missing header");
            assert_eq!(challenge.as_deref(), Some(r#"Basic realm="ops \"team\"""#));
            let (s, _, _) = fetch(
                &c,
                &format!("{base}/bcrypt"),
                &[("authorization", &good), ("authorization", &good)],
            )
            .await;
            assert_eq!(s, 401, "{proto}: two Authorization headers");
            let (_, challenge, _) = fetch(&c, &format!("{base}/apr1"), &[]).await;
            assert_eq!(challenge.as_deref(), Some(r#"Basic realm="""#));
            assert_eq!(
                hits.load(Ordering::SeqCst),
                before + 2,
                "{proto}: refused requests reached the backend"
            );
            let (s, _, body) = fetch(&c, &format!("{base}/open"), &[]).await;
            assert_eq!(
                (s, body.as_str()),
                (200, "open"),
                "{proto}: routes without the filter"
            );
        }
        // Only accepted requests were mirrored (2 per protocol).
        tokio::time::timeout(Duration::from_secs(10), async {
            while mirrored.load(Ordering::SeqCst) < 4 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("mirrors arrive");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            mirrored.load(Ordering::SeqCst),
            4,
            "a refused request was mirrored"
        );
        let metrics = h.runtime.shared.metrics.render();
        assert!(metrics.contains("kind=\"auth_refused\""), "{metrics}");
    })
    .await
    .expect("test finished in time");
}

/// Filters naming one of the config's user sets (`user_set`) ask for its users, each with
/// its own realm; a config naming a set it lacks is refused as a whole.
#[tokio::test]
async fn filters_share_a_user_set_by_name() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let by_set = |realm: &str, set: &str| {
            Filter::BasicAuth(BasicAuth {
                realm: realm.into(),
                users: Vec::new(),
                user_set: Some(set.into()),
            })
        };
        let mut one = fixed_route("one", "/one", "one ok");
        one.filters = vec![by_set("One", "staff")];
        let mut two = fixed_route("two", "/two", "two ok");
        two.filters = vec![by_set("Two", "staff")];
        let mut ops = fixed_route("ops", "/ops", "ops ok");
        ops.filters = vec![by_set("Ops", "ops")];
        let mut cfg = http_config(vec![vhost("v", &[], vec![one, two, ops])]);
        let set = |name: &str, users: &[(&str, &str)]| UserSet {
            name: name.into(),
            users: users
                .iter()
                .map(|(n, h)| BasicAuthUser {
                    name: n.to_string(),
                    hash: h.to_string(),
                })
                .collect(),
        };
        cfg.user_sets = vec![
            set("staff", &[("alice", SHA), ("bob", APR1)]),
            set("ops", &[("carol", SHA)]),
        ];
        let h = Harness::start(cfg.clone()).await;
        let base = format!("http://{}", h.addr("web").await);
        let c = h1_client();
        for (path, realm) in [("one", "One"), ("two", "Two")] {
            for user in ["alice:secret", "bob:secret"] {
                let (s, _, body) = fetch(
                    &c,
                    &format!("{base}/{path}"),
                    &[("authorization", &basic(user))],
                )
                .await;
                assert_eq!((s, body), (200, format!("{path} ok")), "{path} {user}");
            }
            for user in ["alice:wrong", "carol:secret"] {
                let (s, challenge, _) = fetch(
                    &c,
                    &format!("{base}/{path}"),
                    &[("authorization", &basic(user))],
                )
                .await;
                assert_eq!(s, 401, "{path} {user}");
                assert_eq!(challenge, Some(format!("Basic realm=\"{realm}\"")));
            }
        }
        let (s, _, _) = fetch(
            &c,
            &format!("{base}/ops"),
            &[("authorization", &basic("alice:secret"))],
        )
        .await;
        assert_eq!(s, 401, "another set's user");
        let (s, _, _) = fetch(
            &c,
            &format!("{base}/ops"),
            &[("authorization", &basic("carol:secret"))],
        )
        .await;
        assert_eq!(s, 200);
        // The set `ops` dropped while a filter names it: refused, the old config serves on.
        let mut dangling = cfg.clone();
        dangling.user_sets.truncate(1);
        let err = h.runtime.apply(dangling).await.unwrap_err().messages();
        assert!(
            err.iter().any(|m| m.contains("unknown user set \"ops\"")),
            "{err:?}"
        );
        let (s, _, _) = fetch(
            &c,
            &format!("{base}/ops"),
            &[("authorization", &basic("carol:secret"))],
        )
        .await;
        assert_eq!(s, 200, "the previous config still serves");
    })
    .await
    .expect("test finished in time");
}

/// A config whose filter carries a hash the dataplane cannot use is refused as a whole.
#[test]
fn invalid_users_fail_validation() {
    let mut r = fixed_route("r", "/", "x");
    r.filters = vec![auth("a\r\nb", &[("eve", "plaintext"), ("", SHA)])];
    let cfg = http_config(vec![vhost("v", &[], vec![r])]);
    let errors = cfg.validate_structure().unwrap_err().to_string();
    for what in ["realm", "users[0]", "users[1]"] {
        assert!(errors.contains(what), "{what}: {errors}");
    }
}
