//! Container logs in the kubelet's (CRI) file format, so the logs API can honour `sinceTime`,
//! `sinceSeconds` and `timestamps` (the Gateway API mirror conformance tests read logs since a time).
//!
//! Writing: a container's stdout and stderr are pipes; each is read line by line and appended to the log
//! file as `<RFC 3339 time> <stdout|stderr> <F|P> <text>`: `F` ends a line, `P` is a piece of a line longer
//! than [`MAX_LINE`] (or cut off at the end of the stream). Reading: [`render`] turns such a file back into
//! what `kubectl logs` shows; lines in another format (older files) pass through unchanged. Files are
//! rotated at [`MAX_FILE`] (one old file kept), and a request reads at most the last [`MAX_READ`] bytes.

use k8s_openapi::jiff::Timestamp;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Longest piece of a line written as one record.
pub const MAX_LINE: usize = 16 * 1024;
/// Most of a log file read to answer one request (its end).
pub const MAX_READ: u64 = 32 * 1024 * 1024;
/// Size at which a log file is rotated (one old file is kept as `<name>.1`).
pub const MAX_FILE: u64 = 64 * 1024 * 1024;

/// Formats one record.
pub fn record(ts: Timestamp, stream: &str, full: bool, text: &[u8]) -> Vec<u8> {
    let mut out = format!("{ts} {stream} {} ", if full { 'F' } else { 'P' }).into_bytes();
    out.extend_from_slice(text);
    out.push(b'\n');
    out
}

/// Reads `src` line by line and sends records for `stream` to `tx`, until EOF or a read error.
async fn pump<R: AsyncRead + Unpin>(src: R, stream: &'static str, tx: mpsc::Sender<Vec<u8>>) {
    let mut r = BufReader::with_capacity(MAX_LINE, src);
    let mut line: Vec<u8> = Vec::with_capacity(256);
    while let Ok(buf) = r.fill_buf().await {
        if buf.is_empty() {
            break;
        }
        let room = MAX_LINE - line.len();
        let take = buf.len().min(room);
        match buf[..take].iter().position(|b| *b == b'\n') {
            Some(i) => {
                line.extend_from_slice(&buf[..i]);
                r.consume(i + 1);
                if tx
                    .send(record(Timestamp::now(), stream, true, &line))
                    .await
                    .is_err()
                {
                    return;
                }
                line.clear();
            }
            None => {
                line.extend_from_slice(&buf[..take]);
                r.consume(take);
                if line.len() >= MAX_LINE {
                    if tx
                        .send(record(Timestamp::now(), stream, false, &line))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    line.clear();
                }
            }
        }
    }
    if !line.is_empty() {
        let _ = tx
            .send(record(Timestamp::now(), stream, false, &line))
            .await;
    }
}

/// Appends the records of `stdout` and `stderr` to the file `path` until both streams end. A file that grows
/// past [`MAX_FILE`] is renamed to `<path>.1` (replacing the previous one) and a new one started.
pub async fn write<O, E>(stdout: O, stderr: E, path: std::path::PathBuf)
where
    O: AsyncRead + Unpin + Send + 'static,
    E: AsyncRead + Unpin + Send + 'static,
{
    write_rotating(stdout, stderr, path, MAX_FILE).await
}

async fn write_rotating<O, E>(stdout: O, stderr: E, path: std::path::PathBuf, max_file: u64)
where
    O: AsyncRead + Unpin + Send + 'static,
    E: AsyncRead + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(256);
    tokio::spawn(pump(stdout, "stdout", tx.clone()));
    tokio::spawn(pump(stderr, "stderr", tx));
    let mut file = open(&path).await;
    let mut size = match &file {
        Some(f) => f.metadata().await.map(|m| m.len()).unwrap_or(0),
        None => 0,
    };
    while let Some(rec) = rx.recv().await {
        if size + rec.len() as u64 > max_file {
            if let Some(mut f) = file.take() {
                let _ = f.flush().await;
            }
            let mut rotated = path.clone().into_os_string();
            rotated.push(".1");
            let _ = tokio::fs::rename(&path, &rotated).await;
            file = open(&path).await;
            size = 0;
        }
        // On a write error the records are dropped, but the pipes keep being drained so the container never
        // blocks on a full pipe.
        if let Some(f) = file.as_mut() {
            if f.write_all(&rec).await.is_ok() {
                size += rec.len() as u64;
            }
        }
    }
    if let Some(mut f) = file {
        let _ = f.flush().await;
    }
}

async fn open(path: &std::path::Path) -> Option<tokio::fs::File> {
    match tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await
    {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "container log file");
            None
        }
    }
}

/// What a log request asks for.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Only the last this many lines.
    pub tail_lines: Option<usize>,
    /// At most this many bytes of output (cut after `tail_lines`).
    pub limit_bytes: Option<usize>,
    /// Only records at or after this time.
    pub since: Option<Timestamp>,
    /// Prefix each line with its time.
    pub timestamps: bool,
}

/// Renders a log file's content for `q`.
pub fn render(data: &[u8], q: &Query) -> Vec<u8> {
    let mut lines: Vec<Vec<u8>> = Vec::new();
    // A line split into pieces, per stream (pieces of stdout and stderr may interleave).
    let mut pending: [Option<Vec<u8>>; 2] = [None, None];
    for raw in data.split(|b| *b == b'\n') {
        if raw.is_empty() {
            continue;
        }
        let Some((ts, stream, full, text)) = parse(raw) else {
            // Not a record: passes through as a line.
            lines.push(raw.to_vec());
            continue;
        };
        if q.since.is_some_and(|s| ts < s) {
            continue;
        }
        let slot = &mut pending[usize::from(stream == b"stderr")];
        let piece = slot.get_or_insert_with(|| {
            if q.timestamps {
                format!("{ts} ").into_bytes()
            } else {
                Vec::new()
            }
        });
        piece.extend_from_slice(text);
        if full {
            lines.push(slot.take().unwrap_or_default());
        }
    }
    lines.extend(pending.into_iter().flatten());
    if let Some(n) = q.tail_lines {
        let skip = lines.len().saturating_sub(n);
        lines.drain(..skip);
    }
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(&l);
        out.push(b'\n');
    }
    if let Some(limit) = q.limit_bytes {
        out.truncate(limit);
    }
    out
}

/// (time, stream, full line?, text) of a record.
fn parse(raw: &[u8]) -> Option<(Timestamp, &[u8], bool, &[u8])> {
    let mut parts = raw.splitn(4, |b| *b == b' ');
    let ts: Timestamp = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let stream = parts.next()?;
    if stream != b"stdout" && stream != b"stderr" {
        return None;
    }
    let full = match parts.next()? {
        b"F" => true,
        b"P" => false,
        _ => return None,
    };
    Some((ts, stream, full, parts.next().unwrap_or(b"")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn renders_filters_and_joins_pieces() {
        let mut f = Vec::new();
        f.extend(record(at("2026-01-01T00:00:01Z"), "stdout", true, b"one"));
        f.extend(record(at("2026-01-01T00:00:02Z"), "stderr", true, b"two"));
        f.extend(record(at("2026-01-01T00:00:03Z"), "stdout", false, b"thr"));
        f.extend(record(at("2026-01-01T00:00:03Z"), "stdout", true, b"ee"));
        f.extend(b"an old plain line\n");
        assert_eq!(
            render(&f, &Query::default()),
            b"one\ntwo\nthree\nan old plain line\n"
        );
        let since = Query {
            since: Some(at("2026-01-01T00:00:02Z")),
            ..Default::default()
        };
        assert_eq!(render(&f, &since), b"two\nthree\nan old plain line\n");
        let tail = Query {
            tail_lines: Some(2),
            timestamps: true,
            ..Default::default()
        };
        assert_eq!(
            String::from_utf8(render(&f, &tail)).unwrap(),
            "2026-01-01T00:00:03Z three\nan old plain line\n"
        );
        let limit = Query {
            limit_bytes: Some(5),
            ..Default::default()
        };
        assert_eq!(render(&f, &limit), b"one\nt");
    }

    #[tokio::test]
    async fn rotates_at_the_size_limit_keeping_one_old_file() {
        let dir = std::env::temp_dir().join(format!("sweety-logs-rot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.log");
        let lines: String = (0..100).map(|i| format!("line {i:03}\n")).collect();
        // Each record is about 45 bytes: a 1000-byte limit rotates several times.
        write_rotating(
            std::io::Cursor::new(lines.into_bytes()),
            std::io::Cursor::new(Vec::new()),
            path.clone(),
            1000,
        )
        .await;
        let cur = std::fs::read(&path).unwrap();
        let old = std::fs::read(dir.join("c.log.1")).unwrap();
        assert!(
            cur.len() <= 1000 && old.len() <= 1000,
            "{} {}",
            cur.len(),
            old.len()
        );
        let rendered = String::from_utf8(render(&cur, &Query::default())).unwrap();
        assert!(rendered.ends_with("line 099\n"), "{rendered}");
        let older = String::from_utf8(render(&old, &Query::default())).unwrap();
        assert!(!older.is_empty() && !older.contains("line 099"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn writes_records_of_both_streams_and_splits_long_lines() {
        let dir = std::env::temp_dir().join(format!("sweety-logs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.log");
        let long = vec![b'x'; MAX_LINE + 10];
        let mut out_data = b"hello\n".to_vec();
        out_data.extend_from_slice(&long);
        out_data.extend_from_slice(b"\nno newline at the end");
        write(
            std::io::Cursor::new(out_data),
            std::io::Cursor::new(b"oops\n".to_vec()),
            path.clone(),
        )
        .await;
        let text = std::fs::read(&path).unwrap();
        let recs: Vec<_> = text
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| parse(l).expect("a record"))
            .collect();
        assert_eq!(recs.len(), 5, "{}", String::from_utf8_lossy(&text));
        let rendered = render(&text, &Query::default());
        let rendered = String::from_utf8(rendered).unwrap();
        assert!(rendered.contains("hello\n"));
        assert!(rendered.contains("oops\n"));
        assert!(rendered.contains(&format!("{}\n", "x".repeat(MAX_LINE + 10))));
        assert!(rendered.contains("no newline at the end\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
