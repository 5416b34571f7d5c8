//! LoadBalancer allocator (TCP only): gives each `type: LoadBalancer` Service without a loadBalancerClass an
//! address from 10.244.0.200-250, adds it to the bridge as a /32, writes `status.loadBalancer.ingress`, and
//! forwards every TCP port of the Service to its ready EndpointSlice endpoints (round robin). Services and
//! EndpointSlices are polled once a second. UDP/SCTP ports are not forwarded.

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use crate::{Error, Result};

const FIRST: u8 = 200;
const LAST: u8 = 250;

type Backends = Arc<RwLock<Vec<SocketAddr>>>;

struct Allocated {
    ip: Ipv4Addr,
    /// (service port name, port) → backends + listener task.
    ports: Vec<(String, u16, Backends, JoinHandle<()>)>,
}

/// Runs the allocator until the task is dropped; addresses are removed by [`release_all`].
pub async fn run(
    client: Client,
    bridge: String,
    state: Arc<tokio::sync::Mutex<HashMap<String, Ipv4Addr>>>,
) {
    let mut allocated: HashMap<String, Allocated> = HashMap::new();
    loop {
        if let Err(e) = sync(&client, &bridge, &mut allocated, &state).await {
            tracing::warn!(error = %e, "load balancer sync");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Removes every address the allocator added to the bridge.
pub async fn release_all(bridge: &str, state: &tokio::sync::Mutex<HashMap<String, Ipv4Addr>>) {
    for (_, ip) in state.lock().await.drain() {
        let _ = crate::net::ip(&["addr", "del", &format!("{ip}/32"), "dev", bridge]).await;
    }
}

async fn sync(
    client: &Client,
    bridge: &str,
    allocated: &mut HashMap<String, Allocated>,
    state: &tokio::sync::Mutex<HashMap<String, Ipv4Addr>>,
) -> Result<()> {
    let svcs: Api<Service> = Api::all(client.clone());
    let list = svcs
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list Services"))?;
    let mut live = BTreeSet::new();
    for svc in list.items {
        let spec = svc.spec.clone().unwrap_or_default();
        if spec.type_.as_deref() != Some("LoadBalancer") || spec.load_balancer_class.is_some() {
            continue;
        }
        let (Some(uid), Some(ns), Some(name)) = (
            svc.metadata.uid.clone(),
            svc.metadata.namespace.clone(),
            svc.metadata.name.clone(),
        ) else {
            continue;
        };
        live.insert(uid.clone());
        if !allocated.contains_key(&uid) {
            let used: BTreeSet<Ipv4Addr> = allocated.values().map(|a| a.ip).collect();
            let Some(ip) = (FIRST..=LAST)
                .map(|n| Ipv4Addr::new(10, 244, 0, n))
                .find(|i| !used.contains(i))
            else {
                tracing::warn!(service = %format!("{ns}/{name}"), "load balancer range exhausted");
                continue;
            };
            crate::net::ip(&["addr", "replace", &format!("{ip}/32"), "dev", bridge]).await?;
            state.lock().await.insert(uid.clone(), ip);
            let mut ports = Vec::new();
            for p in spec.ports.iter().flatten() {
                if p.protocol.as_deref().unwrap_or("TCP") != "TCP" {
                    continue;
                }
                let Ok(port) = u16::try_from(p.port) else {
                    continue;
                };
                let backends: Backends = Arc::new(RwLock::new(Vec::new()));
                let listener = tokio::net::TcpListener::bind((ip, port))
                    .await
                    .map_err(Error::io(format!("binding {ip}:{port}")))?;
                let task = tokio::spawn(forward(listener, backends.clone()));
                ports.push((p.name.clone().unwrap_or_default(), port, backends, task));
            }
            tracing::info!(service = %format!("{ns}/{name}"), %ip, "load balancer address assigned");
            allocated.insert(uid.clone(), Allocated { ip, ports });
        }
        let a = &allocated[&uid];
        let current = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .and_then(|i| i.first())
            .and_then(|i| i.ip.clone());
        if current.as_deref() != Some(a.ip.to_string().as_str()) {
            let api: Api<Service> = Api::namespaced(client.clone(), &ns);
            let body = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": a.ip.to_string(), "ipMode": "VIP"}]}}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
                .await
                .map_err(Error::kube("patching Service status"))?;
        }
        // Backends from the ready endpoints of the Service's EndpointSlices.
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
        let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={name}"));
        let slices = slices
            .list(&lp)
            .await
            .map_err(Error::kube("list EndpointSlices"))?;
        for (pname, _, backends, _) in &a.ports {
            let mut addrs = Vec::new();
            for s in &slices.items {
                let Some(port) = s
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref().unwrap_or("") == pname)
                    .and_then(|p| p.port)
                    .and_then(|p| u16::try_from(p).ok())
                else {
                    continue;
                };
                for e in &s.endpoints {
                    if e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false) {
                        for addr in &e.addresses {
                            if let Ok(ip) = addr.parse::<Ipv4Addr>() {
                                addrs.push(SocketAddr::from((ip, port)));
                            }
                        }
                    }
                }
            }
            addrs.sort();
            *backends.write().expect("backends lock") = addrs;
        }
    }
    let gone: Vec<String> = allocated
        .keys()
        .filter(|u| !live.contains(*u))
        .cloned()
        .collect();
    for uid in gone {
        if let Some(a) = allocated.remove(&uid) {
            for (_, _, _, task) in a.ports {
                task.abort();
            }
            let _ = crate::net::ip(&["addr", "del", &format!("{}/32", a.ip), "dev", bridge]).await;
            state.lock().await.remove(&uid);
            tracing::info!(ip = %a.ip, "load balancer address released");
        }
    }
    Ok(())
}

async fn forward(listener: tokio::net::TcpListener, backends: Backends) {
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        let target = {
            let b = backends.read().expect("backends lock");
            (!b.is_empty()).then(|| b[next.fetch_add(1, Ordering::Relaxed) % b.len()])
        };
        let Some(target) = target else { continue };
        tokio::spawn(async move {
            if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            }
        });
    }
}
