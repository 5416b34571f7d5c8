//! Header field names as they come off the wire, turned into [`HeaderName`]s: the names most
//! requests and responses carry, spelt the usual ways (`content-type`, `Content-Type`), are
//! recognised by their bytes and given as `http`'s own constants; every other name goes through
//! [`HeaderName::from_bytes`]. The result is the same `HeaderName` either way (a test checks
//! it against `from_bytes` for every known name in mixed case, near misses and arbitrary
//! bytes); the short path skips `from_bytes`' copy into a scratch buffer and its match over
//! every standard name, for the four to eight fields of a usual head on both halves.
//!
//! A name is hostile input: only bytes equal to a known name in one of its two spellings take
//! the short path, so what `from_bytes` refuses is refused still.

use http::header::{self, HeaderName, InvalidHeaderName};

/// The field name `name` (any case), or why it is not one.
pub(crate) fn from_bytes(name: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    match known(name) {
        Some(n) => Ok(n),
        None => HeaderName::from_bytes(name),
    }
}

/// The standard name `name` is, among the ones heads carry most, when it is spelt in lower
/// case or in the usual capitals (`Content-Type`): a match on the bytes, which the compiler
/// turns into a length switch and a few word compares. Other spellings take the long way.
fn known(name: &[u8]) -> Option<HeaderName> {
    let n = match name {
        b"host" | b"Host" => header::HOST,
        b"date" | b"Date" => header::DATE,
        b"etag" | b"ETag" => header::ETAG,
        b"vary" | b"Vary" => header::VARY,
        b"server" | b"Server" => header::SERVER,
        b"accept" | b"Accept" => header::ACCEPT,
        b"cookie" | b"Cookie" => header::COOKIE,
        b"origin" | b"Origin" => header::ORIGIN,
        b"referer" | b"Referer" => header::REFERER,
        b"expires" | b"Expires" => header::EXPIRES,
        b"location" | b"Location" => header::LOCATION,
        b"user-agent" | b"User-Agent" => header::USER_AGENT,
        b"connection" | b"Connection" => header::CONNECTION,
        b"set-cookie" | b"Set-Cookie" => header::SET_COOKIE,
        b"content-type" | b"Content-Type" => header::CONTENT_TYPE,
        b"cache-control" | b"Cache-Control" => header::CACHE_CONTROL,
        b"last-modified" | b"Last-Modified" => header::LAST_MODIFIED,
        b"accept-ranges" | b"Accept-Ranges" => header::ACCEPT_RANGES,
        b"authorization" | b"Authorization" => header::AUTHORIZATION,
        b"if-none-match" | b"If-None-Match" => header::IF_NONE_MATCH,
        b"content-length" | b"Content-Length" => header::CONTENT_LENGTH,
        b"accept-encoding" | b"Accept-Encoding" => header::ACCEPT_ENCODING,
        b"accept-language" | b"Accept-Language" => header::ACCEPT_LANGUAGE,
        b"content-encoding" | b"Content-Encoding" => header::CONTENT_ENCODING,
        b"if-modified-since" | b"If-Modified-Since" => header::IF_MODIFIED_SINCE,
        _ => return None,
    };
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: [&str; 25] = [
        "host",
        "date",
        "etag",
        "vary",
        "server",
        "accept",
        "cookie",
        "origin",
        "referer",
        "expires",
        "location",
        "user-agent",
        "connection",
        "set-cookie",
        "content-type",
        "cache-control",
        "last-modified",
        "accept-ranges",
        "authorization",
        "if-none-match",
        "content-length",
        "accept-encoding",
        "accept-language",
        "content-encoding",
        "if-modified-since",
    ];

    #[test]
    fn every_known_name_takes_the_short_path_to_its_constant() {
        for k in KNOWN {
            let short = known(k.as_bytes()).unwrap_or_else(|| panic!("{k} not known"));
            assert_eq!(short, HeaderName::from_bytes(k.as_bytes()).unwrap());
            assert_eq!(short.as_str(), k);
            // The usual capitals take it too; any other case the long way, to the same name.
            let capitals: String = k
                .split('-')
                .map(|w| w[..1].to_ascii_uppercase() + &w[1..])
                .collect::<Vec<_>>()
                .join("-");
            let capitals = if k == "etag" {
                "ETag".to_string()
            } else {
                capitals
            };
            assert_eq!(
                known(capitals.as_bytes()),
                Some(short.clone()),
                "{capitals}"
            );
            let upper = k.to_ascii_uppercase();
            assert_eq!(from_bytes(upper.as_bytes()).unwrap(), short, "{upper}");
        }
    }

    #[test]
    fn near_misses_go_the_long_way() {
        for n in [
            "hos",
            "hostt",
            "h0st",
            "content_length",
            "content-lengtH ",
            "x-date",
        ] {
            assert!(known(n.as_bytes()).is_none(), "{n}");
        }
        assert!(from_bytes(b"content length").is_err());
        assert!(from_bytes(b"").is_err());
        assert_eq!(from_bytes(b"X-Custom").unwrap().as_str(), "x-custom");
    }

    proptest::proptest! {
        /// Whatever the bytes (known names in any case, with one octet changed, or arbitrary),
        /// the result is `HeaderName::from_bytes`' own, refusals included.
        #[test]
        fn the_same_as_from_bytes(
            base in proptest::sample::select(KNOWN.to_vec()),
            flips in proptest::collection::vec(proptest::prelude::any::<bool>(), 17),
            change in proptest::option::of((0usize..17, proptest::prelude::any::<u8>())),
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20),
            use_raw in proptest::prelude::any::<bool>(),
        ) {
            let bytes: Vec<u8> = if use_raw {
                raw
            } else {
                let mut b: Vec<u8> = base
                    .bytes()
                    .zip(&flips)
                    .map(|(c, &f)| if f { c.to_ascii_uppercase() } else { c })
                    .collect();
                if let Some((i, o)) = change {
                    let i = i % b.len();
                    b[i] = o;
                }
                b
            };
            let ours = from_bytes(&bytes).ok();
            let theirs = HeaderName::from_bytes(&bytes).ok();
            proptest::prop_assert_eq!(ours, theirs, "{:?}", bytes);
        }
    }
}
