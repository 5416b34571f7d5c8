//! Request path normalisation before routing (`path_normalization` in the config): the router,
//! the access rules, the cache key, the access log and the backend all see one path.
//!
//! In order, on the path without its query (the query is left as it came):
//!
//! 1. percent-encoded **unreserved** characters (`A-Z a-z 0-9 - . _ ~`, RFC 3986 §2.3) are
//!    decoded and other escapes get upper-case hex digits (§6.2.2.1–2); a malformed escape
//!    (`%` not followed by two hex digits) is refused;
//! 2. an encoded slash or backslash (`%2F`, `%5C`) and a raw backslash are what
//!    `escaped_slashes` says: refused (the default), decoded to `/`, or kept as they came;
//! 3. runs of `/` are merged into one (`merge_slashes`, on by default);
//! 4. dot segments are removed (RFC 3986 §5.2.4); `..` never climbs above the root.
//!
//! Envoy's `normalize_path`, `merge_slashes` and `path_with_escaped_slashes_action` are the
//! model: a path that a backend would read as another path must not be matched as itself.
//! The result is idempotent and always starts with `/` (the property tests below check both,
//! and agreement with a deliberately naive reference model).

use std::borrow::Cow;
pub use sweety_config::{EscapedSlashes, PathNormalization};

/// Why a path is refused (400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path does not start with `/` (not origin-form).
    #[error("the path is not origin-form")]
    NotOrigin,
    /// A `%` not followed by two hex digits.
    #[error("malformed percent-encoding in the path")]
    BadEscape,
    /// An encoded slash or backslash (or a raw backslash) under `escaped_slashes: reject`.
    #[error("encoded slash or backslash in the path")]
    EscapedSlash,
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Normalises a path (without query) by `policy`. Borrows when the path is already normal
/// (the common case costs one scan).
pub fn normalize<'a>(path: &'a str, policy: &PathNormalization) -> Result<Cow<'a, str>, PathError> {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return Err(PathError::NotOrigin);
    }
    if !policy.enabled {
        return Ok(Cow::Borrowed(path));
    }
    if is_normal(b, policy) {
        return Ok(Cow::Borrowed(path));
    }
    // 1–2: escapes and backslashes.
    let mut decoded: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'%' {
            let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            ) else {
                return Err(PathError::BadEscape);
            };
            let v = h * 16 + l;
            if unreserved(v) {
                decoded.push(v);
            } else if v == b'/' || v == b'\\' {
                match policy.escaped_slashes {
                    EscapedSlashes::Reject => return Err(PathError::EscapedSlash),
                    EscapedSlashes::Decode => decoded.push(b'/'),
                    EscapedSlashes::Keep => {
                        decoded.extend_from_slice(if v == b'/' { b"%2F" } else { b"%5C" })
                    }
                }
            } else {
                decoded.push(b'%');
                decoded.push(b"0123456789ABCDEF"[usize::from(h)]);
                decoded.push(b"0123456789ABCDEF"[usize::from(l)]);
            }
            i += 3;
        } else if c == b'\\' {
            match policy.escaped_slashes {
                EscapedSlashes::Reject => return Err(PathError::EscapedSlash),
                EscapedSlashes::Decode => decoded.push(b'/'),
                EscapedSlashes::Keep => decoded.push(b'\\'),
            }
            i += 1;
        } else {
            decoded.push(c);
            i += 1;
        }
    }
    // 3–4: segments. `decoded` starts with '/' (the first byte was kept as it is).
    let mut out: Vec<&[u8]> = Vec::new();
    let mut trailing = false;
    let mut segs = decoded[1..].split(|&c| c == b'/').peekable();
    while let Some(seg) = segs.next() {
        let last = segs.peek().is_none();
        match seg {
            b"." => trailing = last,
            b".." => {
                out.pop();
                trailing = last;
            }
            b"" if policy.merge_slashes => trailing = last,
            s => {
                out.push(s);
                trailing = false;
            }
        }
    }
    let mut n = Vec::with_capacity(decoded.len());
    for s in &out {
        n.push(b'/');
        n.extend_from_slice(s);
    }
    if trailing || n.is_empty() {
        n.push(b'/');
    }
    // Only ASCII was changed, and whole escapes or bytes moved: still UTF-8 where `path` was.
    Ok(Cow::Owned(String::from_utf8(n).unwrap_or_else(|e| {
        String::from_utf8_lossy(e.as_bytes()).into_owned()
    })))
}

/// One pass that tells whether [`normalize`] would return the path unchanged.
fn is_normal(b: &[u8], policy: &PathNormalization) -> bool {
    let mut seg_start = 1;
    for i in 0..=b.len() {
        let c = b.get(i).copied();
        match c {
            Some(b'%') => {
                let v = match (
                    b.get(i + 1).and_then(|&x| hex(x)),
                    b.get(i + 2).and_then(|&x| hex(x)),
                ) {
                    (Some(h), Some(l)) => h * 16 + l,
                    _ => return false,
                };
                if unreserved(v)
                    || b[i + 1].is_ascii_lowercase()
                    || b[i + 2].is_ascii_lowercase()
                    || ((v == b'/' || v == b'\\') && policy.escaped_slashes != EscapedSlashes::Keep)
                {
                    return false;
                }
            }
            Some(b'\\') if policy.escaped_slashes != EscapedSlashes::Keep => return false,
            Some(b'/') | None if i > 0 => {
                let seg = &b[seg_start..i];
                if seg == b"." || seg == b".." {
                    return false;
                }
                if seg.is_empty() && c.is_some() && policy.merge_slashes {
                    return false;
                }
                seg_start = i + 1;
            }
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(e: EscapedSlashes) -> PathNormalization {
        PathNormalization {
            escaped_slashes: e,
            ..PathNormalization::default()
        }
    }

    fn n(s: &str) -> Result<String, PathError> {
        normalize(s, &PathNormalization::default()).map(Cow::into_owned)
    }

    #[test]
    fn the_issue_examples_all_become_admin() {
        for s in [
            "/admin",
            "/%61dmin",
            "//admin",
            "/./admin",
            "/x/../admin",
            "/x/%2e%2e/admin",
            "/x/%2E%2E/admin",
            "/../admin",
            "/x/./../admin",
            "///admin",
        ] {
            assert_eq!(n(s).as_deref(), Ok("/admin"), "{s}");
        }
    }

    #[test]
    fn rfc3986_dot_segments() {
        // RFC 3986 §5.4 style: trailing dot segments keep the directory's slash.
        for (i, o) in [
            ("/", "/"),
            ("/a/b/c/./../../g", "/a/g"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/b/", "/a/b/"),
            ("/..", "/"),
            ("/.", "/"),
            ("/a/..", "/"),
            ("/a/.../b", "/a/.../b"),
            ("/a/..b/c", "/a/..b/c"),
            ("/a//b", "/a/b"),
            ("/a/b//", "/a/b/"),
        ] {
            assert_eq!(n(i).as_deref(), Ok(o), "{i}");
        }
    }

    #[test]
    fn escapes_are_decoded_or_canonicalised() {
        assert_eq!(n("/%7euser/%41%2d").as_deref(), Ok("/~user/A-"));
        assert_eq!(n("/a%20b%3f").as_deref(), Ok("/a%20b%3F"));
        assert_eq!(n("/%25").as_deref(), Ok("/%25"));
        assert_eq!(n("/%2541").as_deref(), Ok("/%2541"));
        assert_eq!(n("/%"), Err(PathError::BadEscape));
        assert_eq!(n("/%4"), Err(PathError::BadEscape));
        assert_eq!(n("/%zz"), Err(PathError::BadEscape));
        assert_eq!(n("x"), Err(PathError::NotOrigin));
        assert_eq!(n(""), Err(PathError::NotOrigin));
        assert_eq!(n("*"), Err(PathError::NotOrigin));
    }

    #[test]
    fn escaped_slashes_follow_the_policy() {
        let r = p(EscapedSlashes::Reject);
        let d = p(EscapedSlashes::Decode);
        let k = p(EscapedSlashes::Keep);
        for s in ["/a%2fb", "/a%2Fb", "/a%5cb", "/a\\b"] {
            assert_eq!(normalize(s, &r), Err(PathError::EscapedSlash), "{s}");
            assert_eq!(normalize(s, &d).unwrap(), "/a/b", "{s}");
        }
        assert_eq!(normalize("/x/..%2fadmin", &d).unwrap(), "/admin");
        assert_eq!(normalize("/x%2f..%2fadmin", &d).unwrap(), "/admin");
        assert_eq!(normalize("/a%2fb", &k).unwrap(), "/a%2Fb");
        assert_eq!(normalize("/a%5cb/../c", &k).unwrap(), "/c");
        assert_eq!(normalize("/a\\b", &k).unwrap(), "/a\\b");
    }

    #[test]
    fn merging_slashes_can_be_turned_off_and_normalisation_too() {
        let keep = PathNormalization {
            merge_slashes: false,
            ..PathNormalization::default()
        };
        assert_eq!(normalize("/a//b/./c", &keep).unwrap(), "/a//b/c");
        assert_eq!(normalize("/a//../b", &keep).unwrap(), "/a/b");
        let off = PathNormalization {
            enabled: false,
            ..PathNormalization::default()
        };
        assert_eq!(normalize("/a/../%61", &off).unwrap(), "/a/../%61");
        assert_eq!(normalize("a", &off), Err(PathError::NotOrigin));
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for s in ["/", "/a/b", "/a/b/", "/a%20b", "/%2541", "/a.b/c..d/~e"] {
            assert!(matches!(n_cow(s), Ok(Cow::Borrowed(_))), "{s}");
        }
    }

    fn n_cow(s: &str) -> Result<Cow<'_, str>, PathError> {
        normalize(s, &PathNormalization::default())
    }

    /// The reference model: the RFC 3986 §5.2.4 algorithm written out literally on strings
    /// (input and output buffers), after a naive decode and slash merge. It shares no code
    /// with [`normalize`] (its own unreserved set, RFC 3986 §2.3, spelled out).
    fn reference(path: &str, policy: &PathNormalization) -> Result<String, PathError> {
        if !path.starts_with('/') {
            return Err(PathError::NotOrigin);
        }
        let mut s = String::new();
        let mut chars = path.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '%' {
                let h: String = chars.by_ref().take(2).collect();
                if h.len() != 2 || !h.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(PathError::BadEscape);
                }
                let v = char::from(u8::from_str_radix(&h, 16).unwrap());
                let unreserved = v.is_ascii_alphanumeric() || "-._~".contains(v);
                if unreserved {
                    s.push(v);
                } else if v == '/' || v == '\\' {
                    match policy.escaped_slashes {
                        EscapedSlashes::Reject => return Err(PathError::EscapedSlash),
                        EscapedSlashes::Decode => s.push('/'),
                        EscapedSlashes::Keep => s.push_str(&format!("%{}", h.to_uppercase())),
                    }
                } else {
                    s.push_str(&format!("%{}", h.to_uppercase()));
                }
            } else if c == '\\' {
                match policy.escaped_slashes {
                    EscapedSlashes::Reject => return Err(PathError::EscapedSlash),
                    EscapedSlashes::Decode => s.push('/'),
                    EscapedSlashes::Keep => s.push('\\'),
                }
            } else {
                s.push(c);
            }
        }
        if policy.merge_slashes {
            while s.contains("//") {
                s = s.replace("//", "/");
            }
        }
        // RFC 3986 §5.2.4.
        let mut input = s;
        let mut output = String::new();
        while !input.is_empty() {
            if input.starts_with("../") {
                input.drain(..3);
            } else if input.starts_with("./") {
                input.drain(..2);
            } else if input.starts_with("/./") {
                input.replace_range(..3, "/");
            } else if input == "/." {
                input = "/".into();
            } else if input.starts_with("/../") || input == "/.." {
                if input == "/.." {
                    input = "/".into();
                } else {
                    input.replace_range(..4, "/");
                }
                match output.rfind('/') {
                    Some(i) => output.truncate(i),
                    None => output.clear(),
                }
            } else if input == "." || input == ".." {
                input.clear();
            } else {
                let start = usize::from(input.starts_with('/'));
                let end = input[start..].find('/').map_or(input.len(), |i| i + start);
                output.push_str(&input[..end]);
                input.drain(..end);
            }
        }
        if output.is_empty() {
            output.push('/');
        }
        Ok(output)
    }

    fn path_strategy() -> impl Strategy<Value = String> {
        let seg = prop_oneof![
            Just("".to_string()),
            Just(".".to_string()),
            Just("..".to_string()),
            Just("%2e".to_string()),
            Just("%2E%2e".to_string()),
            Just("%2f".to_string()),
            Just("%5C".to_string()),
            Just("\\".to_string()),
            Just("%41".to_string()),
            Just("%7e".to_string()),
            Just("%20".to_string()),
            Just("%".to_string()),
            Just("admin".to_string()),
            "[a-z.~_-]{1,4}",
        ];
        proptest::collection::vec(proptest::collection::vec(seg, 1..3), 0..8).prop_map(|segs| {
            let mut s = String::new();
            for parts in segs {
                s.push('/');
                for p in parts {
                    s.push_str(&p);
                }
            }
            if s.is_empty() {
                s.push('/');
            }
            s
        })
    }

    fn policy_strategy() -> impl Strategy<Value = PathNormalization> {
        (
            any::<bool>(),
            prop_oneof![
                Just(EscapedSlashes::Reject),
                Just(EscapedSlashes::Decode),
                Just(EscapedSlashes::Keep)
            ],
        )
            .prop_map(|(merge_slashes, escaped_slashes)| PathNormalization {
                enabled: true,
                merge_slashes,
                escaped_slashes,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn idempotent_rooted_and_equal_to_the_reference(path in path_strategy(), policy in policy_strategy()) {
            let got = normalize(&path, &policy).map(Cow::into_owned);
            prop_assert_eq!(&got, &reference(&path, &policy), "{}", path);
            if let Ok(once) = got {
                prop_assert!(once.starts_with('/'));
                // Never escapes the root: no `..` segment survives.
                prop_assert!(!once.split('/').any(|s| s == ".." || s == "."), "{}", once);
                let twice = normalize(&once, &policy).map(Cow::into_owned);
                prop_assert_eq!(twice, Ok(once.clone()));
                prop_assert!(matches!(normalize(&once, &policy), Ok(Cow::Borrowed(_))));
            }
        }

        #[test]
        fn arbitrary_strings_never_panic(s in "/[ -~]{0,40}", policy in policy_strategy()) {
            if let Ok(once) = normalize(&s, &policy) {
                prop_assert_eq!(normalize(&once, &policy).map(Cow::into_owned), Ok(once.into_owned()));
            }
        }
    }
}
