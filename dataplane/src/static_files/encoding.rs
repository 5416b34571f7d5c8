//! Content codings for precompressed siblings and `Accept-Encoding` negotiation.

/// The representation variant served for one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Encoding {
    /// The file itself.
    Identity = 0,
    /// The `file.br` sibling, served with `Content-Encoding: br`.
    Br = 1,
    /// The `file.gz` sibling, served with `Content-Encoding: gzip`.
    Gzip = 2,
}

impl Encoding {
    /// The sibling file suffix (`""` for identity).
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Encoding::Identity => "",
            Encoding::Br => ".br",
            Encoding::Gzip => ".gz",
        }
    }

    /// The `Content-Encoding` token, `None` for identity.
    pub(crate) fn token(self) -> Option<&'static str> {
        match self {
            Encoding::Identity => None,
            Encoding::Br => Some("br"),
            Encoding::Gzip => Some("gzip"),
        }
    }
}

/// The precompressed codings the client accepts, best first (br before gzip at equal q).
///
/// A coding with `q=0` is refused; `*` covers codings not named explicitly; `x-gzip` is an
/// alias of `gzip`. Malformed elements are skipped.
pub(crate) fn preferred(accept_encoding: &[u8]) -> [Option<Encoding>; 2] {
    let Ok(value) = std::str::from_utf8(accept_encoding) else {
        return [None, None];
    };
    let (mut br, mut gz, mut star): (Option<u16>, Option<u16>, Option<u16>) = (None, None, None);
    for (coding, q) in crate::compress::accept_codings(value) {
        let slot = if coding.eq_ignore_ascii_case("br") {
            &mut br
        } else if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
            &mut gz
        } else if coding == "*" {
            &mut star
        } else {
            continue;
        };
        // When a coding is listed twice, keep the higher weight.
        *slot = Some(slot.map_or(q, |old| old.max(q)));
    }
    let qbr = br.or(star).unwrap_or(0);
    let qgz = gz.or(star).unwrap_or(0);
    let b = (qbr > 0).then_some(Encoding::Br);
    let g = (qgz > 0).then_some(Encoding::Gzip);
    if qbr >= qgz {
        if b.is_some() {
            [b, g]
        } else {
            [g, None]
        }
    } else {
        [g, b]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Encoding::{Br, Gzip};

    fn pref(v: &str) -> [Option<Encoding>; 2] {
        preferred(v.as_bytes())
    }

    #[test]
    fn common_browser_headers() {
        assert_eq!(pref("gzip, deflate, br"), [Some(Br), Some(Gzip)]);
        assert_eq!(pref("gzip, deflate, br, zstd"), [Some(Br), Some(Gzip)]);
        assert_eq!(pref("gzip"), [Some(Gzip), None]);
        assert_eq!(pref("br"), [Some(Br), None]);
        assert_eq!(pref(""), [None, None]);
        assert_eq!(pref("identity"), [None, None]);
    }

    #[test]
    fn q_values() {
        assert_eq!(pref("br;q=0.5, gzip;q=0.8"), [Some(Gzip), Some(Br)]);
        assert_eq!(pref("br;q=0.8, gzip;q=0.8"), [Some(Br), Some(Gzip)]);
        assert_eq!(pref("br;q=0, gzip"), [Some(Gzip), None]);
        assert_eq!(pref("br;q=0.000, gzip;q=0"), [None, None]);
        assert_eq!(pref("BR; Q=1.0"), [Some(Br), None]);
        assert_eq!(pref("x-gzip;q=0.3"), [Some(Gzip), None]);
    }

    #[test]
    fn star_and_malformed() {
        assert_eq!(pref("*"), [Some(Br), Some(Gzip)]);
        assert_eq!(pref("*;q=0"), [None, None]);
        assert_eq!(pref("gzip;q=0, *"), [Some(Br), None]);
        // Malformed q: the element is skipped.
        assert_eq!(pref("br;q=2, gzip;q=abc"), [None, None]);
        assert_eq!(pref("br;q=1.5"), [None, None]);
    }
}
