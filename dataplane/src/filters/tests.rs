//! Unit tests of every filter, and table tests of the rewrite and redirect path, port and
//! scheme rules.

use super::*;
use http_body::Body as _;
use sweety_config::HeaderValue as Hv;

// ---- helpers ----

fn hv(name: &str, value: &str) -> Hv {
    Hv {
        name: name.into(),
        value: value.into(),
    }
}

fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
    let mut b = http::Request::builder().method(method).uri(uri);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(()).unwrap().into_parts().0
}

fn compile(filters: Vec<Filter>) -> CompiledFilters {
    CompiledFilters::compile(&filters).unwrap()
}

fn values(h: &HeaderMap, name: &str) -> Vec<String> {
    h.get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

fn respond(outcome: RequestOutcome) -> Response<Body> {
    match outcome {
        RequestOutcome::Respond(r) => r,
        RequestOutcome::Continue => panic!("expected a response, got Continue"),
    }
}

fn is_continue(outcome: &RequestOutcome) -> bool {
    matches!(outcome, RequestOutcome::Continue)
}

fn response_parts(headers: &[(&str, &str)]) -> http::response::Parts {
    let mut b = http::Response::builder().status(200);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(()).unwrap().into_parts().0
}

// ---- compile errors ----

#[test]
fn compile_errors_say_which_filter_and_why() {
    let bad_name = HeaderModifier {
        set: vec![hv("bad name", "v")],
        ..Default::default()
    };
    let bad_value = HeaderModifier {
        add: vec![hv("x-ok", "line\nbreak")],
        ..Default::default()
    };
    let bad_remove = HeaderModifier {
        remove: vec!["bad:name".into()],
        ..Default::default()
    };
    let cases: Vec<(Vec<Filter>, &str, &str)> = vec![
        (
            vec![Filter::RequestHeaders(bad_name.clone())],
            "filters[0] (request_headers)",
            "bad name",
        ),
        (
            vec![
                Filter::Mirror(Mirror {
                    backend: "m".into(),
                    percent: 100.0,
                }),
                Filter::ResponseHeaders(bad_value),
            ],
            "filters[1] (response_headers)",
            "x-ok",
        ),
        (
            vec![Filter::RequestHeaders(bad_remove)],
            "filters[0] (request_headers)",
            "bad:name",
        ),
        (
            vec![Filter::Redirect(Redirect {
                status: 200,
                ..Default::default()
            })],
            "filters[0] (redirect)",
            "200",
        ),
        (
            vec![Filter::Redirect(Redirect {
                status: 1000,
                ..Default::default()
            })],
            "filters[0] (redirect)",
            "1000",
        ),
        (
            vec![Filter::Rewrite(UrlRewrite {
                host: Some("bad host".into()),
                path: None,
            })],
            "filters[0] (rewrite)",
            "bad host",
        ),
        (
            vec![Filter::Cors(Cors {
                allow_origins: vec!["https://*.*.example".into()],
                ..Default::default()
            })],
            "filters[0] (cors)",
            "more than one",
        ),
        (
            vec![Filter::Cors(Cors {
                allow_headers: vec!["bad header".into()],
                ..Default::default()
            })],
            "filters[0] (cors)",
            "bad header",
        ),
        (
            vec![Filter::Cors(Cors::default()), Filter::Cors(Cors::default())],
            "filters[1] (cors)",
            "only one",
        ),
    ];
    for (filters, which, why) in cases {
        let err = CompiledFilters::compile(&filters).unwrap_err();
        assert!(
            err.starts_with(which),
            "{err:?} should start with {which:?}"
        );
        assert!(err.contains(why), "{err:?} should mention {why:?}");
    }
}

#[test]
fn empty_filters() {
    let f = compile(vec![]);
    assert!(f.is_empty());
    let mut req = parts("GET", "/x?y=1", &[("host", "a.test")]);
    assert!(is_continue(&f.on_request(&mut req, "http", 80, Some("/"))));
    assert_eq!(req.uri, "/x?y=1");
    let mut resp = response_parts(&[("x", "1")]);
    f.on_response(Some(&HeaderValue::from_static("https://a.test")), &mut resp);
    assert_eq!(resp.headers.len(), 1);
    assert!(!compile(vec![Filter::Cors(Cors::default())]).is_empty());
}

// ---- header modifiers ----

#[test]
fn request_header_modifier_set_add_remove() {
    let f = compile(vec![Filter::RequestHeaders(HeaderModifier {
        set: vec![hv("X-Set", "new"), hv("x-fresh", "f")],
        add: vec![hv("x-add", "two"), hv("x-new-add", "n")],
        remove: vec!["X-Remove".into()],
    })]);
    let mut req = parts(
        "GET",
        "/",
        &[
            ("x-set", "old1"),
            ("x-set", "old2"),
            ("x-add", "one"),
            ("x-remove", "r"),
            ("x-keep", "k"),
        ],
    );
    assert!(is_continue(&f.on_request(&mut req, "http", 80, None)));
    assert_eq!(values(&req.headers, "x-set"), ["new"]);
    assert_eq!(values(&req.headers, "x-fresh"), ["f"]);
    assert_eq!(values(&req.headers, "x-add"), ["one", "two"]);
    assert_eq!(values(&req.headers, "x-new-add"), ["n"]);
    assert!(req.headers.get("x-remove").is_none());
    assert_eq!(values(&req.headers, "x-keep"), ["k"]);
}

#[test]
fn request_header_modifiers_apply_in_config_order() {
    let f = compile(vec![
        Filter::RequestHeaders(HeaderModifier {
            set: vec![hv("x-a", "1")],
            ..Default::default()
        }),
        Filter::RequestHeaders(HeaderModifier {
            add: vec![hv("x-a", "2")],
            ..Default::default()
        }),
        Filter::RequestHeaders(HeaderModifier {
            remove: vec!["x-b".into()],
            set: vec![hv("x-c", "3")],
            ..Default::default()
        }),
    ]);
    let mut req = parts("GET", "/", &[("x-a", "0"), ("x-b", "b")]);
    f.on_request(&mut req, "http", 80, None);
    assert_eq!(values(&req.headers, "x-a"), ["1", "2"]);
    assert!(req.headers.get("x-b").is_none());
    assert_eq!(values(&req.headers, "x-c"), ["3"]);
}

#[test]
fn response_header_modifier() {
    let f = compile(vec![
        Filter::ResponseHeaders(HeaderModifier {
            set: vec![hv("server", "sweety")],
            add: vec![hv("x-add", "b")],
            remove: vec!["x-internal".into()],
        }),
        Filter::ResponseHeaders(HeaderModifier {
            add: vec![hv("x-add", "c")],
            ..Default::default()
        }),
    ]);
    let mut req = parts("GET", "/", &[("x-internal", "req")]);
    f.on_request(&mut req, "http", 80, None);
    assert_eq!(
        values(&req.headers, "x-internal"),
        ["req"],
        "request untouched"
    );
    let mut resp = response_parts(&[
        ("server", "backend"),
        ("x-add", "a"),
        ("x-internal", "secret"),
    ]);
    f.on_response(None, &mut resp);
    assert_eq!(values(&resp.headers, "server"), ["sweety"]);
    assert_eq!(values(&resp.headers, "x-add"), ["a", "b", "c"]);
    assert!(resp.headers.get("x-internal").is_none());
}

#[test]
fn modify_headers_uncompiled() {
    let mut h = HeaderMap::new();
    h.insert("x-set", HeaderValue::from_static("old"));
    h.insert("x-remove", HeaderValue::from_static("r"));
    h.insert("x-add", HeaderValue::from_static("1"));
    modify_headers(
        &mut h,
        &HeaderModifier {
            set: vec![hv("x-set", "new"), hv("bad name", "skipped")],
            add: vec![hv("x-add", "2"), hv("x-bad-value", "a\nb")],
            remove: vec!["x-remove".into()],
        },
    );
    assert_eq!(values(&h, "x-set"), ["new"]);
    assert_eq!(values(&h, "x-add"), ["1", "2"]);
    assert!(h.get("x-remove").is_none());
    assert!(h.get("x-bad-value").is_none());
    assert_eq!(h.len(), 3);
}

// ---- rewrite ----

#[test]
fn replace_prefix_rules() {
    // (matched prefix, replacement, request path, expected path)
    let cases = [
        ("/foo", "/bar", "/foo/x", "/bar/x"),
        ("/foo", "/bar", "/foo", "/bar"),
        ("/foo", "/bar", "/foo/", "/bar/"),
        ("/foo", "/bar/", "/foo/x", "/bar/x"),
        ("/foo", "/bar/", "/foo", "/bar"),
        ("/foo", "/", "/foo/x", "/x"),
        ("/foo", "/", "/foo", "/"),
        ("/foo", "/", "/foo/", "/"),
        ("/foo/", "/bar", "/foo/x", "/bar/x"),
        ("/", "/bar", "/x/y", "/bar/x/y"),
        ("/", "/bar", "/", "/bar/"),
        ("/", "/", "/x", "/x"),
        ("/prefix/one", "/one", "/prefix/one/two", "/one/two"),
        ("/a/b", "/c/d/e", "/a/b/f", "/c/d/e/f"),
        ("/foo", "/bar", "/foobar", "/foobar"),
    ];
    for (prefix, replacement, path, want) in cases {
        assert_eq!(
            replace_prefix(path, prefix, replacement),
            want,
            "{prefix} -> {replacement} on {path}"
        );
    }
}

fn rewrite(host: Option<&str>, path: Option<PathRewrite>) -> CompiledFilters {
    compile(vec![Filter::Rewrite(UrlRewrite {
        host: host.map(Into::into),
        path,
    })])
}

#[test]
fn rewrite_path_full_and_prefix_keep_query() {
    // (rewrite, matched prefix, request uri, expected uri)
    let cases = [
        (
            PathRewrite::Full("/new".into()),
            Some("/old"),
            "/old/x?a=1&b=2",
            "/new?a=1&b=2",
        ),
        (PathRewrite::Full("/new".into()), None, "/exact", "/new"),
        (
            PathRewrite::Prefix("/v2".into()),
            Some("/v1"),
            "/v1/items?id=3",
            "/v2/items?id=3",
        ),
        (PathRewrite::Prefix("/v2".into()), Some("/v1"), "/v1", "/v2"),
        (
            PathRewrite::Prefix("/".into()),
            Some("/strip"),
            "/strip/x?q",
            "/x?q",
        ),
        (
            PathRewrite::Prefix("/".into()),
            Some("/strip"),
            "/strip",
            "/",
        ),
        (
            PathRewrite::Prefix("/new".into()),
            None,
            "/exact?q=1",
            "/exact?q=1",
        ),
        (
            PathRewrite::Full("/new".into()),
            None,
            "http://a.test/old?q=1",
            "http://a.test/new?q=1",
        ),
    ];
    for (rw, prefix, uri, want) in cases {
        let f = rewrite(None, Some(rw.clone()));
        let mut req = parts("GET", uri, &[]);
        assert!(is_continue(&f.on_request(&mut req, "http", 80, prefix)));
        assert_eq!(
            req.uri.to_string(),
            want,
            "{rw:?} with prefix {prefix:?} on {uri}"
        );
    }
}

#[test]
fn regex_rewrite_replaces_the_whole_path_as_nginx_rewrite() {
    let rx = |pattern: &str, substitution: &str| PathRewrite::Regex {
        pattern: pattern.into(),
        substitution: substitution.into(),
    };
    // (rewrite, request uri, expected uri)
    let cases = [
        // The ingress-nginx examples: groups in any order, query kept.
        (
            rx("(?i)/something(/|$)(.*)", "/$2"),
            "/something/new?x=1",
            "/new?x=1",
        ),
        (rx("(?i)/something(/|$)(.*)", "/$2"), "/something", "/"),
        (
            rx("(?i)/api/(v[0-9]+)/(.*)", "/$2/$1"),
            "/API/v2/users/7",
            "/users/7/v2",
        ),
        // Searched, not anchored; the whole path is replaced, not only the match.
        (rx("b/(c)", "/x/$1"), "/a/b/c/d", "/x/c"),
        // No match: the path is kept.
        (rx("^/nope/(.*)", "/$1"), "/a/b", "/a/b"),
        // An unmatched group is empty; `$9` of a pattern with fewer groups too.
        (rx("^/(a)?(b)", "/$1-$2-$9"), "/b", "/-b-"),
        // A group next to a literal `.` cannot make a dot segment, nor `//` a second one.
        (rx("^/p/([^/]*)", "/$1./"), "/p/.", "/"),
        (rx("^/p/([^/]*)", "/$1/x"), "/p/..", "/x"),
        (rx("^/p/(.*)", "//$1"), "/p/q", "/q"),
        // A substitution not starting with `/` gets one.
        (rx("^/(.*)", "$1"), "/z", "/z"),
    ];
    for (rw, uri, want) in cases {
        let f = rewrite(None, Some(rw.clone()));
        let mut req = parts("GET", uri, &[]);
        assert!(is_continue(&f.on_request(&mut req, "http", 80, None)));
        assert_eq!(req.uri.to_string(), want, "{rw:?} on {uri}");
    }
}

#[test]
fn rewrite_host_sets_header_and_authority() {
    let f = rewrite(Some("internal.svc"), None);
    let mut origin_form = parts("GET", "/p?q=1", &[("host", "public.test:8080")]);
    f.on_request(&mut origin_form, "http", 8080, None);
    assert_eq!(header(&origin_form.headers, "host"), Some("internal.svc"));
    assert_eq!(
        origin_form.uri, "/p?q=1",
        "no authority added to an origin-form URI"
    );

    let mut absolute = parts(
        "GET",
        "https://public.test:8443/p?q=1",
        &[("host", "public.test:8443")],
    );
    f.on_request(&mut absolute, "https", 8443, None);
    assert_eq!(header(&absolute.headers, "host"), Some("internal.svc"));
    assert_eq!(absolute.uri.to_string(), "https://internal.svc/p?q=1");
}

#[test]
fn rewrite_host_and_prefix_together() {
    let f = rewrite(Some("b.test"), Some(PathRewrite::Prefix("/api".into())));
    let mut req = parts("GET", "http://a.test/v1/x?z", &[("host", "a.test")]);
    f.on_request(&mut req, "http", 80, Some("/v1"));
    assert_eq!(req.uri.to_string(), "http://b.test/api/x?z");
    assert_eq!(header(&req.headers, "host"), Some("b.test"));
}

// ---- redirect ----

struct RedirectCase {
    name: &'static str,
    redirect: Redirect,
    scheme: &'static str,
    listener_port: u16,
    uri: &'static str,
    host: &'static str,
    prefix: Option<&'static str>,
    location: &'static str,
}

fn redir(
    scheme: Option<&str>,
    host: Option<&str>,
    port: Option<u16>,
    path: Option<PathRewrite>,
) -> Redirect {
    Redirect {
        scheme: scheme.map(Into::into),
        host: host.map(Into::into),
        port,
        path,
        status: 302,
    }
}

#[test]
fn redirect_location_rules() {
    let base = || RedirectCase {
        name: "",
        redirect: redir(None, None, None, None),
        scheme: "http",
        listener_port: 80,
        uri: "/p",
        host: "a.test",
        prefix: None,
        location: "",
    };
    let cases = vec![
        RedirectCase {
            name: "defaults on port 80",
            location: "http://a.test/p",
            ..base()
        },
        RedirectCase {
            name: "no scheme, no port: listener port kept",
            listener_port: 8080,
            host: "a.test:8080",
            location: "http://a.test:8080/p",
            ..base()
        },
        RedirectCase {
            name: "no scheme, https on 443: port omitted",
            scheme: "https",
            listener_port: 443,
            location: "https://a.test/p",
            ..base()
        },
        RedirectCase {
            name: "no scheme, https listener on 8443",
            scheme: "https",
            listener_port: 8443,
            location: "https://a.test:8443/p",
            ..base()
        },
        RedirectCase {
            name: "scheme https: well-known port 443, omitted",
            redirect: redir(Some("https"), None, None, None),
            listener_port: 8080,
            location: "https://a.test/p",
            ..base()
        },
        RedirectCase {
            name: "scheme http from https: port 80, omitted",
            redirect: redir(Some("http"), None, None, None),
            scheme: "https",
            listener_port: 8443,
            location: "http://a.test/p",
            ..base()
        },
        RedirectCase {
            name: "scheme is case-insensitive",
            redirect: redir(Some("HTTPS"), None, None, None),
            location: "https://a.test/p",
            ..base()
        },
        RedirectCase {
            name: "unknown scheme: listener port",
            redirect: redir(Some("ftp"), None, None, None),
            listener_port: 2121,
            location: "ftp://a.test:2121/p",
            ..base()
        },
        RedirectCase {
            name: "explicit port kept",
            redirect: redir(None, None, Some(8081), None),
            location: "http://a.test:8081/p",
            ..base()
        },
        RedirectCase {
            name: "explicit well-known port omitted",
            redirect: redir(Some("https"), None, Some(443), None),
            listener_port: 8080,
            location: "https://a.test/p",
            ..base()
        },
        RedirectCase {
            name: "explicit port 80 on https kept",
            redirect: redir(Some("https"), None, Some(80), None),
            location: "https://a.test:80/p",
            ..base()
        },
        RedirectCase {
            name: "explicit port 443 on http kept",
            redirect: redir(None, None, Some(443), None),
            location: "http://a.test:443/p",
            ..base()
        },
        RedirectCase {
            name: "host replaced",
            redirect: redir(None, Some("b.test"), None, None),
            location: "http://b.test/p",
            ..base()
        },
        RedirectCase {
            name: "host replaced, listener port kept",
            redirect: redir(None, Some("b.test"), None, None),
            listener_port: 8080,
            location: "http://b.test:8080/p",
            ..base()
        },
        RedirectCase {
            name: "host from absolute URI",
            uri: "http://c.test:8080/p",
            host: "ignored.test",
            location: "http://c.test/p",
            ..base()
        },
        RedirectCase {
            name: "IPv6 request host",
            host: "[::1]:80",
            location: "http://[::1]/p",
            ..base()
        },
        RedirectCase {
            name: "query kept",
            uri: "/p?a=1&b=%20",
            location: "http://a.test/p?a=1&b=%20",
            ..base()
        },
        RedirectCase {
            name: "full path",
            redirect: redir(None, None, None, Some(PathRewrite::Full("/new".into()))),
            uri: "/old/deep?x=1",
            location: "http://a.test/new?x=1",
            ..base()
        },
        RedirectCase {
            name: "prefix path",
            redirect: redir(None, None, None, Some(PathRewrite::Prefix("/bar".into()))),
            uri: "/foo/x",
            prefix: Some("/foo"),
            location: "http://a.test/bar/x",
            ..base()
        },
        RedirectCase {
            name: "prefix path, whole prefix",
            redirect: redir(None, None, None, Some(PathRewrite::Prefix("/bar".into()))),
            uri: "/foo",
            prefix: Some("/foo"),
            location: "http://a.test/bar",
            ..base()
        },
        RedirectCase {
            name: "prefix path to root",
            redirect: redir(None, None, None, Some(PathRewrite::Prefix("/".into()))),
            uri: "/foo/x?q",
            prefix: Some("/foo"),
            location: "http://a.test/x?q",
            ..base()
        },
        RedirectCase {
            name: "everything at once",
            redirect: redir(
                Some("https"),
                Some("secure.test"),
                Some(8443),
                Some(PathRewrite::Full("/login".into())),
            ),
            uri: "/account?next=%2F",
            location: "https://secure.test:8443/login?next=%2F",
            ..base()
        },
    ];
    for c in cases {
        let f = compile(vec![Filter::Redirect(c.redirect.clone())]);
        let mut req = parts("GET", c.uri, &[("host", c.host)]);
        let resp = respond(f.on_request(&mut req, c.scheme, c.listener_port, c.prefix));
        assert_eq!(
            header(resp.headers(), "location"),
            Some(c.location),
            "{}",
            c.name
        );
    }
}

#[test]
fn redirect_status_and_empty_body() {
    for status in [301, 302, 303, 307, 308] {
        let f = compile(vec![Filter::Redirect(Redirect {
            scheme: Some("https".into()),
            status,
            ..Default::default()
        })]);
        let mut req = parts("POST", "/x", &[("host", "a.test")]);
        let resp = respond(f.on_request(&mut req, "http", 80, None));
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(header(resp.headers(), "content-length"), Some("0"));
        assert_eq!(header(resp.headers(), "location"), Some("https://a.test/x"));
        assert_eq!(resp.body().size_hint().exact(), Some(0));
    }
}

#[test]
fn filters_before_a_redirect_run_and_later_ones_do_not() {
    let f = compile(vec![
        Filter::RequestHeaders(HeaderModifier {
            set: vec![hv("x-before", "1")],
            ..Default::default()
        }),
        Filter::Redirect(Redirect {
            status: 301,
            ..Default::default()
        }),
        Filter::RequestHeaders(HeaderModifier {
            set: vec![hv("x-after", "1")],
            ..Default::default()
        }),
    ]);
    let mut req = parts("GET", "/", &[("host", "a.test")]);
    let resp = respond(f.on_request(&mut req, "http", 80, None));
    assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
    assert!(req.headers.contains_key("x-before"));
    assert!(!req.headers.contains_key("x-after"));
}

// ---- mirrors ----

#[test]
fn mirrors_in_config_order() {
    let f = compile(vec![
        Filter::Mirror(Mirror {
            backend: "shadow-a".into(),
            percent: 100.0,
        }),
        Filter::RequestHeaders(HeaderModifier::default()),
        Filter::Mirror(Mirror {
            backend: "shadow-b".into(),
            percent: 5.0,
        }),
    ]);
    let got: Vec<(&str, f64)> = f
        .mirrors()
        .map(|m| (m.backend.as_str(), m.percent))
        .collect();
    assert_eq!(got, [("shadow-a", 100.0), ("shadow-b", 5.0)]);
    let mut req = parts("GET", "/", &[]);
    assert!(is_continue(&f.on_request(&mut req, "http", 80, None)));
    assert_eq!(compile(vec![]).mirrors().count(), 0);
}

// ---- CORS ----

/// The policy of the conformance test's `/cors-1` route.
fn cors_full() -> CompiledFilters {
    compile(vec![Filter::Cors(Cors {
        allow_origins: vec!["https://www.foo.com".into(), "https://*.bar.com".into()],
        allow_methods: vec!["GET".into(), "OPTIONS".into()],
        allow_headers: vec!["x-header-1".into(), "x-header-2".into()],
        expose_headers: vec!["x-header-3".into(), "x-header-4".into()],
        allow_credentials: true,
        max_age: Some(3600),
    })])
}

fn preflight(
    f: &CompiledFilters,
    origin: &str,
    method: &str,
    req_headers: Option<&str>,
) -> Response<Body> {
    let mut h = vec![
        ("origin", origin),
        ("access-control-request-method", method),
    ];
    if let Some(rh) = req_headers {
        h.push(("access-control-request-headers", rh));
    }
    let mut req = parts("OPTIONS", "/cors", &h);
    respond(f.on_request(&mut req, "https", 443, Some("/cors")))
}

#[test]
fn cors_preflight_allowed_origins() {
    let f = cors_full();
    for origin in [
        "https://www.foo.com",
        "https://www.bar.com",
        "https://xpto.www.bar.com",
        "HTTPS://WWW.FOO.COM",
    ] {
        let resp = preflight(&f, origin, "GET", Some("x-header-1, x-header-2"));
        let h = resp.headers();
        assert_eq!(resp.status(), StatusCode::OK, "{origin}");
        assert_eq!(header(h, "access-control-allow-origin"), Some(origin));
        assert_eq!(
            header(h, "access-control-allow-methods"),
            Some("GET, OPTIONS")
        );
        assert_eq!(
            header(h, "access-control-allow-headers"),
            Some("x-header-1, x-header-2")
        );
        assert_eq!(
            header(h, "access-control-expose-headers"),
            Some("x-header-3, x-header-4")
        );
        assert_eq!(header(h, "access-control-max-age"), Some("3600"));
        assert_eq!(header(h, "access-control-allow-credentials"), Some("true"));
        assert_eq!(header(h, "vary"), Some("Origin"));
        assert_eq!(header(h, "content-length"), Some("0"));
        assert_eq!(resp.body().size_hint().exact(), Some(0));
    }
}

#[test]
fn cors_preflight_disallowed_origins_get_no_cors_headers() {
    let f = cors_full();
    for origin in [
        "https://foobar.com",
        "https://bar.com",
        "http://www.foo.com",
        "https://www.foo.com.evil.test",
        "https://www.bar.com:8443",
        "https://evil.test/.bar.com",
        "https://user@x.bar.com",
    ] {
        let resp = preflight(&f, origin, "GET", None);
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{origin}");
        assert!(
            !resp
                .headers()
                .keys()
                .any(|k| k.as_str().starts_with("access-control-")),
            "{origin}: {:?}",
            resp.headers()
        );
    }
}

#[test]
fn cors_wildcard_methods_echo_the_requested_method_without_credentials_header() {
    let f = compile(vec![Filter::Cors(Cors {
        allow_origins: vec!["https://www.foo.com".into()],
        allow_methods: vec!["*".into()],
        ..Default::default()
    })]);
    let resp = preflight(&f, "https://www.foo.com", "POST", None);
    let h = resp.headers();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        header(h, "access-control-allow-origin"),
        Some("https://www.foo.com")
    );
    assert_eq!(header(h, "access-control-allow-methods"), Some("POST"));
    assert!(h.get("access-control-allow-credentials").is_none());
    assert!(h.get("access-control-allow-headers").is_none());
    assert!(h.get("access-control-max-age").is_none());
}

#[test]
fn cors_any_origin_without_credentials_answers_star() {
    let f = compile(vec![Filter::Cors(Cors {
        allow_origins: vec!["*".into()],
        allow_methods: vec!["PUT".into()],
        ..Default::default()
    })]);
    for origin in ["https://foobar.com", "https://foobar.com:12345"] {
        let resp = preflight(&f, origin, "PUT", None);
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            header(resp.headers(), "access-control-allow-origin"),
            Some("*")
        );
        assert_eq!(
            header(resp.headers(), "access-control-allow-methods"),
            Some("PUT")
        );
        assert!(resp
            .headers()
            .get("access-control-allow-credentials")
            .is_none());

        let mut resp = response_parts(&[]);
        f.on_response(Some(&HeaderValue::from_str(origin).unwrap()), &mut resp);
        assert_eq!(
            header(&resp.headers, "access-control-allow-origin"),
            Some("*")
        );
    }
}

#[test]
fn cors_wildcards_with_credentials_echo_origin_method_and_headers() {
    let f = compile(vec![Filter::Cors(Cors {
        allow_origins: vec!["*".into()],
        allow_methods: vec!["*".into()],
        allow_headers: vec!["*".into()],
        allow_credentials: true,
        ..Default::default()
    })]);
    let resp = preflight(
        &f,
        "https://other.foo.com",
        "PUT",
        Some("x-header-1, x-header-2"),
    );
    let h = resp.headers();
    assert_eq!(
        header(h, "access-control-allow-origin"),
        Some("https://other.foo.com")
    );
    assert_eq!(header(h, "access-control-allow-methods"), Some("PUT"));
    assert_eq!(
        header(h, "access-control-allow-headers"),
        Some("x-header-1, x-header-2")
    );
    assert_eq!(header(h, "access-control-allow-credentials"), Some("true"));
}

#[test]
fn cors_empty_origin_list_allows_every_origin() {
    // Conformance `CORSAllowCredentialsBehavior`: a CORS filter with only
    // `allowCredentials: true` echoes the origin.
    let f = compile(vec![Filter::Cors(Cors {
        allow_credentials: true,
        ..Default::default()
    })]);
    let origin = HeaderValue::from_static("https://app.example");
    let mut resp = response_parts(&[]);
    f.on_response(Some(&origin), &mut resp);
    assert_eq!(
        header(&resp.headers, "access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(
        header(&resp.headers, "access-control-allow-credentials"),
        Some("true")
    );

    let f = compile(vec![Filter::Cors(Cors::default())]);
    let mut resp = response_parts(&[]);
    f.on_response(Some(&origin), &mut resp);
    assert_eq!(
        header(&resp.headers, "access-control-allow-origin"),
        Some("*")
    );
    assert!(resp
        .headers
        .get("access-control-allow-credentials")
        .is_none());
}

#[test]
fn cors_non_preflight_requests_continue() {
    let f = cors_full();
    let cases: [(&str, &[(&str, &str)]); 3] = [
        ("OPTIONS", &[("origin", "https://www.foo.com")]),
        ("OPTIONS", &[("access-control-request-method", "GET")]),
        (
            "GET",
            &[
                ("origin", "https://www.foo.com"),
                ("access-control-request-method", "GET"),
            ],
        ),
    ];
    for (method, headers) in cases {
        let mut req = parts(method, "/cors", headers);
        assert!(
            is_continue(&f.on_request(&mut req, "https", 443, None)),
            "{method} {headers:?}"
        );
    }
}

#[test]
fn cors_actual_response_from_allowed_origin() {
    let f = cors_full();
    let mut resp = response_parts(&[("vary", "Accept-Encoding")]);
    f.on_response(
        Some(&HeaderValue::from_static("https://www.bar.com")),
        &mut resp,
    );
    let h = &resp.headers;
    assert_eq!(
        header(h, "access-control-allow-origin"),
        Some("https://www.bar.com")
    );
    assert_eq!(
        header(h, "access-control-expose-headers"),
        Some("x-header-3, x-header-4")
    );
    assert_eq!(header(h, "access-control-allow-credentials"), Some("true"));
    assert_eq!(values(h, "vary"), ["Accept-Encoding", "Origin"]);
    assert!(h.get("access-control-allow-methods").is_none());
    assert!(h.get("access-control-max-age").is_none());

    // Idempotent: applying twice (e.g. to a preflight answer) does not duplicate.
    f.on_response(
        Some(&HeaderValue::from_static("https://www.bar.com")),
        &mut resp,
    );
    assert_eq!(values(&resp.headers, "vary"), ["Accept-Encoding", "Origin"]);
    assert_eq!(
        values(&resp.headers, "access-control-allow-origin").len(),
        1
    );
}

#[test]
fn cors_actual_response_from_disallowed_or_missing_origin() {
    let f = cors_full();
    let mut resp = response_parts(&[]);
    f.on_response(
        Some(&HeaderValue::from_static("https://foobar.com")),
        &mut resp,
    );
    assert!(resp.headers.get("access-control-allow-origin").is_none());
    assert!(resp
        .headers
        .get("access-control-allow-credentials")
        .is_none());
    assert_eq!(values(&resp.headers, "vary"), ["Origin"]);

    let mut resp = response_parts(&[]);
    f.on_response(None, &mut resp);
    assert!(resp.headers.is_empty());
}

#[test]
fn cors_preflight_runs_in_config_order() {
    // Headers set before the CORS filter run; a redirect after it does not.
    let f = compile(vec![
        Filter::RequestHeaders(HeaderModifier {
            set: vec![hv("x-before", "1")],
            ..Default::default()
        }),
        Filter::Cors(Cors {
            allow_origins: vec!["https://a.test".into()],
            ..Default::default()
        }),
        Filter::Redirect(Redirect {
            status: 301,
            ..Default::default()
        }),
    ]);
    let mut req = parts(
        "OPTIONS",
        "/",
        &[
            ("origin", "https://a.test"),
            ("access-control-request-method", "GET"),
        ],
    );
    let resp = respond(f.on_request(&mut req, "http", 80, None));
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(req.headers.contains_key("x-before"));

    let mut plain = parts(
        "GET",
        "/",
        &[("host", "a.test"), ("origin", "https://a.test")],
    );
    let resp = respond(f.on_request(&mut plain, "http", 80, None));
    assert_eq!(resp.status(), StatusCode::MOVED_PERMANENTLY);
}

#[test]
fn cors_expose_star_is_passed_through() {
    let f = compile(vec![Filter::Cors(Cors {
        allow_origins: vec!["https://a.test".into()],
        expose_headers: vec!["*".into()],
        ..Default::default()
    })]);
    let mut resp = response_parts(&[]);
    f.on_response(Some(&HeaderValue::from_static("https://a.test")), &mut resp);
    assert_eq!(
        header(&resp.headers, "access-control-expose-headers"),
        Some("*")
    );
}

proptest::proptest! {
    /// Whatever the path and the groups it gives, a regex rewrite forwards a normal path: it
    /// starts with `/`, has no dot segment and no `//`, and normalising it changes nothing.
    #[test]
    fn a_regex_rewrite_always_forwards_a_normal_path(
        raw in "/[a-z./%2F]{0,24}",
        substitution in "[/.a$1-3]{0,12}",
    ) {
        let keep = crate::path_norm::PathNormalization {
            escaped_slashes: crate::path_norm::EscapedSlashes::Keep,
            ..Default::default()
        };
        // Requests reach the filters with their path normalised.
        let Ok(path) = crate::path_norm::normalize(&raw, &keep) else {
            return Ok(());
        };
        let re = regex::Regex::new("^/([^/]*)/?([^/]*)(.*)").unwrap();
        if sweety_config::check_substitution(&substitution).is_err() {
            return Ok(());
        }
        let out = substitute(&path, &re, &substitution);
        proptest::prop_assert!(out.starts_with('/'));
        proptest::prop_assert!(!out.contains("//"), "{out}");
        proptest::prop_assert!(!out.split('/').any(|s| s == "." || s == ".."), "{out}");
        let again = crate::path_norm::normalize(&out, &keep).map(|p| p.into_owned());
        proptest::prop_assert_eq!(again.as_deref(), Ok(out.as_str()));
    }
}
