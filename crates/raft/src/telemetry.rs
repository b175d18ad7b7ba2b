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

/// etcd's apply buckets: 0.1 ms doubling, 20 buckets (the last ends at about 52 s).
pub const APPLY_BUCKETS_SECS: [f64; 20] = [
    0.0001, 0.0002, 0.0004, 0.0008, 0.0016, 0.0032, 0.0064, 0.0128, 0.0256, 0.0512, 0.1024, 0.2048,
    0.4096, 0.8192, 1.6384, 3.2768, 6.5536, 13.1072, 26.2144, 52.4288,
];

/// etcd's index-compaction pause buckets, in seconds: 0.5 ms doubling, 14 buckets.
pub const COMPACTION_PAUSE_BUCKETS_SECS: [f64; 14] = [
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048,
    4.096,
];

/// etcd's snapshot-save buckets, in seconds: 0.1 s doubling, 10 buckets.
pub const SNAPSHOT_SAVE_BUCKETS_SECS: [f64; 10] =
    [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2];

/// A histogram of durations over fixed bucket bounds: lock-free, for a hot path.
#[derive(Debug)]
pub(crate) struct DurationHistogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last one is +Inf.
    counts: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

impl Default for DurationHistogram {
    fn default() -> DurationHistogram {
        DurationHistogram::new(&DISK_BUCKETS_SECS)
    }
}

impl DurationHistogram {
    pub(crate) fn new(bounds: &'static [f64]) -> DurationHistogram {
        DurationHistogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let bucket = self
            .bounds
            .iter()
            .position(|upper| secs <= *upper)
            .unwrap_or(self.bounds.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> HistogramReading {
        let bucket_counts: Vec<u64> = self.counts[..self.bounds.len()]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let past_last = self.counts[self.bounds.len()].load(Ordering::Relaxed);
        HistogramReading {
            bounds_secs: self.bounds,
            count: bucket_counts.iter().sum::<u64>() + past_last,
            bucket_counts,
            sum_secs: Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed)).as_secs_f64(),
        }
    }
}

/// A reading of a [`DurationHistogram`], in Prometheus's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramReading {
    /// The buckets' upper bounds, in seconds.
    pub bounds_secs: &'static [f64],
    /// Observations in each bucket: above the previous bound, at or below this one (not
    /// cumulative).
    pub bucket_counts: Vec<u64>,
    /// All observations (the +Inf bucket).
    pub count: u64,
    pub sum_secs: f64,
}

/// How long applying each kind of command took on this member, by kind and outcome, as etcd's
/// `apply_duration_seconds` labels them (`op`, `success`).
#[derive(Debug, Default)]
pub(crate) struct ApplyTimes {
    by_op: std::sync::Mutex<std::collections::BTreeMap<(&'static str, bool), DurationHistogram>>,
    /// Applies slower than [`SLOW_APPLY`].
    slow: AtomicU64,
}

/// An apply slower than this is slow (etcd's default `--warning-apply-duration`).
pub(crate) const SLOW_APPLY: Duration = Duration::from_millis(100);

impl ApplyTimes {
    /// One apply batch's commands: (kind, succeeded, how long), under one lock.
    pub(crate) fn observe(
        &self,
        applies: impl IntoIterator<Item = (&'static str, bool, Duration)>,
    ) {
        let mut by_op = self.by_op.lock().expect("apply times lock poisoned");
        for (op, ok, took) in applies {
            if took > SLOW_APPLY {
                self.slow.fetch_add(1, Ordering::Relaxed);
            }
            by_op
                .entry((op, ok))
                .or_insert_with(|| DurationHistogram::new(&APPLY_BUCKETS_SECS))
                .observe(took);
        }
    }

    fn read(&self) -> (Vec<(&'static str, bool, HistogramReading)>, u64) {
        let by_op = self.by_op.lock().expect("apply times lock poisoned");
        let readings = by_op
            .iter()
            .map(|((op, ok), h)| (*op, *ok, h.read()))
            .collect();
        (readings, self.slow.load(Ordering::Relaxed))
    }
}

/// What compactions did on this member.
#[derive(Debug)]
pub(crate) struct CompactionStats {
    /// Versions removed from the store.
    pub(crate) versions_removed: AtomicU64,
    /// When the last compaction was applied (Unix seconds; 0 before one since the start).
    pub(crate) last_unix_secs: AtomicU64,
    /// How long each compaction held the apply back.
    pub(crate) pause: DurationHistogram,
}

impl Default for CompactionStats {
    fn default() -> CompactionStats {
        CompactionStats {
            versions_removed: AtomicU64::new(0),
            last_unix_secs: AtomicU64::new(0),
            pause: DurationHistogram::new(&COMPACTION_PAUSE_BUCKETS_SECS),
        }
    }
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
    /// Applies of client and member commands, by kind.
    pub(crate) apply: ApplyTimes,
    /// Bytes of keys and values put, as applied.
    pub(crate) put_bytes: AtomicU64,
    pub(crate) compaction: CompactionStats,
    /// Each write to the log's file, before its sync.
    pub(crate) wal_write: DurationHistogram,
    /// Bytes written to the log's file.
    pub(crate) wal_bytes: AtomicU64,
    /// Times the transport reported a peer it could not deliver a Raft message to.
    pub(crate) undelivered: AtomicU64,
    /// Learners this member promoted as leader.
    pub(crate) learners_promoted: AtomicU64,
    /// Read-index rounds that failed (no leader, or no quorum in time).
    pub(crate) read_indexes_failed: AtomicU64,
    /// Read-index rounds that took longer than [`SLOW_READ_INDEX`].
    pub(crate) read_indexes_slow: AtomicU64,
    /// Installing a leader's snapshot: 1 while one is installed.
    pub(crate) snapshot_installing: AtomicI64,
    /// How long installing a leader's snapshot took, from its arrival to its durable commit.
    pub(crate) snapshot_install: DurationHistogramSnap,
}

/// A read-index round slower than this is slow (etcd retries a read index after 500 ms).
pub(crate) const SLOW_READ_INDEX: Duration = Duration::from_millis(500);

/// [`DurationHistogram`] over [`SNAPSHOT_SAVE_BUCKETS_SECS`].
#[derive(Debug)]
pub(crate) struct DurationHistogramSnap(pub(crate) DurationHistogram);

impl Default for DurationHistogramSnap {
    fn default() -> DurationHistogramSnap {
        DurationHistogramSnap(DurationHistogram::new(&SNAPSHOT_SAVE_BUCKETS_SECS))
    }
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

    /// One append written to the log's file: its bytes, and the write before its sync.
    pub(crate) fn wal_written(&self, bytes: u64, write: Duration) {
        self.wal_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.wal_write.observe(write);
    }

    /// A compaction applied: the versions it removed, and how long it held the apply back.
    pub(crate) fn compacted(&self, versions_removed: u64, took: Duration) {
        let c = &self.compaction;
        c.versions_removed
            .fetch_add(versions_removed, Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        c.last_unix_secs.store(now, Ordering::Relaxed);
        c.pause.observe(took);
    }

    /// Marks a leader's snapshot being installed until the guard drops, which times it.
    pub(crate) fn installing_snapshot(&self) -> InstallingSnapshot<'_> {
        self.snapshot_installing.fetch_add(1, Ordering::Relaxed);
        InstallingSnapshot {
            telemetry: self,
            began: std::time::Instant::now(),
        }
    }

    /// A read-index round ended after `took`; `failed` when it got no index.
    pub(crate) fn read_index_round(&self, failed: bool, took: Duration) {
        if failed {
            self.read_indexes_failed.fetch_add(1, Ordering::Relaxed);
        }
        if took > SLOW_READ_INDEX {
            self.read_indexes_slow.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn committed(&self, index: u64) {
        self.committed_index.fetch_max(index, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> TelemetryReading {
        let (apply, slow_applies) = self.apply.read();
        TelemetryReading {
            wal_write: self.wal_write.read(),
            wal_bytes: self.wal_bytes.load(Ordering::Relaxed),
            apply,
            slow_applies,
            put_bytes: self.put_bytes.load(Ordering::Relaxed),
            compacted_versions: self.compaction.versions_removed.load(Ordering::Relaxed),
            compacted_last_unix_secs: self.compaction.last_unix_secs.load(Ordering::Relaxed),
            compaction_pause: self.compaction.pause.read(),
            learners_promoted: self.learners_promoted.load(Ordering::Relaxed),
            read_indexes_failed: self.read_indexes_failed.load(Ordering::Relaxed),
            read_indexes_slow: self.read_indexes_slow.load(Ordering::Relaxed),
            snapshot_installing: self.snapshot_installing.load(Ordering::Relaxed) > 0,
            snapshot_install: self.snapshot_install.0.read(),
            log_commit: self.log_commit.read(),
            state_commit: self.state_commit.read(),
            proposals_pending: self.proposals_pending.load(Ordering::Relaxed).max(0),
            proposals_failed: self.proposals_failed.load(Ordering::Relaxed),
            leader_changes: self.leader_changes.load(Ordering::Relaxed),
            committed_index: self.committed_index.load(Ordering::Relaxed),
        }
    }
}

/// A snapshot install in progress ([`Telemetry::installing_snapshot`]).
pub(crate) struct InstallingSnapshot<'a> {
    telemetry: &'a Telemetry,
    began: std::time::Instant,
}

impl Drop for InstallingSnapshot<'_> {
    fn drop(&mut self) {
        self.telemetry
            .snapshot_install
            .0
            .observe(self.began.elapsed());
        self.telemetry
            .snapshot_installing
            .fetch_sub(1, Ordering::Relaxed);
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
#[derive(Clone, Debug, PartialEq)]
pub struct TelemetryReading {
    /// Writes to the log's file, before their syncs.
    pub wal_write: HistogramReading,
    /// Bytes written to the log's file.
    pub wal_bytes: u64,
    /// Apply times by (op, succeeded).
    pub apply: Vec<(&'static str, bool, HistogramReading)>,
    /// Applies slower than 100 ms.
    pub slow_applies: u64,
    pub put_bytes: u64,
    pub compacted_versions: u64,
    /// Unix seconds of the last compaction applied since the start (0: none).
    pub compacted_last_unix_secs: u64,
    pub compaction_pause: HistogramReading,
    pub learners_promoted: u64,
    pub read_indexes_failed: u64,
    pub read_indexes_slow: u64,
    pub snapshot_installing: bool,
    pub snapshot_install: HistogramReading,
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
        assert_eq!(r.bucket_counts, expected.to_vec());
        assert_eq!(r.count, 6);
        assert!((r.sum_secs - 10.107).abs() < 1e-9, "{}", r.sum_secs);
    }

    #[test]
    fn applies_are_timed_by_kind_and_outcome_and_slow_ones_counted() {
        let t = Telemetry::default();
        t.apply.observe([
            ("Put", true, Duration::from_micros(150)),
            ("Put", true, Duration::from_millis(150)),
            ("Put", false, Duration::from_micros(50)),
        ]);
        let r = t.read();
        let kinds: Vec<(&str, bool, u64)> = r
            .apply
            .iter()
            .map(|(op, ok, h)| (*op, *ok, h.count))
            .collect();
        assert_eq!(kinds, vec![("Put", false, 1), ("Put", true, 2)]);
        assert_eq!(r.slow_applies, 1);
        assert_eq!(r.apply[1].2.bounds_secs, &APPLY_BUCKETS_SECS);
        // 150 us: above 0.1 ms, at or below 0.2 ms.
        assert_eq!(r.apply[1].2.bucket_counts[1], 1);
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
