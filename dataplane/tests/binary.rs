//! Tests of the `sweety-dataplane` binary itself: `validate` exit codes and output, and
//! `run --config` reloading when the file changes and on SIGHUP, keeping the last good config
//! when the file turns invalid.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

fn get(port: u16) -> Option<String> {
    let out = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "2",
            &format!("http://127.0.0.1:{port}/"),
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Polls until `get` answers `want`, for at most `limit`.
fn wait_for(port: u16, want: &str, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if get(port).as_deref() == Some(want) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn validate_prints_every_error_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, config(8080, "ok")).unwrap();
    let out = Command::new(BIN)
        .arg("validate")
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let bad = dir.path().join("bad.yaml");
    let text = config(8080, "ok").replace("protocol: http", "protocol: https")
        + "limits: {max_connections: 0}\n";
    std::fs::write(&bad, text).unwrap();
    let out = Command::new(BIN)
        .arg("validate")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("listeners[0].tls"), "{stdout}");
    assert!(stdout.contains("limits.max_connections"), "{stdout}");
}

#[test]
fn run_reloads_on_file_change_and_sighup_and_keeps_the_last_good_config() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sweety.yaml");
    let port = free_port();
    std::fs::write(&file, config(port, "one")).unwrap();
    let mut child = Command::new(BIN)
        .args([
            "run",
            "--workers",
            "1",
            "--admin",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let result = std::panic::catch_unwind(|| {
        assert!(
            wait_for(port, "one", Duration::from_secs(10)),
            "first config not served"
        );
        // A changed file is picked up by the watcher (polled every second).
        std::fs::write(&file, config(port, "two")).unwrap();
        assert!(
            wait_for(port, "two", Duration::from_secs(10)),
            "file change not applied"
        );
        // SIGHUP reloads on its own: "six" has the same size as "two" and the file keeps its
        // modification time, so the watcher sees no change and only the signal can apply it.
        // Written beside it with the old stamp, then renamed over it in one step.
        let next = dir.path().join("next.yaml");
        std::fs::write(&next, config(port, "six")).unwrap();
        assert!(Command::new("touch")
            .arg("-r")
            .arg(&file)
            .arg(&next)
            .status()
            .unwrap()
            .success());
        std::fs::rename(&next, &file).unwrap();
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(
            get(port).as_deref(),
            Some("two"),
            "watcher reloaded an unchanged stamp"
        );
        let _ = Command::new("kill")
            .args(["-HUP", &child.id().to_string()])
            .status();
        assert!(
            wait_for(port, "six", Duration::from_secs(10)),
            "SIGHUP reload not applied"
        );
        // An invalid file is rejected; the last good config keeps serving.
        std::fs::write(&file, "listeners: [{name: web, port: 1, protocol: nope}]\n").unwrap();
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(get(port).as_deref(), Some("six"));
    });
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let exited = child.try_wait().unwrap();
    if exited.is_none() {
        let _ = child.kill();
    }
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    if let Err(e) = result {
        panic!("{e:?}\nstderr:\n{stderr}");
    }
    assert!(exited.is_some(), "did not exit on SIGTERM");
    assert!(stderr.contains("keeping the previous config"), "{stderr}");
    // Piped, not a terminal: no ANSI colour codes in the log (issue 21).
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}
