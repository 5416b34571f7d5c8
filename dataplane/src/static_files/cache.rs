//! The small-file cache: file bytes plus precomputed response headers, keyed by the
//! root-joined path and the encoding variant, bounded in total bytes, with CLOCK
//! (second-chance, LRU-like) eviction.
//!
//! Validation: every hit is checked against a fresh `stat` of the same path (the caller
//! does one synchronous `std::fs::metadata`, which it needs anyway to resolve the request).
//! An entry is only used when device, inode, size and mtime all match, so a rewritten,
//! replaced (rename) or re-pointed (symlink swap) file misses. Because the key is the
//! non-canonical joined path and the inode must match, a hit is the very file that was
//! canonicalised and checked to be inside the root when it was inserted; hits therefore skip
//! `canonicalize`, the most expensive part of a miss.
//!
//! Racy-timestamp guard: a file whose mtime is less than `RACY_WINDOW` old is served but
//! not cached, because a second write within the same coarse timestamp tick could leave
//! size and mtime unchanged.
//!
//! The same structure, in a second instance, is the open-file cache of the files too large to
//! hold ([`Entry::open`]): an open descriptor plus the headers, validated the same way, so that
//! a hit streams the very file without canonicalising and opening it again (a blocking-pool
//! hop per request). Each such entry weighs 1, so that cache's size is a count of
//! descriptors. Like nginx's `open_file_cache`, a descriptor is held until its entry is
//! evicted or found stale by a request: a file deleted or replaced on disk keeps its old
//! inode (and disk space) until then, at most that many files.

use super::encoding::Encoding;
use bytes::Bytes;
use http::HeaderValue;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

/// Files larger than this are never cached (they are streamed).
pub(crate) const MAX_ENTRY_BYTES: u64 = 64 * 1024;
/// Bookkeeping charged per entry on top of its bytes and key.
const ENTRY_OVERHEAD: usize = 256;
/// Files modified more recently than this are not cached (see the module docs).
pub(crate) const RACY_WINDOW: Duration = Duration::from_secs(2);

/// The identity of one version of a file, compared on every cache hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) len: u64,
    pub(crate) mtime: Option<SystemTime>,
    dev: u64,
    ino: u64,
}

impl Stamp {
    /// The stamp of `meta` (from `stat` or `fstat`).
    pub(crate) fn of(meta: &Metadata) -> Stamp {
        #[cfg(unix)]
        let (dev, ino) = {
            use std::os::unix::fs::MetadataExt;
            (meta.dev(), meta.ino())
        };
        #[cfg(not(unix))]
        let (dev, ino) = (0, 0);
        Stamp {
            len: meta.len(),
            mtime: meta.modified().ok(),
            dev,
            ino,
        }
    }

    /// Whether a file with this stamp may be cached now (known, not-too-recent mtime).
    pub(crate) fn cacheable(&self, now: SystemTime) -> bool {
        match self.mtime {
            Some(m) => now.duration_since(m).is_ok_and(|age| age >= RACY_WINDOW),
            None => false,
        }
    }
}

/// Everything needed to answer for one file variant except its bytes.
#[derive(Debug, Clone)]
pub(crate) struct Representation {
    pub(crate) stamp: Stamp,
    pub(crate) encoding: Encoding,
    pub(crate) etag: HeaderValue,
    pub(crate) last_modified: Option<HeaderValue>,
    /// `Last-Modified` in whole seconds, for `If-Modified-Since` / `If-Range`.
    pub(crate) mtime_secs: Option<u64>,
    pub(crate) content_type: HeaderValue,
    pub(crate) content_length: HeaderValue,
}

/// A cached file variant: its bytes, or (open-file cache) an open descriptor of it.
#[derive(Debug)]
pub(crate) struct Entry {
    key: OsString,
    pub(crate) rep: Representation,
    pub(crate) bytes: Bytes,
    /// The open file, for an entry of the open-file cache.
    pub(crate) file: Option<Arc<File>>,
    referenced: AtomicBool,
}

impl Entry {
    /// A new entry for `key` (the root-joined path of the *original* file).
    pub(crate) fn new(key: OsString, rep: Representation, bytes: Bytes) -> Entry {
        Entry {
            key,
            rep,
            bytes,
            file: None,
            referenced: AtomicBool::new(false),
        }
    }

    /// An entry of the open-file cache: `file`, opened from `key`'s canonical path, whose
    /// `fstat` gave `rep`'s stamp.
    pub(crate) fn open(key: OsString, rep: Representation, file: Arc<File>) -> Entry {
        Entry {
            key,
            rep,
            bytes: Bytes::new(),
            file: Some(file),
            referenced: AtomicBool::new(false),
        }
    }

    /// What the entry counts against its cache's size: bytes, key and bookkeeping; 1 for an
    /// open file (the open-file cache counts descriptors).
    fn weight(&self) -> usize {
        if self.file.is_some() {
            return 1;
        }
        self.bytes.len() + self.key.len() + ENTRY_OVERHEAD
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// One index per encoding, so lookups need no composite key allocation.
    maps: [HashMap<OsString, usize>; 3],
    slots: Vec<Option<Arc<Entry>>>,
    free: Vec<usize>,
    hand: usize,
    bytes: usize,
}

impl Inner {
    fn evict_slot(&mut self, idx: usize) {
        if let Some(e) = self.slots[idx].take() {
            self.maps[e.rep.encoding as usize].remove(&e.key);
            self.bytes -= e.weight();
            self.free.push(idx);
        }
    }
}

/// The bounded cache. Reads take a shared lock; inserts and evictions an exclusive one.
#[derive(Debug)]
pub(crate) struct Cache {
    max_bytes: usize,
    inner: RwLock<Inner>,
}

impl Cache {
    /// A cache holding at most `max_bytes` (bytes + keys + bookkeeping).
    pub(crate) fn new(max_bytes: usize) -> Cache {
        Cache {
            max_bytes,
            inner: RwLock::new(Inner::default()),
        }
    }

    /// Whether a file of `len` bytes is small enough to be cached at all.
    pub(crate) fn admits(&self, len: u64) -> bool {
        len <= MAX_ENTRY_BYTES && (len as usize) + ENTRY_OVERHEAD < self.max_bytes
    }

    /// The entry for `path` in variant `enc`, marking it recently used.
    pub(crate) fn get(&self, path: &OsStr, enc: Encoding) -> Option<Arc<Entry>> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let idx = *inner.maps[enc as usize].get(path)?;
        let e = inner.slots[idx].clone()?;
        if !e.referenced.load(Ordering::Relaxed) {
            e.referenced.store(true, Ordering::Relaxed);
        }
        Some(e)
    }

    /// Drops `stale` if it is still the cached entry for its key.
    pub(crate) fn remove(&self, stale: &Arc<Entry>) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let map = &inner.maps[stale.rep.encoding as usize];
        if let Some(&idx) = map.get(&stale.key) {
            if inner.slots[idx]
                .as_ref()
                .is_some_and(|e| Arc::ptr_eq(e, stale))
            {
                inner.evict_slot(idx);
            }
        }
    }

    /// Inserts (or replaces) an entry, evicting others until the total fits.
    pub(crate) fn insert(&self, entry: Entry) {
        let weight = entry.weight();
        if weight > self.max_bytes {
            return;
        }
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let enc = entry.rep.encoding as usize;
        if let Some(&idx) = inner.maps[enc].get(&entry.key) {
            inner.evict_slot(idx);
        }
        // CLOCK: sweep, giving referenced entries a second chance. Two full turns always
        // suffice (the first clears every bit), so the bound only guards against bugs.
        let mut budget = inner.slots.len() * 2 + 1;
        while inner.bytes + weight > self.max_bytes && budget > 0 {
            budget -= 1;
            if inner.slots.is_empty() {
                break;
            }
            let idx = inner.hand % inner.slots.len();
            inner.hand = idx + 1;
            let second_chance = match &inner.slots[idx] {
                Some(e) => e.referenced.swap(false, Ordering::Relaxed),
                None => continue,
            };
            if !second_chance {
                inner.evict_slot(idx);
            }
        }
        if inner.bytes + weight > self.max_bytes {
            return;
        }
        let key = entry.key.clone();
        let entry = Arc::new(entry);
        let idx = match inner.free.pop() {
            Some(i) => {
                inner.slots[i] = Some(entry);
                i
            }
            None => {
                inner.slots.push(Some(entry));
                inner.slots.len() - 1
            }
        };
        inner.maps[enc].insert(key, idx);
        inner.bytes += weight;
    }

    /// Number of cached entries.
    pub(crate) fn len(&self) -> usize {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner.maps.iter().map(HashMap::len).sum()
    }

    /// Bytes currently charged against the limit.
    pub(crate) fn charged_bytes(&self) -> usize {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(enc: Encoding) -> Representation {
        Representation {
            stamp: Stamp {
                len: 0,
                mtime: None,
                dev: 0,
                ino: 0,
            },
            encoding: enc,
            etag: HeaderValue::from_static("\"x\""),
            last_modified: None,
            mtime_secs: None,
            content_type: HeaderValue::from_static("text/plain"),
            content_length: HeaderValue::from_static("0"),
        }
    }

    fn entry(key: &str, size: usize) -> Entry {
        Entry::new(
            key.into(),
            rep(Encoding::Identity),
            Bytes::from(vec![0u8; size]),
        )
    }

    #[test]
    fn stays_within_budget_and_prefers_referenced() {
        let per = 1000 + 1 + ENTRY_OVERHEAD;
        let cache = Cache::new(per * 3);
        cache.insert(entry("a", 1000));
        cache.insert(entry("b", 1000));
        cache.insert(entry("c", 1000));
        assert_eq!(cache.len(), 3);
        // Touch a and c; inserting d must evict b (the only unreferenced one).
        assert!(cache.get(OsStr::new("a"), Encoding::Identity).is_some());
        assert!(cache.get(OsStr::new("c"), Encoding::Identity).is_some());
        cache.insert(entry("d", 1000));
        assert_eq!(cache.len(), 3);
        assert!(cache.charged_bytes() <= per * 3);
        assert!(cache.get(OsStr::new("b"), Encoding::Identity).is_none());
        assert!(cache.get(OsStr::new("a"), Encoding::Identity).is_some());
        assert!(cache.get(OsStr::new("d"), Encoding::Identity).is_some());
    }

    #[test]
    fn variants_are_separate_and_replace_in_place() {
        let cache = Cache::new(1 << 20);
        cache.insert(entry("a", 10));
        cache.insert(Entry::new(
            "a".into(),
            rep(Encoding::Br),
            Bytes::from_static(b"br"),
        ));
        assert_eq!(cache.len(), 2);
        cache.insert(entry("a", 20));
        assert_eq!(cache.len(), 2);
        let e = cache.get(OsStr::new("a"), Encoding::Identity).unwrap();
        assert_eq!(e.bytes.len(), 20);
        cache.remove(&e);
        assert!(cache.get(OsStr::new("a"), Encoding::Identity).is_none());
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.charged_bytes(), 2 + 1 + ENTRY_OVERHEAD);
    }

    #[test]
    fn oversized_and_zero_budget() {
        let cache = Cache::new(0);
        assert!(!cache.admits(1));
        cache.insert(entry("a", 1));
        assert_eq!(cache.len(), 0);
        let cache = Cache::new(1 << 20);
        assert!(cache.admits(MAX_ENTRY_BYTES));
        assert!(!cache.admits(MAX_ENTRY_BYTES + 1));
    }

    /// The open-file cache counts descriptors: at most its size, the least recently used
    /// evicted first, and an evicted descriptor is closed once no body streams from it.
    #[test]
    fn open_file_entries_weigh_one_and_close_when_evicted() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let cache = Cache::new(2);
        let open = |key: &str| {
            let f = Arc::new(File::open(tmp.path()).unwrap());
            (
                Entry::open(key.into(), rep(Encoding::Identity), f.clone()),
                f,
            )
        };
        let (a, fa) = open("a");
        let (b, _) = open("b");
        let (c, _) = open("c");
        cache.insert(a);
        cache.insert(b);
        assert_eq!((cache.len(), cache.charged_bytes()), (2, 2));
        assert!(cache.get(OsStr::new("a"), Encoding::Identity).is_some());
        cache.insert(c);
        assert_eq!((cache.len(), cache.charged_bytes()), (2, 2));
        assert!(cache.get(OsStr::new("b"), Encoding::Identity).is_none());
        let hit = cache.get(OsStr::new("a"), Encoding::Identity).unwrap();
        assert!(Arc::ptr_eq(hit.file.as_ref().unwrap(), &fa));
        drop(hit);
        // Only the test's own reference is left once the entry is gone.
        cache.remove(&cache.get(OsStr::new("a"), Encoding::Identity).unwrap());
        assert_eq!(Arc::strong_count(&fa), 1);
    }

    #[test]
    fn racy_window() {
        let now = SystemTime::now();
        let mut s = rep(Encoding::Identity).stamp;
        s.mtime = Some(now);
        assert!(!s.cacheable(now));
        s.mtime = Some(now - Duration::from_secs(60));
        assert!(s.cacheable(now));
        s.mtime = Some(now + Duration::from_secs(60));
        assert!(!s.cacheable(now));
    }
}
