//! LoadBalancer allocator (a stand-in for a cloud provider, like cloud-provider-kind): gives each
//! `type: LoadBalancer` Service without a loadBalancerClass an address from .200-.250 of the Pod CIDR, adds it
//! to the bridge as a /32, writes `status.loadBalancer.ingress`, and forwards every TCP and UDP port of the
//! Service to its ready EndpointSlice endpoints (round robin per connection / per UDP flow). Services and
//! EndpointSlices are watched: each change (bursts within 20 ms coalesced) triggers a sync, and a sync runs at
//! least every 10 s regardless; ports added to or removed from a Service are picked up by the next sync. A Service keeps the address its status already has when that is in the range (so an agent restart
//! does not move addresses). SCTP ports are not forwarded.
//!
//! Requested addresses: a Service with `spec.loadBalancerIP` gets exactly that address when it is in the
//! range and no other Service holds it (moving off any address it had); otherwise it gets none, and the
//! Service status carries the condition [`ADDRESS_USABLE_CONDITION`] (False, `AddressNotUsable`, saying why),
//! which the Sweety controller turns into the Gateway's `Programmed=False AddressNotUsable` (Gateway API
//! static addresses). Dynamic addresses avoid addresses other Services ask for.
//!
//! UDP: one socket per Service port bound to the load-balancer address; each client address gets a flow with
//! its own socket (bound to the load-balancer address, connected to one backend), so replies leave from the
//! address the client sent to (what QUIC needs). Flows end after [`UDP_IDLE`] without a datagram either way
//! (or at once on an ICMP error from the backend); at most [`MAX_UDP_FLOWS`] per port, and a new client's flow
//! evicts the idlest one when the table is full (clients that open a socket per datagram, like DNS resolvers
//! and the conformance suite, would otherwise lock new clients out). At most [`MAX_TCP_CONNECTIONS`] TCP
//! connections per port.

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::net::{PodCidr, LB_FIRST, LB_LAST};
use crate::{Error, Result};

/// A UDP flow without a datagram in either direction for this long is forgotten: conntrack's default for
/// UDP (`nf_conntrack_udp_timeout`, 30 s), what kube-proxy's Service forwarding relies on.
pub const UDP_IDLE: Duration = Duration::from_secs(30);
/// Most UDP flows per forwarded port. When the table is full, a new client's flow replaces the flow idle the
/// longest (instead of its datagrams being dropped); each flow holds one socket.
pub const MAX_UDP_FLOWS: usize = 2048;
/// Most concurrent TCP connections per forwarded port.
pub const MAX_TCP_CONNECTIONS: usize = 1024;
/// Largest UDP datagram relayed (bigger ones are truncated by the kernel; none are that big here).
const UDP_BUF: usize = 65_535;

type Backends = Arc<RwLock<Vec<SocketAddr>>>;

/// Protocol and port of one Service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// TCP: connections are relayed.
    Tcp,
    /// UDP: datagrams are relayed per client address.
    Udp,
}

struct Forwarded {
    /// The Service port's name (EndpointSlice ports are matched by it).
    name: String,
    backends: Backends,
    task: JoinHandle<()>,
}

struct Allocated {
    ip: Ipv4Addr,
    ports: HashMap<(Proto, u16), Forwarded>,
}

/// Runs the allocator until the task is dropped; addresses are removed by [`release_all`].
pub async fn run(
    client: Client,
    bridge: String,
    cidr: PodCidr,
    state: Arc<tokio::sync::Mutex<HashMap<String, Ipv4Addr>>>,
) {
    let mut allocated: HashMap<String, Allocated> = HashMap::new();
    let changed = Arc::new(tokio::sync::Notify::new());
    let _services = spawn_trigger::<Service>(client.clone(), changed.clone());
    let _slices = spawn_trigger::<EndpointSlice>(client.clone(), changed.clone());
    loop {
        if let Err(e) = sync(&client, &bridge, cidr, &mut allocated, &state).await {
            tracing::warn!(error = %e, "load balancer sync");
        }
        // The next sync runs on the next Service or EndpointSlice event (a burst of events
        // within SYNC_COALESCE makes one sync), or after RESYNC without any (a failed sync
        // or a missed event is retried then).
        if tokio::time::timeout(RESYNC, changed.notified())
            .await
            .is_ok()
        {
            tokio::time::sleep(SYNC_COALESCE).await;
        }
    }
}

/// Longest time between two syncs without any watch event.
const RESYNC: Duration = Duration::from_secs(10);
/// Events this close together are handled by one sync.
const SYNC_COALESCE: Duration = Duration::from_millis(20);

/// Watches every `K` in the cluster and wakes the allocator on each change (the event itself
/// is not needed: a sync lists the current state). Ends with the returned guard.
fn spawn_trigger<K>(client: Client, changed: Arc<tokio::sync::Notify>) -> AbortOnDrop
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
    K::DynamicType: Default,
{
    use futures_util::StreamExt;
    use kube::runtime::WatchStreamExt;
    let api: Api<K> = Api::all(client);
    AbortOnDrop(tokio::spawn(async move {
        let mut events = kube::runtime::watcher(api, kube::runtime::watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(ev) = events.next().await {
            match ev {
                Ok(_) => changed.notify_one(),
                Err(e) => tracing::debug!(error = %e, "load balancer watch; retrying"),
            }
        }
    }))
}

/// Aborts a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Removes every address the allocator added to the bridge.
pub async fn release_all(bridge: &str, state: &tokio::sync::Mutex<HashMap<String, Ipv4Addr>>) {
    for (_, ip) in state.lock().await.drain() {
        let _ = crate::net::ip(&["addr", "del", &format!("{ip}/32"), "dev", bridge]).await;
    }
}

/// The (protocol, port) → port name the Service asks for (SCTP and out-of-range ports skipped).
fn wanted_ports(svc: &Service) -> HashMap<(Proto, u16), String> {
    let mut out = HashMap::new();
    for p in svc.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
        let proto = match p.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => Proto::Tcp,
            "UDP" => Proto::Udp,
            _ => continue,
        };
        let Ok(port) = u16::try_from(p.port) else {
            continue;
        };
        out.insert((proto, port), p.name.clone().unwrap_or_default());
    }
    out
}

/// Ready endpoints of `slices` for the Service port named `port_name` (sorted).
fn ready_backends(slices: &[EndpointSlice], port_name: &str) -> Vec<SocketAddr> {
    let mut addrs = Vec::new();
    for s in slices {
        let Some(port) = s
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or("") == port_name)
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
    addrs.dedup();
    addrs
}

async fn listen(
    ip: Ipv4Addr,
    proto: Proto,
    port: u16,
    backends: Backends,
) -> Result<JoinHandle<()>> {
    Ok(match proto {
        Proto::Tcp => {
            let l = TcpListener::bind((ip, port))
                .await
                .map_err(Error::io(format!("binding {ip}:{port}/TCP")))?;
            tokio::spawn(forward_tcp(l, backends))
        }
        Proto::Udp => {
            let s = UdpSocket::bind((ip, port))
                .await
                .map_err(Error::io(format!("binding {ip}:{port}/UDP")))?;
            tokio::spawn(forward_udp(Arc::new(s), ip, backends))
        }
    })
}

async fn sync(
    client: &Client,
    bridge: &str,
    cidr: PodCidr,
    allocated: &mut HashMap<String, Allocated>,
    state: &tokio::sync::Mutex<HashMap<String, Ipv4Addr>>,
) -> Result<()> {
    let svcs: Api<Service> = Api::all(client.clone());
    let list = svcs
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list Services"))?;
    let mut live = BTreeSet::new();
    // Addresses Services have or ask for: new dynamic addresses avoid them.
    let claimed: BTreeSet<Ipv4Addr> = list
        .items
        .iter()
        .filter_map(|svc| status_ip(svc, cidr))
        .chain(
            list.items
                .iter()
                .filter_map(|svc| svc.spec.as_ref()?.load_balancer_ip.as_deref()?.parse().ok()),
        )
        .collect();
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
        let svc_name = format!("{ns}/{name}");
        live.insert(uid.clone());
        // A requested address (spec.loadBalancerIP) is honoured when it is in the range and free; the Service
        // moves to it (or off an address it may no longer have).
        let held_by_others: BTreeSet<Ipv4Addr> = allocated
            .iter()
            .filter(|(u, _)| **u != uid)
            .map(|(_, a)| a.ip)
            .collect();
        let requested = requested_ip(&svc, cidr, &held_by_others);
        let keep = match (&requested, allocated.get(&uid)) {
            (Ok(Some(want)), Some(a)) => a.ip == *want,
            (Err(_), Some(_)) => false,
            _ => true,
        };
        if !keep {
            if let Some(a) = allocated.remove(&uid) {
                release(bridge, state, &uid, a).await;
            }
        }
        if let Err(why) = &requested {
            if let Err(e) = publish_unusable(client, &svc, &ns, &name, why).await {
                tracing::warn!(service = %svc_name, error = %e, "load balancer status");
            }
            continue;
        }
        if !allocated.contains_key(&uid) {
            let used: BTreeSet<Ipv4Addr> = allocated.values().map(|a| a.ip).collect();
            // The requested address; else keep the address the Service already has (e.g. after an agent
            // restart) when it is ours and free; new addresses avoid those other Services hold or ask for.
            let Some(ip) = requested.clone().ok().flatten().or_else(|| {
                status_ip(&svc, cidr)
                    .filter(|i| !used.contains(i))
                    .or_else(|| {
                        (LB_FIRST..=LB_LAST)
                            .map(|n| cidr.host(n))
                            .find(|i| !used.contains(i) && !claimed.contains(i))
                    })
            }) else {
                tracing::warn!(service = %svc_name, "load balancer range exhausted");
                continue;
            };
            crate::net::ip(&["addr", "replace", &format!("{ip}/32"), "dev", bridge]).await?;
            state.lock().await.insert(uid.clone(), ip);
            tracing::info!(service = %svc_name, %ip, "load balancer address assigned");
            allocated.insert(
                uid.clone(),
                Allocated {
                    ip,
                    ports: HashMap::new(),
                },
            );
        }
        let a = allocated.get_mut(&uid).expect("allocated above");
        // Ports: stop forwarding removed ones, start new ones (a failed bind is retried next poll).
        let wanted = wanted_ports(&svc);
        a.ports.retain(|key, f| {
            let keep = wanted.get(key) == Some(&f.name);
            if !keep {
                f.task.abort();
            }
            keep
        });
        for (key, pname) in &wanted {
            if a.ports.contains_key(key) {
                continue;
            }
            let backends: Backends = Arc::new(RwLock::new(Vec::new()));
            match listen(a.ip, key.0, key.1, backends.clone()).await {
                Ok(task) => {
                    a.ports.insert(
                        *key,
                        Forwarded {
                            name: pname.clone(),
                            backends,
                            task,
                        },
                    );
                }
                Err(e) => tracing::warn!(service = %svc_name, error = %e, "load balancer port"),
            }
        }
        // Errors here concern this Service only: the others are still served.
        if let Err(e) = publish(client, &svc, &ns, &name, a).await {
            tracing::warn!(service = %svc_name, error = %e, "load balancer status/backends");
        }
    }
    let gone: Vec<String> = allocated
        .keys()
        .filter(|u| !live.contains(*u))
        .cloned()
        .collect();
    for uid in gone {
        if let Some(a) = allocated.remove(&uid) {
            release(bridge, state, &uid, a).await;
        }
    }
    Ok(())
}

/// Stops forwarding a Service's ports and removes its address from the bridge.
async fn release(
    bridge: &str,
    state: &tokio::sync::Mutex<HashMap<String, Ipv4Addr>>,
    uid: &str,
    a: Allocated,
) {
    for f in a.ports.values() {
        f.task.abort();
    }
    let _ = crate::net::ip(&["addr", "del", &format!("{}/32", a.ip), "dev", bridge]).await;
    state.lock().await.remove(uid);
    tracing::info!(ip = %a.ip, "load balancer address released");
}

/// Service status condition telling the Sweety controller that the address asked for in `spec.loadBalancerIP`
/// cannot be given (status False, reason `AddressNotUsable`); it then reports the Gateway `AddressNotUsable`.
pub const ADDRESS_USABLE_CONDITION: &str = "sweety.dev/LoadBalancerAddressUsable";

/// A Service's `spec.loadBalancerIP`: `Ok(None)` when none is asked for, `Ok(Some(ip))` when it is in the
/// load-balancer range and not held by another Service, else why it cannot be given.
fn requested_ip(
    svc: &Service,
    cidr: PodCidr,
    held_by_others: &BTreeSet<Ipv4Addr>,
) -> std::result::Result<Option<Ipv4Addr>, String> {
    let Some(want) = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_ip.as_deref())
        .filter(|s| !s.is_empty())
    else {
        return Ok(None);
    };
    let Ok(ip) = want.parse::<Ipv4Addr>() else {
        return Err(format!("{want:?} is not an IPv4 address"));
    };
    if !in_lb_range(ip, cidr) {
        return Err(format!(
            "{ip} is outside the load-balancer range {}-{}",
            cidr.host(LB_FIRST),
            cidr.host(LB_LAST)
        ));
    }
    if held_by_others.contains(&ip) {
        return Err(format!("{ip} is already used by another Service"));
    }
    Ok(Some(ip))
}

fn in_lb_range(ip: Ipv4Addr, cidr: PodCidr) -> bool {
    cidr.contains(ip) && (LB_FIRST..=LB_LAST).contains(&ip.octets()[3])
}

/// Our condition on a Service (type [`ADDRESS_USABLE_CONDITION`]), if it has one: (status, message).
fn usable_condition(svc: &Service) -> Option<(String, String, Option<i64>)> {
    svc.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == ADDRESS_USABLE_CONDITION)
        .map(|c| (c.status.clone(), c.message.clone(), c.observed_generation))
}

/// Writes (when it differs) the Service's status for an address that cannot be given: no ingress, our
/// condition False with `why`.
async fn publish_unusable(
    client: &Client,
    svc: &Service,
    ns: &str,
    name: &str,
    why: &str,
) -> Result<()> {
    let generation = svc.metadata.generation;
    let has_ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty());
    if !has_ingress && usable_condition(svc) == Some(("False".into(), why.into(), generation)) {
        return Ok(());
    }
    tracing::warn!(service = %format!("{ns}/{name}"), why, "requested load balancer address not usable");
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let body = serde_json::json!({"status": {
        "loadBalancer": {"ingress": null},
        "conditions": [{
            "type": ADDRESS_USABLE_CONDITION,
            "status": "False",
            "reason": "AddressNotUsable",
            "message": why,
            "observedGeneration": generation,
            "lastTransitionTime": crate::now(),
        }],
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(Error::kube("patching Service status"))?;
    Ok(())
}

/// The load-balancer address in a Service's status, if it is one of `cidr`'s load-balancer range.
fn status_ip(svc: &Service, cidr: PodCidr) -> Option<Ipv4Addr> {
    let ip: Ipv4Addr = svc
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .as_deref()?
        .parse()
        .ok()?;
    in_lb_range(ip, cidr).then_some(ip)
}

/// Writes the Service's load-balancer status (if it differs) and refreshes the backends of its ports.
async fn publish(
    client: &Client,
    svc: &Service,
    ns: &str,
    name: &str,
    a: &Allocated,
) -> Result<()> {
    let current = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .and_then(|i| i.first())
        .and_then(|i| i.ip.clone());
    let stale_condition = usable_condition(svc).is_some();
    if current.as_deref() != Some(a.ip.to_string().as_str()) || stale_condition {
        let api: Api<Service> = Api::namespaced(client.clone(), ns);
        let mut body = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": a.ip.to_string(), "ipMode": "VIP"}]}}});
        if stale_condition {
            // The address is given now: our "not usable" condition goes.
            body["status"]["conditions"] = serde_json::Value::Null;
        }
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map_err(Error::kube("patching Service status"))?;
    }
    // Backends from the ready endpoints of the Service's EndpointSlices.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={name}"));
    let slices = slices
        .list(&lp)
        .await
        .map_err(Error::kube("list EndpointSlices"))?;
    for f in a.ports.values() {
        *f.backends.write().expect("backends lock") = ready_backends(&slices.items, &f.name);
    }
    Ok(())
}

fn pick(backends: &Backends, next: &AtomicUsize) -> Option<SocketAddr> {
    let b = backends.read().expect("backends lock");
    (!b.is_empty()).then(|| b[next.fetch_add(1, Ordering::Relaxed) % b.len()])
}

async fn forward_tcp(listener: TcpListener, backends: Backends) {
    let next = AtomicUsize::new(0);
    let permits = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Ok((inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Some(target) = pick(&backends, &next) else {
            continue;
        };
        tokio::spawn(async move {
            let _permit = permit;
            if let Ok((mut inbound, mut out)) = relay_ends(inbound, target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            }
        });
    }
}

/// The two ends of a relayed TCP connection: the accepted one and a new one to `target`, both
/// with TCP_NODELAY, as Go's net package gives every TCP connection (kube-proxy's user-space
/// mode, the Go backends of the tests). Without it a response that reaches the relay in two
/// reads leaves it as two writes, the second held back by Nagle's algorithm until the
/// client acknowledges the first (a delayed ACK): latency no load balancer of a real cluster
/// adds to what the e2e tests and benchmarks measure.
async fn relay_ends(
    inbound: tokio::net::TcpStream,
    target: SocketAddr,
) -> std::io::Result<(tokio::net::TcpStream, tokio::net::TcpStream)> {
    inbound.set_nodelay(true)?;
    let out = tokio::net::TcpStream::connect(target).await?;
    out.set_nodelay(true)?;
    Ok((inbound, out))
}

/// One UDP flow: its upstream socket (connected to one backend), when it last carried a datagram either way,
/// and the task relaying its replies (aborted when the flow is evicted).
struct Flow {
    up: Arc<UdpSocket>,
    /// Milliseconds since the port's epoch of the last datagram in either direction.
    last: AtomicU64,
    relay: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Flow {
    fn touch(&self, epoch: Instant) {
        self.last.store(millis(epoch), Ordering::Relaxed);
    }
}

fn millis(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Client address → its flow.
type Flows = Arc<Mutex<HashMap<SocketAddr, Arc<Flow>>>>;

/// Makes room for one more flow when the table is full: the flow idle longest is dropped (its socket closed,
/// its relay stopped), like conntrack dropping an old entry rather than refusing new traffic.
fn evict_oldest(flows: &mut HashMap<SocketAddr, Arc<Flow>>) -> Option<SocketAddr> {
    let oldest = flows
        .iter()
        .min_by_key(|(_, f)| f.last.load(Ordering::Relaxed))
        .map(|(c, _)| *c)?;
    if let Some(f) = flows.remove(&oldest) {
        if let Some(task) = f.relay.lock().expect("relay lock").take() {
            task.abort();
        }
    }
    Some(oldest)
}

/// Ends every flow of a port when its forwarder stops (port removed, Service gone). The relay tasks hold the
/// port's socket to send replies from it; left running, they would keep `ip:port` bound until they idle out,
/// and a new Service given the same address could not bind the port meanwhile (seen as a UDPRoute test's
/// first ~30 s of probes going unanswered after the previous test's Gateway released that address).
struct EndFlows(Flows);

impl Drop for EndFlows {
    fn drop(&mut self) {
        let mut table = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for (_, f) in table.drain() {
            if let Some(task) = f.relay.lock().unwrap_or_else(|p| p.into_inner()).take() {
                task.abort();
            }
        }
    }
}

async fn forward_udp(sock: Arc<UdpSocket>, ip: Ipv4Addr, backends: Backends) {
    forward_udp_with(sock, ip, backends, MAX_UDP_FLOWS, UDP_IDLE).await
}

async fn forward_udp_with(
    sock: Arc<UdpSocket>,
    ip: Ipv4Addr,
    backends: Backends,
    max_flows: usize,
    idle: Duration,
) {
    let next = AtomicUsize::new(0);
    let epoch = Instant::now();
    let flows: Flows = Arc::default();
    let _end = EndFlows(flows.clone());
    let mut buf = vec![0u8; UDP_BUF];
    loop {
        let (n, client) = match sock.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "udp recv");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let existing = flows.lock().expect("flows lock").get(&client).cloned();
        let flow = match existing {
            Some(f) => f,
            None => {
                let Some(target) = pick(&backends, &next) else {
                    continue;
                };
                let up = match new_flow(ip, target).await {
                    Ok(u) => Arc::new(u),
                    Err(e) => {
                        tracing::warn!(%target, error = %e, "udp flow");
                        continue;
                    }
                };
                let flow = Arc::new(Flow {
                    up,
                    last: AtomicU64::new(millis(epoch)),
                    relay: Mutex::new(None),
                });
                let task = tokio::spawn(udp_replies(
                    sock.clone(),
                    flow.clone(),
                    client,
                    flows.clone(),
                    epoch,
                    idle,
                ));
                *flow.relay.lock().expect("relay lock") = Some(task.abort_handle());
                let mut table = flows.lock().expect("flows lock");
                while table.len() >= max_flows {
                    let Some(gone) = evict_oldest(&mut table) else {
                        break;
                    };
                    tracing::debug!(client = %gone, "udp flow table full; idlest flow evicted");
                }
                table.insert(client, flow.clone());
                drop(table);
                flow
            }
        };
        flow.touch(epoch);
        let _ = flow.up.send(&buf[..n]).await;
    }
}

async fn new_flow(ip: Ipv4Addr, target: SocketAddr) -> std::io::Result<UdpSocket> {
    let s = UdpSocket::bind((ip, 0)).await?;
    s.connect(target).await?;
    Ok(s)
}

/// Relays a flow's replies to its client until no datagram went either way for `idle`, then forgets the flow.
/// An ICMP error from the backend (nothing listening yet) ends the flow at once, so the client's next
/// datagram opens a new one (possibly to another backend).
async fn udp_replies(
    sock: Arc<UdpSocket>,
    flow: Arc<Flow>,
    client: SocketAddr,
    flows: Flows,
    epoch: Instant,
    idle: Duration,
) {
    let mut buf = vec![0u8; UDP_BUF];
    loop {
        let quiet =
            Duration::from_millis(millis(epoch).saturating_sub(flow.last.load(Ordering::Relaxed)));
        let Some(left) = idle.checked_sub(quiet).filter(|d| !d.is_zero()) else {
            break;
        };
        match tokio::time::timeout(left, flow.up.recv(&mut buf)).await {
            Ok(Ok(n)) => {
                flow.touch(epoch);
                if sock.send_to(&buf[..n], client).await.is_err() {
                    break;
                }
            }
            Ok(Err(_)) => break,
            // Quiet for `left`: loop to check whether the client sent meanwhile.
            Err(_) => {}
        }
    }
    let mut table = flows.lock().expect("flows lock");
    if table.get(&client).is_some_and(|f| Arc::ptr_eq(f, &flow)) {
        table.remove(&client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// Both ends of a relayed TCP connection have TCP_NODELAY (without it a response in two
    /// writes waits for the client's delayed ACK), and bytes go through both ways.
    #[tokio::test]
    async fn tcp_relay_ends_have_nodelay() {
        let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(front.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = front.accept().await.unwrap();
        let (mut inbound, mut out) = relay_ends(accepted, backend.local_addr().unwrap())
            .await
            .unwrap();
        assert!(inbound.nodelay().unwrap(), "the client's end");
        assert!(out.nodelay().unwrap(), "the backend's end");
        let relay = tokio::spawn(async move {
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
        });
        let (mut server, _) = backend.accept().await.unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        server.write_all(b"pong").await.unwrap();
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        relay.abort();
    }

    #[test]
    fn status_address_is_kept_only_inside_the_range() {
        let svc = |ip: &str| -> Service {
            serde_json::from_value(serde_json::json!({
                "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}
            }))
            .unwrap()
        };
        let cidr = PodCidr::parse("10.246.0.0/24").unwrap();
        assert_eq!(
            status_ip(&svc("10.246.0.203"), cidr),
            Some(Ipv4Addr::new(10, 246, 0, 203))
        );
        assert_eq!(status_ip(&svc("10.246.0.5"), cidr), None);
        assert_eq!(status_ip(&svc("10.247.0.203"), cidr), None);
        assert_eq!(status_ip(&Service::default(), cidr), None);
    }

    #[test]
    fn requested_address_must_be_in_range_and_free() {
        let svc = |ip: Option<&str>| -> Service {
            serde_json::from_value(
                serde_json::json!({"spec": {"type": "LoadBalancer", "loadBalancerIP": ip}}),
            )
            .unwrap()
        };
        let cidr = PodCidr::parse("10.246.0.0/24").unwrap();
        let none = BTreeSet::new();
        assert_eq!(requested_ip(&svc(None), cidr, &none), Ok(None));
        assert_eq!(requested_ip(&svc(Some("")), cidr, &none), Ok(None));
        assert_eq!(
            requested_ip(&svc(Some("10.246.0.250")), cidr, &none),
            Ok(Some(Ipv4Addr::new(10, 246, 0, 250)))
        );
        let outside = requested_ip(&svc(Some("192.0.2.1")), cidr, &none).unwrap_err();
        assert!(
            outside.contains("outside the load-balancer range 10.246.0.200-10.246.0.250"),
            "{outside}"
        );
        // In the Pod CIDR but not the load-balancer part of it.
        assert!(requested_ip(&svc(Some("10.246.0.5")), cidr, &none).is_err());
        assert!(requested_ip(&svc(Some("not-an-ip")), cidr, &none).is_err());
        let held = BTreeSet::from([Ipv4Addr::new(10, 246, 0, 250)]);
        let taken = requested_ip(&svc(Some("10.246.0.250")), cidr, &held).unwrap_err();
        assert!(taken.contains("another Service"), "{taken}");
    }

    #[test]
    fn wanted_ports_by_protocol() {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "spec": {"type": "LoadBalancer", "ports": [
                {"name": "https", "port": 443, "protocol": "TCP"},
                {"name": "http3", "port": 443, "protocol": "UDP"},
                {"name": "http", "port": 80},
                {"name": "s", "port": 9, "protocol": "SCTP"}
            ]}
        }))
        .unwrap();
        let w = wanted_ports(&svc);
        assert_eq!(w.len(), 3);
        assert_eq!(w[&(Proto::Tcp, 443)], "https");
        assert_eq!(w[&(Proto::Udp, 443)], "http3");
        assert_eq!(w[&(Proto::Tcp, 80)], "http");
    }

    #[test]
    fn only_ready_endpoints_of_the_named_port() {
        let ep = |ip: &str, ready: bool| Endpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                ..Default::default()
            }),
            ..Default::default()
        };
        let slice = EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: vec![ep("10.246.0.3", true), ep("10.246.0.4", false)],
            ports: Some(vec![
                EndpointPort {
                    name: Some("http3".into()),
                    port: Some(8443),
                    protocol: Some("UDP".into()),
                    ..Default::default()
                },
                EndpointPort {
                    name: Some("http".into()),
                    port: Some(8080),
                    ..Default::default()
                },
            ]),
            metadata: Default::default(),
        };
        assert_eq!(
            ready_backends(std::slice::from_ref(&slice), "http3"),
            vec!["10.246.0.3:8443".parse().unwrap()]
        );
        assert_eq!(
            ready_backends(std::slice::from_ref(&slice), "http"),
            vec!["10.246.0.3:8080".parse().unwrap()]
        );
        assert!(ready_backends(&[slice], "nope").is_empty());
    }

    /// A UDP flow through the forwarder on 127.0.0.1 reaches the backend and the reply comes back from the
    /// forwarder's address; two clients get their own flows.
    #[tokio::test]
    async fn udp_flows_relay_both_ways() {
        let backend = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let backend_addr = backend.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            for _ in 0..4 {
                let (n, from) = backend.recv_from(&mut buf).await.unwrap();
                let mut reply = b"echo:".to_vec();
                reply.extend_from_slice(&buf[..n]);
                backend.send_to(&reply, from).await.unwrap();
            }
        });
        let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let front_addr = front.local_addr().unwrap();
        let backends: Backends = Arc::new(RwLock::new(vec![backend_addr]));
        let task = tokio::spawn(forward_udp(Arc::new(front), Ipv4Addr::LOCALHOST, backends));
        for name in ["a", "b"] {
            let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            c.connect(front_addr).await.unwrap();
            for i in 0..2 {
                let msg = format!("{name}{i}");
                c.send(msg.as_bytes()).await.unwrap();
                let mut buf = [0u8; 64];
                let n = tokio::time::timeout(Duration::from_secs(5), c.recv(&mut buf))
                    .await
                    .expect("reply in time")
                    .unwrap();
                assert_eq!(&buf[..n], format!("echo:{msg}").as_bytes());
            }
        }
        task.abort();
    }

    /// A full flow table takes new clients by evicting the idlest flow: with room for 2 flows, 6 clients that
    /// each send one datagram from a fresh socket (what the conformance suite and DNS resolvers do) all get
    /// their answer through a flow of its own.
    #[tokio::test]
    async fn full_flow_table_evicts_the_idlest_flow() {
        let backend = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let backend_addr = backend.local_addr().unwrap();
        let peers = Arc::new(Mutex::new(BTreeSet::new()));
        let seen = peers.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            loop {
                let (n, from) = backend.recv_from(&mut buf).await.unwrap();
                seen.lock().unwrap().insert(from);
                backend.send_to(&buf[..n], from).await.unwrap();
            }
        });
        let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let front_addr = front.local_addr().unwrap();
        let backends: Backends = Arc::new(RwLock::new(vec![backend_addr]));
        let task = tokio::spawn(forward_udp_with(
            Arc::new(front),
            Ipv4Addr::LOCALHOST,
            backends,
            2,
            Duration::from_secs(600),
        ));
        for i in 0..6 {
            let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            c.connect(front_addr).await.unwrap();
            let msg = format!("probe{i}");
            c.send(msg.as_bytes()).await.unwrap();
            let mut buf = [0u8; 64];
            let n = tokio::time::timeout(Duration::from_secs(5), c.recv(&mut buf))
                .await
                .expect("every new client is answered")
                .unwrap();
            assert_eq!(&buf[..n], msg.as_bytes());
        }
        // Six flows, each with its own upstream socket.
        assert_eq!(peers.lock().unwrap().len(), 6);
        task.abort();
    }

    /// Stopping a port's forwarder (as when its Service goes) closes the flows' sockets with it, so the
    /// address and port can be bound again at once (for the next Service given that address).
    #[tokio::test]
    async fn stopping_the_forwarder_frees_the_port() {
        let backend = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let backend_addr = backend.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            loop {
                let (n, from) = backend.recv_from(&mut buf).await.unwrap();
                backend.send_to(&buf[..n], from).await.unwrap();
            }
        });
        let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let front_addr = front.local_addr().unwrap();
        let backends: Backends = Arc::new(RwLock::new(vec![backend_addr]));
        let task = tokio::spawn(forward_udp(Arc::new(front), Ipv4Addr::LOCALHOST, backends));
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        c.connect(front_addr).await.unwrap();
        c.send(b"x").await.unwrap();
        let mut buf = [0u8; 8];
        tokio::time::timeout(Duration::from_secs(5), c.recv(&mut buf))
            .await
            .expect("reply in time")
            .unwrap();
        task.abort();
        let _ = task.await;
        // The relay task is aborted too; its socket closes once the runtime drops it.
        let mut rebound = None;
        for _ in 0..100 {
            match UdpSocket::bind(front_addr).await {
                Ok(s) => {
                    rebound = Some(s);
                    break;
                }
                Err(_) => tokio::task::yield_now().await,
            }
        }
        assert!(
            rebound.is_some(),
            "{front_addr} still bound after the forwarder stopped"
        );
    }

    #[test]
    fn eviction_takes_the_flow_idle_longest() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut table = HashMap::new();
            for (port, last) in [(1u16, 300u64), (2, 100), (3, 200)] {
                let up = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
                table.insert(
                    SocketAddr::from(([127, 0, 0, 1], port)),
                    Arc::new(Flow {
                        up,
                        last: AtomicU64::new(last),
                        relay: Mutex::new(None),
                    }),
                );
            }
            assert_eq!(
                evict_oldest(&mut table),
                Some(SocketAddr::from(([127, 0, 0, 1], 2)))
            );
            assert_eq!(
                evict_oldest(&mut table),
                Some(SocketAddr::from(([127, 0, 0, 1], 3)))
            );
            assert_eq!(table.len(), 1);
        });
    }
}
