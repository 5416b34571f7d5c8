//! HTTP/3 load client for e2e/bench/callgrind.sh's h3 cells, where oha (built with its `http3`
//! feature) is not at hand: `OHA=target/release/examples/h3_bench callgrind.sh ...`.
//!
//! It takes the part of oha's command line those cells use, `-c CONNS -p STREAMS -n REQUESTS
//! URL` (oha's other flags of the script, `--http-version 3 --insecure --no-tui --output-format
//! json`, are accepted and ignored; `--connect-timeout T` is its deadline), and does what oha does
//! with them: CONNS QUIC connections (quinn's default transport settings, TLS 1.3, ALPN h3), each
//! with STREAMS requests in flight, GET URL until REQUESTS have been sent in all; every body is
//! read to its end. It prints oha's JSON summary field the script reads,
//! `{"statusCodeDistribution": {"200": N, ...}}`, plus `errors`.
//!
//! Benchmarks only: the server's certificate is not verified (oha's `--insecure`); it connects to
//! the URL's literal IP address. Single-threaded (current-thread runtime), so it stays on the
//! CPU it is pinned to. Bounded: every connection and request has a deadline, `--connect-timeout`
//! (`120s` or `120`, seconds, at most an hour; default 120 s): a window of 1,000 concurrent 100 KB
//! responses from a server under valgrind on a loaded machine takes minutes, and all of them end
//! near its end.

use bytes::{Buf, Bytes};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The longest a handshake or one request may take unless `--connect-timeout` says otherwise.
const DEADLINE: Duration = Duration::from_secs(120);
/// The longest `--connect-timeout` accepted.
const MAX_DEADLINE: Duration = Duration::from_secs(3600);

/// What one run is asked to do.
struct Args {
    conns: usize,
    streams: usize,
    requests: usize,
    url: String,
    /// Each handshake's and each request's deadline.
    deadline: Duration,
}

/// A `--connect-timeout` value: whole seconds, `120s` or `120`, 1 s to an hour.
fn parse_deadline(v: &str) -> Result<Duration, String> {
    let secs: u64 = v
        .strip_suffix('s')
        .unwrap_or(v)
        .parse()
        .map_err(|e| format!("--connect-timeout {v}: {e}"))?;
    let d = Duration::from_secs(secs);
    if secs == 0 || d > MAX_DEADLINE {
        return Err(format!("--connect-timeout {v}: must be 1s to 3600s"));
    }
    Ok(d)
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        conns: 50,
        streams: 1,
        requests: 200,
        url: String::new(),
        deadline: DEADLINE,
    };
    let mut i = 0;
    while i < args.len() {
        let value = |i: usize| {
            args.get(i + 1)
                .ok_or_else(|| format!("{} needs a value", args[i]))
        };
        let num = |i: usize| -> Result<usize, String> {
            value(i)?.parse().map_err(|e| format!("{}: {e}", args[i]))
        };
        match args[i].as_str() {
            "-c" => a.conns = num(i)?,
            "-p" => a.streams = num(i)?,
            "-n" => a.requests = num(i)?,
            "--connect-timeout" => a.deadline = parse_deadline(value(i)?)?,
            "--http-version" | "--output-format" => {
                value(i)?;
            }
            "--insecure" | "--no-tui" => {
                i += 1;
                continue;
            }
            url if url.starts_with("https://") => {
                a.url = url.to_string();
                i += 1;
                continue;
            }
            other => return Err(format!("unknown argument {other}")),
        }
        i += 2;
    }
    if a.url.is_empty() || a.conns == 0 || a.streams == 0 {
        return Err("usage: h3_bench -c CONNS -p STREAMS -n REQUESTS https://IP:PORT/PATH".into());
    }
    Ok(a)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(run(args));
    std::process::exit(code);
}

/// The server's address (the URL's literal IP and port) and the URL's host for SNI.
fn target(url: &str) -> Result<(SocketAddr, String), String> {
    let rest = url.strip_prefix("https://").unwrap_or(url);
    let hostport = rest.split('/').next().unwrap_or(rest);
    let addr: SocketAddr = hostport
        .parse()
        .map_err(|e| format!("{hostport}: not IP:PORT ({e})"))?;
    Ok((addr, addr.ip().to_string()))
}

async fn run(args: Args) -> i32 {
    let (addr, host) = match target(&args.url) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let mut endpoint = match quinn::Endpoint::client("127.0.0.1:0".parse().expect("address")) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("client socket: {e}");
            return 1;
        }
    };
    endpoint.set_default_client_config(client_config());
    let left = Arc::new(AtomicUsize::new(args.requests));
    let url: Arc<str> = args.url.into();
    let mut conns = tokio::task::JoinSet::new();
    for _ in 0..args.conns.min(args.requests) {
        let (endpoint, host, left, url) =
            (endpoint.clone(), host.clone(), left.clone(), url.clone());
        conns.spawn(connection(
            endpoint,
            addr,
            host,
            url,
            left,
            args.streams,
            args.deadline,
        ));
    }
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    while let Some(done) = conns.join_next().await {
        let (s, e) = done.unwrap_or_else(|e| (Vec::new(), vec![format!("task: {e}")]));
        for code in s {
            *statuses.entry(code).or_default() += 1;
        }
        for err in e {
            *errors.entry(err).or_default() += 1;
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), endpoint.wait_idle()).await;
    let statuses: serde_json::Map<String, serde_json::Value> = statuses
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into()))
        .collect();
    println!(
        "{}",
        serde_json::json!({ "statusCodeDistribution": statuses, "errors": errors })
    );
    0
}

/// One connection: `streams` request loops sharing `left`; the statuses and errors it saw.
async fn connection(
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    host: String,
    url: Arc<str>,
    left: Arc<AtomicUsize>,
    streams: usize,
    deadline: Duration,
) -> (Vec<u16>, Vec<String>) {
    let conn = match endpoint.connect(addr, &host) {
        Ok(c) => match tokio::time::timeout(deadline, c).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return (Vec::new(), vec![format!("handshake: {e}")]),
            Err(_) => return (Vec::new(), vec!["handshake timed out".into()]),
        },
        Err(e) => return (Vec::new(), vec![format!("connect: {e}")]),
    };
    let (mut driver, send) = match h3::client::new(h3_quinn::Connection::new(conn.clone())).await {
        Ok(h) => h,
        Err(e) => return (Vec::new(), vec![format!("h3: {e}")]),
    };
    let drive = tokio::spawn(async move {
        let _ = driver.wait_idle().await;
    });
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..streams {
        let (mut send, left, url) = (send.clone(), left.clone(), url.clone());
        loops.spawn(async move {
            let (mut ok, mut errs) = (Vec::new(), Vec::new());
            // One ticket per request, until none is left.
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                match tokio::time::timeout(deadline, get(&mut send, &url)).await {
                    Ok(Ok(status)) => ok.push(status),
                    Ok(Err(e)) => errs.push(e),
                    Err(_) => errs.push("request timed out".into()),
                }
            }
            (ok, errs)
        });
    }
    drop(send);
    let (mut ok, mut errs) = (Vec::new(), Vec::new());
    while let Some(done) = loops.join_next().await {
        match done {
            Ok((o, e)) => {
                ok.extend(o);
                errs.extend(e);
            }
            Err(e) => errs.push(format!("task: {e}")),
        }
    }
    conn.close(quinn::VarInt::from_u32(0x100), b""); // H3_NO_ERROR
    drive.abort();
    (ok, errs)
}

/// One GET, its body read to the end: the status.
async fn get(
    send: &mut h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    url: &str,
) -> Result<u16, String> {
    let req = http::Request::get(url)
        .body(())
        .map_err(|e| e.to_string())?;
    let mut s = send.send_request(req).await.map_err(|e| e.to_string())?;
    s.finish().await.map_err(|e| e.to_string())?;
    let resp = s.recv_response().await.map_err(|e| e.to_string())?;
    while let Some(mut d) = s.recv_data().await.map_err(|e| e.to_string())? {
        d.advance(d.remaining());
    }
    Ok(resp.status().as_u16())
}

/// quinn's default client settings with TLS 1.3 (ring), ALPN h3, and no certificate check.
fn client_config() -> quinn::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(sweety_dataplane::proxy::tls::NoVerifier::new(
            provider,
        )))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC TLS config");
    quinn::ClientConfig::new(Arc::new(crypto))
}
