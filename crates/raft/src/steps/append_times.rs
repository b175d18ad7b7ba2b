//! When this member appended which log entries, so that the lease time an entry carries is dated
//! from when the entry reached this member, not from when it was applied. An entry is applied
//! only once this member learns it was committed; entries the old leader replicated but whose
//! commit it never announced are applied by the next leader only after the election. Dated at
//! apply, their lease time would lose the whole election gap, and inherited leases would live
//! that much longer (a dead client's lease, and the "no fresh TTL" promise). The append is
//! recorded once it is durable, after the leader stamped the entry, so the time since then is
//! still a lower bound of the lease time that has passed: never early.

use std::collections::VecDeque;
use std::time::Instant;

/// Most appends remembered: a member that applies far behind dates older entries at apply.
const APPENDS_MAX: usize = 4096;

#[derive(Debug, Default)]
pub struct AppendTimes {
    /// (first index, last index, when) per append, oldest first; pruned as entries are applied.
    appends: VecDeque<(u64, u64, Instant)>,
}

impl AppendTimes {
    /// Records that entries `first..=last` were appended at `at`.
    pub fn appended(&mut self, first: u64, last: u64, at: Instant) {
        if self.appends.len() >= APPENDS_MAX {
            self.appends.pop_front();
        }
        self.appends.push_back((first, last, at));
    }

    /// When the entry at `index` (as it is now) was appended, if remembered; forgets appends
    /// wholly below `index`, which is being applied.
    pub fn appended_at(&mut self, index: u64) -> Option<Instant> {
        // The latest append that covers `index` wrote the entry there now (a conflicting entry
        // is overwritten by a later append).
        let at = self
            .appends
            .iter()
            .rev()
            .find(|(first, last, _)| (*first..=*last).contains(&index))
            .map(|(_, _, at)| *at);
        while self
            .appends
            .front()
            .is_some_and(|(_, last, _)| *last < index)
        {
            self.appends.pop_front();
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::AppendTimes;

    #[test]
    fn an_entry_is_dated_by_its_latest_append_and_applied_appends_are_forgotten() {
        let mut times = AppendTimes::default();
        let first = Instant::now();
        times.appended(1, 3, first);
        assert_eq!(times.appended_at(2), Some(first));
        // A new leader overwrites 3 (a conflicting entry) and appends 4.
        let second = first + Duration::from_millis(5);
        times.appended(3, 4, second);
        assert_eq!(times.appended_at(3), Some(second));
        assert_eq!(times.appended_at(4), Some(second));
        assert_eq!(
            times.appended_at(2),
            None,
            "appends wholly below 4 are forgotten"
        );
        assert_eq!(
            times.appended_at(9),
            None,
            "never appended here: dated at apply"
        );
    }
}
