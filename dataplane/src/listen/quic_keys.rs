//! The keys of the HTTP/3 endpoints' connection IDs and stateless resets (RFC 9000 §5.1,
//! §10.3), so that the clients of an endpoint the reload closed learn at once that their
//! connection is gone.
//!
//! By default quinn gives every endpoint its own random reset key and its own keyed
//! connection-ID scheme. When a config removes an HTTP/3 listener and gives its address to a
//! new one, the reload closes the old endpoint's socket right before the new bind
//! ([`super::quic_socket`]), so the old clients get no CONNECTION_CLOSE; their next packets
//! reach the new endpoint, which took their connection IDs for random bytes (dropped, no reset)
//! and could not have sent a reset token they accept anyway. They hung until their idle
//! timeout. Here every endpoint bound on one local address gets the same two keys, derived
//! from one process secret and that address ([`endpoint_config`]):
//!
//! * connection IDs ([`AddressCids`]) are 8 bytes with no lifetime, as quinn's default ones
//!   were: a 5-byte nonce and a 3-byte tag, HMAC-SHA256(CID key, nonce) truncated, which
//!   [`AddressCids::validate`](ConnectionIdGenerator::validate) checks. An endpoint thus tells
//!   its address's IDs from other bytes (a random one passes with probability 2^-24) and
//!   answers a packet for one it has no connection for with a stateless reset;
//! * quinn computes the reset token of an ID as HMAC-SHA256(reset key, ID) truncated to 16
//!   bytes, so the successor's reset carries the token the old endpoint gave the client, which
//!   closes the connection with a reset (and retries on a new one).
//!
//! The nonce is HMAC-SHA256 of a process-wide counter under a key of its own: unpredictable
//! and unlinkable without the key (§5.1 wants no correlation of one connection's IDs), with
//! no system call and no failure per ID. 40 bits of nonce make a repeat of an ID (whose reset
//! token may have been revealed, RFC 9000 §10.3.2) rare over a process's life; quinn's
//! default had 24.
//!
//! Keys per address rather than one pair for the process: an endpoint that answered a packet
//! carrying an ID of another endpoint's *live* connection would hand that connection's reset
//! token to whoever sent the packet (the stateless reset oracle, RFC 9000 §21.11). With keys
//! per bound address (IP, port, and scope), only an endpoint bound on the same address shares
//! them, and that one exists only once the previous socket there is closed, its connections
//! gone. The cost: a listener that moves to another address of the same port (0.0.0.0:P to
//! 127.0.0.1:P) does not reset the old one's clients; they time out as before.
//!
//! The process secret and the keys derived from it are secrets: random per process (ring's
//! system random source, read once), never logged (ring's `hmac::Key` debug-prints only its
//! algorithm; nothing here prints more), never in the config, never written anywhere. A
//! restarted process has new ones: its predecessor's clients get no reset from it.

use quinn::{ConnectionId, ConnectionIdGenerator, EndpointConfig};
use quinn_proto::InvalidCid;
use ring::hmac;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use subtle::ConstantTimeEq;

/// The length of our connection IDs: quinn's default (`HashedConnectionIdGenerator`'s), which
/// the endpoints had before. Every endpoint uses the same, as short headers carry no length.
pub(crate) const CID_LEN: usize = 8;
/// The random part of an ID.
const NONCE_LEN: usize = 5;
/// The part that [`ConnectionIdGenerator::validate`] checks.
const TAG_LEN: usize = CID_LEN - NONCE_LEN;

/// The process secret: the root of the per-address keys, and the key of the nonces.
struct Secret {
    root: hmac::Key,
    nonce: hmac::Key,
}

/// Created on the first endpoint's bind; see the module docs (a secret: never logged).
static SECRET: OnceLock<Secret> = OnceLock::new();

/// The count of IDs generated in the process: the input of each ID's nonce.
static GENERATED: AtomicU64 = AtomicU64::new(0);

impl Secret {
    fn new(root: hmac::Key) -> Secret {
        let nonce = derive(&root, b"sweety quic cid nonce v1", &[]);
        Secret { root, nonce }
    }

    /// The process's secret, created from the system random source on first use. An error
    /// (no randomness) fails the endpoint's bind: there are no keys to fall back to.
    fn get() -> io::Result<&'static Secret> {
        if let Some(s) = SECRET.get() {
            return Ok(s);
        }
        let root = hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
            .map_err(|_| io::Error::other("no system randomness for the QUIC keys"))?;
        // Two first binds at once: the first stored wins, the other is dropped unused.
        Ok(SECRET.get_or_init(|| Secret::new(root)))
    }

    /// The reset key and the connection-ID generator of endpoints bound on `local`.
    fn for_address(&self, local: SocketAddr) -> (hmac::Key, AddressCids) {
        let addr = address_bytes(local);
        let reset = derive(&self.root, b"sweety quic reset v1", &addr);
        let cids = AddressCids {
            tag: derive(&self.root, b"sweety quic cid tag v1", &addr),
            nonce: self.nonce.clone(),
        };
        (reset, cids)
    }
}

/// A key derived from `root` for `label` and `context` (HMAC-SHA256 as a PRF; the label is
/// followed by a zero octet, which no label contains).
fn derive(root: &hmac::Key, label: &[u8], context: &[u8]) -> hmac::Key {
    let mut ctx = hmac::Context::with_key(root);
    ctx.update(label);
    ctx.update(&[0]);
    ctx.update(context);
    hmac::Key::new(hmac::HMAC_SHA256, ctx.sign().as_ref())
}

/// `local` as bytes for [`derive`]: family, address, port, and an IPv6 scope.
fn address_bytes(local: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 16 + 2 + 4);
    match local {
        SocketAddr::V4(a) => {
            out.push(4);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
        SocketAddr::V6(a) => {
            out.push(6);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
            out.extend_from_slice(&a.scope_id().to_be_bytes());
        }
    }
    out
}

/// The quinn endpoint config of an HTTP/3 endpoint bound on `local`: the reset key and the
/// connection-ID scheme that every endpoint bound there in this process shares; the rest is
/// quinn's default.
pub(crate) fn endpoint_config(local: SocketAddr) -> io::Result<EndpointConfig> {
    let (reset, cids) = Secret::get()?.for_address(local);
    let mut cfg = EndpointConfig::new(Arc::new(reset));
    cfg.cid_generator(move || -> Box<dyn ConnectionIdGenerator> { Box::new(cids.clone()) });
    // No minimum interval between stateless resets (quinn's default is 20 ms per endpoint,
    // and its driver gives a whole receive batch one `now`): with it, when a listener's address
    // is taken over, one of its clients was reset per batch and the others waited for their
    // retransmissions, seconds for the last of 40 (review of 8fdf16d, M1); and a client sending
    // one packet every 20 ms on an ID of this address starved everyone else's resets. Without it
    // nothing is amplified: a reset is always smaller than the packet it answers (quinn sizes it
    // so), and a reset of a reset cannot loop (RFC 9000 §10.3.3): its random ID passes
    // `validate` once in 2^24.
    cfg.min_reset_interval(Duration::ZERO);
    Ok(cfg)
}

/// The connection IDs of the endpoints bound on one address (see the module docs). Each
/// endpoint has its own copy (quinn asks for one per endpoint); the keys are the same.
#[derive(Clone)]
pub(crate) struct AddressCids {
    /// The key of the tags: this address's.
    tag: hmac::Key,
    /// The key of the nonces: the process's.
    nonce: hmac::Key,
}

impl AddressCids {
    /// The tag of `nonce` under this address's key.
    fn tag(&self, nonce: &[u8]) -> [u8; TAG_LEN] {
        let sig = hmac::sign(&self.tag, nonce);
        let mut tag = [0; TAG_LEN];
        tag.copy_from_slice(&sig.as_ref()[..TAG_LEN]);
        tag
    }

    /// The ID with `nonce`.
    fn with_nonce(&self, nonce: [u8; NONCE_LEN]) -> ConnectionId {
        let mut id = [0; CID_LEN];
        id[..NONCE_LEN].copy_from_slice(&nonce);
        id[NONCE_LEN..].copy_from_slice(&self.tag(&nonce));
        ConnectionId::new(&id)
    }
}

impl ConnectionIdGenerator for AddressCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let n = GENERATED.fetch_add(1, Ordering::Relaxed);
        let sig = hmac::sign(&self.nonce, &n.to_be_bytes());
        let mut nonce = [0; NONCE_LEN];
        nonce.copy_from_slice(&sig.as_ref()[..NONCE_LEN]);
        self.with_nonce(nonce)
    }

    /// Whether `cid` (the destination ID of a packet for no known connection: the client's
    /// bytes) is one of this address's: its length, and its tag compared in constant time.
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        if cid.len() != CID_LEN {
            return Err(InvalidCid);
        }
        let (nonce, tag) = cid.split_at(NONCE_LEN);
        if bool::from(self.tag(nonce)[..].ct_eq(tag)) {
            Ok(())
        } else {
            Err(InvalidCid)
        }
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A fixed secret, so that the tests are deterministic.
    fn secret() -> Secret {
        Secret::new(hmac::Key::new(hmac::HMAC_SHA256, &[7; 32]))
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn reset_token(key: &hmac::Key, cid: &ConnectionId) -> Vec<u8> {
        hmac::sign(key, cid).as_ref()[..16].to_vec()
    }

    #[test]
    fn generated_ids_are_8_bytes_distinct_and_valid() {
        let (_, mut cids) = secret().for_address(addr("127.0.0.1:4433"));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2000 {
            let id = cids.generate_cid();
            assert_eq!(id.len(), CID_LEN);
            assert!(cids.validate(&id).is_ok());
            assert!(seen.insert(id), "{id} generated twice");
        }
        assert_eq!((cids.cid_len(), cids.cid_lifetime()), (CID_LEN, None));
    }

    /// The IDs of one address are valid for every endpoint bound there and for no other
    /// address (fixed nonces and keys: deterministic).
    #[test]
    fn ids_are_valid_for_their_address_only() {
        let s = secret();
        let (_, a) = s.for_address(addr("127.0.0.1:4433"));
        let (_, a_again) = s.for_address(addr("127.0.0.1:4433"));
        let others = [
            "127.0.0.1:4434",
            "127.0.0.2:4433",
            "0.0.0.0:4433",
            "[::1]:4433",
            "[fe80::1%2]:4433",
            "[fe80::1%3]:4433",
        ]
        .map(|o| s.for_address(addr(o)).1);
        for n in 0..2000u32 {
            let b = n.to_be_bytes();
            let id = a.with_nonce([b[0], b[1], b[2], b[3], 0x5a]);
            assert!(a.validate(&id).is_ok());
            assert!(a_again.validate(&id).is_ok(), "same address, same keys");
            for o in &others {
                assert!(o.validate(&id).is_err(), "{id} valid for another address");
            }
        }
    }

    #[test]
    fn reset_keys_are_per_address() {
        let s = secret();
        let (_, mut cids) = s.for_address(addr("127.0.0.1:4433"));
        let id = cids.generate_cid();
        let (r1, _) = s.for_address(addr("127.0.0.1:4433"));
        let (r2, _) = s.for_address(addr("127.0.0.1:4433"));
        let (r3, _) = s.for_address(addr("127.0.0.1:4434"));
        assert_eq!(reset_token(&r1, &id), reset_token(&r2, &id));
        assert_ne!(reset_token(&r1, &id), reset_token(&r3, &id));
        // Another process secret: other keys.
        let other = Secret::new(hmac::Key::new(hmac::HMAC_SHA256, &[8; 32]));
        let (r4, c4) = other.for_address(addr("127.0.0.1:4433"));
        assert_ne!(reset_token(&r1, &id), reset_token(&r4, &id));
        assert!(c4.validate(&id).is_err());
    }

    #[test]
    fn the_process_secret_is_created_once() {
        let local = addr("127.0.0.1:4433");
        let (r1, c1) = Secret::get().unwrap().for_address(local);
        let (r2, mut c2) = Secret::get().unwrap().for_address(local);
        let id = c2.generate_cid();
        assert!(c1.validate(&id).is_ok());
        assert_eq!(reset_token(&r1, &id), reset_token(&r2, &id));
        assert!(endpoint_config(local).is_ok());
    }

    /// A short-header datagram of `len` bytes for `dst` (header form 0, fixed bit 1).
    fn short_packet(dst: &ConnectionId, len: usize) -> bytes::BytesMut {
        let mut p = vec![0x5au8; len];
        p[0] = 0x40;
        p[1..1 + dst.len()].copy_from_slice(dst);
        p[..].into()
    }

    /// What a quinn endpoint with `cfg` answers to `datagram` (it has no connections).
    fn answer(cfg: EndpointConfig, datagram: bytes::BytesMut) -> Option<Vec<u8>> {
        let mut ep = quinn_proto::Endpoint::new(Arc::new(cfg), None, false, Some([1; 32]));
        let mut buf = Vec::new();
        let from = addr("127.0.0.1:50000");
        let event = ep.handle(
            std::time::Instant::now(),
            from,
            None,
            None,
            datagram,
            &mut buf,
        )?;
        match event {
            quinn_proto::DatagramEvent::Response(t) => Some(buf[..t.size].to_vec()),
            _ => panic!("no connection to route to"),
        }
    }

    /// The mechanism end to end in quinn: an endpoint bound on an address answers a packet
    /// for an ID of that address it has no connection for (one of a closed predecessor's)
    /// with a stateless reset carrying that ID's token, smaller than the packet; an endpoint
    /// on another address, or one with quinn's default keys (as before), drops it silently.
    #[test]
    fn an_endpoint_resets_the_ids_of_its_address_only() {
        let here = addr("127.0.0.1:4433");
        let (reset, mut cids) = Secret::get().unwrap().for_address(here);
        let id = cids.generate_cid();
        let packet = short_packet(&id, 60);

        let reply = answer(endpoint_config(here).unwrap(), packet.clone()).expect("a reset");
        assert!(
            reply.len() < packet.len() && reply.len() >= 21,
            "{}",
            reply.len()
        );
        assert_eq!(reply[0] & 0xc0, 0x40, "looks like a short-header packet");
        assert_eq!(reply[reply.len() - 16..], reset_token(&reset, &id)[..]);

        let there = endpoint_config(addr("127.0.0.1:4434")).unwrap();
        assert_eq!(
            answer(there, packet.clone()),
            None,
            "another address: no oracle"
        );
        assert_eq!(answer(EndpointConfig::default(), packet), None);
        // Too short to be answered by a smaller reset: dropped.
        let short = short_packet(&id, 1 + CID_LEN + 12);
        assert_eq!(answer(endpoint_config(here).unwrap(), short), None);
    }

    proptest! {
        /// `validate` takes any bytes a client sends: it never panics, refuses every length
        /// but 8, and accepts exactly the IDs that [`AddressCids::with_nonce`] makes.
        #[test]
        fn validate_accepts_exactly_the_ids_of_its_address(
            bytes in proptest::collection::vec(any::<u8>(), 0..=20),
        ) {
            let (_, cids) = secret().for_address(addr("127.0.0.1:4433"));
            let id = ConnectionId::new(&bytes);
            let ok = cids.validate(&id).is_ok();
            if bytes.len() != CID_LEN {
                prop_assert!(!ok);
            } else {
                let nonce: [u8; NONCE_LEN] = bytes[..NONCE_LEN].try_into().unwrap();
                prop_assert_eq!(ok, cids.with_nonce(nonce) == id);
            }
        }

        /// Every ID made from a nonce is valid; with any bit of its tag flipped, it is not.
        #[test]
        fn a_tag_with_any_bit_flipped_is_refused(
            nonce in any::<[u8; NONCE_LEN]>(),
            bit in 0..TAG_LEN * 8,
        ) {
            let (_, cids) = secret().for_address(addr("[::1]:443"));
            let id = cids.with_nonce(nonce);
            prop_assert!(cids.validate(&id).is_ok());
            let mut bytes = id.to_vec();
            bytes[NONCE_LEN + bit / 8] ^= 1 << (bit % 8);
            prop_assert!(cids.validate(&ConnectionId::new(&bytes)).is_err());
        }
    }
}
