//! Response compression end to end with a real client: curl (`--compressed`, built with
//! brotli and zstd) over HTTP/1.1 and h2c against proxied, static and fixed responses.

mod common;

use bytes::Bytes;
use common::*;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use sweety_config::*;

/// The streamed text body the backend sends (compressible, 3 chunks).
fn text_body() -> String {
    (0..2000)
        .map(|i| format!("line {i} of the body\n"))
        .collect()
}

/// A backend: `/text` streams `text_body()` as text/plain in chunks without a length,
/// `/png` sends 4 KB of image/png, `/small` 10 bytes of text, `/coded` an already
/// gzip-labelled body.
async fn origin() -> SocketAddr {
    spawn_backend(move |s| async move {
        let svc =
            hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                let path = req.uri().path().to_string();
                let resp = match path.as_str() {
                    "/text" => {
                        let t = text_body();
                        let (a, rest) = t.split_at(1000);
                        let (b, c) = rest.split_at(20_000);
                        let frames: Vec<Result<Frame<Bytes>, Infallible>> = [a, b, c]
                            .iter()
                            .map(|p| Ok(Frame::data(Bytes::from(p.to_string()))))
                            .collect();
                        http::Response::builder()
                            .header("content-type", "text/plain; charset=utf-8")
                            .header("etag", "\"v1\"")
                            .body(
                                StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync(),
                            )
                            .unwrap()
                    }
                    "/png" => http::Response::builder()
                        .header("content-type", "image/png")
                        .body(
                            http_body_util::Full::new(Bytes::from(vec![7u8; 4096])).boxed_unsync(),
                        )
                        .unwrap(),
                    "/small" => http::Response::builder()
                        .header("content-type", "text/plain")
                        .body(
                            http_body_util::Full::new(Bytes::from_static(b"0123456789"))
                                .boxed_unsync(),
                        )
                        .unwrap(),
                    _ => http::Response::builder()
                        .header("content-type", "text/plain")
                        .header("content-encoding", "gzip")
                        .body(
                            http_body_util::Full::new(Bytes::from_static(b"not really gzip"))
                                .boxed_unsync(),
                        )
                        .unwrap(),
                };
                Ok::<_, Infallible>(resp)
            });
        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(s), svc)
            .await;
    })
    .await
}

struct Curl {
    headers: String,
    body: Vec<u8>,
}

/// Runs curl (bounded to 20 s) and returns the response headers and the decoded body.
async fn curl(args: &[&str]) -> Curl {
    let dir = tempfile::tempdir().unwrap();
    let hdr = dir.path().join("h");
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new("curl")
            .args(["-sS", "--max-time", "10", "-D"])
            .arg(&hdr)
            .args(args)
            .output(),
    )
    .await
    .expect("curl finished in time")
    .expect("curl runs");
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Curl {
        headers: std::fs::read_to_string(&hdr).unwrap().to_ascii_lowercase(),
        body: out.stdout,
    }
}

fn header<'a>(c: &'a Curl, name: &str) -> Option<&'a str> {
    c.headers.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == name).then(|| v.trim())
    })
}

fn compress_route(mut r: Route, c: Compression) -> Route {
    r.filters.push(Filter::Compress(c));
    r
}

async fn start(root: &std::path::Path) -> SocketAddr {
    let up = origin().await;
    let static_route = Route {
        action: Action::Static(StaticSite {
            root: root.to_path_buf(),
            index: vec!["index.html".into()],
            try_files: vec![],
            precompressed: true,
            cache_control: None,
            strip_prefix: Some("/static".into()),
            hide_dotfiles: true,
        }),
        ..proxy_route("static", "/static", "up")
    };
    let mut fixed = fixed_route("fixed", "/fixed", &"fixed body ".repeat(100));
    fixed.filters.push(Filter::Compress(Compression::default()));
    let cfg = Config {
        backends: vec![backend("up", up)],
        ..http_config(vec![vhost(
            "v",
            &[],
            vec![
                compress_route(static_route, Compression::default()),
                compress_route(
                    proxy_route("gzip-only", "/only-gzip", "up"),
                    Compression {
                        algorithms: vec![CompressionAlgorithm::Gzip],
                        ..Compression::default()
                    },
                ),
                fixed,
                compress_route(proxy_route("p", "/", "up"), Compression::default()),
            ],
        )])
    };
    // `/only-gzip` goes to the backend's fallback path: rewrite it to /text.
    let mut cfg = cfg;
    cfg.virtual_hosts[0].routes[1].filters.insert(
        0,
        Filter::Rewrite(UrlRewrite {
            host: None,
            path: Some(PathRewrite::Full("/text".into())),
        }),
    );
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;
    std::mem::forget(h);
    addr
}

#[tokio::test]
async fn curl_negotiates_every_coding_over_h1_and_h2c() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path()).await;
    let url = format!("http://{addr}/text");
    let want = text_body().into_bytes();
    for (accept, coding) in [
        ("gzip", "gzip"),
        ("br", "br"),
        ("zstd", "zstd"),
        ("gzip;q=0.5, br;q=0.9, zstd;q=0.1", "br"),
        ("gzip, br, zstd", "zstd"),
    ] {
        for proto in ["--http1.1", "--http2-prior-knowledge"] {
            let c = curl(&[
                proto,
                "--compressed",
                "-H",
                &format!("accept-encoding: {accept}"),
                &url,
            ])
            .await;
            assert_eq!(
                header(&c, "content-encoding"),
                Some(coding),
                "{accept} {proto}: {}",
                c.headers
            );
            assert_eq!(header(&c, "vary"), Some("accept-encoding"));
            assert_eq!(header(&c, "etag"), Some("w/\"v1\""));
            assert!(header(&c, "content-length").is_none());
            assert_eq!(c.body, want, "{accept} {proto}: decoded body differs");
        }
    }
    // The route's own algorithm list limits the choice.
    let c = curl(&[
        "--compressed",
        "-H",
        "accept-encoding: br, gzip;q=0.1",
        &format!("http://{addr}/only-gzip"),
    ])
    .await;
    assert_eq!(header(&c, "content-encoding"), Some("gzip"));
    assert_eq!(c.body, want);
}

#[tokio::test]
async fn skipped_when_not_eligible() {
    let root = tempfile::tempdir().unwrap();
    let addr = start(root.path()).await;
    let ae = "accept-encoding: gzip, br, zstd";
    // No Accept-Encoding: identity, still Vary.
    let c = curl(&[&format!("http://{addr}/text")]).await;
    assert!(header(&c, "content-encoding").is_none());
    assert_eq!(header(&c, "vary"), Some("accept-encoding"));
    assert_eq!(c.body, text_body().into_bytes());
    // Not on the MIME allowlist.
    let c = curl(&["-H", ae, &format!("http://{addr}/png")]).await;
    assert!(header(&c, "content-encoding").is_none());
    assert_eq!(c.body.len(), 4096);
    // Below the minimum size.
    let c = curl(&["-H", ae, &format!("http://{addr}/small")]).await;
    assert!(header(&c, "content-encoding").is_none());
    assert_eq!(c.body, b"0123456789");
    // Already coded by the backend: passed through untouched.
    let c = curl(&["-H", ae, &format!("http://{addr}/coded")]).await;
    assert_eq!(header(&c, "content-encoding"), Some("gzip"));
    assert_eq!(c.body, b"not really gzip");
    // Fixed responses are compressed too.
    let c = curl(&[
        "--compressed",
        "-H",
        "accept-encoding: gzip",
        &format!("http://{addr}/fixed"),
    ])
    .await;
    assert_eq!(header(&c, "content-encoding"), Some("gzip"));
    assert_eq!(c.body, "fixed body ".repeat(100).into_bytes());
}

#[tokio::test]
async fn static_files_range_and_precompressed_are_not_double_compressed() {
    let root = tempfile::tempdir().unwrap();
    let text = "static text ".repeat(500);
    std::fs::write(root.path().join("a.txt"), &text).unwrap();
    std::fs::write(root.path().join("b.css"), "body{}".repeat(200)).unwrap();
    // A precompressed sibling with distinct content proves which file was served.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, b"from the .gz sibling").unwrap();
    std::fs::write(root.path().join("b.css.gz"), enc.finish().unwrap()).unwrap();
    let addr = start(root.path()).await;

    let c = curl(&[
        "--compressed",
        "-H",
        "accept-encoding: br",
        &format!("http://{addr}/static/a.txt"),
    ])
    .await;
    assert_eq!(header(&c, "content-encoding"), Some("br"));
    assert!(header(&c, "accept-ranges").is_none());
    assert_eq!(c.body, text.as_bytes());

    // Range: 206 with the raw bytes, never compressed.
    let c = curl(&[
        "-H",
        "accept-encoding: gzip, br",
        "-r",
        "0-5",
        &format!("http://{addr}/static/a.txt"),
    ])
    .await;
    assert!(c.headers.starts_with("http/1.1 206"), "{}", c.headers);
    assert!(header(&c, "content-encoding").is_none());
    assert_eq!(c.body, b"static");

    // The precompressed .gz is served as is (its own content), not compressed again.
    let c = curl(&[
        "--compressed",
        "-H",
        "accept-encoding: gzip",
        &format!("http://{addr}/static/b.css"),
    ])
    .await;
    assert_eq!(header(&c, "content-encoding"), Some("gzip"));
    assert_eq!(c.body, b"from the .gz sibling");
}
