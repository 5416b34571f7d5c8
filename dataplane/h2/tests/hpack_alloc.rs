//! Checks that `hpack::Decoder` does not allocate per field once warm, with a counting global
//! allocator (its own test binary) that counts the allocations of the test's own thread.
//!
//! Blocks cover the common cases: fields indexed from both tables, Huffman-coded literals
//! (decoded into the scratch buffer), and literals with incremental indexing that insert into
//! the dynamic table and evict from it (the table's byte buffer is compacted in place).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::BytesMut;
use sweety_h2::hpack::{Decoder, Encoder};

/// Forwards to the system allocator and counts allocations and reallocations per thread
/// (the test harness's other threads allocate at times of their own).
struct Counting;

thread_local! {
    // Const-initialized, no destructor: touching it never allocates.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the slot may be gone while a thread exits.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counter update has no effect on the memory returned.
#[allow(unsafe_code)] // a global allocator is an `unsafe impl`; the proof is above
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's (non-zero-size layout).
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr` came from `System` with `layout`; `new_size` is the caller's, valid.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Literal with incremental indexing, literal name, raw value.
fn insert(block: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    block.push(0x40);
    block.push(name.len() as u8);
    block.extend_from_slice(name);
    block.push(value.len() as u8);
    block.extend_from_slice(value);
}

#[test]
fn decoding_does_not_allocate_once_warm() {
    // Blocks built before counting.
    let mut huffman = BytesMut::new();
    for (n, v) in [
        (":path", "/static/app.3f9c1e.js"),
        (":authority", "www.example.com"),
        (
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/128.0",
        ),
        ("accept-encoding", "gzip, deflate, br, zstd"),
        (
            "x-custom-header",
            "a value that is long enough to be Huffman-coded",
        ),
    ] {
        Encoder::field(&mut huffman, n.as_bytes(), v.as_bytes(), false);
    }
    // Each insert block adds 4 entries of ~100 octets: with a 4096-octet table, entries are
    // evicted from the sixth block on, and the byte buffer wraps many times over the run.
    let inserts: Vec<Vec<u8>> = (0..16u8)
        .map(|i| {
            let mut b = vec![0x82, 0x87, 0x84];
            for j in 0..4u8 {
                let value = vec![b'a' + (i + j) % 26; 60];
                insert(&mut b, format!("x-entry-{i}-{j}").as_bytes(), &value);
            }
            // And reference the newest entries, as a client's next request would.
            b.extend_from_slice(&[0xbe, 0xbf, 0xc0, 0xc1]);
            b
        })
        .collect();

    let mut d = Decoder::new();
    let mut octets = 0usize;
    let mut run = |d: &mut Decoder, rounds: usize| {
        for _ in 0..rounds {
            d.decode(&huffman, 1 << 16, |f| {
                octets += f.name.len() + f.value.len()
            })
            .unwrap();
            for b in &inserts {
                d.decode(b, 1 << 16, |f| octets += f.name.len() + f.value.len())
                    .unwrap();
            }
        }
    };
    // Warm up: the scratch buffer, the table's byte buffer and entry ring reach their size.
    run(&mut d, 4);
    let before = allocations();
    run(&mut d, 200);
    let allocations = allocations() - before;
    assert!(octets > 0);
    assert_eq!(
        allocations,
        0,
        "{allocations} allocations while decoding {} warm blocks",
        200 * (1 + inserts.len())
    );
}
