//! The Raft log on redb. Every append, truncate, purge and vote is an fsync'd commit
//! (`Durability::Immediate`) before openraft hears it is done; openraft hands `append` a whole
//! batch of entries at once, so concurrent client writes share one fsync (group commit).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, RaftLogReader, StorageIOError, Vote};
use redb::{Durability, ReadableTable};

use crate::TypeConfig;
use crate::state_machine::AppendTimes;
use crate::storage::{
    COMMITTED, Db, LAST_PURGED, MetaKey, RAFT_LOG, RAFT_META, StorageError, VOTE, decode, encode,
};

/// openraft's storage error, which ours become (typed, through [`crate::storage::FirstFailure`]).
type RaftStorageError = openraft::StorageError<u64>;

/// How many appends this member has made durable: a leader's proposer watches it to learn that
/// the entry it proposed is on disk (see `replica::batch`).
#[derive(Debug)]
pub(crate) struct LogFlushes {
    count: tokio::sync::watch::Sender<u64>,
}

impl Default for LogFlushes {
    fn default() -> LogFlushes {
        LogFlushes {
            count: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl LogFlushes {
    /// Appends made durable so far.
    pub(crate) fn count(&self) -> u64 {
        *self.count.borrow()
    }

    /// Returns once more than `count` appends have been made durable.
    pub(crate) async fn past(&self, count: u64) {
        let mut rx = self.count.subscribe();
        // The sender lives as long as `self`, which the caller holds: never closed.
        let _ = rx.wait_for(|flushed| *flushed > count).await;
    }

    fn flushed(&self) {
        self.count.send_modify(|count| *count += 1);
    }
}

#[derive(Clone)]
pub struct LogStore {
    db: Arc<Db>,
    /// Shared with the state machine, which dates lease times by them.
    append_times: Arc<AppendTimes>,
    flushes: Arc<LogFlushes>,
    /// The latest committed log id openraft reported. Only a hint for re-applying on restart,
    /// so it is written with the next log commit rather than costing a commit of its own.
    committed: Arc<Mutex<Option<LogId<u64>>>>,
}

impl LogStore {
    pub(crate) fn new(db: Arc<Db>, append_times: Arc<AppendTimes>) -> LogStore {
        LogStore {
            db,
            append_times,
            flushes: Arc::new(LogFlushes::default()),
            committed: Arc::new(Mutex::new(None)),
        }
    }

    /// The count of this store's durable appends.
    pub(crate) fn flushes(&self) -> Arc<LogFlushes> {
        self.flushes.clone()
    }

    fn read_meta<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        key: &MetaKey<T>,
    ) -> Result<Option<T>, StorageError> {
        let txn = self.db.begin_read().map_err(StorageError::read(key.name))?;
        let table = txn
            .open_table(RAFT_META)
            .map_err(StorageError::read(key.name))?;
        key.get(&table)
    }

    /// Records a failure (see [`crate::storage::FirstFailure`]) and hands it to openraft.
    fn fail(
        &self,
        e: StorageError,
        to_raft: impl FnOnce(&StorageError) -> StorageIOError<u64>,
    ) -> RaftStorageError {
        self.db.failure().to_raft(e, to_raft)
    }

    /// Runs one fsync'd write transaction (with the staged state-machine rows) on a blocking
    /// thread: redb's commit waits on fsync, which must not stall a runtime worker (there are
    /// only two on this machine).
    /// `what` names what the transaction writes, for its errors.
    async fn write<F>(&self, what: &'static str, f: F) -> Result<(), StorageError>
    where
        F: FnOnce(&redb::WriteTransaction) -> Result<(), StorageError> + Send + 'static,
    {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let mut txn = db.begin_write().map_err(StorageError::write(what))?;
            txn.set_durability(Durability::Immediate)
                .map_err(StorageError::write(what))?;
            // Every log commit also carries the state machine's applied-but-unwritten changes:
            // this is the group commit of log and state machine (see `Db::stage_sm`).
            let with_state = db.write_staged_sm(&txn)?;
            f(&txn)?;
            let started = std::time::Instant::now();
            txn.commit().map_err(StorageError::commit(what))?;
            let took = started.elapsed();
            db.telemetry().log_commit.observe(took);
            if with_state {
                db.telemetry().state_commit.observe(took);
            }
            Ok(())
        })
        .await
        .map_err(|error| StorageError::Thread { what, error })?
    }

    fn write_meta<T: serde::Serialize + serde::de::DeserializeOwned>(
        txn: &redb::WriteTransaction,
        key: &MetaKey<T>,
        value: &T,
    ) -> Result<(), StorageError> {
        let mut table = txn
            .open_table(RAFT_META)
            .map_err(StorageError::write(key.name))?;
        key.put(&mut table, value)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, RaftStorageError> {
        let read = || -> Result<Vec<Entry<TypeConfig>>, StorageError> {
            let txn = self
                .db
                .begin_read()
                .map_err(StorageError::read("raft_log"))?;
            let table = txn
                .open_table(RAFT_LOG)
                .map_err(StorageError::read("raft_log"))?;
            let start = match range.start_bound() {
                Bound::Included(i) => *i,
                Bound::Excluded(i) => i.saturating_add(1),
                Bound::Unbounded => 0,
            };
            let mut out = Vec::new();
            for row in table
                .range(start..)
                .map_err(StorageError::read("raft_log"))?
            {
                let (k, v) = row.map_err(StorageError::read("raft_log"))?;
                if !range.contains(&k.value()) {
                    break;
                }
                out.push(decode("raft_log", v.value())?);
            }
            Ok(out)
        };
        read().map_err(|e| self.fail(e, |e| StorageIOError::read_logs(e)))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftStorageError> {
        let state = || -> Result<LogState<TypeConfig>, StorageError> {
            let last_purged_log_id: Option<LogId<u64>> = self.read_meta(&LAST_PURGED)?;
            let txn = self
                .db
                .begin_read()
                .map_err(StorageError::read("raft_log"))?;
            let table = txn
                .open_table(RAFT_LOG)
                .map_err(StorageError::read("raft_log"))?;
            let last = match table.last().map_err(StorageError::read("raft_log"))? {
                Some((_, v)) => Some(decode::<Entry<TypeConfig>>("raft_log", v.value())?.log_id),
                None => None,
            };
            Ok(LogState {
                last_purged_log_id,
                last_log_id: last.or(last_purged_log_id),
            })
        };
        state().map_err(|e| self.fail(e, |e| StorageIOError::read_logs(e)))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), RaftStorageError> {
        let vote = *vote;
        self.write(VOTE.name, move |txn| Self::write_meta(txn, &VOTE, &vote))
            .await
            .map_err(|e| self.fail(e, |e| StorageIOError::write_vote(e)))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, RaftStorageError> {
        self.read_meta(&VOTE)
            .map_err(|e| self.fail(e, |e| StorageIOError::read_vote(e)))
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), RaftStorageError> {
        *self.committed.lock().expect("committed lock poisoned") = committed;
        if let Some(log_id) = committed {
            self.db.telemetry().committed(log_id.index);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, RaftStorageError> {
        Ok(self
            .read_meta(&COMMITTED)
            .map_err(|e| self.fail(e, |e| StorageIOError::read(e)))?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), RaftStorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let rows: Vec<(u64, Vec<u8>)> = entries
            .into_iter()
            .map(|e| (e.log_id.index, encode(&e)))
            .collect();
        if let (Some((first, _)), Some((last, _))) = (rows.first(), rows.last()) {
            self.append_times.appending(*first, *last);
        }
        let committed = *self.committed.lock().expect("committed lock poisoned");
        let result = self
            .write("raft_log", move |txn| {
                Self::write_meta(txn, &COMMITTED, &committed)?;
                let mut table = txn
                    .open_table(RAFT_LOG)
                    .map_err(StorageError::write("raft_log"))?;
                for (index, bytes) in &rows {
                    table
                        .insert(*index, bytes.as_slice())
                        .map_err(StorageError::write("raft_log"))?;
                }
                Ok(())
            })
            .await;
        // Tell openraft only after the fsync: it may then count this member toward a quorum.
        match result {
            Ok(()) => {
                self.flushes.flushed();
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let e = self.db.failure().record(e);
                // The callback takes an io::Error: it carries the typed error, not its text.
                callback.log_io_completed(Err(std::io::Error::other(e.clone())));
                Err(StorageIOError::write_logs(&*e).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), RaftStorageError> {
        self.write("raft_log", move |txn| {
            let mut table = txn
                .open_table(RAFT_LOG)
                .map_err(StorageError::write("raft_log"))?;
            table
                .retain_in(log_id.index.., |_, _| false)
                .map_err(StorageError::write("raft_log"))?;
            Ok(())
        })
        .await
        .map_err(|e| self.fail(e, |e| StorageIOError::write_logs(e)))
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), RaftStorageError> {
        // Immediate: this commit also makes every earlier (unsynced) state-machine commit
        // durable before the log entries it was built from disappear.
        self.write("raft_log", move |txn| {
            Self::write_meta(txn, &LAST_PURGED, &log_id)?;
            let mut table = txn
                .open_table(RAFT_LOG)
                .map_err(StorageError::write("raft_log"))?;
            table
                .retain_in(..=log_id.index, |_, _| false)
                .map_err(StorageError::write("raft_log"))?;
            Ok(())
        })
        .await
        .map_err(|e| self.fail(e, |e| StorageIOError::write_logs(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::LogFlushes;

    /// A proposer waiting past a count is held until a later append is made durable, and one
    /// that asks after it was made durable is not held at all.
    #[tokio::test]
    async fn past_waits_for_a_durable_append_after_the_count() {
        let flushes = std::sync::Arc::new(LogFlushes::default());
        let seen = flushes.count();
        let waiter = tokio::spawn({
            let flushes = flushes.clone();
            async move { flushes.past(seen).await }
        });
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "released before any append was durable"
        );
        flushes.flushed();
        waiter.await.expect("waiter");
        assert_eq!(flushes.count(), seen + 1);
        flushes.past(seen).await;
    }
}
