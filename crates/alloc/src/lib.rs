//! The allocator leasehold runs on (mimalloc), and the one control over it the server needs:
//! giving memory back to the OS after a bulk free such as a compaction.
//!
//! mimalloc keeps freed pages for a while (its purge delay, 1 s) and purges them only when the
//! thread that owns them next allocates or frees. An idle server after a compaction therefore keeps
//! the compacted history resident. Purging at once (`MIMALLOC_PURGE_DELAY=0`) gives it back but
//! costs keepalive throughput about 40 % (docs/bench.md). So instead a bulk free calls
//! [`release_soon`], and each runtime worker, the next time it parks ([`on_park`], installed with
//! tokio's `on_thread_park`), collects its own heap once: mimalloc's heaps are per thread, so
//! only the owning thread can return its pages.
//!
//! This crate holds the workspace's only `unsafe` code: the calls to `mi_collect` and
//! `mi_option_set` ([`configure`]), and the initializer entry that runs the latter before `main`.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The allocator the `leasehold` binary installs as its global allocator.
pub use mimalloc::MiMalloc as Allocator;

/// Bumped by each [`release_soon`]; a thread collects when it has not seen the latest value.
static RELEASES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last value of [`RELEASES`] this thread collected for.
    static SEEN: Cell<u64> = const { Cell::new(0) };
}

/// Asks every runtime worker to return its free memory to the OS the next time it parks. Cheap:
/// one atomic increment. Call it after freeing much memory at once.
pub fn release_soon() {
    RELEASES.fetch_add(1, Ordering::Relaxed);
}

/// For tokio's `on_thread_park`: if a release was asked for since this thread last collected,
/// collect this thread's heap and purge freed pages, and say so. Otherwise one atomic load.
pub fn on_park() -> bool {
    let wanted = RELEASES.load(Ordering::Relaxed);
    let due = SEEN.with(|seen| seen.replace(wanted)) != wanted;
    if due {
        collect();
    }
    due
}

/// mimalloc's `mi_option_arena_eager_commit` (its place in v3's `mi_option_e`).
const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// Sets mimalloc's options for a server: arenas committed as they are used rather than at once
/// (mimalloc commits them eagerly on an OS that overcommits, as Linux does, which kept about
/// 10 MiB more resident in an idle server and 20 more under a Kubernetes control plane:
/// docs/bench.md). It must run before the first allocation, which reserves the first arena:
/// on Linux it runs from the executable's initializers ([`CONFIGURE_FIRST`]), before Rust's
/// runtime allocates anything.
pub fn configure() {
    // SAFETY: `mi_option_set` takes an option number and a value, no pointers; mimalloc
    // documents options as settable at any time, and an unknown option number is ignored.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0);
    }
}

/// [`configure`], from the initializers the dynamic loader runs before `main`.
#[cfg(target_os = "linux")]
#[used]
#[allow(unsafe_code)]
// SAFETY: the entry is a plain `extern "C" fn()` with no arguments, as `.init_array` entries
// are; it only sets an allocator option.
#[unsafe(link_section = ".init_array")]
static CONFIGURE_FIRST: extern "C" fn() = configure_first;

#[cfg(target_os = "linux")]
extern "C" fn configure_first() {
    configure();
}

/// Returns this thread's free pages, and every arena page already free, to the OS.
pub fn collect() {
    // SAFETY: `mi_collect` takes no pointers and has no preconditions; mimalloc documents it as
    // callable at any time from any thread, and it only touches the calling thread's heap and
    // the (internally synchronised) arenas.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_collects_once_per_release() {
        // A fresh thread has seen nothing; after one release it collects once, then not again.
        std::thread::spawn(|| {
            release_soon();
            assert!(on_park(), "the first park after a release collects");
            assert!(!on_park(), "a second park without a new release does not");
            release_soon();
            assert!(on_park(), "a new release is collected again");
        })
        .join()
        .unwrap();
    }
}
