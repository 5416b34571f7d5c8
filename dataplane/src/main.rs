//! `sweety-dataplane`: the Sweety dataplane binary. Thin: parses flags, sets up logging and the
//! tokio runtime, and hands over to the library.
//!
//! * `sweety-dataplane` (or `run` with no `--config`): serve the embedded default config;
//! * `sweety-dataplane run --config FILE`: serve FILE, reloading on change and on SIGHUP;
//! * `sweety-dataplane validate FILE`: print every error in FILE, exit non-zero if any.
//! * `--control-socket PATH` (with either form of `run`): accept config pushes from the
//!   controller on a Unix socket. `--config FILE` is then only the initial config (not
//!   watched); without it the dataplane starts with no listeners and is not ready until the
//!   first push.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use sweety_config::Config;
use sweety_dataplane::idle_purge;
use sweety_dataplane::reload::{Runtime, RuntimeOptions};

#[derive(Parser, Debug)]
#[command(
    name = "sweety-dataplane",
    version,
    about = "Sweety dataplane: HTTP/1.1, HTTP/2 and HTTP/3 edge server"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Unix socket the controller pushes configs on (see docs/control-protocol.md).
    #[arg(long, global = true, env = "SWEETY_CONTROL_SOCKET")]
    control_socket: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve a config file (or the embedded default when none is given).
    Run(RunArgs),
    /// Validate a config file and print every error.
    Validate {
        /// The config file (YAML or JSON).
        file: PathBuf,
    },
}

#[derive(Parser, Debug, Default)]
struct RunArgs {
    /// Config file (YAML or JSON). Reloaded when it changes and on SIGHUP.
    #[arg(long, short, env = "SWEETY_CONFIG")]
    config: Option<PathBuf>,
    /// Admin listener address (overrides the config's `admin`).
    #[arg(long, env = "SWEETY_ADMIN")]
    admin: Option<SocketAddr>,
    /// Worker threads (default: one per CPU; with one, a single-threaded runtime).
    #[arg(long, env = "SWEETY_WORKERS")]
    workers: Option<usize>,
    /// Keep the pages of code and constants mapped at startup (see `release_startup_code`).
    #[arg(long, env = "SWEETY_KEEP_STARTUP_PAGES")]
    keep_startup_pages: bool,
    /// Set from the global `--control-socket`.
    #[arg(skip)]
    control_socket: Option<PathBuf>,
}

/// mimalloc: less fragmentation and lower RSS across config reloads (e2e/bench/HISTORY.md, "Earlier measurements").
#[global_allocator]
static GLOBAL: WordAligned = WordAligned;

/// The alignment every block of `mi_malloc` has: a machine word.
const WORD: usize = std::mem::size_of::<usize>();

/// mimalloc as the global allocator, asked by size alone (`mi_malloc`) when the alignment
/// wanted is at most a word, as it is for nearly every Rust allocation. The `mimalloc` crate's
/// own allocator always calls `mi_malloc_aligned`, whose fast path is for blocks of at most
/// 1 KiB: a larger block (a request's future, ~1.5-3 KiB, twice per proxied request) went
/// through mimalloc v3's aligned fallback, which over-allocates `size + align - 1` (a larger
/// size class), marks the page as holding interior pointers and so slows its frees too:
/// ~500-700 instructions per such allocation (issue 23, callgrind).
struct WordAligned;

// SAFETY (the workspace's fifth `unsafe` in shipped code): each method forwards to mimalloc
// with the layout's size, and the pointer it returns is aligned to `layout.align()`:
// - `mi_malloc`/`mi_zalloc`/`mi_realloc` blocks are whole words and start on a word: mimalloc's
//   size classes are multiples of the word size (`_mi_wsize_from_size`), a page's blocks start
//   at an offset aligned to 16 (`mi_page_info_size`) or to the block size, and huge blocks at
//   an OS page; so any `align <= WORD` is met. Larger alignments go to the `_aligned` calls
//   exactly as `mimalloc::MiMalloc` does.
// - Every pointer handed to `dealloc`/`realloc` came from one of these calls (the
//   `GlobalAlloc` contract), and `mi_free`/`mi_realloc` accept a block from any of them
//   (mimalloc finds a block's page from its address, aligned or not).
// - `realloc` keeps the old layout's alignment: a block first allocated with `align <= WORD`
//   is reallocated with `mi_realloc`, whose new block is word-aligned again; otherwise with
//   `mi_realloc_aligned` and the same alignment, as `MiMalloc` does.
// - Null on failure is passed through, as `GlobalAlloc` requires.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for WordAligned {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if layout.align() <= WORD {
            libmimalloc_sys::mi_malloc(layout.size()).cast()
        } else {
            libmimalloc_sys::mi_malloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if layout.align() <= WORD {
            libmimalloc_sys::mi_zalloc(layout.size()).cast()
        } else {
            libmimalloc_sys::mi_zalloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        libmimalloc_sys::mi_free(ptr.cast());
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= WORD {
            libmimalloc_sys::mi_realloc(ptr.cast(), new_size).cast()
        } else {
            libmimalloc_sys::mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast()
        }
    }
}

/// mimalloc v3's `mi_option_purge_delay` (its index in `mi_option_e`, mimalloc.h; the sys crate
/// names no constant for it). Its documented default is 1000 ms, checked before it is changed.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long mimalloc keeps a freed page before returning it to the OS, in ms (issue 23,
/// docs/benchmarks.md "Memory under bulk load"). At 0 (until then) every page freed under load
/// was returned at once and faulted in again a moment later: 2 page faults per proxied HTTP/2
/// request. At mimalloc's default of 1 s the faults go (0.2 per request) but a 100 KB proxy load
/// peaks ~12 MiB higher (pages freed within the last second kept beside the new ones); at
/// 100 ms the faults are a third and the peak is as at 0. An idle dataplane does not wait for
/// it: [`return_freed_memory`] runs when the workers go idle.
const PURGE_DELAY_MS: std::ffi::c_long = 100;

/// mimalloc v3's `mi_option_minimal_purge_size` and `mi_option_arena_max_object_size` (their
/// indexes in `mi_option_e`, mimalloc.h; the sys crate names no constant for them). The second
/// is only read, to check the indexes: its documented default (2 GiB on 64-bit, in KiB) is
/// the one value of the table there.
const MI_OPTION_MINIMAL_PURGE_SIZE: libmimalloc_sys::mi_option_t = 44;
const MI_OPTION_ARENA_MAX_OBJECT_SIZE: libmimalloc_sys::mi_option_t = 45;
const ARENA_MAX_OBJECT_SIZE_KIB: std::ffi::c_long = 2 * 1024 * 1024;

/// The smallest aligned run of freed memory mimalloc returns to the OS, in KiB (issue 23). At
/// its default (one OS page) every 64 KiB page freed under load was returned at the next
/// purge, however many live pages surround it, and faulted in again when the next request
/// needed a page of that size: 0.07-0.13 page faults per proxied HTTP/1.1 request (HAProxy:
/// 0.01). A free page amid live ones is now kept; a freed run of 1 MiB (an aligned 16 pages:
/// what a burst of large bodies or a closed connection's buffers free) is still returned, on
/// the same schedule ([`PURGE_DELAY_MS`]; at idle by [`return_freed_memory`]).
const MINIMAL_PURGE_KIB: std::ffi::c_long = 1024;

/// Sets [`PURGE_DELAY_MS`] and [`MINIMAL_PURGE_KIB`]. A `MIMALLOC_PURGE_DELAY` or
/// `MIMALLOC_MINIMAL_PURGE_SIZE` set by the operator wins.
#[allow(unsafe_code)] // the workspace's first `unsafe` in shipped code: the proof is inside
fn set_allocator_options() {
    // SAFETY: mi_option_get/mi_option_set read and store one integer in mimalloc's option
    // table; they take no pointers and have no preconditions beyond a valid option index,
    // which the default checks below confirm (an unknown index reads as 0 and is left alone;
    // the minimal purge size's default is 0 too, so its index is confirmed by its
    // neighbour's, whose default no other option of the table has). Both run first in
    // `main`, before any other thread exists.
    unsafe {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none()
            && libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) == 1000
        {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
        }
        if std::env::var_os("MIMALLOC_MINIMAL_PURGE_SIZE").is_none()
            && libmimalloc_sys::mi_option_get(MI_OPTION_ARENA_MAX_OBJECT_SIZE)
                == ARENA_MAX_OBJECT_SIZE_KIB
            && libmimalloc_sys::mi_option_get(MI_OPTION_MINIMAL_PURGE_SIZE) == 0
        {
            libmimalloc_sys::mi_option_set(MI_OPTION_MINIMAL_PURGE_SIZE, MINIMAL_PURGE_KIB);
        }
    }
}

/// Returns the memory freed so far to the OS: the calling thread's empty pages to mimalloc's
/// arenas, then every arena's freed pages (whichever thread freed them) to the OS. mimalloc's
/// own purge runs [`PURGE_DELAY_MS`] after a free and only when a thread next allocates a page,
/// which spares the page faults of memory freed and needed again under load; this is called
/// when that delay would keep memory an idle dataplane no longer uses: once the first config
/// serves, then by [`sweety_dataplane::idle_purge::run`] after an apply and when the workers go
/// idle (issue 23; docs/benchmarks.md, "Memory under bulk load").
#[allow(unsafe_code)] // the workspace's fourth `unsafe` in shipped code: the proof is inside
fn return_freed_memory() {
    // SAFETY: mi_collect takes no pointer and has no precondition: it may be called at any
    // time from any thread that may allocate. It walks only the calling thread's own heap (no
    // other thread allocates from it; blocks other threads free into it are taken from their
    // atomic free lists), frees only pages with no live block, and purges arena ranges that
    // are free in the arenas' atomic bitmaps (claimed before purging, so a concurrent
    // allocation cannot be handed a range being purged). No live allocation is touched.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// Unmaps the pages of code and constants that startup brought in (of the executable and of
/// the shared libraries it loaded), once the first config serves; returns the bytes of the
/// ranges released. Most of an idle dataplane's RSS is not heap but these file pages (issue 23,
/// docs/benchmarks.md "Idle RSS"): YAML parsing, validation, the router and TLS set-up run
/// once, and the kernel maps 64 KiB around every page they touch, in libc and libm as in the
/// executable. Released, they stay in the page cache: what the requests use is mapped again at
/// its first use (a minor fault each, once), the rest no longer counts.
///
/// Only private mappings of the files mapped when `main` began (the executable and the
/// libraries loaded with it, [`STARTUP_OBJECTS`]) that cannot be written and hold no anonymous
/// (private, modified) page are released: their pages are the file's, so a later access reads
/// the same bytes. The relocated read-only data (RELRO) holds anonymous pages and is left alone.
#[allow(unsafe_code)] // the workspace's second `unsafe` in shipped code: the proof is inside
fn release_startup_code() -> usize {
    let Some(objects) = STARTUP_OBJECTS.get() else {
        return 0;
    };
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let mut released = 0;
    for (start, end) in releasable(&smaps, objects) {
        // SAFETY: [start, end) is a whole mapping of this process (read from its smaps just
        // now), private, of a file, without write permission and without an anonymous page:
        // every page in it is the file's clean page-cache page, never modified, which the
        // kernel may already unmap at any time to reclaim memory. MADV_DONTNEED on a private
        // file mapping only drops the page-table entries; the next access maps the same file
        // page again, so no thread (one may run code in the range meanwhile) can observe a
        // difference. The range cannot become another mapping between the read of smaps and this
        // call: the file is one the process was started with (the executable, or a library of
        // the initial link map, which the dynamic loader never unloads), and nothing in this
        // process unmaps or mprotects such a mapping.
        let r =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        if r == 0 {
            released += end - start;
        }
    }
    released
}

/// [`release_startup_code`], and how much it released in the debug log; and the heap memory
/// startup freed ([`return_freed_memory`]).
fn release_startup_code_logged() {
    let released = release_startup_code();
    return_freed_memory();
    tracing::debug!(kib = released / 1024, "startup code released");
}

/// The files mapped when `main` began: the executable and the shared libraries of the initial
/// link map (never unloaded), whose read-only mappings [`release_startup_code`] may release.
static STARTUP_OBJECTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Records [`STARTUP_OBJECTS`] from /proc/self/maps; called first thing in `main`, before any
/// library could be loaded later (NSS modules by a name lookup, say).
fn record_startup_objects() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut objects: Vec<String> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.starts_with('/'))
        .map(str::to_owned)
        .collect();
    objects.sort();
    objects.dedup();
    let _ = STARTUP_OBJECTS.set(objects);
}

/// The `(start, end)` of the mappings in `smaps` (the text of /proc/self/smaps) that are
/// private mappings of one of the files `objects` (sorted), not writable, and hold no anonymous
/// page. Special mappings (`[vdso]`, `[vvar]`, `[stack]`) and anonymous ones are never.
fn releasable(smaps: &str, objects: &[String]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            // A mapping's header: "start-end perms offset dev inode path".
            current = None;
            let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            else {
                continue;
            };
            let perms = fields.next().unwrap_or("").as_bytes();
            let path = fields.nth(3).unwrap_or("");
            let unwritable_private =
                perms.len() == 4 && perms[0] == b'r' && perms[1] == b'-' && perms[3] == b'p';
            let startup_object = objects.binary_search_by(|o| o.as_str().cmp(path)).is_ok();
            if unwritable_private && path.starts_with('/') && startup_object {
                current = Some((a, b));
            }
        } else if first == "Anonymous:" {
            if let Some(range) = current.take() {
                if fields.next() == Some("0") {
                    out.push(range);
                }
            }
        }
    }
    out
}

fn main() -> anyhow::Result<()> {
    record_startup_objects();
    set_allocator_options();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        // Colour only on a terminal (and never with NO_COLOR): piped to a file or a log
        // collector, escape codes are noise in every line (issue 21).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Validate { file }) => validate(&file),
        Some(Command::Run(args)) => run(RunArgs {
            control_socket: cli.control_socket,
            ..args
        }),
        None => run(RunArgs {
            control_socket: cli.control_socket,
            ..RunArgs::default()
        }),
    }
}

fn read_config(path: &Path) -> anyhow::Result<Config> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(Config::from_yaml(&text)?)
}

fn validate(file: &Path) -> anyhow::Result<()> {
    let cfg = read_config(file)?;
    match cfg.validate() {
        Ok(()) => {
            println!("{}: ok", file.display());
            Ok(())
        }
        Err(errs) => {
            for e in &errs.0 {
                println!("{}: {e}", file.display());
            }
            std::process::exit(1);
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    // One worker: a current-thread runtime. Every task then runs on the thread that accepted
    // its connection, with no work stealing, no cross-thread wake-ups and cheaper task
    // queues; blocking file reads still go to the blocking pool.
    let mut rt = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    rt.max_blocking_threads(64)
        .thread_keep_alive(Duration::from_secs(10))
        .enable_all();
    rt.build()?.block_on(serve(args))
}

async fn serve(args: RunArgs) -> anyhow::Result<()> {
    let (config, demo_dir) = match &args.config {
        Some(p) => (Some(read_config(p)?), None),
        None if args.control_socket.is_some() => (None, None),
        None => {
            let dir = std::env::temp_dir().join(format!("sweety-demo-{}", std::process::id()));
            let root = sweety_dataplane::defaults::write_demo_site(&dir)?;
            let (cert, key) = sweety_dataplane::tls::self_signed(&["localhost", "127.0.0.1"])?;
            (
                Some(sweety_dataplane::defaults::default_config(&root, cert, key)),
                Some(dir),
            )
        }
    };
    let opts = RuntimeOptions {
        access_log: config
            .as_ref()
            .map(|c| c.access_log.clone())
            .unwrap_or_default(),
        ..RuntimeOptions::default()
    };
    let runtime = Arc::new(Runtime::new(opts)?);
    let admin_addr = match args.admin {
        Some(a) => a,
        None => {
            let a = config
                .as_ref()
                .and_then(|c| c.admin.clone())
                .unwrap_or_default();
            format!("{}:{}", a.address, a.port)
                .parse()
                .context("admin address")?
        }
    };
    let admin = sweety_dataplane::admin::serve(runtime.shared.clone(), admin_addr)
        .await
        .with_context(|| format!("cannot bind the admin listener on {admin_addr}"))?;
    if let Some(config) = config {
        runtime
            .apply(config)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    for (name, addr) in runtime.bound().await {
        tracing::info!(listener = %name, %addr, "listening");
    }
    tracing::info!(%admin, "admin listening");
    let _control = match &args.control_socket {
        Some(path) => Some(
            sweety_dataplane::control::ControlServer::bind(runtime.clone(), path)
                .with_context(|| format!("cannot create the control socket {}", path.display()))?,
        ),
        None => None,
    };
    if let (Some(p), None) = (&args.config, &args.control_socket) {
        tokio::spawn(watch_file(runtime.clone(), p.clone()));
    }

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Once the tasks spawned above have started (the config watch's first look) and a config
    // serves (with `--control-socket` and no `--config`, once the first push did): startup's
    // pages released, then the allocator's freed memory returned whenever the workers go idle.
    tokio::task::yield_now().await;
    let keep = args.keep_startup_pages;
    let startup_done = move || {
        if keep {
            return_freed_memory();
        } else {
            release_startup_code_logged();
        }
    };
    let ready = |rt: &Runtime| rt.shared.ready.load(std::sync::atomic::Ordering::Relaxed);
    if ready(&runtime) {
        startup_done();
        tokio::spawn(idle_purge::run(runtime.shared.clone(), return_freed_memory));
    } else {
        let runtime = runtime.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !ready(&runtime) {
                tick.tick().await;
            }
            tokio::task::yield_now().await;
            startup_done();
            idle_purge::run(runtime.shared.clone(), return_freed_memory).await;
        });
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down: draining connections");
    runtime.shutdown().await;
    if let Some(d) = demo_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(())
}

/// Reloads `path` when its modification time or size changes (polled every second) and on
/// SIGHUP. A bad file is reported and the running config keeps serving.
async fn watch_file(runtime: Arc<Runtime>, path: PathBuf) {
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.modified().ok(), m.len()))
    };
    let mut last = stamp(&path);
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGHUP");
            return;
        }
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            _ = hup.recv() => true,
        };
        let now = stamp(&path);
        if !forced && now == last {
            continue;
        }
        last = now;
        match read_config(&path) {
            Ok(cfg) => {
                let generation = cfg.generation;
                match runtime.apply(cfg).await {
                    Ok(()) => tracing::info!(generation, file = %path.display(), "config reloaded"),
                    Err(e) => tracing::error!("{e}; keeping the previous config"),
                }
            }
            Err(e) => {
                runtime
                    .shared
                    .metrics
                    .reloads_failed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!("{e:#}; keeping the previous config");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::releasable;

    /// The option indexes `set_allocator_options` uses are mimalloc's: each reads its
    /// documented default in this build (a shifted table would read another option's).
    #[test]
    #[allow(unsafe_code)]
    fn the_allocator_option_indexes_read_their_defaults() {
        // SAFETY: as in `set_allocator_options`: reads of mimalloc's option table.
        let get = |o| unsafe { libmimalloc_sys::mi_option_get(o) };
        assert_eq!(get(super::MI_OPTION_PURGE_DELAY), 1000);
        assert_eq!(get(super::MI_OPTION_MINIMAL_PURGE_SIZE), 0);
        assert_eq!(
            get(super::MI_OPTION_ARENA_MAX_OBJECT_SIZE),
            super::ARENA_MAX_OBJECT_SIZE_KIB
        );
    }

    #[test]
    fn only_unwritable_private_file_mappings_without_anonymous_pages_are_releasable() {
        let smaps = "\
55d000000000-55d000431000 r--p 00000000 fe:00 1234 /usr/bin/sweety-dataplane
Size:               4292 kB
Rss:                2048 kB
Anonymous:             0 kB
55d000431000-55d000e48000 r-xp 00431000 fe:00 1234 /usr/bin/sweety-dataplane
Size:              10332 kB
Anonymous:             0 kB
55d000e48000-55d000ee2000 r--p 00e48000 fe:00 1234 /usr/bin/sweety-dataplane
Size:                616 kB
Anonymous:           616 kB
55d000ee2000-55d000eea000 rw-p 00ee2000 fe:00 1234 /usr/bin/sweety-dataplane
Anonymous:             0 kB
7f0000000000-7f0000171000 r-xp 00028000 fe:00 99 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
7f0000171000-7f0000180000 r--s 00000000 fe:00 98 /some/shared/file
Anonymous:             0 kB
7f1000000000-7f1000021000 rw-p 00000000 00:00 0
Anonymous:           132 kB
7f2000000000-7f2000002000 r-xp 00000000 00:00 0                          [vdso]
Anonymous:             0 kB
7f3000000000-7f3000001000 r--p 00000000 00:00 0
Anonymous:             0 kB
";
        let objects = |paths: &[&str]| paths.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let started_with = objects(&[
            "/some/shared/file",
            "/usr/bin/sweety-dataplane",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ]);
        assert_eq!(
            releasable(smaps, &started_with),
            vec![
                (0x55d0_0000_0000, 0x55d0_0043_1000),
                (0x55d0_0043_1000, 0x55d0_00e4_8000),
                (0x7f00_0000_0000, 0x7f00_0017_1000),
            ]
        );
        // A library loaded later (not in the list) is never released.
        assert_eq!(
            releasable(smaps, &objects(&["/usr/bin/sweety-dataplane"])),
            vec![
                (0x55d0_0000_0000, 0x55d0_0043_1000),
                (0x55d0_0043_1000, 0x55d0_00e4_8000),
            ]
        );
        assert!(releasable(smaps, &[]).is_empty());
    }
}
