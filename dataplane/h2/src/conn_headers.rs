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
    name == header::TE || ALWAYS.contains(&name.as_str())
}

/// Removes the connection-specific fields: `Connection` and every field it names, the fixed
/// list, and `TE` as `te` says.
pub fn strip(h: &mut HeaderMap, te: Te) {
    // One pass over the names first: most maps have none of them.
    let any = h.keys().any(may_strip);
    if !any {
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
        // `Connection: te` asks to remove TE, which the rule below decides alone.
        if n != header::TE {
            h.remove(n);
        }
    }
    let te_trailers = te == Te::KeepTrailers
        && h.get_all(header::TE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| {
                t.split(';')
                    .next()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
            });
    for n in ALWAYS {
        h.remove(n);
    }
    h.remove(header::TE);
    if te_trailers {
        h.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
