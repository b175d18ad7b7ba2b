//! One leader read-index round: the consensus core confirms this member's leadership with a
//! quorum (raft-rs's ReadIndex), then this member applies that far before any reader reads. A
//! member that leads when the round begins and stops leading in that term before the round is
//! confirmed (it lost its quorum, say) fails the round at once with etcd's "leader changed",
//! rather than when the core gives up on it. [`crate::Replica`]'s leader rounds and the
//! simulator's members both drive this one machine.

use leasehold_consensus::reads::Confirmed;

/// What the driver of a [`LeaderRound`] does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaderStep<E> {
    /// Wait until this member has applied the read index ([`LeaderRound::applied`]).
    AwaitApply(Confirmed),
    /// The round is over: its readers read now.
    Read(Confirmed),
    /// The round failed; its readers fail with this.
    Failed(LeaderEnd<E>),
}

/// Why a leader round failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaderEnd<E> {
    /// The core gave no read index (it timed out, or was dropped).
    Index(E),
    /// This member stopped leading in the round's term before the round was confirmed.
    LeaderChanged,
}

/// One leader read-index round (see the module doc).
#[derive(Clone, Copy, Debug)]
pub struct LeaderRound {
    /// The term this member led in when the round began (`None`: it did not lead, and the core
    /// decides alone, forwarding the round if it knows a leader).
    led_term: Option<u64>,
    /// The read index, once the core gave it.
    confirmed: Option<Confirmed>,
}

impl LeaderRound {
    /// A round begun by a member that leads (`leading`) in `term`, or not. It waits for the
    /// core's read index ([`LeaderRound::confirmed`]), watching leadership meanwhile
    /// ([`LeaderRound::leadership`]).
    pub fn start(leading: bool, term: u64) -> LeaderRound {
        LeaderRound {
            led_term: leading.then_some(term),
            confirmed: None,
        }
    }

    /// The core's answer; `applied` is how far this member has applied.
    pub fn confirmed<E>(&mut self, answer: Result<Confirmed, E>, applied: u64) -> LeaderStep<E> {
        match answer {
            Err(e) => LeaderStep::Failed(LeaderEnd::Index(e)),
            Ok(confirmed) => {
                self.confirmed = Some(confirmed);
                self.applied(applied)
                    .unwrap_or(LeaderStep::AwaitApply(confirmed))
            }
        }
    }

    /// This member has applied up to `applied`: the round's read, once that reaches its read
    /// index; `None` before (or before the read index came).
    pub fn applied<E>(&self, applied: u64) -> Option<LeaderStep<E>> {
        self.confirmed
            .filter(|c| applied >= c.index)
            .map(LeaderStep::Read)
    }

    /// Leadership as this member sees it now: the round's failure if it began leading and no
    /// longer leads in that term before its read index came; `None` otherwise.
    pub fn leadership<E>(&self, leading: bool, term: u64) -> Option<LeaderStep<E>> {
        let led = self.led_term?;
        (self.confirmed.is_none() && !(leading && term == led))
            .then_some(LeaderStep::Failed(LeaderEnd::LeaderChanged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Step = LeaderStep<&'static str>;

    const AT_9: Confirmed = Confirmed {
        index: 9,
        proof: None,
    };

    /// Readers read only once this member has applied the read index.
    #[test]
    fn a_round_reads_once_applied_to_its_read_index() {
        let mut round = LeaderRound::start(true, 3);
        assert_eq!(round.applied::<&str>(100), None, "no read index yet");
        let step: Step = round.confirmed(Ok(AT_9), 8);
        assert_eq!(step, LeaderStep::AwaitApply(AT_9));
        assert_eq!(round.applied::<&str>(8), None);
        assert_eq!(round.applied::<&str>(9), Some(LeaderStep::Read(AT_9)));
        // Applied that far already: read at once.
        let mut round = LeaderRound::start(true, 3);
        assert_eq!(
            round.confirmed::<&str>(Ok(AT_9), 12),
            LeaderStep::Read(AT_9)
        );
        let mut round = LeaderRound::start(true, 3);
        assert_eq!(
            round.confirmed(Err("timed out"), 12),
            LeaderStep::Failed(LeaderEnd::Index("timed out"))
        );
    }

    /// A leader deposed (or in a new term) before its read index fails the round with "leader
    /// changed"; once confirmed, or if it never led, leadership does not end the round.
    #[test]
    fn a_leader_deposed_before_confirmation_fails_the_round() {
        let mut round = LeaderRound::start(true, 3);
        assert_eq!(round.leadership::<&str>(true, 3), None);
        let changed = Some(LeaderStep::Failed(LeaderEnd::LeaderChanged));
        assert_eq!(round.leadership::<&str>(false, 3), changed);
        assert_eq!(round.leadership::<&str>(true, 4), changed);
        let _: Step = round.confirmed(Ok(AT_9), 0);
        assert_eq!(round.leadership::<&str>(false, 4), None, "confirmed");
        let round = LeaderRound::start(false, 3);
        assert_eq!(round.leadership::<&str>(false, 5), None, "never led");
    }
}
