//! A streamed static file's chunks are allocated on the runtime thread that frees them, not on
//! the blocking-pool thread that reads them (issue 23): with mimalloc a block returns to the
//! heap of the thread that allocated it, so chunks allocated on up to `max_blocking_threads`
//! pool threads kept pages of chunks on each of them (tens of MiB of RSS under bulk load).
//! A counting global allocator (its own test binary) counts allocations of chunk size made on
//! any thread but the test's, whose current-thread runtime serves the file.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::static_site;
use http::Method;
use http_body_util::BodyExt;
use sweety_dataplane::static_files::StaticFiles;

/// Allocations this large are file chunks (nothing else in the test allocates as much).
const LARGE: usize = 64 * 1024;

/// Forwards to the system allocator; counts allocations of at least [`LARGE`] bytes made on
/// threads other than the one marked as the test's.
struct Counting;

thread_local! {
    // Const-initialized, no destructor: touching it never allocates.
    static TEST_THREAD: Cell<bool> = const { Cell::new(false) };
}

static LARGE_ELSEWHERE: AtomicUsize = AtomicUsize::new(0);

fn count(size: usize) {
    // `try_with`: the slot may be gone while a thread exits (that thread is not the test's).
    if size >= LARGE && !TEST_THREAD.try_with(Cell::get).unwrap_or(false) {
        LARGE_ELSEWHERE.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counter update has no effect on the memory returned.
#[allow(unsafe_code)] // a global allocator is an `unsafe impl`; the proof is above
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: same contract as the caller's (non-zero-size layout).
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: `ptr` came from `System` with `layout`; `new_size` is the caller's, valid.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[tokio::test(flavor = "current_thread")]
async fn file_chunks_are_allocated_on_the_runtime_thread() {
    TEST_THREAD.with(|t| t.set(true));
    let dir = tempfile::tempdir().unwrap();
    let file: Vec<u8> = (0..(1usize << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("big.bin"), &file).unwrap();
    let site = static_site(dir.path());
    let sf = StaticFiles::new(1 << 20);
    let req = http::Request::builder()
        .method(Method::GET)
        .uri("/big.bin")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let before = LARGE_ELSEWHERE.load(Ordering::Relaxed);
    let resp = sf.serve(&site, &req, None).await;
    assert_eq!(resp.status(), 200);
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got.as_ref(), &file[..], "the file, whole");
    let elsewhere = LARGE_ELSEWHERE.load(Ordering::Relaxed) - before;
    assert_eq!(
        elsewhere, 0,
        "{elsewhere} chunk-size allocations on other threads (the blocking pool)"
    );
}
