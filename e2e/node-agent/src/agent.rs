//! The Pod loop: watches Pods bound to this node (field selector `spec.nodeName`), starts new ones (network,
//! volumes, containers, probes, status writer), and on deletion kills the processes, removes the network and
//! deletes the Pod with grace period 0, as the kubelet does once its containers are gone.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::container::{self, Spec};
use crate::imagemap::{resolve_command, ImageMap};
use crate::net::{Network, PodNet};
use crate::status::{CState, PodState};
use crate::{Error, Result};

/// Agent settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The Node object this agent registers and whose Pods it runs.
    pub node_name: String,
    /// Which host binary runs the containers of which image.
    pub images: ImageMap,
    /// Per-Pod directories (volumes) live under `<root>/pods`, container logs under `<root>/logs`.
    pub root_dir: PathBuf,
    /// The agent binary, re-executed as the `exec-container` helper.
    pub agent_exe: PathBuf,
    /// Variables every container gets first (e.g. where the apiserver is, [`crate::env::apiserver_env`]).
    pub base_env: Vec<(String, String)>,
}

struct Running {
    net: Option<PodNet>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    dir: PathBuf,
}

enum Entry {
    Starting,
    Running(Box<Running>),
    Stopping,
}

/// The node agent.
pub struct Agent {
    client: Client,
    cfg: Config,
    net: Network,
    pods: Mutex<HashMap<String, Entry>>,
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

impl Agent {
    /// Sets up the bridge; does not register the Node (see [`crate::node::register`]).
    pub async fn new(
        client: Client,
        cfg: Config,
        bridge: &str,
        cidr: crate::net::PodCidr,
    ) -> Result<Arc<Self>> {
        let net = Network::setup(bridge, cidr).await?;
        Ok(Arc::new(Agent {
            client,
            cfg,
            net,
            pods: Mutex::new(HashMap::new()),
        }))
    }

    /// Watches this node's Pods until the stream ends (it normally does not).
    pub async fn run(self: &Arc<Self>) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let wc =
            watcher::Config::default().fields(&format!("spec.nodeName={}", self.cfg.node_name));
        let mut stream = watcher::watcher(api, wc).boxed();
        let mut seen: HashSet<String> = HashSet::new();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Init) => seen.clear(),
                Ok(watcher::Event::InitApply(pod)) => {
                    if let Some(uid) = pod.metadata.uid.clone() {
                        seen.insert(uid);
                    }
                    self.on_pod(pod);
                }
                Ok(watcher::Event::InitDone) => {
                    let gone: Vec<String> = {
                        let pods = self.pods.lock().expect("pods lock");
                        pods.keys()
                            .filter(|u| !seen.contains(*u))
                            .cloned()
                            .collect()
                    };
                    for uid in gone {
                        let me = self.clone();
                        tokio::spawn(async move { me.stop(&uid, None).await });
                    }
                }
                Ok(watcher::Event::Apply(pod)) => self.on_pod(pod),
                Ok(watcher::Event::Delete(pod)) => {
                    if let Some(uid) = pod.metadata.uid.clone() {
                        let me = self.clone();
                        tokio::spawn(async move { me.stop(&uid, None).await });
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pod watch error");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn on_pod(self: &Arc<Self>, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let mut pods = self.pods.lock().expect("pods lock");
        if pod.metadata.deletion_timestamp.is_some() {
            if !matches!(pods.get(&uid), Some(Entry::Stopping)) {
                let me = self.clone();
                tokio::spawn(async move { me.stop(&uid, Some(pod)).await });
            }
            return;
        }
        if pods.contains_key(&uid) {
            return;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded") | Some("Failed")) {
            return;
        }
        pods.insert(uid.clone(), Entry::Starting);
        drop(pods);
        let me = self.clone();
        tokio::spawn(async move {
            let name = key(&pod);
            match me.start(&pod).await {
                Ok(r) => {
                    let mut pods = me.pods.lock().expect("pods lock");
                    match pods.get(&uid) {
                        Some(Entry::Starting) => {
                            pods.insert(uid, Entry::Running(Box::new(r)));
                        }
                        _ => {
                            // Deleted while starting: stop() saw Starting and left it to us.
                            drop(pods);
                            let me2 = me.clone();
                            tokio::spawn(async move { me2.teardown(r).await });
                        }
                    }
                }
                Err(e) => tracing::error!(pod = %name, error = %e, "starting pod failed"),
            }
        });
    }

    async fn start(self: &Arc<Self>, pod: &Pod) -> Result<Running> {
        let name = key(pod);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let dir = self.cfg.root_dir.join("pods").join(&uid);
        let log_dir =
            self.cfg
                .root_dir
                .join("logs")
                .join(format!("{}_{}", name.replace('/', "_"), uid));
        for d in [&dir, &log_dir] {
            std::fs::create_dir_all(d).map_err(Error::io(format!("creating {}", d.display())))?;
        }
        let state = Arc::new(Mutex::new(PodState::new(
            &spec
                .containers
                .iter()
                .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
                .collect::<Vec<_>>(),
            self.net.cidr().gateway(),
        )));
        let changed = Arc::new(Notify::new());
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut running = Running {
            net: None,
            stop: stop_tx,
            tasks: Vec::new(),
            dir: dir.clone(),
        };
        // The status writer runs from the start so waiting reasons become visible.
        running.tasks.push(tokio::spawn(status_writer(
            self.client.clone(),
            pod.clone(),
            state.clone(),
            changed.clone(),
            stop_rx.clone(),
        )));
        let net = self.net.create_pod_net().await?;
        let ip = net.ip;
        running.net = Some(net.clone());
        state.lock().expect("pod state lock").ip = Some(ip);
        changed.notify_one();
        tracing::info!(pod = %name, %ip, netns = %net.netns, "pod network ready");

        // Volumes: referenced objects may appear a little later (e.g. kube-root-ca.crt), so retry (bounded).
        let (ip_s, host_s) = (ip.to_string(), self.net.cidr().gateway().to_string());
        let mut volumes = None;
        let mut last_err = None;
        for _ in 0..30 {
            match crate::volumes::materialise(&self.client, pod, &dir, (&ip_s, &host_s)).await {
                Ok(v) => {
                    volumes = Some(v);
                    break;
                }
                Err(e) => {
                    last_err = Some(e);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            // Deleted while starting: stop retrying (on_pod's task tears down what exists).
            if !matches!(
                self.pods.lock().expect("pods lock").get(&uid),
                Some(Entry::Starting)
            ) {
                break;
            }
        }
        let Some(volumes) = volumes else {
            let msg = last_err.map(|e| e.to_string()).unwrap_or_default();
            tracing::error!(pod = %name, error = %msg, "volumes");
            set_waiting_all(&state, "CreateContainerConfigError", &msg);
            changed.notify_one();
            return Ok(running);
        };

        let restart_policy = spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into());
        let grace = Duration::from_secs(
            spec.termination_grace_period_seconds
                .unwrap_or(30)
                .clamp(1, 10) as u64,
        );
        for c in &spec.containers {
            let fail = |reason: &str, msg: String| {
                tracing::warn!(pod = %name, container = %c.name, reason, message = %msg, "container not started");
                if let Some(rec) = state.lock().expect("pod state lock").container_mut(&c.name) {
                    rec.state = CState::Waiting {
                        reason: reason.into(),
                        message: msg,
                    };
                }
                changed.notify_one();
            };
            let env =
                match crate::env::build(&self.client, pod, c, &self.cfg.base_env, (&ip_s, &host_s))
                    .await
                {
                    Ok(e) => e,
                    Err(e) => {
                        fail("CreateContainerConfigError", e.to_string());
                        continue;
                    }
                };
            let expand = |v: &Option<Vec<String>>| -> Vec<String> {
                v.iter()
                    .flatten()
                    .map(|s| crate::env::expand(s, &env))
                    .collect()
            };
            let image = c.image.clone().unwrap_or_default();
            let Some((program, args)) = resolve_command(
                &self.cfg.images,
                &image,
                &c.name,
                &expand(&c.command),
                &expand(&c.args),
            ) else {
                fail(
                    "ErrImageNeverPull",
                    format!("image {image:?} is not mapped to a local binary (--image-map)"),
                );
                continue;
            };
            let mut binds = Vec::new();
            let mut bad_mount = None;
            for m in c.volume_mounts.iter().flatten() {
                let Some(src) = volumes.get(&m.name) else {
                    bad_mount = Some(format!("volume {} not found", m.name));
                    break;
                };
                let src = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                    Some(sp) => src.join(sp),
                    None => src.clone(),
                };
                let dst = PathBuf::from(&m.mount_path);
                if let Err(e) = ensure_mount_point(&src, &dst) {
                    bad_mount = Some(e.to_string());
                    break;
                }
                binds.push((src, dst));
            }
            if let Some(msg) = bad_mount {
                fail("CreateContainerConfigError", msg);
                continue;
            }
            let (kill_tx, kill_rx) = watch::channel(None);
            if c.startup_probe.is_some() || c.liveness_probe.is_some() {
                running
                    .tasks
                    .push(tokio::spawn(container::startup_and_liveness(
                        c.name.clone(),
                        c.startup_probe.clone(),
                        c.liveness_probe.clone(),
                        c.readiness_probe.is_some(),
                        ip,
                        c.ports.clone().unwrap_or_default(),
                        state.clone(),
                        changed.clone(),
                        kill_tx,
                        stop_rx.clone(),
                    )));
            }
            let cspec = Spec {
                name: c.name.clone(),
                netns: net.netns.clone(),
                agent_exe: self.cfg.agent_exe.clone(),
                program,
                args,
                env,
                binds,
                workdir: c.working_dir.clone(),
                log_file: log_dir.join(format!("{}.log", c.name)),
                restart_policy: restart_policy.clone(),
                grace,
                has_readiness_probe: c.readiness_probe.is_some(),
                has_startup_probe: c.startup_probe.is_some(),
                kill: kill_rx,
            };
            running.tasks.push(tokio::spawn(container::supervise(
                cspec,
                state.clone(),
                changed.clone(),
                stop_rx.clone(),
            )));
            if let Some(p) = c.readiness_probe.clone() {
                running.tasks.push(tokio::spawn(container::readiness(
                    c.name.clone(),
                    p,
                    ip,
                    c.ports.clone().unwrap_or_default(),
                    state.clone(),
                    changed.clone(),
                    stop_rx.clone(),
                )));
            }
        }
        Ok(running)
    }

    /// Stops a Pod (if running here) and, when `pod` is given (it has a deletionTimestamp), deletes it with
    /// grace period 0.
    async fn stop(self: &Arc<Self>, uid: &str, pod: Option<Pod>) {
        let entry = {
            let mut pods = self.pods.lock().expect("pods lock");
            pods.insert(uid.to_string(), Entry::Stopping)
        };
        match entry {
            Some(Entry::Running(r)) => self.teardown(*r).await,
            Some(Entry::Starting) => {
                // start() finishes and tears down itself; give it a bounded moment before deleting.
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Some(Entry::Stopping) | None => {}
        }
        if let Some(pod) = pod {
            let api: Api<Pod> = Api::namespaced(
                self.client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or(""),
            );
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.to_string()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            if let Some(name) = pod.metadata.name.as_deref() {
                if pod
                    .metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
                {
                    tracing::info!(pod = %key(&pod), "pod has finalizers; leaving them to their owners");
                }
                match api.delete(name, &dp).await {
                    Ok(_) => tracing::info!(pod = %key(&pod), "pod deleted"),
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => tracing::warn!(pod = %key(&pod), error = %e, "deleting pod"),
                }
            }
        }
        self.pods.lock().expect("pods lock").remove(uid);
    }

    async fn teardown(&self, r: Running) {
        let _ = r.stop.send(true);
        for t in r.tasks {
            if tokio::time::timeout(Duration::from_secs(15), t)
                .await
                .is_err()
            {
                tracing::warn!("container task did not stop in time");
            }
        }
        if let Some(net) = &r.net {
            self.net.remove_pod_net(net).await;
        }
        let _ = std::fs::remove_dir_all(&r.dir);
    }

    /// Stops every Pod (without deleting them, all at once) and removes the bridge if the agent created it.
    pub async fn shutdown(self: &Arc<Self>) {
        let all: Vec<(String, Entry)> = self.pods.lock().expect("pods lock").drain().collect();
        // In parallel: each Pod may take its (clamped) grace period.
        let stops = all.into_iter().filter_map(|(_, e)| match e {
            Entry::Running(r) => Some(self.teardown(*r)),
            _ => None,
        });
        futures_util::future::join_all(stops).await;
        self.net.teardown().await;
    }
}

fn set_waiting_all(state: &Mutex<PodState>, reason: &str, msg: &str) {
    for c in state.lock().expect("pod state lock").containers.iter_mut() {
        c.state = CState::Waiting {
            reason: reason.into(),
            message: msg.into(),
        };
    }
}

/// Makes sure the mount point `dst` exists on the host (a directory, or an empty file when `src` is a file).
/// Created mount points are never removed: removing a directory that is a mount point in another mount
/// namespace detaches that mount there (Linux >= 3.18), which would pull the volume from under a running
/// Pod, possibly one of another agent on this host. They stay empty on the host (the mounts are private).
fn ensure_mount_point(src: &Path, dst: &Path) -> Result<()> {
    if dst.exists() {
        return Ok(());
    }
    if src.is_dir() {
        std::fs::create_dir_all(dst)
            .map_err(Error::io(format!("creating mount point {}", dst.display())))?;
    } else {
        if let Some(p) = dst.parent() {
            std::fs::create_dir_all(p).map_err(Error::io(format!("creating {}", p.display())))?;
        }
        std::fs::write(dst, b"")
            .map_err(Error::io(format!("creating mount point {}", dst.display())))?;
    }
    Ok(())
}

async fn status_writer(
    client: Client,
    pod: Pod,
    state: Arc<Mutex<PodState>>,
    changed: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Pod> = Api::namespaced(client, pod.metadata.namespace.as_deref().unwrap_or(""));
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut last = serde_json::Value::Null;
    loop {
        let status = state.lock().expect("pod state lock").render();
        let body = serde_json::json!({ "status": status });
        if body != last {
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => last = body,
                Err(e) => tracing::warn!(pod = %name, error = %e, "writing pod status"),
            }
        }
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = crate::stopped(&mut stop) => return,
        }
    }
}
