//! Proposals waiting for their entries, keyed by (index, term): a proposal is answered by the
//! entry applied at its index if that entry still has its term; one that another leader's entry
//! replaced, or whose index this member never applies itself (a snapshot covered it), is
//! answered "no leader": its outcome is unknown, and the client goes again.

use std::collections::BTreeMap;

/// What became of a waiting proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryOutcome {
    /// Its entry was applied: answer with its replies.
    Applied,
    /// Another entry took its index (a leader change), or a snapshot covered it: its outcome is
    /// unknown ("no leader").
    Lost,
    /// It waited for a membership change, and raft-rs put an empty entry in its place because
    /// another change was pending.
    ChangeInProgress,
}

/// Waiting proposals by log index. `T` is whatever answers one: a channel in the replica, the
/// clients of a batch in the simulator.
#[derive(Debug)]
pub struct Waiters<T> {
    by_index: BTreeMap<u64, (u64, bool, T)>,
}

impl<T> Default for Waiters<T> {
    fn default() -> Waiters<T> {
        Waiters {
            by_index: BTreeMap::new(),
        }
    }
}

impl<T> Waiters<T> {
    /// `waiter` waits for the entry proposed at `index` in `term`; `conf_change` if it is a
    /// membership change.
    pub fn insert(&mut self, index: u64, term: u64, conf_change: bool, waiter: T) {
        self.by_index.insert(index, (term, conf_change, waiter));
    }

    /// The entry at `index` with `term` was applied (a membership change or not): every waiter at
    /// or below it, each with its outcome (only one at `index` can have been applied).
    pub fn applied(
        &mut self,
        index: u64,
        term: u64,
        conf_change: bool,
    ) -> Vec<(u64, T, EntryOutcome)> {
        let mut answered = Vec::new();
        while let Some(entry) = self.by_index.first_entry() {
            if *entry.key() > index {
                break;
            }
            let (at, (waited_term, waited_conf_change, waiter)) = entry.remove_entry();
            let outcome = if at != index || waited_term != term {
                EntryOutcome::Lost
            } else if waited_conf_change && !conf_change {
                EntryOutcome::ChangeInProgress
            } else {
                EntryOutcome::Applied
            };
            answered.push((at, waiter, outcome));
        }
        answered
    }

    /// A snapshot brought this member to `index` without applying the entries up to it: every
    /// waiter at or below it is lost.
    pub fn skipped_to(&mut self, index: u64) -> Vec<T> {
        let above = self.by_index.split_off(&(index + 1));
        std::mem::replace(&mut self.by_index, above)
            .into_values()
            .map(|(_, _, waiter)| waiter)
            .collect()
    }

    /// Every waiter (the member stops).
    pub fn drain(&mut self) -> Vec<T> {
        std::mem::take(&mut self.by_index)
            .into_values()
            .map(|(_, _, waiter)| waiter)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.by_index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_index.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::{EntryOutcome, Waiters};

    #[test]
    fn a_proposal_is_answered_by_its_index_only_while_it_keeps_its_term() {
        let mut w = Waiters::default();
        w.insert(5, 2, false, "five");
        w.insert(6, 2, true, "six");
        w.insert(8, 2, false, "eight");
        assert_eq!(w.applied(4, 2, false), vec![], "nothing waits at 4");
        assert_eq!(
            w.applied(5, 2, false),
            vec![(5, "five", EntryOutcome::Applied)]
        );
        // raft-rs put an empty entry where a membership change was proposed.
        assert_eq!(
            w.applied(6, 2, false),
            vec![(6, "six", EntryOutcome::ChangeInProgress)]
        );
        // A new leader's entry at 8: the waiter lost its entry.
        w.insert(9, 2, false, "nine");
        assert_eq!(
            w.applied(8, 3, false),
            vec![(8, "eight", EntryOutcome::Lost)]
        );
        assert_eq!(w.len(), 1);
        // Index 9 applied as part of a jump: lost, not left behind.
        w.insert(12, 3, false, "twelve");
        assert_eq!(
            w.applied(10, 3, false),
            vec![(9, "nine", EntryOutcome::Lost)]
        );
        assert_eq!(w.skipped_to(20), vec!["twelve"]);
        assert!(w.is_empty());
        w.insert(21, 3, false, "21");
        assert_eq!(w.skipped_to(20), Vec::<&str>::new());
        assert_eq!(w.drain(), vec!["21"]);
    }
}
