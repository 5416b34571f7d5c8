//! Error pages: the `error_pages` route filter ([`ErrorPages`], ingress-nginx's
//! `custom-http-errors` and `default-backend` annotations) and the parser of a status code
//! list ([`parse_codes`]), which is tenant input.
//!
//! ingress-nginx turns `custom-http-errors` into nginx's `proxy_intercept_errors on` plus one
//! `error_page <code> = @custom_<upstream>_<code>` per code, whose named location asks the
//! default backend for `/` with `X-Code`, `X-Format`, `X-Original-URI`, `X-Namespace`,
//! `X-Ingress-Name`, `X-Service-Name`, `X-Service-Port` and `X-Request-ID`, with
//! `proxy_intercept_errors off` (no loop); `default-backend` replaces a location's upstream
//! when it has no endpoint. The dataplane does the same from this filter (see its
//! `error_pages` module); what differs is in docs/config.md.

use crate::{Duration, HeaderValue};
use serde::{Deserialize, Serialize};

/// Most status codes one filter intercepts: every code from 400 to 599 once.
pub const MAX_CODES: usize = 200;
/// Longest code list [`parse_codes`] reads, bytes ("400, 401, …" for all 200 codes fits).
pub const MAX_CODES_TEXT: usize = 2048;
/// Most fixed `headers` one filter sends to its backend.
pub const MAX_HEADERS: usize = 8;
/// Longest page request timeout accepted.
pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Headers the dataplane sets itself on a page request (or that frame it): `headers` may not
/// name them.
pub const RESERVED_HEADERS: &[&str] = &[
    "x-code",
    "x-format",
    "x-original-uri",
    "x-request-id",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
];

/// Replace the route's error responses by an error page, and serve its requests from another
/// backend while the route's own have no endpoint (ingress-nginx's `custom-http-errors` and
/// `default-backend`).
///
/// When the route's action answers one of `codes`, its response is not passed on: its body is
/// discarded unread and `backend` is asked for `/` (the request's method and headers, no body,
/// with `X-Code`, `X-Format`, `X-Original-URI`, `X-Request-ID` and `headers`), within
/// `timeout`; the client gets the original status with that answer's body and content headers.
/// Without `backend` the client gets Sweety's own page for the status. When `backend` gives no
/// answer (no endpoint, connect error, timeout), the original response passes unchanged. The
/// page's answer is never intercepted again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorPages {
    /// Statuses replaced by the page: 400 to 599, each once, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<u16>,
    /// The backend that serves the pages (a backend name); none: the built-in page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// While no backend of the route has an endpoint that may take traffic, its requests are
    /// served by `backend` (unchanged, with `X-Code: 503` and the fixed headers), whose answer
    /// passes as it is (ingress-nginx's `default-backend`). Needs `backend`.
    #[serde(default, skip_serializing_if = "crate::model::is_false")]
    pub unavailable: bool,
    /// Fixed headers sent to `backend` (`X-Namespace`, `X-Ingress-Name`, `X-Service-Name`,
    /// `X-Service-Port` from the controller); at most [`MAX_HEADERS`], none of
    /// [`RESERVED_HEADERS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderValue>,
    /// How long the page request may take to answer, and the longest pause in its body
    /// (1 ms to [`MAX_TIMEOUT`]; default 5 s).
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}

impl Default for ErrorPages {
    fn default() -> Self {
        ErrorPages {
            codes: Vec::new(),
            backend: None,
            unavailable: false,
            headers: Vec::new(),
            timeout: default_timeout(),
        }
    }
}

/// A comma-separated list of status codes as ingress-nginx's `custom-http-errors` takes it:
/// three digits each, 400 to 599, whitespace around each allowed, empty items (a trailing
/// comma) skipped; duplicates are kept once and the result is sorted. Anything else (another
/// code, a sign, a word, no code at all, more than [`MAX_CODES_TEXT`] bytes) is an error
/// naming the first offending item.
pub fn parse_codes(text: &str) -> Result<Vec<u16>, String> {
    if text.len() > MAX_CODES_TEXT {
        return Err(format!("is longer than {MAX_CODES_TEXT} bytes"));
    }
    let mut codes = Vec::new();
    for item in text.split(',') {
        let item = item.trim_matches(|c: char| c.is_ascii_whitespace());
        if item.is_empty() {
            continue;
        }
        let code = (item.len() == 3 && item.bytes().all(|b| b.is_ascii_digit()))
            .then(|| item.parse::<u16>().ok())
            .flatten()
            .filter(|c| (400..=599).contains(c));
        match code {
            Some(c) => codes.push(c),
            None => {
                let shown: String = item.chars().take(16).collect();
                return Err(format!("{shown:?} is not a status code from 400 to 599"));
            }
        }
    }
    codes.sort_unstable();
    codes.dedup();
    if codes.is_empty() {
        return Err("lists no status code".into());
    }
    Ok(codes)
}

/// Problems of one [`ErrorPages`] filter: `(field, message)`; the backend's existence is
/// checked by the config's validation, which knows the backends.
pub fn check_error_pages(e: &ErrorPages) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if e.codes.len() > MAX_CODES {
        out.push(("codes".into(), format!("at most {MAX_CODES} codes")));
    }
    for (i, c) in e.codes.iter().enumerate() {
        if !(400..=599).contains(c) {
            out.push((format!("codes[{i}]"), format!("{c} is not from 400 to 599")));
        } else if e.codes[..i].contains(c) {
            out.push((
                format!("codes[{i}]"),
                format!("{c} is listed more than once"),
            ));
        }
    }
    if e.unavailable && e.backend.is_none() {
        out.push((
            "unavailable".into(),
            "needs a backend to serve the requests".into(),
        ));
    }
    if e.codes.is_empty() && !e.unavailable {
        out.push((
            "codes".into(),
            "lists no code and unavailable is off".into(),
        ));
    }
    if e.headers.len() > MAX_HEADERS {
        out.push(("headers".into(), format!("at most {MAX_HEADERS} headers")));
    }
    for (i, h) in e.headers.iter().enumerate() {
        let name = h.name.to_ascii_lowercase();
        if let Err(msg) = crate::validate::check_token(&h.name, "header name") {
            out.push((format!("headers[{i}].name"), msg));
        } else if RESERVED_HEADERS.contains(&name.as_str()) {
            out.push((
                format!("headers[{i}].name"),
                format!(
                    "{:?} is set by the dataplane (or frames the request)",
                    h.name
                ),
            ));
        } else if e.headers[..i]
            .iter()
            .any(|o| o.name.eq_ignore_ascii_case(&h.name))
        {
            out.push((
                format!("headers[{i}].name"),
                format!("{:?} is listed more than once", h.name),
            ));
        }
        if h.value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            out.push((
                format!("headers[{i}].value"),
                "header values must not contain control characters".into(),
            ));
        }
    }
    let t = e.timeout.get();
    if t < std::time::Duration::from_millis(1) || t > MAX_TIMEOUT {
        out.push((
            "timeout".into(),
            format!("must be from 1ms to {}s", MAX_TIMEOUT.as_secs()),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_as_ingress_nginx_reads_them() {
        assert_eq!(parse_codes("404,503"), Ok(vec![404, 503]));
        assert_eq!(parse_codes(" 503 , 404,\t500 ,"), Ok(vec![404, 500, 503]));
        assert_eq!(parse_codes("404,404,404"), Ok(vec![404]));
        assert_eq!(parse_codes("400,599"), Ok(vec![400, 599]));
        for bad in [
            "",
            ",",
            " , ",
            "399",
            "600",
            "200",
            "4O4",
            "+404",
            "0404",
            "404;503",
            "404 503",
            "1e3",
            "-404",
            "abc",
            "404,x",
            "４０４",
        ] {
            assert!(parse_codes(bad).is_err(), "{bad:?} is refused");
        }
        let all: Vec<String> = (400..=599).map(|c: u16| c.to_string()).collect();
        assert_eq!(parse_codes(&all.join(", ")).map(|v| v.len()), Ok(200));
        assert!(parse_codes(&"404,".repeat(600)).is_err(), "too long");
    }

    #[test]
    fn check_finds_each_problem() {
        let ok = ErrorPages {
            codes: vec![404, 503],
            backend: Some("errors".into()),
            unavailable: true,
            headers: vec![HeaderValue {
                name: "X-Namespace".into(),
                value: "team-a".into(),
            }],
            ..Default::default()
        };
        assert!(check_error_pages(&ok).is_empty());
        let fields = |e: &ErrorPages| -> Vec<String> {
            check_error_pages(e).into_iter().map(|(f, _)| f).collect()
        };
        let mut e = ok.clone();
        e.codes = vec![404, 404, 302];
        assert_eq!(fields(&e), ["codes[1]", "codes[2]"]);
        let mut e = ok.clone();
        e.backend = None;
        assert_eq!(fields(&e), ["unavailable"]);
        let mut e = ok.clone();
        e.codes.clear();
        e.unavailable = false;
        assert_eq!(fields(&e), ["codes"]);
        let mut e = ok.clone();
        e.headers.push(HeaderValue {
            name: "X-Code".into(),
            value: "200".into(),
        });
        e.headers.push(HeaderValue {
            name: "x-namespace".into(),
            value: "b".into(),
        });
        e.headers.push(HeaderValue {
            name: "X-Bad".into(),
            value: "a\r\nb".into(),
        });
        assert_eq!(
            fields(&e),
            ["headers[1].name", "headers[2].name", "headers[3].value"]
        );
        let mut e = ok;
        e.timeout = Duration::from_secs(61);
        assert_eq!(fields(&e), ["timeout"]);
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Whatever the text, the parser never panics, and what it accepts is a sorted
            /// list of distinct codes from 400 to 599 that [`check_error_pages`] accepts.
            #[test]
            fn accepted_lists_are_valid(text in "[0-9, \t4-5a-z+-]{0,40}") {
                if let Ok(codes) = parse_codes(&text) {
                    prop_assert!(!codes.is_empty());
                    prop_assert!(codes.windows(2).all(|w| w[0] < w[1]));
                    prop_assert!(codes.iter().all(|c| (400..=599).contains(c)));
                    let e = ErrorPages { codes, ..Default::default() };
                    prop_assert!(check_error_pages(&e).is_empty());
                }
            }

            /// Any set of valid codes, written with any spacing, reads back as itself.
            #[test]
            fn written_codes_read_back(
                codes in proptest::collection::btree_set(400u16..=599, 1..30),
                pad in "[ \t]{0,2}",
            ) {
                let text: Vec<String> = codes.iter().map(|c| format!("{pad}{c}{pad}")).collect();
                let want: Vec<u16> = codes.into_iter().collect();
                prop_assert_eq!(parse_codes(&text.join(",")), Ok(want));
            }
        }
    }
}
