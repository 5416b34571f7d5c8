//! Memory bounded by design under bulk load (issue 23): the static-file bytes a connection
//! holds ahead of a slow client stay within `limits.static_read_ahead` plus
//! `UNBUDGETED_CHUNK` per stream, whatever the number of streams and the file size. One
//! HTTP/2 (h2c) client with ten streams of a 1 MiB file reads frame by frame, slower than the
//! server can read the file, while the test samples the process-wide count of file bytes read
//! and not yet released (`static_files::read_ahead_bytes`). Counts, not timings; its own test
//! binary, because the count is process-wide. Bounded in time and count.

mod common;

use common::h2 as raw2;
use common::*;
use std::time::Duration;
use sweety_config::*;
use sweety_dataplane::static_files::{read_ahead_bytes, CHUNK_SIZE, UNBUDGETED_CHUNK};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

const FILE: usize = 1 << 20;
const STREAMS: u32 = 10;
const BUDGET: u32 = 64 * 1024;

#[tokio::test]
async fn a_slow_h2_client_with_ten_streams_holds_one_budget_of_file_bytes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big.bin"), vec![7u8; FILE]).unwrap();
    let route = Route {
        action: Action::Static(StaticSite {
            root: dir.path().to_path_buf(),
            index: vec![],
            try_files: vec![],
            precompressed: false,
            cache_control: None,
            strip_prefix: None,
            hide_dotfiles: true,
        }),
        ..fixed_route("files", "/", "")
    };
    let mut cfg = http_config(vec![vhost("v", &[], vec![route])]);
    cfg.limits.static_read_ahead = BUDGET;
    let h = Harness::start(cfg).await;
    let addr = h.addr("web").await;

    // Windows wide open (2^31-1): only the socket paces the server, not flow control.
    let (mut rd, mut wr) = raw2::open_from("127.0.0.1", addr, &[(0x4, 0x7fff_ffff)]).await;
    let grow = (0x7fff_ffffu32 - 65_535).to_be_bytes();
    wr.write_all(&raw2::frame(raw2::WINDOW_UPDATE, 0, 0, &grow))
        .await
        .unwrap();
    for i in 0..STREAMS {
        let block = raw2::request_block("/big.bin");
        let flags = raw2::END_STREAM | raw2::END_HEADERS;
        wr.write_all(&raw2::frame(raw2::HEADERS, flags, 1 + 2 * i, &block))
            .await
            .unwrap();
    }

    // Read every frame until all ten responses ended, sampling the count before each read;
    // a short pause every 16 frames keeps the client slower than the server.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut data, mut ended, mut max_held, mut frames) = (0usize, 0u32, 0u64, 0u64);
    while ended < STREAMS {
        max_held = max_held.max(read_ahead_bytes());
        let ev = rd.next(deadline).await;
        let raw2::Event::Frame(f) = ev else {
            panic!("connection ended early: {ev:?} after {data} bytes");
        };
        frames += 1;
        match f.ty {
            raw2::SETTINGS if f.flags & raw2::ACK == 0 => {
                wr.write_all(&raw2::frame(raw2::SETTINGS, raw2::ACK, 0, &[]))
                    .await
                    .unwrap();
            }
            raw2::HEADERS => assert_eq!(f.status, Some(200)),
            raw2::DATA => data += f.payload.len(),
            raw2::RST_STREAM | raw2::GOAWAY => panic!("stream reset: {f:?}"),
            _ => {}
        }
        if f.ty == raw2::DATA && f.flags & raw2::END_STREAM != 0 {
            ended += 1;
        }
        if frames % 16 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    assert_eq!(data, FILE * STREAMS as usize, "every response whole");
    let bound = BUDGET as u64 + STREAMS as u64 * UNBUDGETED_CHUNK as u64;
    eprintln!("file bytes held ahead of the client: at most {max_held} (bound {bound})");
    assert!(max_held > 0, "the count saw the file being read");
    assert!(
        max_held <= bound,
        "{max_held} file bytes held ahead of the client, bound {bound} \
         (unbounded it is up to {STREAMS} x {CHUNK_SIZE})"
    );
    // Everything read was released once sent.
    drop((rd, wr));
    assert_eq!(read_ahead_bytes(), 0);
}
