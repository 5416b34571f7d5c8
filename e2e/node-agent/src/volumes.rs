//! Materialises a Pod's volumes as files under `<pod dir>/volumes/<name>`: emptyDir, hostPath, Secret,
//! ConfigMap, downwardAPI and projected (secret, configMap, downwardAPI, serviceAccountToken via
//! TokenRequest). Contents are written once at Pod start; they are NOT refreshed afterwards (no ConfigMap /
//! Secret updates, no token rotation).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, ServiceAccount,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::{Error, Result};

/// Volume name → host directory (or file, for hostPath) holding its content.
pub type Volumes = BTreeMap<String, PathBuf>;

/// Writes all volumes of `pod` below `pod_dir`; `ips` is (Pod IP, node IP) for the downward API.
pub async fn materialise(
    client: &Client,
    pod: &Pod,
    pod_dir: &Path,
    ips: (&str, &str),
) -> Result<Volumes> {
    let mut out = Volumes::new();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let spec = match &pod.spec {
        Some(s) => s,
        None => return Ok(out),
    };
    for vol in spec.volumes.iter().flatten() {
        let name = vol.name.clone();
        let err = |message: String| Error::Volume {
            volume: name.clone(),
            message,
        };
        if let Some(hp) = &vol.host_path {
            out.insert(name.clone(), PathBuf::from(&hp.path));
            continue;
        }
        let dir = pod_dir.join("volumes").join(&name);
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        if vol.empty_dir.is_some() {
        } else if let Some(s) = &vol.secret {
            let sname = s.secret_name.clone().unwrap_or_default();
            write_secret(
                client,
                &ns,
                &sname,
                s.items.as_deref(),
                s.optional.unwrap_or(false),
                &dir,
            )
            .await
            .map_err(|e| err(e.to_string()))?;
        } else if let Some(c) = &vol.config_map {
            write_config_map(
                client,
                &ns,
                &c.name,
                c.items.as_deref(),
                c.optional.unwrap_or(false),
                &dir,
            )
            .await
            .map_err(|e| err(e.to_string()))?;
        } else if let Some(d) = &vol.downward_api {
            write_downward(pod, d.items.as_deref().unwrap_or_default(), ips, &dir)
                .map_err(|e| err(e.to_string()))?;
        } else if let Some(p) = &vol.projected {
            for src in p.sources.iter().flatten() {
                if let Some(s) = &src.secret {
                    write_secret(
                        client,
                        &ns,
                        &s.name,
                        s.items.as_deref(),
                        s.optional.unwrap_or(false),
                        &dir,
                    )
                    .await
                    .map_err(|e| err(e.to_string()))?;
                } else if let Some(c) = &src.config_map {
                    write_config_map(
                        client,
                        &ns,
                        &c.name,
                        c.items.as_deref(),
                        c.optional.unwrap_or(false),
                        &dir,
                    )
                    .await
                    .map_err(|e| err(e.to_string()))?;
                } else if let Some(d) = &src.downward_api {
                    write_downward(pod, d.items.as_deref().unwrap_or_default(), ips, &dir)
                        .map_err(|e| err(e.to_string()))?;
                } else if let Some(t) = &src.service_account_token {
                    let token =
                        request_token(client, pod, t.audience.clone(), t.expiration_seconds)
                            .await
                            .map_err(|e| err(e.to_string()))?;
                    write_file(&dir, &t.path, token.as_bytes())?;
                } else {
                    return Err(err("unsupported projected source (only secret, configMap, downwardAPI, serviceAccountToken)".into()));
                }
            }
        } else {
            return Err(err("unsupported volume type (only emptyDir, hostPath, secret, configMap, downwardAPI, projected)".into()));
        }
        out.insert(name, dir);
    }
    Ok(out)
}

fn write_file(dir: &Path, rel: &str, content: &[u8]) -> Result<()> {
    let rel = Path::new(rel);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(Error::Volume {
            volume: dir.display().to_string(),
            message: format!("refusing path {}", rel.display()),
        });
    }
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(Error::io(format!("creating {}", parent.display())))?;
    }
    std::fs::write(&path, content).map_err(Error::io(format!("writing {}", path.display())))
}

fn write_items(
    dir: &Path,
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    what: &str,
) -> Result<()> {
    match items {
        None => {
            for (k, v) in &data {
                write_file(dir, k, v)?;
            }
        }
        Some(items) => {
            for it in items {
                let v = data.get(&it.key).ok_or_else(|| Error::Volume {
                    volume: dir.display().to_string(),
                    message: format!("{what} has no key {}", it.key),
                })?;
                write_file(dir, &it.path, v)?;
            }
        }
    }
    Ok(())
}

async fn write_secret(
    client: &Client,
    ns: &str,
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: bool,
    dir: &Path,
) -> Result<()> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    match api
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get Secret {ns}/{name}")))?
    {
        Some(s) => {
            let mut data: BTreeMap<String, Vec<u8>> = s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            for (k, v) in s.string_data.unwrap_or_default() {
                data.insert(k, v.into_bytes());
            }
            write_items(dir, data, items, &format!("Secret {name}"))
        }
        None if optional => Ok(()),
        None => Err(Error::Volume {
            volume: dir.display().to_string(),
            message: format!("Secret {ns}/{name} not found"),
        }),
    }
}

async fn write_config_map(
    client: &Client,
    ns: &str,
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: bool,
    dir: &Path,
) -> Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    match api
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get ConfigMap {ns}/{name}")))?
    {
        Some(c) => {
            let mut data: BTreeMap<String, Vec<u8>> = c
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            for (k, v) in c.binary_data.unwrap_or_default() {
                data.insert(k, v.0);
            }
            write_items(dir, data, items, &format!("ConfigMap {name}"))
        }
        None if optional => Ok(()),
        None => Err(Error::Volume {
            volume: dir.display().to_string(),
            message: format!("ConfigMap {ns}/{name} not found"),
        }),
    }
}

fn write_downward(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    ips: (&str, &str),
    dir: &Path,
) -> Result<()> {
    for it in items {
        let value = match &it.field_ref {
            Some(f) => {
                crate::env::field_value(pod, &f.field_path, ips.0, ips.1).ok_or_else(|| {
                    Error::Volume {
                        volume: dir.display().to_string(),
                        message: format!("unsupported fieldRef {}", f.field_path),
                    }
                })?
            }
            None => {
                return Err(Error::Volume {
                    volume: dir.display().to_string(),
                    message: "downwardAPI resourceFieldRef is not supported".into(),
                })
            }
        };
        write_file(dir, &it.path, value.as_bytes())?;
    }
    Ok(())
}

async fn request_token(
    client: &Client,
    pod: &Pod,
    audience: Option<String>,
    expiration: Option<i64>,
) -> Result<String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audience.into_iter().collect(),
            expiration_seconds: expiration,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let resp: TokenRequest = api
        .create_subresource("token", &sa, &PostParams::default(), &req)
        .await
        .map_err(Error::kube(format!(
            "TokenRequest for ServiceAccount {ns}/{sa}"
        )))?;
    Ok(resp.status.map(|s| s.token).unwrap_or_default())
}
