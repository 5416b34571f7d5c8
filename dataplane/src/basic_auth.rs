//! HTTP Basic authentication (RFC 7617) of routes with a `basic_auth` filter: the one check
//! every protocol (HTTP/1.1, HTTP/2, HTTP/3) goes through, in the pipeline's access phase
//! after the IP lists and limits and before the other request filters, mirrors and the cache
//! (`crate::pipeline`).
//!
//! A request passes when it carries exactly one `Authorization: Basic <base64(user:password)>`
//! whose user is listed and whose password matches the user's htpasswd hash; anything else
//! (no header, two headers, another scheme, bad base64, no `:`, an unknown user, a wrong
//! password, a header over [`MAX_HEADER_BYTES`]) is answered 401 with
//! `WWW-Authenticate: Basic realm="…"` (the realm quoted, `"` and `\` escaped). The
//! `Authorization` header is passed to the backend, as nginx does.
//!
//! Hashes ([`sweety_config::htpasswd`] checks their shape): `{SHA}` (SHA-1, compared in
//! constant time), `$apr1$` (Apache's MD5-crypt: 1,000 MD5 rounds, computed here after the
//! FreeBSD md5crypt scheme Apache's `apr_md5.c` uses with the magic `$apr1$`; compared in
//! constant time) and bcrypt (the `bcrypt` crate, which compares in constant time). bcrypt is
//! deliberately slow (cost 10: tens of milliseconds of CPU), so it runs on the blocking pool and
//! at most [`bcrypt_slots`] checks run at once; a request that waits longer than
//! [`BCRYPT_QUEUE_TIMEOUT`] for a slot is answered 503 with `Retry-After` (a flood of wrong
//! passwords costs bounded CPU and never blocks the event loop). An unknown user's password is
//! checked against the costliest of the route's hashes (the answer ignored, through the same
//! bcrypt slots), so an unknown user is refused no faster than a known one with a wrong
//! password: timing does not tell which users exist.

use crate::body::{text_response, Body};
use base64::Engine as _;
use http::header::{HeaderMap, HeaderValue, AUTHORIZATION, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{Response, StatusCode};
use md5::{Digest as _, Md5};
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use subtle::ConstantTimeEq;
use sweety_config::htpasswd::{check_hash, Scheme};
use sweety_config::BasicAuth;
use tokio::sync::Semaphore;

/// Longest `Authorization` value read; a longer one is refused (401).
pub const MAX_HEADER_BYTES: usize = 4096;
/// Longest wait for a bcrypt slot before 503.
pub const BCRYPT_QUEUE_TIMEOUT: Duration = Duration::from_secs(2);

/// bcrypt checks running at once, process-wide: the number of CPUs.
pub fn bcrypt_slots() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

static BCRYPT: LazyLock<Semaphore> = LazyLock::new(|| Semaphore::new(bcrypt_slots()));

/// How one user's password is checked.
#[derive(Clone)]
enum Verifier {
    Bcrypt(Arc<str>),
    Apr1 { salt: Box<str>, digest: Box<[u8]> },
    Sha1([u8; 20]),
}

/// The compiled `basic_auth` filter of one route.
pub struct BasicAuthRules {
    challenge: HeaderValue,
    users: HashMap<Box<[u8]>, Verifier>,
    /// What an unknown user's password is checked against, the answer ignored: the costliest
    /// of the users' verifiers, so that an unknown user costs what a wrong password does (no
    /// user enumeration by timing) and waits for the same bcrypt slots.
    decoy: Option<Verifier>,
}

impl Verifier {
    /// The work one check takes, to pick the decoy: bcrypt by cost, then `$apr1$`, `{SHA}`.
    fn work(&self) -> u32 {
        match self {
            Verifier::Bcrypt(h) => 2 + h.get(4..6).and_then(|c| c.parse().ok()).unwrap_or(0),
            Verifier::Apr1 { .. } => 1,
            Verifier::Sha1(_) => 0,
        }
    }

    /// Whether `password` matches (`Err`: 503, every bcrypt slot stayed busy).
    async fn verify(&self, password: Vec<u8>) -> Result<bool, Response<Body>> {
        Ok(match self {
            Verifier::Sha1(d) => {
                let got: [u8; 20] = sha1::Sha1::digest(&password).into();
                bool::from(got.ct_eq(d))
            }
            Verifier::Apr1 { salt, digest } => {
                let got = apr1_digest(&password, salt.as_bytes());
                bool::from(got.as_slice().ct_eq(digest))
            }
            Verifier::Bcrypt(hash) => {
                let permit =
                    match tokio::time::timeout(BCRYPT_QUEUE_TIMEOUT, BCRYPT.acquire()).await {
                        Ok(Ok(p)) => p,
                        _ => return Err(busy()),
                    };
                let hash = hash.clone();
                // The permit moves into the blocking task: a request dropped meanwhile (the
                // client went away) cannot free the slot while its bcrypt still runs, so at
                // most `bcrypt_slots` checks burn CPU at once whatever clients do.
                tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    bcrypt::verify(&password, &hash).unwrap_or(false)
                })
                .await
                .unwrap_or(false)
            }
        })
    }
}

impl std::fmt::Debug for BasicAuthRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BasicAuthRules({} users)", self.users.len())
    }
}

/// `Basic realm="<realm>"` with `"` and `\` escaped (RFC 9110 quoted-string).
pub fn challenge(realm: &str) -> HeaderValue {
    let mut v = String::with_capacity(realm.len() + 16);
    v.push_str("Basic realm=\"");
    for c in realm.chars() {
        if c == '"' || c == '\\' {
            v.push('\\');
        }
        v.push(c);
    }
    v.push('"');
    // Validation refuses control and non-ASCII characters; anything left over falls back.
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("Basic realm=\"\""))
}

impl BasicAuthRules {
    /// Compiles the filter (validated: an entry whose hash does not check is left out, so it
    /// never matches).
    pub fn new(a: &BasicAuth) -> BasicAuthRules {
        let mut users = HashMap::new();
        for u in &a.users {
            let v = match check_hash(&u.hash) {
                Ok(Scheme::Bcrypt) => Verifier::Bcrypt(Arc::from(u.hash.as_str())),
                Ok(Scheme::Apr1) => {
                    let rest = &u.hash["$apr1$".len()..];
                    let Some((salt, digest)) = rest.split_once('$') else {
                        continue;
                    };
                    Verifier::Apr1 {
                        salt: salt.into(),
                        digest: digest.as_bytes().into(),
                    }
                }
                Ok(Scheme::Sha1) => {
                    let Ok(d) = base64::engine::general_purpose::STANDARD.decode(&u.hash[5..])
                    else {
                        continue;
                    };
                    let Ok(d) = <[u8; 20]>::try_from(d.as_slice()) else {
                        continue;
                    };
                    Verifier::Sha1(d)
                }
                Err(_) => continue,
            };
            users
                .entry(u.name.as_bytes().to_vec().into_boxed_slice())
                .or_insert(v);
        }
        let decoy = users.values().max_by_key(|v| v.work()).cloned();
        BasicAuthRules {
            challenge: challenge(&a.realm),
            users,
            decoy,
        }
    }

    /// Checks the request's credentials: `Ok` to go on, or the answer (401, or 503 when every
    /// bcrypt slot stayed busy).
    pub async fn check(&self, headers: &HeaderMap) -> Result<(), Response<Body>> {
        let Some((user, password)) = credentials(headers) else {
            return Err(self.unauthorized());
        };
        let ok = match self.users.get(user.as_slice()) {
            Some(v) => v.verify(password).await?,
            // An unknown user does a wrong password's work, then is refused.
            None => {
                if let Some(d) = &self.decoy {
                    d.verify(password).await?;
                }
                false
            }
        };
        if ok {
            Ok(())
        } else {
            Err(self.unauthorized())
        }
    }

    fn unauthorized(&self) -> Response<Body> {
        let mut r = text_response(StatusCode::UNAUTHORIZED, "401 Unauthorized\n");
        r.headers_mut()
            .insert(WWW_AUTHENTICATE, self.challenge.clone());
        r
    }
}

fn busy() -> Response<Body> {
    let mut r = text_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "503 Service Unavailable: too many password checks in progress, retry later\n",
    );
    r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1u32));
    r
}

/// User and password of the request's one `Authorization: Basic` header.
pub fn credentials(headers: &HeaderMap) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut all = headers.get_all(AUTHORIZATION).iter();
    let value = all.next()?;
    if all.next().is_some() || value.len() > MAX_HEADER_BYTES {
        return None;
    }
    let value = value.as_bytes();
    let sp = value.iter().position(|&b| b == b' ')?;
    if !value[..sp].eq_ignore_ascii_case(b"basic") {
        return None;
    }
    let token = value[sp..].trim_ascii();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token)
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some((decoded[..colon].to_vec(), decoded[colon + 1..].to_vec()))
}

const ITOA64: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The 22-character digest of Apache's `$apr1$` MD5-crypt of `password` with `salt` (at most
/// 8 bytes are used, as Apache does).
pub fn apr1_digest(password: &[u8], salt: &[u8]) -> Vec<u8> {
    const MAGIC: &[u8] = b"$apr1$";
    let salt = &salt[..salt.len().min(8)];
    let mut ctx = Md5::new();
    ctx.update(password);
    ctx.update(MAGIC);
    ctx.update(salt);
    let alt = {
        let mut a = Md5::new();
        a.update(password);
        a.update(salt);
        a.update(password);
        a.finalize()
    };
    let mut left = password.len();
    while left > 0 {
        let n = left.min(16);
        ctx.update(&alt[..n]);
        left -= n;
    }
    let mut i = password.len();
    while i != 0 {
        if i & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&password[..1]);
        }
        i >>= 1;
    }
    let mut fin = ctx.finalize();
    for round in 0..1000 {
        let mut c = Md5::new();
        if round & 1 == 1 {
            c.update(password);
        } else {
            c.update(fin);
        }
        if round % 3 != 0 {
            c.update(salt);
        }
        if round % 7 != 0 {
            c.update(password);
        }
        if round & 1 == 1 {
            c.update(fin);
        } else {
            c.update(password);
        }
        fin = c.finalize();
    }
    let mut out = Vec::with_capacity(22);
    let mut put = |mut v: u32, n: usize| {
        for _ in 0..n {
            out.push(ITOA64[(v & 0x3f) as usize]);
            v >>= 6;
        }
    };
    let f = |i: usize| u32::from(fin[i]);
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        put(f(a) << 16 | f(b) << 8 | f(c), 4);
    }
    put(f(11), 2);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn basic(user_pass: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_pass)
        )
    }

    /// Tests that take bcrypt slots (process-wide) run one at a time.
    static SLOTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    fn rules(users: &[(&str, &str)]) -> BasicAuthRules {
        BasicAuthRules::new(&BasicAuth {
            realm: "r".into(),
            users: users
                .iter()
                .map(|(n, h)| sweety_config::BasicAuthUser {
                    name: n.to_string(),
                    hash: h.to_string(),
                })
                .collect(),
            user_set: None,
        })
    }

    /// Waits (bounded) until `n` bcrypt slots are free.
    async fn until_free(n: usize) -> usize {
        for _ in 0..20_000 {
            if BCRYPT.available_permits() == n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        BCRYPT.available_permits()
    }

    /// A request dropped while its bcrypt runs (the client went away) keeps the slot until
    /// bcrypt ends: clients that hang up cannot run more than `bcrypt_slots` checks at once.
    #[tokio::test]
    async fn dropped_request_keeps_its_bcrypt_slot() {
        let _serial = SLOTS.lock().await;
        let slots = bcrypt_slots();
        let held = BCRYPT.acquire_many(slots as u32 - 1).await.unwrap();
        let hash = bcrypt::hash("pw", 8).unwrap();
        let r = Arc::new(rules(&[("alice", &hash)]));
        let task = tokio::spawn({
            let r = r.clone();
            async move { r.check(&headers(&[&basic("alice:wrong")])).await.is_ok() }
        });
        assert_eq!(until_free(0).await, 0, "the check takes the last slot");
        task.abort();
        assert!(task.await.is_err(), "the request was dropped mid-check");
        assert_eq!(
            BCRYPT.available_permits(),
            0,
            "a dropped request freed its slot while its bcrypt still ran"
        );
        assert_eq!(until_free(1).await, 1, "the slot is back when bcrypt ends");
        drop(held);
    }

    /// An unknown user's password is checked like a known user's (against the costliest
    /// hash, through the bcrypt slots): with every slot taken it waits and gets the same 503
    /// as a known user, not a quick 401 that would tell it apart.
    #[tokio::test]
    async fn unknown_users_do_a_wrong_passwords_work() {
        let _serial = SLOTS.lock().await;
        let hash = bcrypt::hash("pw", 4).unwrap();
        let r = rules(&[
            ("carol", "{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ="),
            ("alice", &hash),
        ]);
        let held = BCRYPT.acquire_many(bcrypt_slots() as u32).await.unwrap();
        for who in ["alice:wrong", "mallory:wrong"] {
            let resp = r.check(&headers(&[&basic(who)])).await.unwrap_err();
            assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{who}");
        }
        drop(held);
        for who in ["alice:wrong", "mallory:pw", "carol:wrong"] {
            let resp = r.check(&headers(&[&basic(who)])).await.unwrap_err();
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{who}");
        }
        assert!(r.check(&headers(&[&basic("alice:pw")])).await.is_ok());
        assert!(r.check(&headers(&[&basic("carol:secret")])).await.is_ok());
        // Without bcrypt users no slot is taken.
        let held = BCRYPT.acquire_many(bcrypt_slots() as u32).await.unwrap();
        let sha = rules(&[("carol", "{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=")]);
        let resp = sha
            .check(&headers(&[&basic("mallory:x")]))
            .await
            .unwrap_err();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        drop(held);
    }

    #[test]
    fn apr1_matches_openssl() {
        // `openssl passwd -apr1 -salt <salt> <password>`.
        for (pw, salt, digest) in [
            ("secret", "sL5yBeMm", "Ru3.Rv6KbPb.NJWjCDVKo1"),
            ("", "x", "tMwYqBfQwi3FYAr0aJc8M/"),
            (
                "a much longer password than sixteen bytes",
                "12345678",
                "RkSsHiO1RUdjaoav57ZaW/",
            ),
        ] {
            assert_eq!(
                String::from_utf8(apr1_digest(pw.as_bytes(), salt.as_bytes())).unwrap(),
                digest,
                "{pw:?}"
            );
        }
    }

    #[test]
    fn credentials_are_strict() {
        assert_eq!(
            credentials(&headers(&[&basic("alice:se:cret")])),
            Some((b"alice".to_vec(), b"se:cret".to_vec()))
        );
        assert_eq!(
            credentials(&headers(
                &[&basic("alice:secret").replace("Basic", "bAsIc")]
            )),
            Some((b"alice".to_vec(), b"secret".to_vec()))
        );
        for bad in [
            vec![],
            vec!["Bearer abc".to_string()],
            vec![basic("nocolon")],
            vec!["Basic !!!".to_string()],
            vec!["Basic".to_string()],
            vec![basic("a:b"), basic("a:b")],
            vec![format!("Basic {}", "A".repeat(MAX_HEADER_BYTES))],
        ] {
            let refs: Vec<&str> = bad.iter().map(String::as_str).collect();
            assert_eq!(credentials(&headers(&refs)), None, "{bad:?}");
        }
    }

    #[test]
    fn challenges_are_quoted() {
        assert_eq!(challenge("ops"), "Basic realm=\"ops\"");
        assert_eq!(challenge("a\"b\\c"), "Basic realm=\"a\\\"b\\\\c\"");
        assert_eq!(challenge("bad\r\nx"), "Basic realm=\"\"");
    }

    proptest::proptest! {
        /// Any header value: `credentials` never panics, and what it returns re-encodes to
        /// the header's token.
        #[test]
        fn credentials_total(v in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            if let Ok(hv) = HeaderValue::from_bytes(&v) {
                let mut h = HeaderMap::new();
                h.insert(AUTHORIZATION, hv);
                if let Some((u, p)) = credentials(&h) {
                    proptest::prop_assert!(!u.contains(&b':'));
                    let mut joined = u.clone();
                    joined.push(b':');
                    joined.extend_from_slice(&p);
                    let token = v[v.iter().position(|&b| b == b' ').unwrap()..].trim_ascii();
                    let encoded = base64::engine::general_purpose::STANDARD.encode(&joined);
                    proptest::prop_assert_eq!(encoded.as_bytes(), token);
                }
            }
        }
    }
}
