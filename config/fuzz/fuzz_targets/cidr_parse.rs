//! `Cidr::parse` / `Cidr::parse_masked` on arbitrary text (an allow/deny list entry from an
//! Ingress annotation, a `trusted_proxies` entry). Input: the entry, optionally followed by
//! `\0` and 16 bytes of a client address to test membership with.
//! Checks: no panic; whatever `parse` accepts `parse_masked` accepts as the same network;
//! whatever `parse_masked` accepts prints (`Display`) as a canonical network that `parse`
//! reads back as itself; a network contains its own address, and a client address is contained
//! exactly when its leading `prefix` bits equal the network's (IPv4-mapped IPv6 clients as
//! IPv4).

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use sweety_config::Cidr;

fn bits(ip: IpAddr) -> (u128, u32) {
    match ip {
        IpAddr::V4(v) => (u128::from(u32::from(v)), 32),
        IpAddr::V6(v) => (u128::from(v), 128),
    }
}

/// The reference model: the leading `prefix` of `width` bits agree.
fn same_prefix(a: u128, b: u128, prefix: u32, width: u32) -> bool {
    if prefix == 0 {
        return true;
    }
    let shift = width - prefix;
    (a >> shift) == (b >> shift)
}

fuzz_target!(|data: &[u8]| {
    let (text, client) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], data.get(i + 1..i + 17)),
        None => (data, None),
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let strict = Cidr::parse(text);
    let masked = Cidr::parse_masked(text);
    if let Ok(s) = &strict {
        assert_eq!(masked.as_ref().ok(), Some(s), "{text:?}");
    }
    let Ok(net) = masked else {
        return;
    };
    let shown = net.to_string();
    assert_eq!(
        Cidr::parse(&shown).as_ref(),
        Ok(&net),
        "{text:?} -> {shown:?}"
    );
    let (addr, prefix) = shown.split_once('/').expect("address/prefix");
    let addr: IpAddr = addr.parse().expect("address");
    let prefix: u32 = prefix.parse().expect("prefix");
    assert!(
        net.contains(addr),
        "{shown} does not contain its own address"
    );
    let Some(c) = client.filter(|c| c.len() == 16) else {
        return;
    };
    let raw = u128::from_be_bytes(c.try_into().unwrap());
    let candidates = [
        IpAddr::V6(Ipv6Addr::from(raw)),
        IpAddr::V4(Ipv4Addr::from(raw as u32)),
        IpAddr::V6(Ipv4Addr::from(raw as u32).to_ipv6_mapped()),
    ];
    let (nbits, width) = bits(addr);
    for ip in candidates {
        let ip_cmp = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let (cbits, cwidth) = bits(ip_cmp);
        let expect = cwidth == width && same_prefix(cbits, nbits, prefix, width);
        assert_eq!(net.contains(ip), expect, "{shown} contains {ip}?");
    }
});
