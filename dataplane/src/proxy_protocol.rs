//! The PROXY protocol (HAProxy's v1 text and v2 binary headers): parsing the header a load
//! balancer in front of Sweety sends before a connection's data, and encoding the v2 header
//! Sweety sends to layer-4 backends that want the client address.
//!
//! Reading is bounded: a v1 header is at most 107 bytes, a v2 header at most
//! [`MAX_V2_PAYLOAD`] bytes after its 16-byte preamble, and the caller applies a timeout. The
//! reader never consumes a byte past the header, so the stream is handed on untouched.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The v2 signature.
pub const V2_SIG: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Longest v1 header including `\r\n` (from the specification).
pub const V1_MAX: usize = 107;
/// Largest v2 payload (addresses and TLVs) accepted, bytes.
pub const MAX_V2_PAYLOAD: usize = 2048;

/// Why a PROXY header was refused.
#[derive(Debug, thiserror::Error)]
pub enum PpError {
    /// The connection does not start with a PROXY header.
    #[error("no PROXY protocol header")]
    Missing,
    /// The header is malformed.
    #[error("malformed PROXY protocol header: {0}")]
    Malformed(&'static str),
    /// The v2 payload is larger than [`MAX_V2_PAYLOAD`].
    #[error("PROXY protocol v2 header too large ({0} bytes)")]
    TooLarge(usize),
    /// Reading failed.
    #[error("reading the PROXY protocol header: {0}")]
    Io(#[source] std::io::Error),
}

/// What a header says: the original source and destination, or nothing (v1 `UNKNOWN`, v2
/// `LOCAL` or an unspecified family), in which case the connection's own addresses stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    /// Original client address.
    pub source: SocketAddr,
    /// Original destination address.
    pub destination: SocketAddr,
}

/// Parses a complete v1 line (with its `\r\n`).
pub fn parse_v1(line: &[u8]) -> Result<Option<Addresses>, PpError> {
    let bad = PpError::Malformed;
    if line.len() > V1_MAX {
        return Err(bad("v1 header longer than 107 bytes"));
    }
    let text = line
        .strip_suffix(b"\r\n")
        .ok_or(bad("v1 header does not end in CRLF"))?;
    let text = std::str::from_utf8(text).map_err(|_| bad("v1 header is not ASCII"))?;
    let mut parts = text.split(' ');
    if parts.next() != Some("PROXY") {
        return Err(PpError::Missing);
    }
    let family = parts.next().ok_or(bad("v1 header without protocol"))?;
    if family == "UNKNOWN" {
        return Ok(None);
    }
    let v6 = match family {
        "TCP4" => false,
        "TCP6" => true,
        _ => return Err(bad("v1 protocol is not TCP4, TCP6 or UNKNOWN")),
    };
    let mut field = || parts.next().ok_or(bad("v1 header has too few fields"));
    let (sa, da, sp, dp) = (field()?, field()?, field()?, field()?);
    if parts.next().is_some() {
        return Err(bad("v1 header has too many fields"));
    }
    let ip = |s: &str| -> Result<IpAddr, PpError> {
        let ip: IpAddr = s.parse().map_err(|_| bad("v1 address is not an IP"))?;
        if ip.is_ipv6() != v6 {
            return Err(bad("v1 address does not match the protocol"));
        }
        Ok(ip)
    };
    let port = |s: &str| -> Result<u16, PpError> {
        if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("v1 port is not a number"));
        }
        s.parse().map_err(|_| bad("v1 port out of range"))
    };
    Ok(Some(Addresses {
        source: SocketAddr::new(ip(sa)?, port(sp)?),
        destination: SocketAddr::new(ip(da)?, port(dp)?),
    }))
}

/// Parses a v2 header: `head` is the 16-byte preamble, `payload` the bytes it announces.
pub fn parse_v2(head: &[u8; 16], payload: &[u8]) -> Result<Option<Addresses>, PpError> {
    let bad = PpError::Malformed;
    if head[..12] != V2_SIG {
        return Err(PpError::Missing);
    }
    let ver_cmd = head[12];
    if ver_cmd >> 4 != 2 {
        return Err(bad("v2 version is not 2"));
    }
    let len = usize::from(u16::from_be_bytes([head[14], head[15]]));
    if payload.len() != len {
        return Err(bad("v2 payload length mismatch"));
    }
    match ver_cmd & 0x0f {
        0 => return Ok(None), // LOCAL: health checks of the proxy itself.
        1 => {}
        _ => return Err(bad("v2 command is not LOCAL or PROXY")),
    }
    let family = head[13] >> 4;
    let transport = head[13] & 0x0f;
    if transport > 2 {
        return Err(bad("v2 transport is not STREAM or DGRAM"));
    }
    match family {
        0 => Ok(None),
        1 => {
            if len < 12 {
                return Err(bad("v2 IPv4 addresses truncated"));
            }
            let p = payload;
            let s = Ipv4Addr::new(p[0], p[1], p[2], p[3]);
            let d = Ipv4Addr::new(p[4], p[5], p[6], p[7]);
            Ok(Some(Addresses {
                source: SocketAddr::new(s.into(), u16::from_be_bytes([p[8], p[9]])),
                destination: SocketAddr::new(d.into(), u16::from_be_bytes([p[10], p[11]])),
            }))
        }
        2 => {
            if len < 36 {
                return Err(bad("v2 IPv6 addresses truncated"));
            }
            let p = payload;
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&p[..16]);
            d.copy_from_slice(&p[16..32]);
            Ok(Some(Addresses {
                source: SocketAddr::new(
                    Ipv6Addr::from(s).into(),
                    u16::from_be_bytes([p[32], p[33]]),
                ),
                destination: SocketAddr::new(
                    Ipv6Addr::from(d).into(),
                    u16::from_be_bytes([p[34], p[35]]),
                ),
            }))
        }
        3 => Ok(None), // AF_UNIX: no IP to report.
        _ => Err(bad("v2 address family unknown")),
    }
}

/// Reads one PROXY header (v1 or v2) from `io`, consuming exactly its bytes. The caller
/// bounds the time it may take.
pub async fn read_header<R: AsyncRead + Unpin>(io: &mut R) -> Result<Option<Addresses>, PpError> {
    let mut head = [0u8; 16];
    io.read_exact(&mut head[..8]).await.map_err(PpError::Io)?;
    if head[..6] == *b"PROXY " {
        let mut line = head[..8].to_vec();
        // Byte by byte so nothing past the CRLF is consumed.
        while !line.ends_with(b"\r\n") {
            if line.len() >= V1_MAX {
                return Err(PpError::Malformed("v1 header longer than 107 bytes"));
            }
            let mut b = [0u8; 1];
            io.read_exact(&mut b).await.map_err(PpError::Io)?;
            line.push(b[0]);
        }
        return parse_v1(&line);
    }
    if head[..8] != V2_SIG[..8] {
        return Err(PpError::Missing);
    }
    io.read_exact(&mut head[8..]).await.map_err(PpError::Io)?;
    if head[..12] != V2_SIG {
        return Err(PpError::Missing);
    }
    let len = usize::from(u16::from_be_bytes([head[14], head[15]]));
    if len > MAX_V2_PAYLOAD {
        return Err(PpError::TooLarge(len));
    }
    let mut payload = vec![0u8; len];
    io.read_exact(&mut payload).await.map_err(PpError::Io)?;
    parse_v2(&head, &payload)
}

/// Longest header [`encode_v2`] writes: 16 bytes, then two IPv6 addresses and two ports.
pub const V2_MAX_LEN: usize = 16 + 36;

/// Encodes a v2 `PROXY` header for a stream (`udp == false`) or datagram connection from
/// `source` to `destination`. Mixed families are sent as IPv6 (IPv4-mapped).
pub fn encode_v2(source: SocketAddr, destination: SocketAddr, udp: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(V2_MAX_LEN);
    out.extend_from_slice(&V2_SIG);
    out.push(0x21);
    let transport = if udp { 0x02 } else { 0x01 };
    match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.push(0x10 | transport);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
        }
        (s, d) => {
            let v6 = |ip: IpAddr| match ip {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            out.push(0x20 | transport);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&v6(s).octets());
            out.extend_from_slice(&v6(d).octets());
        }
    }
    out.extend_from_slice(&source.port().to_be_bytes());
    out.extend_from_slice(&destination.port().to_be_bytes());
    out
}

/// A listener's expectation of PROXY headers (from `client_ip.proxy_protocol`).
#[derive(Debug)]
pub struct Expect {
    trusted: Vec<sweety_config::Cidr>,
    /// Time the header may take to arrive.
    pub timeout: std::time::Duration,
}

impl Expect {
    /// The expectation of listener `name`, if it is listed.
    pub fn for_listener(c: &sweety_config::ClientIp, name: &str) -> Option<std::sync::Arc<Expect>> {
        c.proxy_protocol.iter().any(|n| n == name).then(|| {
            std::sync::Arc::new(Expect {
                trusted: sweety_config::parse_cidrs(&c.trusted_proxies).0,
                timeout: c.proxy_protocol_timeout.get(),
            })
        })
    }

    /// Whether a connection from `peer` must start with a header: always without
    /// `trusted_proxies`, else only from them (others are served with their own address).
    pub fn applies_to(&self, peer: IpAddr) -> bool {
        self.trusted.is_empty() || sweety_config::any_contains(&self.trusted, peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    async fn read(bytes: &[u8]) -> (Result<Option<Addresses>, PpError>, Vec<u8>) {
        let mut cur = std::io::Cursor::new(bytes.to_vec());
        let r = read_header(&mut cur).await;
        let pos = cur.position() as usize;
        (r, bytes[pos..].to_vec())
    }

    #[tokio::test]
    async fn v1_tcp4_tcp6_unknown_and_rest_untouched() {
        let (r, rest) =
            read(b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET / HTTP/1.1\r\n").await;
        let a = r.unwrap().unwrap();
        assert_eq!(a.source, sa("192.0.2.1:56324"));
        assert_eq!(a.destination, sa("198.51.100.2:443"));
        assert_eq!(rest, b"GET / HTTP/1.1\r\n");
        let (r, _) = read(b"PROXY TCP6 2001:db8::1 2001:db8::2 1 2\r\n").await;
        assert_eq!(r.unwrap().unwrap().source, sa("[2001:db8::1]:1"));
        let (r, rest) = read(b"PROXY UNKNOWN\r\nxyz").await;
        assert!(r.unwrap().is_none());
        assert_eq!(rest, b"xyz");
    }

    #[tokio::test]
    async fn v1_malformed() {
        for bad in [
            &b"PROXY TCP4 192.0.2.1 198.51.100.2 56324\r\n"[..],
            b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443 9\r\n",
            b"PROXY TCP4 2001:db8::1 198.51.100.2 1 2\r\n",
            b"PROXY TCP4 192.0.2.1 198.51.100.2 99999 443\r\n",
            b"PROXY TCP4 192.0.2.1 198.51.100.2 +1 443\r\n",
            b"PROXY UDP4 192.0.2.1 198.51.100.2 1 2\r\n",
            b"PROXY TCP4 192.0.2.1 198.51.100.2 1 2\n",
        ] {
            let (r, _) = read(bad).await;
            assert!(r.is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        // No CRLF within 107 bytes.
        let mut long = b"PROXY TCP4 ".to_vec();
        long.extend(std::iter::repeat_n(b'1', 200));
        let (r, rest) = read(&long).await;
        assert!(matches!(r, Err(PpError::Malformed(_))), "{r:?}");
        assert_eq!(
            long.len() - rest.len(),
            V1_MAX,
            "stops reading at the limit"
        );
        // Not a PROXY header at all; truncated input.
        assert!(matches!(
            read(b"GET / HTTP/1.1\r\n").await.0,
            Err(PpError::Missing)
        ));
        assert!(matches!(read(b"PROX").await.0, Err(PpError::Io(_))));
    }

    #[tokio::test]
    async fn v2_round_trip_and_rest_untouched() {
        for (s, d) in [
            (sa("192.0.2.1:1234"), sa("198.51.100.2:443")),
            (sa("[2001:db8::1]:1234"), sa("[2001:db8::2]:443")),
        ] {
            let mut bytes = encode_v2(s, d, false);
            bytes.extend_from_slice(b"payload");
            let (r, rest) = read(&bytes).await;
            let a = r.unwrap().unwrap();
            assert_eq!((a.source, a.destination), (s, d));
            assert_eq!(rest, b"payload");
        }
        // Mixed families go as v4-mapped v6.
        let b = encode_v2(sa("192.0.2.1:1"), sa("[2001:db8::2]:2"), true);
        assert_eq!(b[13], 0x22);
        assert_eq!(b.len(), V2_MAX_LEN, "the longest header");
        let (r, _) = read(&b).await;
        assert_eq!(r.unwrap().unwrap().source, sa("[::ffff:192.0.2.1]:1"));
    }

    #[tokio::test]
    async fn v2_local_tlvs_and_malformed() {
        // LOCAL with a TLV payload: no addresses, payload consumed.
        let mut b = V2_SIG.to_vec();
        b.extend_from_slice(&[0x20, 0x00, 0x00, 0x03, 0x01, 0x00, 0x00]);
        b.extend_from_slice(b"next");
        let (r, rest) = read(&b).await;
        assert!(r.unwrap().is_none());
        assert_eq!(rest, b"next");
        // PROXY TCP4 with TLVs after the addresses.
        let mut b = encode_v2(sa("192.0.2.1:1"), sa("192.0.2.2:2"), false);
        b[15] = 12 + 4;
        b.extend_from_slice(&[0x04, 0x00, 0x01, 0xaa]);
        assert_eq!(read(&b).await.0.unwrap().unwrap().source, sa("192.0.2.1:1"));
        // Too large, wrong version, truncated addresses, truncated stream.
        let mut big = V2_SIG.to_vec();
        big.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert!(matches!(read(&big).await.0, Err(PpError::TooLarge(65535))));
        let mut v3 = encode_v2(sa("192.0.2.1:1"), sa("192.0.2.2:2"), false);
        v3[12] = 0x31;
        assert!(read(&v3).await.0.is_err());
        let mut short = V2_SIG.to_vec();
        short.extend_from_slice(&[0x21, 0x11, 0x00, 0x04, 1, 2, 3, 4]);
        assert!(matches!(read(&short).await.0, Err(PpError::Malformed(_))));
        let cut = encode_v2(sa("192.0.2.1:1"), sa("192.0.2.2:2"), false);
        assert!(matches!(read(&cut[..20]).await.0, Err(PpError::Io(_))));
        let mut bad_sig = encode_v2(sa("192.0.2.1:1"), sa("192.0.2.2:2"), false);
        bad_sig[10] = b'X';
        assert!(matches!(read(&bad_sig).await.0, Err(PpError::Missing)));
    }
}
