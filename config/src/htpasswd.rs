//! Basic authentication: the `basic_auth` route filter ([`BasicAuth`]) and the parser of
//! htpasswd files (the `auth` key of an ingress-nginx `auth-secret`, or one user per key with
//! `auth-secret-type: auth-map`).
//!
//! The text is tenant input. [`parse`] never fails as a whole: each line is an entry, a
//! comment, or rejected with its reason, so one bad line loses nothing else. Accepted hash
//! formats, checked for their exact shape here (the dataplane verifies passwords):
//!
//! - bcrypt `$2y$`, `$2a$`, `$2b$` + two-digit cost (4..=[`MAX_BCRYPT_COST`]) + `$` + 53
//!   characters of bcrypt's alphabet (`htpasswd -B`);
//! - Apache MD5 `$apr1$` + salt (1–8 characters) + `$` + 22 characters (`htpasswd -m`, the
//!   default of `htpasswd`);
//! - `{SHA}` + base64 of a SHA-1 digest (`htpasswd -s`).
//!
//! Refused, each with a reason: crypt(3) DES (13 characters, 8-byte passwords, `htpasswd -d`),
//! plain text (`htpasswd -p`), `$1$` MD5-crypt, `$5$`/`$6$` SHA-crypt, `{SSHA}` and anything
//! else. A bcrypt cost above [`MAX_BCRYPT_COST`] is refused too: each check of such an entry
//! takes over a second of CPU, which anyone can trigger with a wrong password. nginx reads the
//! same file format (`auth_basic_user_file`: `name:hash[:comment]`, `#` comments, the first line
//! of a name wins).

use serde::{Deserialize, Serialize};

/// Most entries one filter (one htpasswd file) may hold.
pub const MAX_USERS: usize = 10_000;
/// Longest user name, bytes.
pub const MAX_USER_BYTES: usize = 256;
/// Longest realm, bytes.
pub const MAX_REALM_BYTES: usize = 256;
/// Highest bcrypt cost accepted (2^14 rounds: about a second of CPU per check).
pub const MAX_BCRYPT_COST: u32 = 14;
/// Longest line read (a longer one is rejected).
pub const MAX_LINE_BYTES: usize = 4096;

/// Require HTTP Basic credentials matching one of `users` (or of the config's user set
/// `user_set`) (401 with `WWW-Authenticate: Basic realm="<realm>"` otherwise). Checked after
/// the IP lists and rate limits, before the other request filters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    /// The realm shown to the client (quoted and escaped by the dataplane).
    #[serde(default)]
    pub realm: String,
    /// Users and their password hashes ([`check_hash`] formats). None (and no `user_set`):
    /// every request is answered 401.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<BasicAuthUser>,
    /// The name of one of the config's `user_sets` whose users these are, instead of
    /// `users` (which must then be empty). A name the config lacks refuses the config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_set: Option<String>,
}

/// A named list of users (one htpasswd file) that `basic_auth` filters share by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSet {
    /// Unique among the config's user sets, not empty.
    pub name: String,
    /// Users and their password hashes, as [`BasicAuth::users`].
    #[serde(default)]
    pub users: Vec<BasicAuthUser>,
}

/// One user of [`BasicAuth`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthUser {
    /// The user name (no `:` and no control characters).
    pub name: String,
    /// The password hash, as in an htpasswd file.
    pub hash: String,
}

impl std::fmt::Debug for BasicAuthUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The hash is a secret: never logged.
        write!(f, "BasicAuthUser({:?}, ..)", self.name)
    }
}

/// The hash formats accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `$2a$`/`$2b$`/`$2y$` bcrypt.
    Bcrypt,
    /// `$apr1$` Apache MD5.
    Apr1,
    /// `{SHA}` SHA-1 (unsalted).
    Sha1,
}

/// A line of an htpasswd file that was not taken, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// 1-based line number (or key index for a map).
    pub line: usize,
    /// The user name, when the line had one.
    pub user: Option<String>,
    /// Why it was rejected.
    pub reason: String,
}

/// Parsed htpasswd: the usable entries, in file order, and the rejected lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Usable users (the first line of a name only).
    pub users: Vec<BasicAuthUser>,
    /// Lines not taken.
    pub rejected: Vec<Rejected>,
}

const BCRYPT_ALPHABET: &[u8] = b"./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn all_in(s: &str, alphabet: &[u8]) -> bool {
    s.bytes().all(|b| alphabet.contains(&b))
}

/// Whether `user` may be a user name.
pub fn check_user(user: &str) -> Result<(), String> {
    if user.is_empty() {
        return Err("empty user name".into());
    }
    if user.len() > MAX_USER_BYTES {
        return Err(format!("user name longer than {MAX_USER_BYTES} bytes"));
    }
    if user.contains(':') || user.chars().any(char::is_control) {
        return Err("user name contains ':' or a control character".into());
    }
    Ok(())
}

/// Whether `realm` may be shown in `WWW-Authenticate` (it is quoted there).
pub fn check_realm(realm: &str) -> Result<(), String> {
    if realm.len() > MAX_REALM_BYTES {
        return Err(format!("longer than {MAX_REALM_BYTES} bytes"));
    }
    if realm.chars().any(|c| c.is_control() || !c.is_ascii()) {
        return Err("contains a control or non-ASCII character".into());
    }
    Ok(())
}

/// The format of a password hash, or why it is refused.
pub fn check_hash(hash: &str) -> Result<Scheme, String> {
    if let Some(rest) = hash
        .strip_prefix("$2y$")
        .or_else(|| hash.strip_prefix("$2a$"))
        .or_else(|| hash.strip_prefix("$2b$"))
    {
        let (cost, tail) = rest
            .split_once('$')
            .ok_or("bcrypt hash without a cost field")?;
        let cost: u32 = (cost.len() == 2 && cost.bytes().all(|b| b.is_ascii_digit()))
            .then(|| cost.parse().ok())
            .flatten()
            .ok_or("bcrypt cost is not two digits")?;
        if !(4..=31).contains(&cost) {
            return Err(format!("bcrypt cost {cost} is not between 4 and 31"));
        }
        if cost > MAX_BCRYPT_COST {
            return Err(format!(
                "bcrypt cost {cost} is above {MAX_BCRYPT_COST}: every wrong password would cost \
                 seconds of CPU"
            ));
        }
        if tail.len() != 53 || !all_in(tail, BCRYPT_ALPHABET) {
            return Err("bcrypt hash is not 53 characters of bcrypt's alphabet".into());
        }
        return Ok(Scheme::Bcrypt);
    }
    if let Some(rest) = hash.strip_prefix("$apr1$") {
        let (salt, digest) = rest.split_once('$').ok_or("$apr1$ hash without a salt")?;
        if salt.is_empty() || salt.len() > 8 || !all_in(salt, BCRYPT_ALPHABET) {
            return Err("$apr1$ salt is not 1-8 characters of ./0-9A-Za-z".into());
        }
        if digest.len() != 22 || !all_in(digest, BCRYPT_ALPHABET) {
            return Err("$apr1$ digest is not 22 characters of ./0-9A-Za-z".into());
        }
        return Ok(Scheme::Apr1);
    }
    if let Some(b64) = hash.strip_prefix("{SHA}") {
        // 20 bytes: 27 characters and one `=`; the last character carries 2 bits, the rest 0.
        let ok = b64.len() == 28
            && b64.ends_with('=')
            && all_in(&b64[..27], B64)
            && B64
                .iter()
                .position(|&c| c == b64.as_bytes()[26])
                .is_some_and(|v| v & 0b11 == 0);
        return if ok {
            Ok(Scheme::Sha1)
        } else {
            Err("{SHA} hash is not the base64 of 20 bytes".into())
        };
    }
    Err(match hash {
        h if h.starts_with("$1$") => {
            "MD5-crypt ($1$) is not supported (use bcrypt or $apr1$)".into()
        }
        h if h.starts_with("$5$") || h.starts_with("$6$") => {
            "SHA-crypt ($5$/$6$) is not supported (use bcrypt)".into()
        }
        h if h.starts_with("$2x$") => "bcrypt $2x$ (the buggy variant) is not supported".into(),
        h if h.starts_with("{SSHA}") => "{SSHA} is not supported (use bcrypt)".into(),
        h if h.len() == 13 && all_in(h, BCRYPT_ALPHABET) => {
            "crypt(3) DES (passwords cut to 8 bytes) is refused (use bcrypt)".into()
        }
        "" => "empty password hash".into(),
        _ => "not a bcrypt, $apr1$ or {SHA} hash (plain text passwords are refused)".into(),
    })
}

/// One entry: `name` and `hash` checked, or why not.
pub fn check_entry(name: &str, hash: &str) -> Result<Scheme, String> {
    check_user(name)?;
    check_hash(hash)
}

/// Parse an htpasswd file (`name:hash[:comment]` per line, `#` comments and blank lines
/// skipped, `\r\n` accepted). The first line of a name wins; later ones are rejected.
pub fn parse(text: &str) -> Parsed {
    let mut out = Parsed::default();
    for (i, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.split_once(':') {
            Some((n, r)) => (n, r),
            None => (line, ""),
        };
        // A comment after the hash is allowed, as nginx allows it.
        let hash = rest.split(':').next().unwrap_or("");
        let user = (!name.is_empty() && name.len() <= MAX_USER_BYTES).then(|| name.to_string());
        let mut reject = |reason: String| {
            out.rejected.push(Rejected {
                line: i + 1,
                user: user.clone(),
                reason,
            })
        };
        if line.len() > MAX_LINE_BYTES {
            reject(format!("line longer than {MAX_LINE_BYTES} bytes"));
            continue;
        }
        if !line.contains(':') {
            reject("not name:hash".into());
            continue;
        }
        if let Err(why) = check_entry(name, hash) {
            reject(why);
            continue;
        }
        add(&mut out, i + 1, name, hash);
    }
    out
}

/// Parse an `auth-map` (user name → hash, one per key).
pub fn parse_map<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Parsed {
    let mut out = Parsed::default();
    for (i, (name, hash)) in entries.into_iter().enumerate() {
        let hash = hash.trim_end_matches(['\r', '\n']);
        match check_entry(name, hash) {
            Ok(_) => add(&mut out, i + 1, name, hash),
            Err(reason) => out.rejected.push(Rejected {
                line: i + 1,
                user: (!name.is_empty() && name.len() <= MAX_USER_BYTES).then(|| name.to_string()),
                reason,
            }),
        }
    }
    out
}

fn add(out: &mut Parsed, line: usize, name: &str, hash: &str) {
    let reject = |reason: &str| Rejected {
        line,
        user: Some(name.to_string()),
        reason: reason.into(),
    };
    if out.users.iter().any(|u| u.name == name) {
        out.rejected.push(reject(
            "the user is listed earlier; the first entry is used",
        ));
    } else if out.users.len() >= MAX_USERS {
        out.rejected
            .push(reject(&format!("more than {MAX_USERS} users")));
    } else {
        out.users.push(BasicAuthUser {
            name: name.to_string(),
            hash: hash.to_string(),
        });
    }
}

/// Problems of a [`BasicAuth`] filter (for validation).
pub fn check_basic_auth(a: &BasicAuth) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Err(e) = check_realm(&a.realm) {
        out.push(("realm".to_string(), e));
    }
    if a.user_set.is_some() && !a.users.is_empty() {
        out.push((
            "users".to_string(),
            "must be empty when user_set names the users".into(),
        ));
    }
    out.extend(check_users(&a.users));
    out
}

/// Problems of a list of users (a [`BasicAuth`]'s or a [`UserSet`]'s): too many, an entry
/// [`check_entry`] refuses, a name listed twice.
pub fn check_users(users: &[BasicAuthUser]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if users.len() > MAX_USERS {
        out.push(("users".to_string(), format!("more than {MAX_USERS} users")));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, u) in users.iter().enumerate() {
        if let Err(e) = check_entry(&u.name, &u.hash) {
            out.push((format!("users[{i}]"), e));
        } else if !seen.insert(u.name.as_str()) {
            out.push((format!("users[{i}].name"), "listed more than once".into()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // A bcrypt-shaped hash; `openssl passwd -apr1 -salt sL5yBeMm secret`; {SHA} of `secret`.
    const BCRYPT: &str = "$2y$05$WKXH0WjVMaTzbeVOeIC0UewSiKW9S3Ok0tsOQMTn/rbP0XyLaqPqa";
    const APR1: &str = "$apr1$sL5yBeMm$Ru3.Rv6KbPb.NJWjCDVKo1";
    const SHA: &str = "{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ=";

    #[test]
    fn formats() {
        assert_eq!(check_hash(BCRYPT), Ok(Scheme::Bcrypt));
        assert_eq!(
            check_hash(&BCRYPT.replace("$2y$", "$2a$")),
            Ok(Scheme::Bcrypt)
        );
        assert_eq!(
            check_hash(&BCRYPT.replace("$2y$", "$2b$")),
            Ok(Scheme::Bcrypt)
        );
        assert_eq!(check_hash(APR1), Ok(Scheme::Apr1));
        assert_eq!(check_hash(SHA), Ok(Scheme::Sha1));
        for (bad, why) in [
            ("rqXexS6ZhobKA", "DES"),
            ("secret", "plain"),
            ("$1$abc$def", "$1$"),
            ("$6$salt$x", "SHA-crypt"),
            ("{SSHA}abc", "SSHA"),
            (&BCRYPT.replace("$2y$", "$2x$"), "$2x$"),
            (&BCRYPT.replace("$05$", "$15$"), "above 14"),
            (&BCRYPT.replace("$05$", "$03$"), "between 4 and 31"),
            (&BCRYPT.replace("$05$", "$5$"), "two digits"),
            (&BCRYPT[..40], "53"),
            ("$apr1$toolongsalt$7IXLbZ/fDu.uYVO38/Fx2/", "salt"),
            ("$apr1$sL5yBeMm$7IXLbZ/fDu", "22"),
            ("{SHA}5en6G6MezRroT3XKqkdPOmY/BfQ", "20 bytes"),
            ("{SHA}5en6G6MezRroT3XKqkdPOmY/BfR=", "20 bytes"),
            ("", "empty"),
        ] {
            let e = check_hash(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn files() {
        let text = format!(
            "# users\r\nalice:{BCRYPT}\r\n\nbob:{APR1}:a comment\ncarol:{SHA}\ndes:rqXexS6ZhobKA\n\
             alice:{SHA}\nnocolon\n:{SHA}\nbad\u{7}name:{SHA}\n"
        );
        let p = parse(&text);
        let names: Vec<&str> = p.users.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["alice", "bob", "carol"]);
        assert_eq!(p.users[0].hash, BCRYPT);
        assert_eq!(p.users[1].hash, APR1);
        let lines: Vec<usize> = p.rejected.iter().map(|r| r.line).collect();
        assert_eq!(lines, [6, 7, 8, 9, 10]);
        assert!(p.rejected[0].reason.contains("DES"));
        assert!(p.rejected[1].reason.contains("earlier"));
        let m = parse_map([("alice", BCRYPT), ("eve", "plain")]);
        assert_eq!(m.users.len(), 1);
        assert_eq!(m.rejected[0].user.as_deref(), Some("eve"));
    }

    #[test]
    fn realms_and_filters() {
        assert!(check_realm("Authentication Required - \"ops\"").is_ok());
        assert!(check_realm("a\r\nSet-Cookie: x").is_err());
        assert!(check_realm("é").is_err());
        assert!(check_realm(&"r".repeat(300)).is_err());
        let f = BasicAuth {
            realm: "x".into(),
            users: vec![
                BasicAuthUser {
                    name: "a".into(),
                    hash: SHA.into(),
                },
                BasicAuthUser {
                    name: "a".into(),
                    hash: SHA.into(),
                },
                BasicAuthUser {
                    name: "b".into(),
                    hash: "plain".into(),
                },
            ],
            user_set: None,
        };
        let problems: Vec<String> = check_basic_auth(&f).into_iter().map(|p| p.0).collect();
        assert_eq!(problems, ["users[1].name", "users[2]"]);
        assert!(!format!("{:?}", f.users[0]).contains("SHA"));
    }

    #[test]
    fn hostile_files_are_bounded() {
        // Many users: the first MAX_USERS are taken, the rest rejected, nothing panics.
        let mut text = String::new();
        for i in 0..MAX_USERS + 3 {
            text.push_str(&format!("u{i}:{SHA}\n"));
        }
        let p = parse(&text);
        assert_eq!(p.users.len(), MAX_USERS);
        assert_eq!(p.rejected.len(), 3);
        let long = format!("{}:{SHA}", "x".repeat(MAX_LINE_BYTES));
        assert_eq!(parse(&long).rejected.len(), 1);
        assert_eq!(parse(&long).rejected[0].user, None);
    }

    mod props {
        use super::super::*;
        use super::{APR1, BCRYPT, SHA};
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any text: every non-blank, non-comment line is either a user or rejected, each
            /// user passes check_entry, and names are unique.
            #[test]
            fn parse_is_total(text in "(?s).{0,2000}") {
                let p = parse(&text);
                let lines = text.split('\n')
                    .map(|l| l.strip_suffix('\r').unwrap_or(l))
                    .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                    .count();
                prop_assert_eq!(p.users.len() + p.rejected.len(), lines);
                for (i, u) in p.users.iter().enumerate() {
                    prop_assert!(check_entry(&u.name, &u.hash).is_ok());
                    prop_assert!(!p.users[..i].iter().any(|o| o.name == u.name));
                }
                let f = BasicAuth { realm: String::new(), users: p.users, user_set: None };
                prop_assert!(check_basic_auth(&f).is_empty());
            }

            /// Lines built from a valid entry plus noise: accepted exactly when check_entry
            /// accepts the pieces.
            #[test]
            fn lines_agree_with_check_entry(
                name in "[a-z:\\x00-\\x09\\x0b\\x0c\\x0e-\\x1f]{0,12}",
                hash in prop_oneof![
                    Just(BCRYPT.to_string()), Just(APR1.to_string()), Just(SHA.to_string()),
                    "[./A-Za-z0-9$]{0,60}".prop_map(String::from),
                ],
                comment in proptest::option::of("[a-z ]{0,10}"),
            ) {
                let line = match &comment {
                    Some(c) => format!("{name}:{hash}:{c}"),
                    None => format!("{name}:{hash}"),
                };
                let p = parse(&line);
                let expect = !line.trim().is_empty()
                    && !line.starts_with('#')
                    && !name.contains(['\r', '\n', ':'])
                    && check_entry(&name, &hash).is_ok();
                prop_assert_eq!(p.users.len() == 1, expect, "{:?}", p);
            }
        }
    }
}
