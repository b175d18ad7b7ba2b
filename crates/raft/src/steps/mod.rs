//! The replica's decisions as steps, without tasks, threads or clock reads: each takes the state
//! and the time it acts at, and says what to do. [`crate::Replica`] drives them on tokio, awaiting
//! each step; the simulator (`leasehold-sim`) drives the same functions event by event on its
//! simulated clocks, so what it checks is what production decides.
//!
//! - [`stamp`]: the lease time a leader puts on grants and renewals, and [`stamp_gate`]: whether
//!   a batch waits for its leader to start timing leases first;
//! - [`Promotion`]: when a member starts and stops timing leases;
//! - [`expiry_pass`]: the leader's expiry driver;
//! - [`LeaderRenewals`]: a leader's renewals, from memory within a lease's cover, and
//!   [`after_end`]: a renewal decided again when the end it asked for revoked nothing;
//! - [`answered_before_apply`]: when a follower answers a write the leader committed for it;
//! - [`learner_in_sync`]: whether a learner may be promoted;
//! - [`reconfig`]: etcd's `--strict-reconfig-check` on membership changes;
//! - [`AppendTimes`]: when entries reached this member, which dates the lease time they carry;
//! - [`ReadRounds`]: which read-index round answers which linearizable reader, and
//!   [`FollowerRound`]: one follower round, from its ask to the heartbeat that proves it, and
//!   [`LeaderRound`]: one leader round, from its read index to applying that far;
//! - [`Waiters`]: which applied entry answers which waiting proposal;
//! - [`leader_arrival`]: what a leader does with a write as it arrives (a renewal is decided at
//!   once), [`BatchFill`]: how many queued writes one log entry takes, [`batch_route`]:
//!   whether a batch is proposed here, forwarded to the leader, or answered "no leader", and
//!   [`Proposer`]: what becomes of each batch, held behind the stamp gate with the queue behind
//!   it until its leader times leases.

use std::time::{Duration, Instant};

use leasehold_lease::LeaseClock;

use crate::command::{Applied, Proposal, Write};

mod append_times;
mod batch;
mod expiry;
mod follower_round;
mod leader_round;
mod promotion;
mod read_rounds;
pub mod reconfig;
mod renewals;
mod waiters;

pub use append_times::AppendTimes;
pub use batch::{
    Arrival, BATCH_BYTES_MAX, BATCH_LEN_MAX, BatchFill, BatchRoute, BatchStep, Go, Proposer,
    batch_route, leader_arrival,
};
pub use expiry::{ExpiryConfig, ExpiryPass, ExpiryWork, expiry_pass};
#[cfg(test)]
pub(crate) use follower_round::heard as follower_round_heard;
pub use follower_round::{FollowerRound, FollowerStep, PROOF_ASKS, RoundEnd};
pub use leader_round::{LeaderEnd, LeaderRound, LeaderStep};
pub use promotion::{Promotion, PromotionStep};
pub use read_rounds::ReadRounds;
pub use renewals::{AfterEnd, LeaderRenewals, RENEW_DECISIONS_MAX, RenewStep, after_end};
pub use waiters::{EntryOutcome, Waiters};

/// A step that needs lease time was asked of a member that does not time leases (it does not
/// lead, or has not promoted itself yet): its callers answer "no leader".
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this member does not time leases")]
pub struct NotTimingLeases;

/// How long a newly elected leader's batch of grants and renewals waits for it to start timing
/// leases ([`StampGate::AwaitPromotion`]); then it answers "no leader".
pub const PROMOTION_WAIT_MAX: Duration = Duration::from_secs(2);

/// What a batch of writes does before it is stamped ([`stamp_gate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StampGate {
    /// Stamp it now: nothing in it needs lease time, or this member times leases.
    Now,
    /// This member leads but has not promoted itself yet (milliseconds after its election):
    /// the batch, and the proposer with it, waits for the promotion, at most
    /// [`PROMOTION_WAIT_MAX`].
    AwaitPromotion,
    /// It needs lease time and this member does not lead (an election is under way): "no
    /// leader" at once, and the caller waits for the next leader.
    NoLeader,
}

/// Whether `writes` can be stamped now by a member that times leases (`timing`) or not, and
/// leads (`is_leader`) or not. Only a leader is ever promoted, so only a leader waits: a
/// proposer that waited on a follower held every later write for the whole bound, and a renewal
/// retried after the election missed its lease's grace (a cluster test lost a kept lease).
pub fn stamp_gate<'a>(
    writes: impl IntoIterator<Item = &'a Write>,
    timing: bool,
    is_leader: bool,
) -> StampGate {
    if timing || !writes.into_iter().any(Write::is_lease_timed) {
        StampGate::Now
    } else if is_leader {
        StampGate::AwaitPromotion
    } else {
        StampGate::NoLeader
    }
}

/// Turns writes into one log entry's proposal, giving every grant and renewal the leader's lease
/// time at `now`, rounded up so that a deadline never falls before its TTL has run
/// (`LeaseClock::now_ms_ceil`). Writes are stamped by the member that commits them, so a
/// follower's forwarded grants and renewals count from the leader's clock too. [`NotTimingLeases`]
/// if a write needs lease time and this member does not time leases (`clock` is `None`). Renewals
/// cover `margin_ms` beyond the deadline they give.
pub fn stamp(
    clock: Option<LeaseClock>,
    now: Instant,
    margin_ms: u64,
    writes: Vec<Write>,
) -> Result<Proposal, NotTimingLeases> {
    let now_ms = if writes.iter().any(Write::is_lease_timed) {
        clock.ok_or(NotTimingLeases)?.now_ms_ceil(now)
    } else {
        // Nothing in this batch reads it.
        0
    };
    Ok(Proposal {
        commands: writes
            .into_iter()
            .map(|w| w.stamp(now_ms, margin_ms))
            .collect(),
    })
}

/// Whether a follower answers a write the leader committed for it as soon as the leader says so,
/// before applying the entry itself: only a renewal ([`Write::answered_at_commit`]) that found its
/// lease live. A renewal that found no live lease may have revoked it, deleting its keys, so it is
/// answered after this member applies that too, like every other write, so that the client's next
/// read here sees what it was told.
pub fn answered_before_apply(answered_at_commit: bool, applied: &Applied) -> bool {
    answered_at_commit && !matches!(applied, Applied::LeaseRenew(None))
}

/// Whether a learner may be promoted to voter, by etcd's rule: its match index is at least 90 %
/// of the leader's own (`leader_match`); a learner the leader holds no progress for passes, as
/// in etcd.
pub fn learner_in_sync(leader_match: u64, learner_match: Option<u64>) -> bool {
    learner_match.is_none_or(|learner| u128::from(learner) * 10 >= u128::from(leader_match) * 9)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use leasehold_lease::{LeaseClock, LeaseId};

    use super::{
        NotTimingLeases, StampGate, answered_before_apply, learner_in_sync, stamp, stamp_gate,
    };
    use crate::command::{Applied, Command, LeaseRenew, Write};

    fn renew(n: i64) -> Write {
        Write::LeaseRenew(LeaseRenew {
            id: LeaseId::from_wire(n).expect("not zero"),
        })
    }

    #[test]
    fn renewals_carry_the_leaders_lease_time_rounded_up() {
        let now = Instant::now();
        let clock = LeaseClock::promote(10_000, now);
        let later = now + Duration::from_micros(2_300);
        let proposal = stamp(Some(clock), later, 2_000, vec![renew(1)]).expect("stamped");
        assert_eq!(
            proposal.commands,
            vec![Command::LeaseCover {
                id: LeaseId::from_wire(1).expect("not zero"),
                now_ms: 10_003,
                margin_ms: 2_000,
            }]
        );
        assert!(
            matches!(
                stamp(None, later, 2_000, vec![renew(1)]),
                Err(NotTimingLeases)
            ),
            "only a member that times leases stamps them"
        );
    }

    #[test]
    fn only_a_leader_that_is_not_timing_leases_yet_holds_lease_writes_back() {
        let put = Write::Compact(crate::command::Compact { revision: 1 });
        assert_eq!(stamp_gate(&[renew(1)], true, true), StampGate::Now);
        assert_eq!(
            stamp_gate(std::slice::from_ref(&put), false, false),
            StampGate::Now
        );
        assert_eq!(
            stamp_gate(&[put.clone(), renew(1)], false, true),
            StampGate::AwaitPromotion
        );
        assert_eq!(
            stamp_gate(&[put, renew(1)], false, false),
            StampGate::NoLeader
        );
    }

    #[test]
    fn only_a_renewal_of_a_live_lease_is_answered_before_the_follower_applies_it() {
        let renewed = Applied::LeaseRenew(Some(5));
        assert!(answered_before_apply(true, &renewed));
        assert!(!answered_before_apply(true, &Applied::LeaseRenew(None)));
        assert!(!answered_before_apply(false, &renewed));
    }

    #[test]
    fn a_learner_is_in_sync_at_ninety_per_cent_of_the_leaders_match() {
        assert!(learner_in_sync(100, Some(90)));
        assert!(!learner_in_sync(100, Some(89)));
        assert!(
            learner_in_sync(100, None),
            "no progress held: etcd lets it pass"
        );
    }
}
