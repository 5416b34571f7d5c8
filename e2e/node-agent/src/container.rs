//! Running one container as a local process: the `exec-container` helper (bind mounts inside the Pod's mount
//! namespace, then exec), the supervisor (spawn inside the netns, restart per restartPolicy with backoff,
//! kill the process group on stop or when the liveness prober asks) and the probers (HTTP GET / TCP socket
//! against the Pod IP): readiness sets `ready`; startup sets `started` (readiness and liveness wait for it);
//! liveness and a failed startup kill the container, which is then restarted per its restartPolicy.
//!
//! Process chain: `ip netns exec <netns> <agent exe> exec-container --bind SRC DST ... --workdir D -- PROGRAM
//! ARGS`. `ip netns exec` already gives the process its own mount namespace (with `/` made a slave), so the
//! bind mounts the helper makes are visible only to the container and are dropped when it exits.

use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerPort, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{watch, Notify};

use crate::status::{CState, PodState, Terminated};
use crate::{Error, Result};

/// The `exec-container` helper: bind-mounts each (src, dst), changes directory and execs the program.
/// Only returns on failure.
///
/// Every source is opened before the first mount and mounted through `/proc/<pid>/fd/<n>`, so a mount over a
/// directory that contains later sources (e.g. an emptyDir at `/tmp` or `/root` while the agent's volume
/// directories live below it) cannot hide them. A destination missing in the container's view (inside an
/// earlier mount) is created there.
pub fn exec_container(
    binds: &[(String, String)],
    workdir: Option<&str>,
    program: &str,
    args: &[String],
) -> Error {
    use std::os::fd::AsRawFd;
    let mut held = Vec::with_capacity(binds.len());
    for (src, _) in binds {
        match std::fs::File::open(src) {
            Ok(f) => held.push(f),
            Err(e) => return Error::io(format!("opening volume source {src}"))(e),
        }
    }
    let pid = std::process::id();
    for ((src, dst), f) in binds.iter().zip(&held) {
        let dst_path = std::path::Path::new(dst);
        if !dst_path.exists() {
            let made = if f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
                std::fs::create_dir_all(dst_path)
            } else {
                dst_path
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|_| std::fs::write(dst_path, b""))
            };
            if let Err(e) = made {
                return Error::io(format!("creating mount point {dst}"))(e);
            }
        }
        let via = format!("/proc/{pid}/fd/{}", f.as_raw_fd());
        let status = std::process::Command::new("mount")
            .args(["--bind", &via, dst])
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => {
                return Error::Command {
                    command: format!("mount --bind {src} {dst}"),
                    stderr: format!("exit status {s}"),
                }
            }
            Err(e) => return Error::io("running mount")(e),
        }
    }
    drop(held);
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    if let Some(dir) = workdir {
        cmd.current_dir(dir);
    }
    Error::io(format!("exec {program}"))(cmd.exec())
}

/// Everything needed to run (and re-run) one container.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Container name in the Pod spec (also the name in logs and statuses).
    pub name: String,
    /// Network namespace of the Pod, entered with `ip netns exec`.
    pub netns: String,
    /// The agent binary, re-executed as the `exec-container` helper inside the namespace.
    pub agent_exe: PathBuf,
    /// Host binary that stands for the container's image.
    pub program: PathBuf,
    /// Arguments after the program (the container's command and args).
    pub args: Vec<String>,
    /// Environment of the process, in Pod spec order.
    pub env: Vec<(String, String)>,
    /// (host source, container path) bind mounts: the Pod's volumes.
    pub binds: Vec<(PathBuf, PathBuf)>,
    /// Working directory inside the container, if the spec sets one.
    pub workdir: Option<String>,
    /// File the container's stdout and stderr are written to (CRI log format).
    pub log_file: PathBuf,
    /// "Always", "OnFailure" or "Never".
    pub restart_policy: String,
    /// How long after SIGTERM the process group gets SIGKILL.
    pub grace: Duration,
    /// True when the container has a readinessProbe (readiness is then set by the prober).
    pub has_readiness_probe: bool,
    /// True when the container has a startupProbe (`started` is then set by the prober).
    pub has_startup_probe: bool,
    /// The probers' kill requests: `Some(n)` kills the instance whose restartCount is n.
    pub kill: watch::Receiver<Option<i32>>,
}

fn spawn(spec: &Spec) -> Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new("ip");
    cmd.arg("netns")
        .arg("exec")
        .arg(&spec.netns)
        .arg(&spec.agent_exe)
        .arg("exec-container");
    for (src, dst) in &spec.binds {
        cmd.arg("--bind").arg(src).arg(dst);
    }
    if let Some(w) = &spec.workdir {
        cmd.arg("--workdir").arg(w);
    }
    cmd.arg("--").arg(&spec.program).args(&spec.args);
    cmd.env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(Error::io(format!("spawning container {}", spec.name)))?;
    // The log writer ends when every process holding the pipes has exited.
    if let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) {
        tokio::spawn(crate::logs::write(out, err, spec.log_file.clone()));
    }
    Ok(child)
}

fn signal_group(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args(["-s", signal, "--", &format!("-{pid}")])
        .stderr(std::process::Stdio::null())
        .status();
}

/// Runs the container until `stop` turns true, restarting it per the restart policy with exponential
/// backoff (1 s doubling to 30 s, reset after 60 s of uptime). Updates `state` and pings `changed`.
pub async fn supervise(
    spec: Spec,
    state: Arc<Mutex<PodState>>,
    changed: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_secs(1);
    let update = |f: &dyn Fn(&mut crate::status::ContainerRecord)| {
        if let Some(c) = state
            .lock()
            .expect("pod state lock")
            .container_mut(&spec.name)
        {
            f(c);
        }
        changed.notify_one();
    };
    loop {
        if *stop.borrow() {
            return;
        }
        let started = Instant::now();
        let started_at = crate::now();
        let instance = state
            .lock()
            .expect("pod state lock")
            .container_mut(&spec.name)
            .map(|c| c.restart_count)
            .unwrap_or(0);
        let mut kill = spec.kill.clone();
        let exit_code = match spawn(&spec) {
            Ok(mut child) => {
                let pid = child.id();
                let sa = started_at.clone();
                let probe = spec.has_readiness_probe;
                let startup = spec.has_startup_probe;
                update(&|c| {
                    c.state = CState::Running {
                        started_at: sa.clone(),
                    };
                    c.started = !startup;
                    c.ready = !probe && !startup;
                });
                tracing::info!(container = %spec.name, netns = %spec.netns, ?pid, "container started");
                tokio::select! {
                    res = child.wait() => {
                        // Reap whatever the main process left behind in its process group.
                        if let Some(pid) = pid {
                            signal_group(pid, "KILL");
                        }
                        exit_code(res)
                    }
                    _ = async {
                        // No prober (sender gone): never.
                        if kill.wait_for(|k| *k == Some(instance)).await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    } => {
                        tracing::info!(container = %spec.name, "killing container (probe failed)");
                        if let Some(pid) = pid {
                            signal_group(pid, "KILL");
                        }
                        exit_code(child.wait().await)
                    }
                    _ = crate::stopped(&mut stop) => {
                        if let Some(pid) = pid {
                            signal_group(pid, "TERM");
                            if tokio::time::timeout(spec.grace, child.wait()).await.is_err() {
                                signal_group(pid, "KILL");
                                let _ = child.wait().await;
                            }
                            // Anything left in the group after the main process exited.
                            signal_group(pid, "KILL");
                        }
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(container = %spec.name, error = %e, "container failed to start");
                -1
            }
        };
        let restart = match spec.restart_policy.as_str() {
            "Never" => false,
            "OnFailure" => exit_code != 0,
            _ => true,
        };
        let term = Terminated {
            exit_code,
            reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
            started_at: Some(started_at),
            finished_at: crate::now(),
        };
        tracing::info!(container = %spec.name, exit_code, restart, "container exited");
        if !restart {
            update(&|c| {
                c.state = CState::Terminated(term.clone());
                c.ready = false;
                c.will_restart = false;
            });
            return;
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_secs(1);
        }
        let msg = format!(
            "back-off {}s restarting failed container",
            backoff.as_secs()
        );
        update(&|c| {
            c.last = Some(term.clone());
            c.restart_count += 1;
            c.ready = false;
            c.state = CState::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: msg.clone(),
            };
        });
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = crate::stopped(&mut stop) => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

fn exit_code(res: std::io::Result<std::process::ExitStatus>) -> i32 {
    res.ok()
        .and_then(|s| {
            s.code()
                .or_else(|| std::os::unix::process::ExitStatusExt::signal(&s).map(|n| 128 + n))
        })
        .unwrap_or(-1)
}

/// Resolves a probe port (number or named container port).
fn probe_port(port: &IntOrString, ports: &[ContainerPort]) -> Option<u16> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).ok(),
        IntOrString::String(name) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// One probe attempt: Ok(true) on success.
pub async fn probe_once(probe: &Probe, ip: Ipv4Addr, ports: &[ContainerPort]) -> bool {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let attempt = async {
        if let Some(h) = &probe.http_get {
            let port = probe_port(&h.port, ports)?;
            let mut s = tokio::net::TcpStream::connect((ip, port)).await.ok()?;
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            let mut req = format!(
                "GET {path} HTTP/1.0\r\nHost: {ip}:{port}\r\nUser-Agent: kube-probe/sweety\r\n"
            );
            for hd in h.http_headers.iter().flatten() {
                if !hd.name.contains(['\r', '\n']) && !hd.value.contains(['\r', '\n']) {
                    req.push_str(&format!("{}: {}\r\n", hd.name, hd.value));
                }
            }
            req.push_str("\r\n");
            s.write_all(req.as_bytes()).await.ok()?;
            let mut buf = [0u8; 64];
            let mut n = 0;
            while n < 12 {
                let m = s.read(&mut buf[n..]).await.ok()?;
                if m == 0 {
                    break;
                }
                n += m;
            }
            let line = String::from_utf8_lossy(&buf[..n]).to_string();
            let code: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some((200..400).contains(&code))
        } else if let Some(t) = &probe.tcp_socket {
            let port = probe_port(&t.port, ports)?;
            Some(tokio::net::TcpStream::connect((ip, port)).await.is_ok())
        } else {
            // exec / grpc probes are not supported: treat as passing.
            Some(true)
        }
    };
    matches!(tokio::time::timeout(timeout, attempt).await, Ok(Some(true)))
}

/// Runs a readinessProbe until `stop`, setting the container's `ready` (only while it is running and
/// started, i.e. past its startupProbe).
pub async fn readiness(
    name: String,
    probe: Probe,
    ip: Ipv4Addr,
    ports: Vec<ContainerPort>,
    state: Arc<Mutex<PodState>>,
    changed: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let period = Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64);
    let success_needed = probe.success_threshold.unwrap_or(1).max(1);
    let failure_needed = probe.failure_threshold.unwrap_or(3).max(1);
    let (mut ok_run, mut fail_run) = (0, 0);
    let delay = Duration::from_secs(probe.initial_delay_seconds.unwrap_or(0).max(0) as u64);
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = crate::stopped(&mut stop) => return,
    }
    loop {
        let running = state
            .lock()
            .expect("pod state lock")
            .containers
            .iter()
            .any(|c| c.name == name && c.started && matches!(c.state, CState::Running { .. }));
        if running {
            let ok = probe_once(&probe, ip, &ports).await;
            if ok {
                ok_run += 1;
                fail_run = 0;
            } else {
                fail_run += 1;
                ok_run = 0;
            }
            let mut st = state.lock().expect("pod state lock");
            if let Some(c) = st.container_mut(&name) {
                let was = c.ready;
                if ok && ok_run >= success_needed && matches!(c.state, CState::Running { .. }) {
                    c.ready = true;
                } else if !ok && (fail_run >= failure_needed || !c.ready) {
                    c.ready = false;
                }
                if was != c.ready {
                    changed.notify_one();
                }
            }
        } else {
            ok_run = 0;
            fail_run = 0;
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = crate::stopped(&mut stop) => return,
        }
    }
}

/// Probe settings with the Kubernetes defaults.
struct Timing {
    delay: Duration,
    period: Duration,
    failures: i32,
}

impl Timing {
    fn of(p: &Probe) -> Self {
        Timing {
            delay: Duration::from_secs(p.initial_delay_seconds.unwrap_or(0).max(0) as u64),
            period: Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64),
            failures: p.failure_threshold.unwrap_or(3).max(1),
        }
    }
}

/// Runs the startupProbe and livenessProbe of one container until `stop`. For each instance of the
/// container (a new restartCount): the startupProbe runs first (after its initialDelay, every period);
/// success sets `started` (and `ready` when there is no readinessProbe), `failureThreshold` failures in a
/// row kill the instance. Then the livenessProbe
/// runs the same way; its failures kill the instance too. Kills go through `kill` to the supervisor, which
/// restarts per restartPolicy.
#[allow(clippy::too_many_arguments)]
pub async fn startup_and_liveness(
    name: String,
    startup: Option<Probe>,
    liveness: Option<Probe>,
    has_readiness_probe: bool,
    ip: Ipv4Addr,
    ports: Vec<ContainerPort>,
    state: Arc<Mutex<PodState>>,
    changed: Arc<Notify>,
    kill: watch::Sender<Option<i32>>,
    mut stop: watch::Receiver<bool>,
) {
    // (instance, when it was first seen running, failures in a row, killed)
    let mut current: Option<(i32, Instant, i32, bool)> = None;
    loop {
        let snapshot = state
            .lock()
            .expect("pod state lock")
            .containers
            .iter()
            .find(|c| c.name == name)
            .map(|c| {
                (
                    matches!(c.state, CState::Running { .. }),
                    c.started,
                    c.restart_count,
                )
            });
        let mut wait = Duration::from_millis(500);
        if let Some((true, started, instance)) = snapshot {
            if current.map(|c| c.0) != Some(instance) {
                current = Some((instance, Instant::now(), 0, false));
            }
            let (_, since, fails, killed) = current.as_mut().expect("set above");
            let probe = if started {
                liveness.as_ref()
            } else {
                startup.as_ref()
            };
            if let (Some(p), false) = (probe, *killed) {
                let t = Timing::of(p);
                if since.elapsed() >= t.delay {
                    let ok = probe_once(p, ip, &ports).await;
                    let kind = if started { "liveness" } else { "startup" };
                    if ok {
                        *fails = 0;
                        if !started {
                            if let Some(c) =
                                state.lock().expect("pod state lock").container_mut(&name)
                            {
                                if c.restart_count == instance {
                                    c.started = true;
                                    // Without a readinessProbe, started means ready.
                                    if !has_readiness_probe {
                                        c.ready = true;
                                    }
                                }
                            }
                            changed.notify_one();
                            // Liveness starts counting its initialDelay now.
                            *since = Instant::now();
                        }
                    } else {
                        *fails += 1;
                        tracing::info!(container = %name, kind, failures = *fails, "probe failed");
                        if *fails >= t.failures {
                            tracing::warn!(container = %name, kind, "probe failed {} times: killing the container", *fails);
                            *killed = true;
                            let _ = kill.send(Some(instance));
                        }
                    }
                    wait = if ok && !started {
                        Duration::from_millis(100)
                    } else {
                        t.period
                    };
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = crate::stopped(&mut stop) => return,
        }
    }
}
