//! The static-file handler: GET/HEAD, Range, conditionals, precompressed siblings,
//! try_files/SPA fallback, traversal protection, bounded streaming and a small hot-file cache.
//!
//! Request flow ([`StaticFiles::serve`]):
//! 1. Method check (GET/HEAD, else 405), prefix stripping and path sanitising (`path`).
//! 2. Resolution: `try_files` candidates, directory redirect, index files (`resolve`);
//!    this is a handful of synchronous `stat` calls.
//! 3. Variant choice: a `.br` / `.gz` sibling when the client accepts it (`encoding`);
//!    `Vary: Accept-Encoding` whenever a sibling exists.
//! 4. Cache lookup keyed by the joined path and variant, validated against the `stat` from
//!    step 2/3 (`cache`). A hit does no further system call, no `spawn_blocking`, and builds
//!    the response from precomputed header values.
//! 5. On a miss, one blocking-pool hop canonicalises the path, refuses anything outside the
//!    canonical root (symlink escapes), opens the file and `fstat`s it; small files are read
//!    whole (and cached), large ones are streamed in [`CHUNK_SIZE`] frames (`file_body`) and
//!    their open descriptor is kept in the open-file cache ([`OPEN_FILES`] descriptors,
//!    validated like the small-file cache), so the next request for the file streams it
//!    without that hop.
//! 6. Conditionals (`If-None-Match`, then `If-Modified-Since`) and a single `Range`
//!    (honouring `If-Range`) are evaluated against the chosen representation (`conditional`,
//!    `range`).
//!
//! Simplifications: multi-range requests get the full 200; `If-Match` and
//! `If-Unmodified-Since` are not evaluated; precompressed variants are never range-served.

mod cache;
mod conditional;
mod encoding;
mod file_body;
mod path;
mod range;
mod resolve;

pub use file_body::{
    unbudgeted_bytes, ReadAheadTotal, ReadBudget, ReadChunk, CHUNK_SIZE, UNBUDGETED_CHUNK,
};

use crate::body::{boxed, empty, full, text_response, Body};
use arc_swap::ArcSwapOption;
use bytes::Bytes;
use cache::{Cache, Entry, Representation, Stamp, MAX_ENTRY_BYTES};
use encoding::Encoding;
use file_body::FileBody;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};
use path::PathError;
use range::RangeSpec;
use resolve::Resolution;
use std::ffi::OsString;
use std::fs::{self, File, Metadata};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use sweety_config::StaticSite;

/// Open descriptors of large files kept for the next request (the open-file cache's size).
pub const OPEN_FILES: usize = 256;

/// The static-file handler, shared by all routes; owns the small-file and open-file caches.
#[derive(Debug)]
pub struct StaticFiles {
    cache: Cache,
    /// Large files' open descriptors and headers (see `cache`).
    open_files: Cache,
    /// Last `Cache-Control` string seen and its parsed header value, to avoid re-validating
    /// and re-allocating it per request.
    cache_control: ArcSwapOption<(String, HeaderValue)>,
}

/// The chosen variant of a resolved file.
struct Variant {
    encoding: Encoding,
    /// The sibling file and its metadata when a precompressed variant is served.
    sibling: Option<(PathBuf, Metadata)>,
    /// Whether `Vary: Accept-Encoding` must be sent (a sibling exists).
    vary: bool,
}

/// Where the body comes from.
enum Source {
    Bytes(Bytes),
    File(Arc<File>, Option<ReadBudget>),
}

/// What a miss produced.
enum Opened {
    /// Read whole; `cacheable` when stable and old enough.
    Small(Representation, Bytes, bool),
    /// Open, to be streamed.
    Large(Representation, File),
    /// Resolved outside the canonical root.
    Refused,
}

impl StaticFiles {
    /// A handler whose in-memory cache holds at most `cache_max_bytes` of small files.
    pub fn new(cache_max_bytes: usize) -> StaticFiles {
        StaticFiles {
            cache: Cache::new(cache_max_bytes),
            open_files: Cache::new(OPEN_FILES),
            cache_control: ArcSwapOption::empty(),
        }
    }

    /// Number of file variants currently held in the cache.
    pub fn cached_entries(&self) -> usize {
        self.cache.len()
    }

    /// Bytes currently charged against the cache limit (file bytes plus bookkeeping).
    pub fn cached_bytes(&self) -> usize {
        self.cache.charged_bytes()
    }

    /// Large files whose open descriptor is kept for the next request (at most
    /// [`OPEN_FILES`]).
    pub fn open_files(&self) -> usize {
        self.open_files.len()
    }

    /// Serves `req` (its path after any rewrite) from `site`; a streamed file takes its chunks
    /// from `budget`, the connection's read-ahead budget, when there is one.
    pub async fn serve(
        &self,
        site: &StaticSite,
        req: &http::request::Parts,
        budget: Option<&ReadBudget>,
    ) -> Response<Body> {
        let head = match req.method {
            Method::GET => false,
            Method::HEAD => true,
            _ => return method_not_allowed(),
        };
        let stripped = path::strip_prefix(req.uri.path(), site.strip_prefix.as_deref());
        let clean = match path::sanitize(&stripped) {
            Ok(c) => c,
            Err(PathError::BadRequest) => {
                return text_response(StatusCode::BAD_REQUEST, "bad request\n")
            }
            Err(PathError::NotFound) => return not_found(),
        };
        if site.hide_dotfiles && path::names_a_dotfile(&clean.rel) {
            return not_found();
        }
        let (file_path, meta) = match resolve::resolve(site, &clean) {
            Resolution::File { path, meta } => (path, meta),
            Resolution::Redirect => return redirect(req),
            Resolution::Status(status) => return status_response(status),
            Resolution::NotFound => return not_found(),
            Resolution::Io(e) => return io_error(&e),
        };
        let range_requested = !head && req.headers.contains_key(header::RANGE);
        let variant = choose_variant(site, &file_path, &req.headers, range_requested);
        let (serve_path, serve_meta) = match &variant.sibling {
            Some((p, m)) => (p.as_path(), m),
            None => (file_path.as_path(), &meta),
        };

        // Hot path: a validated cache hit.
        if let Some(hit) = self.cache.get(file_path.as_os_str(), variant.encoding) {
            if hit.rep.stamp == Stamp::of(serve_meta) {
                let bytes = hit.bytes.clone();
                return self.respond(
                    site,
                    req,
                    head,
                    variant.vary,
                    &hit.rep,
                    Source::Bytes(bytes),
                );
            }
            self.cache.remove(&hit);
        }
        // A large file opened before: the same validation, then stream from its descriptor.
        if let Some(hit) = self.open_files.get(file_path.as_os_str(), variant.encoding) {
            if let (true, Some(file)) = (hit.rep.stamp == Stamp::of(serve_meta), &hit.file) {
                let source = Source::File(file.clone(), budget.cloned());
                return self.respond(site, req, head, variant.vary, &hit.rep, source);
            }
            self.open_files.remove(&hit);
        }

        // Miss: canonicalise, check containment, open, read or stream (one blocking hop).
        let root = site.root.clone();
        let serve_path = serve_path.to_path_buf();
        let type_path = file_path.clone();
        let enc = variant.encoding;
        let opened =
            tokio::task::spawn_blocking(move || open_checked(&root, &serve_path, &type_path, enc))
                .await;
        match opened {
            Ok(Ok(Opened::Small(rep, bytes, cacheable))) => {
                if cacheable && self.cache.admits(rep.stamp.len) {
                    let key: OsString = file_path.into_os_string();
                    self.cache
                        .insert(Entry::new(key, rep.clone(), bytes.clone()));
                }
                self.respond(site, req, head, variant.vary, &rep, Source::Bytes(bytes))
            }
            Ok(Ok(Opened::Large(rep, file))) => {
                let file = Arc::new(file);
                if rep.stamp.cacheable(SystemTime::now()) {
                    let key: OsString = file_path.into_os_string();
                    self.open_files
                        .insert(Entry::open(key, rep.clone(), file.clone()));
                }
                let source = Source::File(file, budget.cloned());
                self.respond(site, req, head, variant.vary, &rep, source)
            }
            Ok(Ok(Opened::Refused)) => not_found(),
            Ok(Err(e)) => io_error(&e),
            Err(join) => {
                tracing::warn!(error = %join, "static file task failed");
                text_response(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")
            }
        }
    }

    /// The site's `Cache-Control` value, memoised across requests.
    fn cache_control(&self, site: &StaticSite) -> Option<HeaderValue> {
        let wanted = site.cache_control.as_deref()?;
        if let Some(memo) = &*self.cache_control.load() {
            if memo.0 == wanted {
                return Some(memo.1.clone());
            }
        }
        let value = HeaderValue::from_str(wanted).ok()?;
        self.cache_control
            .store(Some(Arc::new((wanted.to_owned(), value.clone()))));
        Some(value)
    }

    /// Builds the response for `rep`: 304, 206, 416 or 200 (no body for HEAD).
    fn respond(
        &self,
        site: &StaticSite,
        req: &http::request::Parts,
        head: bool,
        vary: bool,
        rep: &Representation,
        source: Source,
    ) -> Response<Body> {
        let mut h = HeaderMap::with_capacity(12);
        h.insert(header::ETAG, rep.etag.clone());
        if let Some(lm) = &rep.last_modified {
            h.insert(header::LAST_MODIFIED, lm.clone());
        }
        if let Some(cc) = self.cache_control(site) {
            h.insert(header::CACHE_CONTROL, cc);
        }
        if vary {
            h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
        }

        if not_modified(&req.headers, rep) {
            return build(StatusCode::NOT_MODIFIED, h, empty());
        }

        let len = rep.stamp.len;
        let mut spec = RangeSpec::Full;
        if !head {
            if let Some(range) = req.headers.get(header::RANGE) {
                let validator_ok = req.headers.get(header::IF_RANGE).is_none_or(|v| {
                    conditional::if_range_matches(v.as_bytes(), rep.etag.as_bytes(), rep.mtime_secs)
                });
                if validator_ok {
                    spec = range::parse_range(range.as_bytes(), len);
                }
            }
        }
        h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        let (status, start, count) = match spec {
            RangeSpec::Full => {
                h.insert(header::CONTENT_LENGTH, rep.content_length.clone());
                (StatusCode::OK, 0, len)
            }
            RangeSpec::Partial { start, end } => {
                let count = end - start + 1;
                h.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
                let cr = format!("bytes {start}-{end}/{len}");
                if let Ok(v) = HeaderValue::from_str(&cr) {
                    h.insert(header::CONTENT_RANGE, v);
                }
                (StatusCode::PARTIAL_CONTENT, start, count)
            }
            RangeSpec::Unsatisfiable => {
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                    h.insert(header::CONTENT_RANGE, v);
                }
                h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
                return build(StatusCode::RANGE_NOT_SATISFIABLE, h, empty());
            }
        };
        h.insert(header::CONTENT_TYPE, rep.content_type.clone());
        if let Some(token) = rep.encoding.token() {
            h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(token));
        }
        let body = if head {
            empty()
        } else {
            match source {
                Source::Bytes(b) if status == StatusCode::OK => full(b),
                Source::Bytes(b) => full(b.slice(start as usize..(start + count) as usize)),
                Source::File(f, budget) => {
                    let chunk = req
                        .extensions
                        .get::<ReadChunk>()
                        .map_or(CHUNK_SIZE, |c| c.0);
                    boxed(FileBody::new(f, start, count, chunk, budget, true))
                }
            }
        };
        build(status, h, body)
    }
}

/// `If-None-Match` (when present) or else `If-Modified-Since` says "not modified".
fn not_modified(headers: &HeaderMap, rep: &Representation) -> bool {
    if let Some(inm) = headers.get(header::IF_NONE_MATCH) {
        return conditional::none_match_hits(inm.as_bytes(), rep.etag.as_bytes());
    }
    if let (Some(ims), Some(mtime)) = (headers.get(header::IF_MODIFIED_SINCE), rep.mtime_secs) {
        return conditional::parse_date(ims.as_bytes()).is_some_and(|since| mtime <= since);
    }
    false
}

/// `path` with `suffix` appended to its file name (`app.js` → `app.js.br`).
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::with_capacity(path.as_os_str().len() + suffix.len());
    s.push(path.as_os_str());
    s.push(suffix);
    PathBuf::from(s)
}

fn is_regular_file(path: &Path) -> Option<Metadata> {
    fs::metadata(path).ok().filter(Metadata::is_file)
}

/// Picks the precompressed sibling the client prefers, if one exists (never for ranges).
fn choose_variant(site: &StaticSite, path: &Path, headers: &HeaderMap, range: bool) -> Variant {
    let mut v = Variant {
        encoding: Encoding::Identity,
        sibling: None,
        vary: false,
    };
    if !site.precompressed {
        return v;
    }
    let wanted = match headers.get(header::ACCEPT_ENCODING) {
        Some(ae) if !range => encoding::preferred(ae.as_bytes()),
        _ => [None, None],
    };
    let mut checked = [false; 3];
    for enc in wanted.into_iter().flatten() {
        checked[enc as usize] = true;
        let p = sibling(path, enc.suffix());
        if let Some(meta) = is_regular_file(&p) {
            v.encoding = enc;
            v.sibling = Some((p, meta));
            v.vary = true;
            return v;
        }
    }
    v.vary = [Encoding::Br, Encoding::Gzip]
        .into_iter()
        .filter(|e| !checked[*e as usize])
        .any(|e| is_regular_file(&sibling(path, e.suffix())).is_some());
    v
}

/// Content type by the original file's extension; text types get `charset=utf-8`.
fn content_type(path: &Path) -> HeaderValue {
    match mime_guess::from_path(path).first_raw() {
        Some(t)
            if t.starts_with("text/")
                || matches!(
                    t,
                    "application/javascript" | "application/json" | "application/xml"
                ) =>
        {
            HeaderValue::from_str(&format!("{t}; charset=utf-8"))
                .unwrap_or_else(|_| HeaderValue::from_static(t))
        }
        Some(t) => HeaderValue::from_static(t),
        None => HeaderValue::from_static("application/octet-stream"),
    }
}

/// The representation metadata of a file variant with `stamp`.
fn representation(stamp: Stamp, encoding: Encoding, type_path: &Path) -> Representation {
    let (secs, nanos) = stamp
        .mtime
        .and_then(|m| m.duration_since(UNIX_EPOCH).ok())
        .map_or((0, 0), |d| (d.as_secs(), d.subsec_nanos()));
    let (dash, suffix) = encoding.token().map_or(("", ""), |t| ("-", t));
    let etag = format!("\"{secs:x}.{nanos:x}-{:x}{dash}{suffix}\"", stamp.len);
    let mtime_secs = stamp.mtime.and_then(conditional::http_secs);
    Representation {
        stamp,
        encoding,
        etag: HeaderValue::from_str(&etag).unwrap_or_else(|_| HeaderValue::from_static("\"0\"")),
        last_modified: mtime_secs
            .and_then(|s| HeaderValue::from_str(&conditional::fmt_date(s)).ok()),
        mtime_secs,
        content_type: content_type(type_path),
        content_length: HeaderValue::from(stamp.len),
    }
}

/// The miss path (blocking): containment check against the canonical root, open, `fstat`,
/// and for small files a whole read.
fn open_checked(
    root: &Path,
    serve_path: &Path,
    type_path: &Path,
    enc: Encoding,
) -> io::Result<Opened> {
    // The root is canonicalised per miss (not memoised) so a root that is itself a symlink
    // (e.g. `current -> releases/v2`) can be re-pointed at deploy time.
    let canon_root = fs::canonicalize(root)?;
    let canon = fs::canonicalize(serve_path)?;
    if !canon.starts_with(&canon_root) {
        return Ok(Opened::Refused);
    }
    let mut file = File::open(&canon)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::ErrorKind::NotFound.into());
    }
    let stamp = Stamp::of(&meta);
    if stamp.len > MAX_ENTRY_BYTES {
        return Ok(Opened::Large(representation(stamp, enc, type_path), file));
    }
    let mut buf = Vec::with_capacity(stamp.len as usize);
    (&mut file)
        .take(MAX_ENTRY_BYTES + 1)
        .read_to_end(&mut buf)?;
    let after = Stamp::of(&file.metadata()?);
    if after == stamp && buf.len() as u64 == stamp.len {
        let cacheable = stamp.cacheable(SystemTime::now());
        return Ok(Opened::Small(
            representation(stamp, enc, type_path),
            Bytes::from(buf),
            cacheable,
        ));
    }
    // Changed while being read: serve what was read, described by its real length, uncached.
    let mut changed = after;
    changed.len = buf.len() as u64;
    Ok(Opened::Small(
        representation(changed, enc, type_path),
        Bytes::from(buf),
        false,
    ))
}

fn build(status: StatusCode, headers: HeaderMap, body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

fn not_found() -> Response<Body> {
    text_response(StatusCode::NOT_FOUND, "not found\n")
}

fn method_not_allowed() -> Response<Body> {
    let mut resp = text_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    resp
}

fn status_response(status: StatusCode) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from_static(
        status.canonical_reason().unwrap_or("").as_bytes(),
    )));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// 301 to the request path with `/` appended, keeping the query.
fn redirect(req: &http::request::Parts) -> Response<Body> {
    let location = path::dir_redirect_location(req.uri.path(), req.uri.query());
    match HeaderValue::from_str(&location) {
        Ok(v) => {
            let mut h = HeaderMap::with_capacity(2);
            h.insert(header::LOCATION, v);
            h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
            build(StatusCode::MOVED_PERMANENTLY, h, empty())
        }
        Err(_) => text_response(StatusCode::BAD_REQUEST, "bad request\n"),
    }
}

/// Maps a file-system error: absent → 404, permission → 403, anything else → 500.
fn io_error(e: &io::Error) -> Response<Body> {
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => not_found(),
        io::ErrorKind::PermissionDenied => text_response(StatusCode::FORBIDDEN, "forbidden\n"),
        _ => {
            tracing::warn!(error = %e, "static file error");
            text_response(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n")
        }
    }
}
