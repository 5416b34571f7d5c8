//! Admission against a real API server: the generated CRDs install (their CEL rules compile and
//! fit the cost budget), a full example is accepted, and each bad input is rejected with the
//! rule's message.
//!
//! Needs a cluster, so it is `#[ignore]`d: it runs with `--ignored` and `SWEETY_KUBECONFIG`
//! naming one (`.ci/run` starts `e2e/cluster/up.sh` and runs it), and fails when it is not set:
//! `SWEETY_KUBECONFIG=$SWEETY_CLUSTER_DIR/run/kubeconfig cargo test -p sweety-crds --test admission -- --ignored`.
//! `SWEETY_KUBECTL` names the kubectl binary (default `kubectl`). Objects go to the namespace
//! `sweety-crd-admission`, which the test creates and deletes.

use std::io::Write;
use std::process::{Command, Stdio};

const NS: &str = "sweety-crd-admission";

fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let bin = std::env::var("SWEETY_KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let kubeconfig = std::env::var("SWEETY_KUBECONFIG").expect("SWEETY_KUBECONFIG");
    let mut child = Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl (set SWEETY_KUBECTL)");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn site(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: sweety.dev/v1alpha1\nkind: SweetySite\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n{spec}"
    )
}

const GOOD_ROUTES: &str = "  hostnames: [www.example.com, \"*.example.org\"]
  tls: {secretName: www-tls}
  preset: spa
  routes:
  - path: /
    static: {configMap: {name: www-content}}
  - path: /api
    proxy: {backends: [{service: api, port: 80, weight: 90}, {service: canary, port: 80, weight: 10}]}
  - path: /old
    pathType: Exact
    redirect: {url: \"https://new.example.com/\", statusCode: 301}
  - path: /blog
    redirect: {host: blog.example.com}
  compression: {enabled: true, minimumSize: 1024}
  cache: {ttlSeconds: 60}
  rateLimit: {requestsPerSecond: 10, burst: 20}
  responseHeaders: {set: [{name: X-Frame-Options, value: DENY}], remove: [Server]}
";

#[test]
#[ignore = "needs a kube-apiserver: SWEETY_KUBECONFIG (e2e/cluster/up.sh)"]
fn crds_install_and_cel_rules_reject_bad_input() {
    assert!(
        std::env::var_os("SWEETY_KUBECONFIG").is_some(),
        "SWEETY_KUBECONFIG is not set: this test needs a cluster (e2e/cluster/up.sh)"
    );
    for (name, text) in sweety_crds::crd_files().unwrap() {
        let (ok, out) = kubectl(&["apply", "--server-side", "-f", "-"], Some(&text));
        assert!(ok, "{name} did not install: {out}");
    }
    for crd in [
        "sweetysites.sweety.dev",
        "sweetyproxyconfigs.sweety.dev",
        "sweetysecuritypolicies.sweety.dev",
    ] {
        let (ok, out) = kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=30s",
                "crd",
                crd,
            ],
            None,
        );
        assert!(ok, "{crd} not established: {out}");
    }
    let _ = kubectl(&["create", "namespace", NS], None);

    let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&site("good", GOOD_ROUTES)));
    assert!(ok, "the full example was rejected: {out}");

    let route = |r: &str| format!("  hostnames: [a.example.com]\n  routes:\n  - {r}\n");
    let cases = [
        (
            route("{path: /, static: {directory: /srv}, proxy: {backends: [{service: a, port: 80}]}}"),
            "exactly one of static, proxy or redirect must be set",
        ),
        (route("{path: /}"), "exactly one of static, proxy or redirect must be set"),
        (route("{path: x, static: {directory: /srv}}"), "path must start with '/'"),
        (
            route("{path: /, redirect: {host: b.example.com, statusCode: 200}}"),
            "statusCode must be 301, 302, 303, 307 or 308",
        ),
        (
            route("{path: /, redirect: {url: \"https://b.example.com\", host: c}}"),
            "set either url, or at least one of scheme, host and path",
        ),
        (
            route("{path: /, redirect: {url: \"ftp://b.example.com\"}}"),
            "url must be http(s)://host[:port][/path]",
        ),
        (
            route("{path: /, proxy: {backends: [{service: a, port: 80, weight: 0}]}}"),
            "at least one backend must have a weight above 0",
        ),
        (
            route("{path: /, proxy: {backends: [{service: a, port: 80, weight: -1}]}}"),
            "should be greater than or equal to 0",
        ),
        (
            route("{path: /, static: {configMap: {name: c}, directory: /srv}}"),
            "exactly one of configMap or directory must be set",
        ),
        (
            route("{path: /, static: {directory: ../etc}}"),
            "directory must be an absolute path without '..'",
        ),
        (
            "  hostnames: []\n  routes: [{path: /, static: {directory: /srv}}]\n".to_string(),
            "should have at least 1 items",
        ),
        (
            "  hostnames: [Bad_Host]\n  routes: [{path: /, static: {directory: /srv}}]\n".to_string(),
            "hostnames must be lower-case DNS names",
        ),
        (
            "  hostnames: [a.example, a.example]\n  routes: [{path: /, static: {directory: /srv}}]\n"
                .to_string(),
            "hostnames must be unique",
        ),
    ];
    let mut failures = Vec::new();
    for (spec, want) in &cases {
        let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&site("bad", spec)));
        if ok || !out.contains(want) {
            failures.push(format!(
                "spec:\n{spec}expected rejection with {want:?}, got: {out}"
            ));
        }
    }

    let pc = |spec: &str| {
        format!("apiVersion: sweety.dev/v1alpha1\nkind: SweetyProxyConfig\nmetadata: {{name: p, namespace: {NS}}}\nspec: {spec}\n")
    };
    let (ok, out) = kubectl(
        &["apply", "-f", "-"],
        Some(&pc("{limits: {maxConnections: 100, headerReadTimeout: 10s}, http3: true, logging: {accessLog: true, format: text}, clientIp: {trustedProxies: [10.0.0.0/8, 192.0.2.7], forwardedForDepth: 2}, service: {type: NodePort, externalTrafficPolicy: Local}}")),
    );
    assert!(ok, "the full SweetyProxyConfig was rejected: {out}");
    for (spec, want) in [
        (
            "{service: {type: ClusterIP, externalTrafficPolicy: Local}}",
            "externalTrafficPolicy needs a LoadBalancer or NodePort Service",
        ),
        ("{limits: {idleTimeout: 10 minutes}}", "should match"),
        ("{logging: {format: xml}}", "Unsupported value: \"xml\""),
    ] {
        let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&pc(spec)));
        if ok || !out.contains(want) {
            failures.push(format!(
                "spec {spec}: expected rejection with {want:?}, got: {out}"
            ));
        }
    }
    let policy = |spec: &str| {
        format!("apiVersion: sweety.dev/v1alpha1\nkind: SweetySecurityPolicy\nmetadata: {{name: sp, namespace: {NS}}}\nspec: {{targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}}], {spec}}}\n")
    };
    let (ok, out) = kubectl(
        &["apply", "-f", "-"],
        Some(&policy("ipRules: {deny: [192.0.2.0/24]}")),
    );
    assert!(
        ok,
        "a SweetySecurityPolicy with ipRules was rejected: {out}"
    );
    for (spec, want) in [
        // The dataplane would refuse a config with it (the translator refuses it too).
        ("ipRules: {}", "ipRules must list at least one address"),
        (
            "ipRules: {allow: []}",
            "ipRules must list at least one address",
        ),
    ] {
        let (ok, out) = kubectl(&["apply", "-f", "-"], Some(&policy(spec)));
        if ok || !out.contains(want) {
            failures.push(format!(
                "policy {spec}: expected rejection with {want:?}, got: {out}"
            ));
        }
    }
    let _ = kubectl(&["delete", "namespace", NS, "--wait=false"], None);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
