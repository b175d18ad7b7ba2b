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
//! This crate holds the workspace's only `unsafe` code: the call to `mi_collect`.

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
