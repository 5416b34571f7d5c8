//! `htpasswd::parse` on arbitrary text (the `auth` key of an ingress-nginx `auth-secret`, a
//! tenant's Secret). Checks: no panic; every non-blank, non-comment line is either a user or
//! rejected; every user passes `check_entry`, names are unique and at most `MAX_USERS`; the
//! users make a `basic_auth` filter that validation accepts.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sweety_config::htpasswd::{check_basic_auth, check_entry, parse, MAX_USERS};
use sweety_config::BasicAuth;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let p = parse(text);
    let lines = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .count();
    assert_eq!(p.users.len() + p.rejected.len(), lines);
    assert!(p.users.len() <= MAX_USERS);
    for (i, u) in p.users.iter().enumerate() {
        assert!(check_entry(&u.name, &u.hash).is_ok(), "{u:?}");
        assert!(!p.users[..i].iter().any(|o| o.name == u.name));
    }
    let f = BasicAuth {
        realm: String::new(),
        users: p.users,
        user_set: None,
    };
    assert!(check_basic_auth(&f).is_empty());
});
