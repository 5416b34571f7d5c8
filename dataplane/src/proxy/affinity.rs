//! Session affinity and hash keys: reading the session token a client brings back (cookie or
//! header), issuing one on the response, and extracting the consistent-hash key of a request.

use http::header::{HeaderMap, HeaderName, HeaderValue, COOKIE, SET_COOKIE};
use std::net::IpAddr;
use sweety_config::{HashOn, HashPolicy, SessionKind, SessionPersistence};

/// Longest session token accepted from a client, bytes (ours are 16 hex digits).
const MAX_TOKEN: usize = 64;

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim_matches('"'))
}

/// The session token the client sent, if any (and not absurdly long).
pub fn token_from(headers: &HeaderMap, sp: &SessionPersistence) -> Option<String> {
    let t = match sp.kind {
        SessionKind::Cookie => cookie(headers, &sp.name)?,
        SessionKind::Header => headers.get(sp.name.as_str())?.to_str().ok()?,
    };
    (!t.is_empty() && t.len() <= MAX_TOKEN).then(|| t.to_string())
}

/// Adds the session token to a response: a `Set-Cookie` with the configured attributes, or
/// the configured header.
pub fn set_token(headers: &mut HeaderMap, sp: &SessionPersistence, token: &str) {
    match sp.kind {
        SessionKind::Cookie => {
            let mut c = format!(
                "{}={token}; Path={}",
                sp.name,
                sp.path.as_deref().unwrap_or("/")
            );
            if let Some(ttl) = sp.ttl {
                c.push_str(&format!("; Max-Age={}", ttl.get().as_secs().max(1)));
            }
            if sp.http_only {
                c.push_str("; HttpOnly");
            }
            if sp.secure {
                c.push_str("; Secure");
            }
            if let Some(s) = &sp.same_site {
                c.push_str(&format!("; SameSite={s}"));
            }
            if let Ok(v) = HeaderValue::from_str(&c) {
                headers.append(SET_COOKIE, v);
            }
        }
        SessionKind::Header => {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(sp.name.as_bytes()),
                HeaderValue::from_str(token),
            ) {
                headers.insert(n, v);
            }
        }
    }
}

/// The consistent-hash key of a request; `None` when the header or cookie is missing.
pub fn hash_key(policy: &HashPolicy, headers: &HeaderMap, client: IpAddr) -> Option<Vec<u8>> {
    match &policy.on {
        HashOn::ClientIp => Some(match client {
            IpAddr::V4(v) => v.octets().to_vec(),
            IpAddr::V6(v) => v
                .to_ipv4_mapped()
                .map_or_else(|| v.octets().to_vec(), |v4| v4.octets().to_vec()),
        }),
        HashOn::Header(h) => headers.get(h.as_str()).map(|v| v.as_bytes().to_vec()),
        HashOn::Cookie(c) => cookie(headers, c).map(|v| v.as_bytes().to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sweety_config::Duration;

    fn sp(kind: SessionKind) -> SessionPersistence {
        serde_json::from_value(serde_json::json!({"type": match kind {
            SessionKind::Cookie => "cookie",
            SessionKind::Header => "header",
        }}))
        .unwrap()
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("a=1; sweety-session=abc"));
        h.append(COOKIE, HeaderValue::from_static("b=2"));
        assert_eq!(cookie(&h, "sweety-session"), Some("abc"));
        assert_eq!(cookie(&h, "b"), Some("2"));
        assert_eq!(cookie(&h, "c"), None);
        assert_eq!(
            token_from(&h, &sp(SessionKind::Cookie)).as_deref(),
            Some("abc")
        );
        h.insert(
            COOKIE,
            HeaderValue::from_str(&format!("sweety-session={}", "x".repeat(100))).unwrap(),
        );
        assert_eq!(
            token_from(&h, &sp(SessionKind::Cookie)),
            None,
            "overlong token ignored"
        );
    }

    #[test]
    fn set_cookie_has_the_attributes() {
        let mut s = sp(SessionKind::Cookie);
        s.ttl = Some(Duration::from_secs(3600));
        s.secure = true;
        s.same_site = Some("Lax".into());
        s.path = Some("/app".into());
        let mut h = HeaderMap::new();
        set_token(&mut h, &s, "0123456789abcdef");
        assert_eq!(
            h[SET_COOKIE],
            "sweety-session=0123456789abcdef; Path=/app; Max-Age=3600; HttpOnly; Secure; SameSite=Lax"
        );
        let mut h = HeaderMap::new();
        let mut hs = sp(SessionKind::Header);
        hs.name = "x-session".into();
        set_token(&mut h, &hs, "t1");
        assert_eq!(h["x-session"], "t1");
        h.insert("x-session", HeaderValue::from_static("t1"));
        assert_eq!(token_from(&h, &hs).as_deref(), Some("t1"));
    }

    #[test]
    fn hash_keys() {
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let by_ip = HashPolicy {
            on: HashOn::ClientIp,
            algorithm: Default::default(),
        };
        let h = HeaderMap::new();
        assert_eq!(hash_key(&by_ip, &h, ip), hash_key(&by_ip, &h, mapped));
        let by_header = HashPolicy {
            on: HashOn::Header("x-user".into()),
            algorithm: Default::default(),
        };
        assert_eq!(hash_key(&by_header, &h, ip), None);
        let mut h = HeaderMap::new();
        h.insert("x-user", HeaderValue::from_static("alice"));
        assert_eq!(hash_key(&by_header, &h, ip), Some(b"alice".to_vec()));
    }
}
