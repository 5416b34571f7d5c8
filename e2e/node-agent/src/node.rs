//! Node registration (labels, capacity, Ready condition, InternalIP = the bridge address, removal of the
//! `node.kubernetes.io/not-ready` taint added by admission) and heartbeats (a Lease in kube-node-lease every
//! 10 s plus a status refresh every 40 s).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::{Error, Result};

const MANAGER: &str = "sweety-node-agent";

/// Node registration parameters.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Name of the Node object.
    pub name: String,
    /// Labels the Node is registered with.
    pub labels: BTreeMap<String, String>,
    /// CPU capacity and allocatable, as a Kubernetes quantity.
    pub cpu: String,
    /// Memory capacity and allocatable, as a Kubernetes quantity.
    pub memory: String,
    /// Most Pods the node accepts, as a quantity.
    pub pods: String,
    /// The node address (InternalIP): the bridge address.
    pub address: std::net::Ipv4Addr,
    /// Port of the kubelet-style API on the node address, if served.
    pub kubelet_port: Option<u16>,
}

fn status(cfg: &NodeConfig) -> NodeStatus {
    let now = crate::now();
    let cond = |t: &str, s: &str, reason: &str| NodeCondition {
        type_: t.into(),
        status: s.into(),
        reason: Some(reason.into()),
        message: Some(format!("sweety-node-agent: {reason}")),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    let resources: BTreeMap<String, Quantity> = [
        ("cpu", cfg.cpu.clone()),
        ("memory", cfg.memory.clone()),
        ("pods", cfg.pods.clone()),
        ("ephemeral-storage", "100Gi".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Quantity(v)))
    .collect();
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        conditions: Some(vec![
            cond("Ready", "True", "KubeletReady"),
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID"),
        ]),
        addresses: Some(vec![NodeAddress {
            type_: "InternalIP".into(),
            address: cfg.address.to_string(),
        }]),
        // No Hostname address: the apiserver prefers Hostname when contacting the kubelet API, and the node
        // name does not resolve here.
        daemon_endpoints: cfg.kubelet_port.map(|port| NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(port),
            }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH.into(),
            operating_system: "linux".into(),
            kubelet_version: "v1.34.4-sweety".into(),
            kube_proxy_version: String::new(),
            container_runtime_version: "sweety-node-agent://0.1".into(),
            os_image: "sweety-node-agent".into(),
            kernel_version: String::new(),
            machine_id: String::new(),
            system_uuid: String::new(),
            boot_id: String::new(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates or updates the Node, writes its status and removes the not-ready taint.
pub async fn register(client: &Client, cfg: &NodeConfig) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), cfg.name.clone()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
    ]);
    labels.extend(cfg.labels.clone());
    let patch = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": cfg.name, "labels": labels},
    });
    api.patch(
        &cfg.name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::kube(format!("applying Node {}", cfg.name)))?;
    write_status(client, cfg).await?;
    // TaintNodesByCondition admission adds node.kubernetes.io/not-ready:NoSchedule on creation; the
    // node-lifecycle-controller (disabled in e2e/cluster/up.sh) would remove it once the Node is Ready.
    let node = api.get(&cfg.name).await.map_err(Error::kube("get Node"))?;
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    let kept: Vec<_> = taints
        .iter()
        .filter(|t| t.key != "node.kubernetes.io/not-ready")
        .cloned()
        .collect();
    if kept.len() != taints.len() {
        let p = serde_json::json!({"spec": {"taints": kept}});
        api.patch(&cfg.name, &PatchParams::default(), &Patch::Merge(&p))
            .await
            .map_err(Error::kube("removing not-ready taint"))?;
    }
    Ok(())
}

async fn write_status(client: &Client, cfg: &NodeConfig) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let p = serde_json::json!({"status": status(cfg)});
    api.patch_status(&cfg.name, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .map_err(Error::kube("patching Node status"))?;
    Ok(())
}

async fn renew_lease(client: &Client, cfg: &NodeConfig) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let node: Api<Node> = Api::all(client.clone());
    let uid = node
        .get(&cfg.name)
        .await
        .map_err(Error::kube("get Node"))?
        .metadata
        .uid;
    let spec = LeaseSpec {
        holder_identity: Some(cfg.name.clone()),
        lease_duration_seconds: Some(40),
        renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        ..Default::default()
    };
    match api
        .get_opt(&cfg.name)
        .await
        .map_err(Error::kube("get Lease"))?
    {
        Some(_) => {
            let p = serde_json::json!({"spec": spec});
            api.patch(&cfg.name, &PatchParams::default(), &Patch::Merge(&p))
                .await
                .map_err(Error::kube("renewing Lease"))?;
        }
        None => {
            let lease = Lease {
                metadata: kube::api::ObjectMeta {
                    name: Some(cfg.name.clone()),
                    owner_references: uid.map(|uid| {
                        vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: cfg.name.clone(),
                            uid,
                            ..Default::default()
                        }]
                    }),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease)
                .await
                .map_err(Error::kube("creating Lease"))?;
        }
    }
    Ok(())
}

/// Heartbeats forever (errors are logged and retried on the next tick).
pub async fn heartbeat(client: Client, cfg: NodeConfig) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    let mut n: u64 = 0;
    loop {
        tick.tick().await;
        if let Err(e) = renew_lease(&client, &cfg).await {
            tracing::warn!(error = %e, "lease heartbeat");
        }
        if n % 4 == 3 {
            if let Err(e) = write_status(&client, &cfg).await {
                tracing::warn!(error = %e, "node status heartbeat");
            }
        }
        n += 1;
    }
}
