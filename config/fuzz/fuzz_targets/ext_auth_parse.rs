//! `ext_auth::parse_auth_url` and `parse_signin` on arbitrary text (an ingress-nginx
//! `auth-url` / `auth-signin`, tenant input). Checks: no panic; an accepted auth URL has a
//! non-zero port, a path starting with `/`, no variable, user information (an `@` before the
//! path; one in the path is a path character) or fragment, and rebuilds to a URL that parses
//! the same; an accepted signin URL's literal parts carry no `$` and it names exactly as many
//! variables as the text has `$`; a filter made of accepted values passes validation.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sweety_config::ext_auth::{check_external_auth, parse_auth_url, parse_signin, Part};
use sweety_config::ExternalAuth;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (first, second) = text.split_once('\n').unwrap_or((text, ""));
    let auth = parse_auth_url(first);
    if let Ok(u) = &auth {
        assert!(u.port != 0 && u.path_and_query.starts_with('/'));
        assert!(!first.contains(['$', '#']));
        // No user information: no `@` before the path (an `@` in the path is a path character).
        let rest = first.split_once("://").map_or("", |(_, r)| r);
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        assert!(!authority.contains('@'), "{first:?}");
        let again = format!(
            "{}://{}{}",
            if u.tls { "https" } else { "http" },
            u.authority(),
            u.path_and_query
        );
        assert_eq!(parse_auth_url(&again).as_ref(), Ok(u));
    }
    let signin = parse_signin(second, "rd");
    if let Ok(s) = &signin {
        let mut vars = 0;
        for p in &s.parts {
            match p {
                Part::Text(t) => assert!(!t.contains('$')),
                Part::Var(_) => vars += 1,
            }
        }
        assert_eq!(vars, second.matches('$').count());
    }
    if auth.is_ok() {
        let mut f = ExternalAuth::new(first);
        f.signin = signin.is_ok().then(|| second.to_string());
        assert!(check_external_auth(&f).is_empty());
    }
});
