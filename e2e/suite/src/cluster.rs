//! The cluster side: the test environment (from the environment variables in the crate docs), server-side
//! apply of JSON manifests, reading conditions, and killing a container of the chart's pod.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use crate::{Error, Result};

/// Field manager of everything the tests apply.
pub const MANAGER: &str = "sweety-e2e";

/// How the restart test kills a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartMode {
    /// SIGKILL to the container's local process (the e2e node agent runs containers as processes).
    Process,
    /// `docker exec <node> crictl stop` (kind).
    Kind {
        /// The kind node container that runs the Pod.
        node: String,
    },
}

/// An IPv4 network the tests may send traffic to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: u32,
    mask: u32,
}

impl Cidr {
    /// Parses `a.b.c.d/len`.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || {
            Error::Config(format!(
                "SWEETY_E2E_ALLOWED_CIDR {s:?}: expected a.b.c.d/len"
            ))
        };
        let (a, l) = s.split_once('/').ok_or_else(bad)?;
        let ip: Ipv4Addr = a.parse().map_err(|_| bad())?;
        let len: u32 = l.parse().map_err(|_| bad())?;
        if len > 32 {
            return Err(bad());
        }
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        Ok(Cidr {
            net: u32::from(ip) & mask,
            mask,
        })
    }

    /// Whether `ip` is inside.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => u32::from(v4) & self.mask == self.net,
            IpAddr::V6(_) => false,
        }
    }
}

/// The test environment.
#[derive(Clone)]
pub struct Env {
    /// Client of the cluster under test.
    pub client: Client,
    /// Addresses the tests may send traffic to (SWEETY_E2E_ALLOWED_CIDR).
    pub allowed: Cidr,
    /// Namespace and release of the chart.
    pub namespace: String,
    /// Helm release name of the chart.
    pub release: String,
    /// How the restart tests kill the dataplane and controller.
    pub restart: RestartMode,
}

/// The environment. Panics when no cluster is configured (the tests that call it are `#[ignore]`d and run
/// with `--ignored` by e2e/run.sh and e2e/kind/run.sh) or when the configuration is unusable.
pub async fn env(test: &str) -> Env {
    let Ok(path) = std::env::var("SWEETY_E2E_KUBECONFIG") else {
        panic!("{test}: SWEETY_E2E_KUBECONFIG is not set (run e2e/run.sh, which sets it)");
    };
    match load(&path).await {
        Ok(e) => e,
        Err(e) => panic!("{test}: e2e environment from {path}: {e}"),
    }
}

async fn load(path: &str) -> Result<Env> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| Error::Config(format!("kubeconfig {path}: {e}")))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| Error::Config(format!("kubeconfig {path}: {e}")))?;
    let client = Client::try_from(cfg).map_err(Error::kube("client"))?;
    let allowed = std::env::var("SWEETY_E2E_ALLOWED_CIDR").map_err(|_| {
        Error::Config(
            "SWEETY_E2E_ALLOWED_CIDR is required: the network of the load-balancer addresses"
                .into(),
        )
    })?;
    let restart = match std::env::var("SWEETY_E2E_RESTART").as_deref() {
        Err(_) | Ok("process") => RestartMode::Process,
        Ok("kind") => RestartMode::Kind {
            node: std::env::var("SWEETY_E2E_KIND_NODE")
                .unwrap_or_else(|_| "sweety-e2e-control-plane".into()),
        },
        Ok(other) => {
            return Err(Error::Config(format!(
                "SWEETY_E2E_RESTART={other:?}: use process or kind"
            )))
        }
    };
    Ok(Env {
        client,
        allowed: Cidr::parse(&allowed)?,
        namespace: std::env::var("SWEETY_E2E_NAMESPACE").unwrap_or_else(|_| "sweety".into()),
        release: std::env::var("SWEETY_E2E_RELEASE").unwrap_or_else(|_| "sweety".into()),
        restart,
    })
}

/// The API resource of a manifest's apiVersion/kind (the kinds the tests use).
pub fn resource_of(api_version: &str, kind: &str) -> Result<ApiResource> {
    let plural = match kind {
        "Namespace" => "namespaces",
        "Secret" => "secrets",
        "ConfigMap" => "configmaps",
        "Service" => "services",
        "Deployment" => "deployments",
        "Ingress" => "ingresses",
        "IngressClass" => "ingressclasses",
        "Gateway" => "gateways",
        "HTTPRoute" => "httproutes",
        "GatewayClass" => "gatewayclasses",
        "SweetySite" => "sweetysites",
        "SweetySecurityPolicy" => "sweetysecuritypolicies",
        "SweetyProxyConfig" => "sweetyproxyconfigs",
        other => {
            return Err(Error::Config(format!(
                "kind {other} is not known to the e2e helpers"
            )))
        }
    };
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    Ok(ApiResource::from_gvk_with_plural(&gvk, plural))
}

fn api_for(client: &Client, ar: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

fn ident(manifest: &Value) -> Result<(ApiResource, Option<String>, String)> {
    let s = |p: &str| {
        manifest
            .pointer(p)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let (Some(av), Some(kind), Some(name)) = (s("/apiVersion"), s("/kind"), s("/metadata/name"))
    else {
        return Err(Error::Config(
            "manifest without apiVersion, kind or metadata.name".into(),
        ));
    };
    Ok((resource_of(&av, &kind)?, s("/metadata/namespace"), name))
}

/// Server-side applies a manifest (forcing conflicts: the tests own what they apply).
pub async fn apply(client: &Client, manifest: Value) -> Result<DynamicObject> {
    let (ar, ns, name) = ident(&manifest)?;
    let api = api_for(client, &ar, ns.as_deref());
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&manifest),
    )
    .await
    .map_err(Error::kube(format!("apply {} {name}", ar.kind)))
}

/// Reads an object (None when it does not exist).
pub async fn get(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<DynamicObject>> {
    let ar = resource_of(api_version, kind)?;
    api_for(client, &ar, namespace)
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get {kind} {name}")))
}

/// Deletes an object if it exists.
pub async fn delete(client: &Client, manifest: &Value) -> Result<()> {
    let (ar, ns, name) = ident(manifest)?;
    match api_for(client, &ar, ns.as_deref())
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("delete {} {name}", ar.kind))(e)),
    }
}

/// A condition of a conditions array: (status, reason, observedGeneration).
pub fn condition(conditions: Option<&Value>, kind: &str) -> Option<(String, String, Option<i64>)> {
    conditions?.as_array()?.iter().find_map(|c| {
        (c.get("type")?.as_str()? == kind).then(|| {
            (
                c.get("status")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                c.get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                c.get("observedGeneration").and_then(Value::as_i64),
            )
        })
    })
}

/// Checks that `conditions` has `kind` with `status` (and `reason`, when given) at `generation`;
/// Err describes what is there instead.
pub fn expect_condition(
    conditions: Option<&Value>,
    kind: &str,
    status: &str,
    reason: Option<&str>,
    generation: Option<i64>,
) -> std::result::Result<(), String> {
    match condition(conditions, kind) {
        Some((s, r, g))
            if s == status
                && reason.is_none_or(|want| want == r)
                && (generation.is_none() || g == generation) =>
        {
            Ok(())
        }
        Some((s, r, g)) => Err(format!(
            "{kind}={s} reason {r} observedGeneration {g:?}, want {status}{} at {generation:?}",
            reason.map(|r| format!(" reason {r}")).unwrap_or_default()
        )),
        None => Err(format!("no {kind} condition in {conditions:?}")),
    }
}

/// The chart's pod (the newest non-terminating one).
pub async fn chart_pod(env: &Env) -> Result<Pod> {
    chart_pods(env).await?.pop().ok_or_else(|| Error::Restart {
        container: String::new(),
        message: format!("no pod of release {} in {}", env.release, env.namespace),
    })
}

/// The chart's pods that are not terminating, oldest first.
pub async fn chart_pods(env: &Env) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={}", env.release));
    let mut list = pods
        .list(&lp)
        .await
        .map_err(Error::kube("list chart pods"))?
        .items;
    list.retain(|p| p.metadata.deletion_timestamp.is_none());
    list.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
    Ok(list)
}

/// GET `path` on `port` of pod `name` in the chart's namespace through the apiserver's pod proxy (works
/// wherever `kubectl` does, whether or not this host reaches Pod addresses).
pub async fn pod_get(env: &Env, name: &str, port: u16, path: &str) -> Result<String> {
    let uri = format!(
        "/api/v1/namespaces/{}/pods/{name}:{port}/proxy{path}",
        env.namespace
    );
    let req = http::Request::get(&uri)
        .body(Vec::new())
        .map_err(|e| Error::Config(format!("request {uri}: {e}")))?;
    env.client
        .request_text(req)
        .await
        .map_err(Error::kube(format!("GET {uri}")))
}

/// (restartCount, ready) of a container of a pod.
pub fn container_state(pod: &Pod, container: &str) -> Option<(i32, bool)> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container)
        .map(|c| (c.restart_count, c.ready))
}

/// Kills one container of the chart's pod the hard way and waits until Kubernetes reports it restarted
/// (restartCount + 1) and the pod is Ready again. Returns the pod name.
pub async fn kill_container(env: &Env, container: &str) -> Result<String> {
    let err = |message: String| Error::Restart {
        container: container.to_string(),
        message,
    };
    let pod = chart_pod(env).await?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let (before, _) = container_state(&pod, container)
        .ok_or_else(|| err(format!("pod {name} has no status for it")))?;
    match &env.restart {
        RestartMode::Process => {
            kill_local_process(&name, &format!("sweety-{container}")).map_err(err)?
        }
        RestartMode::Kind { node } => kill_in_kind(node, &env.namespace, &name, container)
            .await
            .map_err(err)?,
    }
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    crate::eventually(
        &format!("{container} of {name} restarted and Ready"),
        Duration::from_secs(120),
        Duration::from_millis(250),
        || async {
            let p = pods.get(&name).await.map_err(|e| e.to_string())?;
            let (count, ready) = container_state(&p, container).unwrap_or((before, false));
            let pod_ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if count > before && ready && pod_ready {
                Ok(())
            } else {
                Err(format!("restartCount {count} (was {before}), container ready {ready}, pod ready {pod_ready}"))
            }
        },
    )
    .await?;
    Ok(name)
}

/// SIGKILLs the local process whose executable is named `exe` and whose environment has `POD_NAME=<pod>`
/// (the chart gives both containers POD_NAME). Exactly one must match.
fn kill_local_process(pod: &str, exe: &str) -> std::result::Result<(), String> {
    let want_env = format!("POD_NAME={pod}");
    let mut found = Vec::new();
    let dir = std::fs::read_dir("/proc").map_err(|e| format!("reading /proc: {e}"))?;
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(target) = std::fs::read_link(entry.path().join("exe")) else {
            continue;
        };
        if target.file_name().and_then(|f| f.to_str()) != Some(exe) {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|b| *b == 0).any(|v| v == want_env.as_bytes()) {
            found.push(pid);
        }
    }
    let [pid] = found[..] else {
        return Err(format!(
            "expected one {exe} process of pod {pod} on this host, found {found:?} (SWEETY_E2E_RESTART=process needs the node (node agent or e2e/realnode) on this host, and root)"
        ));
    };
    let status = std::process::Command::new("kill")
        .args(["-s", "KILL", &pid.to_string()])
        .status()
        .map_err(|e| format!("running kill: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("kill -s KILL {pid}: {status}"))
}

/// `crictl stop --timeout 0` of the container inside the kind node container; the kubelet restarts it.
async fn kill_in_kind(
    node: &str,
    namespace: &str,
    pod: &str,
    container: &str,
) -> std::result::Result<(), String> {
    let ns_label = format!("io.kubernetes.pod.namespace={namespace}");
    let pod_label = format!("io.kubernetes.pod.name={pod}");
    let name_re = format!("^{container}$");
    let out = tokio::process::Command::new("docker")
        .args([
            "exec", node, "crictl", "ps", "-q", "--name", &name_re, "--label", &ns_label,
        ])
        .args(["--label", &pod_label])
        .output()
        .await
        .map_err(|e| format!("docker exec crictl ps: {e}"))?;
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let [id] = &ids[..] else {
        return Err(format!(
            "crictl ps found {ids:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    };
    let st = tokio::process::Command::new("docker")
        .args(["exec", node, "crictl", "stop", "--timeout", "0", id])
        .status()
        .await
        .map_err(|e| format!("docker exec crictl stop: {e}"))?;
    st.success()
        .then_some(())
        .ok_or_else(|| format!("crictl stop {id}: {st}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_membership() {
        let c = Cidr::parse("10.246.0.0/24").unwrap();
        assert!(c.contains("10.246.0.200".parse().unwrap()));
        assert!(!c.contains("10.246.1.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("10.0.0.0").is_err());
    }

    #[test]
    fn conditions_are_matched_with_reason_and_generation() {
        let conds = serde_json::json!([
            {"type": "Accepted", "status": "True", "reason": "Accepted", "observedGeneration": 2},
            {"type": "ResolvedRefs", "status": "False", "reason": "BackendNotFound", "observedGeneration": 2}
        ]);
        assert!(expect_condition(Some(&conds), "Accepted", "True", None, Some(2)).is_ok());
        assert!(expect_condition(Some(&conds), "Accepted", "True", None, Some(1)).is_err());
        assert!(expect_condition(
            Some(&conds),
            "ResolvedRefs",
            "False",
            Some("BackendNotFound"),
            None
        )
        .is_ok());
        let e = expect_condition(Some(&conds), "ResolvedRefs", "True", None, None).unwrap_err();
        assert!(e.contains("BackendNotFound"), "{e}");
        assert!(expect_condition(Some(&conds), "Programmed", "True", None, None).is_err());
    }

    #[test]
    fn resources_of_the_kinds_used() {
        let r = resource_of("gateway.networking.k8s.io/v1", "HTTPRoute").unwrap();
        assert_eq!(
            (r.group.as_str(), r.plural.as_str()),
            ("gateway.networking.k8s.io", "httproutes")
        );
        let r = resource_of("v1", "Secret").unwrap();
        assert_eq!((r.group.as_str(), r.version.as_str()), ("", "v1"));
        assert!(resource_of("v1", "Pod").is_err());
    }
}
