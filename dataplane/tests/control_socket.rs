//! Tests of `sweety-dataplane --control-socket PATH` as a process: starting without a config
//! (not ready until the first push), starting from `run --config FILE` (the Hello reports the
//! file's generation and hash), and refusing a path that is not a socket.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use sweety_config::wire::{decode_frame, encode_apply, Message};
use sweety_config::Config;

const BIN: &str = env!("CARGO_BIN_EXE_sweety-dataplane");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn config(port: u16, body: &str) -> String {
    format!(
        "listeners:\n  - {{name: web, address: 127.0.0.1, port: {port}, protocol: http}}\n\
         virtual_hosts:\n  - name: v\n    routes:\n      - name: r\n        \
         action: {{fixed: {{status: 200, body: \"{body}\"}}}}\n\
         access_log: {{enabled: false}}\n"
    )
}

/// `curl` status code and body of `url` (status 0 when nothing answers).
fn curl(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "2", "-w", "\n%{http_code}", url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Kills the process when dropped, so a failing test leaves nothing running.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(args: &[&str]) -> Proc {
    Proc(
        Command::new(BIN)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Connects once the socket exists (at most 10 s).
fn connect(path: &Path) -> UnixStream {
    let start = Instant::now();
    loop {
        if let Ok(s) = UnixStream::connect(path) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no control socket"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read_msg(s: &mut UnixStream) -> Message {
    let mut buf = Vec::new();
    loop {
        if let Some((m, _)) = decode_frame(&buf).unwrap() {
            return m;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).expect("a frame within 5 s");
        assert!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn without_config_it_is_not_ready_until_the_first_push() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("control.sock");
    let (admin, web) = (free_port(), free_port());
    let admin_addr = format!("127.0.0.1:{admin}");
    let _p = start(&[
        "--control-socket",
        sock.to_str().unwrap(),
        "run",
        "--admin",
        &admin_addr,
    ]);
    let mut s = connect(&sock);
    let Message::Hello(h) = read_msg(&mut s) else {
        panic!("Hello first")
    };
    assert_eq!((h.generation, h.hash.as_str()), (0, ""));
    assert_eq!(curl(&format!("http://{admin_addr}/readyz")).0, 503);

    let cfg = Config::from_yaml(&config(web, "pushed")).unwrap();
    s.write_all(&encode_apply(3, &cfg).unwrap()).unwrap();
    assert_eq!(read_msg(&mut s), Message::Ack { generation: 3 });
    assert_eq!(
        curl(&format!("http://127.0.0.1:{web}/")),
        (200, "pushed".into())
    );
    assert_eq!(curl(&format!("http://{admin_addr}/readyz")).0, 200);
    let (_, body) = curl(&format!("http://{admin_addr}/config"));
    assert!(body.contains("\"generation\":3"), "{body}");
}

#[test]
fn with_a_config_file_the_hello_reports_it_and_pushes_replace_it() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("control.sock");
    let file = dir.path().join("sweety.yaml");
    let (admin, web) = (free_port(), free_port());
    let text = format!("generation: 7\n{}", config(web, "from file"));
    std::fs::write(&file, &text).unwrap();
    let _p = start(&[
        "run",
        "--config",
        file.to_str().unwrap(),
        "--control-socket",
        sock.to_str().unwrap(),
        "--admin",
        &format!("127.0.0.1:{admin}"),
    ]);
    let mut s = connect(&sock);
    let Message::Hello(h) = read_msg(&mut s) else {
        panic!("Hello first")
    };
    let from_file = Config::from_yaml(&text).unwrap();
    assert_eq!((h.generation, h.hash), (7, from_file.content_hash()));
    assert_eq!(
        curl(&format!("http://127.0.0.1:{web}/")),
        (200, "from file".into())
    );
    let cfg = Config::from_yaml(&config(web, "pushed")).unwrap();
    s.write_all(&encode_apply(8, &cfg).unwrap()).unwrap();
    assert_eq!(read_msg(&mut s), Message::Ack { generation: 8 });
    assert_eq!(
        curl(&format!("http://127.0.0.1:{web}/")),
        (200, "pushed".into())
    );
}

#[test]
fn a_path_that_is_not_a_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("important.txt");
    std::fs::write(&file, "keep me").unwrap();
    let out = Command::new(BIN)
        .args([
            "--control-socket",
            file.to_str().unwrap(),
            "run",
            "--admin",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}
