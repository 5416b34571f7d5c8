//! Unit tests of SweetySecurityPolicy (`super`): precedence (rule > route > listener >
//! Gateway, the more specific replacing the other whole), oldest-wins conflicts, each power's
//! validation and its fail-closed answer, the TCP/TLS/UDP listener case, the bound on refused
//! htpasswd lines in the status, and property tests over the untrusted inputs a policy reads
//! (htpasswd files, `ipRules` entries): whatever they hold, a covered rule either carries the
//! policy's filter or answers 500, the status says which, and the config stays valid.

use crate::translate::status::{Condition, ObjectKey, ObjectStatus, RouteParentStatus};
use crate::translate::{translate, Output, Params, Snapshot};
use base64::Engine as _;
use proptest::prelude::*;
use sweety_config::htpasswd;
use sweety_config::{Action, Filter, HostVerify, Route};

/// A bcrypt and an $apr1$ entry (the goldens' alice and bob).
const ALICE: &str = "alice:$2y$05$WKXH0WjVMaTzbeVOeIC0UewSiKW9S3Ok0tsOQMTn/rbP0XyLaqPqa";
const BOB: &str = "bob:$apr1$sL5yBeMm$Ru3.Rv6KbPb.NJWjCDVKo1";

/// GatewayClass, Service `web` with endpoints, the auth Service, and Gateway `gw` with two
/// HTTP listeners (`http` on 80, `alt` on 8080).
const BASE: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: sweety, generation: 1}
spec: {controllerName: sweety.dev/gateway-controller}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: app}
spec: {ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: app, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.0.1]}]
---
apiVersion: v1
kind: Service
metadata: {name: auth, namespace: app}
spec: {ports: [{name: http, port: 8080, targetPort: 9000}], clusterIP: 10.96.0.50}
---
apiVersion: v1
kind: Service
metadata: {name: auth-headless, namespace: app}
spec: {ports: [{name: http, port: 8080, targetPort: 9000}], clusterIP: None}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: app, generation: 1}
spec:
  gatewayClassName: sweety
  listeners:
  - {name: http, port: 80, protocol: HTTP}
  - {name: alt, port: 8080, protocol: HTTP}
"#;

/// An HTTPRoute of namespace `app` on `gw` for `<name>.example.com`, one rule per name
/// (`None`: unnamed).
fn route(name: &str, rules: &[Option<&str>]) -> String {
    let mut y = format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, \
         namespace: app, generation: 1, creationTimestamp: \"2024-01-01T00:00:00Z\"}}\nspec:\n  \
         parentRefs: [{{name: gw}}]\n  hostnames: [{name}.example.com]\n  rules:\n"
    );
    for (i, r) in rules.iter().enumerate() {
        if let Some(n) = r {
            y.push_str(&format!("  - name: {n}\n"));
            y.push_str(&format!(
                "    matches: [{{path: {{type: PathPrefix, value: /{n}}}}}]\n"
            ));
        } else {
            y.push_str(&format!(
                "  - matches: [{{path: {{type: PathPrefix, value: /r{i}}}}}]\n"
            ));
        }
        y.push_str("    backendRefs: [{name: web, port: 80}]\n");
    }
    y
}

/// A SweetySecurityPolicy of namespace `app`: `targets` is the flow list of `targetRefs`
/// (kind, name, sectionName as `Kind/name[#section]`), `body` the rest of the spec (YAML
/// indented by two).
fn policy(name: &str, created: &str, targets: &[&str], body: &str) -> String {
    let refs: Vec<String> = targets
        .iter()
        .map(|t| {
            let (kind, rest) = t.split_once('/').unwrap();
            let (name, section) = match rest.split_once('#') {
                Some((n, s)) => (n, format!(", sectionName: {s}")),
                None => (rest, String::new()),
            };
            format!("{{group: gateway.networking.k8s.io, kind: {kind}, name: {name}{section}}}")
        })
        .collect();
    format!(
        "apiVersion: sweety.dev/v1alpha1\nkind: SweetySecurityPolicy\nmetadata: {{name: {name}, \
         namespace: app, generation: 1, creationTimestamp: \"{created}\"}}\nspec:\n  \
         targetRefs: [{}]\n{body}",
        refs.join(", ")
    )
}

/// An Opaque Secret of namespace `app` with `key` holding `bytes`.
fn secret(name: &str, key: &str, bytes: &[u8]) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: app}}\ntype: \
         Opaque\ndata: {{\"{key}\": {}}}\n",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// One document of a golden input: the one containing `marker`.
fn golden_doc(golden: &str, marker: &str) -> String {
    golden
        .split("\n---\n")
        .find(|d| d.contains(marker))
        .unwrap_or_else(|| panic!("no document with {marker:?}"))
        .to_string()
}

const POWERS: &str = include_str!("../../../../testdata/translate/gw-security-powers.in.yaml");

/// Translate `BASE` and `docs`; the config must be one the dataplane accepts.
fn run(docs: &[String]) -> Output {
    let mut y = BASE.to_string();
    for d in docs {
        y.push_str("---\n");
        y.push_str(d);
        if !d.ends_with('\n') {
            y.push('\n');
        }
    }
    let (s, _) = Snapshot::from_yaml(&y).unwrap_or_else(|e| panic!("{e}\n{y}"));
    let out = translate(&s, &Params::default());
    if let Err(e) = out.config.validate_structure() {
        panic!("translate produced an invalid config: {e:?}");
    }
    out
}

/// The rule of route `name` on listener port `port` named `label` (its name, else
/// `rule-<index>`).
fn rule<'o>(out: &'o Output, port: u16, name: &str, label: &str) -> &'o Route {
    let vh = format!("gw/app/gw/{port}/{name}.example.com");
    let want = format!("httproute/app/{name}/{label}");
    out.config
        .virtual_hosts
        .iter()
        .find(|v| v.name == vh)
        .unwrap_or_else(|| panic!("no virtual host {vh}"))
        .routes
        .iter()
        .find(|r| r.name == want)
        .unwrap_or_else(|| panic!("no route {want} in {vh}"))
}

/// The `ip_access` filters of a rule, as (allow, deny).
fn ip(r: &Route) -> Vec<(Vec<String>, Vec<String>)> {
    r.filters
        .iter()
        .filter_map(|f| match f {
            Filter::IpAccess(a) => Some((a.allow.clone(), a.deny.clone())),
            _ => None,
        })
        .collect()
}

/// The users a `basic_auth` filter asks for: those of the config's user set it names (it
/// lists none itself), which must exist.
fn users_of(out: &Output, f: &sweety_config::BasicAuth) -> Vec<sweety_config::BasicAuthUser> {
    assert!(f.users.is_empty(), "the users are named by set, not copied");
    let name = f.user_set.as_deref().expect("a user set");
    out.config
        .user_sets
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no user set {name}"))
        .users
        .clone()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The rule answers 500 naming policy `app/<name>`, with no filter left.
fn refused(r: &Route, name: &str) -> bool {
    matches!(&r.action, Action::Fixed(f) if f.status == 500
        && f.body.contains(&format!("SweetySecurityPolicy app/{name} ")))
        && r.filters.is_empty()
}

/// The rule forwards to `web` (whatever its filters).
fn proxied(r: &Route) -> bool {
    matches!(&r.action, Action::Proxy(p) if p.backends[0].backend == "app/web:80")
}

/// The ancestors of policy `app/<name>`.
fn ancestors<'o>(out: &'o Output, name: &str) -> &'o [RouteParentStatus] {
    match out
        .statuses
        .get(&ObjectKey::new("SweetySecurityPolicy", "app", name))
    {
        Some(ObjectStatus::Policy(p)) => &p.ancestors,
        other => panic!("policy {name}: no policy status: {other:?}"),
    }
}

fn condition<'a>(a: &'a RouteParentStatus, type_: &str) -> &'a Condition {
    a.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} in {a:?}"))
}

/// Policy `name` has exactly one ancestor, Gateway `app/gw` (section `section`), and its
/// `Accepted` condition: (status, reason, message).
fn accepted(out: &Output, name: &str, section: Option<&str>) -> (String, String, String) {
    let list = ancestors(out, name);
    assert_eq!(list.len(), 1, "policy {name}: {list:?}");
    let a = &list[0];
    assert_eq!(a.parent_ref.kind.as_deref(), Some("Gateway"));
    assert_eq!(a.parent_ref.name, "gw");
    assert_eq!(a.parent_ref.namespace.as_deref(), Some("app"));
    assert_eq!(a.parent_ref.section_name.as_deref(), section);
    assert_eq!(a.controller_name, "sweety.dev/gateway-controller");
    let c = condition(a, "Accepted");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

const T2024: &str = "2024-06-01T00:00:00Z";

#[test]
fn precedence_is_rule_then_route_then_listener_then_gateway_each_replacing_the_other_whole() {
    let out = run(&[
        route("r", &[Some("admin"), Some("public")]),
        route("o", &[None]),
        policy(
            "gateway",
            T2024,
            &["Gateway/gw"],
            "  ipRules: {allow: [10.0.0.0/8]}\n",
        ),
        policy(
            "listener",
            T2024,
            &["Gateway/gw#alt"],
            "  ipRules: {deny: [192.0.2.0/24]}\n",
        ),
        policy(
            "whole-route",
            T2024,
            &["HTTPRoute/r"],
            "  ipRules: {allow: [172.16.0.0/12]}\n",
        ),
        policy(
            "one-rule",
            T2024,
            &["HTTPRoute/r#admin"],
            "  ipRules: {deny: [198.51.100.0/24]}\n",
        ),
    ]);
    let gateway = (strings(&["10.0.0.0/8"]), vec![]);
    let listener = (vec![], strings(&["192.0.2.0/24"]));
    let whole_route = (strings(&["172.16.0.0/12"]), vec![]);
    let one_rule = (vec![], strings(&["198.51.100.0/24"]));
    // A route without a policy of its own: the listener's replaces the Gateway's on alt.
    assert_eq!(ip(rule(&out, 80, "o", "rule-0")), vec![gateway]);
    assert_eq!(ip(rule(&out, 8080, "o", "rule-0")), vec![listener]);
    for port in [80, 8080] {
        // The route's own policy replaces both; the rule's replaces the route's. Exactly
        // one filter each: nothing is merged.
        assert_eq!(ip(rule(&out, port, "r", "admin")), vec![one_rule.clone()]);
        assert_eq!(
            ip(rule(&out, port, "r", "public")),
            vec![whole_route.clone()]
        );
        assert!(proxied(rule(&out, port, "r", "admin")));
    }
    for name in ["gateway", "whole-route", "one-rule"] {
        assert_eq!(accepted(&out, name, None).0, "True", "{name}");
    }
    assert_eq!(accepted(&out, "listener", Some("alt")).0, "True");
}

#[test]
fn the_oldest_policy_of_a_target_wins_and_the_others_say_conflicted() {
    let out = run(&[
        route("c", &[None]),
        // Oldest by creation time, though its name sorts last.
        policy(
            "zz-oldest",
            "2023-01-01T00:00:00Z",
            &["HTTPRoute/c"],
            "  ipRules: {deny: [203.0.113.0/24]}\n",
        ),
        // The same time: namespace/name decides.
        policy(
            "b-same",
            "2024-01-01T00:00:00Z",
            &["HTTPRoute/c"],
            "  ipRules: {deny: [198.51.100.0/24]}\n",
        ),
        policy(
            "a-same",
            "2024-01-01T00:00:00Z",
            &["HTTPRoute/c"],
            "  ipRules: {deny: [198.51.100.1/32]}\n",
        ),
    ]);
    assert_eq!(
        ip(rule(&out, 80, "c", "rule-0")),
        vec![(vec![], strings(&["203.0.113.0/24"]))]
    );
    let (status, reason, _) = accepted(&out, "zz-oldest", None);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Accepted"));
    let winner = &ancestors(&out, "zz-oldest")[0];
    assert_eq!(condition(winner, "Conflicted").status, "False");
    for loser in ["a-same", "b-same"] {
        let (status, reason, message) = accepted(&out, loser, None);
        assert_eq!((status.as_str(), reason.as_str()), ("False", "Conflicted"));
        assert!(
            message.contains("SweetySecurityPolicy app/zz-oldest is older"),
            "{message}"
        );
        let c = condition(&ancestors(&out, loser)[0], "Conflicted");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "Conflicted")
        );
    }

    // Between a-same and b-same alone (same time), the name decides: a-same.
    let out = run(&[
        route("c", &[None]),
        policy(
            "b-same",
            "2024-01-01T00:00:00Z",
            &["HTTPRoute/c"],
            "  ipRules: {deny: [198.51.100.0/24]}\n",
        ),
        policy(
            "a-same",
            "2024-01-01T00:00:00Z",
            &["HTTPRoute/c"],
            "  ipRules: {deny: [198.51.100.1/32]}\n",
        ),
    ]);
    assert_eq!(
        ip(rule(&out, 80, "c", "rule-0")),
        vec![(vec![], strings(&["198.51.100.1/32"]))]
    );
    assert_eq!(accepted(&out, "b-same", None).1, "Conflicted");
}

#[test]
fn an_invalid_oldest_policy_still_wins_its_target_and_fails_it_closed() {
    // Letting the younger, valid policy take over would let a broken Secret change who
    // guards the route; the older one keeps the target and it answers 500.
    let out = run(&[
        route("c", &[None]),
        policy(
            "old-broken",
            "2023-01-01T00:00:00Z",
            &["HTTPRoute/c"],
            "  basicAuth: {secretRef: {name: missing}}\n",
        ),
        policy(
            "young-valid",
            "2024-01-01T00:00:00Z",
            &["HTTPRoute/c"],
            "  ipRules: {allow: [10.0.0.0/8]}\n",
        ),
    ]);
    assert!(refused(rule(&out, 80, "c", "rule-0"), "old-broken"));
    assert_eq!(accepted(&out, "old-broken", None).1, "Invalid");
    assert_eq!(accepted(&out, "young-valid", None).1, "Conflicted");
}

/// A policy on route `t`, its spec body and extra objects, and what its status must say.
struct Case {
    what: &'static str,
    body: String,
    extra: Vec<String>,
    /// Accepted False / Invalid with a message containing this.
    why: &'static str,
}

fn case(what: &'static str, body: &str, extra: Vec<String>, why: &'static str) -> Case {
    Case {
        what,
        body: body.into(),
        extra,
        why,
    }
}

#[test]
fn each_power_refuses_what_it_cannot_honour_with_a_500_and_a_reason_and_nothing_else_changes() {
    let htpasswd = |text: &str| secret("htpasswd", "auth", text.as_bytes());
    let cases = vec![
        case(
            "nothing asked for",
            "",
            vec![],
            "sets none of extAuth, basicAuth, clientCertificate, ipRules",
        ),
        case(
            "an ipRules entry that is no address",
            "  ipRules: {allow: [10.0.0.0/8, 010.1.2.3]}\n",
            vec![],
            "ipRules.allow",
        ),
        case(
            "a deny entry that is no network",
            "  ipRules: {deny: [10.0.0.0/33]}\n",
            vec![],
            "ipRules.deny",
        ),
        case(
            "an ipRules without an address",
            "  ipRules: {allow: [], deny: []}\n",
            vec![],
            "ipRules lists no address",
        ),
        case(
            "a missing htpasswd Secret",
            "  basicAuth: {secretRef: {name: htpasswd}}\n",
            vec![],
            "basicAuth.secretRef: the Secret app/htpasswd does not exist",
        ),
        case(
            "a Secret without the htpasswd key",
            "  basicAuth: {secretRef: {name: htpasswd}}\n",
            vec![secret("htpasswd", "users", ALICE.as_bytes())],
            "has no key \"auth\" or \".htpasswd\"",
        ),
        case(
            "an htpasswd file that is not UTF-8",
            "  basicAuth: {secretRef: {name: htpasswd}}\n",
            vec![secret("htpasswd", "auth", b"alice:\xff\xfe")],
            "is not UTF-8",
        ),
        case(
            "an htpasswd file without a usable entry",
            "  basicAuth: {secretRef: {name: htpasswd}}\n",
            vec![htpasswd("# only\nplain:hunter2\ndes:rqXexS6ZhobKA\n")],
            "has no usable htpasswd entry",
        ),
        case(
            "a realm the dataplane would refuse",
            "  basicAuth: {secretRef: {name: htpasswd}, realm: \"a\\u0001b\"}\n",
            vec![htpasswd(ALICE)],
            "basicAuth.realm",
        ),
        case(
            "a Secret of another namespace without a ReferenceGrant",
            "  basicAuth: {secretRef: {name: htpasswd, namespace: other}}\n",
            vec![],
            "no ReferenceGrant there allows it",
        ),
        case(
            "a secretRef that is not a Secret",
            "  basicAuth: {secretRef: {name: htpasswd, kind: ConfigMap}}\n",
            vec![htpasswd(ALICE)],
            "basicAuth.secretRef must name a core Secret",
        ),
        case(
            "a missing auth Service",
            "  extAuth: {backendRef: {name: nope, port: 8080}}\n",
            vec![],
            "nope",
        ),
        case(
            "an auth Service of another namespace without a ReferenceGrant",
            "  extAuth: {backendRef: {name: auth, namespace: other, port: 8080}}\n",
            vec![],
            "ReferenceGrant",
        ),
        case(
            "an auth port the Service does not have",
            "  extAuth: {backendRef: {name: auth, port: 9999}}\n",
            vec![],
            "9999",
        ),
        case(
            "headersToBackend the dataplane would refuse",
            "  extAuth: {backendRef: {name: auth, port: 8080}, headersToBackend: [\"bad header\"]}\n",
            vec![],
            "extAuth.headersToBackend",
        ),
        case(
            "clientCertificate on an HTTPRoute",
            "  clientCertificate: {caCertificateRefs: [{name: client-ca}]}\n",
            vec![golden_doc(POWERS, "name: client-ca")],
            "clientCertificate applies to Gateways and their listeners only",
        ),
    ];
    for c in cases {
        let mut docs = vec![
            route("t", &[None, Some("second")]),
            route("bystander", &[None]),
            policy("p", T2024, &["HTTPRoute/t"], &c.body),
        ];
        docs.extend(c.extra.iter().cloned());
        let out = run(&docs);
        for port in [80, 8080] {
            for i in ["rule-0", "second"] {
                assert!(
                    refused(rule(&out, port, "t", i), "p"),
                    "{}: rule {i} on {port} is not refused: {:?}",
                    c.what,
                    rule(&out, port, "t", i)
                );
            }
            let b = rule(&out, port, "bystander", "rule-0");
            assert!(
                proxied(b) && b.filters.is_empty(),
                "{}: bystander {b:?}",
                c.what
            );
        }
        let (status, reason, message) = accepted(&out, "p", None);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "Invalid"),
            "{}: {message}",
            c.what
        );
        assert!(
            message.contains(c.why),
            "{}: {message:?} does not say {:?}",
            c.what,
            c.why
        );
        // The 500 names the policy, never the reason (which may name Secrets).
        let Action::Fixed(f) = &rule(&out, 80, "t", "rule-0").action else {
            unreachable!()
        };
        assert!(!f.body.contains(c.why) || c.why.is_empty(), "{}", c.what);
    }
}

#[test]
fn each_valid_power_becomes_its_filter_in_front_of_the_rules_own() {
    let out = run(&[
        route("t", &[None]),
        route("h", &[None]),
        secret(
            "htpasswd",
            ".htpasswd",
            format!("{ALICE}\n{BOB}\n").as_bytes(),
        ),
        policy(
            "all",
            T2024,
            &["HTTPRoute/t"],
            "  ipRules: {allow: [192.168.1.7, \"2001:db8::1/64\"], deny: [10.9.1.2/16]}\n  \
             basicAuth: {secretRef: {name: htpasswd}, realm: Staff}\n  \
             extAuth: {backendRef: {name: auth, port: 8080}, path: /verify, headersToBackend: [X-User]}\n",
        ),
        policy(
            "headless",
            T2024,
            &["HTTPRoute/h"],
            "  extAuth: {backendRef: {name: auth-headless, port: 8080}}\n",
        ),
    ]);
    let r = rule(&out, 80, "t", "rule-0");
    assert!(proxied(r));
    // ipRules first (cheapest), then basic, then external auth.
    let [Filter::IpAccess(ip), Filter::BasicAuth(basic), Filter::ExternalAuth(ext)] =
        &r.filters[..]
    else {
        panic!("filters {:?}", r.filters)
    };
    // Host bits masked as ingress-nginx does.
    assert_eq!(ip.allow, strings(&["192.168.1.7/32", "2001:db8::/64"]));
    assert_eq!(ip.deny, strings(&["10.9.0.0/16"]));
    assert_eq!(basic.realm, "Staff");
    let users: Vec<String> = users_of(&out, basic).into_iter().map(|u| u.name).collect();
    assert_eq!(users, ["alice", "bob"]);
    assert_eq!(basic.user_set.as_deref(), Some("secret/app/htpasswd"));
    assert_eq!(ext.url, "http://10.96.0.50:8080/verify");
    assert!(ext.restrict_addresses, "a tenant's auth URL is restricted");
    assert_eq!(ext.response_headers, strings(&["X-User"]));
    let (status, _, message) = accepted(&out, "all", None);
    assert_eq!(status, "True", "{message}");
    // A headless Service is asked by its DNS name.
    let Filter::ExternalAuth(ext) = &rule(&out, 80, "h", "rule-0").filters[0] else {
        panic!()
    };
    assert_eq!(ext.url, "http://auth-headless.app.svc:8080/");
}

/// Gateway `gw` with an HTTPS listener for secure.example.com (the powers golden's
/// certificate and client CA).
fn https_docs() -> Vec<String> {
    let gw = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: tls, \
              namespace: app, generation: 1}\nspec:\n  gatewayClassName: sweety\n  listeners:\n  \
              - {name: plain, port: 81, protocol: HTTP}\n  - name: https\n    port: 443\n    \
              protocol: HTTPS\n    hostname: secure.example.com\n    tls: {certificateRefs: \
              [{name: app-tls}]}\n  - name: nohost\n    port: 444\n    protocol: HTTPS\n    \
              tls: {certificateRefs: [{name: app-tls}]}\n";
    let route = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: \
                 s, namespace: app, generation: 1}\nspec:\n  parentRefs: [{name: tls}]\n  \
                 hostnames: [secure.example.com]\n  rules:\n  - backendRefs: [{name: web, port: \
                 80}]\n";
    vec![
        golden_doc(POWERS, "name: app-tls"),
        golden_doc(POWERS, "name: client-ca"),
        gw.into(),
        route.into(),
    ]
}

fn tls_rule(out: &Output, port: u16) -> &Route {
    let vh = format!("gw/app/tls/{port}/secure.example.com");
    out.config
        .virtual_hosts
        .iter()
        .find(|v| v.name == vh)
        .and_then(|v| v.routes.first())
        .unwrap_or_else(|| panic!("no {vh}"))
}

fn tls_status(out: &Output, name: &str) -> (String, String, String) {
    let a = &ancestors(out, name)[0];
    let c = condition(a, "Accepted");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[test]
fn client_certificates_are_asked_for_by_https_listeners_with_a_hostname_only() {
    let cert = "  clientCertificate: {caCertificateRefs: [{name: client-ca}], mode: Optional, \
                verifyDepth: 2}\n";
    let mut docs = https_docs();
    docs.push(policy("mtls", T2024, &["Gateway/tls#https"], cert));
    let out = run(&docs);
    let l = out
        .config
        .listeners
        .iter()
        .find(|l| l.name == "gw/app/tls/443")
        .unwrap();
    let hca = &l.tls.as_ref().unwrap().host_client_auth;
    assert_eq!(hca.len(), 1);
    assert_eq!(hca[0].hostnames, strings(&["secure.example.com"]));
    assert_eq!(hca[0].verify, HostVerify::Optional);
    assert_eq!(hca[0].verify_depth, 2);
    assert!(proxied(tls_rule(&out, 443)));
    assert_eq!(tls_status(&out, "mtls").0, "True");

    // A plain listener, an HTTPS listener without a hostname, a depth out of range and a
    // missing CA: the listener's routes answer 500, no host_client_auth, Invalid.
    let bad = [
        ("plain", cert, 81, "is not HTTPS"),
        ("nohost", cert, 444, "has no hostname"),
        (
            "https",
            "  clientCertificate: {caCertificateRefs: [{name: client-ca}], verifyDepth: 0}\n",
            443,
            "verifyDepth 0 is not between 1 and",
        ),
        (
            "https",
            "  clientCertificate: {caCertificateRefs: [{name: nope}]}\n",
            443,
            "the Secret app/nope does not exist",
        ),
        (
            "https",
            "  clientCertificate: {caCertificateRefs: [{name: app-tls}]}\n",
            443,
            "has no key \"ca.crt\"",
        ),
    ];
    for (section, body, port, why) in bad {
        let mut docs = https_docs();
        let target = format!("Gateway/tls#{section}");
        docs.push(policy("mtls", T2024, &[&target], body));
        let out = run(&docs);
        assert!(
            refused(tls_rule(&out, port), "mtls"),
            "{section} {why}: {:?}",
            tls_rule(&out, port)
        );
        for l in &out.config.listeners {
            let none = l.tls.as_ref().is_none_or(|t| t.host_client_auth.is_empty());
            assert!(none, "{section} {why}: {l:?}");
        }
        let (status, reason, message) = tls_status(&out, "mtls");
        assert_eq!((status.as_str(), reason.as_str()), ("False", "Invalid"));
        assert!(message.contains(why), "{message:?} does not say {why:?}");
        // The other listeners' routes are served as usual.
        for other in [81, 443, 444].into_iter().filter(|p| *p != port) {
            assert!(proxied(tls_rule(&out, other)), "{section}: {other}");
        }
    }

    // The client certificate holds whatever an HTTPRoute's policy says: the route's own
    // ipRules apply, the listener still asks for the certificate.
    let mut docs = https_docs();
    docs.push(policy("mtls", T2024, &["Gateway/tls#https"], cert));
    docs.push(policy(
        "route-ip",
        T2024,
        &["HTTPRoute/s"],
        "  ipRules: {allow: [10.0.0.0/8]}\n",
    ));
    let out = run(&docs);
    assert_eq!(
        ip(tls_rule(&out, 443)),
        vec![(strings(&["10.0.0.0/8"]), vec![])]
    );
    let l = out
        .config
        .listeners
        .iter()
        .find(|l| l.name == "gw/app/tls/443")
        .unwrap();
    assert_eq!(l.tls.as_ref().unwrap().host_client_auth.len(), 1);
}

const L4: &str = r#"apiVersion: v1
kind: Service
metadata: {name: db, namespace: app}
spec: {ports: [{name: pg, port: 5432, targetPort: 5432}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: db-1, namespace: app, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{name: pg, port: 5432}]
endpoints: [{addresses: [10.1.0.5]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: mixed, namespace: app, generation: 1}
spec:
  gatewayClassName: sweety
  listeners:
  - {name: http, port: 82, protocol: HTTP}
  - {name: tcp, port: 5432, protocol: TCP}
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: db, namespace: app, generation: 1}
spec:
  parentRefs: [{name: mixed, sectionName: tcp}]
  rules:
  - backendRefs: [{name: db, port: 5432}]
"#;

#[test]
fn a_policy_covering_a_tcp_listener_stops_its_routes_and_says_so() {
    let tcp_routes = |out: &Output| {
        out.config
            .listeners
            .iter()
            .find(|l| l.name == "gw/app/mixed/5432")
            .map(|l| l.l4_routes.len())
            .unwrap()
    };
    let none = run(&[L4.into()]);
    assert_eq!(tcp_routes(&none), 1, "served without a policy");
    for (target, served, status, why) in [
        (
            "Gateway/mixed",
            0,
            "False",
            "listener tcp of Gateway app/mixed",
        ),
        (
            "Gateway/mixed#tcp",
            0,
            "False",
            "listener tcp of Gateway app/mixed",
        ),
        ("Gateway/mixed#http", 1, "True", "policy applied"),
    ] {
        let out = run(&[
            L4.into(),
            policy("p", T2024, &[target], "  ipRules: {allow: [10.0.0.0/8]}\n"),
        ]);
        assert_eq!(tcp_routes(&out), served, "{target}");
        let a = &ancestors(&out, "p")[0];
        let c = condition(a, "Accepted");
        assert_eq!(c.status, status, "{target}: {}", c.message);
        assert!(c.message.contains(why), "{target}: {}", c.message);
        if status == "False" {
            assert_eq!(c.reason, "Invalid");
            assert!(c.message.contains("cannot guard"), "{}", c.message);
        }
    }
}

/// An htpasswd file of `good` usable users and `bad` plain-text lines.
fn htpasswd_file(good: usize, bad: usize) -> String {
    let mut text = String::new();
    for i in 0..good {
        text.push_str(&format!(
            "u{i}:$2y$05$WKXH0WjVMaTzbeVOeIC0UewSiKW9S3Ok0tsOQMTn/rbP0XyLaqPqa\n"
        ));
    }
    for i in 0..bad {
        text.push_str(&format!("plain{i}:hunter{i}\n"));
    }
    text
}

#[test]
fn refused_htpasswd_lines_are_said_up_to_a_bound_and_counted_beyond_it() {
    let max = crate::translate::ingress::nginx::MAX_REJECTED_REPORTED;
    for bad in [0, 1, max, max + 1, 5000] {
        let out = run(&[
            route("t", &[None]),
            secret("htpasswd", "auth", htpasswd_file(1, bad).as_bytes()),
            policy(
                "p",
                T2024,
                &["HTTPRoute/t"],
                "  basicAuth: {secretRef: {name: htpasswd}}\n",
            ),
        ]);
        let (status, _, message) = accepted(&out, "p", None);
        assert_eq!(status, "True");
        let Filter::BasicAuth(f) = &rule(&out, 80, "t", "rule-0").filters[0] else {
            panic!()
        };
        assert_eq!(
            users_of(&out, f).len(),
            1,
            "the refused users cannot log in"
        );
        if bad == 0 {
            assert_eq!(message, "policy applied");
            continue;
        }
        // Lines 2.. are the bad ones (line 1 is u0).
        let said: Vec<String> = (2..2 + bad.min(max)).map(|l| l.to_string()).collect();
        assert!(
            message.contains(&format!("htpasswd lines {}", said.join(", "))),
            "{bad}: {message}"
        );
        let more = bad.saturating_sub(max);
        assert_eq!(
            message.contains(&format!("and {more} more")),
            more > 0,
            "{bad}: {message}"
        );
        assert!(message.len() < 400, "{bad}: {} bytes", message.len());
    }
}

/// One `ipRules` entry: a valid address or network of either family (with host bits), or
/// something else (junk, leading zeros, bad prefixes, spaces, empty).
fn cidr_entry() -> impl Strategy<Value = String> {
    prop_oneof![
        (any::<[u8; 4]>(), proptest::option::of(0u8..=32)).prop_map(|(a, p)| {
            let ip = std::net::Ipv4Addr::from(a).to_string();
            p.map_or(ip.clone(), |p| format!("{ip}/{p}"))
        }),
        (any::<[u16; 8]>(), proptest::option::of(0u8..=128)).prop_map(|(a, p)| {
            let ip = std::net::Ipv6Addr::from(a).to_string();
            p.map_or(ip.clone(), |p| format!("{ip}/{p}"))
        }),
        "[0-9./:a-fA-F ]{0,24}",
        "(0[0-9]{1,2}\\.){3}[0-9]{1,3}(/[0-9]{1,3})?",
        "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}/[0-9]{2,3}",
    ]
}

/// YAML double-quoted text.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Whatever `ipRules` holds, the rule either carries exactly the masked entries or
    /// answers 500 with the policy Invalid naming the field; the config is one the dataplane
    /// accepts either way (never open, never a refused config).
    #[test]
    fn ip_rules_either_apply_as_read_or_fail_closed(
        allow in proptest::collection::vec(cidr_entry(), 0..4),
        deny in proptest::collection::vec(cidr_entry(), 0..4),
    ) {
        let list = |l: &[String]| l.iter().map(|e| quoted(e)).collect::<Vec<_>>().join(", ");
        let body = format!("  ipRules: {{allow: [{}], deny: [{}]}}\n", list(&allow), list(&deny));
        let out = run(&[route("t", &[None]), policy("p", T2024, &["HTTPRoute/t"], &body)]);
        let r = rule(&out, 80, "t", "rule-0");
        let (status, reason, message) = accepted(&out, "p", None);
        let read = |l: &[String]| -> Result<Vec<String>, String> {
            l.iter().map(|e| super::masked_cidr(e)).collect()
        };
        match (read(&allow), read(&deny)) {
            (Ok(a), Ok(d)) if !(a.is_empty() && d.is_empty()) => {
                prop_assert_eq!(ip(r), vec![(a, d)]);
                prop_assert!(proxied(r));
                prop_assert_eq!(status, "True");
            }
            (a, d) => {
                prop_assert!(refused(r, "p"), "{:?}", r);
                prop_assert_eq!((status.as_str(), reason.as_str()), ("False", "Invalid"));
                let field = if a.is_err() { "ipRules.allow" }
                    else if d.is_err() { "ipRules.deny" }
                    else { "ipRules lists no address" };
                prop_assert!(message.contains(field), "{}", message);
            }
        }
    }

    /// Whatever the htpasswd Secret holds, the rule either asks for exactly the users the
    /// parser took (the refused lines said, boundedly) or answers 500 with the policy
    /// Invalid; the config is one the dataplane accepts either way.
    #[test]
    fn htpasswd_files_either_apply_as_parsed_or_fail_closed(
        lines in proptest::collection::vec(prop_oneof![
            Just(ALICE.to_string()),
            Just(BOB.to_string()),
            Just("sha:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=".to_string()),
            "[a-z]{0,6}:[!-~]{0,20}",
            "(?s).{0,30}",
        ], 0..40),
    ) {
        let text = lines.join("\n");
        let out = run(&[
            route("t", &[None]),
            secret("htpasswd", "auth", text.as_bytes()),
            policy("p", T2024, &["HTTPRoute/t"], "  basicAuth: {secretRef: {name: htpasswd}}\n"),
        ]);
        let parsed = htpasswd::parse(&text);
        let r = rule(&out, 80, "t", "rule-0");
        let (status, reason, message) = accepted(&out, "p", None);
        prop_assert!(message.len() < 600, "{} bytes", message.len());
        if parsed.users.is_empty() {
            prop_assert!(refused(r, "p"), "{:?}", r);
            prop_assert_eq!((status.as_str(), reason.as_str()), ("False", "Invalid"));
            prop_assert!(message.contains("no usable htpasswd entry"), "{}", message);
        } else {
            let [Filter::BasicAuth(f)] = &r.filters[..] else {
                return Err(TestCaseError::fail(format!("filters {:?}", r.filters)));
            };
            prop_assert_eq!(&users_of(&out, f), &parsed.users);
            prop_assert_eq!(status, "True");
            prop_assert_eq!(message.contains("refused"), !parsed.rejected.is_empty());
        }
    }
}

#[test]
fn a_route_policy_takes_effect_through_the_gateways_that_accepted_the_route_only() {
    // Two parentRefs to the same Gateway, one refused (no listener nope): attached through
    // the other, so the Gateway is an ancestor with the policy Accepted.
    let both = route("r", &[None]).replace(
        "parentRefs: [{name: gw}]",
        "parentRefs: [{name: gw, sectionName: nope}, {name: gw, sectionName: http}]",
    );
    let p = policy(
        "p",
        T2024,
        &["HTTPRoute/r"],
        "  ipRules: {allow: [10.0.0.0/8]}\n",
    );
    let out = run(&[both, p.clone()]);
    assert_eq!(
        accepted(&out, "p", None),
        ("True".into(), "Accepted".into(), "policy applied".into())
    );
    assert_eq!(
        ip(rule(&out, 80, "r", "rule-0")),
        vec![(strings(&["10.0.0.0/8"]), vec![])]
    );
    // Refused through every parentRef: the Gateway says why, nothing is served.
    let none = route("r", &[None]).replace(
        "parentRefs: [{name: gw}]",
        "parentRefs: [{name: gw, sectionName: nope}]",
    );
    let out = run(&[none, p]);
    let (status, reason, message) = accepted(&out, "p", None);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "TargetNotFound")
    );
    assert!(
        message
            .contains("HTTPRoute app/r is not attached to Gateway app/gw (no listener named nope)"),
        "{message}"
    );
    assert!(out
        .config
        .virtual_hosts
        .iter()
        .all(|v| v.routes.is_empty() || !v.name.contains("r.example.com")));
}

/// A Gateway with `routes` HTTPRoutes of `rules` rules each and a basicAuth policy on the
/// Gateway whose htpasswd file has `users` users: the config's compact JSON size.
fn config_bytes(routes: usize, rules: usize, users: usize) -> usize {
    let mut docs = Vec::new();
    let names: Vec<String> = (0..rules).map(|i| format!("r{i}")).collect();
    let names: Vec<Option<&str>> = names.iter().map(|n| Some(n.as_str())).collect();
    for r in 0..routes {
        docs.push(route(&format!("route{r}"), &names));
    }
    docs.push(secret(
        "htpasswd",
        "auth",
        htpasswd_file(users, 0).as_bytes(),
    ));
    docs.push(policy(
        "p",
        T2024,
        &["Gateway/gw"],
        "  basicAuth: {secretRef: {name: htpasswd}, realm: Staff}\n",
    ));
    let out = run(&docs);
    assert_eq!(accepted(&out, "p", None).0, "True");
    serde_json::to_vec(&out.config).unwrap().len()
}

#[test]
fn a_gateway_policys_users_are_in_the_config_once_whatever_the_number_of_rules() {
    // 200 routes: 100 more users cost one copy of them, with one rule per route or three.
    let one = config_bytes(200, 1, 101) - config_bytes(200, 1, 1);
    let three = config_bytes(200, 3, 101) - config_bytes(200, 3, 1);
    assert_eq!(one, three, "the users are not copied per rule");
    // One user is about 85 bytes of JSON (name and bcrypt hash); a copy per rule would be
    // 200 times that.
    assert!(one / 100 < 120, "{} bytes per user", one / 100);
    for (rules, users) in [(1, 1), (1, 100), (3, 100), (1, 1000)] {
        eprintln!(
            "200 routes x {rules} rule(s), {users} users: config {} bytes",
            config_bytes(200, rules, users)
        );
    }
    // Every rule names the one set.
    let mut docs: Vec<String> = (0..3)
        .map(|r| route(&format!("route{r}"), &[None]))
        .collect();
    docs.push(secret("htpasswd", "auth", htpasswd_file(2, 0).as_bytes()));
    docs.push(policy(
        "p",
        T2024,
        &["Gateway/gw"],
        "  basicAuth: {secretRef: {name: htpasswd}, realm: Staff}\n",
    ));
    let out = run(&docs);
    assert_eq!(out.config.user_sets.len(), 1);
    for port in [80, 8080] {
        for r in 0..3 {
            let Filter::BasicAuth(f) = &rule(&out, port, &format!("route{r}"), "rule-0").filters[0]
            else {
                panic!()
            };
            assert_eq!(users_of(&out, f).len(), 2);
        }
    }
}
