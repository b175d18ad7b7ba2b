//! One follower read-index round: what a follower does between asking its leader for a read
//! index and letting its readers read. [`crate::Replica`]'s follower rounds and the simulator's
//! members both drive this one machine; they only carry its asks and its waits.
//!
//! The leader answers on the follower's own line to it, and that line reaches the leader even
//! when the leader's traffic cannot reach the follower (a one-way partition). So an answer that
//! carries the round's proof ([`ReadProof`]: the leader's term and the round's read-index
//! context) counts only once the follower's core has stepped the leader's heartbeat for that
//! round, or a later one ([`HeartbeatSeen::proves`]), as an etcd follower hears its read index
//! only over its leader's Raft traffic. A proof not heard within half an election timeout (the
//! heartbeat may have been lost) asks again; after [`PROOF_ASKS`] asks the round fails. A
//! round ends as soon as the follower loses the leader it asked, with etcd's "leader changed".
//!
//! A reader reads once the follower has applied [`FollowerStep::Read`]'s `index`, never before.

use std::time::{Duration, Instant};

use leasehold_consensus::HeartbeatSeen;
use leasehold_consensus::reads::ReadProof;

/// How many times a follower asks for a read round whose heartbeat it does not hear.
pub const PROOF_ASKS: usize = 4;

/// What the driver of a [`FollowerRound`] does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FollowerStep<A, E> {
    /// Send the leader a read-index request (again), and hand its answer to
    /// [`FollowerRound::answered`].
    Ask,
    /// Wait for this member to step more of the leader's heartbeats
    /// ([`FollowerRound::heard`]), until `until` ([`FollowerRound::timed_out`]).
    AwaitProof { until: Instant },
    /// The round is over: its readers read once this member has applied `index`. `with` is what
    /// the leader's answer carried besides.
    Read { index: u64, with: A },
    /// The round failed; its readers fail with this.
    Failed(RoundEnd<E>),
}

/// Why a follower round failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoundEnd<E> {
    /// The ask itself failed (the line broke, or the leader refused).
    Ask(E),
    /// No heartbeat proved the leader's answer after [`PROOF_ASKS`] asks: the leader's traffic
    /// does not reach this member, which answers as one without a leader.
    Unproven,
    /// This member lost the leader it asked (or heard of another) before the round was over.
    LeaderChanged,
}

/// One follower read-index round to `leader` (see the module doc).
#[derive(Debug)]
pub struct FollowerRound<A> {
    leader: u64,
    asks: usize,
    proof_wait: Duration,
    /// The leader's answer, waiting for the heartbeat that proves it, until the deadline.
    proving: Option<(u64, ReadProof, A, Instant)>,
}

impl<A> FollowerRound<A> {
    /// A round that asks `leader`, whose heartbeats come at least every half `election_timeout`;
    /// its first step is to ask.
    pub fn start<E>(
        leader: u64,
        election_timeout: Duration,
    ) -> (FollowerRound<A>, FollowerStep<A, E>) {
        let round = FollowerRound {
            leader,
            asks: 1,
            proof_wait: election_timeout / 2,
            proving: None,
        };
        (round, FollowerStep::Ask)
    }

    /// The leader this round asks.
    pub fn leader(&self) -> u64 {
        self.leader
    }

    /// Whether the round holds an answer and waits for its proof (a second answer to the same
    /// ask is then none of its business).
    pub fn proving(&self) -> bool {
        self.proving.is_some()
    }

    /// The leader's answer to the last ask (`index`, and its `proof` unless the leader is the
    /// only voter), or the ask's failure; `seen` is the newest leader heartbeat this member has
    /// stepped.
    pub fn answered<E>(
        &mut self,
        answer: Result<(u64, Option<ReadProof>, A), E>,
        seen: &HeartbeatSeen,
        now: Instant,
    ) -> FollowerStep<A, E> {
        match answer {
            Err(e) => FollowerStep::Failed(RoundEnd::Ask(e)),
            Ok((index, None, with)) => FollowerStep::Read { index, with },
            Ok((index, Some(proof), with)) => {
                let until = now + self.proof_wait;
                self.proving = Some((index, proof, with, until));
                self.heard(seen)
                    .unwrap_or(FollowerStep::AwaitProof { until })
            }
        }
    }

    /// This member stepped more of the leader's heartbeats (`seen`, the newest): the round's
    /// read, if they prove the answer it holds; `None` while they do not (or it holds none).
    pub fn heard<E>(&mut self, seen: &HeartbeatSeen) -> Option<FollowerStep<A, E>> {
        let (index, proof, _, _) = self.proving.as_ref()?;
        if !seen.proves(self.leader, *proof) {
            return None;
        }
        let index = *index;
        let (_, _, with, _) = self.proving.take()?;
        Some(FollowerStep::Read { index, with })
    }

    /// The time is `now`: a proof not heard by its deadline asks again, or fails the round after
    /// the last ask. `None` while nothing is due.
    pub fn timed_out<E>(&mut self, now: Instant) -> Option<FollowerStep<A, E>> {
        let (_, _, _, until) = self.proving.as_ref()?;
        if now < *until {
            return None;
        }
        self.proving = None;
        if self.asks < PROOF_ASKS {
            self.asks += 1;
            Some(FollowerStep::Ask)
        } else {
            Some(FollowerStep::Failed(RoundEnd::Unproven))
        }
    }

    /// This member now knows `leader` as its leader: any other than the one asked fails the
    /// round. `None` while it is still the same.
    pub fn leader_is<E>(&mut self, leader: Option<u64>) -> Option<FollowerStep<A, E>> {
        (leader != Some(self.leader)).then_some(FollowerStep::Failed(RoundEnd::LeaderChanged))
    }
}

/// What the follower-round tests here and in `replica/read_index.rs` share: a leader's round
/// proof, and the heartbeats a follower has stepped.
#[cfg(test)]
pub(crate) mod heard {
    use super::{HeartbeatSeen, ReadProof};

    /// Leader 2's round of context 5 in term 3.
    pub(crate) const PROOF: ReadProof = ReadProof {
        term: 3,
        context: 5,
    };

    /// `leader`'s newest heartbeat stepped: of `term`, carrying `context`.
    pub(crate) fn seen(leader: u64, term: u64, context: u64) -> HeartbeatSeen {
        HeartbeatSeen {
            leader,
            term,
            heartbeats: 1,
            context,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Step = FollowerStep<&'static str, &'static str>;

    use super::heard::{PROOF, seen};

    const ELECTION: Duration = Duration::from_millis(1_000);

    /// An answer counts once this member has stepped the leader's heartbeat of the round's term
    /// carrying its context or a later one; another leader's or another term's proves nothing.
    #[test]
    fn an_answer_counts_once_the_leaders_heartbeat_for_it_is_stepped() {
        let t0 = Instant::now();
        let (mut round, first): (_, Step) = FollowerRound::start(2, ELECTION);
        assert_eq!(first, FollowerStep::Ask);
        let until = t0 + ELECTION / 2;
        let step: Step = round.answered(Ok((9, Some(PROOF), "lease")), &seen(2, 3, 4), t0);
        assert_eq!(step, FollowerStep::AwaitProof { until });
        assert_eq!(
            round.heard::<&str>(&seen(3, 3, 9)),
            None,
            "another leader's"
        );
        assert_eq!(round.heard::<&str>(&seen(2, 2, 9)), None, "another term's");
        assert_eq!(
            round.heard::<&str>(&seen(2, 3, 4)),
            None,
            "an earlier round's"
        );
        assert_eq!(
            round.heard::<&str>(&seen(2, 3, 6)),
            Some(FollowerStep::Read {
                index: 9,
                with: "lease"
            })
        );
        assert_eq!(round.heard::<&str>(&seen(2, 3, 7)), None, "read once only");
        // Proven already when the answer comes: read at once.
        let (mut round, _): (_, Step) = FollowerRound::start(2, ELECTION);
        let step: Step = round.answered(Ok((9, Some(PROOF), "lease")), &seen(2, 3, 5), t0);
        assert_eq!(
            step,
            FollowerStep::Read {
                index: 9,
                with: "lease"
            }
        );
    }

    /// A leader's answer without a proof (it is the only voter) counts at once; a failed ask
    /// fails the round with its own error.
    #[test]
    fn an_answer_without_proof_counts_at_once_and_a_failed_ask_ends_the_round() {
        let (mut round, _): (_, Step) = FollowerRound::start(2, ELECTION);
        let step: Step = round.answered(
            Ok((7, None, "x")),
            &HeartbeatSeen::default(),
            Instant::now(),
        );
        assert_eq!(
            step,
            FollowerStep::Read {
                index: 7,
                with: "x"
            }
        );
        let (mut round, _): (_, Step) = FollowerRound::start(2, ELECTION);
        let step: Step =
            round.answered(Err("line broke"), &HeartbeatSeen::default(), Instant::now());
        assert_eq!(step, FollowerStep::Failed(RoundEnd::Ask("line broke")));
    }

    /// A follower that never hears the leader asks again each half election timeout, and fails
    /// after the last ask.
    #[test]
    fn a_round_never_proven_asks_again_then_fails() {
        let mut now = Instant::now();
        let (mut round, _): (_, Step) = FollowerRound::start(2, ELECTION);
        let nothing = HeartbeatSeen::default();
        for ask in 1..=PROOF_ASKS {
            let step: Step = round.answered(Ok((9, Some(PROOF), "x")), &nothing, now);
            let until = now + ELECTION / 2;
            assert_eq!(step, FollowerStep::AwaitProof { until });
            assert_eq!(
                round.timed_out::<&str>(until - Duration::from_millis(1)),
                None,
                "not yet due"
            );
            now = until;
            let next: Option<Step> = round.timed_out(now);
            if ask < PROOF_ASKS {
                assert_eq!(next, Some(FollowerStep::Ask), "ask {ask} goes again");
            } else {
                assert_eq!(next, Some(FollowerStep::Failed(RoundEnd::Unproven)));
            }
        }
    }

    /// Losing the leader asked, or hearing of another, fails the round with "leader changed";
    /// the same leader does not.
    #[test]
    fn a_round_ends_when_its_leader_is_replaced() {
        let (mut round, _): (_, Step) = FollowerRound::<&str>::start(2, ELECTION);
        assert_eq!(round.leader_is::<&str>(Some(2)), None);
        assert_eq!(
            round.leader_is::<&str>(None),
            Some(FollowerStep::Failed(RoundEnd::LeaderChanged))
        );
        assert_eq!(
            round.leader_is::<&str>(Some(3)),
            Some(FollowerStep::Failed(RoundEnd::LeaderChanged))
        );
    }
}
