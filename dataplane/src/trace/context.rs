//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the `traceparent` and
//! `tracestate` request fields, parsed strictly. Both are untrusted client input.
//!
//! * `traceparent` (§3.2): `version-traceid-parentid-flags` in lowercase hex. Version `00` is
//!   exactly 55 bytes; a higher version (not `ff`) is read by its first 55 bytes when the
//!   56th, if any, is `-` (§3.2.4, forward compatibility). An all-zero trace id or parent id,
//!   uppercase hex, any other length or byte, and more than one `traceparent` field make it
//!   invalid: the caller then starts a new trace (§3.2.2.3 "restart the trace") and never
//!   passes the invalid value on.
//! * `tracestate` (§3.3): at most 32 list members `key=value` separated by `,` and optional
//!   spaces/tabs, keys and values by the §3.3.1.3 grammar, no key twice, at most
//!   [`MAX_TRACESTATE`] bytes when its field lines are joined with `,`. Anything else, or a
//!   `tracestate` without a valid `traceparent`, is dropped whole (§3.3.1.1: a vendor that
//!   cannot parse it must not propagate it). A valid one is passed on unchanged.
//!
//! Pure functions over bytes; no allocation except the joined `tracestate` of several field
//! lines. Fuzzed by `dataplane/fuzz/fuzz_targets/trace_context.rs`.

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};

/// The `traceparent` field.
pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// The `tracestate` field.
pub static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Longest `tracestate` (all field lines joined) passed on; a longer one is dropped.
pub const MAX_TRACESTATE: usize = 512;
/// Most list members of a `tracestate`.
pub const MAX_TRACESTATE_MEMBERS: usize = 32;

/// The sampled bit of `trace-flags`.
pub const FLAG_SAMPLED: u8 = 0x01;

/// A valid incoming `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id (never all zero).
    pub trace_id: [u8; 16],
    /// The caller's span id (never all zero).
    pub parent_id: [u8; 8],
    /// `trace-flags` (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// Whether the caller sampled (recorded) its span.
    pub fn sampled(&self) -> bool {
        self.flags & FLAG_SAMPLED != 0
    }
}

/// The value of a lowercase hex digit.
fn hex_lc(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// `out.len() * 2` lowercase hex digits into `out`.
fn unhex(s: &[u8], out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2 {
        return None;
    }
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        *o = (hex_lc(pair[0])? << 4) | hex_lc(pair[1])?;
    }
    Some(())
}

/// Parses one `traceparent` field value; `None` when it is invalid (see the module doc).
pub fn parse_traceparent(v: &[u8]) -> Option<TraceParent> {
    if v.len() < 55 {
        return None;
    }
    let mut version = [0u8; 1];
    unhex(&v[0..2], &mut version)?;
    match version[0] {
        0xff => return None,
        0x00 if v.len() != 55 => return None,
        _ if v.len() > 55 && v[55] != b'-' => return None,
        _ => {}
    }
    if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let mut trace_id = [0u8; 16];
    unhex(&v[3..35], &mut trace_id)?;
    let mut parent_id = [0u8; 8];
    unhex(&v[36..52], &mut parent_id)?;
    let mut flags = [0u8; 1];
    unhex(&v[53..55], &mut flags)?;
    if trace_id == [0; 16] || parent_id == [0; 8] {
        return None;
    }
    Some(TraceParent {
        trace_id,
        parent_id,
        flags: flags[0],
    })
}

/// A version `00` `traceparent` naming `span_id` as the parent, with the sampled flag.
pub fn format_traceparent(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> [u8; 55] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'-'; 55];
    out[0] = b'0';
    out[1] = b'0';
    let mut put = |at: usize, bytes: &[u8]| {
        for (i, b) in bytes.iter().enumerate() {
            out[at + 2 * i] = HEX[usize::from(b >> 4)];
            out[at + 2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
    };
    put(3, trace_id);
    put(36, span_id);
    put(53, &[u8::from(sampled)]);
    out
}

/// `traceparent` as a header value.
pub fn traceparent_value(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> HeaderValue {
    HeaderValue::from_bytes(&format_traceparent(trace_id, span_id, sampled))
        .expect("hex digits and dashes are a valid header value")
}

/// Lowercase hex of `bytes` (trace and span ids in logs and attributes).
pub fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}

fn lcalpha(b: u8) -> bool {
    b.is_ascii_lowercase()
}

fn key_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'*' | b'/')
}

/// §3.3.1.3.1: `simple-key` or `tenant-id@system-id`.
fn valid_key(k: &[u8]) -> bool {
    match k.iter().position(|&b| b == b'@') {
        None => {
            !k.is_empty() && k.len() <= 256 && lcalpha(k[0]) && k[1..].iter().all(|&b| key_char(b))
        }
        Some(at) => {
            let (tenant, system) = (&k[..at], &k[at + 1..]);
            !tenant.is_empty()
                && tenant.len() <= 241
                && (lcalpha(tenant[0]) || tenant[0].is_ascii_digit())
                && tenant[1..].iter().all(|&b| key_char(b))
                && !system.is_empty()
                && system.len() <= 14
                && lcalpha(system[0])
                && system[1..].iter().all(|&b| key_char(b))
        }
    }
}

/// §3.3.1.3.2: 1 to 256 of 0x20–0x7E except `,` and `=`, not ending in a space.
fn valid_value(v: &[u8]) -> bool {
    let nblk = |b: u8| (0x21..=0x7e).contains(&b) && b != b',' && b != b'=';
    !v.is_empty()
        && v.len() <= 256
        && nblk(v[v.len() - 1])
        && v.iter().all(|&b| b == b' ' || nblk(b))
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Whether `v` (one field line, or several joined with `,`) is a valid `tracestate` of at most
/// [`MAX_TRACESTATE`] bytes, [`MAX_TRACESTATE_MEMBERS`] members and no key twice. Empty
/// list members (only spaces) are allowed, as §3.3.1.1 says.
pub fn valid_tracestate(v: &[u8]) -> bool {
    if v.len() > MAX_TRACESTATE {
        return false;
    }
    let mut keys: [&[u8]; MAX_TRACESTATE_MEMBERS] = [&[]; MAX_TRACESTATE_MEMBERS];
    let mut n = 0;
    for member in v.split(|&b| b == b',') {
        let member = trim_ows(member);
        if member.is_empty() {
            continue;
        }
        let Some(eq) = member.iter().position(|&b| b == b'=') else {
            return false;
        };
        let (key, value) = (&member[..eq], &member[eq + 1..]);
        if !valid_key(key) || !valid_value(value) || n == MAX_TRACESTATE_MEMBERS {
            return false;
        }
        if keys[..n].contains(&key) {
            return false;
        }
        keys[n] = key;
        n += 1;
    }
    true
}

/// What a request brought: its valid `traceparent` and `tracestate`, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Incoming {
    /// The parent span, when exactly one valid `traceparent` came.
    pub parent: Option<TraceParent>,
    /// The `tracestate` to pass on (valid, with a valid `traceparent`).
    pub tracestate: Option<HeaderValue>,
}

/// Reads the trace context of a request and removes both fields from `headers` (the caller
/// sets its own): see the module doc for what is kept.
pub fn take_incoming(headers: &mut HeaderMap) -> Incoming {
    let parent = {
        let mut values = headers.get_all(&TRACEPARENT).iter();
        match (values.next(), values.next()) {
            (Some(v), None) => parse_traceparent(v.as_bytes()),
            _ => None,
        }
    };
    let tracestate = parent.and_then(|_| {
        let mut values = headers.get_all(&TRACESTATE).iter();
        let first = values.next()?;
        let joined = match values.next() {
            None => first.clone(),
            Some(second) => {
                let mut all = first.as_bytes().to_vec();
                for v in std::iter::once(second).chain(values) {
                    if all.len() + 1 + v.len() > MAX_TRACESTATE {
                        return None;
                    }
                    all.push(b',');
                    all.extend_from_slice(v.as_bytes());
                }
                HeaderValue::from_bytes(&all).ok()?
            }
        };
        valid_tracestate(joined.as_bytes()).then_some(joined)
    });
    headers.remove(&TRACEPARENT);
    headers.remove(&TRACESTATE);
    Incoming { parent, tracestate }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_spec_example_parses() {
        let p = parse_traceparent(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(hex(&p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&p.parent_id), "00f067aa0ba902b7");
        assert!(p.sampled());
        let p =
            parse_traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!p.sampled());
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        for bad in [
            "",
            "00",
            // version ff is forbidden
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // uppercase hex
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            "0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // all-zero ids
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // version 00 must be exactly 55 bytes
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            // wrong separators, short fields
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // a higher version must continue with '-' after 55 bytes
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(parse_traceparent(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_higher_version_is_read_by_its_first_fields() {
        let p = parse_traceparent(
            b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds",
        )
        .unwrap();
        assert_eq!(hex(&p.parent_id), "00f067aa0ba902b7");
        assert!(
            parse_traceparent(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").is_some()
        );
    }

    #[test]
    fn formatting_round_trips() {
        let p = parse_traceparent(EXAMPLE.as_bytes()).unwrap();
        let out = format_traceparent(&p.trace_id, &p.parent_id, true);
        assert_eq!(&out[..], EXAMPLE.as_bytes());
    }

    #[test]
    fn tracestate_grammar() {
        for ok in [
            "rojo=00f067aa0ba902b7",
            "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
            "rojo=00f067aa0ba902b7 ,\t congo=t61rcWkgMzE",
            "t@sys=1,a*/_-=v a l",
            "1tenant@vendor=x",
            "",
            " , ",
        ] {
            assert!(valid_tracestate(ok.as_bytes()), "{ok:?}");
        }
        for bad in [
            "Rojo=1",        // uppercase key
            "rojo",          // no value
            "rojo=",         // empty value
            "rojo=a,rojo=b", // key twice
            "rojo=a b ",     // value ends in a space (after trimming: "a b" is fine, so test '=')
            "rojo=a=b",      // '=' in a value
            "@sys=1",        // empty tenant
            "t@=1",          // empty system
            "t@1sys=1",      // system must start with a letter
            "t@systemistoolong=1",
            "rojo=\u{7f}",
        ] {
            // "rojo=a b " trims to a valid member; every other one is invalid.
            if bad == "rojo=a b " {
                assert!(valid_tracestate(bad.as_bytes()));
                continue;
            }
            assert!(!valid_tracestate(bad.as_bytes()), "{bad:?}");
        }
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        assert!(!valid_tracestate(many.join(",").as_bytes()));
        assert!(valid_tracestate(many[..32].join(",").as_bytes()));
        let long = format!("k={}", "v".repeat(MAX_TRACESTATE));
        assert!(!valid_tracestate(long.as_bytes()));
    }

    fn headers(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn incoming_keeps_only_a_valid_context_and_removes_the_fields() {
        let mut h = headers(&[
            (&TRACEPARENT, EXAMPLE),
            (&TRACESTATE, "a=1"),
            (&TRACESTATE, "b=2"),
        ]);
        let i = take_incoming(&mut h);
        assert!(i.parent.is_some());
        assert_eq!(i.tracestate.unwrap(), "a=1,b=2");
        assert!(h.is_empty());

        // Two traceparents: restart, and tracestate goes with it.
        let mut h = headers(&[
            (&TRACEPARENT, EXAMPLE),
            (&TRACEPARENT, EXAMPLE),
            (&TRACESTATE, "a=1"),
        ]);
        assert_eq!(take_incoming(&mut h), Incoming::default());
        assert!(h.is_empty());

        // An invalid traceparent drops a valid tracestate.
        let mut h = headers(&[(&TRACEPARENT, "00-xyz"), (&TRACESTATE, "a=1")]);
        assert_eq!(take_incoming(&mut h), Incoming::default());

        // An invalid tracestate is dropped, the parent kept.
        let mut h = headers(&[(&TRACEPARENT, EXAMPLE), (&TRACESTATE, "A=1")]);
        let i = take_incoming(&mut h);
        assert!(i.parent.is_some() && i.tracestate.is_none());

        // Joined lines over the bound are dropped.
        let half = format!("a={}", "v".repeat(256 - 2));
        let other = format!("b={}", "v".repeat(256 - 2));
        let third = format!("c={}", "v".repeat(10));
        let mut h = headers(&[
            (&TRACEPARENT, EXAMPLE),
            (&TRACESTATE, &half),
            (&TRACESTATE, &other),
            (&TRACESTATE, &third),
        ]);
        assert!(take_incoming(&mut h).tracestate.is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

        /// Every id pair formats to a value that parses back to itself (unless an id is zero).
        #[test]
        fn format_then_parse(t in any::<[u8; 16]>(), s in any::<[u8; 8]>(), sampled in any::<bool>()) {
            let v = format_traceparent(&t, &s, sampled);
            let p = parse_traceparent(&v);
            if t == [0; 16] || s == [0; 8] {
                prop_assert!(p.is_none());
            } else {
                prop_assert_eq!(p, Some(TraceParent { trace_id: t, parent_id: s, flags: u8::from(sampled) }));
            }
        }

        /// Arbitrary bytes never panic, and what parses is canonical: its version-00 form
        /// equals the input's first 55 bytes apart from the version and flags.
        #[test]
        fn arbitrary_bytes(v in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Some(p) = parse_traceparent(&v) {
                let f = format_traceparent(&p.trace_id, &p.parent_id, false);
                prop_assert_eq!(&f[2..53], &v[2..53]);
                prop_assert!(v.len() == 55 || v[55] == b'-');
            }
            let _ = valid_tracestate(&v);
        }

        /// A mutation of one byte of a valid value either still parses to the same ids
        /// (flags and version bytes) or is refused.
        #[test]
        fn one_byte_mutations(i in 0usize..55, b in any::<u8>()) {
            let mut v = EXAMPLE.as_bytes().to_vec();
            v[i] = b;
            if let Some(p) = parse_traceparent(&v) {
                prop_assert!(v.iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c) || *c == b'-'));
                prop_assert_eq!(&format_traceparent(&p.trace_id, &p.parent_id, false)[3..52], &v[3..52]);
            }
        }

        /// Valid generated tracestates are accepted; what is accepted has at most 32 members
        /// and fits the bound.
        #[test]
        fn generated_tracestates(
            members in proptest::collection::vec(("[a-z][a-z0-9_*/-]{0,8}", "[!-+--<>-~][ -+--<>-~]{0,6}[!-+--<>-~]"), 0..40)
        ) {
            let mut seen = std::collections::HashSet::new();
            let unique: Vec<_> = members.iter().filter(|(k, _)| seen.insert(k.clone())).collect();
            let joined = unique.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
            let ok = valid_tracestate(joined.as_bytes());
            prop_assert_eq!(ok, unique.len() <= MAX_TRACESTATE_MEMBERS && joined.len() <= MAX_TRACESTATE);
        }
    }
}
