//! Static content on disk for the dataplane: each directory `translate` names
//! (`<content_dir>/<namespace>/<name>-<12 hex of its content>`) is written once, atomically
//! (a temporary sibling renamed into place), and removed only when no config the dataplane may
//! still serve names it: [`Garbage`] keeps every directory named by the generation the
//! dataplane last acknowledged and by every generation submitted after it.

use crate::translate::StaticContent;
use crate::Error;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Write each static content directory that does not exist yet (directories are named by
/// content hash, so an existing one is complete): files go to a temporary sibling that is then
/// renamed into place. Directories outside `content_dir` and unsafe file names are refused.
pub fn write_static_content(content_dir: &str, content: &[StaticContent]) -> Result<(), Error> {
    let root = Path::new(content_dir);
    for c in content {
        let dir = Path::new(&c.dir);
        if !dir.starts_with(root) || dir.components().any(|p| p.as_os_str() == "..") {
            return Err(io_err(
                &c.dir,
                std::io::Error::other("outside the content directory"),
            ));
        }
        if dir.exists() {
            continue;
        }
        let tmp = std::path::PathBuf::from(format!("{}.tmp{}", c.dir, std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| io_err(&c.dir, e))?;
        for (name, body) in &c.files {
            let safe = !name.is_empty()
                && name != "."
                && name != ".."
                && !name.contains('/')
                && !name.contains('\\');
            if !safe {
                return Err(io_err(
                    name,
                    std::io::Error::other("unsafe static file name"),
                ));
            }
            std::fs::write(tmp.join(name), body).map_err(|e| io_err(name, e))?;
        }
        std::fs::rename(&tmp, dir).map_err(|e| io_err(&c.dir, e))?;
    }
    Ok(())
}

/// How many submitted generations newer than the acknowledged one keep their directories
/// (while the dataplane does not acknowledge, e.g. disconnected, configs keep coming; the
/// oldest unacknowledged ones are let go first: the dataplane runs the acknowledged one or
/// gets the newest on reconnect).
const KEEP_UNACKED: usize = 16;

/// The static content directories of the configs the dataplane may still serve, by generation
/// (see the module docs).
#[derive(Debug)]
pub struct Garbage {
    content_dir: String,
    /// Directories each submitted generation names.
    by_generation: BTreeMap<u64, BTreeSet<String>>,
    /// What the last call kept (None: no call yet). Until a directory leaves this set nothing
    /// new can be garbage, so [`Garbage::collect`] does not scan (it runs on every
    /// reconcile and every Ack).
    scanned: Option<BTreeSet<String>>,
}

impl Garbage {
    /// Nothing submitted yet under `content_dir`.
    pub fn new(content_dir: &str) -> Garbage {
        Garbage {
            content_dir: content_dir.to_string(),
            by_generation: BTreeMap::new(),
            scanned: None,
        }
    }

    /// Generation `generation` (just submitted) names `content`.
    pub fn submitted(&mut self, generation: u64, content: &[StaticContent]) {
        let dirs = content.iter().map(|c| c.dir.clone()).collect();
        self.by_generation.insert(generation, dirs);
    }

    /// The dataplane runs generation `acked`: forget older generations, keep at most
    /// [`KEEP_UNACKED`] newer ones, and remove the directories (and left-over temporary ones)
    /// none of what is left names. Namespace directories left empty go too. The directory is
    /// scanned only the first time and when a directory stopped being kept. Returns how many
    /// directories were removed.
    pub fn collect(&mut self, acked: u64) -> usize {
        // The newest generation at or below `acked` is what the dataplane runs (a Hello after
        // a restart can report a generation this controller never submitted).
        let running = self
            .by_generation
            .range(..=acked)
            .next_back()
            .map(|(g, _)| *g);
        if let Some(running) = running {
            self.by_generation = self.by_generation.split_off(&running);
        }
        let newer: Vec<u64> = self
            .by_generation
            .keys()
            .copied()
            .filter(|g| Some(*g) != running)
            .collect();
        for g in newer.iter().take(newer.len().saturating_sub(KEEP_UNACKED)) {
            self.by_generation.remove(g);
        }
        let keep: BTreeSet<String> = self.by_generation.values().flatten().cloned().collect();
        // Everything on disk outside the last kept set went at that scan; if nothing left the
        // set since, nothing on disk can be garbage now.
        let unchanged = self.scanned.as_ref().is_some_and(|s| s.is_subset(&keep));
        self.scanned = Some(keep);
        if unchanged {
            return 0;
        }
        let keep = self.scanned.as_ref().expect("just set");
        let removed = remove_unreferenced(Path::new(&self.content_dir), keep);
        if removed > 0 {
            tracing::info!(removed, "removed unreferenced static content directories");
        }
        removed
    }
}

/// Whether a directory name is one `translate` gives static content (`<name>-<12 hex>`) or a
/// temporary one of [`write_static_content`]: nothing else under the content directory is
/// ever removed, even if it is misconfigured to a shared path.
fn ours(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    let hashed = name.len() > 13
        && name.as_bytes()[name.len() - 13] == b'-'
        && name[name.len() - 12..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let tmp = name.rsplit_once(".tmp").is_some_and(|(head, pid)| {
        !head.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
    });
    hashed || tmp
}

/// Remove `<root>/<ns>/<dir>` not in `keep`; the number removed.
fn remove_unreferenced(root: &Path, keep: &BTreeSet<String>) -> usize {
    let mut removed = 0;
    let Ok(namespaces) = std::fs::read_dir(root) else {
        return 0;
    };
    for ns in namespaces.flatten() {
        if !ns.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(dirs) = std::fs::read_dir(ns.path()) else {
            continue;
        };
        let mut left = 0;
        for d in dirs.flatten() {
            let path = d.path().to_string_lossy().into_owned();
            if keep.contains(&path) || !ours(&d.file_name()) {
                left += 1;
                continue;
            }
            match std::fs::remove_dir_all(d.path()) {
                Ok(()) => removed += 1,
                Err(e) => {
                    left += 1;
                    tracing::warn!(path, error = %e, "removing static content failed");
                }
            }
        }
        if left == 0 {
            let _ = std::fs::remove_dir(ns.path());
        }
    }
    removed
}

fn io_err(what: &str, source: std::io::Error) -> Error {
    Error::Io {
        what: format!("static content {what}"),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_content_is_written_once_and_confined() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().to_str().unwrap();
        let dir = format!("{base}/web/pages.v1-abc123");
        let content = vec![StaticContent {
            dir: dir.clone(),
            files: BTreeMap::from([("index.html".to_string(), "<h1>hi</h1>".to_string())]),
        }];
        write_static_content(base, &content).unwrap();
        assert_eq!(
            std::fs::read_to_string(format!("{dir}/index.html")).unwrap(),
            "<h1>hi</h1>"
        );
        // Already present: left alone.
        std::fs::write(format!("{dir}/index.html"), "kept").unwrap();
        write_static_content(base, &content).unwrap();
        assert_eq!(
            std::fs::read_to_string(format!("{dir}/index.html")).unwrap(),
            "kept"
        );

        let outside = vec![StaticContent {
            dir: "/tmp/elsewhere".into(),
            files: BTreeMap::new(),
        }];
        assert!(write_static_content(base, &outside).is_err());
        let bad_name = vec![StaticContent {
            dir: format!("{base}/def"),
            files: BTreeMap::from([("../x".to_string(), String::new())]),
        }];
        assert!(write_static_content(base, &bad_name).is_err());
    }

    #[test]
    fn content_is_removed_only_when_no_config_the_dataplane_may_serve_names_it() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().to_str().unwrap();
        let v = |name: &str| StaticContent {
            dir: format!("{base}/web/pages-{name}"),
            files: BTreeMap::from([("index.html".to_string(), name.to_string())]),
        };
        let (v1, v2, v3) = (
            vec![v("00000000000a")],
            vec![v("00000000000b")],
            vec![v("00000000000c")],
        );
        let exists = |c: &[StaticContent]| Path::new(&c[0].dir).exists();
        let mut garbage = Garbage::new(base);
        write_static_content(base, &v1).unwrap();
        garbage.submitted(1, &v1);
        std::fs::create_dir_all(format!("{base}/web/pages-v0.tmp42")).unwrap();
        std::fs::create_dir_all(format!("{base}/web/not-ours")).unwrap();
        // Nothing acknowledged yet: generation 1 is kept; the stray temporary dir goes.
        assert_eq!(garbage.collect(0), 1);
        assert!(exists(&v1));
        assert!(!Path::new(&format!("{base}/web/pages-v0.tmp42")).exists());
        // Two newer configs while the dataplane still runs generation 1: all three are kept
        // (however many reconciles run before the Ack).
        for (g, c) in [(2, &v2), (3, &v3)] {
            write_static_content(base, c).unwrap();
            garbage.submitted(g, c);
            assert_eq!(garbage.collect(1), 0);
        }
        assert!(exists(&v1) && exists(&v2) && exists(&v3));
        // Generation 3 acknowledged: what only 1 and 2 named goes.
        assert_eq!(garbage.collect(3), 2);
        assert!(!exists(&v1) && !exists(&v2) && exists(&v3));
        // A dataplane that restarted and reports a generation this controller renumbered
        // above its own: the newest submitted one at or below it is what runs.
        assert_eq!(garbage.collect(7), 0);
        assert!(exists(&v3));
        // Nothing referenced any more; what translate never names is left alone, and an
        // emptied namespace directory goes.
        std::fs::create_dir_all(format!("{base}/other/app-0123456789ab")).unwrap();
        garbage.submitted(8, &[]);
        assert_eq!(garbage.collect(8), 2);
        assert!(!exists(&v3));
        assert!(Path::new(&format!("{base}/web/not-ours")).exists());
        assert!(!Path::new(&format!("{base}/other")).exists());
    }

    #[test]
    fn the_directory_is_scanned_only_when_a_directory_stopped_being_kept() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().to_str().unwrap();
        let v = |name: &str| StaticContent {
            dir: format!("{base}/web/pages-{name}"),
            files: BTreeMap::from([("index.html".to_string(), name.to_string())]),
        };
        let (v1, v2) = (vec![v("00000000000a")], vec![v("00000000000b")]);
        let mut garbage = Garbage::new(base);
        write_static_content(base, &v1).unwrap();
        garbage.submitted(1, &v1);
        assert_eq!(garbage.collect(1), 0);
        // A stray left now is not seen while the kept set only stays or grows (no scan on
        // every reconcile and Ack)...
        let stray = format!("{base}/web/pages-v0.tmp42");
        std::fs::create_dir_all(&stray).unwrap();
        garbage.submitted(2, &v1);
        assert_eq!(garbage.collect(1), 0);
        write_static_content(base, &v2).unwrap();
        garbage.submitted(3, &v2);
        assert_eq!(garbage.collect(2), 0);
        assert!(Path::new(&stray).exists());
        // ...and goes with the next scan, when v1 stops being kept.
        assert_eq!(garbage.collect(3), 2);
        assert!(!Path::new(&stray).exists() && !Path::new(&v1[0].dir).exists());
    }

    #[test]
    fn unacknowledged_generations_are_bounded_but_the_running_one_is_kept() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().to_str().unwrap();
        let v = |g: u64| StaticContent {
            dir: format!("{base}/web/pages-{g:012x}"),
            files: BTreeMap::from([("index.html".to_string(), g.to_string())]),
        };
        let mut garbage = Garbage::new(base);
        let total = KEEP_UNACKED as u64 + 5;
        for g in 1..=total {
            write_static_content(base, &[v(g)]).unwrap();
            garbage.submitted(g, &[v(g)]);
            garbage.collect(1);
        }
        let kept: Vec<u64> = (1..=total)
            .filter(|g| Path::new(&v(*g).dir).exists())
            .collect();
        let newest = (total - KEEP_UNACKED as u64 + 1)..=total;
        assert_eq!(kept, std::iter::once(1).chain(newest).collect::<Vec<_>>());
    }
}
