//! Per-client-address caps (`limits.max_connections_per_client`,
//! `limits.max_requests_per_client`): one address cannot hold more than its share of the
//! connection and request slots, so slow-reading or zero-window clients from one address
//! cannot exhaust them for everyone else. 0 turns a cap off.
//!
//! Counts live in a fixed set of shards (address hash → shard), each a small map behind its
//! own lock held only to count; an address's entry goes when its count drops to zero, so the
//! maps hold only addresses with something open. Guards release on drop.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

const SHARDS: usize = 32;

/// Counters of what each client address holds.
#[derive(Debug)]
pub struct ClientCaps {
    shards: Vec<Mutex<HashMap<IpAddr, u32>>>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for ClientCaps {
    fn default() -> Self {
        ClientCaps {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }
}

/// The address already holds its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverCap;

/// One slot held by an address; released on drop.
#[derive(Debug)]
pub struct ClientSlot {
    caps: Arc<ClientCaps>,
    ip: IpAddr,
}

impl ClientCaps {
    fn shard(&self, ip: &IpAddr) -> &Mutex<HashMap<IpAddr, u32>> {
        &self.shards[(self.hasher.hash_one(ip) as usize) % SHARDS]
    }

    /// Takes a slot for `ip` unless it already holds `max` (0: no cap, nothing counted).
    pub fn try_take(self: &Arc<Self>, ip: IpAddr, max: u32) -> Result<Option<ClientSlot>, OverCap> {
        if max == 0 {
            return Ok(None);
        }
        let ip = ip.to_canonical();
        let mut m = self.shard(&ip).lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= max {
            if *n == 0 {
                m.remove(&ip);
            }
            return Err(OverCap);
        }
        *n += 1;
        Ok(Some(ClientSlot {
            caps: self.clone(),
            ip,
        }))
    }

    /// Slots `ip` holds now.
    pub fn held(&self, ip: IpAddr) -> u32 {
        let ip = ip.to_canonical();
        let m = self.shard(&ip).lock().unwrap_or_else(|e| e.into_inner());
        m.get(&ip).copied().unwrap_or(0)
    }

    /// Addresses holding anything (for tests and metrics).
    pub fn addresses(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut m = self
            .caps
            .shard(&self.ip)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_count_per_address_and_release_on_drop() {
        let caps = Arc::new(ClientCaps::default());
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let a6: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let s1 = caps.try_take(a, 2).unwrap();
        let s2 = caps.try_take(a6, 2).unwrap();
        assert!(
            caps.try_take(a, 2).is_err(),
            "the mapped form is the same client"
        );
        let sb = caps.try_take(b, 2).unwrap();
        assert_eq!((caps.held(a), caps.held(b)), (2, 1));
        drop(s1);
        let s3 = caps.try_take(a, 2).unwrap();
        drop((s2, s3, sb));
        assert_eq!(caps.addresses(), 0, "entries go at zero");
        assert!(caps.try_take(a, 0).unwrap().is_none(), "0 is no cap");
        assert_eq!(caps.addresses(), 0);
    }
}
