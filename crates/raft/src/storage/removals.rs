//! A compaction's removals from the file, a batch at a time (etcd's scheduled compaction).
//!
//! Applying a compaction changes the in-memory store at once: reads below it are refused and its
//! hash is taken. The rows it hides leave the file later, off the apply path: once the
//! checkpoint holding the compaction is durable, the compactor thread removes them at most
//! `--compaction-batch-limit` per durable transaction, pausing `--compaction-sleep-interval`
//! between batches, and then says "finished scheduled compaction". A stop may interrupt it: the
//! file then holds rows below its compaction revision that it hides, which loading the state
//! leaves out ([`leasehold_mvcc::Store::restore_with_hidden`]) and schedules again, so the
//! compaction resumes at the next start.

use std::collections::VecDeque;
use std::time::Instant;

use leasehold_mvcc::Revision;
use redb::Durability;

use super::{Db, KV, StorageError};

/// What a failed removal is called in errors.
const WHAT: &str = "a compaction's removals";

/// One compaction's rows still in the file.
pub(crate) struct Scheduled {
    revision: i64,
    rows: Vec<Revision>,
    /// How many of `rows` are removed.
    removed: usize,
    since: Instant,
}

impl Scheduled {
    /// The rows a compaction at `revision` hides, to remove.
    pub(crate) fn new(revision: i64, rows: Vec<Revision>) -> Scheduled {
        Scheduled {
            revision,
            rows,
            removed: 0,
            since: Instant::now(),
        }
    }
}

/// The compactions whose checkpoint is durable, oldest first, and the newest compaction
/// revision this member's file holds no hidden row of (what a `physical` compaction waits
/// for).
pub(crate) struct Removals {
    queue: std::sync::Mutex<VecDeque<Scheduled>>,
    finished: tokio::sync::watch::Sender<i64>,
}

impl Default for Removals {
    fn default() -> Self {
        Removals {
            queue: std::sync::Mutex::default(),
            finished: tokio::sync::watch::Sender::new(-1),
        }
    }
}

impl Db {
    /// Queues compactions whose checkpoint is now durable, and wakes the compactor. One without
    /// rows to remove is finished at once.
    pub(crate) fn schedule_removals(&self, compactions: impl IntoIterator<Item = Scheduled>) {
        let mut queue = self.removals.queue.lock().expect("removals lock poisoned");
        for compaction in compactions {
            if compaction.rows.is_empty() && queue.is_empty() {
                self.finished_compaction(&compaction);
            } else {
                queue.push_back(compaction);
            }
        }
        let work = !queue.is_empty();
        drop(queue);
        if work {
            self.compaction_bell.ring(|r| r.staged = true);
        }
    }

    /// The state was loaded (or installed) at `compact_revision`, with `hidden` rows of it
    /// still in the file: what was scheduled before is void, and the removal of those rows
    /// resumes (etcd's "resume scheduled compaction").
    pub(crate) fn loaded_compaction(&self, compact_revision: i64, hidden: Vec<Revision>) {
        // No remover is in the middle of a batch of what is cleared.
        let writing = self.writing.lock().expect("writing lock poisoned");
        self.removals
            .queue
            .lock()
            .expect("removals lock poisoned")
            .clear();
        drop(writing);
        if hidden.is_empty() {
            self.removals.finished.send_replace(compact_revision);
            return;
        }
        tracing::info!(
            "scheduled-compact-revision" = compact_revision,
            "keys-left" = hidden.len(),
            "resume scheduled compaction"
        );
        self.schedule_removals([Scheduled::new(compact_revision, hidden)]);
    }

    /// Removes at most `limit` rows of the oldest scheduled compaction in one durable
    /// transaction; whether any row is left to remove. A failed write leaves the rows
    /// scheduled. One writer at a time, the stage's included. Blocking.
    pub(crate) fn remove_compacted(&self, limit: usize) -> Result<bool, StorageError> {
        let _writing = self.writing.lock().expect("writing lock poisoned");
        let batch: Vec<Revision> = {
            let queue = self.removals.queue.lock().expect("removals lock poisoned");
            let Some(oldest) = queue.front() else {
                return Ok(false);
            };
            let end = oldest.rows.len().min(oldest.removed.saturating_add(limit));
            oldest.rows[oldest.removed..end].to_vec()
        };
        if !batch.is_empty() {
            self.reopen_if_full(WHAT)?;
            if let Err(e) = self.remove_rows(&batch) {
                // redb takes no write after a failed one until its file is opened again: the
                // next writer does that once this one marks the disk full. Any other failure
                // ends the member at the checkpointer's next write, as a failed checkpoint does.
                if e.is_out_of_space() && self.mark_full() {
                    tracing::error!(
                        "the disk is full ({e}): writes that add data get NOSPACE and reads go \
                         on until space is freed"
                    );
                }
                self.checkpoint_bell.ring(|r| r.staged = true);
                return Err(e);
            }
            // With nothing staged, this write is the one that says the disk has room again;
            // a stage put back for want of space says so when the checkpointer writes it.
            let nothing_staged = self
                .staged_sm
                .lock()
                .expect("staged lock poisoned")
                .meta
                .is_none();
            if nothing_staged && self.clear_full_if_room() {
                tracing::warn!(
                    "the disk has room again: a compaction's rows are removed and writes are \
                     admitted"
                );
            }
        }
        let mut queue = self.removals.queue.lock().expect("removals lock poisoned");
        let Some(oldest) = queue.front_mut() else {
            // Voided meanwhile by a snapshot's install.
            return Ok(false);
        };
        oldest.removed += batch.len();
        if oldest.removed == oldest.rows.len() {
            let done = queue.pop_front().expect("the front was just seen");
            self.finished_compaction(&done);
        }
        Ok(!queue.is_empty())
    }

    /// Removes `rows` from the file in one durable transaction.
    fn remove_rows(&self, rows: &[Revision]) -> Result<(), StorageError> {
        let mut txn = self.begin_write().map_err(StorageError::write(WHAT))?;
        txn.set_durability(Durability::Immediate)
            .map_err(StorageError::write(WHAT))?;
        {
            let mut kv = txn.open_table(KV).map_err(StorageError::write(WHAT))?;
            for rev in rows {
                kv.remove(rev.to_bytes())
                    .map_err(StorageError::write(WHAT))?;
            }
        }
        txn.commit().map_err(StorageError::commit(WHAT))
    }

    /// Removes every scheduled row now, without pausing (a defragmentation, which is to shrink
    /// the file, does this first). Blocking.
    pub(crate) fn remove_all_compacted(&self) -> Result<(), StorageError> {
        while self.remove_compacted(usize::MAX)? {}
        Ok(())
    }

    /// The newest compaction revision whose hidden rows are all out of the file.
    pub(crate) fn compaction_finished(&self) -> tokio::sync::watch::Receiver<i64> {
        self.removals.finished.subscribe()
    }

    fn finished_compaction(&self, done: &Scheduled) {
        self.removals
            .finished
            .send_modify(|r| *r = (*r).max(done.revision));
        // etcd's words, which its tests wait for.
        tracing::info!(
            "compact-revision" = done.revision,
            "took" = ?done.since.elapsed(),
            "number-of-keys-compacted" = done.rows.len(),
            "finished scheduled compaction"
        );
    }
}
