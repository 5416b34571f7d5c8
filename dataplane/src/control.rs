//! The dataplane end of the control protocol (`--control-socket PATH`): a Unix socket on which
//! the controller pushes config snapshots (`Apply`) and deltas (`ApplyDelta`), answered with
//! `Ack` or `Nack`. Frames are encoded by [`sweety_config::wire`]; docs/control-protocol.md
//! has the protocol.
//!
//! * The socket file is created with mode 0600 before it becomes reachable under its name
//!   (bound under a temporary name, chmod-ed, then renamed into place). A stale socket at the
//!   path is removed; anything else at the path is refused.
//! * On connect the dataplane sends `Hello` with the generation and content hash it runs, so a
//!   controller can skip a resend or resend after a dataplane restart.
//! * This module only frames: it decodes `Apply` and `ApplyDelta` into a
//!   [`crate::reload::Change`], hands it to [`Runtime::apply`] (which validates,
//!   builds and swaps, and keeps the base of the next delta) and answers `Ack`, or `Nack`
//!   with every error (with its path); on any error the last good config keeps serving.
//! * `ApplyDelta` names its base generation: it applies onto the config last pushed here
//!   when that is the base and still serving, and the result must hash to what the delta
//!   says. A base mismatch, a delta that does not apply or an invalid result is `Nack`ed;
//!   the controller then sends the full config.
//! * One controller connection at a time: a new connection *replaces* the previous one, which
//!   is closed. A restarted (or newly elected) controller must never be locked out by a
//!   half-dead old connection.

use crate::reload::{Change, Runtime};
use std::io;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use sweety_config::wire::{self, FrameHeader, FrameType, Hello, Message, HEADER_LEN};
use sweety_config::Config;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

/// Counters of the control socket.
#[derive(Debug, Default)]
pub struct ControlStats {
    /// Controller connections accepted.
    pub connections: AtomicU64,
    /// `Apply` frames received.
    pub applies: AtomicU64,
    /// `Ack`s sent.
    pub acks: AtomicU64,
    /// `Nack`s sent (rejected configs and protocol errors).
    pub nacks: AtomicU64,
    /// `ApplyDelta` frames received (also counted in `applies`).
    pub deltas: AtomicU64,
}

/// A running control socket. Dropping it stops accepting, closes the controller connection
/// and removes the socket file (if it is still the one this server created).
pub struct ControlServer {
    path: PathBuf,
    inode: (u64, u64),
    stats: Arc<ControlStats>,
    runtime: Arc<Runtime>,
    task: JoinHandle<()>,
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ControlServer {
    /// Creates the socket at `path` (mode 0600) and serves it in the background. Must be
    /// called inside a tokio runtime.
    pub fn bind(runtime: Arc<Runtime>, path: &Path) -> io::Result<ControlServer> {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => {
                tracing::info!(path = %path.display(), "removing a stale control socket");
                std::fs::remove_file(path)?;
            }
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a socket; refusing to replace it",
                        path.display()
                    ),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let name = path.file_name().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a file path", path.display()),
            )
        })?;
        let tmp = path.with_file_name(format!(
            ".{}.{}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        let std_listener = std::os::unix::net::UnixListener::bind(&tmp)?;
        // Restrict before the socket is reachable under its real name.
        let prepared = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = prepared {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let meta = std::fs::symlink_metadata(path)?;
        std_listener.set_nonblocking(true)?;
        let listener = tokio::net::UnixListener::from_std(std_listener)?;
        let stats = Arc::new(ControlStats::default());
        let task = tokio::spawn(accept_loop(runtime.clone(), listener, stats.clone()));
        tracing::info!(path = %path.display(), "control socket listening");
        Ok(ControlServer {
            path: path.to_path_buf(),
            inode: (meta.dev(), meta.ino()),
            stats,
            runtime,
            task,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The counters.
    pub fn stats(&self) -> &ControlStats {
        &self.stats
    }

    /// A copy of the whole config last applied over the socket (the base of the next delta),
    /// with its generation; `None` before the first one or after a rejected delta
    /// ([`Runtime::applied_config`]).
    pub fn applied_config(&self) -> Option<Config> {
        self.runtime.applied_config()
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.task.abort();
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if (m.dev(), m.ino()) == self.inode {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

async fn accept_loop(
    runtime: Arc<Runtime>,
    listener: tokio::net::UnixListener,
    stats: Arc<ControlStats>,
) {
    // Aborted together with this task (the guard is dropped with it).
    let mut current: Option<AbortOnDrop> = None;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "control socket accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        stats.connections.fetch_add(1, Relaxed);
        if current.take().is_some() {
            tracing::info!("a new controller connection replaces the previous one");
        }
        let (rt, st) = (runtime.clone(), stats.clone());
        current = Some(AbortOnDrop(tokio::spawn(async move {
            match session(&rt, &st, stream).await {
                Ok(()) => tracing::info!("controller disconnected"),
                Err(e) => tracing::warn!(error = %e, "controller connection closed"),
            }
        })));
    }
}

fn invalid(e: sweety_config::ParseError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

async fn send(w: &mut (impl tokio::io::AsyncWrite + Unpin), m: &Message) -> io::Result<()> {
    w.write_all(&m.encode().map_err(invalid)?).await
}

async fn session(runtime: &Runtime, stats: &ControlStats, stream: UnixStream) -> io::Result<()> {
    let (rd, mut wr) = stream.into_split();
    // A small frame (an `ApplyDelta` is a few hundred bytes) arrives with its header in one
    // read; a large payload bypasses the buffer (read straight into its own allocation).
    let mut rd = tokio::io::BufReader::with_capacity(16 * 1024, rd);
    let hello = if runtime.shared.ready.load(Relaxed) {
        let snap = runtime.shared.snapshot();
        Hello {
            version: wire::PROTOCOL_VERSION,
            generation: snap.config.generation,
            hash: snap.hash.clone(),
        }
    } else {
        Hello {
            version: wire::PROTOCOL_VERSION,
            generation: 0,
            hash: String::new(),
        }
    };
    send(&mut wr, &Message::Hello(hello)).await?;
    loop {
        let mut hdr = [0u8; HEADER_LEN];
        match rd.read_exact(&mut hdr).await {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            r => r?,
        };
        let header = match FrameHeader::parse(&hdr) {
            Ok(h) if matches!(h.kind, FrameType::Apply | FrameType::ApplyDelta) => h,
            Ok(h) => {
                let msg = format!("unexpected {:?} frame from the controller", h.kind);
                return Err(protocol_error(stats, &mut wr, msg).await);
            }
            // The stream cannot be resynchronised after a bad header: report and close.
            Err(e) => return Err(protocol_error(stats, &mut wr, e.to_string()).await),
        };
        let mut payload = vec![0u8; header.len as usize];
        rd.read_exact(&mut payload).await?;
        stats.applies.fetch_add(1, Relaxed);
        if header.kind == FrameType::ApplyDelta {
            stats.deltas.fetch_add(1, Relaxed);
        }
        let generation = wire::apply_generation(&payload).unwrap_or(0);
        // The payload is dropped as soon as it is decoded, before the config is built.
        let reply = match apply_frame(runtime, header.kind, payload).await {
            Ok(()) => {
                tracing::info!(generation, "pushed config applied");
                Message::Ack { generation }
            }
            Err(errors) => {
                tracing::error!(
                    generation,
                    ?errors,
                    "pushed config rejected; keeping the previous config"
                );
                Message::Nack { generation, errors }
            }
        };
        match &reply {
            Message::Ack { .. } => stats.acks.fetch_add(1, Relaxed),
            _ => stats.nacks.fetch_add(1, Relaxed),
        };
        send(&mut wr, &reply).await?;
    }
}

/// Decodes an `Apply` or `ApplyDelta` payload and applies it; the errors for the `Nack`.
async fn apply_frame(
    runtime: &Runtime,
    kind: FrameType,
    payload: Vec<u8>,
) -> Result<(), Vec<String>> {
    let decoded = Message::decode(kind, &payload);
    drop(payload);
    let change = match decoded {
        Ok(Message::Apply { generation, config }) => Ok(Change::Full { generation, config }),
        Ok(Message::ApplyDelta {
            generation,
            base,
            delta,
        }) => Ok(Change::Delta {
            generation,
            base,
            delta,
        }),
        Ok(other) => Err(format!("unexpected {:?} payload", other.kind())),
        Err(e) => Err(e.to_string()),
    };
    let change = match change {
        Ok(change) => change,
        // Rejected before a change exists: counted here (the runtime counts the rest).
        Err(error) => {
            runtime.shared.metrics.reloads_failed.fetch_add(1, Relaxed);
            return Err(vec![error]);
        }
    };
    runtime.apply(change).await.map_err(|e| e.messages())
}

/// Sends a `Nack` for generation 0 explaining a protocol error, and returns the error that
/// closes the connection.
async fn protocol_error(
    stats: &ControlStats,
    wr: &mut tokio::net::unix::OwnedWriteHalf,
    msg: String,
) -> io::Error {
    stats.nacks.fetch_add(1, Relaxed);
    let nack = Message::Nack {
        generation: 0,
        errors: vec![msg.clone()],
    };
    let _ = send(wr, &nack).await;
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reload::RuntimeOptions;
    use sweety_config::wire::{decode_frame, MAX_FRAME_BYTES};
    use sweety_config::*;

    fn runtime() -> Arc<Runtime> {
        let opts = RuntimeOptions {
            access_log: AccessLog {
                enabled: false,
                ..AccessLog::default()
            },
            ..RuntimeOptions::default()
        };
        Arc::new(Runtime::new(opts).unwrap())
    }

    /// Reads one frame with a deadline.
    async fn read_msg(s: &mut UnixStream) -> Option<Message> {
        let mut buf = Vec::new();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if let Some((m, _)) = decode_frame(&buf).unwrap() {
                return Some(m);
            }
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, s.read(&mut chunk))
                .await
                .expect("frame within 5 s")
                .unwrap();
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    #[tokio::test]
    async fn socket_is_0600_and_stale_sockets_are_replaced_but_files_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let first = ControlServer::bind(runtime(), &path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
        // A socket left behind (the old server is still bound) is replaced.
        let second = ControlServer::bind(runtime(), &path).unwrap();
        assert!(UnixStream::connect(&path).await.is_ok());
        drop(first); // Not its file any more: it must not remove the new server's socket.
        assert!(path.exists());
        drop(second);
        assert!(!path.exists(), "the socket file is removed on drop");

        let file = dir.path().join("not-a-socket");
        std::fs::write(&file, "data").unwrap();
        let err = ControlServer::bind(runtime(), &file)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "data");
    }

    #[tokio::test]
    async fn hello_apply_ack_and_nack_keep_the_last_good_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let rt = runtime();
        let server = ControlServer::bind(rt.clone(), &path).unwrap();
        let mut s = UnixStream::connect(&path).await.unwrap();
        let Some(Message::Hello(h)) = read_msg(&mut s).await else {
            panic!("hello first")
        };
        assert_eq!((h.version, h.generation, h.hash.as_str()), (1, 0, ""));

        let cfg = Config::from_yaml(
            "listeners: [{name: web, address: 127.0.0.1, port: 0, protocol: http, http3: false}]",
        )
        .unwrap();
        let apply = Message::Apply {
            generation: 5,
            config: Box::new(cfg.clone()),
        };
        s.write_all(&apply.encode().unwrap()).await.unwrap();
        assert_eq!(read_msg(&mut s).await, Some(Message::Ack { generation: 5 }));
        assert_eq!(rt.shared.snapshot().config.generation, 5);

        let mut bad = cfg.clone();
        bad.listeners[0].name = String::new();
        let apply = Message::Apply {
            generation: 6,
            config: Box::new(bad),
        };
        s.write_all(&apply.encode().unwrap()).await.unwrap();
        let Some(Message::Nack { generation, errors }) = read_msg(&mut s).await else {
            panic!("nack")
        };
        assert_eq!(generation, 6);
        assert!(
            errors.iter().any(|e| e.starts_with("listeners[0].name")),
            "{errors:?}"
        );
        assert_eq!(rt.shared.snapshot().config.generation, 5, "last good kept");

        // A payload that is not a config: Nack with the generation, connection stays open.
        let mut frame = FrameHeader {
            kind: FrameType::Apply,
            len: 10,
        }
        .encode()
        .to_vec();
        frame.extend_from_slice(&7u64.to_be_bytes());
        frame.extend_from_slice(b"{]");
        s.write_all(&frame).await.unwrap();
        let Some(Message::Nack { generation, errors }) = read_msg(&mut s).await else {
            panic!("nack")
        };
        assert_eq!(generation, 7);
        assert!(errors[0].starts_with("invalid JSON config"), "{errors:?}");

        // A reconnect gets a Hello with what runs now.
        drop(s);
        let mut s = UnixStream::connect(&path).await.unwrap();
        let Some(Message::Hello(h)) = read_msg(&mut s).await else {
            panic!("hello")
        };
        let mut expect = cfg.clone();
        expect.generation = 5;
        assert_eq!((h.generation, h.hash), (5, expect.content_hash()));
        let st = server.stats();
        assert_eq!(st.applies.load(Relaxed), 3);
        assert_eq!(st.acks.load(Relaxed), 1);
        assert_eq!(st.nacks.load(Relaxed), 2);
    }

    /// The base of a delta is the config last applied here, as the generation it was applied
    /// as (kept in the config itself): a delta naming that generation applies, one naming
    /// another is refused without consuming the base.
    #[tokio::test]
    async fn a_delta_applies_only_on_the_generation_applied_last() {
        use sweety_config::delta::{ConfigDelta, Digests};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let rt = runtime();
        let server = ControlServer::bind(rt.clone(), &path).unwrap();
        let mut s = UnixStream::connect(&path).await.unwrap();
        assert!(matches!(read_msg(&mut s).await, Some(Message::Hello(_))));
        let v1 = Config::from_yaml(
            "listeners: [{name: web, address: 127.0.0.1, port: 0, protocol: http, http3: false}]\n\
             virtual_hosts: [{name: a, hostnames: [a.test], routes: [{name: r, \
             action: {fixed: {status: 200, body: x}}}]}]",
        )
        .unwrap();
        let apply = Message::Apply {
            generation: 3,
            config: Box::new(v1.clone()),
        };
        s.write_all(&apply.encode().unwrap()).await.unwrap();
        assert_eq!(read_msg(&mut s).await, Some(Message::Ack { generation: 3 }));
        assert_eq!(server.applied_config().map(|c| c.generation), Some(3));

        let step = |from: &Config, host: &str| {
            let mut to = from.clone();
            to.virtual_hosts[0].hostnames.push(host.into());
            let (fd, td) = (Digests::of(from), Digests::of(&to));
            (ConfigDelta::between(from, &fd, &to, &td).unwrap(), to)
        };
        let (d, v2) = step(&v1, "b.test");
        // Against a generation that is not the one applied last: refused, base kept.
        let frame = wire::encode_apply_delta(4, 2, &d).unwrap();
        s.write_all(&frame).await.unwrap();
        let Some(Message::Nack { generation, errors }) = read_msg(&mut s).await else {
            panic!("nack")
        };
        assert_eq!(generation, 4);
        assert!(
            errors[0].contains("delta against generation 2"),
            "{errors:?}"
        );
        assert_eq!(server.applied_config().map(|c| c.generation), Some(3));
        // Against generation 3: applied, and the result is the base of the next one.
        let frame = wire::encode_apply_delta(4, 3, &d).unwrap();
        s.write_all(&frame).await.unwrap();
        assert_eq!(read_msg(&mut s).await, Some(Message::Ack { generation: 4 }));
        let (d, v3) = step(&v2, "c.test");
        let frame = wire::encode_apply_delta(5, 4, &d).unwrap();
        s.write_all(&frame).await.unwrap();
        assert_eq!(read_msg(&mut s).await, Some(Message::Ack { generation: 5 }));
        let mut want = v3;
        want.generation = 5;
        assert_eq!(server.applied_config(), Some(want));
        assert_eq!(rt.shared.snapshot().config.generation, 5);
        rt.shutdown().await;
    }

    #[tokio::test]
    async fn oversized_frame_is_rejected_from_its_header_and_the_connection_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let _server = ControlServer::bind(runtime(), &path).unwrap();
        let mut s = UnixStream::connect(&path).await.unwrap();
        assert!(matches!(read_msg(&mut s).await, Some(Message::Hello(_))));
        let header = FrameHeader {
            kind: FrameType::Apply,
            len: 0,
        }
        .encode();
        let mut big = header;
        big[4..8].copy_from_slice(&(MAX_FRAME_BYTES + 1).to_be_bytes());
        // Only the header is sent: the server must not wait for (or allocate) the payload.
        s.write_all(&big).await.unwrap();
        let Some(Message::Nack { generation, errors }) = read_msg(&mut s).await else {
            panic!("nack")
        };
        assert_eq!(generation, 0);
        assert!(errors[0].contains("too large"), "{errors:?}");
        assert_eq!(read_msg(&mut s).await, None, "connection closed");
    }

    #[tokio::test]
    async fn a_second_controller_connection_replaces_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let server = ControlServer::bind(runtime(), &path).unwrap();
        let mut a = UnixStream::connect(&path).await.unwrap();
        assert!(matches!(read_msg(&mut a).await, Some(Message::Hello(_))));
        let mut b = UnixStream::connect(&path).await.unwrap();
        assert!(matches!(read_msg(&mut b).await, Some(Message::Hello(_))));
        assert_eq!(read_msg(&mut a).await, None, "the first one is closed");
        let ack = Message::Apply {
            generation: 1,
            config: Box::new(Config::default()),
        };
        b.write_all(&ack.encode().unwrap()).await.unwrap();
        assert_eq!(read_msg(&mut b).await, Some(Message::Ack { generation: 1 }));
        assert_eq!(server.stats().connections.load(Relaxed), 2);
    }

    #[tokio::test]
    async fn admin_config_does_not_expose_private_keys() {
        let rt = runtime();
        let (cert, key) = crate::tls::self_signed(&["a.example"]).unwrap();
        let mut cfg = Config::from_yaml(
            "listeners: [{name: tls, address: 127.0.0.1, port: 0, protocol: https, http3: false, \
             tls: {certificates: []}}]",
        )
        .unwrap();
        cfg.listeners[0]
            .tls
            .as_mut()
            .unwrap()
            .certificates
            .push(Certificate {
                hostnames: vec!["a.example".into()],
                cert: PemSource::Pem(cert),
                key: PemSource::Pem(key.clone()),
            });
        rt.apply(cfg).await.unwrap();
        let req = http::Request::get("/config").body(()).unwrap();
        let resp = crate::admin::respond(&rt.shared, &req);
        use http_body_util::BodyExt as _;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("\"hash\""), "{text}");
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        let key_line = key.lines().nth(1).unwrap();
        assert!(!text.contains(key_line), "{text}");
        rt.shutdown().await;
    }

    /// Benchmark (not run by default): the dataplane side of a 5,000-route push (decode,
    /// validate, build, swap) and of a one-route change of it, plus the controller-side
    /// content hash and encode. `cargo test -p sweety-dataplane --release --lib
    /// control::tests::bench -- --ignored --nocapture`; results in docs/control-protocol.md.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore]
    async fn bench_apply_5000_routes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let _server = ControlServer::bind(runtime(), &path).unwrap();
        let mut s = UnixStream::connect(&path).await.unwrap();
        assert!(matches!(read_msg(&mut s).await, Some(Message::Hello(_))));
        let base = Config::from_yaml(
            "listeners: [{name: web, address: 127.0.0.1, port: 0, protocol: http, http3: false}]\n\
             virtual_hosts: [{name: app, routes: [{name: all, matches: [{path: {prefix: /}}], \
             action: {fixed: {status: 200, body: x}}}]}]",
        )
        .unwrap();
        let template = base.virtual_hosts[0].clone();
        let mut times = Vec::new();
        for round in 0..10u64 {
            let mut c = base.clone();
            c.virtual_hosts = (0..5000)
                .map(|i| {
                    let mut v = template.clone();
                    v.name = format!("ns-{}/route-{i}", i % 50);
                    v.hostnames = vec![format!("app-{i}.example.com")];
                    v.routes[0].name = format!("ns-{}/route-{i}/rule-0", i % 50);
                    v.routes[0].matches[0].path = Some(PathMatch::Prefix(format!(
                        "/api/v{}/",
                        (i + round as usize) % 7
                    )));
                    v
                })
                .collect();
            let t = std::time::Instant::now();
            let _hash = c.content_hash();
            let hashed = t.elapsed();
            let frame = wire::encode_apply(round + 1, &c).unwrap();
            let encoded = t.elapsed();
            s.write_all(&frame).await.unwrap();
            assert_eq!(
                read_msg(&mut s).await,
                Some(Message::Ack {
                    generation: round + 1
                })
            );
            times.push((t.elapsed(), hashed, encoded));
        }
        times.sort();
        let (total, hashed, encoded) = times[5];
        println!(
            "5000 routes: hash {hashed:?}, hash+encode {encoded:?}, hash+encode+send+decode+\
             validate+apply+ack {total:?} (p50 of 10)"
        );

        // One-route deltas against what was applied last (generation 10): the dataplane side
        // of a single route change (send, decode, apply, validate, build, swap, Ack).
        let mut cur = base.clone();
        cur.virtual_hosts = (0..5000)
            .map(|i| {
                let mut v = template.clone();
                v.name = format!("ns-{}/route-{i}", i % 50);
                v.hostnames = vec![format!("app-{i}.example.com")];
                v.routes[0].name = format!("ns-{}/route-{i}/rule-0", i % 50);
                v.routes[0].matches[0].path =
                    Some(PathMatch::Prefix(format!("/api/v{}/", (i + 9) % 7)));
                v
            })
            .collect();
        let mut cur_d = sweety_config::delta::Digests::of(&cur);
        let mut lat = Vec::new();
        for k in 0..300u64 {
            let mut next = cur.clone();
            let i = (k as usize * 7919) % 5000;
            next.virtual_hosts[i].routes[0].matches[0].path =
                Some(PathMatch::Prefix(format!("/changed/{k}")));
            let next_d = sweety_config::delta::Digests::reuse(&next, &cur, &cur_d);
            let delta =
                sweety_config::delta::ConfigDelta::between(&cur, &cur_d, &next, &next_d).unwrap();
            let frame = wire::encode_apply_delta(11 + k, 10 + k, &delta).unwrap();
            let t = std::time::Instant::now();
            s.write_all(&frame).await.unwrap();
            assert_eq!(
                read_msg(&mut s).await,
                Some(Message::Ack { generation: 11 + k })
            );
            lat.push(t.elapsed());
            (cur, cur_d) = (next, next_d);
        }
        lat.sort();
        println!(
            "5000 virtual hosts, one-route delta: send+decode+apply+validate+build+swap+ack \
             p50 {:?} p99 {:?} (of {})",
            lat[lat.len() / 2],
            lat[lat.len() * 99 / 100],
            lat.len()
        );
    }
}
