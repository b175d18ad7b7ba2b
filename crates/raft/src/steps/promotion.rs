//! When a member starts and stops timing leases (docs/lease.md). A new leader first confirms its
//! leadership with a read index and applies everything committed before its term, so it inherits
//! the latest lease deadlines and lease time; it then commits a `LeasePromote`, which extends
//! every inherited lease by the election timeout, and only once that is applied does it time
//! leases, from the lease time it proposed. It stops timing leases as soon as it does not lead.
//!
//! The replica drives this from its leadership watch, awaiting each step; the simulator drives
//! the same struct event by event.

use std::time::{Duration, Instant};

use leasehold_lease::LeaseClock;

use crate::command::Command;

/// One member's promotion, step by step.
#[derive(Clone, Copy, Debug, Default)]
pub struct Promotion {
    /// The term this member last started timing leases in.
    promoted_term: Option<u64>,
    stage: Stage,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Stage {
    #[default]
    Idle,
    /// Waiting for the read index of `term`, and for this member to apply that far.
    Confirming { term: u64 },
    /// `LeasePromote` at `lease_ms` proposed in `term`, waiting to be applied.
    Committing { term: u64, lease_ms: u64 },
}

/// What leadership asks of the member next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromotionStep {
    /// Nothing until leadership changes or a step under way completes.
    Wait,
    /// Confirm leadership with a read index, apply up to it (everything committed before
    /// `term`), then call [`Promotion::confirmed`], or [`Promotion::failed`] if that failed.
    Confirm { term: u64 },
    /// Stop timing leases now: another member leads, or none does.
    Demote,
}

impl Promotion {
    /// Leadership as this member sees it now: leading or not, in `term`.
    pub fn leadership(&mut self, leading: bool, term: u64) -> PromotionStep {
        if !leading {
            self.stage = Stage::Idle;
            return match self.promoted_term.take() {
                Some(_) => PromotionStep::Demote,
                None => PromotionStep::Wait,
            };
        }
        if self.promoted_term == Some(term) {
            return PromotionStep::Wait;
        }
        match self.stage {
            Stage::Confirming { term: t } | Stage::Committing { term: t, .. } if t == term => {
                PromotionStep::Wait
            }
            _ => {
                self.stage = Stage::Confirming { term };
                PromotionStep::Confirm { term }
            }
        }
    }

    /// Leadership in `term` is confirmed and everything committed before it is applied here:
    /// the command to commit on this member's own Raft (never forwarded: only a leader promotes
    /// itself), then call [`Promotion::committed`]. `lease_now_ms` is the old leader's last lease
    /// time plus what this member has seen pass since it appended it (`lease_time_at`): the
    /// election gap counts, as it does for the clients. `None` if the promotion was overtaken.
    pub fn confirmed(
        &mut self,
        term: u64,
        lease_now_ms: u64,
        election_timeout: Duration,
    ) -> Option<Command> {
        if self.stage != (Stage::Confirming { term }) {
            return None;
        }
        self.stage = Stage::Committing {
            term,
            lease_ms: lease_now_ms,
        };
        Some(Command::LeasePromote {
            now_ms: lease_now_ms,
            extend_ms: u64::try_from(election_timeout.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// The promotion's command, proposed in `term`, is applied here at `now`: the lease clock
    /// this member times leases with from now on. `None` if the promotion was overtaken.
    pub fn committed(&mut self, term: u64, now: Instant) -> Option<LeaseClock> {
        let Stage::Committing { term: t, lease_ms } = self.stage else {
            return None;
        };
        if t != term {
            return None;
        }
        self.stage = Stage::Idle;
        self.promoted_term = Some(term);
        Some(LeaseClock::promote(lease_ms, now))
    }

    /// A step of the promotion in `term` failed (no read index, a dropped proposal): the next
    /// [`Promotion::leadership`] call starts it again.
    pub fn failed(&mut self, term: u64) {
        match self.stage {
            Stage::Confirming { term: t } | Stage::Committing { term: t, .. } if t == term => {
                self.stage = Stage::Idle;
            }
            _ => {}
        }
    }

    /// The term this member times leases for, if it does.
    pub fn promoted_term(&self) -> Option<u64> {
        self.promoted_term
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Promotion, PromotionStep};
    use crate::command::Command;

    const ELECTION: Duration = Duration::from_millis(1000);

    #[test]
    fn a_leader_times_leases_only_after_its_promotion_is_applied() {
        let mut p = Promotion::default();
        assert_eq!(p.leadership(true, 3), PromotionStep::Confirm { term: 3 });
        assert_eq!(
            p.leadership(true, 3),
            PromotionStep::Wait,
            "one promotion at a time"
        );
        assert_eq!(
            p.confirmed(3, 40_000, ELECTION),
            Some(Command::LeasePromote {
                now_ms: 40_000,
                extend_ms: 1000,
            })
        );
        assert_eq!(p.promoted_term(), None, "not before the command applies");
        let now = Instant::now();
        let clock = p.committed(3, now).expect("promoted");
        assert_eq!(clock.now_ms(now), 40_000, "from the lease time it proposed");
        assert_eq!(p.promoted_term(), Some(3));
        assert_eq!(p.leadership(true, 3), PromotionStep::Wait);
        assert_eq!(p.leadership(false, 4), PromotionStep::Demote);
        assert_eq!(p.leadership(false, 4), PromotionStep::Wait, "demoted once");
    }

    #[test]
    fn a_promotion_overtaken_by_another_term_starts_again() {
        let mut p = Promotion::default();
        assert_eq!(p.leadership(true, 3), PromotionStep::Confirm { term: 3 });
        assert_eq!(p.leadership(true, 5), PromotionStep::Confirm { term: 5 });
        assert_eq!(
            p.confirmed(3, 1, ELECTION),
            None,
            "term 3's read index is stale"
        );
        assert!(p.confirmed(5, 2, ELECTION).is_some());
        assert!(p.committed(3, Instant::now()).is_none());
        p.failed(5);
        assert_eq!(p.leadership(true, 5), PromotionStep::Confirm { term: 5 });
        assert_eq!(
            p.leadership(false, 6),
            PromotionStep::Wait,
            "nothing to demote"
        );
        assert!(p.confirmed(5, 3, ELECTION).is_none(), "lost leadership");
    }
}
