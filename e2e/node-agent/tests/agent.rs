//! End-to-end test of the node agent against a real apiserver (e2e/cluster/up.sh with the scheduler and
//! controller-manager). `#[ignore]`d: it needs SWEETY_KUBECONFIG and root, runs with `--ignored` (`.ci/run` does)
//! and fails when either is missing.
//!
//! It starts the agent binary as a child, creates a 2-replica Deployment of `python3 -m http.server` (through
//! `--image-map`) serving a ConfigMap volume with a readinessProbe, and checks: both Pods Ready with
//! IPs from its `--pod-cidr`, the Service's EndpointSlice lists them, each Pod IP serves the ConfigMap file over HTTP
//! from the host (so the volume is visible to the process), a deleted Pod is replaced, a Pod reaches the
//! apiserver, volumes mount below an emptyDir that covers the agent's own directory, a failing livenessProbe
//! kills and restarts a container, and the network namespaces are cleaned
//! up.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use kube::{Api, Client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NODE: &str = "sweety-node-agent-it";
const BRIDGE: &str = "sweetyit0";
/// The test's Pod network (not the default one, so it can run next to another agent). The cluster must be
/// started with the same `POD_CIDR` (its apiserver certificate then names the relay address .1).
const POD_CIDR: &str = "10.250.0.0/24";
const POD_NET: &str = "10.250.0.";
const NODE_IP: &str = "10.250.0.1";
const MOUNT: &str = "/run/sweety-node-agent-it/www";
const CONTENT: &str = "hello from a configmap volume\n";
const SECRET_MOUNT: &str = "/run/sweety-node-agent-it/secret";
/// The crashing container's program (a fixed string, not user input).
const CRASHER: &str = "import os, sys
print('env', os.environ['MY_NAME'], os.environ['MY_NS'], os.environ['SECRET_VAL'])
print('token', len(open('/var/run/secrets/kubernetes.io/serviceaccount/token').read()) > 100)
print('secretfile', open('/run/sweety-node-agent-it/secret/key').read(), flush=True)
import ssl, http.client
sa = '/var/run/secrets/kubernetes.io/serviceaccount/'
ctx = ssl.create_default_context(cafile=sa + 'ca.crt')
host, port = os.environ['KUBERNETES_SERVICE_HOST'], int(os.environ['KUBERNETES_SERVICE_PORT'])
c = http.client.HTTPSConnection(host, port, context=ctx, timeout=10)
c.request('GET', '/api', headers={'Authorization': 'Bearer ' + open(sa + 'token').read()})
print('apiserver', host, c.getresponse().status, flush=True)
sys.exit(3)";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

struct AgentProc(Child);

impl Drop for AgentProc {
    fn drop(&mut self) {
        // SIGTERM lets the agent stop its Pods and remove its bridge; bounded wait, then SIGKILL.
        let _ = Command::new("kill")
            .args(["-s", "TERM", &self.0.id().to_string()])
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn http_get(ip: &str, port: u16, path: &str) -> Option<String> {
    let mut s = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect((ip, port)),
    )
    .await
    .ok()?
    .ok()?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// Ready Pods of the Deployment: name → IP.
async fn ready_pods(pods: &Api<Pod>) -> Vec<(String, String)> {
    let list = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("list pods");
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let st = p.status?;
            let ready = st
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then(|| {
                (
                    p.metadata.name.unwrap_or_default(),
                    st.pod_ip.unwrap_or_default(),
                )
            })
        })
        .collect()
}

fn netns_list() -> String {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver with scheduler and controller-manager (SWEETY_KUBECONFIG) and root"]
async fn runs_deployment_pods_as_processes() {
    let kubeconfig = std::env::var("SWEETY_KUBECONFIG")
        .expect("SWEETY_KUBECONFIG is not set: this test needs a cluster (e2e/cluster/up.sh)");
    assert!(
        is_root(),
        "this test needs root (network namespaces, bind mounts)"
    );
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .expect("a system python3 for the test server");
    let root_dir = tempfile_dir();
    let agent = AgentProc(
        Command::new(env!("CARGO_BIN_EXE_sweety-node-agent"))
            .args([
                "run",
                "--node",
                NODE,
                "--bridge",
                BRIDGE,
                "--node-label",
                "sweety.dev/test=node-agent",
                "--load-balancer",
                "--pod-cidr",
                POD_CIDR,
            ])
            .arg("--image-map")
            .arg(format!("python-http={python}"))
            .arg("--root-dir")
            .arg(&root_dir)
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start agent"),
    );

    std::env::set_var("KUBECONFIG", &kubeconfig);
    let client = Client::try_default().await.expect("kube client");
    let ns_name = format!("node-agent-it-{}", std::process::id());
    let nss: Api<Namespace> = Api::all(client.clone());
    // Namespaces left by an earlier failed run: their Pods are bound to this node and would keep netns.
    for old in nss
        .list(&ListParams::default())
        .await
        .expect("list namespaces")
        .items
    {
        let name = old.metadata.name.unwrap_or_default();
        if name.starts_with("node-agent-it-") && old.metadata.deletion_timestamp.is_none() {
            let _ = nss.delete(&name, &DeleteParams::default()).await;
        }
    }
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns_name}})).unwrap();
    nss.create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");

    // Node registered, Ready and untainted.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    eventually(
        "node Ready without not-ready taint",
        Duration::from_secs(30),
        || async {
            let n = nodes.get_opt(NODE).await.ok()??;
            let ready = n
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let tainted = n
                .spec
                .as_ref()?
                .taints
                .iter()
                .flatten()
                .any(|t| t.key == "node.kubernetes.io/not-ready");
            let ip_ok = n
                .status
                .as_ref()?
                .addresses
                .iter()
                .flatten()
                .any(|a| a.type_ == "InternalIP" && a.address == NODE_IP);
            (ready && !tainted && ip_ok).then_some(())
        },
    )
    .await;

    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns_name);
    eventually(
        "default ServiceAccount",
        Duration::from_secs(30),
        || async { sas.get_opt("default").await.ok()? },
    )
    .await;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns_name);
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "www"}, "data": {"index.html": CONTENT}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create configmap");

    let deploy: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "nodeName": null,
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "web",
                        "image": "example.test/python-http:1",
                        "args": ["-m", "http.server", "8080", "--bind", "$(POD_IP)", "--directory", MOUNT],
                        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/index.html", "port": "http"}, "periodSeconds": 1},
                        "volumeMounts": [{"name": "www", "mountPath": MOUNT}]
                    }],
                    "volumes": [{"name": "www", "configMap": {"name": "www"}}]
                }
            }
        }
    }))
    .unwrap();
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns_name);
    deploys
        .create(&PostParams::default(), &deploy)
        .await
        .expect("create deployment");
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
    }))
    .unwrap();
    let svcs: Api<Service> = Api::namespaced(client.clone(), &ns_name);
    svcs.create(&PostParams::default(), &svc)
        .await
        .expect("create service");

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns_name);
    let first = eventually("2 ready pods", Duration::from_secs(90), || async {
        let r = ready_pods(&pods).await;
        (r.len() == 2).then_some(r)
    })
    .await;
    for (name, ip) in &first {
        assert!(ip.starts_with(POD_NET), "pod {name} has IP {ip}");
    }
    let ips: BTreeSet<String> = first.iter().map(|(_, ip)| ip.clone()).collect();
    assert_eq!(ips.len(), 2, "distinct pod IPs: {ips:?}");

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns_name);
    eventually(
        "EndpointSlice with both pod IPs ready",
        Duration::from_secs(30),
        || async {
            let list = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                .await
                .ok()?;
            let ready: BTreeSet<String> = list
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
                .flat_map(|e| e.addresses.iter().cloned())
                .collect();
            (ready == ips).then_some(())
        },
    )
    .await;

    for ip in &ips {
        let body = http_get(ip, 8080, "/index.html").await.unwrap_or_default();
        assert!(
            body.starts_with("HTTP/1.0 200"),
            "GET http://{ip}:8080/index.html: {body:?}"
        );
        assert!(
            body.ends_with(CONTENT),
            "volume content served by {ip}: {body:?}"
        );
    }
    // The LoadBalancer allocator gave the Service an address on the bridge that forwards to the Pods.
    let lb_ip = eventually(
        "Service load balancer address",
        Duration::from_secs(30),
        || async {
            let s = svcs.get("web").await.ok()?;
            let ip = s.status?.load_balancer?.ingress?.into_iter().next()?.ip?;
            ip.starts_with(&format!("{POD_NET}2")).then_some(ip)
        },
    )
    .await;
    let via_lb = eventually(
        "GET through the load balancer",
        Duration::from_secs(20),
        || async {
            http_get(&lb_ip, 80, "/index.html")
                .await
                .filter(|b| b.ends_with(CONTENT))
        },
    )
    .await;
    assert!(via_lb.starts_with("HTTP/1.0 200"), "{via_lb:?}");

    // The bind mount is private to the Pods' mount namespaces: the host's mount point stays empty.
    assert!(
        std::fs::read_dir(MOUNT)
            .map(|mut d| d.next().is_none())
            .unwrap_or(true),
        "{MOUNT} on the host must not show the volume"
    );

    // Delete one Pod: the agent kills it, removes its netns and finalises the deletion; the ReplicaSet
    // replaces it.
    let (victim, victim_ip) = first[0].clone();
    pods.delete(&victim, &DeleteParams::default())
        .await
        .expect("delete pod");
    eventually("victim pod gone", Duration::from_secs(30), || async {
        pods.get_opt(&victim).await.ok()?.is_none().then_some(())
    })
    .await;
    let second = eventually("replacement pod ready", Duration::from_secs(60), || async {
        let r = ready_pods(&pods).await;
        (r.len() == 2 && r.iter().all(|(n, _)| n != &victim)).then_some(r)
    })
    .await;
    for (_, ip) in &second {
        let body = http_get(ip, 8080, "/index.html").await.unwrap_or_default();
        assert!(
            body.ends_with(CONTENT),
            "replacement serves the volume at {ip}: {body:?}"
        );
    }
    let _ = victim_ip;

    // A crashing Pod (bound directly to the node): env from the downward API and a Secret, a Secret volume
    // and the auto-injected service-account token are visible to the process (checked through its log
    // file), and it is restarted with its exit code in lastState.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns_name);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "creds"}, "stringData": {"key": "filedata", "env": "s3cret"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    let crasher: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "crasher"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": "example.test/python-http:1",
                "args": ["-c", CRASHER],
                "env": [
                    {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "SECRET_VAL", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "env"}}}
                ],
                // An emptyDir over /tmp first: the agent's volume directories (its --root-dir) are below
                // /tmp here, and the later mounts must still find their sources.
                "volumeMounts": [
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "creds", "mountPath": SECRET_MOUNT}
                ]
            }],
            "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "creds", "secret": {"secretName": "creds"}}]
        }
    }))
    .unwrap();
    let crasher = pods
        .create(&PostParams::default(), &crasher)
        .await
        .expect("create crasher");
    let uid = crasher.metadata.uid.clone().unwrap_or_default();
    eventually(
        "crasher restarted with exit code 3",
        Duration::from_secs(40),
        || async {
            let p = pods.get_opt("crasher").await.ok()??;
            let cs = p.status?.container_statuses?.into_iter().next()?;
            let code = cs.last_state?.terminated?.exit_code;
            (cs.restart_count >= 1 && code == 3).then_some(())
        },
    )
    .await;
    let log = root_dir
        .join("logs")
        .join(format!("{ns_name}_crasher_{uid}"))
        .join("c.log");
    // The file is in the kubelet's CRI format (time, stream, F/P, text); render it as `kubectl logs` does.
    let raw = std::fs::read(&log).unwrap_or_default();
    let text = String::from_utf8(sweety_node_agent::logs::render(
        &raw,
        &sweety_node_agent::logs::Query::default(),
    ))
    .unwrap_or_default();
    // The last line: the apiserver answered over TLS (certificate verified against the projected CA, so
    // it names the relay address) with the projected token, at KUBERNETES_SERVICE_HOST = the node address.
    let expected = format!(
        "env crasher {ns_name} s3cret\ntoken True\nsecretfile filedata\napiserver {NODE_IP} 200\n"
    );
    assert!(text.starts_with(&expected), "{}: {text:?}", log.display());
    // The same log through the apiserver (pods/log → the agent's kubelet API on the node address).
    let lp = LogParams {
        container: Some("c".into()),
        ..Default::default()
    };
    let via_api = pods
        .logs("crasher", &lp)
        .await
        .expect("pods/log via the apiserver");
    assert!(via_api.starts_with(&expected), "kubectl logs: {via_api:?}");
    // timestamps: every line starts with its RFC 3339 time; sinceTime in the future: nothing.
    let stamped = pods
        .logs(
            "crasher",
            &LogParams {
                container: Some("c".into()),
                timestamps: true,
                ..Default::default()
            },
        )
        .await
        .expect("pods/log with timestamps");
    let first = stamped.lines().next().unwrap_or_default();
    let (ts, rest) = first.split_once(' ').unwrap_or_default();
    assert!(
        ts.parse::<k8s_openapi::jiff::Timestamp>().is_ok()
            && rest == format!("env crasher {ns_name} s3cret"),
        "timestamped line: {first:?}"
    );
    let future = pods
        .logs(
            "crasher",
            &LogParams {
                container: Some("c".into()),
                since_time: Some(
                    k8s_openapi::jiff::Timestamp::now()
                        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(3600))
                        .expect("time"),
                ),
                ..Default::default()
            },
        )
        .await
        .expect("pods/log since a future time");
    assert_eq!(future, "", "sinceTime in the future returns nothing");

    // Startup and liveness probes: the startupProbe (TCP) passes once the server listens, then the
    // livenessProbe (a 404 path) fails twice and the agent kills the container (SIGKILL: exit 137) and
    // restarts it (restartPolicy Always), which then serves again.
    let unhealthy: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "unhealthy"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "web",
                "image": "example.test/python-http:1",
                "args": ["-m", "http.server", "8080", "--bind", "$(POD_IP)", "--directory", "/"],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "ports": [{"name": "http", "containerPort": 8080}],
                "startupProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 1, "failureThreshold": 120},
                "livenessProbe": {"httpGet": {"path": "/no-such-file", "port": "http"},
                                  "periodSeconds": 1, "failureThreshold": 2}
            }]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &unhealthy)
        .await
        .expect("create unhealthy pod");
    eventually(
        "unhealthy pod killed by its liveness probe and restarted",
        Duration::from_secs(90),
        || async {
            let p = pods.get_opt("unhealthy").await.ok()??;
            let cs = p.status?.container_statuses?.into_iter().next()?;
            let code = cs.last_state?.terminated?.exit_code;
            (cs.restart_count >= 1 && code == 137).then_some(())
        },
    )
    .await;
    // The restarted instance runs and passes its startup probe again (`started`; with no readinessProbe
    // that also makes it ready).
    eventually(
        "restarted instance started and ready",
        Duration::from_secs(60),
        || async {
            let p = pods.get_opt("unhealthy").await.ok()??;
            let cs = p.status?.container_statuses?.into_iter().next()?;
            (cs.state?.running.is_some() && cs.started == Some(true) && cs.ready).then_some(())
        },
    )
    .await;

    // Cleanup: deleting the namespace removes the Pods; the agent tears down their namespaces.
    nss.delete(&ns_name, &DeleteParams::default())
        .await
        .expect("delete namespace");
    eventually("pods gone", Duration::from_secs(60), || async {
        pods.list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    eventually("pod netns removed", Duration::from_secs(30), || async {
        let prefix = format!("{BRIDGE}-");
        (!netns_list().lines().any(|l| l.starts_with(&prefix))).then_some(())
    })
    .await;
    drop(agent);
    let _ = nodes.delete(NODE, &DeleteParams::default()).await;
    let bridge_gone = !Command::new("ip")
        .args(["link", "show", BRIDGE])
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(bridge_gone, "the agent removes the bridge it created");
    let _ = std::fs::remove_dir_all(&root_dir);
    // Parent of the mount points, created by the agent (the leaves are removed by the agent).
    let _ = std::fs::remove_dir("/run/sweety-node-agent-it");
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sweety-node-agent-it-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("root dir");
    d
}
