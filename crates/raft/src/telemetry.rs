//! What a member counts about itself for its operators: how long the disk takes to commit, how
//! many proposals are in flight or failed, how often the leader changed, how far the log is
//! committed. Plain atomics, written where the events happen and read whole by
//! [`crate::Replica::telemetry`]; the server turns the reading into etcd's Prometheus metrics.
//! This crate knows nothing of Prometheus.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// The upper bounds of a duration histogram's buckets, in seconds, as etcd buckets its disk
/// histograms: 1 ms doubling, 14 buckets (the last ends at 8.192 s); slower goes to +Inf.
pub const DISK_BUCKETS_SECS: [f64; 14] = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
    8.192,
];

/// A histogram of durations over [`DISK_BUCKETS_SECS`]: lock-free, for a hot path.
#[derive(Debug, Default)]
pub(crate) struct DurationHistogram {
    /// Observations per bucket (not cumulative); the last one is +Inf.
    counts: [AtomicU64; DISK_BUCKETS_SECS.len() + 1],
    sum_nanos: AtomicU64,
}

impl DurationHistogram {
    pub(crate) fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let bucket = DISK_BUCKETS_SECS
            .iter()
            .position(|upper| secs <= *upper)
            .unwrap_or(DISK_BUCKETS_SECS.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn read(&self) -> HistogramReading {
        let mut bucket_counts = [0; DISK_BUCKETS_SECS.len()];
        for (i, slot) in bucket_counts.iter_mut().enumerate() {
            *slot = self.counts[i].load(Ordering::Relaxed);
        }
        let past_last = self.counts[DISK_BUCKETS_SECS.len()].load(Ordering::Relaxed);
        HistogramReading {
            bucket_counts,
            count: bucket_counts.iter().sum::<u64>() + past_last,
            sum_secs: Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed)).as_secs_f64(),
        }
    }
}

/// A reading of a [`DurationHistogram`], in Prometheus's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HistogramReading {
    /// Observations in each bucket of [`DISK_BUCKETS_SECS`]: above the previous bound, at or
    /// below this one (not cumulative).
    pub bucket_counts: [u64; DISK_BUCKETS_SECS.len()],
    /// All observations (the +Inf bucket).
    pub count: u64,
    pub sum_secs: f64,
}

/// The member's counters, shared by the storage, the proposers and the leadership watcher.
#[derive(Debug, Default)]
pub(crate) struct Telemetry {
    /// Every fsync'd commit of the log (which carries the state machine's staged rows too).
    pub(crate) log_commit: DurationHistogram,
    /// Every commit that wrote state-machine rows: log commits that carried some, and snapshot
    /// installs.
    pub(crate) state_commit: DurationHistogram,
    proposals_pending: AtomicI64,
    proposals_failed: AtomicU64,
    leader_changes: AtomicU64,
    committed_index: AtomicU64,
}

impl Telemetry {
    /// Counts a proposal in flight until the guard drops.
    pub(crate) fn proposing(&self) -> PendingProposal<'_> {
        self.proposals_pending.fetch_add(1, Ordering::Relaxed);
        PendingProposal(self)
    }

    pub(crate) fn proposal_failed(&self) {
        self.proposals_failed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn leader_changed(&self) {
        self.leader_changes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn committed(&self, index: u64) {
        self.committed_index.fetch_max(index, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> TelemetryReading {
        TelemetryReading {
            log_commit: self.log_commit.read(),
            state_commit: self.state_commit.read(),
            proposals_pending: self.proposals_pending.load(Ordering::Relaxed).max(0),
            proposals_failed: self.proposals_failed.load(Ordering::Relaxed),
            leader_changes: self.leader_changes.load(Ordering::Relaxed),
            committed_index: self.committed_index.load(Ordering::Relaxed),
        }
    }
}

/// A proposal in flight; dropping it ends it.
pub(crate) struct PendingProposal<'a>(&'a Telemetry);

impl Drop for PendingProposal<'_> {
    fn drop(&mut self) {
        self.0.proposals_pending.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What [`crate::Replica::telemetry`] reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TelemetryReading {
    pub log_commit: HistogramReading,
    pub state_commit: HistogramReading,
    pub proposals_pending: i64,
    pub proposals_failed: u64,
    /// How many times this member has seen a new leader (the first one included), as etcd
    /// counts `leader_changes_seen`.
    pub leader_changes: u64,
    /// The highest log index this member knows to be committed.
    pub committed_index: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_reads_its_buckets_and_its_sum() {
        let h = DurationHistogram::default();
        for ms in [0, 1, 3, 3, 100, 10_000] {
            h.observe(Duration::from_millis(ms));
        }
        let r = h.read();
        // <=1ms: 0 and 1; (2,4]ms: 3 and 3; (64,128]ms: 100; 10 s is past the last bound.
        let mut expected = [0; DISK_BUCKETS_SECS.len()];
        expected[0] = 2;
        expected[2] = 2;
        expected[7] = 1;
        assert_eq!(r.bucket_counts, expected);
        assert_eq!(r.count, 6);
        assert!((r.sum_secs - 10.107).abs() < 1e-9, "{}", r.sum_secs);
    }

    #[test]
    fn pending_proposals_end_with_their_guard() {
        let t = Telemetry::default();
        let a = t.proposing();
        let b = t.proposing();
        assert_eq!(t.read().proposals_pending, 2);
        drop(a);
        assert_eq!(t.read().proposals_pending, 1);
        drop(b);
        t.committed(7);
        t.committed(5);
        let r = t.read();
        assert_eq!((r.proposals_pending, r.committed_index), (0, 7));
    }
}
