//! Validators: entity-tag list matching (`If-None-Match`, `If-Range`) and HTTP dates.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One entity tag from a header list.
#[derive(Debug, PartialEq, Eq)]
enum Tag<'a> {
    /// `*`.
    Any,
    /// An entity tag: whether it carried `W/`, and the opaque tag with its quotes.
    Tag { weak: bool, opaque: &'a [u8] },
}

/// Iterates the entity tags of an `If-None-Match`-style list; stops at the first malformed one.
fn tags(mut s: &[u8]) -> impl Iterator<Item = Tag<'_>> {
    std::iter::from_fn(move || {
        while let [b' ' | b'\t' | b',', rest @ ..] = s {
            s = rest;
        }
        if s.is_empty() {
            return None;
        }
        if let [b'*', rest @ ..] = s {
            s = rest;
            return Some(Tag::Any);
        }
        let weak = s.starts_with(b"W/");
        let body = if weak { &s[2..] } else { s };
        if body.first() != Some(&b'"') {
            s = &[];
            return None;
        }
        let close = body[1..].iter().position(|&b| b == b'"')?;
        let opaque = &body[..close + 2];
        s = &body[close + 2..];
        Some(Tag::Tag { weak, opaque })
    })
}

/// Strips an optional `W/` from our own ETag value.
fn opaque_of(etag: &[u8]) -> &[u8] {
    etag.strip_prefix(b"W/").unwrap_or(etag)
}

/// `If-None-Match` evaluation: true when `header` lists `*` or a tag weakly equal to `etag`.
pub(crate) fn none_match_hits(header: &[u8], etag: &[u8]) -> bool {
    let ours = opaque_of(etag);
    tags(header).any(|t| match t {
        Tag::Any => true,
        Tag::Tag { opaque, .. } => opaque == ours,
    })
}

/// `If-Range` evaluation: true when the validator still matches the current representation,
/// i.e. the `Range` header may be honoured. An entity tag needs strong equality; a date must
/// equal `Last-Modified` exactly.
pub(crate) fn if_range_matches(header: &[u8], etag: &[u8], mtime_secs: Option<u64>) -> bool {
    let trimmed = header.trim_ascii();
    if trimmed.starts_with(b"\"") || trimmed.starts_with(b"W/") {
        let mut it = tags(trimmed);
        return match (it.next(), it.next()) {
            (
                Some(Tag::Tag {
                    weak: false,
                    opaque,
                }),
                None,
            ) => !etag.starts_with(b"W/") && opaque == etag,
            _ => false,
        };
    }
    match (parse_date(trimmed), mtime_secs) {
        (Some(date), Some(ours)) => date == ours,
        _ => false,
    }
}

/// Parses an HTTP date header into seconds since the epoch.
pub(crate) fn parse_date(value: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(value).ok()?;
    let t = httpdate::parse_http_date(s.trim()).ok()?;
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

/// Seconds since the epoch of `t`, when it can be rendered as an HTTP date (1970..=9999).
pub(crate) fn http_secs(t: SystemTime) -> Option<u64> {
    let secs = t.duration_since(UNIX_EPOCH).ok()?.as_secs();
    (secs < 253_402_300_800).then_some(secs)
}

/// Formats `secs` since the epoch as an IMF-fixdate.
pub(crate) fn fmt_date(secs: u64) -> String {
    httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETAG: &[u8] = b"\"1f-17a\"";

    #[test]
    fn if_none_match_lists() {
        assert!(none_match_hits(b"\"1f-17a\"", ETAG));
        assert!(none_match_hits(b"W/\"1f-17a\"", ETAG), "weak comparison");
        assert!(none_match_hits(b"\"x\", \"1f-17a\"", ETAG));
        assert!(none_match_hits(b"\"x\",W/\"1f-17a\"", ETAG));
        assert!(none_match_hits(b"*", ETAG));
        assert!(!none_match_hits(b"\"x\", \"y\"", ETAG));
        assert!(!none_match_hits(b"1f-17a", ETAG), "unquoted is malformed");
        assert!(!none_match_hits(b"\"1f-17a", ETAG), "unterminated");
        assert!(!none_match_hits(b"", ETAG));
        // A comma inside the opaque tag is legal.
        assert!(none_match_hits(b"\"a,b\"", b"\"a,b\""));
    }

    #[test]
    fn if_range_needs_strong_equality_or_exact_date() {
        assert!(if_range_matches(b"\"1f-17a\"", ETAG, Some(0)));
        assert!(!if_range_matches(b"W/\"1f-17a\"", ETAG, Some(0)));
        assert!(!if_range_matches(b"\"other\"", ETAG, Some(0)));
        let date = fmt_date(1_700_000_000);
        assert!(if_range_matches(date.as_bytes(), ETAG, Some(1_700_000_000)));
        assert!(!if_range_matches(
            date.as_bytes(),
            ETAG,
            Some(1_700_000_001)
        ));
        assert!(!if_range_matches(b"garbage", ETAG, Some(1_700_000_000)));
        assert!(!if_range_matches(date.as_bytes(), ETAG, None));
    }

    #[test]
    fn dates_round_trip_and_guard_range() {
        let s = fmt_date(784_111_777);
        assert_eq!(s, "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(parse_date(s.as_bytes()), Some(784_111_777));
        assert_eq!(http_secs(UNIX_EPOCH - Duration::from_secs(1)), None);
        assert_eq!(
            http_secs(UNIX_EPOCH + Duration::from_secs(253_402_300_800)),
            None
        );
    }
}
