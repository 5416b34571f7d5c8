//! Connection-specific header fields (RFC 9110 §7.6.1): `Connection` and the fields it names,
//! `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`, and `TE` with any value
//! but `trailers`. A proxy does not forward them (HTTP/1.1 hop-by-hop), and HTTP/2 and HTTP/3
//! do not allow them: a request carrying one is malformed (RFC 9113 §8.2.2, RFC 9114 §4.2), and
//! a response must not carry one. One list, used by the proxy (`proxy::forward`), Sweety's
//! HTTP/2 engine (request check, response stripping) and HTTP/3 (the same).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The fields that are connection-specific whatever their value.
const ALWAYS: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// What [`strip`] does with `TE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Te {
    /// A request being forwarded: `TE: trailers` is kept (as exactly that), other values go.
    KeepTrailers,
    /// A response: `TE` is a request field; it goes.
    Remove,
}

/// Whether a request field (lower-case name, value) is connection-specific: an HTTP/2 or
/// HTTP/3 request carrying it is malformed. (Fields named by `Connection` need `Connection`
/// itself, which is one.)
pub fn is_connection_specific(name: &str, value: &[u8]) -> bool {
    ALWAYS.contains(&name) || (name == "te" && value != b"trailers")
}

/// Whether a field name is one [`strip`] may remove whatever its value: the fixed list or `TE`
/// (fields named by `Connection` need `Connection` itself, which is one).
pub fn may_strip(name: &HeaderName) -> bool {
    // The standard names compare as `http`'s enum, the two others by string (what
    // `ALWAYS.contains` does for all, at five string comparisons per name).
    name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name == header::TE
        || matches!(name.as_str(), "keep-alive" | "proxy-connection")
}

/// Removes the connection-specific fields: `Connection` and every field it names, the fixed
/// list, and `TE` as `te` says.
///
/// The fields to remove are found in one pass over the names the map has (a few), and only
/// those are removed: removing every listed name and every name `Connection` lists by string
/// would parse and hash each of them, about 2,500 instructions for a proxied response, which
/// nearly always carries `Connection: keep-alive`.
pub fn strip(h: &mut HeaderMap, te: Te) {
    // One pass over the names first: most maps have none of them.
    let any = h.keys().any(may_strip);
    if !any {
        return;
    }
    let te_trailers = te == Te::KeepTrailers && te_asks_trailers(h);
    let mut gone: Vec<HeaderName> = h.keys().filter(|n| may_strip(n)).cloned().collect();
    // The fields `Connection` names (usually none but `keep-alive`, listed already): each
    // token once against the names present. `Connection: te` asks to remove TE, which
    // `may_strip` (and `te_trailers`) decide alone. (Values that are not visible ASCII name
    // nothing; for the rest `trim_ascii` is `trim`.)
    for token in h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
    {
        let token = token.trim_ascii();
        if let Some(n) = h
            .keys()
            .find(|n| n.as_str().eq_ignore_ascii_case(token) && !may_strip(n))
        {
            if !gone.contains(n) {
                gone.push(n.clone());
            }
        }
    }
    for n in &gone {
        h.remove(n);
    }
    if te_trailers {
        h.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// Whether a `TE` field of `h` names `trailers` (its parameters aside, any case).
fn te_asks_trailers(h: &HeaderMap) -> bool {
    h.get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            t.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
}

/// Whether a field may not be sent as a trailer (RFC 9110 §6.5.1): the rule of
/// `sweety-fields`, shared with `sweety-h1`.
pub use sweety_fields::forbidden_trailer;

#[cfg(test)]
mod tests {
    use super::*;

    /// [`strip`] as it was before it looked only at the names present (each listed name and
    /// each name `Connection` lists removed by string): the reference it must match.
    fn reference_strip(h: &mut HeaderMap, te: Te) {
        if !h
            .keys()
            .any(|n| n == header::TE || ALWAYS.contains(&n.as_str()))
        {
            return;
        }
        let named: Vec<HeaderName> = h
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
            .collect();
        for n in named {
            if n != header::TE {
                h.remove(n);
            }
        }
        let te_trailers = te == Te::KeepTrailers && te_asks_trailers(h);
        for n in ALWAYS {
            h.remove(n);
        }
        h.remove(header::TE);
        if te_trailers {
            h.insert(header::TE, HeaderValue::from_static("trailers"));
        }
    }

    #[test]
    fn may_strip_is_the_list_and_te() {
        for n in ALWAYS.into_iter().chain(["te"]) {
            assert!(may_strip(&HeaderName::from_static(n)), "{n}");
        }
        for n in [
            "trailer",
            "host",
            "keep-alive-x",
            "proxy-authorization",
            "x-connection",
        ] {
            assert!(!may_strip(&HeaderName::from_static(n)), "{n}");
        }
    }

    fn fields(h: &HeaderMap) -> Vec<(String, Vec<u8>)> {
        h.iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    /// Every combination of up to four fields from a set of names and values (connection
    /// fields naming present, absent, upper-case, blank, invalid and listed names; TE with and
    /// without `trailers`; repeated fields), for requests and responses: the same fields,
    /// values and order as the reference.
    #[test]
    fn strip_matches_the_reference_on_every_small_map() {
        let pool: &[(&str, &str)] = &[
            ("connection", "keep-alive"),
            ("connection", "close, X-Hop"),
            ("connection", " te ,, upgrade,x-hop , bad name,\u{e9}"),
            ("connection", "X-END"),
            ("x-hop", "1"),
            ("x-hop", "2"),
            ("x-end", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("te", "trailers"),
            ("te", "gzip, Trailers;q=1"),
            ("te", "gzip"),
            ("close", "1"),
        ];
        let mut checked = 0;
        for a in 0..pool.len() {
            for b in a..=pool.len() {
                for c in b..=pool.len() {
                    for d in c..=pool.len() {
                        let mut start = HeaderMap::new();
                        for i in [a, b, c, d].into_iter().filter(|&i| i < pool.len()) {
                            let (n, v) = pool[i];
                            start.append(
                                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                                HeaderValue::from_bytes(v.as_bytes()).unwrap(),
                            );
                        }
                        for te in [Te::KeepTrailers, Te::Remove] {
                            let (mut ours, mut reference) = (start.clone(), start.clone());
                            strip(&mut ours, te);
                            reference_strip(&mut reference, te);
                            assert_eq!(fields(&ours), fields(&reference), "{start:?} {te:?}");
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 1000, "{checked} maps");
    }

    fn map(fields: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn names(h: &HeaderMap) -> Vec<String> {
        let mut n: Vec<String> = h
            .iter()
            .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap()))
            .collect();
        n.sort();
        n
    }

    /// Each case: fields in; what a request kept for forwarding keeps; what a response keeps;
    /// whether each field is connection-specific in an HTTP/2 or HTTP/3 request.
    #[test]
    fn connection_specific_fields_table() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            (&[("x-end", "1")], &["x-end: 1"], &["x-end: 1"]),
            (
                &[
                    ("connection", "keep-alive, X-Hop"),
                    ("connection", "close"),
                    ("x-hop", "1"),
                    ("keep-alive", "timeout=5"),
                    ("proxy-connection", "keep-alive"),
                    ("transfer-encoding", "chunked"),
                    ("upgrade", "websocket"),
                    ("x-end", "1"),
                ],
                &["x-end: 1"],
                &["x-end: 1"],
            ),
            (&[("te", "trailers")], &["te: trailers"], &[]),
            (
                &[("te", "gzip, trailers;q=1"), ("connection", "te")],
                &["te: trailers"],
                &[],
            ),
            (&[("te", "gzip")], &[], &[]),
        ];
        for (fields, request, response) in cases {
            let mut h = map(fields);
            strip(&mut h, Te::KeepTrailers);
            assert_eq!(names(&h), *request, "request: {fields:?}");
            let mut h = map(fields);
            strip(&mut h, Te::Remove);
            assert_eq!(names(&h), *response, "response: {fields:?}");
        }
        for (name, value, specific) in [
            ("connection", "close", true),
            ("keep-alive", "5", true),
            ("proxy-connection", "keep-alive", true),
            ("transfer-encoding", "chunked", true),
            ("upgrade", "h2c", true),
            ("te", "gzip", true),
            ("te", "trailers", false),
            ("x-hop", "1", false),
            ("trailer", "x-checksum", false),
        ] {
            assert_eq!(
                is_connection_specific(name, value.as_bytes()),
                specific,
                "{name}: {value}"
            );
        }
    }
}
