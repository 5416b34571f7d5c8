//! Pod networking with iproute2: a host bridge carrying 10.244.0.1/24 and, per Pod, a network namespace
//! `sweety-<n>` with a veth pair (`swh<n>` on the bridge, `eth0` inside) and the address 10.244.0.<n>.
//!
//! Only addresses on the bridge this module manages are used: packets to other 10.x addresses may leave the VM.
//! Pod indices 2..=199 are allocated (.1 is the gateway, .200-.254 are left for a future LoadBalancer range).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

use tokio::process::Command;

use crate::{Error, Result};

/// The bridge / node address.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// Prefix length of the Pod network.
pub const PREFIX: u8 = 24;
const FIRST: u8 = 2;
const LAST: u8 = 199;

/// Runs `ip ARGS`, returning stdout or an error carrying stderr.
pub async fn ip(args: &[&str]) -> Result<String> {
    run("ip", args).await
}

/// Runs a program (no shell) and returns its stdout, or an error with its stderr.
pub async fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(Error::io(format!("running {program}")))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One Pod's network.
#[derive(Debug, Clone)]
pub struct PodNet {
    pub index: u8,
    pub netns: String,
    pub host_veth: String,
    pub ip: Ipv4Addr,
}

/// The bridge and the Pod address allocator.
#[derive(Debug)]
pub struct Network {
    bridge: String,
    created_bridge: bool,
    free: Mutex<BTreeSet<u8>>,
}

impl Network {
    /// Creates the bridge (or reuses an existing one of that name, making sure it has 10.244.0.1/24 and is up)
    /// and removes stale `sweety-<n>` namespaces and `swh<n>` links left by an earlier run.
    pub async fn setup(bridge: &str) -> Result<Self> {
        let created_bridge = ip(&["link", "show", bridge]).await.is_err();
        if created_bridge {
            ip(&["link", "add", bridge, "type", "bridge"]).await?;
        }
        let cidr = format!("{GATEWAY}/{PREFIX}");
        ip(&["addr", "replace", &cidr, "dev", bridge]).await?;
        ip(&["link", "set", bridge, "up"]).await?;
        let listed = ip(&["netns", "list"]).await.unwrap_or_default();
        for line in listed.lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if let Some(n) = name.strip_prefix("sweety-") {
                if n.parse::<u8>().is_ok() {
                    tracing::info!(netns = name, "removing stale network namespace");
                    let _ = ip(&["netns", "del", name]).await;
                    let _ = ip(&["link", "del", &format!("swh{n}")]).await;
                }
            }
        }
        Ok(Network {
            bridge: bridge.to_string(),
            created_bridge,
            free: Mutex::new((FIRST..=LAST).collect()),
        })
    }

    /// Creates the network of a new Pod.
    pub async fn create_pod_net(&self) -> Result<PodNet> {
        let index = {
            let mut free = self.free.lock().expect("allocator lock");
            let n = *free.iter().next().ok_or(Error::NoFreeIp)?;
            free.remove(&n);
            n
        };
        let net = PodNet {
            index,
            netns: format!("sweety-{index}"),
            host_veth: format!("swh{index}"),
            ip: Ipv4Addr::new(10, 244, 0, index),
        };
        if let Err(e) = self.plumb(&net).await {
            self.remove_pod_net(&net).await;
            return Err(e);
        }
        Ok(net)
    }

    async fn plumb(&self, net: &PodNet) -> Result<()> {
        let peer = format!("swp{}", net.index);
        let ns = net.netns.as_str();
        let _ = ip(&["netns", "del", ns]).await;
        let _ = ip(&["link", "del", &net.host_veth]).await;
        ip(&["netns", "add", ns]).await?;
        ip(&[
            "link",
            "add",
            &net.host_veth,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
        ])
        .await?;
        ip(&["link", "set", &net.host_veth, "master", &self.bridge]).await?;
        ip(&["link", "set", &net.host_veth, "up"]).await?;
        ip(&["link", "set", &peer, "netns", ns]).await?;
        ip(&["-n", ns, "link", "set", &peer, "name", "eth0"]).await?;
        let addr = format!("{}/{PREFIX}", net.ip);
        ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"]).await?;
        ip(&["-n", ns, "link", "set", "eth0", "up"]).await?;
        ip(&["-n", ns, "link", "set", "lo", "up"]).await?;
        ip(&[
            "-n",
            ns,
            "route",
            "add",
            "default",
            "via",
            &GATEWAY.to_string(),
        ])
        .await?;
        Ok(())
    }

    /// Removes a Pod's namespace and veth and returns its address to the pool (errors are logged).
    pub async fn remove_pod_net(&self, net: &PodNet) {
        if let Err(e) = ip(&["netns", "del", &net.netns]).await {
            tracing::debug!(error = %e, "netns del");
        }
        let _ = ip(&["link", "del", &net.host_veth]).await;
        self.free.lock().expect("allocator lock").insert(net.index);
    }

    /// Deletes the bridge if this agent created it.
    pub async fn teardown(&self) {
        if self.created_bridge {
            if let Err(e) = ip(&["link", "del", &self.bridge]).await {
                tracing::warn!(error = %e, "deleting bridge");
            }
        }
    }
}
