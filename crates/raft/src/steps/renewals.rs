//! The leader's renewals (docs/lease.md, "Renewals"): answered from memory while the lease's
//! cover reaches the new deadline, through the log when it does not, and never while the expiry
//! driver is ending the lease. The replica runs these steps under one lock for renewals and
//! expiry passes alike; the simulator runs them event by event.

use std::collections::HashSet;

use leasehold_lease::{LeaseId, LeaseTable, MemoryRenewal};

/// What a renewal on the leader does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewStep {
    /// Answered now: renewed for `ttl_secs`. `cover`: also extend the lease's cover through
    /// the log, in the background (nobody waits for it), because less than half a margin of it
    /// is left.
    Answer { ttl_secs: i64, cover: bool },
    /// Answer TTL 0: no such lease.
    NotFound,
    /// The deadline its holder was told has passed: commit `LeaseExpireTold` for it at the
    /// cover given (the lease is marked as ending), then answer TTL 0 if that revoked it and
    /// renew again if not.
    Expire { cover_ms: u64 },
    /// Renew through the log (a `LeaseCover`), answered once applied: the cover is too short,
    /// or the expiry driver is ending the lease (the log orders the two).
    ThroughLog,
}

/// How many times a leader decides one renewal. An end it asked for ([`RenewStep::Expire`])
/// that found the lease renewed through the log first revoked nothing, and the renewal is
/// decided again; each decision finds a later deadline, so a second is normally the last.
pub const RENEW_DECISIONS_MAX: usize = 3;

/// What a renewal does once the end it asked for ([`RenewStep::Expire`]) has applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterEnd {
    /// Answer TTL 0: the lease is gone.
    Gone,
    /// Decide it again: the end revoked nothing (a renewal through the log moved the cover
    /// first), and the lease lives on.
    DecideAgain,
    /// Answer "no leader" (the client asks again): [`RENEW_DECISIONS_MAX`] decisions were made.
    GiveUp,
}

/// A renewal's next step after the end it asked for has applied, whether the lease still
/// exists, after `decisions` decisions of it. The same rule for a renewal from the leader's own
/// client and one a follower forwarded, on the replica and in the simulator.
pub fn after_end(lease_exists: bool, decisions: usize) -> AfterEnd {
    if !lease_exists {
        AfterEnd::Gone
    } else if decisions < RENEW_DECISIONS_MAX {
        AfterEnd::DecideAgain
    } else {
        AfterEnd::GiveUp
    }
}

/// The leader's bookkeeping beside the lease table: leases whose expiry is being committed, and
/// leases whose cover is being extended in the background.
#[derive(Debug, Default)]
pub struct LeaderRenewals {
    ending: HashSet<LeaseId>,
    covering: HashSet<LeaseId>,
}

impl LeaderRenewals {
    /// A renewal of `id` at lease time `now_ms` (rounded up, `LeaseClock::now_ms_ceil`), with
    /// covers `margin_ms` long.
    pub fn renew(
        &mut self,
        table: &LeaseTable,
        id: LeaseId,
        now_ms: u64,
        margin_ms: u64,
    ) -> RenewStep {
        if self.ending.contains(&id) {
            return RenewStep::ThroughLog;
        }
        match table.renew_in_memory(id, now_ms) {
            MemoryRenewal::Renewed { ttl_secs, slack_ms } => {
                let cover = margin_ms > 0 && slack_ms < margin_ms / 2 && self.covering.insert(id);
                RenewStep::Answer { ttl_secs, cover }
            }
            MemoryRenewal::NotFound => RenewStep::NotFound,
            MemoryRenewal::Expired { cover_ms } => {
                self.ending.insert(id);
                RenewStep::Expire { cover_ms }
            }
            MemoryRenewal::Uncovered => RenewStep::ThroughLog,
        }
    }

    /// The expiry driver is committing the end of these leases: renewals of them go through
    /// the log until [`LeaderRenewals::ended`].
    pub fn ending(&mut self, ids: impl IntoIterator<Item = LeaseId>) {
        self.ending.extend(ids);
    }

    /// The end of these leases was applied, or failed to commit.
    pub fn ended(&mut self, ids: impl IntoIterator<Item = LeaseId>) {
        for id in ids {
            self.ending.remove(&id);
        }
    }

    /// The background cover of `id` was applied, or failed.
    pub fn covered(&mut self, id: LeaseId) {
        self.covering.remove(&id);
    }

    /// Forgets everything: at promotion and demotion.
    pub fn clear(&mut self) {
        self.ending.clear();
        self.covering.clear();
    }
}

#[cfg(test)]
mod tests {
    use leasehold_lease::{LeaseId, LeaseTable, Renewal};

    use super::{AfterEnd, LeaderRenewals, RENEW_DECISIONS_MAX, RenewStep, after_end};

    fn id(n: i64) -> LeaseId {
        LeaseId::from_wire(n).expect("not zero")
    }

    const MARGIN: u64 = 4_000;

    /// A lease of TTL 10 s granted at 0 and renewed through the log at 1,000: told 11,000,
    /// covered until 15,000.
    fn covered_lease() -> LeaseTable {
        let mut t = LeaseTable::new();
        t.grant(id(1), 10, 0).expect("granted");
        assert_eq!(
            t.renew_covered(id(1), 1_000, MARGIN),
            Renewal::Renewed { ttl_secs: 10 }
        );
        t
    }

    #[test]
    fn a_renewal_within_the_cover_is_answered_from_memory_and_moves_only_the_told_deadline() {
        let t = covered_lease();
        let mut r = LeaderRenewals::default();
        assert_eq!(
            r.renew(&t, id(1), 2_000, MARGIN),
            RenewStep::Answer {
                ttl_secs: 10,
                cover: false
            }
        );
        assert_eq!(t.told_ms(id(1)), Some(12_000));
        assert_eq!(t.record(id(1)).expect("live").deadline_ms, 15_000);
        // 4,000 of cover left is not less than half the margin; 1,000 is: cover again, once.
        assert_eq!(
            r.renew(&t, id(1), 4_000, MARGIN),
            RenewStep::Answer {
                ttl_secs: 10,
                cover: true
            }
        );
        assert_eq!(
            r.renew(&t, id(1), 4_500, MARGIN),
            RenewStep::Answer {
                ttl_secs: 10,
                cover: false
            },
            "one background cover at a time"
        );
        r.covered(id(1));
        assert_eq!(
            r.renew(&t, id(1), 4_500, MARGIN),
            RenewStep::Answer {
                ttl_secs: 10,
                cover: true
            }
        );
    }

    #[test]
    fn a_renewal_past_the_cover_goes_through_the_log() {
        let t = covered_lease();
        let mut r = LeaderRenewals::default();
        assert_eq!(r.renew(&t, id(1), 5_001, MARGIN), RenewStep::ThroughLog);
        assert_eq!(t.told_ms(id(1)), Some(11_000), "nothing promised");
    }

    #[test]
    fn a_lease_past_its_told_deadline_is_ended_not_renewed_even_within_its_cover() {
        let t = covered_lease();
        let mut r = LeaderRenewals::default();
        assert_eq!(
            r.renew(&t, id(1), 11_001, MARGIN),
            RenewStep::Expire { cover_ms: 15_000 }
        );
        assert_eq!(
            r.renew(&t, id(1), 11_002, MARGIN),
            RenewStep::ThroughLog,
            "while it is ending, renewals are ordered by the log"
        );
        r.ended([id(1)]);
        assert_eq!(
            r.renew(&t, id(1), 11_003, MARGIN),
            RenewStep::Expire { cover_ms: 15_000 }
        );
        assert_eq!(r.renew(&t, id(2), 1, MARGIN), RenewStep::NotFound);
    }

    #[test]
    fn an_expiry_that_lost_the_race_to_a_renewal_through_the_log_revokes_nothing() {
        let mut t = covered_lease();
        // The leader saw the cover at 15,000; a renewal through the log moved it first.
        assert_eq!(
            t.renew_covered(id(1), 10_000, MARGIN),
            Renewal::Renewed { ttl_secs: 10 }
        );
        assert_eq!(t.expire_told(id(1), 11_001, 15_000), None);
        assert!(t.contains(id(1)));
        // With the cover it saw, the lease ends, even though its cover has not passed.
        assert!(t.expire_told(id(1), 20_001, 24_000).is_some());
        assert!(!t.contains(id(1)));
    }

    #[test]
    fn a_renewal_whose_end_revoked_nothing_is_decided_again_a_bounded_number_of_times() {
        assert_eq!(after_end(false, 1), AfterEnd::Gone);
        assert_eq!(after_end(true, 1), AfterEnd::DecideAgain);
        assert_eq!(
            after_end(true, RENEW_DECISIONS_MAX - 1),
            AfterEnd::DecideAgain
        );
        assert_eq!(after_end(true, RENEW_DECISIONS_MAX), AfterEnd::GiveUp);
        assert_eq!(after_end(false, RENEW_DECISIONS_MAX), AfterEnd::Gone);
    }
}
