//! The controller ↔ dataplane control protocol: pure encoding and decoding of length-prefixed
//! frames over bytes (no I/O, no async runtime), shared by both sides.
//!
//! Every frame is an 8-byte header followed by a payload:
//!
//! ```text
//!  byte 0     1     2         3        4   5   6   7     8 ...
//!      +-----+-----+---------+--------+---------------+-----------------+
//!      | 'S' | 'W' | version | type   | length u32 BE | payload         |
//!      +-----+-----+---------+--------+---------------+-----------------+
//! ```
//!
//! * `version` is [`PROTOCOL_VERSION`]; a frame with another version is rejected.
//! * `type` is one of [`FrameType`].
//! * `length` is checked against [`MAX_FRAME_BYTES`] *before* anything is allocated.
//!
//! Payloads: `Hello`, `Ack` and `Nack` are JSON objects. `Apply` is the generation as a u64
//! (big endian) followed by the config as compact JSON, so a receiver that cannot parse the
//! config still knows which generation to reject. `ApplyDelta` is the generation and the base
//! generation (u64 big endian each) followed by a [`ConfigDelta`] as compact JSON. See
//! `docs/control-protocol.md`.

use crate::delta::ConfigDelta;
use crate::{Config, ParseError};
use serde::{Deserialize, Serialize};

/// The protocol version carried in every frame header and in `Hello`.
pub const PROTOCOL_VERSION: u8 = 1;

/// Largest accepted payload (64 MiB). Larger frames are rejected from their header alone.
pub const MAX_FRAME_BYTES: u32 = 64 * 1024 * 1024;

/// Size of the frame header.
pub const HEADER_LEN: usize = 8;

const MAGIC: [u8; 2] = *b"SW";

/// The kind of a frame (the header's `type` byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    /// Dataplane → controller, first frame on every connection.
    Hello = 1,
    /// Controller → dataplane: a full config snapshot.
    Apply = 2,
    /// Dataplane → controller: the generation was applied.
    Ack = 3,
    /// Dataplane → controller: the generation was rejected; the old config keeps serving.
    Nack = 4,
    /// Controller → dataplane: changes relative to the config of a base generation.
    ApplyDelta = 5,
}

impl FrameType {
    fn from_byte(b: u8) -> Result<FrameType, ParseError> {
        Ok(match b {
            1 => FrameType::Hello,
            2 => FrameType::Apply,
            3 => FrameType::Ack,
            4 => FrameType::Nack,
            5 => FrameType::ApplyDelta,
            other => return Err(ParseError::FrameType(other)),
        })
    }

    fn name(self) -> &'static str {
        match self {
            FrameType::Hello => "Hello",
            FrameType::Apply => "Apply",
            FrameType::Ack => "Ack",
            FrameType::Nack => "Nack",
            FrameType::ApplyDelta => "ApplyDelta",
        }
    }
}

/// A parsed, size-checked frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Frame kind.
    pub kind: FrameType,
    /// Payload length in bytes (at most [`MAX_FRAME_BYTES`]).
    pub len: u32,
}

impl FrameHeader {
    /// Parses a header, rejecting a bad magic, another protocol version, an unknown type or
    /// a payload over [`MAX_FRAME_BYTES`].
    pub fn parse(bytes: &[u8; HEADER_LEN]) -> Result<FrameHeader, ParseError> {
        if bytes[0..2] != MAGIC {
            return Err(ParseError::FrameMagic([bytes[0], bytes[1]]));
        }
        if bytes[2] != PROTOCOL_VERSION {
            return Err(ParseError::FrameVersion(bytes[2]));
        }
        let kind = FrameType::from_byte(bytes[3])?;
        let len = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        if len > MAX_FRAME_BYTES {
            return Err(ParseError::FrameTooLarge {
                len,
                max: MAX_FRAME_BYTES,
            });
        }
        Ok(FrameHeader { kind, len })
    }

    /// The header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let l = self.len.to_be_bytes();
        [
            MAGIC[0],
            MAGIC[1],
            PROTOCOL_VERSION,
            self.kind as u8,
            l[0],
            l[1],
            l[2],
            l[3],
        ]
    }
}

/// Sent by the dataplane as the first frame of every connection: what it runs now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The dataplane's protocol version.
    pub version: u8,
    /// Generation of the config it serves (0: none yet).
    pub generation: u64,
    /// [`Config::content_hash`] of the config it serves (empty: none yet).
    pub hash: String,
}

/// One control-protocol message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Dataplane → controller on connect.
    Hello(Hello),
    /// Controller → dataplane: replace the running config with this one.
    Apply {
        /// The generation; authoritative over `config.generation`.
        generation: u64,
        /// The full config snapshot.
        config: Box<Config>,
    },
    /// Controller → dataplane: apply `delta` to the config of generation `base` (the one the
    /// dataplane serves) and serve the result as `generation`.
    ApplyDelta {
        /// The generation of the result.
        generation: u64,
        /// The generation the delta was computed against.
        base: u64,
        /// The changes.
        delta: Box<ConfigDelta>,
    },
    /// Dataplane → controller: `generation` is live.
    Ack {
        /// The applied generation.
        generation: u64,
    },
    /// Dataplane → controller: `generation` was rejected; the last good config keeps serving.
    Nack {
        /// The rejected generation (0 when the frame was unreadable).
        generation: u64,
        /// Every error, each `path: message`.
        errors: Vec<String>,
    },
}

#[derive(Serialize, Deserialize)]
struct AckBody {
    generation: u64,
}

#[derive(Serialize, Deserialize)]
struct NackBody {
    generation: u64,
    errors: Vec<String>,
}

impl Message {
    /// The frame type this message travels as.
    pub fn kind(&self) -> FrameType {
        match self {
            Message::Hello(_) => FrameType::Hello,
            Message::Apply { .. } => FrameType::Apply,
            Message::ApplyDelta { .. } => FrameType::ApplyDelta,
            Message::Ack { .. } => FrameType::Ack,
            Message::Nack { .. } => FrameType::Nack,
        }
    }

    /// The whole frame, header included. Fails only when the payload exceeds
    /// [`MAX_FRAME_BYTES`].
    pub fn encode(&self) -> Result<Vec<u8>, ParseError> {
        let mut out = vec![0u8; HEADER_LEN];
        match self {
            Message::Hello(h) => serde_json::to_writer(&mut out, h),
            Message::Apply { generation, config } => return encode_apply(*generation, config),
            Message::ApplyDelta {
                generation,
                base,
                delta,
            } => return encode_apply_delta(*generation, *base, delta),
            Message::Ack { generation } => serde_json::to_writer(
                &mut out,
                &AckBody {
                    generation: *generation,
                },
            ),
            Message::Nack { generation, errors } => serde_json::to_writer(
                &mut out,
                &NackBody {
                    generation: *generation,
                    errors: errors.clone(),
                },
            ),
        }
        .expect("control messages always serialise");
        finish(self.kind(), out)
    }
}

/// Fills in the header of a frame whose payload follows `HEADER_LEN` placeholder bytes.
fn finish(kind: FrameType, mut out: Vec<u8>) -> Result<Vec<u8>, ParseError> {
    let payload = out.len() - HEADER_LEN;
    let len = u32::try_from(payload)
        .ok()
        .filter(|l| *l <= MAX_FRAME_BYTES)
        .ok_or(ParseError::FrameTooLarge {
            len: u32::try_from(payload).unwrap_or(u32::MAX),
            max: MAX_FRAME_BYTES,
        })?;
    let header = FrameHeader { kind, len };
    out[..HEADER_LEN].copy_from_slice(&header.encode());
    Ok(out)
}

impl Message {
    /// Decodes a payload of the given kind.
    pub fn decode(kind: FrameType, payload: &[u8]) -> Result<Message, ParseError> {
        let bad = |source| ParseError::FramePayload {
            kind: kind.name(),
            source,
        };
        Ok(match kind {
            FrameType::Hello => Message::Hello(serde_json::from_slice(payload).map_err(bad)?),
            FrameType::Apply => {
                let generation = apply_generation(payload).ok_or(ParseError::FrameTruncated {
                    kind: kind.name(),
                    len: payload.len(),
                })?;
                let config = Config::from_json(&payload[8..])?;
                Message::Apply {
                    generation,
                    config: Box::new(config),
                }
            }
            FrameType::ApplyDelta => {
                let truncated = ParseError::FrameTruncated {
                    kind: kind.name(),
                    len: payload.len(),
                };
                let generation = apply_generation(payload).ok_or(truncated)?;
                let base = payload
                    .get(8..16)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
                    .ok_or(ParseError::FrameTruncated {
                        kind: kind.name(),
                        len: payload.len(),
                    })?;
                let delta = serde_json::from_slice(&payload[16..]).map_err(bad)?;
                Message::ApplyDelta {
                    generation,
                    base,
                    delta: Box::new(delta),
                }
            }
            FrameType::Ack => {
                let b: AckBody = serde_json::from_slice(payload).map_err(bad)?;
                Message::Ack {
                    generation: b.generation,
                }
            }
            FrameType::Nack => {
                let b: NackBody = serde_json::from_slice(payload).map_err(bad)?;
                Message::Nack {
                    generation: b.generation,
                    errors: b.errors,
                }
            }
        })
    }
}

/// An `Apply` frame for a borrowed config (no copy of the config is made).
pub fn encode_apply(generation: u64, config: &Config) -> Result<Vec<u8>, ParseError> {
    let mut out = vec![0u8; HEADER_LEN];
    out.extend_from_slice(&generation.to_be_bytes());
    serde_json::to_writer(&mut out, config).expect("configs always serialise");
    finish(FrameType::Apply, out)
}

/// An `ApplyDelta` frame: `delta` turns the config of generation `base` into `generation`.
pub fn encode_apply_delta(
    generation: u64,
    base: u64,
    delta: &ConfigDelta,
) -> Result<Vec<u8>, ParseError> {
    let mut out = vec![0u8; HEADER_LEN];
    out.extend_from_slice(&generation.to_be_bytes());
    out.extend_from_slice(&base.to_be_bytes());
    serde_json::to_writer(&mut out, delta).expect("deltas always serialise");
    finish(FrameType::ApplyDelta, out)
}

/// An `Apply` frame from a config already serialized as JSON (the pusher serializes once for
/// both the content hash and the frame).
pub fn encode_apply_json(generation: u64, config_json: &[u8]) -> Result<Vec<u8>, ParseError> {
    let mut out = Vec::with_capacity(HEADER_LEN + 8 + config_json.len());
    out.resize(HEADER_LEN, 0);
    out.extend_from_slice(&generation.to_be_bytes());
    out.extend_from_slice(config_json);
    finish(FrameType::Apply, out)
}

/// The generation of an `Apply` or `ApplyDelta` payload, readable even when the rest is not.
pub fn apply_generation(payload: &[u8]) -> Option<u64> {
    let g: [u8; 8] = payload.get(..8)?.try_into().ok()?;
    Some(u64::from_be_bytes(g))
}

/// Decodes the first complete frame in `buf`: `Ok(None)` when more bytes are needed,
/// otherwise the message and how many bytes it used. A header announcing an oversized
/// payload is an error as soon as the header is complete.
pub fn decode_frame(buf: &[u8]) -> Result<Option<(Message, usize)>, ParseError> {
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let header = FrameHeader::parse(h.try_into().expect("header length"))?;
    let end = HEADER_LEN + header.len as usize;
    let Some(payload) = buf.get(HEADER_LEN..end) else {
        return Ok(None);
    };
    Ok(Some((Message::decode(header.kind, payload)?, end)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::delta::Digests;
    use crate::validate::tests::full;
    use crate::{
        Action, FixedResponse, Listener, ListenerProtocol, PathMatch, Route, RouteMatch, Timeouts,
        VirtualHost,
    };

    fn all_messages() -> Vec<Message> {
        vec![
            Message::Hello(Hello {
                version: PROTOCOL_VERSION,
                generation: 7,
                hash: "ab".repeat(32),
            }),
            Message::Apply {
                generation: 8,
                config: Box::new(full()),
            },
            Message::ApplyDelta {
                generation: 9,
                base: 8,
                delta: Box::new({
                    let (a, mut b) = (full(), full());
                    b.virtual_hosts.reverse();
                    b.virtual_hosts[0].name = "renamed".into();
                    b.limits.max_connections += 1;
                    let (da, db) = (Digests::of(&a), Digests::of(&b));
                    ConfigDelta::between(&a, &da, &b, &db).unwrap()
                }),
            },
            Message::Ack { generation: 8 },
            Message::Nack {
                generation: 9,
                errors: vec!["listeners[0].port: must not be 0".into()],
            },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in all_messages() {
            let bytes = m.encode().unwrap();
            assert_eq!(&bytes[..3], b"SW\x01");
            assert_eq!(bytes[3], m.kind() as u8);
            let len = u32::from_be_bytes(bytes[4..8].try_into().unwrap()) as usize;
            assert_eq!(len, bytes.len() - HEADER_LEN);
            let (back, used) = decode_frame(&bytes).unwrap().unwrap();
            assert_eq!(used, bytes.len());
            assert_eq!(back, m);
        }
    }

    #[test]
    fn partial_input_needs_more_bytes_and_frames_split_cleanly() {
        let mut stream = Vec::new();
        for m in all_messages() {
            stream.extend(m.encode().unwrap());
        }
        for cut in [0, 1, 7, 8, 20] {
            assert!(decode_frame(&stream[..cut]).unwrap().is_none(), "cut {cut}");
        }
        let mut rest = &stream[..];
        let mut got = Vec::new();
        while let Some((m, used)) = decode_frame(rest).unwrap() {
            got.push(m);
            rest = &rest[used..];
        }
        assert!(rest.is_empty());
        assert_eq!(got, all_messages());
    }

    #[test]
    fn oversized_header_is_rejected_before_the_payload_arrives() {
        let h = FrameHeader {
            kind: FrameType::Apply,
            len: MAX_FRAME_BYTES,
        }
        .encode();
        assert_eq!(FrameHeader::parse(&h).unwrap().len, MAX_FRAME_BYTES);
        let mut big = h;
        big[4..8].copy_from_slice(&(MAX_FRAME_BYTES + 1).to_be_bytes());
        let err = FrameHeader::parse(&big).unwrap_err();
        assert!(
            matches!(err, ParseError::FrameTooLarge { len, max } if len == MAX_FRAME_BYTES + 1 && max == MAX_FRAME_BYTES),
            "{err}"
        );
        // Only the 8 header bytes are present: the error comes without waiting for 64 MiB.
        let err = decode_frame(&big).unwrap_err().to_string();
        assert!(err.contains("too large"), "{err}");
    }

    #[test]
    fn bad_magic_version_and_type_are_rejected() {
        let good = Message::Ack { generation: 1 }.encode().unwrap();
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(
            decode_frame(&b),
            Err(ParseError::FrameMagic([b'X', b'W']))
        ));
        let mut b = good.clone();
        b[2] = 9;
        assert!(matches!(decode_frame(&b), Err(ParseError::FrameVersion(9))));
        let mut b = good.clone();
        b[3] = 42;
        assert!(matches!(decode_frame(&b), Err(ParseError::FrameType(42))));
    }

    #[test]
    fn bad_payloads_are_errors_and_apply_keeps_its_generation() {
        let err = Message::decode(FrameType::Ack, b"{\"gen\":1}").unwrap_err();
        assert!(err.to_string().starts_with("invalid Ack payload"), "{err}");
        let err = Message::decode(FrameType::Apply, b"\x00\x01").unwrap_err();
        assert!(
            matches!(err, ParseError::FrameTruncated { len: 2, .. }),
            "{err}"
        );
        let mut payload = 42u64.to_be_bytes().to_vec();
        payload.extend_from_slice(b"{\"listener\": []}");
        let err = Message::decode(FrameType::Apply, &payload).unwrap_err();
        assert!(
            err.to_string().contains("unknown field `listener`"),
            "{err}"
        );
        assert_eq!(apply_generation(&payload), Some(42));
    }

    /// A config shaped like a controller's output for `routes` HTTPRoutes: one vhost per
    /// route with one prefix match each.
    pub(crate) fn big_config(routes: usize) -> Config {
        Config {
            generation: 1,
            listeners: vec![Listener {
                name: "web".into(),
                address: "127.0.0.1".into(),
                port: 8080,
                protocol: ListenerProtocol::Http,
                tls: None,
                http3: false,
                max_requests_in_flight: None,
                advertised_port: None,
                l4_routes: vec![],
            }],
            virtual_hosts: (0..routes)
                .map(|i| VirtualHost {
                    name: format!("ns-{}/route-{i}", i % 50),
                    hostnames: vec![format!("app-{i}.example.com")],
                    listeners: vec![],
                    routes: vec![Route {
                        name: format!("ns-{}/route-{i}/rule-0", i % 50),
                        matches: vec![RouteMatch {
                            path: Some(PathMatch::Prefix(format!("/api/v{}/", i % 7))),
                            ..Default::default()
                        }],
                        filters: vec![],
                        action: Action::Fixed(FixedResponse {
                            status: 200,
                            body: format!("route {i}"),
                            content_type: None,
                        }),
                        timeouts: Timeouts::default(),
                        retry: None,
                        max_request_body_bytes: None,
                    }],
                })
                .collect(),
            ..Config::default()
        }
    }

    /// Micro benchmark (not run by default): `cargo test -p sweety-config --release --lib
    /// wire::tests::bench_5000_routes -- --ignored --nocapture`. Results are recorded in
    /// docs/control-protocol.md.
    #[test]
    #[ignore]
    fn bench_5000_routes() {
        let config = big_config(5000);
        let msg = Message::Apply {
            generation: 1,
            config: Box::new(config.clone()),
        };
        let rounds = 20;
        let mut enc = Vec::new();
        let mut dec = Vec::new();
        let mut hash = Vec::new();
        let mut bytes = 0;
        for _ in 0..rounds {
            let t = std::time::Instant::now();
            let frame = msg.encode().unwrap();
            enc.push(t.elapsed());
            bytes = frame.len();
            let t = std::time::Instant::now();
            let (back, _) = decode_frame(&frame).unwrap().unwrap();
            dec.push(t.elapsed());
            assert_eq!(back, msg);
            let t = std::time::Instant::now();
            let _ = config.content_hash();
            hash.push(t.elapsed());
        }
        for v in [&mut enc, &mut dec, &mut hash] {
            v.sort();
        }
        println!(
            "5000 routes: frame {bytes} bytes; p50 encode {:?}, decode {:?}, content_hash {:?}",
            enc[rounds / 2],
            dec[rounds / 2],
            hash[rounds / 2]
        );
    }

    #[test]
    fn apply_from_json_matches_apply_from_config_and_hash() {
        let cfg = crate::Config::default();
        assert_eq!(cfg.generation, 0);
        let json = cfg.to_json();
        assert_eq!(
            encode_apply_json(9, &json).unwrap(),
            encode_apply(9, &cfg).unwrap()
        );
    }
}
