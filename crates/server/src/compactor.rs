//! Automatic compaction, as etcd's `--auto-compaction-mode` and `--auto-compaction-retention`
//! define it. Every member keeps the schedule; only the leader proposes the compaction (as etcd
//! pauses its compactor on followers), through the log like a client's Compact.
//!
//! - `revision`: every 5 minutes, compact to `current revision - retention`, unless that is not
//!   positive or was already compacted to.
//! - `periodic`: keep `retention` of history. The revision is sampled every tenth of the
//!   retention (of an hour at most); the first compaction comes `retention` after the start, to
//!   the revision sampled then, and later ones every `min(retention, 1h)`, each to the revision
//!   sampled `retention` ago.
//!
//! The schedules ([`Periodic`], [`ByRevision`]) are plain state machines over the instants they
//! are given, so tests drive them with a manual clock; [`drive_auto_compaction`] runs one on
//! tokio's clock.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use leasehold_raft::{Compact, Replica};
use tokio::sync::watch;
use tokio::time::Instant;

/// The parsed `--auto-compaction-*` flags (`leasehold_node` reads them as etcd does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Keep this much history (by time).
    Periodic(Duration),
    /// Keep this many revisions.
    Revision(i64),
}

/// What a compaction attempt came to, as the schedules need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Compacted, or the revision was already compacted (etcd counts both as done).
    Done,
    Failed,
}

/// The periodic schedule.
#[derive(Debug)]
pub struct Periodic {
    period: Duration,
    /// How often the revision is sampled, and a failed compaction retried.
    sample_every: Duration,
    /// Between compactions, once the first has happened.
    compact_every: Duration,
    /// `revs[0]` is the revision sampled `period` ago (once that long has passed).
    revs: VecDeque<i64>,
    samples_kept: usize,
    last_success: Instant,
    /// `period` until the first compaction, `compact_every` after it.
    wait: Duration,
}

impl Periodic {
    pub fn new(period: Duration, now: Instant) -> Periodic {
        let compact_every = period.min(Duration::from_secs(3600));
        let sample_every = (compact_every / 10).max(Duration::from_millis(1));
        let samples_kept = usize::try_from(period.as_nanos() / sample_every.as_nanos())
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        Periodic {
            period,
            sample_every,
            compact_every,
            revs: VecDeque::new(),
            samples_kept,
            last_success: now,
            wait: period,
        }
    }

    /// How long to wait after [`Periodic::sample`] before [`Periodic::due`].
    pub fn sample_every(&self) -> Duration {
        self.sample_every
    }

    /// Records the current revision; called every `sample_every`, leader or not.
    pub fn sample(&mut self, revision: i64) {
        self.revs.push_back(revision);
        if self.revs.len() > self.samples_kept {
            self.revs.pop_front();
        }
    }

    /// The revision to compact to now, if it is time.
    pub fn due(&mut self, now: Instant) -> Option<i64> {
        if now.saturating_duration_since(self.last_success) < self.wait {
            return None;
        }
        self.wait = self.compact_every;
        self.revs.front().copied().filter(|rev| *rev > 0)
    }

    pub fn finished(&mut self, outcome: Outcome, now: Instant) {
        if outcome == Outcome::Done {
            self.last_success = now;
        }
    }

    pub fn period(&self) -> Duration {
        self.period
    }
}

/// The revision schedule: every 5 minutes.
#[derive(Debug)]
pub struct ByRevision {
    retention: i64,
    /// The last revision compacted to.
    done: i64,
}

impl ByRevision {
    pub const INTERVAL: Duration = Duration::from_secs(5 * 60);

    pub fn new(retention: i64) -> ByRevision {
        ByRevision { retention, done: 0 }
    }

    /// The revision to compact to, checked every [`ByRevision::INTERVAL`].
    pub fn due(&self, current: i64) -> Option<i64> {
        let rev = current.saturating_sub(self.retention);
        (rev > 0 && rev != self.done).then_some(rev)
    }

    pub fn finished(&mut self, rev: i64, outcome: Outcome) {
        if outcome == Outcome::Done {
            self.done = rev;
        }
    }
}

/// Runs the schedule until `shutdown` turns true.
pub async fn drive_auto_compaction(
    replica: Arc<Replica>,
    mode: AutoCompaction,
    mut shutdown: watch::Receiver<bool>,
) {
    let current = |replica: &Replica| replica.read_local(|store, _, _| store.current_revision());
    match mode {
        AutoCompaction::Periodic(period) => {
            let mut schedule = Periodic::new(period, Instant::now());
            // Every member samples its revision on the timer, leader or not, as etcd's periodic
            // compactor does: a member that becomes leader compacts to the revision it had
            // `period` ago without first waiting a whole period.
            loop {
                schedule.sample(current(&replica));
                tokio::select! {
                    () = tokio::time::sleep(schedule.sample_every()) => {}
                    _ = shutdown.changed() => return,
                }
                if !replica.is_leader() {
                    continue;
                }
                let Some(rev) = schedule.due(Instant::now()) else {
                    continue;
                };
                let outcome = compact(&replica, rev, &format!("{:?}", schedule.period())).await;
                schedule.finished(outcome, Instant::now());
            }
        }
        AutoCompaction::Revision(retention) => {
            let mut schedule = ByRevision::new(retention);
            loop {
                // A follower sleeps until it leads, then the interval.
                tokio::select! {
                    () = replica.until_leading() => {}
                    _ = shutdown.changed() => return,
                }
                tokio::select! {
                    () = tokio::time::sleep(ByRevision::INTERVAL) => {}
                    _ = shutdown.changed() => return,
                }
                if !replica.is_leader() {
                    continue;
                }
                if let Some(rev) = schedule.due(current(&replica)) {
                    let outcome = compact(&replica, rev, &format!("{retention} revisions")).await;
                    schedule.finished(rev, outcome);
                }
            }
        }
    }
}

async fn compact(replica: &Replica, revision: i64, retention: &str) -> Outcome {
    tracing::info!(revision, retention, "starting auto compaction");
    let started = std::time::Instant::now();
    match replica.propose(Compact { revision }).await {
        Ok(Ok(_)) => {
            tracing::info!(revision, took = ?started.elapsed(), "completed auto compaction");
            Outcome::Done
        }
        Ok(Err(leasehold_mvcc::Error::Compacted)) => Outcome::Done,
        Ok(Err(e)) => {
            tracing::warn!(revision, "failed auto compaction: {e}");
            Outcome::Failed
        }
        Err(e) => {
            tracing::warn!(revision, "failed auto compaction: {e}");
            Outcome::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a periodic schedule as the driver does, one sample per step, with the revision
    /// growing by 10 each step; returns (step, revision) of each compaction.
    fn run_periodic(period: Duration, steps: u32, fail_first: bool) -> Vec<(u32, i64)> {
        let start = Instant::now();
        let mut p = Periodic::new(period, start);
        let mut now = start;
        let mut out = Vec::new();
        let mut failed = false;
        for step in 0..steps {
            p.sample(i64::from(step) * 10 + 1);
            now += p.sample_every();
            if let Some(rev) = p.due(now) {
                if fail_first && !failed {
                    failed = true;
                    p.finished(Outcome::Failed, now);
                    continue;
                }
                out.push((step, rev));
                p.finished(Outcome::Done, now);
            }
        }
        out
    }

    #[test]
    fn periodic_keeps_the_retention_of_history() {
        // 10 minutes: samples every minute; the first compaction after 10 minutes, to the
        // revision of the start; then every 10 minutes, each to the revision of 10 minutes
        // before.
        let got = run_periodic(Duration::from_secs(600), 31, false);
        assert_eq!(got, vec![(9, 1), (19, 91), (29, 191)]);
    }

    #[test]
    fn periodic_over_an_hour_compacts_hourly() {
        // 2 hours: samples every 6 minutes (step), the first after 2 hours (20 steps), then
        // hourly (10 steps), always to the revision of 2 hours (20 samples) before.
        let got = run_periodic(Duration::from_secs(7200), 41, false);
        assert_eq!(got, vec![(19, 1), (29, 91), (39, 191)]);
    }

    #[test]
    fn periodic_retries_a_failure_at_the_next_sample() {
        let got = run_periodic(Duration::from_secs(600), 12, true);
        // Failed at step 9; retried at step 10, to the oldest revision kept (sampled 11 minutes
        // before).
        assert_eq!(got, vec![(10, 1)]);
    }

    #[test]
    fn revision_mode_keeps_the_last_retention_revisions() {
        let mut r = ByRevision::new(100);
        assert_eq!(r.due(50), None, "nothing before revision 1 to compact");
        assert_eq!(r.due(100), None);
        assert_eq!(r.due(150), Some(50));
        r.finished(50, Outcome::Failed);
        assert_eq!(r.due(150), Some(50), "a failure is retried");
        r.finished(50, Outcome::Done);
        assert_eq!(r.due(150), None, "no writes since: nothing new");
        assert_eq!(r.due(151), Some(51));
    }
}
