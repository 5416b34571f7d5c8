//! WebSocket echo benchmark tool for e2e/bench/run.sh (the `ws-h1` cell):
//!
//! * `ws_bench server ADDR`: an echo WebSocket server (the backend behind the proxies);
//! * `ws_bench client URL CONNS SECONDS SIZE`: CONNS connections each send a SIZE-byte binary
//!   message and wait for its echo, in a loop, for SECONDS; prints one JSON line with
//!   messages/s (`rps`), `done`, `failed` and the p99 round trip in ms;
//! * `ws_bench probe URL`: one 64-byte echo; prints `101 64B` on success.
//!
//! Single-threaded (current-thread runtime) so it stays on the CPU it is pinned to.

use futures_util::{SinkExt, StreamExt};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(async move {
        match args.first().map(String::as_str) {
            Some("server") if args.len() == 2 => server(&args[1]).await,
            Some("client") if args.len() == 5 => {
                let n = args[2].parse().unwrap_or(50);
                let secs = args[3].parse().unwrap_or(8);
                let size = args[4].parse().unwrap_or(64);
                client(&args[1], n, Duration::from_secs(secs), size).await
            }
            Some("probe") if args.len() == 2 => probe(&args[1]).await,
            _ => {
                eprintln!(
                    "usage: ws_bench server ADDR | client URL CONNS SECONDS SIZE | probe URL"
                );
                2
            }
        }
    });
    std::process::exit(code);
}

async fn server(addr: &str) -> i32 {
    let l = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("bind {addr}: {e}");
            return 1;
        }
    };
    loop {
        let Ok((s, _)) = l.accept().await else {
            continue;
        };
        let _ = s.set_nodelay(true);
        tokio::spawn(async move {
            let Ok(mut ws) = tokio_tungstenite::accept_async(s).await else {
                return;
            };
            while let Some(Ok(m)) = ws.next().await {
                if m.is_binary() || m.is_text() {
                    if ws.send(m).await.is_err() {
                        return;
                    }
                } else if m.is_close() {
                    return;
                }
            }
        });
    }
}

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn connect(url: &str) -> Result<Ws, String> {
    let rest = url
        .strip_prefix("ws://")
        .ok_or_else(|| format!("{url}: only ws:// URLs"))?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let tcp = tokio::net::TcpStream::connect(hostport)
        .await
        .map_err(|e| format!("connect {hostport}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let (ws, _) = tokio_tungstenite::client_async(url, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    Ok(ws)
}

async fn echo_once(ws: &mut Ws, payload: &[u8]) -> Result<(), String> {
    ws.send(Message::binary(payload.to_vec()))
        .await
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
        Ok(Some(Ok(m))) if m.is_binary() && m.len() == payload.len() => Ok(()),
        Ok(other) => Err(format!("unexpected reply {other:?}")),
        Err(_) => Err("no echo within 5 s".into()),
    }
}

async fn probe(url: &str) -> i32 {
    let r = tokio::time::timeout(Duration::from_secs(5), async {
        let mut ws = connect(url).await?;
        echo_once(&mut ws, &[7u8; 64]).await
    })
    .await;
    match r {
        Ok(Ok(())) => {
            println!("101 64B");
            0
        }
        Ok(Err(e)) => {
            println!("error: {e}");
            1
        }
        Err(_) => {
            println!("error: timeout");
            1
        }
    }
}

async fn client(url: &str, conns: usize, dur: Duration, size: usize) -> i32 {
    let start = Instant::now();
    let deadline = start + dur;
    let mut tasks = Vec::with_capacity(conns);
    for _ in 0..conns {
        let url = url.to_string();
        tasks.push(tokio::spawn(async move {
            let mut lat_us: Vec<u32> = Vec::new();
            let mut failed = 0u64;
            let payload = vec![b'x'; size];
            let mut ws = match connect(&url).await {
                Ok(ws) => ws,
                Err(_) => return (lat_us, 1),
            };
            while Instant::now() < deadline {
                let t = Instant::now();
                match echo_once(&mut ws, &payload).await {
                    Ok(()) => lat_us.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32),
                    Err(_) => {
                        failed += 1;
                        break;
                    }
                }
            }
            let _ = ws.close(None).await;
            (lat_us, failed)
        }));
    }
    let mut all: Vec<u32> = Vec::new();
    let mut failed = 0u64;
    for t in tasks {
        if let Ok((l, f)) = t.await {
            all.extend(l);
            failed += f;
        } else {
            failed += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64().max(dur.as_secs_f64());
    all.sort_unstable();
    let p99 = if all.is_empty() {
        None
    } else {
        let i = ((all.len() as f64) * 0.99).ceil() as usize;
        Some(f64::from(all[i.saturating_sub(1).min(all.len() - 1)]) / 1000.0)
    };
    println!(
        "{}",
        serde_json::json!({
            "rps": all.len() as f64 / secs,
            "done": all.len(),
            "failed": failed,
            "p99_ms": p99,
        })
    );
    0
}
