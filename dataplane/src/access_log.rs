//! JSON-lines access log written off the request path.
//!
//! Requests hand a small [`LogLine`] to a bounded channel with `try_send`; a writer task
//! formats and writes them. When the writer falls behind the channel fills, lines are dropped
//! and counted in `sweety_access_log_dropped_total`: a request never waits for the log.

use crate::metrics::Metrics;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::mpsc;

/// One access log record.
#[derive(Debug, Serialize)]
pub struct LogLine {
    /// Unix time of the request start, milliseconds.
    pub ts_ms: u64,
    /// Listener name.
    pub listener: Arc<str>,
    /// Client address.
    pub client: std::net::SocketAddr,
    /// Protocol label (`HTTP/1.1`, `HTTP/2`, `HTTP/3`).
    pub protocol: &'static str,
    /// Method.
    pub method: String,
    /// Host.
    pub host: String,
    /// Path and query.
    pub path: String,
    /// Response status.
    pub status: u16,
    /// Route name (`-` when none matched).
    pub route: Arc<str>,
    /// Response body bytes sent.
    pub bytes: u64,
    /// Microseconds from request start to the end of the response body.
    pub duration_us: u64,
    /// User agent, when sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
}

/// The sending half of the access log. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AccessLog {
    tx: Option<mpsc::Sender<LogLine>>,
    metrics: Arc<Metrics>,
}

impl AccessLog {
    /// A logger that drops everything (access log disabled).
    pub fn disabled(metrics: Arc<Metrics>) -> AccessLog {
        AccessLog { tx: None, metrics }
    }

    /// Starts a writer task appending to `path` (standard output when `None`), queueing at
    /// most `buffer` lines. Must be called inside a tokio runtime.
    pub fn start(
        path: Option<PathBuf>,
        buffer: usize,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<AccessLog> {
        let out: Box<dyn Write + Send> = match &path {
            Some(p) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            ),
            None => Box::new(std::io::stdout()),
        };
        let (tx, rx) = mpsc::channel(buffer.max(1));
        // The writer does blocking writes, so it runs on its own thread, not on a runtime worker.
        std::thread::Builder::new()
            .name("sweety-access-log".into())
            .spawn(move || writer(rx, out))?;
        Ok(AccessLog {
            tx: Some(tx),
            metrics,
        })
    }

    /// True when lines are being written.
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues a line, or drops and counts it when the writer is behind.
    pub fn log(&self, line: LogLine) {
        if let Some(tx) = &self.tx {
            if tx.try_send(line).is_err() {
                self.metrics.access_log_dropped.fetch_add(1, Relaxed);
            }
        }
    }
}

fn writer(mut rx: mpsc::Receiver<LogLine>, out: Box<dyn Write + Send>) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    while let Some(line) = rx.blocking_recv() {
        let mut write_one = |l: &LogLine| {
            let _ = serde_json::to_writer(&mut out, l);
            let _ = out.write_all(b"\n");
        };
        write_one(&line);
        // Drain what is queued before flushing, so bursts are written in one go.
        while let Ok(l) = rx.try_recv() {
            write_one(&l);
        }
        let _ = out.flush();
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(i: u16) -> LogLine {
        LogLine {
            ts_ms: 1,
            listener: "web".into(),
            client: "127.0.0.1:5000".parse().unwrap(),
            protocol: "HTTP/1.1",
            method: "GET".into(),
            host: "example.com".into(),
            path: format!("/p/{i}"),
            status: 200,
            route: "r".into(),
            bytes: 12,
            duration_us: 5,
            user_agent: None,
        }
    }

    #[tokio::test]
    async fn writes_json_lines_to_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("access.log");
        let m = Arc::new(Metrics::default());
        let log = AccessLog::start(Some(p.clone()), 16, m).unwrap();
        log.log(line(1));
        log.log(line(2));
        drop(log);
        let mut text = String::new();
        for _ in 0..100 {
            text = std::fs::read_to_string(&p).unwrap_or_default();
            if text.lines().count() == 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["path"], "/p/2");
        assert_eq!(lines[0]["status"], 200);
    }

    #[tokio::test]
    async fn drops_and_counts_when_the_writer_is_behind() {
        let m = Arc::new(Metrics::default());
        // A channel nobody reads: the second line cannot be queued.
        let (tx, _rx) = mpsc::channel(1);
        let log = AccessLog {
            tx: Some(tx),
            metrics: m.clone(),
        };
        log.log(line(1));
        log.log(line(2));
        log.log(line(3));
        assert_eq!(m.access_log_dropped.load(Relaxed), 2);
    }
}
