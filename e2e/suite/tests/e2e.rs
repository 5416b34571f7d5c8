//! End-to-end tests of Sweety as installed by its Helm chart (e2e/run.sh runs them; see the crate docs for
//! the environment). Each test applies what it needs (server-side apply, idempotent) into its own namespace
//! and fetches it through the load-balancer address over HTTP/1.1 and HTTP/2 (curl) and HTTP/3 (quinn/h3):
//! an Ingress with TLS, a Gateway + HTTPRoute with TLS, and a SweetySite serving a ConfigMap. Statuses are
//! checked on every object. Further tests change a route and watch it being served, kill the dataplane and
//! then the controller container and check nothing is lost, and apply invalid objects that must get a clear
//! condition without breaking the valid ones; the ingress-nginx user guide's examples are applied and checked
//! request by request, and `sweety-controller migrate-report` judges them (the binary beside the test's
//! directory, or `SWEETY_E2E_CONTROLLER_BIN`); an Ingress with `ssl-passthrough` hands its host's TLS
//! connections to a backend that terminates TLS itself. Tests take a shared lock, so they never overlap.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sweety_e2e::client::{self, Reply, Target, Version};
use sweety_e2e::cluster::{self, expect_condition, Env};
use sweety_e2e::tls::{self, TestPki};
use sweety_e2e::{eventually, Error, Result};

/// Serialises the tests: the restart test must not overlap the others.
static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The echo backend's image: `SWEETY_E2E_ECHO_IMAGE`, default a local name the e2e node agent maps to the
/// echo-basic binary (e2e/kind/run.sh passes the conformance suite's image reference).
fn echo_image() -> String {
    std::env::var("SWEETY_E2E_ECHO_IMAGE").unwrap_or_else(|_| "sweety-e2e/echo-basic:v1.6.3".into())
}
/// The echo backend's `imagePullPolicy`: `SWEETY_E2E_PULL_POLICY`, default `IfNotPresent` (`Never` on the real
/// node, whose images are all imported: a pull there is a test error, never a download).
fn echo_pull_policy() -> String {
    std::env::var("SWEETY_E2E_PULL_POLICY").unwrap_or_else(|_| "IfNotPresent".into())
}
const INGRESS_NS: &str = "e2e-ingress";
const INGRESS_HOST: &str = "ingress.e2e.test";
const GATEWAY_NS: &str = "e2e-gateway";
const GATEWAY_HOST: &str = "gateway.e2e.test";
const SITE_NS: &str = "e2e-site";
const SITE_HOST: &str = "site.e2e.test";
const SITE_INDEX: &str = "<h1>sweety e2e static site</h1>\n";
/// Bound of every wait for the cluster to converge (the machine may be loaded).
const CONVERGE: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(250);

/// What a fixture serves: the load-balancer address, the host name and the CA of its certificate.
struct Served {
    addr: IpAddr,
    host: &'static str,
    pki: TestPki,
    /// What a GET of `/e2e/<anything>` must contain (echo backends report their namespace).
    expect: &'static str,
    path: &'static str,
}

impl Served {
    /// Its host and path over plain HTTP (port 80).
    fn plain(&self) -> Target<'static> {
        Target {
            addr: self.addr,
            host: self.host,
            path: self.path,
            ca_pem: None,
        }
    }
}

fn ip_of(v: Option<&Value>) -> std::result::Result<IpAddr, String> {
    v.and_then(Value::as_str)
        .ok_or_else(|| "no address yet".to_string())?
        .parse()
        .map_err(|e| format!("bad address: {e}"))
}

async fn namespace(env: &Env, name: &str) -> Result<()> {
    cluster::apply(
        &env.client,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    .await?;
    Ok(())
}

async fn tls_secret(env: &Env, ns: &str, hosts: &[&str]) -> Result<TestPki> {
    // Reuse the Secret's certificate if it exists (kept in an annotation with the CA), so re-running a
    // fixture does not rotate certificates under a running test.
    if let Some(s) = cluster::get(&env.client, "v1", "Secret", Some(ns), "tls").await? {
        let ann = |k: &str| {
            s.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(k))
                .cloned()
        };
        let data = |k: &str| {
            s.data
                .pointer(&format!("/data/{k}"))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        if let (Some(ca), Some(_), Some(_)) =
            (ann("sweety.dev/e2e-ca"), data("tls.crt"), data("tls.key"))
        {
            if let Some(cert) = ann("sweety.dev/e2e-cert") {
                return Ok(TestPki {
                    ca_pem: ca,
                    cert_pem: cert,
                    key_pem: String::new(),
                });
            }
        }
    }
    let pki = tls::generate(hosts)?;
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "tls", "namespace": ns,
                "annotations": {"sweety.dev/e2e-ca": pki.ca_pem, "sweety.dev/e2e-cert": pki.cert_pem}},
            "stringData": {"tls.crt": pki.cert_pem, "tls.key": pki.key_pem}
        }),
    )
    .await?;
    Ok(pki)
}

/// An echo-basic Deployment + Service `echo` (port 8080) in `ns`, waited for until available.
async fn echo(env: &Env, ns: &str) -> Result<()> {
    echo_named(env, ns, "echo").await
}

/// An echo-basic Deployment + Service `name` (port 8080; its pods are named `name-…`) in `ns`, waited for
/// until available.
async fn echo_named(env: &Env, ns: &str, name: &str) -> Result<()> {
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "terminationGracePeriodSeconds": 2,
                        "containers": [{
                            "name": "echo", "image": echo_image(), "imagePullPolicy": echo_pull_policy(),
                            "env": [
                                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
                            ],
                            "ports": [{"name": "http", "containerPort": 3000}],
                            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
                        }]
                    }
                }
            }
        }),
    )
    .await?;
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 8080, "targetPort": "http"}]}
        }),
    )
    .await?;
    eventually(
        &format!("{name} in {ns} available"),
        CONVERGE,
        POLL,
        || async {
            let d = cluster::get(&env.client, "apps/v1", "Deployment", Some(ns), name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no deployment")?;
            let avail = d
                .data
                .pointer("/status/availableReplicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            (avail >= 1)
                .then_some(())
                .ok_or(format!("availableReplicas {avail}"))
        },
    )
    .await
}

/// GatewayClass `sweety` is Accepted at its generation.
async fn gateway_class_accepted(env: &Env) -> Result<()> {
    eventually("GatewayClass sweety Accepted", CONVERGE, POLL, || async {
        let gc = cluster::get(
            &env.client,
            "gateway.networking.k8s.io/v1",
            "GatewayClass",
            None,
            "sweety",
        )
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no GatewayClass sweety")?;
        expect_condition(
            gc.data.pointer("/status/conditions"),
            "Accepted",
            "True",
            None,
            gc.metadata.generation,
        )
    })
    .await
}

async fn ingress_fixture(env: &Env) -> Result<Served> {
    namespace(env, INGRESS_NS).await?;
    let pki = tls_secret(env, INGRESS_NS, &[INGRESS_HOST]).await?;
    echo(env, INGRESS_NS).await?;
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            // Served on plain HTTP too (fetch_all checks both): ssl-redirect, on by default
            // for TLS hosts as in ingress-nginx, is turned off for this Ingress.
            "metadata": {"name": "echo", "namespace": INGRESS_NS,
                         "annotations": {"nginx.ingress.kubernetes.io/ssl-redirect": "false"}},
            "spec": {
                "ingressClassName": "sweety",
                "tls": [{"hosts": [INGRESS_HOST], "secretName": "tls"}],
                "rules": [{"host": INGRESS_HOST, "http": {"paths": [{
                    "path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "echo", "port": {"number": 8080}}}
                }]}}]
            }
        }),
    )
    .await?;
    // Ingress status: the chart Service's load-balancer address.
    let addr = eventually("Ingress load-balancer address", CONVERGE, POLL, || async {
        let i = object(env, ("networking.k8s.io/v1", "Ingress"), INGRESS_NS, "echo").await?;
        ip_of(i.data.pointer("/status/loadBalancer/ingress/0/ip"))
    })
    .await?;
    Ok(Served {
        addr,
        host: INGRESS_HOST,
        pki,
        expect: INGRESS_NS,
        path: "/e2e/ingress",
    })
}

fn http_route(rules_extra: Option<Value>) -> Value {
    let mut rule = json!({
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [{"name": "echo", "port": 8080}]
    });
    if let Some(f) = rules_extra {
        rule["filters"] = f;
    }
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "echo", "namespace": GATEWAY_NS},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [GATEWAY_HOST], "rules": [rule]}
    })
}

/// The HTTPRoute's parent status for Gateway `gw` has `kind`=`status` at the route's generation.
async fn route_condition(
    env: &Env,
    name: &str,
    kind: &str,
    status: &str,
    reason: Option<&str>,
) -> Result<()> {
    eventually(
        &format!("HTTPRoute {name} {kind}={status}"),
        CONVERGE,
        POLL,
        || async {
            let r = object(
                env,
                ("gateway.networking.k8s.io/v1", "HTTPRoute"),
                GATEWAY_NS,
                name,
            )
            .await?;
            let parents = r
                .data
                .pointer("/status/parents")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let p = parents
                .iter()
                .find(|p| p.pointer("/parentRef/name").and_then(Value::as_str) == Some("gw"))
                .ok_or("no parent status for gw")?;
            expect_condition(
                p.get("conditions"),
                kind,
                status,
                reason,
                r.metadata.generation,
            )
        },
    )
    .await
}

async fn gateway_fixture(env: &Env) -> Result<Served> {
    gateway_class_accepted(env).await?;
    namespace(env, GATEWAY_NS).await?;
    let pki = tls_secret(env, GATEWAY_NS, &[GATEWAY_HOST]).await?;
    echo(env, GATEWAY_NS).await?;
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": GATEWAY_NS},
            "spec": {
                "gatewayClassName": "sweety",
                "listeners": [
                    {"name": "http", "protocol": "HTTP", "port": 80, "hostname": GATEWAY_HOST},
                    {"name": "https", "protocol": "HTTPS", "port": 443, "hostname": GATEWAY_HOST,
                     "tls": {"mode": "Terminate", "certificateRefs": [{"name": "tls"}]}}
                ]
            }
        }),
    )
    .await?;
    // Keep a route change from an earlier test run out: the fixture is the plain route.
    cluster::apply(&env.client, http_route(None)).await?;
    let addr = eventually(
        "Gateway gw Accepted, Programmed, listeners Programmed, address",
        CONVERGE,
        POLL,
        || async {
            let g = object(
                env,
                ("gateway.networking.k8s.io/v1", "Gateway"),
                GATEWAY_NS,
                "gw",
            )
            .await?;
            let gen = g.metadata.generation;
            expect_condition(
                g.data.pointer("/status/conditions"),
                "Accepted",
                "True",
                None,
                gen,
            )?;
            expect_condition(
                g.data.pointer("/status/conditions"),
                "Programmed",
                "True",
                None,
                gen,
            )?;
            let listeners = g
                .data
                .pointer("/status/listeners")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if listeners.len() != 2 {
                return Err(format!("{} listener statuses", listeners.len()));
            }
            for l in &listeners {
                expect_condition(l.get("conditions"), "Programmed", "True", None, gen)
                    .map_err(|e| format!("listener {:?}: {e}", l.get("name")))?;
                expect_condition(l.get("conditions"), "ResolvedRefs", "True", None, gen)
                    .map_err(|e| format!("listener {:?}: {e}", l.get("name")))?;
            }
            ip_of(g.data.pointer("/status/addresses/0/value"))
        },
    )
    .await?;
    route_condition(env, "echo", "Accepted", "True", None).await?;
    route_condition(env, "echo", "ResolvedRefs", "True", None).await?;
    Ok(Served {
        addr,
        host: GATEWAY_HOST,
        pki,
        expect: GATEWAY_NS,
        path: "/e2e/gateway",
    })
}

async fn site_fixture(env: &Env) -> Result<Served> {
    namespace(env, SITE_NS).await?;
    let pki = tls_secret(env, SITE_NS, &[SITE_HOST]).await?;
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "content", "namespace": SITE_NS},
            "data": {"index.html": SITE_INDEX}
        }),
    )
    .await?;
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "sweety.dev/v1alpha1", "kind": "SweetySite",
            "metadata": {"name": "site", "namespace": SITE_NS},
            "spec": {
                "hostnames": [SITE_HOST],
                "tls": {"secretName": "tls"},
                "routes": [{"path": "/", "static": {"configMap": {"name": "content"}}}]
            }
        }),
    )
    .await?;
    let addr = eventually(
        "SweetySite Accepted, ResolvedRefs, Programmed, address",
        CONVERGE,
        POLL,
        || async {
            let s = object(env, SITE, SITE_NS, "site").await?;
            let c = s.data.pointer("/status/conditions");
            let gen = s.metadata.generation;
            expect_condition(c, "Accepted", "True", None, gen)?;
            expect_condition(c, "ResolvedRefs", "True", None, gen)?;
            expect_condition(c, "Programmed", "True", None, gen)?;
            ip_of(s.data.pointer("/status/addresses/0/value"))
        },
    )
    .await?;
    Ok(Served {
        addr,
        host: SITE_HOST,
        pki,
        expect: SITE_INDEX,
        path: "/index.html",
    })
}

/// Checks one reply: 200, the version asked for, and the expected content.
fn check(s: &Served, v: Version, r: &Reply) -> std::result::Result<(), String> {
    let want_version = match v {
        Version::H1 => "1.1",
        Version::H2 => "2",
        Version::H3 => "3",
    };
    if r.status != 200 || r.version != want_version {
        return Err(format!(
            "{v:?}: status {} version {} body {:?}",
            r.status, r.version, r.body
        ));
    }
    if s.expect == SITE_INDEX {
        return (r.body == SITE_INDEX)
            .then_some(())
            .ok_or(format!("{v:?}: body {:?}", r.body));
    }
    let j: Value = serde_json::from_str(&r.body)
        .map_err(|e| format!("{v:?}: not echo JSON ({e}): {:?}", r.body))?;
    let ns_ok = j.get("namespace").and_then(Value::as_str) == Some(s.expect);
    let pod_ok = j
        .get("pod")
        .and_then(Value::as_str)
        .is_some_and(|p| p.starts_with("echo-"));
    let path_ok = j.get("path").and_then(Value::as_str) == Some(s.path);
    (ns_ok && pod_ok && path_ok)
        .then_some(())
        .ok_or(format!("{v:?}: echo answered {j}"))
}

/// Fetches `s` over HTTP/1.1 (plain and TLS), HTTP/2 and HTTP/3 until each answers correctly (bounded:
/// a fresh object needs the controller and the dataplane to converge).
async fn fetch_all(env: &Env, s: &Served) -> Result<()> {
    let plain = s.plain();
    let tls = Target {
        ca_pem: Some(&s.pki.ca_pem),
        ..plain.clone()
    };
    eventually(
        &format!("http://{}{} over HTTP/1.1 via {}", s.host, s.path, s.addr),
        CONVERGE,
        POLL,
        || async {
            let r = client::get(&env.allowed, Version::H1, &plain)
                .await
                .map_err(|e| e.to_string())?;
            check(s, Version::H1, &r)
        },
    )
    .await?;
    for v in Version::ALL {
        eventually(
            &format!("https://{}{} over {v:?} via {}", s.host, s.path, s.addr),
            CONVERGE,
            POLL,
            || async {
                let r = client::get(&env.allowed, v, &tls)
                    .await
                    .map_err(|e| e.to_string())?;
                check(s, v, &r)
            },
        )
        .await?;
    }
    Ok(())
}

fn report(result: Result<()>) {
    if let Err(e) = result {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(&format!(": {s}"));
            src = s.source();
        }
        panic!("{msg}");
    }
}

/// A SweetySite's API version and kind.
const SITE: (&str, &str) = ("sweety.dev/v1alpha1", "SweetySite");

/// The object `kind` `name` (of `api_version`, in `namespace`) as the API server has it; an
/// error (for [`eventually`]) while it is missing.
async fn object(
    env: &Env,
    (api_version, kind): (&str, &str),
    namespace: &str,
    name: &str,
) -> std::result::Result<kube::api::DynamicObject, String> {
    cluster::get(&env.client, api_version, kind, Some(namespace), name)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no {kind} {name}"))
}
/// The Ingress, the Gateway and the SweetySite fixtures, in that order.
async fn every_fixture(env: &Env) -> Result<[Served; 3]> {
    Ok([
        ingress_fixture(env).await?,
        gateway_fixture(env).await?,
        site_fixture(env).await?,
    ])
}

/// Polls a GET of `t` over HTTP/1.1 (every 20 ms, for 30 s at most) until `check` accepts
/// the answer and its body read as JSON (the echo backend's).
async fn until_echoed(
    env: &Env,
    what: &str,
    t: &Target<'_>,
    check: impl Fn(&Reply, &Value) -> std::result::Result<(), String>,
) -> Result<()> {
    eventually(
        what,
        Duration::from_secs(30),
        Duration::from_millis(20),
        || async {
            let r = client::get(&env.allowed, Version::H1, t)
                .await
                .map_err(|e| e.to_string())?;
            let j: Value = serde_json::from_str(&r.body)
                .map_err(|e| format!("{} {e}: {:?}", r.status, r.body))?;
            check(&r, &j)
        },
    )
    .await
}

/// An e2e test of the installed chart, ignored unless asked for (e2e/run.sh): `$name` takes
/// the cluster's environment (named after the test) as `$env` and the suite's lock, and
/// reports what `$body` returns. Keep `$body` a call of a named `async fn`: rustfmt does not
/// format a macro's arguments, so code written inline here goes unformatted.
macro_rules! cluster_test {
    ($(#[$doc:meta])* $name:ident, |$env:ident| $body:expr) => {
        $(#[$doc])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "needs the installed chart on a cluster: run e2e/run.sh"]
        async fn $name() {
            let $env = cluster::env(stringify!($name)).await;
            let _g = LOCK.lock().await;
            report($body);
        }
    };
}

cluster_test! {
    ingress_with_tls_over_h1_h2_h3, |env| ingress_over_h1_h2_h3(&env).await
}

async fn ingress_over_h1_h2_h3(env: &Env) -> Result<()> {
    let s = ingress_fixture(env).await?;
    fetch_all(env, &s).await
}

cluster_test! {
    httproute_with_tls_over_h1_h2_h3, |env| httproute_over_h1_h2_h3(&env).await
}

async fn httproute_over_h1_h2_h3(env: &Env) -> Result<()> {
    let s = gateway_fixture(env).await?;
    fetch_all(env, &s).await
}

cluster_test! {
    sweetysite_static_over_h1_h2_h3, |env| sweetysite_over_h1_h2_h3(&env).await
}

async fn sweetysite_over_h1_h2_h3(env: &Env) -> Result<()> {
    let s = site_fixture(env).await?;
    fetch_all(env, &s).await
}

/// Applies a changed HTTPRoute (a request header set by a filter; echo-basic echoes request headers) and
/// polls until the change is served. The time from the apply to the first answer showing it is printed (the
/// goal is under a second; speed is measured by e2e/bench, so the bound here is only a hang guard).
async fn change_route_and_see_it_served(env: &Env, s: &Served) -> Result<Duration> {
    let nonce = format!(
        "{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let filter = json!([{"type": "RequestHeaderModifier",
        "requestHeaderModifier": {"set": [{"name": "X-E2e-Change", "value": nonce}]}}]);
    let t = s.plain();
    let start = Instant::now();
    cluster::apply(&env.client, http_route(Some(filter))).await?;
    until_echoed(env, "the changed route served", &t, |_, j| {
        let got = j.pointer("/headers/X-E2e-Change/0").and_then(Value::as_str);
        (got == Some(nonce.as_str()))
            .then_some(())
            .ok_or(format!("header {got:?}"))
    })
    .await?;
    let took = start.elapsed();
    println!("route change: applied → served in {} ms", took.as_millis());
    route_condition(env, "echo", "Accepted", "True", None).await?;
    Ok(took)
}

cluster_test! {
    changed_route_is_served, |env| change_route_and_back(&env).await
}

async fn change_route_and_back(env: &Env) -> Result<()> {
    let s = gateway_fixture(env).await?;
    fetch_all(env, &s).await?;
    change_route_and_see_it_served(env, &s).await?;
    // And back: the plain route again (the header disappears).
    cluster::apply(&env.client, http_route(None)).await?;
    let t = s.plain();
    until_echoed(env, "the reverted route served", &t, |r, j| {
        // An echo of this very request (echo-basic names the path it saw) without the header.
        let echoed = j.pointer("/path").and_then(Value::as_str) == Some(s.path);
        let header = j.pointer("/headers/X-E2e-Change");
        (r.status == 200 && echoed && header.is_none())
            .then_some(())
            .ok_or(format!(
                "{} path echoed: {echoed}, header {header:?}",
                r.status
            ))
    })
    .await
}

cluster_test! {
    killed_dataplane_then_controller_lose_no_config,
    |env| kill_dataplane_then_controller(&env).await
}

async fn kill_dataplane_then_controller(env: &Env) -> Result<()> {
    let all = every_fixture(env).await?;
    for s in &all {
        fetch_all(env, s).await?;
    }
    for container in ["dataplane", "controller"] {
        let pod = cluster::kill_container(env, container).await?;
        println!("killed the {container} container of {pod}; it restarted and the pod is Ready");
        for s in &all {
            fetch_all(env, s).await.map_err(|e| Error::Restart {
                container: container.into(),
                message: format!("after the restart: {e}"),
            })?;
        }
    }
    // The restarted controller still acts on changes and keeps the statuses.
    change_route_and_see_it_served(env, &all[1]).await?;
    cluster::apply(&env.client, http_route(None)).await?;
    gateway_fixture(env).await?;
    site_fixture(env).await?;
    Ok(())
}

cluster_test! {
    invalid_objects_get_a_condition_and_break_nothing,
    |env| apply_invalid_objects(&env).await
}

async fn apply_invalid_objects(env: &Env) -> Result<()> {
    let all = every_fixture(env).await?;
    // A route to a Service that does not exist, and a site claiming the Ingress's hostname.
    let broken_route = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "broken", "namespace": GATEWAY_NS},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": [GATEWAY_HOST],
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/broken"}}],
                       "backendRefs": [{"name": "no-such-service", "port": 8080}]}]}
    });
    let dup_site = json!({
        "apiVersion": "sweety.dev/v1alpha1", "kind": "SweetySite",
        "metadata": {"name": "dup", "namespace": SITE_NS},
        "spec": {"hostnames": [INGRESS_HOST],
            "routes": [{"path": "/", "static": {"configMap": {"name": "content"}}}]}
    });
    cluster::apply(&env.client, broken_route.clone()).await?;
    cluster::apply(&env.client, dup_site.clone()).await?;
    route_condition(
        env,
        "broken",
        "ResolvedRefs",
        "False",
        Some("BackendNotFound"),
    )
    .await?;
    eventually(
        "SweetySite dup Accepted=False HostnameConflict",
        CONVERGE,
        POLL,
        || async {
            let s = object(env, SITE, SITE_NS, "dup").await?;
            expect_condition(
                s.data.pointer("/status/conditions"),
                "Accepted",
                "False",
                Some("HostnameConflict"),
                s.metadata.generation,
            )
        },
    )
    .await?;
    // The broken rule answers an error, never another backend.
    let t = Target {
        addr: all[1].addr,
        host: GATEWAY_HOST,
        path: "/broken",
        ca_pem: None,
    };
    eventually("/broken answers 5xx", CONVERGE, POLL, || async {
        let r = client::get(&env.allowed, Version::H1, &t)
            .await
            .map_err(|e| e.to_string())?;
        (r.status >= 500).then_some(()).ok_or(format!(
            "a rule without a usable backend must answer 5xx, got {} {:?}",
            r.status, r.body
        ))
    })
    .await?;
    // Everything valid is still served, with its statuses unchanged.
    for s in &all {
        fetch_all(env, s).await?;
    }
    route_condition(env, "echo", "ResolvedRefs", "True", None).await?;
    site_fixture(env).await?;
    cluster::delete(&env.client, &broken_route).await?;
    cluster::delete(&env.client, &dup_site).await?;
    Ok(())
}

/// Pods of the chart in this test: three replicas, each a controller and a dataplane.
const REPLICAS: i32 = 3;
/// Bound of the request loop that runs across the leader's death (count and time).
const LOOP_MAX_REQUESTS: usize = 5000;
const LOOP_MAX_TIME: Duration = Duration::from_secs(240);

/// The chart's Deployment: its name, replica count and the controller's `--lease-name`.
async fn chart_deployment(env: &Env) -> Result<(String, i32, String)> {
    use k8s_openapi::api::apps::v1::Deployment;
    let api: kube::Api<Deployment> = kube::Api::namespaced(env.client.clone(), &env.namespace);
    let lp = kube::api::ListParams::default()
        .labels(&format!("app.kubernetes.io/instance={}", env.release));
    let list = api
        .list(&lp)
        .await
        .map_err(Error::kube("list chart Deployments"))?
        .items;
    let [d] = list.as_slice() else {
        return Err(Error::Config(format!(
            "expected one Deployment of release {} (chart kind Deployment), found {}",
            env.release,
            list.len()
        )));
    };
    let name = d.metadata.name.clone().unwrap_or_default();
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let lease = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .into_iter()
        .flat_map(|p| p.containers.iter())
        .filter(|c| c.name == "controller")
        .flat_map(|c| c.args.iter().flatten())
        .find_map(|a| a.strip_prefix("--lease-name=").map(str::to_string))
        .ok_or_else(|| Error::Config(format!("Deployment {name}: no --lease-name")))?;
    Ok((name, replicas, lease))
}

async fn scale(env: &Env, deployment: &str, replicas: i32) -> Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    let api: kube::Api<Deployment> = kube::Api::namespaced(env.client.clone(), &env.namespace);
    api.patch(
        deployment,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"replicas": replicas}})),
    )
    .await
    .map_err(Error::kube(format!("scale Deployment {deployment}")))?;
    Ok(())
}

/// Waits until exactly `n` chart pods run, none terminating, every container Ready; their names.
async fn ready_pods(env: &Env, n: usize) -> Result<Vec<String>> {
    eventually(&format!("{n} chart pods Ready"), CONVERGE, POLL, || async {
        let pods = cluster::chart_pods(env).await.map_err(|e| e.to_string())?;
        let ready: Vec<String> = pods
            .iter()
            .filter(|p| {
                ["controller", "dataplane"]
                    .iter()
                    .all(|c| cluster::container_state(p, c).is_some_and(|(_, r)| r))
            })
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        (ready.len() == n && pods.len() == n)
            .then_some(ready.clone())
            .ok_or(format!("{} pods, Ready: {ready:?}", pods.len()))
    })
    .await
}

/// The content hash every dataplane serves (its admin `/config`: the hash ignores the generation,
/// which each pod's controller numbers itself), once all `pods` serve the same one.
async fn one_config(env: &Env, pods: &[String]) -> Result<String> {
    eventually(
        "every dataplane serves the same config (admin /config hash)",
        CONVERGE,
        POLL,
        || async {
            let mut hashes = Vec::new();
            for p in pods {
                let body = cluster::pod_get(env, p, 9901, "/config")
                    .await
                    .map_err(|e| e.to_string())?;
                let j: Value = serde_json::from_str(&body).map_err(|e| format!("{p}: {e}"))?;
                let hash = j
                    .get("hash")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let generation = j.get("generation").and_then(Value::as_u64).unwrap_or(0);
                hashes.push((p.clone(), hash, generation));
            }
            let first = &hashes[0].1;
            (!first.is_empty() && hashes.iter().all(|(_, h, _)| h == first))
                .then(|| first.clone())
                .ok_or(format!("(pod, hash, generation): {hashes:?}"))
        },
    )
    .await
}

/// Container port of the Ingress HTTPS listener (the chart's `https` port of the dataplane).
const INGRESS_HTTPS_CONTAINER_PORT: u16 = 8443;

/// The default certificate (SHA-256 fingerprint) every one of `pods` presents to a real TLS client
/// (`openssl s_client` to each Pod's address, without SNI and with a name no certificate covers), once
/// all of them present the one the controller keeps in the Secret of `--generated-default-certificate`.
/// Fails when the chart was given a Secret (`--default-certificate`): this proves the default install.
async fn one_default_certificate(env: &Env, deployment: &str, pods: &[String]) -> Result<String> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{Pod, Secret};
    let d = kube::Api::<Deployment>::namespaced(env.client.clone(), &env.namespace)
        .get(deployment)
        .await
        .map_err(Error::kube(format!("get Deployment {deployment}")))?;
    let args: Vec<String> = d
        .spec
        .and_then(|s| s.template.spec)
        .into_iter()
        .flat_map(|p| p.containers)
        .filter(|c| c.name == "controller")
        .flat_map(|c| c.args.unwrap_or_default())
        .collect();
    if let Some(a) = args
        .iter()
        .find(|a| a.starts_with("--default-certificate="))
    {
        return Err(Error::Config(format!(
            "the chart was installed with {a}: this test proves the default (no Secret given)"
        )));
    }
    let name = args
        .iter()
        .find_map(|a| a.strip_prefix("--generated-default-certificate="))
        .ok_or_else(|| {
            Error::Config(format!(
                "Deployment {deployment}: no --generated-default-certificate"
            ))
        })?
        .to_string();
    let secrets: kube::Api<Secret> = kube::Api::namespaced(env.client.clone(), &env.namespace);
    let pods_api: kube::Api<Pod> = kube::Api::namespaced(env.client.clone(), &env.namespace);
    eventually(
        &format!("every replica presents the default certificate of Secret {name}"),
        CONVERGE,
        POLL,
        || async {
            let secret = secrets
                .get(&name)
                .await
                .map_err(|e| format!("Secret {name}: {e}"))?;
            let pem = secret
                .data
                .as_ref()
                .and_then(|d| d.get("tls.crt"))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .ok_or(format!("Secret {name} has no tls.crt"))?;
            let want = client::fingerprint(&pem).map_err(|e| e.to_string())?;
            let mut seen = Vec::new();
            for p in pods {
                let ip: IpAddr = pods_api
                    .get(p)
                    .await
                    .map_err(|e| format!("pod {p}: {e}"))?
                    .status
                    .and_then(|s| s.pod_ip)
                    .and_then(|ip| ip.parse().ok())
                    .ok_or(format!("pod {p} has no address"))?;
                let addr = std::net::SocketAddr::new(ip, INGRESS_HTTPS_CONTAINER_PORT);
                for sni in [None, Some("unknown.sweety-e2e.invalid")] {
                    let got = client::served_fingerprint(&env.allowed, addr, sni)
                        .await
                        .map_err(|e| e.to_string())?;
                    seen.push((p.clone(), sni, got));
                }
            }
            seen.iter()
                .all(|(_, _, f)| *f == want)
                .then(|| want.clone())
                .ok_or(format!(
                    "Secret {name}: {want}; presented (pod, SNI, fingerprint): {seen:?}"
                ))
        },
    )
    .await
}

/// The lease holder, once exactly one of `pods` says (metric `sweety_controller_leader`) it leads and the
/// Lease names it.
async fn one_leader(env: &Env, pods: &[String], lease: &str) -> Result<String> {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: kube::Api<Lease> = kube::Api::namespaced(env.client.clone(), &env.namespace);
    eventually(
        "exactly one leader, named by the Lease",
        CONVERGE,
        POLL,
        || async {
            let mut leaders = Vec::new();
            for p in pods {
                let text = cluster::pod_get(env, p, 9090, "/metrics")
                    .await
                    .map_err(|e| e.to_string())?;
                let leads = text.lines().any(|l| {
                    l.split_whitespace().collect::<Vec<_>>() == ["sweety_controller_leader", "1"]
                });
                if leads {
                    leaders.push(p.clone());
                }
            }
            let holder = leases
                .get_opt(lease)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|l| l.spec?.holder_identity)
                .unwrap_or_default();
            (leaders.len() == 1 && leaders[0] == holder)
                .then(|| holder.clone())
                .ok_or(format!(
                    "leading by their metrics: {leaders:?}; Lease holder {holder:?}"
                ))
        },
    )
    .await
}

/// What the request loop saw.
#[derive(Default, Debug)]
struct LoopTally {
    ok: usize,
    failed: usize,
    first_failures: Vec<String>,
    /// Whether the loop ran until `stop` (not ended early by its bounds).
    stopped: bool,
}

/// Sends HTTP/1.1 GETs to `s` one after another (each a new connection: curl) until `stop`, at most
/// LOOP_MAX_REQUESTS and LOOP_MAX_TIME; every answer must be a correct 200 from the echo backend.
async fn request_loop(
    allowed: cluster::Cidr,
    addr: IpAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> LoopTally {
    let served = Served {
        addr,
        host: GATEWAY_HOST,
        pki: TestPki {
            ca_pem: String::new(),
            cert_pem: String::new(),
            key_pem: String::new(),
        },
        expect: GATEWAY_NS,
        path: "/e2e/replicas",
    };
    let t = Target {
        addr,
        host: GATEWAY_HOST,
        path: served.path,
        ca_pem: None,
    };
    let start = Instant::now();
    let mut tally = LoopTally::default();
    while !stop.load(std::sync::atomic::Ordering::Relaxed)
        && tally.ok + tally.failed < LOOP_MAX_REQUESTS
        && start.elapsed() < LOOP_MAX_TIME
    {
        let outcome = match client::get(&allowed, Version::H1, &t).await {
            Ok(r) => check(&served, Version::H1, &r),
            Err(e) => Err(e.to_string()),
        };
        match outcome {
            Ok(()) => tally.ok += 1,
            Err(e) => {
                tally.failed += 1;
                if tally.first_failures.len() < 5 {
                    tally
                        .first_failures
                        .push(format!("{:.1}s: {e}", start.elapsed().as_secs_f64()));
                }
            }
        }
    }
    tally.stopped = stop.load(std::sync::atomic::Ordering::Relaxed);
    tally
}

/// With three replicas (the chart's Deployment scaled to 3 for the test, then back): every dataplane serves
/// the same config (content hash) and presents the same default certificate to a real TLS client (the one
/// the controller keeps in a Secret: the install passed none), exactly one controller leads (its metric and the Lease agree), and
/// deleting the leader's pod moves the leadership to another pod while a request loop through the
/// Gateway's address sees no failed request; the new leader writes statuses (a route change gets its
/// status at the new generation and is served).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the installed chart on a cluster: run e2e/run.sh"]
async fn three_replicas_serve_one_config_and_survive_the_leaders_death() {
    let env = cluster::env("three_replicas_serve_one_config_and_survive_the_leaders_death").await;
    let _g = LOCK.lock().await;
    let (deployment, before, lease) = match chart_deployment(&env).await {
        Ok(d) => d,
        Err(e) => return report(Err(e)),
    };
    let result = replicas_scenario(&env, &deployment, &lease).await;
    // Back to the installed count whatever happened (the other tests assume one pod).
    let restored = async {
        scale(&env, &deployment, before).await?;
        ready_pods(&env, usize::try_from(before).unwrap_or(1)).await
    }
    .await;
    report(result.and(restored.map(|_| ())));
}

async fn replicas_scenario(env: &Env, deployment: &str, lease: &str) -> Result<()> {
    let s = gateway_fixture(env).await?;
    // An Ingress with TLS: the Ingress HTTPS listener, which serves the default certificate.
    ingress_fixture(env).await?;
    cluster::apply(&env.client, http_route(None)).await?;
    scale(env, deployment, REPLICAS).await?;
    let pods = ready_pods(env, REPLICAS as usize).await?;
    let hash = one_config(env, &pods).await?;
    let leader = one_leader(env, &pods, lease).await?;
    println!("{REPLICAS} replicas {pods:?} serve config {hash}; leader {leader}");
    let certificate = one_default_certificate(env, deployment, &pods).await?;
    println!("every replica presents the default certificate {certificate}");
    fetch_all(env, &s).await?;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let looping = tokio::spawn(request_loop(env.allowed, s.addr, stop.clone()));
    // Let the loop run before the kill, so it covers a steady state too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pods_api: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(env.client.clone(), &env.namespace);
    let killed_at = Instant::now();
    let outcome = async {
        pods_api
            .delete(&leader, &kube::api::DeleteParams::default())
            .await
            .map_err(Error::kube(format!("delete the leader's pod {leader}")))?;
        // A replacement pod comes; the leadership moves to a pod other than the deleted one.
        let pods = ready_pods(env, REPLICAS as usize).await?;
        let new_leader = one_leader(env, &pods, lease).await?;
        if new_leader == leader {
            return Err(Error::Config(format!(
                "{leader} still leads after its deletion"
            )));
        }
        println!(
            "leader {leader} deleted; {new_leader} leads {:.1}s later",
            killed_at.elapsed().as_secs_f64()
        );
        // The new leader writes statuses: a route change gets its status at the new generation and is
        // served by every dataplane (the same config again, a new hash).
        change_route_and_see_it_served(env, &s).await?;
        route_condition(env, "echo", "Accepted", "True", None).await?;
        let changed = one_config(env, &pods).await?;
        if changed == hash {
            return Err(Error::Config(
                "the route change did not change the served config".into(),
            ));
        }
        cluster::apply(&env.client, http_route(None)).await?;
        route_condition(env, "echo", "Accepted", "True", None).await?;
        one_config(env, &pods).await?;
        // The replacement pod serves the same default certificate: nothing is regenerated.
        let after = one_default_certificate(env, deployment, &pods).await?;
        if after != certificate {
            return Err(Error::Config(format!(
                "the default certificate changed across the leader's death: {certificate} -> {after}"
            )));
        }
        // The loop covers the old pod's whole end (preStop sleep, SIGTERM, drain, exit).
        eventually(
            &format!("the deleted pod {leader} gone"),
            CONVERGE,
            POLL,
            || async {
                match pods_api.get_opt(&leader).await {
                    Ok(None) => Ok(()),
                    Ok(Some(_)) => Err("still there".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await?;
        Ok::<(), Error>(())
    }
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let tally = looping
        .await
        .map_err(|e| Error::Config(format!("request loop: {e}")))?;
    println!(
        "request loop across the leader's death: {} ok, {} failed over {:.1}s",
        tally.ok,
        tally.failed,
        killed_at.elapsed().as_secs_f64() + 2.0
    );
    outcome?;
    if !tally.stopped {
        return Err(Error::Config(format!(
            "the request loop ended on its bounds ({} requests, {LOOP_MAX_TIME:?}) before the \
             scenario did: it did not cover the leader's death ({tally:?})",
            tally.ok + tally.failed
        )));
    }
    if tally.failed > 0 || tally.ok < 20 {
        return Err(Error::Config(format!(
            "request loop: {} ok, {} failed (first: {:?})",
            tally.ok, tally.failed, tally.first_failures
        )));
    }
    Ok(())
}

/// Namespace of the ingress-nginx user-guide examples.
const NGINX_NS: &str = "e2e-nginx";
/// `foo:bar` as `htpasswd -c auth foo` writes it (`openssl passwd -apr1 -salt e2eSalt1 bar`).
const HTPASSWD_FOO_BAR: &str = "foo:$apr1$e2eSalt1$ybKFD4K1BXq0i42eEx0mC0\n";

fn nginx_host(name: &str) -> String {
    format!("{name}.nginx.e2e.test")
}

/// An Ingress of class `sweety` in [`NGINX_NS`]: `host`, one path to `service:8080`, the annotations
/// (names without the `nginx.ingress.kubernetes.io/` prefix).
fn nginx_ingress(
    name: &str,
    host: &str,
    path: (&str, &str),
    service: &str,
    annotations: &[(&str, &str)],
    tls: bool,
) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (format!("nginx.ingress.kubernetes.io/{k}"), json!(v)))
        .collect();
    let mut spec = json!({
        "ingressClassName": "sweety",
        "rules": [{"host": host, "http": {"paths": [{
            "path": path.0, "pathType": path.1,
            "backend": {"service": {"name": service, "port": {"number": 8080}}}
        }]}}]
    });
    if tls {
        spec["tls"] = json!([{"hosts": [host], "secretName": "tls"}]);
    }
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": NGINX_NS, "annotations": annotations},
        "spec": spec
    })
}

/// The echo JSON of a reply: (pod, path, request headers), or why the reply is not one.
fn echoed(r: &client::FullReply) -> std::result::Result<(String, String, Value), String> {
    if r.status != 200 {
        return Err(format!("status {} body {:?}", r.status, r.body));
    }
    let j: Value =
        serde_json::from_str(&r.body).map_err(|e| format!("not echo JSON ({e}): {:?}", r.body))?;
    if j.get("namespace").and_then(Value::as_str) != Some(NGINX_NS) {
        return Err(format!("another namespace's echo answered: {j}"));
    }
    let s = |k: &str| j.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    Ok((
        s("pod"),
        s("path"),
        j.get("headers").cloned().unwrap_or(Value::Null),
    ))
}

/// The first value of request header `name` (as echo-basic reports them: canonical case) in `headers`.
fn echoed_header<'a>(headers: &'a Value, name: &str) -> Option<&'a str> {
    headers
        .as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.get(0))
        .and_then(Value::as_str)
}

/// One check over HTTP/1.1 to `t` (curl arguments `extra`), retried until the configuration
/// has converged: `what` names it, `f` judges a reply. Returns the reply `f` accepted.
async fn expect<F>(
    env: &Env,
    what: &str,
    t: &Target<'_>,
    extra: &[&str],
    f: F,
) -> Result<client::FullReply>
where
    F: Fn(&client::FullReply) -> std::result::Result<(), String>,
{
    eventually(what, CONVERGE, POLL, || async {
        let r = client::request(&env.allowed, Version::H1, t, extra)
            .await
            .map_err(|e| e.to_string())?;
        f(&r).map(|()| r.clone())
    })
    .await
}

/// A check of one example's reply: its status is `want` (else the status and body, for the report).
fn status_is(want: u16) -> impl Fn(&client::FullReply) -> std::result::Result<(), String> {
    move |r| {
        (r.status == want)
            .then_some(())
            .ok_or(format!("status {} body {:?}", r.status, r.body))
    }
}

/// The ClusterIP of Service `name` in [`NGINX_NS`].
async fn cluster_ip(env: &Env, name: &str) -> Result<String> {
    eventually(&format!("ClusterIP of {name}"), CONVERGE, POLL, || async {
        let svc = cluster::get(&env.client, "v1", "Service", Some(NGINX_NS), name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no Service")?;
        svc.data
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .filter(|ip| ip.parse::<IpAddr>().is_ok())
            .map(str::to_string)
            .ok_or_else(|| "no ClusterIP".to_string())
    })
    .await
}

cluster_test! {
    /// The examples of the ingress-nginx user guide (issue 19), applied as the guide writes them (class
    /// `sweety`; an `auth-url` names the echo Service's ClusterIP, as the real node runs no cluster DNS) and
    /// checked through the load-balancer address with curl: rewrite with capture groups, canary by header,
    /// cookie and weight, basic authentication, external authentication (allow, deny, sign-in redirect and an
    /// unreachable service failing closed), client certificates, ssl-redirect with HSTS and the body-size
    /// limit. Then `sweety-controller migrate-report --output json` (the binary, read-only) judges the same
    /// Ingresses: none refused, each annotation honoured.
    ingress_nginx_user_guide_examples, |env| nginx_examples(&env).await
}

async fn nginx_examples(env: &Env) -> Result<()> {
    namespace(env, NGINX_NS).await?;
    let (rewrite, canary, weight, basic) = (
        nginx_host("rewrite"),
        nginx_host("canary"),
        nginx_host("weight"),
        nginx_host("basic"),
    );
    let (ext_allow, ext_signin, ext_deny, ext_down) = (
        nginx_host("ext-allow"),
        nginx_host("ext-signin"),
        nginx_host("ext-deny"),
        nginx_host("ext-down"),
    );
    let (mtls, hsts, body) = (nginx_host("mtls"), nginx_host("hsts"), nginx_host("body"));
    let pki = tls_secret(env, NGINX_NS, &[mtls.as_str(), hsts.as_str()]).await?;
    echo(env, NGINX_NS).await?;
    echo_named(env, NGINX_NS, "echo-canary").await?;
    // A Service without endpoints: an auth service that cannot be asked.
    cluster::apply(
        &env.client,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "auth-down", "namespace": NGINX_NS},
               "spec": {"selector": {"app": "no-such-pod"}, "ports": [{"name": "http", "port": 8080}]}}),
    )
    .await?;
    let echo_ip = cluster_ip(env, "echo").await?;
    let down_ip = cluster_ip(env, "auth-down").await?;
    let client_pki = tls::client("e2e client")?;
    let other_client = tls::client("stranger")?;
    cluster::apply(
        &env.client,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "basic-auth", "namespace": NGINX_NS},
               "type": "Opaque", "stringData": {"auth": HTPASSWD_FOO_BAR}}),
    )
    .await?;
    cluster::apply(
        &env.client,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ca-secret", "namespace": NGINX_NS},
               "type": "Opaque", "stringData": {"ca.crt": client_pki.ca_pem}}),
    )
    .await?;
    let auth_ok = format!("http://{echo_ip}:8080/status/200");
    let auth_401 = format!("http://{echo_ip}:8080/status/401");
    let auth_down = format!("http://{down_ip}:8080/verify");
    let ca_secret = format!("{NGINX_NS}/ca-secret");
    let prefix = ("/", "Prefix");
    let ingresses = [
        // docs/examples/rewrite: `/something(/|$)(.*)` to `/$2`.
        nginx_ingress(
            "rewrite",
            &rewrite,
            ("/something(/|$)(.*)", "ImplementationSpecific"),
            "echo",
            &[("use-regex", "true"), ("rewrite-target", "/$2")],
            false,
        ),
        // docs/examples/canary: production, and a canary by header, then cookie, weight 0.
        nginx_ingress("production", &canary, prefix, "echo", &[], false),
        nginx_ingress(
            "canary",
            &canary,
            prefix,
            "echo-canary",
            &[
                ("canary", "true"),
                ("canary-by-header", "X-Canary"),
                ("canary-by-cookie", "canary"),
            ],
            false,
        ),
        nginx_ingress("weight-production", &weight, prefix, "echo", &[], false),
        nginx_ingress(
            "weight-canary",
            &weight,
            prefix,
            "echo-canary",
            &[("canary", "true"), ("canary-weight", "100")],
            false,
        ),
        // docs/examples/auth/basic.
        nginx_ingress(
            "basic",
            &basic,
            prefix,
            "echo",
            &[
                ("auth-type", "basic"),
                ("auth-secret", "basic-auth"),
                ("auth-realm", "Authentication Required - foo"),
            ],
            false,
        ),
        // docs/examples/auth/external-auth and oauth-external-auth (auth-url + auth-signin).
        nginx_ingress(
            "ext-allow",
            &ext_allow,
            prefix,
            "echo",
            &[("auth-url", &auth_ok)],
            false,
        ),
        nginx_ingress(
            "ext-signin",
            &ext_signin,
            prefix,
            "echo",
            &[
                ("auth-url", &auth_401),
                (
                    "auth-signin",
                    "https://signin.nginx.e2e.test/oauth2/start?rd=$escaped_request_uri",
                ),
            ],
            false,
        ),
        nginx_ingress(
            "ext-deny",
            &ext_deny,
            prefix,
            "echo",
            &[("auth-url", &auth_401)],
            false,
        ),
        nginx_ingress(
            "ext-down",
            &ext_down,
            prefix,
            "echo",
            &[("auth-url", &auth_down)],
            false,
        ),
        // docs/examples/auth/client-certs.
        nginx_ingress(
            "mtls",
            &mtls,
            prefix,
            "echo",
            &[
                ("auth-tls-verify-client", "on"),
                ("auth-tls-secret", &ca_secret),
                ("auth-tls-verify-depth", "1"),
                ("auth-tls-pass-certificate-to-upstream", "true"),
            ],
            true,
        ),
        // TLS with ingress-nginx's defaults: ssl-redirect on, HSTS.
        nginx_ingress("hsts", &hsts, prefix, "echo", &[], true),
        // docs/user-guide/nginx-configuration/annotations.md#custom-max-body-size.
        nginx_ingress(
            "body",
            &body,
            prefix,
            "echo",
            &[("proxy-body-size", "64k")],
            false,
        ),
    ];
    for ing in &ingresses {
        cluster::apply(&env.client, ing.clone()).await?;
    }
    // Every Ingress gets the load-balancer address (the same Service for all).
    let mut addr = None;
    for ing in &ingresses {
        let name = ing["metadata"]["name"].as_str().unwrap_or_default();
        let ip = eventually(
            &format!("Ingress {name} load-balancer address"),
            CONVERGE,
            POLL,
            || async {
                let i = object(env, ("networking.k8s.io/v1", "Ingress"), NGINX_NS, name).await?;
                ip_of(i.data.pointer("/status/loadBalancer/ingress/0/ip"))
            },
        )
        .await?;
        addr.get_or_insert(ip);
    }
    let addr = addr.ok_or_else(|| Error::Config("no Ingress".into()))?;

    let at = |host: &'static str, path: &'static str| Target {
        addr,
        host,
        path,
        ca_pem: None,
    };
    // `Target` borrows its strings: the hosts live for the test.
    let leak = |s: &String| -> &'static str { Box::leak(s.clone().into_boxed_str()) };
    let (rewrite, canary, weight, basic) =
        (leak(&rewrite), leak(&canary), leak(&weight), leak(&basic));
    let (ext_allow, ext_signin, ext_deny, ext_down) = (
        leak(&ext_allow),
        leak(&ext_signin),
        leak(&ext_deny),
        leak(&ext_down),
    );
    let (mtls, hsts, body) = (leak(&mtls), leak(&hsts), leak(&body));

    // Rewrite: the second capture group is the backend's path.
    for (path, want) in [
        ("/something", "/"),
        ("/something/", "/"),
        ("/something/new", "/new"),
        ("/something/a/b?x=1", "/a/b?x=1"),
    ] {
        expect(
            env,
            &format!("rewrite {path} -> {want}"),
            &at(rewrite, path),
            &[],
            |r| {
                let (_, got, _) = echoed(r)?;
                (got == want)
                    .then_some(())
                    .ok_or(format!("backend path {got:?}"))
            },
        )
        .await?;
    }
    expect(
        env,
        "rewrite: no match is 404",
        &at(rewrite, "/other"),
        &[],
        status_is(404),
    )
    .await?;

    // Canary: header before cookie; weight 100 sends everything to the canary.
    let pod_of = |want_canary: bool| {
        move |r: &client::FullReply| {
            let (pod, _, _) = echoed(r)?;
            (pod.starts_with("echo-canary-") == want_canary)
                .then_some(())
                .ok_or(format!("answered by {pod}"))
        }
    };
    expect(
        env,
        "canary: plain request to production",
        &at(canary, "/"),
        &[],
        pod_of(false),
    )
    .await?;
    expect(
        env,
        "canary: X-Canary always",
        &at(canary, "/"),
        &["-H", "X-Canary: always"],
        pod_of(true),
    )
    .await?;
    expect(
        env,
        "canary: cookie always",
        &at(canary, "/"),
        &["-b", "canary=always"],
        pod_of(true),
    )
    .await?;
    expect(
        env,
        "canary: X-Canary never wins over the cookie",
        &at(canary, "/"),
        &["-H", "X-Canary: never", "-b", "canary=always"],
        pod_of(false),
    )
    .await?;
    for _ in 0..5 {
        expect(
            env,
            "canary-weight 100",
            &at(weight, "/"),
            &[],
            pod_of(true),
        )
        .await?;
    }

    // Basic authentication.
    let r = expect(
        env,
        "basic: no credentials is 401",
        &at(basic, "/"),
        &[],
        status_is(401),
    )
    .await?;
    let realm = r.header("www-authenticate").unwrap_or_default();
    if realm != "Basic realm=\"Authentication Required - foo\"" {
        return Err(Error::Config(format!("basic: WWW-Authenticate {realm:?}")));
    }
    expect(
        env,
        "basic: foo:bar passes",
        &at(basic, "/"),
        &["-u", "foo:bar"],
        |r| echoed(r).map(drop),
    )
    .await?;
    expect(
        env,
        "basic: a wrong password is 401",
        &at(basic, "/"),
        &["-u", "foo:baz"],
        status_is(401),
    )
    .await?;

    // External authentication.
    expect(env, "ext auth allows", &at(ext_allow, "/app"), &[], |r| {
        echoed(r).map(drop)
    })
    .await?;
    let r = expect(
        env,
        "ext auth denies with a sign-in redirect",
        &at(ext_signin, "/app?x=1"),
        &[],
        |r| {
            (r.status == 302)
                .then_some(())
                .ok_or(format!("status {} body {:?}", r.status, r.body))
        },
    )
    .await?;
    let location = r.header("location").unwrap_or_default();
    if !location.starts_with("https://signin.nginx.e2e.test/oauth2/start?rd=")
        || !location.contains("%2Fapp%3Fx%3D1")
    {
        return Err(Error::Config(format!(
            "ext auth sign-in: Location {location:?}"
        )));
    }
    expect(
        env,
        "ext auth denies (401)",
        &at(ext_deny, "/app"),
        &[],
        status_is(401),
    )
    .await?;
    expect(
        env,
        "ext auth service down fails closed",
        &at(ext_down, "/app"),
        &[],
        |r| {
            (r.status >= 500 && !r.body.contains("\"namespace\""))
                .then_some(())
                .ok_or(format!("status {} body {:?}", r.status, r.body))
        },
    )
    .await?;

    // Client certificates (HTTP/1.1 over TLS, SNI = the host).
    let tls_at = |host: &'static str, path: &'static str| Target {
        ca_pem: Some(leak(&pki.ca_pem)),
        ..at(host, path)
    };
    let dir = std::env::temp_dir().join(format!("sweety-e2e-nginx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(Error::io("temp dir"))?;
    let file = |name: &str, text: &str| -> Result<String> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(Error::io("writing a test file"))?;
        Ok(p.to_string_lossy().into_owned())
    };
    let (cert, key) = (
        file("client.crt", &client_pki.cert_pem)?,
        file("client.key", &client_pki.key_pem)?,
    );
    let (other_cert, other_key) = (
        file("other.crt", &other_client.cert_pem)?,
        file("other.key", &other_client.key_pem)?,
    );
    let r = expect(
        env,
        "mtls: the CA's client passes",
        &tls_at(mtls, "/"),
        &["--cert", &cert, "--key", &key],
        |r| {
            let (_, _, headers) = echoed(r)?;
            let verify = echoed_header(&headers, "ssl-client-verify");
            let passed = echoed_header(&headers, "ssl-client-cert").unwrap_or_default();
            (verify == Some("SUCCESS") && passed.starts_with("-----BEGIN%20CERTIFICATE-----"))
                .then_some(())
                .ok_or(format!(
                    "ssl-client-verify {verify:?}, ssl-client-cert {passed:?}"
                ))
        },
    )
    .await?;
    let (_, _, headers) = echoed(&r).map_err(Error::Config)?;
    let dn = echoed_header(&headers, "ssl-client-subject-dn").unwrap_or_default();
    if dn != "CN=e2e client" {
        return Err(Error::Config(format!("mtls: ssl-client-subject-dn {dn:?}")));
    }
    expect(
        env,
        "mtls: no certificate is 400",
        &tls_at(mtls, "/"),
        &[],
        status_is(400),
    )
    .await?;
    expect(
        env,
        "mtls: another CA's certificate is 400",
        &tls_at(mtls, "/"),
        &["--cert", &other_cert, "--key", &other_key],
        status_is(400),
    )
    .await?;

    // ssl-redirect (on by default for a TLS host) and HSTS with nginx's defaults.
    let r = expect(
        env,
        "hsts: http redirects to https",
        &at(hsts, "/page?q=1"),
        &[],
        status_is(308),
    )
    .await?;
    let location = r.header("location").unwrap_or_default();
    if location != format!("https://{hsts}/page?q=1") {
        return Err(Error::Config(format!(
            "ssl-redirect: Location {location:?}"
        )));
    }
    let r = expect(env, "hsts: https is served", &tls_at(hsts, "/"), &[], |r| {
        echoed(r).map(drop)
    })
    .await?;
    let sts = r.header("strict-transport-security").unwrap_or_default();
    if sts != "max-age=31536000; includeSubDomains" {
        return Err(Error::Config(format!("HSTS header {sts:?}")));
    }

    // proxy-body-size 64k: 64 KiB passes, one byte more is 413.
    let small = file("small.bin", &"a".repeat(64 * 1024))?;
    let large = file("large.bin", &"a".repeat(64 * 1024 + 1))?;
    expect(
        env,
        "body: 64 KiB passes",
        &at(body, "/upload"),
        &["--data-binary", &format!("@{small}")],
        |r| echoed(r).map(drop),
    )
    .await?;
    expect(
        env,
        "body: 64 KiB + 1 is 413",
        &at(body, "/upload"),
        &["--data-binary", &format!("@{large}")],
        status_is(413),
    )
    .await?;
    let _ = std::fs::remove_dir_all(&dir);

    // The migration report on the same Ingresses: the controller binary, read-only, JSON.
    let bin = std::env::var("SWEETY_E2E_CONTROLLER_BIN").unwrap_or_else(|_| {
        // Beside this test binary's directory (target/debug/deps -> target/debug).
        std::env::current_exe()
            .ok()
            .and_then(|p| Some(p.parent()?.parent()?.join("sweety-controller")))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sweety-controller".into())
    });
    let kubeconfig = std::env::var("SWEETY_E2E_KUBECONFIG")
        .map_err(|_| Error::Config("SWEETY_E2E_KUBECONFIG".into()))?;
    let out = tokio::process::Command::new(&bin)
        .args([
            "--kubeconfig",
            &kubeconfig,
            "migrate-report",
            "--namespace",
            NGINX_NS,
            "--output",
            "json",
        ])
        .output()
        .await
        .map_err(Error::io(format!(
            "running {bin} migrate-report (build it with `cargo build -p sweety-controller`, or name it in \
             SWEETY_E2E_CONTROLLER_BIN)"
        )))?;
    if !out.status.success() {
        return Err(Error::Config(format!(
            "migrate-report: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let reports: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| Error::Config(format!("migrate-report JSON: {e}")))?;
    let reports = reports.as_array().cloned().unwrap_or_default();
    let mut names: Vec<&str> = reports.iter().filter_map(|r| r["name"].as_str()).collect();
    names.sort_unstable();
    let mut want: Vec<&str> = ingresses
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    want.sort_unstable();
    if names != want {
        return Err(Error::Config(format!(
            "migrate-report lists {names:?}, want {want:?}"
        )));
    }
    for r in &reports {
        let name = r["name"].as_str().unwrap_or_default();
        if !r["refused"].is_null() {
            return Err(Error::Config(format!(
                "migrate-report refuses {name}: {}",
                r["refused"]
            )));
        }
        if r["class"] != "sweety" {
            return Err(Error::Config(format!(
                "migrate-report: {name} class {}",
                r["class"]
            )));
        }
        for a in r["annotations"].as_array().into_iter().flatten() {
            let support = a["support"].as_str().unwrap_or_default();
            if !matches!(support, "honoured" | "honoured-differently") {
                return Err(Error::Config(format!(
                    "migrate-report: {name} {} is {support}: {}",
                    a["annotation"], a["how"]
                )));
            }
        }
    }
    let verdict = |ing: &str, ann: &str| -> Option<String> {
        reports.iter().find(|r| r["name"] == ing)?["annotations"]
            .as_array()?
            .iter()
            .find(|a| a["annotation"] == ann)
            .and_then(|a| a["support"].as_str().map(str::to_string))
    };
    for (ing, ann) in [
        ("rewrite", "rewrite-target"),
        ("canary", "canary-by-header"),
        ("weight-canary", "canary-weight"),
        ("basic", "auth-type"),
        ("ext-signin", "auth-signin"),
        ("mtls", "auth-tls-secret"),
        ("body", "proxy-body-size"),
    ] {
        if verdict(ing, ann).is_none() {
            return Err(Error::Config(format!(
                "migrate-report: no verdict on {ing} {ann}"
            )));
        }
    }
    println!(
        "ingress-nginx examples: {} Ingresses served as the guide says; migrate-report agrees",
        ingresses.len()
    );
    Ok(())
}

const POLICY_NS: &str = "e2e-policy";
const POLICY_HOST: &str = "policy.e2e.test";

cluster_test! {
    /// SweetySecurityPolicy (issue 19) through the load-balancer address: Gateway `policy-gw`'s
    /// policy denies every IPv4 client, HTTPRoute `guarded`'s rule `admin` has its own policy
    /// (basic auth, realm Staff) that replaces it whole, HTTPRoute `broken`'s names a Secret that
    /// does not exist. `/` answers 403; `/admin` 401 with the realm without or with wrong
    /// credentials and the echo with `foo:bar`; `/broken` 500; the policies' statuses name the
    /// Gateway as ancestor (Accepted True, and False/Invalid for `broken`).
    security_policy_guards_gateway_routes, |env| security_policy(&env).await
}

async fn security_policy(env: &Env) -> Result<()> {
    gateway_class_accepted(env).await?;
    namespace(env, POLICY_NS).await?;
    echo(env, POLICY_NS).await?;
    let route = |name: &str, rules: Value| {
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": POLICY_NS},
            "spec": {"parentRefs": [{"name": "policy-gw"}], "hostnames": [POLICY_HOST], "rules": rules}
        })
    };
    let policy = |name: &str, target: Value, spec: Value| {
        let mut spec = spec;
        spec["targetRefs"] = json!([target]);
        json!({
            "apiVersion": "sweety.dev/v1alpha1", "kind": "SweetySecurityPolicy",
            "metadata": {"name": name, "namespace": POLICY_NS}, "spec": spec
        })
    };
    let backend = json!([{"name": "echo", "port": 8080}]);
    for o in [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "htpasswd", "namespace": POLICY_NS},
               "type": "Opaque", "stringData": {"auth": HTPASSWD_FOO_BAR}}),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "policy-gw", "namespace": POLICY_NS},
            "spec": {"gatewayClassName": "sweety",
                     "listeners": [{"name": "http", "protocol": "HTTP", "port": 80, "hostname": POLICY_HOST}]}
        }),
        route(
            "guarded",
            json!([
                {"name": "admin", "matches": [{"path": {"type": "PathPrefix", "value": "/admin"}}], "backendRefs": backend},
                {"name": "open", "matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": backend}
            ]),
        ),
        route(
            "broken",
            json!([{"matches": [{"path": {"type": "PathPrefix", "value": "/broken"}}], "backendRefs": backend}]),
        ),
        policy(
            "deny-all",
            json!({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "policy-gw"}),
            json!({"ipRules": {"deny": ["0.0.0.0/0"]}}),
        ),
        policy(
            "staff",
            json!({"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "guarded", "sectionName": "admin"}),
            json!({"basicAuth": {"secretRef": {"name": "htpasswd"}, "realm": "Staff"}}),
        ),
        policy(
            "broken",
            json!({"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "broken"}),
            json!({"basicAuth": {"secretRef": {"name": "no-such-secret"}}}),
        ),
    ] {
        cluster::apply(&env.client, o).await?;
    }
    let addr = eventually("Gateway policy-gw address", CONVERGE, POLL, || async {
        let g = object(
            env,
            ("gateway.networking.k8s.io/v1", "Gateway"),
            POLICY_NS,
            "policy-gw",
        )
        .await?;
        expect_condition(
            g.data.pointer("/status/conditions"),
            "Programmed",
            "True",
            None,
            g.metadata.generation,
        )?;
        ip_of(g.data.pointer("/status/addresses/0/value"))
    })
    .await?;
    let at = |path: &'static str| Target {
        addr,
        host: POLICY_HOST,
        path,
        ca_pem: None,
    };
    expect(
        env,
        "the Gateway's deny list: / is 403",
        &at("/"),
        &[],
        status_is(403),
    )
    .await?;
    for (what, extra) in [
        ("no credentials", &[][..]),
        ("a wrong password", &["-u", "foo:wrong"][..]),
    ] {
        let r = expect(
            env,
            &format!("/admin with {what} is 401"),
            &at("/admin"),
            extra,
            status_is(401),
        )
        .await?;
        let realm = r.header("www-authenticate").unwrap_or_default();
        if realm != "Basic realm=\"Staff\"" {
            return Err(Error::Config(format!("/admin: WWW-Authenticate {realm:?}")));
        }
    }
    expect(
        env,
        "/admin with foo:bar reaches the echo (the rule's policy replaces the Gateway's)",
        &at("/admin/x"),
        &["-u", "foo:bar"],
        |r| {
            let j: Value = serde_json::from_str(&r.body)
                .map_err(|e| format!("status {} not echo JSON ({e}): {:?}", r.status, r.body))?;
            (r.status == 200 && j.get("path").and_then(Value::as_str) == Some("/admin/x"))
                .then_some(())
                .ok_or(format!("status {} {j}", r.status))
        },
    )
    .await?;
    expect(
        env,
        "/broken (its policy's Secret is missing) is 500",
        &at("/broken"),
        &["-u", "foo:bar"],
        status_is(500),
    )
    .await?;
    // Each policy's status names the Gateway as ancestor.
    for (name, status, reason) in [
        ("deny-all", "True", "Accepted"),
        ("staff", "True", "Accepted"),
        ("broken", "False", "Invalid"),
    ] {
        eventually(
            &format!("SweetySecurityPolicy {name} Accepted={status} through policy-gw"),
            CONVERGE,
            POLL,
            || async {
                let p = object(
                    env,
                    ("sweety.dev/v1alpha1", "SweetySecurityPolicy"),
                    POLICY_NS,
                    name,
                )
                .await?;
                let ancestors = p
                    .data
                    .pointer("/status/ancestors")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let a = ancestors
                    .iter()
                    .find(|a| {
                        a.pointer("/ancestorRef/name").and_then(Value::as_str) == Some("policy-gw")
                    })
                    .ok_or(format!("ancestors {ancestors:?}"))?;
                expect_condition(
                    a.get("conditions"),
                    "Accepted",
                    status,
                    Some(reason),
                    p.metadata.generation,
                )
            },
        )
        .await?;
    }
    Ok(())
}

/// Namespace of the ssl-passthrough test.
const PASSTHROUGH_NS: &str = "e2e-passthrough";
const PASSTHROUGH_HOST: &str = "passthrough.e2e.test";

/// ssl-passthrough on the real node (issue 19's `nginx.ingress.kubernetes.io/ssl-passthrough`): the chart's
/// SweetyProxyConfig allows it for the test (`spec.ingress.sslPassthrough`, the test's own field, removed at the
/// end), an echo-basic backend terminates TLS itself (its certificate for the host from the test's CA, HTTPS on
/// 8443), and an Ingress with the annotation sends the host's TLS connections on port 443 to it untouched. Checked
/// through the load-balancer address: the certificate `openssl s_client` gets for the host is the backend's own,
/// and curl (trusting only the test CA) gets the echo's answer with none of the fields a terminating proxy adds
/// (`X-Forwarded-For`, `X-Request-Id`): the bytes went through, not a proxied request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the installed chart on a cluster: run e2e/run.sh"]
async fn ingress_ssl_passthrough_reaches_the_backends_tls() {
    let env = cluster::env("ingress_ssl_passthrough_reaches_the_backends_tls").await;
    let _g = LOCK.lock().await;
    let result = ssl_passthrough(&env).await;
    // Whatever happened, the class goes back to refusing ssl-passthrough.
    let cleanup = passthrough_allowed(&env, false).await;
    report(result.and(cleanup));
}

/// Sets (or removes) the test's `spec.ingress.sslPassthrough: true` on the SweetyProxyConfig of IngressClass
/// `sweety` (the chart's).
async fn passthrough_allowed(env: &Env, on: bool) -> Result<()> {
    let class = cluster::get(
        &env.client,
        "networking.k8s.io/v1",
        "IngressClass",
        None,
        "sweety",
    )
    .await?
    .ok_or_else(|| Error::Config("no IngressClass sweety".into()))?;
    let p = |k: &str| {
        class
            .data
            .pointer(&format!("/spec/parameters/{k}"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| Error::Config(format!("IngressClass sweety has no parameters.{k}")))
    };
    let (ns, name) = (p("namespace")?, p("name")?);
    let spec = if on {
        json!({"ingress": {"sslPassthrough": true}})
    } else {
        json!({})
    };
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "sweety.dev/v1alpha1", "kind": "SweetyProxyConfig",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec
        }),
    )
    .await?;
    Ok(())
}

async fn ssl_passthrough(env: &Env) -> Result<()> {
    namespace(env, PASSTHROUGH_NS).await?;
    let pki = tls_secret(env, PASSTHROUGH_NS, &[PASSTHROUGH_HOST]).await?;
    passthrough_allowed(env, true).await?;
    // An echo-basic that serves HTTPS itself (TLS_SERVER_CERT/TLS_SERVER_PRIVKEY, port 8443).
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "echo-tls", "namespace": PASSTHROUGH_NS},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "echo-tls"}},
                "template": {
                    "metadata": {"labels": {"app": "echo-tls"}},
                    "spec": {
                        "terminationGracePeriodSeconds": 2,
                        "volumes": [{"name": "tls", "secret": {"secretName": "tls"}}],
                        "containers": [{
                            "name": "echo", "image": echo_image(), "imagePullPolicy": echo_pull_policy(),
                            "env": [
                                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                                {"name": "TLS_SERVER_CERT", "value": "/etc/tls/tls.crt"},
                                {"name": "TLS_SERVER_PRIVKEY", "value": "/etc/tls/tls.key"}
                            ],
                            "volumeMounts": [{"name": "tls", "mountPath": "/etc/tls", "readOnly": true}],
                            "ports": [{"name": "http", "containerPort": 3000}, {"name": "https", "containerPort": 8443}],
                            "readinessProbe": {"tcpSocket": {"port": "https"}, "periodSeconds": 1}
                        }]
                    }
                }
            }
        }),
    )
    .await?;
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "echo-tls", "namespace": PASSTHROUGH_NS},
            "spec": {"selector": {"app": "echo-tls"}, "ports": [{"name": "https", "port": 8443, "targetPort": "https"}]}
        }),
    )
    .await?;
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "passthrough", "namespace": PASSTHROUGH_NS,
                         "annotations": {"nginx.ingress.kubernetes.io/ssl-passthrough": "true"}},
            "spec": {
                "ingressClassName": "sweety",
                "rules": [{"host": PASSTHROUGH_HOST, "http": {"paths": [{
                    "path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "echo-tls", "port": {"number": 8443}}}
                }]}}]
            }
        }),
    )
    .await?;
    let addr = eventually(
        "passthrough Ingress load-balancer address",
        CONVERGE,
        POLL,
        || async {
            let i = object(
                env,
                ("networking.k8s.io/v1", "Ingress"),
                PASSTHROUGH_NS,
                "passthrough",
            )
            .await?;
            ip_of(i.data.pointer("/status/loadBalancer/ingress/0/ip"))
        },
    )
    .await?;
    // The backend's own certificate, not one Sweety holds.
    let want = client::fingerprint(&pki.cert_pem)?;
    eventually(
        "the backend's certificate for the host",
        CONVERGE,
        POLL,
        || async {
            let got = client::served_fingerprint(
                &env.allowed,
                std::net::SocketAddr::new(addr, 443),
                Some(PASSTHROUGH_HOST),
            )
            .await
            .map_err(|e| e.to_string())?;
            (got == want)
                .then_some(())
                .ok_or(format!("certificate {got}, the backend's is {want}"))
        },
    )
    .await?;
    let t = Target {
        addr,
        host: PASSTHROUGH_HOST,
        path: "/e2e/passthrough",
        ca_pem: Some(&pki.ca_pem),
    };
    expect(env, "the echo's answer through the tunnel", &t, &[], |r| {
        if r.status != 200 {
            return Err(format!("status {} body {:?}", r.status, r.body));
        }
        let j: Value = serde_json::from_str(&r.body)
            .map_err(|e| format!("not echo JSON ({e}): {:?}", r.body))?;
        if j.get("namespace").and_then(Value::as_str) != Some(PASSTHROUGH_NS) {
            return Err(format!("another echo answered: {j}"));
        }
        let headers = j.get("headers").cloned().unwrap_or(Value::Null);
        for f in ["X-Forwarded-For", "X-Request-Id"] {
            if let Some(v) = echoed_header(&headers, f) {
                return Err(format!(
                    "{f}: {v}: the request was proxied, not passed through"
                ));
            }
        }
        Ok(())
    })
    .await?;
    cluster::delete(
        &env.client,
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": {"name": "passthrough", "namespace": PASSTHROUGH_NS}}),
    )
    .await
}
