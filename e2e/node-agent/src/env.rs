//! Container environment: plain values, downward-API fieldRefs, secretKeyRef / configMapKeyRef, envFrom, and
//! kubelet-style `$(VAR)` expansion (in env values, command and args).

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::{Api, Client};

use crate::{Error, Result};

/// PATH given to containers that do not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The value of a downward-API `fieldPath` for a Pod (None if unsupported); `host_ip` is the node address.
pub fn field_value(pod: &Pod, path: &str, pod_ip: &str, host_ip: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    if let Some(rest) = path.strip_prefix("metadata.labels['") {
        let key = rest.strip_suffix("']")?;
        return Some(meta.labels.as_ref()?.get(key)?.clone());
    }
    if let Some(rest) = path.strip_prefix("metadata.annotations['") {
        let key = rest.strip_suffix("']")?;
        return Some(meta.annotations.as_ref()?.get(key)?.clone());
    }
    let map_text = |m: Option<&std::collections::BTreeMap<String, String>>| {
        m.map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v:?}\n"))
                .collect::<String>()
        })
        .unwrap_or_default()
    };
    Some(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => map_text(meta.labels.as_ref()),
        "metadata.annotations" => map_text(meta.annotations.as_ref()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        "status.podIP" => pod_ip.to_string(),
        "status.podIPs" => pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => host_ip.to_string(),
        _ => return None,
    })
}

/// Expands `$(NAME)` references to earlier variables; `$$(NAME)` yields a literal `$(NAME)`; unknown
/// references are left as written (as the kubelet does).
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(inner) = tail.strip_prefix("$(") {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => out.push_str(&tail[..end + 3]),
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str(tail);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// Where Pods reach the apiserver: the kubelet's `KUBERNETES_SERVICE_*` / `KUBERNETES_PORT*` variables.
pub fn apiserver_env(host: &str, port: u16) -> Vec<(String, String)> {
    let url = format!("tcp://{host}:{port}");
    [
        ("KUBERNETES_SERVICE_HOST", host.to_string()),
        ("KUBERNETES_SERVICE_PORT", port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", port.to_string()),
        ("KUBERNETES_PORT", url.clone()),
        (&format!("KUBERNETES_PORT_{port}_TCP"), url),
        (&format!("KUBERNETES_PORT_{port}_TCP_PROTO"), "tcp".into()),
        (
            &format!("KUBERNETES_PORT_{port}_TCP_PORT"),
            port.to_string(),
        ),
        (
            &format!("KUBERNETES_PORT_{port}_TCP_ADDR"),
            host.to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The environment of one container (without the agent's own environment): `base` (e.g.
/// [`apiserver_env`]) first, then envFrom and env, which may override it, as with the kubelet.
pub async fn build(
    client: &Client,
    pod: &Pod,
    container: &Container,
    base: &[(String, String)],
    (pod_ip, host_ip): (&str, &str),
) -> Result<Vec<(String, String)>> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut env: Vec<(String, String)> = base.to_vec();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(r) = &from.config_map_ref {
            let optional = r.optional.unwrap_or(false);
            match cms
                .get_opt(&r.name)
                .await
                .map_err(Error::kube("get ConfigMap for envFrom"))?
            {
                Some(cm) => {
                    for (k, v) in cm.data.unwrap_or_default() {
                        env.push((format!("{prefix}{k}"), v));
                    }
                }
                None if optional => {}
                None => return Err(missing(&container.name, "ConfigMap", &r.name)),
            }
        }
        if let Some(r) = &from.secret_ref {
            let optional = r.optional.unwrap_or(false);
            match secrets
                .get_opt(&r.name)
                .await
                .map_err(Error::kube("get Secret for envFrom"))?
            {
                Some(s) => {
                    for (k, v) in s.data.unwrap_or_default() {
                        env.push((
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v.0).into_owned(),
                        ));
                    }
                }
                None if optional => {}
                None => return Err(missing(&container.name, "Secret", &r.name)),
            }
        }
    }
    for e in container.env.iter().flatten() {
        let value = if let Some(v) = &e.value {
            expand(v, &env)
        } else if let Some(src) = &e.value_from {
            if let Some(f) = &src.field_ref {
                field_value(pod, &f.field_path, pod_ip, host_ip).ok_or_else(|| {
                    Error::Container {
                        container: container.name.clone(),
                        message: format!("unsupported fieldRef {}", f.field_path),
                    }
                })?
            } else if let Some(r) = &src.config_map_key_ref {
                let cm = cms
                    .get_opt(&r.name)
                    .await
                    .map_err(Error::kube("get ConfigMap for env"))?;
                match cm.and_then(|c| c.data).and_then(|d| d.get(&r.key).cloned()) {
                    Some(v) => v,
                    None if r.optional.unwrap_or(false) => continue,
                    None => {
                        return Err(missing(
                            &container.name,
                            "ConfigMap key",
                            &format!("{}/{}", r.name, r.key),
                        ))
                    }
                }
            } else if let Some(r) = &src.secret_key_ref {
                let s = secrets
                    .get_opt(&r.name)
                    .await
                    .map_err(Error::kube("get Secret for env"))?;
                match s.and_then(|c| c.data).and_then(|d| d.get(&r.key).cloned()) {
                    Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                    None if r.optional.unwrap_or(false) => continue,
                    None => {
                        return Err(missing(
                            &container.name,
                            "Secret key",
                            &format!("{}/{}", r.name, r.key),
                        ))
                    }
                }
            } else {
                return Err(Error::Container {
                    container: container.name.clone(),
                    message: format!("env {}: resourceFieldRef is not supported", e.name),
                });
            }
        } else {
            String::new()
        };
        env.push((e.name.clone(), value));
    }
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.insert(0, ("PATH".into(), DEFAULT_PATH.into()));
    }
    if !env.iter().any(|(k, _)| k == "HOSTNAME") {
        env.push((
            "HOSTNAME".into(),
            pod.metadata.name.clone().unwrap_or_default(),
        ));
    }
    Ok(env)
}

fn missing(container: &str, what: &str, name: &str) -> Error {
    Error::Container {
        container: container.to_string(),
        message: format!("{what} {name} not found"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_like_the_kubelet() {
        let env = vec![
            ("A".to_string(), "1".to_string()),
            ("B".to_string(), "x y".to_string()),
        ];
        assert_eq!(expand("--a=$(A) $(B)", &env), "--a=1 x y");
        assert_eq!(expand("$$(A) $(C) $x $(", &env), "$(A) $(C) $x $(");
    }

    #[test]
    fn downward_fields() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "labels": {"app": "a"}},
            "spec": {"nodeName": "node-1", "containers": []}
        }))
        .unwrap();
        assert_eq!(
            field_value(&pod, "metadata.name", "10.244.0.2", "10.244.0.1").as_deref(),
            Some("p")
        );
        assert_eq!(
            field_value(&pod, "metadata.namespace", "", "").as_deref(),
            Some("n")
        );
        assert_eq!(
            field_value(&pod, "status.podIP", "10.244.0.2", "10.244.0.1").as_deref(),
            Some("10.244.0.2")
        );
        assert_eq!(
            field_value(&pod, "spec.nodeName", "", "").as_deref(),
            Some("node-1")
        );
        assert_eq!(
            field_value(&pod, "spec.serviceAccountName", "", "").as_deref(),
            Some("default")
        );
        assert_eq!(
            field_value(&pod, "metadata.labels['app']", "", "").as_deref(),
            Some("a")
        );
        assert_eq!(
            field_value(&pod, "metadata.labels", "", "").as_deref(),
            Some("app=\"a\"\n")
        );
        assert_eq!(
            field_value(&pod, "status.hostIP", "", "10.246.0.1").as_deref(),
            Some("10.246.0.1")
        );
        assert_eq!(field_value(&pod, "spec.bogus", "", ""), None);
    }

    #[test]
    fn apiserver_env_names_the_reachable_address() {
        let env = apiserver_env("10.246.0.1", 26443);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.246.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("26443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://10.246.0.1:26443"));
        assert_eq!(get("KUBERNETES_PORT_26443_TCP_ADDR"), Some("10.246.0.1"));
    }
}
