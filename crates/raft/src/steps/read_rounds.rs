//! Read-index rounds shared by the readers that arrive together: many concurrent linearizable
//! reads share one leadership confirmation (on the leader) or one read-index request to the
//! leader (on a follower), as etcd batches its read-index requests.
//!
//! A read may only use a confirmation that began after the read arrived, or it could miss a
//! write acknowledged just before. So a reader joins the *next* round: while one round runs,
//! the readers that arrive wait together for the round after it, which starts as soon as the
//! running one ends. Every reader is answered by exactly one round that began after it joined.

/// The readers of the next round, and whether a round is running. `T` is whatever answers a
/// reader: a channel in the replica, a client's request in the simulator.
#[derive(Debug)]
pub struct ReadRounds<T> {
    running: bool,
    next: Vec<T>,
}

impl<T> Default for ReadRounds<T> {
    fn default() -> ReadRounds<T> {
        ReadRounds {
            running: false,
            next: Vec::new(),
        }
    }
}

impl<T> ReadRounds<T> {
    /// `reader` joins the next round. `Some(readers)` when no round runs: the caller starts one
    /// now, for them; `None` while one runs: the reader waits for the round after it.
    #[must_use]
    pub fn join(&mut self, reader: T) -> Option<Vec<T>> {
        self.next.push(reader);
        if self.running {
            return None;
        }
        self.running = true;
        Some(std::mem::take(&mut self.next))
    }

    /// The running round ended (answered or failed; its readers are the caller's to answer).
    /// `Some(readers)`: those who joined meanwhile, for whom the caller starts the next round
    /// now; `None`: nobody waits, and no round runs.
    #[must_use]
    pub fn finished(&mut self) -> Option<Vec<T>> {
        debug_assert!(self.running, "a round ended that never started");
        if self.next.is_empty() {
            self.running = false;
            return None;
        }
        Some(std::mem::take(&mut self.next))
    }

    /// Whether a round is running.
    pub fn running(&self) -> bool {
        self.running
    }

    /// How many readers wait for the next round.
    pub fn waiting(&self) -> usize {
        self.next.len()
    }

    /// Forgets every round (the member stopped): the readers that waited, for the caller to
    /// fail.
    pub fn clear(&mut self) -> Vec<T> {
        self.running = false;
        std::mem::take(&mut self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::ReadRounds;

    #[test]
    fn readers_that_arrive_during_a_round_share_the_next_one() {
        let mut rounds = ReadRounds::default();
        assert_eq!(
            rounds.join(1),
            Some(vec![1]),
            "idle: a round starts at once"
        );
        // Round 1 runs: these wait for the next one, not this one.
        for reader in 2..=11 {
            assert_eq!(rounds.join(reader), None);
        }
        assert_eq!(rounds.waiting(), 10);
        assert_eq!(
            rounds.finished(),
            Some((2..=11).collect()),
            "ten readers, one round"
        );
        assert!(rounds.running());
        assert_eq!(rounds.finished(), None, "nobody joined meanwhile: idle");
        assert!(!rounds.running());
        assert_eq!(rounds.join(12), Some(vec![12]));
        assert_eq!(rounds.join(13), None);
        assert_eq!(rounds.clear(), vec![13]);
        assert!(!rounds.running());
    }
}
