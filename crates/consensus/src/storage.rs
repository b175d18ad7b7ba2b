//! raft-rs's view of the log: the entries after the last compaction, made durable by the
//! write-ahead log before the core puts them here. raft-rs reads it; only the core's driver
//! changes it.
//!
//! Every entry's index and term stay in memory; its data only while it is among the newest
//! ([`LogStorage::chill`]): an older entry, which only a follower that lags needs, is read back
//! from the write-ahead log when one does ([`ColdLog`]). etcd keeps its whole retained log in
//! memory (`MemoryStorage`), so a member that was down costs the leader its backlog's size.
//!
//! What is read back is metered ([`SendWindow`]): at most a window of it waits to be sent to
//! a peer at once, counting what the transport still holds for that peer. Past that, raft-rs
//! is told the entries are not there yet (`LogTemporarilyUnavailable`, raft-rs's asynchronous
//! fetch): it sends that follower nothing more and the core asks again once the transport has
//! taken what waits ([`LogStorage::take_fetch_waits`]). Otherwise raft-rs reads a whole round
//! of appends for a follower that answers (up to 512 of 1 MiB) at once.

use std::cell::{Cell, RefCell};

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};

/// The bytes of messages the host has handed its transport for peer `to` that the transport
/// has not yet sent (read live).
pub type WaitingBytes = Box<dyn Fn(u64) -> u64 + Send>;

/// How much of the log read back for followers may wait to be sent at once.
struct SendWindow {
    /// For each peer.
    bytes: u64,
    /// What the transport holds, by peer.
    waiting: Option<WaitingBytes>,
    /// Read back since the core last handed its messages to the host (they are not yet in
    /// `waiting`), for every peer together.
    unsent: Cell<u64>,
    /// raft-rs's requests refused for the window, to make again when it opens.
    refused: RefCell<Vec<GetEntriesContext>>,
}

impl SendWindow {
    /// The bytes that may still be read back now for the request `context`.
    fn open(&self, context: &GetEntriesContext) -> u64 {
        let waiting = match (&self.waiting, peer_of(context)) {
            (Some(waiting), Some(to)) => waiting(to),
            _ => 0,
        };
        self.bytes
            .saturating_sub(waiting)
            .saturating_sub(self.unsent.get())
    }

    /// Holds a refused request; one like a request held already is not held twice.
    fn refuse(&self, context: GetEntriesContext) {
        let mut refused = self.refused.borrow_mut();
        let printed = format!("{context:?}");
        if !refused.iter().any(|c| format!("{c:?}") == printed) {
            refused.push(context);
        }
    }
}

/// The peer an append request of raft-rs's is for. raft-rs keeps the request's fields to itself
/// but prints them (`GetEntriesContext(SendAppend { to: 2, term: 5, aggressively: true })`):
/// the ID is read from that. `None` for any other request, or if the form ever changes (the
/// window then counts only what was read back since the core last sent, which a test catches:
/// `a_follower_that_lags_is_sent_entries_read_back_only_as_its_link_takes_them`).
fn peer_of(context: &GetEntriesContext) -> Option<u64> {
    let printed = format!("{context:?}");
    let rest = printed.split_once("SendAppend { to: ")?.1;
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

/// Where entries whose data left memory are read back from: the write-ahead log.
pub(crate) trait ColdLog: Send {
    /// The entries `low..high` from `low` on, stopping once they hold `max_bytes` of data (at
    /// least one); `Err` says why they could not be read.
    fn read(&self, low: u64, high: u64, max_bytes: u64) -> Result<Vec<Entry>, String>;
    /// The oldest index it finds; it finds every entry from there to the last appended.
    fn from(&self) -> Option<u64>;
}

impl<F: leasehold_wal::Fs> ColdLog for leasehold_wal::WalReader<F> {
    fn read(&self, low: u64, high: u64, max_bytes: u64) -> Result<Vec<Entry>, String> {
        leasehold_wal::WalReader::read(self, low, high, max_bytes)
            .map(|entries| {
                entries
                    .into_iter()
                    .map(crate::proto::entry_to_raft)
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    fn from(&self) -> Option<u64> {
        self.located_from()
    }
}

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
    /// Where chilled entries are read back from.
    cold: Box<dyn ColdLog>,
    /// The entries up to here hold no data in memory (`compacted_index <= cold_through`); their
    /// data is read from `cold`.
    cold_through: u64,
    /// The sizes of their data: `cold_sizes[i]` is entry `compacted_index + 1 + i`'s.
    cold_sizes: Vec<u32>,
    /// How much of what `cold` reads back may wait to be sent.
    window: SendWindow,
}

impl std::fmt::Debug for LogStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStorage")
            .field("compacted_index", &self.compacted_index)
            .field("cold_through", &self.cold_through)
            .field("last", &self.last())
            .finish()
    }
}

impl LogStorage {
    pub(crate) fn new(
        hard_state: HardState,
        conf_state: ConfState,
        compacted_index: u64,
        compacted_term: u64,
        entries: Vec<Entry>,
        cold: Box<dyn ColdLog>,
    ) -> LogStorage {
        let storage = LogStorage {
            hard_state,
            conf_state,
            compacted_index,
            compacted_term,
            entries,
            snapshot: None,
            snapshot_wanted: std::cell::Cell::new(None),
            cold,
            cold_through: compacted_index,
            cold_sizes: Vec::new(),
            window: SendWindow {
                bytes: u64::MAX,
                waiting: None,
                unsent: Cell::new(0),
                refused: RefCell::new(Vec::new()),
            },
        };
        storage.validate();
        storage
    }

    /// At most `bytes` of entries read back for a follower wait to be sent to it at once.
    pub(crate) fn set_send_window(&mut self, bytes: u64) {
        self.window.bytes = bytes;
    }

    /// The window counts what `waiting` says the transport holds for each peer.
    pub(crate) fn watch_transport(&mut self, waiting: WaitingBytes) {
        self.window.waiting = Some(waiting);
    }

    /// The host has every message made so far: what was read back waits in its transport now.
    pub(crate) fn sent(&self) {
        self.window.unsent.set(0);
    }

    /// raft-rs's requests refused while their window was shut, those whose window is open
    /// again: the core makes each again (`RawNode::on_entries_fetched`).
    pub(crate) fn take_fetch_waits(&self) -> Vec<GetEntriesContext> {
        let refused = self.window.refused.take();
        let (open, shut) = refused
            .into_iter()
            .partition(|context| self.window.open(context) > 0);
        *self.window.refused.borrow_mut() = shut;
        open
    }

    /// Lets the entries up to `index` drop their data from memory, once the cold log finds
    /// every one of them.
    pub(crate) fn chill(&mut self, index: u64) {
        let Some(from) = self.cold.from() else {
            return;
        };
        let index = index.min(self.last());
        if from > self.cold_through + 1 || index <= self.cold_through {
            return;
        }
        let start = (self.cold_through - self.compacted_index) as usize;
        let end = (index - self.compacted_index) as usize;
        for e in &mut self.entries[start..end] {
            let data = std::mem::take(&mut e.data);
            self.cold_sizes
                .push(u32::try_from(data.len()).unwrap_or(u32::MAX));
        }
        self.cold_through = index;
        self.validate();
    }

    /// The size of entry `i`'s data (its position in `entries`), in memory or not.
    fn data_len(&self, i: usize) -> u64 {
        match self.cold_sizes.get(i) {
            Some(&size) => u64::from(size),
            None => self.entries[i].data.len() as u64,
        }
    }

    /// The entries from `low` (chilled, so `low <= cold_through`) read back from the cold log,
    /// as far as `high` or `cold_through`, within `max_size` as raft-rs counts it (at least
    /// one): each checked against the index and term this storage holds for it.
    fn read_cold(&self, low: u64, high: u64, max_size: u64) -> Result<Vec<Entry>, String> {
        let mut end = low;
        let mut size = 0u64;
        while end < high.min(self.cold_through + 1) {
            let bytes = self.data_len((end - self.compacted_index - 1) as usize) + ENTRY_OVERHEAD;
            if end > low && size + bytes > max_size {
                break;
            }
            size += bytes;
            end += 1;
        }
        let read = self.cold.read(low, end, u64::MAX)?;
        for (i, e) in read.iter().enumerate() {
            let index = low + i as u64;
            if e.index != index || Some(e.term) != self.term_of(index) {
                return Err(format!(
                    "entry {}/{} read back where {index}/{:?} is held",
                    e.index,
                    e.term,
                    self.term_of(index)
                ));
            }
        }
        Ok(read)
    }

    fn validate(&self) {
        debug_assert!(
            self.entries
                .iter()
                .enumerate()
                .all(|(i, e)| e.index == self.compacted_index + 1 + i as u64),
            "entries follow the compaction mark without a gap"
        );
        debug_assert_eq!(
            self.cold_sizes.len() as u64,
            self.cold_through - self.compacted_index,
            "a size for each entry without its data"
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

    /// The oldest index from which the entries up to `index` hold at most `bytes` bytes of data,
    /// in memory or not (`index + 1` when the entry at `index` alone holds more).
    pub(crate) fn first_within_bytes(&self, index: u64, bytes: u64) -> u64 {
        let upto = index
            .saturating_sub(self.compacted_index)
            .min(self.entries.len() as u64) as usize;
        let mut total = 0u64;
        let mut first = self.compacted_index + upto as u64 + 1;
        for i in (0..upto).rev() {
            total += self.data_len(i);
            if total > bytes {
                break;
            }
            first = self.entries[i].index;
        }
        first
    }

    /// The bytes of entry data held in memory.
    pub(crate) fn bytes_in_memory(&self) -> u64 {
        self.entries.iter().map(|e| e.data.len() as u64).sum()
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
        self.cold_through = self.cold_through.min(first - 1);
        self.cold_sizes
            .truncate((self.cold_through - self.compacted_index) as usize);
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
        self.cold_sizes.drain(..drop.min(self.cold_sizes.len()));
        self.compacted_index = index;
        self.compacted_term = term;
        self.cold_through = self.cold_through.max(index);
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
            self.cold_sizes.clear();
            self.compacted_index = meta.index;
            self.compacted_term = meta.term;
            self.cold_through = meta.index;
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

/// What raft-rs's byte bounds count for an entry besides its data and context.
const ENTRY_OVERHEAD: u64 = 24;

/// An entry's size as raft-rs's byte bounds count it, about.
pub(crate) fn entry_size(e: &Entry) -> u64 {
    (e.data.len() + e.context.len()) as u64 + ENTRY_OVERHEAD
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
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.compacted_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let mut max_size = max_size.into().unwrap_or(u64::MAX);
        let mut out = Vec::new();
        let mut size = 0u64;
        let mut low = low;
        if low <= self.cold_through && context.can_async() {
            // An append to a follower that lags (raft-rs's own reads of the log cannot wait).
            let open = self.window.open(&context);
            if open == 0 {
                self.window.refuse(context);
                return Err(raft::Error::Store(StorageError::LogTemporarilyUnavailable));
            }
            max_size = max_size.min(open);
        }
        if low <= self.cold_through {
            // A follower that lags: its entries come back from the disk. Any that do not come
            // back as held answer "compacted", and raft-rs sends the follower a snapshot: one
            // past every chilled entry, which the host is asked for.
            let read = self.read_cold(low, high, max_size).map_err(|e| {
                tracing::warn!("raft log: reading entries {low}.. back for a follower: {e}");
                let wanted = self.snapshot_wanted.get().unwrap_or(0);
                self.snapshot_wanted
                    .set(Some(wanted.max(self.cold_through)));
                raft::Error::Store(StorageError::Compacted)
            })?;
            let read_all = read.len() as u64 == high.min(self.cold_through + 1) - low;
            size = read.iter().map(entry_size).sum();
            self.window.unsent.set(self.window.unsent.get() + size);
            low += read.len() as u64;
            out = read;
            if !read_all || size >= max_size {
                return Ok(out);
            }
        }
        for e in self.slice(low, high) {
            let bytes = entry_size(e);
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
        // One older than a snapshot already wanted is not offered: the entries after it may not
        // read back (see `entries`).
        let request_index = request_index.max(self.snapshot_wanted.get().unwrap_or(0));
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
                self.snapshot_wanted.set(Some(request_index));
                Err(raft::Error::Store(
                    StorageError::SnapshotTemporarilyUnavailable,
                ))
            }
        }
    }
}
