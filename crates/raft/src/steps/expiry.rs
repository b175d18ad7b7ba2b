//! The leader's expiry driver, one pass at a time: what is due is revoked, many leases per log
//! entry, and the replicated lease clock is ticked every [`ExpiryConfig::tick`] while leases
//! exist, which bounds how much lease time a restart can lose (docs/lease.md). The driver never
//! polls on a fixed tick for expiry: a pass says when the next one is worth running. A failed
//! proposal is retried, never dropped: the leases stay due in the table until a revoke applies.

use std::time::{Duration, Instant};

use leasehold_lease::{LeaseClock, LeaseId, LeaseTable};

use crate::command::Command;

/// How the driver paces itself.
#[derive(Clone, Copy, Debug)]
pub struct ExpiryConfig {
    /// Lease-clock tick interval: the most lease time a restart can lose.
    pub tick: Duration,
    /// Most leases revoked by one log entry.
    pub revoke_batch_len_max: usize,
    /// Wait before retrying a failed proposal.
    pub retry: Duration,
}

impl Default for ExpiryConfig {
    fn default() -> Self {
        ExpiryConfig {
            tick: Duration::from_millis(500),
            revoke_batch_len_max: 10_000,
            retry: Duration::from_millis(100),
        }
    }
}

/// What a pass asks the leader to commit before the next pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpiryWork {
    /// Revoke `leases` (each with the cover the pass saw), whose told deadlines passed by lease
    /// time `now_ms`; `deadlines` are those told deadlines, for the expiry-lag metric. The caller
    /// marks them as ending ([`crate::steps::LeaderRenewals::ending`]) under the same lock as
    /// the pass, so that no renewal is answered from memory in between.
    Expire {
        leases: Vec<(LeaseId, u64)>,
        now_ms: u64,
        deadlines: Vec<u64>,
    },
    /// Tick the replicated lease clock to `now_ms`.
    Tick { now_ms: u64 },
}

impl ExpiryWork {
    /// The leader-only command that does it (never forwarded: a member deposed meanwhile must
    /// not get its expiries committed by the new leader, etcd#15247).
    pub fn command(&self) -> Command {
        match self {
            ExpiryWork::Expire { leases, now_ms, .. } => Command::LeaseExpireTold {
                leases: leases.clone(),
                now_ms: *now_ms,
            },
            ExpiryWork::Tick { now_ms } => Command::LeaseTick { now_ms: *now_ms },
        }
    }
}

/// One pass's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiryPass {
    /// What to commit first, if anything; the next pass comes after it is applied (or failed,
    /// then after [`ExpiryConfig::retry`]).
    pub work: Option<ExpiryWork>,
    /// When the next pass is due if no lease changes meanwhile: at once after an expiry (more may
    /// be due), else at the next tick or deadline, whichever is first; `None`: only a lease
    /// change can make work.
    pub wake: Option<Instant>,
}

/// One pass of the driver on a leader whose lease clock is `clock`, at `now` on the driver's
/// clock: a pure function of the applied lease table, so the replica and the simulator run the
/// same decisions.
pub fn expiry_pass(
    table: &LeaseTable,
    clock: &LeaseClock,
    now: Instant,
    cfg: &ExpiryConfig,
) -> ExpiryPass {
    let now_ms = clock.now_ms(now);
    let due = table.told_expired(now_ms, cfg.revoke_batch_len_max);
    if !due.is_empty() {
        let deadlines = due
            .iter()
            .filter_map(|(id, _)| table.told_ms(*id))
            .collect();
        return ExpiryPass {
            work: Some(ExpiryWork::Expire {
                leases: due,
                now_ms,
                deadlines,
            }),
            wake: Some(now),
        };
    }
    let any = !table.is_empty();
    let tick_ms = u64::try_from(cfg.tick.as_millis()).unwrap_or(u64::MAX);
    let work = (any && now_ms >= table.clock_ms().saturating_add(tick_ms))
        .then_some(ExpiryWork::Tick { now_ms });
    let next_tick = any.then(|| now + cfg.tick);
    let next_expiry = table.next_told_ms().map(|d| clock.instant_at(d));
    let wake = match (next_tick, next_expiry) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    ExpiryPass { work, wake }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use leasehold_lease::{LeaseClock, LeaseId, LeaseTable};

    use super::{ExpiryConfig, ExpiryWork, expiry_pass};

    fn id(n: i64) -> LeaseId {
        LeaseId::from_wire(n).expect("not zero")
    }

    #[test]
    fn a_lease_is_expired_at_its_deadline_not_a_millisecond_before() {
        let mut table = LeaseTable::new();
        table.grant(id(1), 5, 1_000).expect("granted");
        let base = Instant::now();
        let clock = LeaseClock::promote(1_000, base);
        let cfg = ExpiryConfig {
            tick: Duration::from_secs(3600),
            ..ExpiryConfig::default()
        };
        let deadline = table.record(id(1)).expect("live").deadline_ms;
        let at = clock.instant_at(deadline);
        let before = expiry_pass(&table, &clock, at - Duration::from_millis(1), &cfg);
        assert_eq!(before.work, None, "not due a millisecond early");
        assert_eq!(before.wake, Some(at), "wakes at the deadline");
        let pass = expiry_pass(&table, &clock, at, &cfg);
        assert_eq!(
            pass.work,
            Some(ExpiryWork::Expire {
                leases: vec![(id(1), deadline)],
                now_ms: deadline,
                deadlines: vec![deadline],
            })
        );
        assert_eq!(pass.wake, Some(at), "looks again at once");
    }

    /// A lease renewed from memory to a told deadline before its cover ends at the told one;
    /// the covers of other leases do not hide it from the pass.
    #[test]
    fn a_lease_ends_at_the_deadline_its_holder_was_told_not_at_its_cover() {
        let mut table = LeaseTable::new();
        table.grant(id(1), 5, 0).expect("granted");
        table.renew_covered(id(1), 1_000, 3_000);
        table.grant(id(2), 4, 1_000).expect("granted");
        // Lease 1: told 6,000, covered until 9,000; lease 2: 5,000 both.
        let base = Instant::now();
        let clock = LeaseClock::promote(0, base);
        let cfg = ExpiryConfig {
            tick: Duration::from_secs(3600),
            ..ExpiryConfig::default()
        };
        let at = |ms| base + Duration::from_millis(ms);
        assert_eq!(
            expiry_pass(&table, &clock, at(0), &cfg).wake,
            Some(at(5_000))
        );
        table.expire_told(id(2), 5_000, 5_000).expect("ended");
        let pass = expiry_pass(&table, &clock, at(5_999), &cfg);
        assert_eq!(pass.work, None);
        assert_eq!(
            pass.wake,
            Some(at(6_000)),
            "the told deadline, not the cover"
        );
        assert_eq!(
            expiry_pass(&table, &clock, at(6_000), &cfg).work,
            Some(ExpiryWork::Expire {
                leases: vec![(id(1), 9_000)],
                now_ms: 6_000,
                deadlines: vec![6_000],
            })
        );
    }

    #[test]
    fn the_clock_is_ticked_only_while_leases_exist() {
        let cfg = ExpiryConfig::default();
        let base = Instant::now();
        let clock = LeaseClock::promote(0, base);
        let empty = LeaseTable::new();
        let idle = expiry_pass(&empty, &clock, base + Duration::from_secs(9), &cfg);
        assert_eq!(idle.work, None);
        assert_eq!(idle.wake, None, "nothing to time: only a grant makes work");

        let mut table = LeaseTable::new();
        table.grant(id(7), 60, 0).expect("granted");
        let early = expiry_pass(&table, &clock, base + Duration::from_millis(499), &cfg);
        assert_eq!(early.work, None, "a tick is not due yet");
        assert_eq!(early.wake, Some(base + Duration::from_millis(999)));
        let due = expiry_pass(&table, &clock, base + Duration::from_millis(500), &cfg);
        assert_eq!(due.work, Some(ExpiryWork::Tick { now_ms: 500 }));
    }
}
