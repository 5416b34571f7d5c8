//! End-to-end tests of Sweety as installed by its Helm chart (e2e/run.sh runs them; see the crate docs for
//! the environment). Each test applies what it needs (server-side apply, idempotent) into its own namespace
//! and fetches it through the load-balancer address over HTTP/1.1 and HTTP/2 (curl) and HTTP/3 (quinn/h3):
//! an Ingress with TLS, a Gateway + HTTPRoute with TLS, and a SweetySite serving a ConfigMap. Statuses are
//! checked on every object. Further tests change a route and watch it being served, kill the dataplane and
//! then the controller container and check nothing is lost, and apply invalid objects that must get a clear
//! condition without breaking the valid ones. Tests take a shared lock, so they never overlap.

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

async fn tls_secret(env: &Env, ns: &str, host: &str) -> Result<TestPki> {
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
    let pki = tls::generate(&[host])?;
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
    cluster::apply(
        &env.client,
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "echo", "namespace": ns},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "echo"}},
                "template": {
                    "metadata": {"labels": {"app": "echo"}},
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
            "metadata": {"name": "echo", "namespace": ns},
            "spec": {"selector": {"app": "echo"}, "ports": [{"name": "http", "port": 8080, "targetPort": "http"}]}
        }),
    )
    .await?;
    eventually(
        &format!("echo in {ns} available"),
        CONVERGE,
        POLL,
        || async {
            let d = cluster::get(&env.client, "apps/v1", "Deployment", Some(ns), "echo")
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
    let pki = tls_secret(env, INGRESS_NS, INGRESS_HOST).await?;
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
        let i = cluster::get(
            &env.client,
            "networking.k8s.io/v1",
            "Ingress",
            Some(INGRESS_NS),
            "echo",
        )
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no ingress")?;
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
            let r = cluster::get(
                &env.client,
                "gateway.networking.k8s.io/v1",
                "HTTPRoute",
                Some(GATEWAY_NS),
                name,
            )
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no route")?;
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
    let pki = tls_secret(env, GATEWAY_NS, GATEWAY_HOST).await?;
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
            let g = cluster::get(
                &env.client,
                "gateway.networking.k8s.io/v1",
                "Gateway",
                Some(GATEWAY_NS),
                "gw",
            )
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no gateway")?;
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
    let pki = tls_secret(env, SITE_NS, SITE_HOST).await?;
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
            let s = cluster::get(
                &env.client,
                "sweety.dev/v1alpha1",
                "SweetySite",
                Some(SITE_NS),
                "site",
            )
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no site")?;
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
    let plain = Target {
        addr: s.addr,
        host: s.host,
        path: s.path,
        ca_pem: None,
    };
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the installed chart on a cluster: run e2e/run.sh"]
async fn ingress_with_tls_over_h1_h2_h3() {
    let env = cluster::env("ingress_with_tls_over_h1_h2_h3").await;
    let _g = LOCK.lock().await;
    report(
        async {
            let s = ingress_fixture(&env).await?;
            fetch_all(&env, &s).await
        }
        .await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the installed chart on a cluster: run e2e/run.sh"]
async fn httproute_with_tls_over_h1_h2_h3() {
    let env = cluster::env("httproute_with_tls_over_h1_h2_h3").await;
    let _g = LOCK.lock().await;
    report(
        async {
            let s = gateway_fixture(&env).await?;
            fetch_all(&env, &s).await
        }
        .await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the installed chart on a cluster: run e2e/run.sh"]
async fn sweetysite_static_over_h1_h2_h3() {
    let env = cluster::env("sweetysite_static_over_h1_h2_h3").await;
    let _g = LOCK.lock().await;
    report(
        async {
            let s = site_fixture(&env).await?;
            fetch_all(&env, &s).await
        }
        .await,
    );
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
    let t = Target {
        addr: s.addr,
        host: s.host,
        path: s.path,
        ca_pem: None,
    };
    let start = Instant::now();
    cluster::apply(&env.client, http_route(Some(filter))).await?;
    eventually(
        "the changed route served",
        Duration::from_secs(30),
        Duration::from_millis(20),
        || async {
            let r = client::get(&env.allowed, Version::H1, &t)
                .await
                .map_err(|e| e.to_string())?;
            let j: Value =
                serde_json::from_str(&r.body).map_err(|e| format!("{e}: {:?}", r.body))?;
            let got = j.pointer("/headers/X-E2e-Change/0").and_then(Value::as_str);
            (got == Some(nonce.as_str()))
                .then_some(())
                .ok_or(format!("header {got:?}"))
        },
    )
    .await?;
    let took = start.elapsed();
    println!("route change: applied → served in {} ms", took.as_millis());
    route_condition(env, "echo", "Accepted", "True", None).await?;
    Ok(took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the installed chart on a cluster: run e2e/run.sh"]
async fn changed_route_is_served() {
    let env = cluster::env("changed_route_is_served").await;
    let _g = LOCK.lock().await;
    report(
        async {
            let s = gateway_fixture(&env).await?;
            fetch_all(&env, &s).await?;
            change_route_and_see_it_served(&env, &s).await?;
            // And back: the plain route again (the header disappears).
            cluster::apply(&env.client, http_route(None)).await?;
            let t = Target {
                addr: s.addr,
                host: s.host,
                path: s.path,
                ca_pem: None,
            };
            eventually(
                "the reverted route served",
                Duration::from_secs(30),
                Duration::from_millis(20),
                || async {
                    let r = client::get(&env.allowed, Version::H1, &t)
                        .await
                        .map_err(|e| e.to_string())?;
                    // An echo of this very request (echo-basic names the path it saw) without the header.
                    let j: Value = serde_json::from_str(&r.body)
                        .map_err(|e| format!("{} {e}: {:?}", r.status, r.body))?;
                    let echoed = j.pointer("/path").and_then(Value::as_str) == Some(s.path);
                    let header = j.pointer("/headers/X-E2e-Change");
                    (r.status == 200 && echoed && header.is_none())
                        .then_some(())
                        .ok_or(format!(
                            "{} path echoed: {echoed}, header {header:?}",
                            r.status
                        ))
                },
            )
            .await
        }
        .await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the installed chart on a cluster: run e2e/run.sh"]
async fn killed_dataplane_then_controller_lose_no_config() {
    let env = cluster::env("killed_dataplane_then_controller_lose_no_config").await;
    let _g = LOCK.lock().await;
    report(
        async {
            let all = [
                ingress_fixture(&env).await?,
                gateway_fixture(&env).await?,
                site_fixture(&env).await?,
            ];
            for s in &all {
                fetch_all(&env, s).await?;
            }
            for container in ["dataplane", "controller"] {
                let pod = cluster::kill_container(&env, container).await?;
                println!(
                    "killed the {container} container of {pod}; it restarted and the pod is Ready"
                );
                for s in &all {
                    fetch_all(&env, s).await.map_err(|e| Error::Restart {
                        container: container.into(),
                        message: format!("after the restart: {e}"),
                    })?;
                }
            }
            // The restarted controller still acts on changes and keeps the statuses.
            change_route_and_see_it_served(&env, &all[1]).await?;
            cluster::apply(&env.client, http_route(None)).await?;
            gateway_fixture(&env).await?;
            site_fixture(&env).await?;
            Ok(())
        }
        .await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the installed chart on a cluster: run e2e/run.sh"]
async fn invalid_objects_get_a_condition_and_break_nothing() {
    let env = cluster::env("invalid_objects_get_a_condition_and_break_nothing").await;
    let _g = LOCK.lock().await;
    report(
        async {
            let all = [
                ingress_fixture(&env).await?,
                gateway_fixture(&env).await?,
                site_fixture(&env).await?,
            ];
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
                &env,
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
                    let s = cluster::get(
                        &env.client,
                        "sweety.dev/v1alpha1",
                        "SweetySite",
                        Some(SITE_NS),
                        "dup",
                    )
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("no site")?;
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
                fetch_all(&env, s).await?;
            }
            route_condition(&env, "echo", "ResolvedRefs", "True", None).await?;
            site_fixture(&env).await?;
            cluster::delete(&env.client, &broken_route).await?;
            cluster::delete(&env.client, &dup_site).await?;
            Ok(())
        }
        .await,
    );
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
