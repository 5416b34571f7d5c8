//! Pod networking with iproute2: a host bridge carrying the first address of the Pod CIDR (a /24, default
//! 10.244.0.0/24) and, per Pod, a network namespace `<bridge>-<n>` with a veth pair (`<bridge>h<n>` on the
//! bridge, `eth0` inside) and the address `<cidr>.<n>`.
//!
//! A Pod's `eth0` gets a MAC address derived from its IP ([`pod_mac`], `0a:58:` and the four address bytes,
//! as the CNI bridge plugin does), and so does the bridge from the node address (a bridge's own MAC otherwise
//! follows its ports as Pods come and go): Pod addresses are reused as soon as a Pod is gone, and with a random MAC
//! the neighbour (ARP) entries other Pods and the host still hold for the address would point at the old
//! Pod's MAC. Linux keeps such an entry REACHABLE for up to ~45 s, during which connections to the new Pod
//! time out (seen as the first TCPRoute connections hanging ~30 s after a test replaced its Pods).
//!
//! Every name is derived from the bridge name, so two agents with different bridges and CIDRs (two clusters)
//! can run on one host without touching each other's namespaces or links. Only addresses on the bridge this
//! module manages are used: packets to other 10.x addresses may leave the VM.
//! Layout of the /24: .1 is the bridge (node address), Pods get .2-.199, LoadBalancer addresses .200-.250.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

use tokio::process::Command;

use crate::{Error, Result};

/// Prefix length of the Pod network.
pub const PREFIX: u8 = 24;
const FIRST: u8 = 2;
const LAST: u8 = 199;
/// First and last host number of the LoadBalancer range.
pub const LB_FIRST: u8 = 200;
/// Last host number of the LoadBalancer range (inclusive).
pub const LB_LAST: u8 = 250;
/// Longest bridge name: derived link names (`<bridge>h<n>`, n <= 199) must fit IFNAMSIZ - 1 = 15 bytes.
pub const MAX_BRIDGE_NAME: usize = 11;

/// A /24 Pod network: `a.b.c.0/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodCidr {
    base: [u8; 3],
}

impl PodCidr {
    /// Parses `a.b.c.0/24` (only /24 networks are supported).
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| Error::PodCidr(format!("{s:?}: {why}"));
        let (addr, len) = s
            .split_once('/')
            .ok_or_else(|| bad("expected a.b.c.0/24"))?;
        if len != "24" {
            return Err(bad("only /24 networks are supported"));
        }
        let ip: Ipv4Addr = addr.parse().map_err(|_| bad("not an IPv4 address"))?;
        let o = ip.octets();
        if o[3] != 0 {
            return Err(bad("the host part must be 0"));
        }
        if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() {
            return Err(bad(
                "loopback, unspecified, multicast and broadcast ranges are not usable",
            ));
        }
        Ok(PodCidr {
            base: [o[0], o[1], o[2]],
        })
    }

    /// Address `<network>.<n>`.
    pub fn host(&self, n: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.base[0], self.base[1], self.base[2], n)
    }

    /// The bridge (node) address, `.1`.
    pub fn gateway(&self) -> Ipv4Addr {
        self.host(1)
    }

    /// Whether `ip` is inside this network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        ip.octets()[..3] == self.base
    }
}

impl Default for PodCidr {
    fn default() -> Self {
        PodCidr { base: [10, 244, 0] }
    }
}

impl std::fmt::Display for PodCidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{PREFIX}", self.host(0))
    }
}

/// Checks a bridge name: 1..=11 bytes of `[a-z0-9]`, so derived names are valid interface names.
pub fn check_bridge_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_BRIDGE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(Error::BridgeName(name.to_string()))
    }
}

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

/// The MAC address of the Pod with address `ip`: locally administered, unicast, `0a:58:` then the address.
pub fn pod_mac(ip: Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    format!("0a:58:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

/// One Pod's network.
#[derive(Debug, Clone)]
pub struct PodNet {
    /// Host number of the Pod in the /24 (.2-.199); also names its namespace and veth.
    pub index: u8,
    /// Name of the Pod's network namespace (`<bridge>-<index>`).
    pub netns: String,
    /// Host end of the Pod's veth pair, attached to the bridge.
    pub host_veth: String,
    /// The Pod's address (status.podIP).
    pub ip: Ipv4Addr,
}

/// The bridge and the Pod address allocator.
#[derive(Debug)]
pub struct Network {
    bridge: String,
    cidr: PodCidr,
    created_bridge: bool,
    free: Mutex<BTreeSet<u8>>,
}

/// The first interface other than `bridge` with an IPv4 address inside `cidr`, from `ip -o -4 addr show`
/// output (`<index>: <device> inet <addr>/<len> ...`).
fn other_user_of<'a>(ip_addr_output: &'a str, bridge: &str, cidr: PodCidr) -> Option<&'a str> {
    ip_addr_output.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let dev = words.nth(1)?;
        let addr = words
            .skip_while(|w| *w != "inet")
            .nth(1)?
            .split('/')
            .next()?
            .parse::<Ipv4Addr>()
            .ok()?;
        (dev != bridge && cidr.contains(addr)).then_some(dev)
    })
}

/// Namespace name of Pod index `n` on `bridge`.
pub fn netns_name(bridge: &str, n: u8) -> String {
    format!("{bridge}-{n}")
}

fn host_veth_name(bridge: &str, n: u8) -> String {
    format!("{bridge}h{n}")
}

fn peer_veth_name(bridge: &str, n: u8) -> String {
    format!("{bridge}p{n}")
}

impl Network {
    /// Creates the bridge (or reuses an existing one of that name, making sure it carries the gateway address
    /// and is up) and removes stale `<bridge>-<n>` namespaces and `<bridge>h<n>` links left by an earlier run
    /// of an agent on the same bridge. Namespaces of other bridges are left alone.
    pub async fn setup(bridge: &str, cidr: PodCidr) -> Result<Self> {
        check_bridge_name(bridge)?;
        // Another interface with an address in this network (another agent's bridge): sharing it would
        // break that cluster's routing, so refuse.
        let addrs = ip(&["-o", "-4", "addr", "show"]).await?;
        if let Some(dev) = other_user_of(&addrs, bridge, cidr) {
            return Err(Error::CidrInUse {
                cidr,
                device: dev.to_string(),
            });
        }
        let created_bridge = ip(&["link", "show", bridge]).await.is_err();
        if created_bridge {
            ip(&["link", "add", bridge, "type", "bridge"]).await?;
        }
        // A fixed MAC: a bridge without one takes the lowest MAC of its ports and changes it whenever Pods
        // (veths) come and go, leaving every Pod's neighbour entry for the node and load-balancer addresses
        // pointing at a MAC the bridge no longer has until it expires (up to ~45 s of lost replies, seen as
        // UDPRoute probes through the load balancer going unanswered for 10-40 s).
        ip(&["link", "set", bridge, "address", &pod_mac(cidr.gateway())]).await?;
        let gw = format!("{}/{PREFIX}", cidr.gateway());
        ip(&["addr", "replace", &gw, "dev", bridge]).await?;
        ip(&["link", "set", bridge, "up"]).await?;
        let listed = ip(&["netns", "list"]).await.unwrap_or_default();
        let prefix = format!("{bridge}-");
        for line in listed.lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if let Some(n) = name.strip_prefix(&prefix) {
                if let Ok(n) = n.parse::<u8>() {
                    tracing::info!(netns = name, "removing stale network namespace");
                    let _ = ip(&["netns", "del", name]).await;
                    let _ = ip(&["link", "del", &host_veth_name(bridge, n)]).await;
                }
            }
        }
        Ok(Network {
            bridge: bridge.to_string(),
            cidr,
            created_bridge,
            free: Mutex::new((FIRST..=LAST).collect()),
        })
    }

    /// The Pod network.
    pub fn cidr(&self) -> PodCidr {
        self.cidr
    }

    /// The bridge name.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// Creates the network of a new Pod.
    pub async fn create_pod_net(&self) -> Result<PodNet> {
        let index = {
            let mut free = self.free.lock().expect("allocator lock");
            let n = *free.iter().next().ok_or(Error::NoFreeIp(self.cidr))?;
            free.remove(&n);
            n
        };
        let net = PodNet {
            index,
            netns: netns_name(&self.bridge, index),
            host_veth: host_veth_name(&self.bridge, index),
            ip: self.cidr.host(index),
        };
        if let Err(e) = self.plumb(&net).await {
            self.remove_pod_net(&net).await;
            return Err(e);
        }
        Ok(net)
    }

    async fn plumb(&self, net: &PodNet) -> Result<()> {
        let peer = peer_veth_name(&self.bridge, net.index);
        let ns = net.netns.as_str();
        let _ = ip(&["netns", "del", ns]).await;
        let _ = ip(&["link", "del", &net.host_veth]).await;
        let _ = ip(&["link", "del", &peer]).await;
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
        ip(&["-n", ns, "link", "set", "eth0", "address", &pod_mac(net.ip)]).await?;
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
            &self.cidr.gateway().to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_slash_24() {
        let c = PodCidr::parse("10.246.0.0/24").unwrap();
        assert_eq!(c.gateway(), Ipv4Addr::new(10, 246, 0, 1));
        assert_eq!(c.host(200), Ipv4Addr::new(10, 246, 0, 200));
        assert_eq!(c.to_string(), "10.246.0.0/24");
        assert!(c.contains(Ipv4Addr::new(10, 246, 0, 77)));
        assert!(!c.contains(Ipv4Addr::new(10, 244, 0, 77)));
        assert_eq!(PodCidr::default().gateway(), Ipv4Addr::new(10, 244, 0, 1));
    }

    #[test]
    fn rejects_other_networks_with_the_reason() {
        for (s, why) in [
            ("10.246.0.0/16", "only /24"),
            ("10.246.0.5/24", "host part"),
            ("10.246.0.0", "expected a.b.c.0/24"),
            ("banana/24", "not an IPv4"),
            ("127.0.0.0/24", "loopback"),
        ] {
            let e = PodCidr::parse(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn finds_another_interface_in_the_network() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever
2: eth0    inet 10.0.2.15/24 brd 10.0.2.255 scope global eth0
7: sweetybr3    inet 10.247.0.1/24 scope global sweetybr3
7: sweetybr3    inet 10.247.0.200/32 scope global sweetybr3
9: sweetybr2    inet 10.246.0.1/24 scope global sweetybr2
";
        let c247 = PodCidr::parse("10.247.0.0/24").unwrap();
        assert_eq!(other_user_of(out, "sweetyit0", c247), Some("sweetybr3"));
        assert_eq!(other_user_of(out, "sweetybr3", c247), None);
        let c246 = PodCidr::parse("10.246.0.0/24").unwrap();
        assert_eq!(other_user_of(out, "sweetybr2", c246), None);
        let c250 = PodCidr::parse("10.250.0.0/24").unwrap();
        assert_eq!(other_user_of(out, "sweetyit0", c250), None);
    }

    #[test]
    fn pod_mac_follows_the_address() {
        assert_eq!(pod_mac(Ipv4Addr::new(10, 250, 0, 26)), "0a:58:0a:fa:00:1a");
        // Locally administered (bit 1) and unicast (bit 0 clear) in the first octet.
        assert_eq!(0x0a & 0b11, 0b10);
    }

    #[test]
    fn derives_names_from_the_bridge() {
        assert_eq!(netns_name("sweetybr2", 7), "sweetybr2-7");
        assert_eq!(host_veth_name("sweetybr2", 199), "sweetybr2h199");
        check_bridge_name("sweetybr2").unwrap();
        check_bridge_name("abcdefghijk").unwrap();
        assert!(check_bridge_name("abcdefghijkl").is_err());
        assert!(check_bridge_name("").is_err());
        assert!(check_bridge_name("br;rm").is_err());
        assert!(check_bridge_name("Br0").is_err());
        // The longest derived link name fits IFNAMSIZ - 1.
        assert!(peer_veth_name("abcdefghijk", 199).len() <= 15);
    }
}
