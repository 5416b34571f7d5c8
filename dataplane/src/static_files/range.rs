//! `Range` header parsing for a single byte range (RFC 9110 §14).
//!
//! Only one range is honoured; a multi-range request is answered with the full
//! representation (a documented simplification: no `multipart/byteranges`).

/// What a `Range` header asks for, resolved against the representation length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeSpec {
    /// Serve the whole representation (header absent, malformed, other unit, or several ranges).
    Full,
    /// Serve bytes `start..=end` (inclusive, both within the representation).
    Partial { start: u64, end: u64 },
    /// No byte of the representation is selected: answer 416.
    Unsatisfiable,
}

/// Parses a decimal number, saturating at `u64::MAX`; `None` when empty or not all digits.
fn parse_num(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.bytes().fold(0u64, |acc, b| {
        acc.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    }))
}

/// Resolves the `Range` header `value` against a representation of `len` bytes.
pub(crate) fn parse_range(value: &[u8], len: u64) -> RangeSpec {
    let Ok(value) = std::str::from_utf8(value) else {
        return RangeSpec::Full;
    };
    let value = value.trim();
    let Some((unit, set)) = value.split_once('=') else {
        return RangeSpec::Full;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return RangeSpec::Full;
    }
    let mut specs = set.split(',').map(str::trim).filter(|s| !s.is_empty());
    let (Some(spec), None) = (specs.next(), specs.next()) else {
        // None at all (malformed) or several ranges: full representation.
        return RangeSpec::Full;
    };
    let Some((first, last)) = spec.split_once('-') else {
        return RangeSpec::Full;
    };
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        // Suffix range: the last `n` bytes.
        let Some(n) = parse_num(last) else {
            return RangeSpec::Full;
        };
        if n == 0 || len == 0 {
            return RangeSpec::Unsatisfiable;
        }
        return RangeSpec::Partial {
            start: len - n.min(len),
            end: len - 1,
        };
    }
    let Some(start) = parse_num(first) else {
        return RangeSpec::Full;
    };
    let end = if last.is_empty() {
        None
    } else {
        match parse_num(last) {
            Some(end) if end >= start => Some(end),
            // `a-b` with b < a, or garbage: the header is invalid and ignored.
            _ => return RangeSpec::Full,
        }
    };
    if start >= len {
        return RangeSpec::Unsatisfiable;
    }
    RangeSpec::Partial {
        start,
        end: end.map_or(len - 1, |e| e.min(len - 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &str, len: u64) -> RangeSpec {
        parse_range(v.as_bytes(), len)
    }

    #[test]
    fn closed_open_and_suffix() {
        assert_eq!(p("bytes=0-9", 100), RangeSpec::Partial { start: 0, end: 9 });
        assert_eq!(
            p("bytes=90-", 100),
            RangeSpec::Partial { start: 90, end: 99 }
        );
        assert_eq!(
            p("bytes=-10", 100),
            RangeSpec::Partial { start: 90, end: 99 }
        );
        assert_eq!(
            p("Bytes = 5-5 ", 100),
            RangeSpec::Partial { start: 5, end: 5 }
        );
    }

    #[test]
    fn clamps_to_length() {
        assert_eq!(
            p("bytes=50-1000", 100),
            RangeSpec::Partial { start: 50, end: 99 }
        );
        assert_eq!(
            p("bytes=-1000", 100),
            RangeSpec::Partial { start: 0, end: 99 }
        );
        assert_eq!(
            p("bytes=0-99999999999999999999999", 10),
            RangeSpec::Partial { start: 0, end: 9 }
        );
    }

    #[test]
    fn unsatisfiable() {
        assert_eq!(p("bytes=100-", 100), RangeSpec::Unsatisfiable);
        assert_eq!(p("bytes=100-200", 100), RangeSpec::Unsatisfiable);
        assert_eq!(p("bytes=-0", 100), RangeSpec::Unsatisfiable);
        assert_eq!(p("bytes=0-", 0), RangeSpec::Unsatisfiable);
        assert_eq!(p("bytes=-5", 0), RangeSpec::Unsatisfiable);
    }

    #[test]
    fn ignored_headers_mean_full() {
        for v in [
            "bytes=0-1,5-6",
            "bytes=5-1",
            "items=0-1",
            "bytes=a-b",
            "bytes=",
            "bytes=-",
            "bytes=+1-2",
            "0-1",
        ] {
            assert_eq!(p(v, 100), RangeSpec::Full, "{v}");
        }
        // An empty list element is allowed and does not make it multi-range.
        assert_eq!(
            p("bytes=0-1, ", 100),
            RangeSpec::Partial { start: 0, end: 1 }
        );
    }
}
