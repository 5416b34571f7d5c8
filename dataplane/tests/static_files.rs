//! Integration tests for the static-file handler against a real temporary directory:
//! ranges, conditionals, precompressed siblings, traversal refusal, try_files, directory
//! handling, HEAD/405, chunked streaming of a large file and cache invalidation.

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use sweety_config::StaticSite;
use sweety_dataplane::body::Body;
use sweety_dataplane::static_files::{StaticFiles, CHUNK_SIZE};
use tempfile::TempDir;

/// Writes `content` to `root/rel` with an mtime `age` in the past (old enough to be cached).
fn write_aged(root: &Path, rel: &str, content: &[u8], age: Duration) -> PathBuf {
    let p = root.join(rel);
    if let Some(parent) = p.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    fs::write(&p, content).unwrap();
    let f = fs::File::options().write(true).open(&p).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
    p
}

fn write(root: &Path, rel: &str, content: &[u8]) -> PathBuf {
    write_aged(root, rel, content, Duration::from_secs(3600))
}

/// A temp dir holding `site/` (the root) and a `secret` file next to it.
fn setup() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("site");
    fs::create_dir(&root).unwrap();
    fs::write(dir.path().join("secret"), b"top secret").unwrap();
    (dir, root)
}

fn site(root: &Path) -> StaticSite {
    StaticSite {
        root: root.to_path_buf(),
        index: vec!["index.html".into()],
        try_files: vec![],
        precompressed: true,
        cache_control: Some("public, max-age=60".into()),
        strip_prefix: None,
        hide_dotfiles: true,
    }
}

fn req(method: Method, uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
    let mut b = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap().into_parts().0
}

async fn get(sf: &StaticFiles, s: &StaticSite, uri: &str, h: &[(&str, &str)]) -> Response<Body> {
    sf.serve(s, &req(Method::GET, uri, h), None).await
}

async fn body(resp: Response<Body>) -> Bytes {
    resp.into_body().collect().await.unwrap().to_bytes()
}

fn hdr(resp: &Response<Body>, name: header::HeaderName) -> Option<&str> {
    resp.headers().get(name).map(|v| v.to_str().unwrap())
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[tokio::test]
async fn serves_file_with_metadata_headers() {
    let (_d, root) = setup();
    write(&root, "hello.txt", b"hello world");
    let (sf, s) = (StaticFiles::new(1 << 20), site(&root));
    let resp = get(&sf, &s, "/hello.txt", &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        hdr(&resp, header::CONTENT_TYPE),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(hdr(&resp, header::CONTENT_LENGTH), Some("11"));
    assert_eq!(hdr(&resp, header::ACCEPT_RANGES), Some("bytes"));
    assert_eq!(
        hdr(&resp, header::CACHE_CONTROL),
        Some("public, max-age=60")
    );
    assert!(hdr(&resp, header::ETAG).unwrap().starts_with('"'));
    assert!(hdr(&resp, header::LAST_MODIFIED).unwrap().ends_with("GMT"));
    assert!(resp.headers().get(header::VARY).is_none());
    assert_eq!(body(resp).await, "hello world");

    let resp = get(&sf, &s, "/missing.txt", &[]).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(body(resp).await, "not found\n");
}

#[tokio::test]
async fn range_requests() {
    let (_d, root) = setup();
    let data = pattern(1000);
    write(&root, "data.bin", &data);
    let (sf, s) = (StaticFiles::new(1 << 20), site(&root));

    let resp = get(&sf, &s, "/data.bin", &[("range", "bytes=10-19")]).await;
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(hdr(&resp, header::CONTENT_RANGE), Some("bytes 10-19/1000"));
    assert_eq!(hdr(&resp, header::CONTENT_LENGTH), Some("10"));
    let etag = hdr(&resp, header::ETAG).unwrap().to_owned();
    assert_eq!(body(resp).await, &data[10..20]);

    let resp = get(&sf, &s, "/data.bin", &[("range", "bytes=-5")]).await;
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        hdr(&resp, header::CONTENT_RANGE),
        Some("bytes 995-999/1000")
    );
    assert_eq!(body(resp).await, &data[995..]);

    let resp = get(&sf, &s, "/data.bin", &[("range", "bytes=990-")]).await;
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        hdr(&resp, header::CONTENT_RANGE),
        Some("bytes 990-999/1000")
    );
    assert_eq!(body(resp).await, &data[990..]);

    let resp = get(&sf, &s, "/data.bin", &[("range", "bytes=1000-")]).await;
    assert_eq!(resp.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(hdr(&resp, header::CONTENT_RANGE), Some("bytes */1000"));
    assert!(body(resp).await.is_empty());

    // If-Range with a stale ETag or date: the full representation.
    let resp = get(
        &sf,
        &s,
        "/data.bin",
        &[("range", "bytes=0-9"), ("if-range", "\"stale\"")],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(body(resp).await.len(), 1000);
    let resp = get(
        &sf,
        &s,
        "/data.bin",
        &[
            ("range", "bytes=0-9"),
            ("if-range", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);

    // If-Range with the current ETag: the range.
    let resp = get(
        &sf,
        &s,
        "/data.bin",
        &[("range", "bytes=0-9"), ("if-range", &etag)],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(body(resp).await, &data[..10]);

    // Several ranges: full 200 (documented simplification).
    let resp = get(&sf, &s, "/data.bin", &[("range", "bytes=0-1,5-6")]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(body(resp).await, data.as_slice());
}

#[tokio::test]
async fn conditional_requests() {
    let (_d, root) = setup();
    write(&root, "page.html", b"<p>hi</p>");
    let (sf, s) = (StaticFiles::new(1 << 20), site(&root));
    let first = get(&sf, &s, "/page.html", &[]).await;
    let etag = hdr(&first, header::ETAG).unwrap().to_owned();
    let last_modified = hdr(&first, header::LAST_MODIFIED).unwrap().to_owned();

    let resp = get(&sf, &s, "/page.html", &[("if-none-match", &etag)]).await;
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(hdr(&resp, header::ETAG), Some(etag.as_str()));
    assert_eq!(
        hdr(&resp, header::LAST_MODIFIED),
        Some(last_modified.as_str())
    );
    assert_eq!(
        hdr(&resp, header::CACHE_CONTROL),
        Some("public, max-age=60")
    );
    assert!(body(resp).await.is_empty());

    let weak_list = format!("\"nope\", W/{etag}");
    let resp = get(&sf, &s, "/page.html", &[("if-none-match", &weak_list)]).await;
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
    let resp = get(&sf, &s, "/page.html", &[("if-none-match", "*")]).await;
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
    let resp = get(&sf, &s, "/page.html", &[("if-none-match", "\"nope\"")]).await;
    assert_eq!(resp.status(), StatusCode::OK);

    let resp = get(
        &sf,
        &s,
        "/page.html",
        &[("if-modified-since", &last_modified)],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
    assert!(body(resp).await.is_empty());
    let old = "Sun, 06 Nov 1994 08:49:37 GMT";
    let resp = get(&sf, &s, "/page.html", &[("if-modified-since", old)]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    // If-None-Match wins over If-Modified-Since.
    let resp = get(
        &sf,
        &s,
        "/page.html",
        &[
            ("if-none-match", "\"nope\""),
            ("if-modified-since", &last_modified),
        ],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn precompressed_siblings() {
    let (_d, root) = setup();
    write(&root, "app.js", b"console.log('identity')");
    write(&root, "app.js.br", b"BROTLI");
    write(&root, "app.js.gz", b"GZIP");
    write(&root, "gz-only.css", b"body{}");
    write(&root, "gz-only.css.gz", b"GZCSS");
    write(&root, "plain.css", b"p{}");
    let (sf, s) = (StaticFiles::new(1 << 20), site(&root));

    let resp = get(
        &sf,
        &s,
        "/app.js",
        &[("accept-encoding", "gzip, deflate, br")],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(hdr(&resp, header::CONTENT_ENCODING), Some("br"));
    assert_eq!(hdr(&resp, header::VARY), Some("accept-encoding"));
    assert!(hdr(&resp, header::CONTENT_TYPE)
        .unwrap()
        .contains("javascript"));
    assert_eq!(hdr(&resp, header::CONTENT_LENGTH), Some("6"));
    let br_etag = hdr(&resp, header::ETAG).unwrap().to_owned();
    assert_eq!(body(resp).await, "BROTLI");

    let resp = get(&sf, &s, "/app.js", &[("accept-encoding", "gzip")]).await;
    assert_eq!(hdr(&resp, header::CONTENT_ENCODING), Some("gzip"));
    assert_ne!(hdr(&resp, header::ETAG), Some(br_etag.as_str()));
    assert_eq!(body(resp).await, "GZIP");

    // q=0 refuses br.
    let resp = get(&sf, &s, "/app.js", &[("accept-encoding", "br;q=0, gzip")]).await;
    assert_eq!(hdr(&resp, header::CONTENT_ENCODING), Some("gzip"));
    // Higher q for gzip wins.
    let resp = get(
        &sf,
        &s,
        "/app.js",
        &[("accept-encoding", "br;q=0.2, gzip;q=0.9")],
    )
    .await;
    assert_eq!(hdr(&resp, header::CONTENT_ENCODING), Some("gzip"));

    // Nothing acceptable, or no header: identity, still Vary.
    for h in [&[("accept-encoding", "br;q=0, gzip;q=0")][..], &[]] {
        let resp = get(&sf, &s, "/app.js", h).await;
        assert!(resp.headers().get(header::CONTENT_ENCODING).is_none());
        assert_eq!(hdr(&resp, header::VARY), Some("accept-encoding"));
        assert_eq!(body(resp).await, "console.log('identity')");
    }

    // br preferred but only .gz exists.
    let resp = get(&sf, &s, "/gz-only.css", &[("accept-encoding", "br, gzip")]).await;
    assert_eq!(hdr(&resp, header::CONTENT_ENCODING), Some("gzip"));
    assert!(hdr(&resp, header::CONTENT_TYPE)
        .unwrap()
        .starts_with("text/css"));
    assert_eq!(body(resp).await, "GZCSS");

    // No sibling: no Vary.
    let resp = get(&sf, &s, "/plain.css", &[("accept-encoding", "br, gzip")]).await;
    assert!(resp.headers().get(header::VARY).is_none());
    assert!(resp.headers().get(header::CONTENT_ENCODING).is_none());

    // Range: identity bytes, Vary kept.
    let resp = get(
        &sf,
        &s,
        "/app.js",
        &[("accept-encoding", "br"), ("range", "bytes=0-6")],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert!(resp.headers().get(header::CONTENT_ENCODING).is_none());
    assert_eq!(hdr(&resp, header::VARY), Some("accept-encoding"));
    assert_eq!(body(resp).await, "console");

    // Disabled per site.
    let mut off = site(&root);
    off.precompressed = false;
    let resp = get(&sf, &off, "/app.js", &[("accept-encoding", "br")]).await;
    assert!(resp.headers().get(header::CONTENT_ENCODING).is_none());
    assert!(resp.headers().get(header::VARY).is_none());
    assert_eq!(body(resp).await, "console.log('identity')");
}

#[cfg(unix)]
#[tokio::test]
async fn traversal_is_refused() {
    let (d, root) = setup();
    write(&root, "a/ok.txt", b"ok");
    std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("passwd")).unwrap();
    std::os::unix::fs::symlink(d.path().join("secret"), root.join("secret-link")).unwrap();
    std::os::unix::fs::symlink(root.join("a/ok.txt"), root.join("inside-link")).unwrap();
    let (sf, s) = (StaticFiles::new(1 << 20), site(&root));

    for uri in [
        "/../secret",
        "/a/../../secret",
        "/%2e%2e/secret",
        "/a/%2E%2E/%2e%2e/secret",
        "/..%2fsecret",
        "/a%2f..%2f..%2fsecret",
        "/a\\..\\..\\secret",
        "/etc/passwd",
        "/etc/hostname",
        "/passwd",
        "/secret-link",
    ] {
        let resp = get(&sf, &s, uri, &[]).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{uri}");
        let b = body(resp).await;
        assert!(
            !b.starts_with(b"top secret") && !b.starts_with(b"root:"),
            "{uri}"
        );
    }
    for uri in ["/a%00.txt", "/%zz", "/%ff"] {
        let resp = get(&sf, &s, uri, &[]).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{uri}");
    }
    // A symlink inside the root pointing inside the root is fine, as is an encoded slash.
    let resp = get(&sf, &s, "/inside-link", &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(body(resp).await, "ok");
    let resp = get(&sf, &s, "/a%2fok.txt", &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn spa_fallback_with_try_files() {
    let (_d, root) = setup();
    write(&root, "index.html", b"<app/>");
    write(&root, "main.js", b"js");
    write(&root, "docs/index.html", b"docs");
    let sf = StaticFiles::new(1 << 20);
    let mut s = site(&root);
    s.try_files = vec!["$uri".into(), "$uri/".into(), "/index.html".into()];

    let resp = get(&sf, &s, "/some/client/route", &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(hdr(&resp, header::CONTENT_TYPE)
        .unwrap()
        .starts_with("text/html"));
    assert_eq!(body(resp).await, "<app/>");
    let resp = get(&sf, &s, "/main.js", &[]).await;
    assert_eq!(body(resp).await, "js");
    let resp = get(&sf, &s, "/docs", &[]).await;
    assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
    let resp = get(&sf, &s, "/docs/", &[]).await;
    assert_eq!(body(resp).await, "docs");

    // `$uri.html` style candidates and an explicit `=404`.
    s.try_files = vec!["$uri".into(), "$uri.html".into(), "=404".into()];
    write(&root, "about.html", b"about");
    let resp = get(&sf, &s, "/about", &[]).await;
    assert_eq!(body(resp).await, "about");
    let resp = get(&sf, &s, "/nothing", &[]).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn directories_redirect_and_index() {
    let (_d, root) = setup();
    write(&root, "docs/index.html", b"docs index");
    fs::create_dir(root.join("empty")).unwrap();
    let (sf, mut s) = (StaticFiles::new(1 << 20), site(&root));

    let resp = get(&sf, &s, "/docs?x=1&y=2", &[]).await;
    assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(hdr(&resp, header::LOCATION), Some("/docs/?x=1&y=2"));
    let resp = get(&sf, &s, "/docs/", &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(body(resp).await, "docs index");
    // No listing.
    let resp = get(&sf, &s, "/empty/", &[]).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    // Never a protocol-relative Location.
    let resp = get(&sf, &s, "//docs", &[]).await;
    assert_eq!(hdr(&resp, header::LOCATION), Some("/docs/"));

    // With strip_prefix the redirect keeps the client-visible path.
    s.strip_prefix = Some("/static".into());
    let resp = get(&sf, &s, "/static/docs", &[]).await;
    assert_eq!(hdr(&resp, header::LOCATION), Some("/static/docs/"));
    let resp = get(&sf, &s, "/static/docs/index.html", &[]).await;
    assert_eq!(body(resp).await, "docs index");
    let resp = get(&sf, &s, "/static/", &[]).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn head_and_method_not_allowed() {
    let (_d, root) = setup();
    write(&root, "f.txt", b"twelve bytes");
    let (sf, s) = (StaticFiles::new(1 << 20), site(&root));
    let g = get(&sf, &s, "/f.txt", &[]).await;
    let h = sf.serve(&s, &req(Method::HEAD, "/f.txt", &[]), None).await;
    assert_eq!(h.status(), StatusCode::OK);
    for name in [
        header::CONTENT_LENGTH,
        header::CONTENT_TYPE,
        header::ETAG,
        header::LAST_MODIFIED,
    ] {
        assert_eq!(h.headers().get(&name), g.headers().get(&name), "{name}");
    }
    assert_eq!(hdr(&h, header::CONTENT_LENGTH), Some("12"));
    assert!(body(h).await.is_empty());

    for m in [Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS] {
        let resp = sf.serve(&s, &req(m.clone(), "/f.txt", &[]), None).await;
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED, "{m}");
        assert_eq!(hdr(&resp, header::ALLOW), Some("GET, HEAD"));
    }
}

#[tokio::test]
async fn large_file_is_streamed_in_chunks() {
    let (_d, root) = setup();
    let data = pattern(5 * 1024 * 1024 + 17);
    write(&root, "big.bin", &data);
    let (sf, s) = (StaticFiles::new(1 << 20), site(&root));

    let resp = get(&sf, &s, "/big.bin", &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        hdr(&resp, header::CONTENT_LENGTH),
        Some(data.len().to_string().as_str())
    );
    let mut b = resp.into_body();
    let (mut frames, mut got) = (0, Vec::with_capacity(data.len()));
    while let Some(frame) = b.frame().await {
        let chunk = frame.unwrap().into_data().unwrap();
        assert!(chunk.len() <= CHUNK_SIZE, "frame of {} bytes", chunk.len());
        frames += 1;
        got.extend_from_slice(&chunk);
    }
    assert!(frames > 1);
    assert!(got == data, "streamed bytes differ");
    assert_eq!(sf.cached_entries(), 0, "large files are not cached");

    // A range deep inside the file reads only that range.
    let start = 3 * 1024 * 1024 + 5;
    let range = format!("bytes={}-{}", start, start + 300_000 - 1);
    let resp = get(&sf, &s, "/big.bin", &[("range", &range)]).await;
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(hdr(&resp, header::CONTENT_LENGTH), Some("300000"));
    let got = body(resp).await;
    assert!(got == data[start..start + 300_000], "range bytes differ");
}

/// The open-file cache: a large, aged file's descriptor is kept after its first request and
/// reused; a file replaced by rename with the same size and mtime (only the inode differs) is
/// served anew, never from the stale descriptor; a file modified just now is not kept.
#[tokio::test]
async fn open_file_cache_keeps_descriptors_and_drops_replaced_files() {
    let (_d, root) = setup();
    let one = pattern(2 << 20);
    let p = write(&root, "big.bin", &one);
    let (sf, s) = (StaticFiles::new(1 << 20), site(&root));
    for _ in 0..2 {
        let got = body(get(&sf, &s, "/big.bin", &[]).await).await;
        assert!(got == one, "first version");
        assert_eq!((sf.cached_entries(), sf.open_files()), (0, 1));
    }

    let mtime = fs::metadata(&p).unwrap().modified().unwrap();
    let two: Vec<u8> = one.iter().map(|b| b ^ 0xff).collect();
    let tmp = write(&root, "big.tmp", &two);
    fs::File::options()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    fs::rename(&tmp, &p).unwrap();
    let got = body(get(&sf, &s, "/big.bin", &[]).await).await;
    assert!(
        got == two,
        "the replaced file's bytes, not the stale descriptor's"
    );
    assert_eq!(sf.open_files(), 1, "the stale entry replaced");

    fs::write(root.join("fresh.bin"), &one).unwrap();
    let got = body(get(&sf, &s, "/fresh.bin", &[]).await).await;
    assert!(got == one);
    assert_eq!(sf.open_files(), 1, "a file modified just now is not kept");
}

#[tokio::test]
async fn cache_hits_and_invalidation() {
    let (_d, root) = setup();
    let p = write_aged(&root, "c.txt", b"version one", Duration::from_secs(3600));
    let (sf, s) = (StaticFiles::new(1 << 20), site(&root));

    let first = get(&sf, &s, "/c.txt", &[]).await;
    let etag1 = hdr(&first, header::ETAG).unwrap().to_owned();
    assert_eq!(body(first).await, "version one");
    assert_eq!(sf.cached_entries(), 1);
    let second = get(&sf, &s, "/c.txt", &[]).await;
    assert_eq!(hdr(&second, header::ETAG), Some(etag1.as_str()));
    assert_eq!(body(second).await, "version one");

    // Same size, new content and a new mtime.
    fs::write(&p, b"version two").unwrap();
    fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(1800))
        .unwrap();
    let third = get(&sf, &s, "/c.txt", &[]).await;
    assert_ne!(hdr(&third, header::ETAG), Some(etag1.as_str()));
    assert_eq!(body(third).await, "version two");
    assert_eq!(sf.cached_entries(), 1);

    // Replaced by rename with a different size.
    let tmp = write_aged(
        &root,
        "c.tmp",
        b"v3, longer than before",
        Duration::from_secs(900),
    );
    fs::rename(&tmp, &p).unwrap();
    let fourth = get(&sf, &s, "/c.txt", &[]).await;
    assert_eq!(body(fourth).await, "v3, longer than before");

    // A file modified just now is served but not cached (racy-timestamp guard).
    fs::write(root.join("fresh.txt"), b"fresh").unwrap();
    let before = sf.cached_entries();
    let resp = get(&sf, &s, "/fresh.txt", &[]).await;
    assert_eq!(body(resp).await, "fresh");
    assert_eq!(sf.cached_entries(), before);
}

#[tokio::test]
async fn cache_respects_its_budget() {
    let (_d, root) = setup();
    for i in 0..20 {
        write(&root, &format!("f{i}.bin"), &pattern(10_000));
    }
    let budget = 50_000;
    let (sf, s) = (StaticFiles::new(budget), site(&root));
    for i in 0..20 {
        let resp = get(&sf, &s, &format!("/f{i}.bin"), &[]).await;
        assert_eq!(body(resp).await.len(), 10_000);
        assert!(sf.cached_bytes() <= budget);
    }
    assert!(sf.cached_entries() >= 1 && sf.cached_entries() < 20);
}

#[tokio::test]
async fn dotfiles_are_hidden_by_default_and_can_be_shown() {
    let (_d, root) = setup();
    write(&root, ".env", b"SECRET=1");
    write(&root, ".git/config", b"[core]");
    write(&root, "a/.htpasswd", b"u:p");
    write(&root, ".well-known/acme-challenge/t", b"token");
    let (sf, mut s) = (StaticFiles::new(1 << 20), site(&root));
    for uri in [
        "/.env",
        "/.git/config",
        "/a/.htpasswd",
        "/%2eenv",
        "/a/%2Ehtpasswd",
    ] {
        let resp = get(&sf, &s, uri, &[]).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{uri}");
    }
    let resp = get(&sf, &s, "/.well-known/acme-challenge/t", &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    s.hide_dotfiles = false;
    let resp = get(&sf, &s, "/.env", &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(body(resp).await, "SECRET=1");
}
