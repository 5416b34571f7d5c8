//! Request-path sanitising: prefix stripping, percent-decoding, and refusal of anything that
//! could leave the site root (`..` segments, NUL, backslashes, encoded slashes that escape).
//!
//! Decoding happens before segment checks, so `%2e%2e` and `..%2f` are seen as the `..`
//! segments they are. Empty and `.` segments are dropped (like a merged-slashes server).

use std::borrow::Cow;

/// Longest accepted decoded path, in bytes.
const MAX_PATH: usize = 4096;
/// Longest accepted path segment, in bytes (common file-system name limit).
const MAX_SEGMENT: usize = 255;

/// Why a request path is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathError {
    /// Malformed: bad percent-encoding, invalid UTF-8, NUL, not origin-form. Answer 400.
    BadRequest,
    /// Would escape the root or can never name a file. Answer 404.
    NotFound,
}

/// A sanitised path relative to the site root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CleanPath<'a> {
    /// Segments joined by `/`, no leading or trailing slash; empty for the root.
    pub(crate) rel: Cow<'a, str>,
    /// Whether the request path ended with `/`.
    pub(crate) trailing_slash: bool,
}

impl CleanPath<'_> {
    /// The path as a URI path again (`/` + rel, plus `/` when it had a trailing slash).
    pub(crate) fn to_uri(&self) -> String {
        let mut s = String::with_capacity(self.rel.len() + 2);
        s.push('/');
        s.push_str(&self.rel);
        if self.trailing_slash && !self.rel.is_empty() {
            s.push('/');
        }
        s
    }
}

/// Removes `prefix` from `path` on a segment boundary, keeping a leading `/`.
///
/// A path that does not start with the prefix is returned unchanged.
pub(crate) fn strip_prefix<'a>(path: &'a str, prefix: Option<&str>) -> Cow<'a, str> {
    let Some(prefix) = prefix.map(|p| p.trim_end_matches('/')) else {
        return Cow::Borrowed(path);
    };
    if prefix.is_empty() {
        return Cow::Borrowed(path);
    }
    match path.strip_prefix(prefix) {
        Some("") => Cow::Borrowed("/"),
        Some(rest) if rest.starts_with('/') => Cow::Borrowed(rest),
        _ => Cow::Borrowed(path),
    }
}

/// Decodes `%XX` escapes; `None` for a truncated or non-hex escape or invalid UTF-8.
fn percent_decode(s: &str) -> Option<Cow<'_, str>> {
    if !s.contains('%') {
        return Some(Cow::Borrowed(s));
    }
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let ok =
                b.len() > i + 2 && b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit();
            if !ok {
                return None;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    percent_encoding::percent_decode_str(s).decode_utf8().ok()
}

/// Sanitises a URI path (percent-encoded, origin-form) into a root-relative path.
pub(crate) fn sanitize(raw: &str) -> Result<CleanPath<'_>, PathError> {
    let decoded = percent_decode(raw).ok_or(PathError::BadRequest)?;
    match decoded {
        Cow::Borrowed(s) => clean(s),
        Cow::Owned(s) => clean(&s).map(|c| CleanPath {
            rel: Cow::Owned(c.rel.into_owned()),
            trailing_slash: c.trailing_slash,
        }),
    }
}

/// Whether a cleaned relative path has a segment starting with `.` (a hidden file or
/// directory: `.git`, `.env`), `.well-known` (RFC 8615, ACME challenges) excepted.
pub(crate) fn names_a_dotfile(rel: &str) -> bool {
    rel.split('/')
        .any(|s| s.starts_with('.') && s != ".well-known")
}

/// Segment checks on an already-decoded path; borrows when the path is already canonical.
pub(crate) fn clean(path: &str) -> Result<CleanPath<'_>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::BadRequest);
    }
    if path.len() > MAX_PATH {
        return Err(PathError::NotFound);
    }
    if path.contains('\0') {
        return Err(PathError::BadRequest);
    }
    if path.contains('\\') {
        return Err(PathError::NotFound);
    }
    let trailing_slash = path.ends_with('/');
    let body = path.trim_start_matches('/').trim_end_matches('/');
    let mut canonical = true;
    for seg in body.split('/') {
        match seg {
            ".." => return Err(PathError::NotFound),
            "" | "." => canonical = false,
            s if s.len() > MAX_SEGMENT => return Err(PathError::NotFound),
            _ => {}
        }
    }
    // A leading run of slashes beyond one also means "not canonical" (harmless, but rebuild).
    if path.len() > 1 && path.as_bytes()[1] == b'/' {
        canonical = false;
    }
    let rel = if body.is_empty() {
        Cow::Borrowed("")
    } else if canonical {
        Cow::Borrowed(body)
    } else {
        let segs: Vec<&str> = body
            .split('/')
            .filter(|s| !s.is_empty() && *s != ".")
            .collect();
        Cow::Owned(segs.join("/"))
    };
    Ok(CleanPath {
        rel,
        trailing_slash,
    })
}

/// The `Location` for a directory redirect: `path` + `/` (+ `?query`), with a leading run of
/// slashes collapsed so the result can never be a protocol-relative URL.
pub(crate) fn dir_redirect_location(path: &str, query: Option<&str>) -> String {
    let trimmed = path.trim_start_matches(['/', '\\']);
    let mut s = String::with_capacity(trimmed.len() + 3 + query.map_or(0, |q| q.len() + 1));
    s.push('/');
    s.push_str(trimmed);
    s.push('/');
    if let Some(q) = query {
        s.push('?');
        s.push_str(q);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> (String, bool) {
        let c = sanitize(raw).unwrap_or_else(|e| panic!("{raw}: {e:?}"));
        (c.rel.into_owned(), c.trailing_slash)
    }

    #[test]
    fn plain_paths_borrow() {
        let c = sanitize("/a/b.txt").unwrap();
        assert!(matches!(c.rel, Cow::Borrowed("a/b.txt")));
        assert!(!c.trailing_slash);
        assert_eq!(ok("/"), (String::new(), true));
        assert_eq!(ok("/dir/"), ("dir".into(), true));
    }

    #[test]
    fn decodes_and_normalises() {
        assert_eq!(ok("/a%20b.txt"), ("a b.txt".into(), false));
        assert_eq!(ok("//a//./b/"), ("a/b".into(), true));
        assert_eq!(ok("/caf%C3%A9"), ("café".into(), false));
        // An encoded slash that does not escape simply separates segments.
        assert_eq!(ok("/a%2Fb"), ("a/b".into(), false));
        assert_eq!(ok("/...hidden"), ("...hidden".into(), false));
    }

    #[test]
    fn refuses_traversal() {
        for raw in [
            "/../etc/passwd",
            "/a/../../etc",
            "/%2e%2e/etc",
            "/%2E%2E%2Fetc",
            "/a/..%2f..%2fetc",
            "/..",
            "/a\\..\\b",
            "/a%5c..%5cb",
        ] {
            assert_eq!(sanitize(raw), Err(PathError::NotFound), "{raw}");
        }
    }

    #[test]
    fn dotfiles_are_named_except_well_known() {
        for rel in [".git/config", "a/.env", ".htpasswd", "a/b/.hidden/x"] {
            assert!(names_a_dotfile(rel), "{rel}");
        }
        for rel in ["", "a/b.c", ".well-known/acme-challenge/t", "a/b..c"] {
            assert!(!names_a_dotfile(rel), "{rel}");
        }
    }

    #[test]
    fn refuses_malformed() {
        for raw in ["/a%00b", "/%zz", "/%2", "/%", "/%ff%fe", "relative", "*"] {
            assert_eq!(sanitize(raw), Err(PathError::BadRequest), "{raw}");
        }
        let long = format!("/{}", "a".repeat(300));
        assert_eq!(sanitize(&long), Err(PathError::NotFound));
    }

    #[test]
    fn prefix_stripping_is_segment_aware() {
        assert_eq!(strip_prefix("/static/a.css", Some("/static")), "/a.css");
        assert_eq!(strip_prefix("/static/a.css", Some("/static/")), "/a.css");
        assert_eq!(strip_prefix("/static", Some("/static")), "/");
        assert_eq!(strip_prefix("/staticx/a", Some("/static")), "/staticx/a");
        assert_eq!(strip_prefix("/other", Some("/static")), "/other");
        assert_eq!(strip_prefix("/a", Some("/")), "/a");
        assert_eq!(strip_prefix("/a", None), "/a");
    }

    #[test]
    fn redirect_location_is_never_protocol_relative() {
        assert_eq!(dir_redirect_location("/docs", None), "/docs/");
        assert_eq!(dir_redirect_location("/docs", Some("a=1")), "/docs/?a=1");
        assert_eq!(
            dir_redirect_location("//evil.example", None),
            "/evil.example/"
        );
        assert_eq!(
            dir_redirect_location("/\\evil.example", None),
            "/evil.example/"
        );
    }

    #[test]
    fn to_uri_round_trips() {
        assert_eq!(sanitize("/a/b/").unwrap().to_uri(), "/a/b/");
        assert_eq!(sanitize("/a").unwrap().to_uri(), "/a");
        assert_eq!(sanitize("/").unwrap().to_uri(), "/");
    }
}
