//! raft-rs's view of the log: the entries after the last compaction, in memory (as etcd keeps
//! its retained log in `MemoryStorage`), made durable by the write-ahead log before the core
//! puts them here. raft-rs reads it; only the core's driver changes it.

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};

#[derive(Debug, Default)]
pub struct LogStorage {
    hard_state: HardState,
    conf_state: ConfState,
    /// The log is compacted up to this index, whose term is kept.
    compacted_index: u64,
    compacted_term: u64,
    /// `entries[i].index == compacted_index + 1 + i`.
    entries: Vec<Entry>,
    /// The newest snapshot of the state machine the host made, for followers that need one.
    snapshot: Option<Snapshot>,
    /// A leader asked for a snapshot newer than `snapshot` (the host should make one).
    snapshot_wanted: std::cell::Cell<Option<u64>>,
}

impl LogStorage {
    pub(crate) fn new(
        hard_state: HardState,
        conf_state: ConfState,
        compacted_index: u64,
        compacted_term: u64,
        entries: Vec<Entry>,
    ) -> LogStorage {
        let storage = LogStorage {
            hard_state,
            conf_state,
            compacted_index,
            compacted_term,
            entries,
            snapshot: None,
            snapshot_wanted: std::cell::Cell::new(None),
        };
        storage.validate();
        storage
    }

    fn validate(&self) {
        debug_assert!(
            self.entries
                .iter()
                .enumerate()
                .all(|(i, e)| e.index == self.compacted_index + 1 + i as u64),
            "entries follow the compaction mark without a gap"
        );
    }

    pub(crate) fn last(&self) -> u64 {
        self.entries
            .last()
            .map_or(self.compacted_index, |e| e.index)
    }

    pub(crate) fn compacted(&self) -> (u64, u64) {
        (self.compacted_index, self.compacted_term)
    }

    pub(crate) fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    pub(crate) fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    pub(crate) fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    pub(crate) fn set_conf_state(&mut self, cs: ConfState) {
        self.conf_state = cs;
    }

    /// The term of the entry at `index`, if held (the mark's included).
    pub(crate) fn term_of(&self, index: u64) -> Option<u64> {
        if index == self.compacted_index {
            return Some(self.compacted_term);
        }
        if index < self.compacted_index {
            return None;
        }
        self.entries
            .get((index - self.compacted_index - 1) as usize)
            .map(|e| e.term)
    }

    /// The oldest index from which the entries up to `index` hold at most `bytes` bytes of data
    /// (`index + 1` when the entry at `index` alone holds more).
    pub(crate) fn first_within_bytes(&self, index: u64, bytes: u64) -> u64 {
        let upto = index
            .saturating_sub(self.compacted_index)
            .min(self.entries.len() as u64) as usize;
        let mut total = 0u64;
        let mut first = self.compacted_index + upto as u64 + 1;
        for entry in self.entries[..upto].iter().rev() {
            total += entry.data.len() as u64;
            if total > bytes {
                break;
            }
            first = entry.index;
        }
        first
    }

    /// Appends `entries` (durable already), replacing any from their first index on.
    pub(crate) fn append(&mut self, entries: Vec<Entry>) {
        let Some(first) = entries.first().map(|e| e.index) else {
            return;
        };
        assert!(
            first > self.compacted_index && first <= self.last() + 1,
            "entries from {first} do not follow the log ({}..={})",
            self.compacted_index,
            self.last()
        );
        self.entries
            .truncate((first - self.compacted_index - 1) as usize);
        self.entries.extend(entries);
        self.validate();
    }

    /// Drops the entries up to `index` (which the host's snapshot now holds).
    pub(crate) fn compact(&mut self, index: u64) {
        if index <= self.compacted_index {
            return;
        }
        let term = self
            .term_of(index)
            .expect("compacting to an entry the log holds");
        let drop = (index - self.compacted_index) as usize;
        self.entries.drain(..drop.min(self.entries.len()));
        self.compacted_index = index;
        self.compacted_term = term;
        self.validate();
    }

    /// The log now starts after `snapshot` (installed from the leader): entries that agree with it
    /// stay, others go.
    pub(crate) fn apply_snapshot(&mut self, snapshot: &Snapshot) {
        let meta = snapshot.get_metadata();
        if self.term_of(meta.index) == Some(meta.term) {
            self.compact(meta.index);
        } else {
            self.entries.clear();
            self.compacted_index = meta.index;
            self.compacted_term = meta.term;
        }
        self.conf_state = meta.get_conf_state().clone();
        self.hard_state.term = self.hard_state.term.max(meta.term);
        self.hard_state.commit = self.hard_state.commit.max(meta.index);
        self.validate();
    }

    /// The host's newest snapshot, offered to followers that need one.
    pub(crate) fn set_snapshot(&mut self, snapshot: Snapshot) {
        self.snapshot = Some(snapshot);
        if self
            .snapshot_wanted
            .get()
            .is_some_and(|want| self.snapshot_index() >= want)
        {
            self.snapshot_wanted.set(None);
        }
    }

    fn snapshot_index(&self) -> u64 {
        self.snapshot.as_ref().map_or(0, |s| s.get_metadata().index)
    }

    /// Whether a leader asked for a snapshot at or beyond an index this storage has none for.
    pub(crate) fn snapshot_wanted(&self) -> Option<u64> {
        self.snapshot_wanted.get()
    }

    /// The entries in `[low, high)`, for the host (committed entries it missed).
    pub(crate) fn slice(&self, low: u64, high: u64) -> &[Entry] {
        let from = (low.max(self.compacted_index + 1) - self.compacted_index - 1) as usize;
        let to = (high.min(self.last() + 1) - self.compacted_index - 1) as usize;
        &self.entries[from.min(to)..to]
    }
}

impl raft::Storage for LogStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.compacted_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let max_size = max_size.into().unwrap_or(u64::MAX);
        let mut out = Vec::new();
        let mut size = 0u64;
        for e in self.slice(low, high) {
            let bytes = (e.data.len() + e.context.len() + 24) as u64;
            if !out.is_empty() && size + bytes > max_size {
                break;
            }
            size += bytes;
            out.push(e.clone());
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.compacted_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.term_of(idx)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.compacted_index + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let names = |s: &Snapshot| {
            let cs = s.get_metadata().get_conf_state();
            cs.voters.contains(&to) || cs.learners.contains(&to)
        };
        match &self.snapshot {
            // One that no longer reaches the log (compacted since) would leave the follower
            // with a gap, and one from before the follower was added is ignored by it: a newer
            // one is wanted then.
            Some(s)
                if s.get_metadata().index >= request_index
                    && s.get_metadata().index >= self.compacted_index
                    && names(s) =>
            {
                Ok(s.clone())
            }
            _ => {
                self.snapshot_wanted.set(Some(
                    request_index.max(self.snapshot_wanted.get().unwrap_or(0)),
                ));
                Err(raft::Error::Store(
                    StorageError::SnapshotTemporarilyUnavailable,
                ))
            }
        }
    }
}
