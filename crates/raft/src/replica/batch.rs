//! Group commit: concurrent writes become one log entry, proposed on this member's Raft when it
//! leads and forwarded to the leader when it does not.

use std::sync::Arc;

use openraft::Raft;
use tokio::sync::{mpsc, oneshot};

use super::error::ReplicaError;
use super::forward::{Forwarded, Forwarder, forward, leader_elsewhere};
use super::lease_time::{PROMOTION_WAIT_MAX, SharedClock, stamp_lease_times};
use crate::TypeConfig;
use crate::command::{Applied, Proposal, Write};
use crate::storage::FirstFailure;

/// Most commands in one log entry (a renewal is about 15 bytes of it, a 256-byte put about 280).
pub(super) const BATCH_LEN_MAX: usize = 4096;

/// Soft bound on one log entry's size: a batch closes once it holds this much.
pub(super) const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Proposals in flight at once. One: openraft 0.9 appends each proposal to the log and waits for
/// its fsync before it takes the next, so a second proposal in flight does not overlap the disk;
/// it only splits the writes that arrived meanwhile into two entries and two fsyncs. With one,
/// everything that arrives while an entry is being synced and applied forms the next entry.
/// Measured (64 clients, single node, release): 1 proposer 24,550 puts/s, 2: 21,074, 4: 13,260,
/// 8: 8,761 (docs/bench.md).
pub(super) const PROPOSERS: usize = 1;

/// Writes waiting to be batched before callers wait for room.
pub(super) const QUEUE_LEN_MAX: usize = 16 * 1024;

/// A client write waiting for its batch.
pub(super) struct Pending {
    pub(super) write: Write,
    pub(super) reply: oneshot::Sender<Result<Applied, ReplicaError>>,
}

/// Takes whatever writes are queued (at least one, at most a batch), proposes them as one log
/// entry, and answers each caller with its own result. [`PROPOSERS`] of these run (one), so the
/// next batch forms while the previous one is being made durable. On a follower the batch goes
/// to the leader, and the callers are answered once this member has applied it too.
pub(super) async fn propose_batches(
    raft: Raft<TypeConfig>,
    member_id: u64,
    clock: SharedClock,
    failure: Arc<FirstFailure>,
    forwarder: Arc<dyn Forwarder>,
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Pending>>>,
) {
    loop {
        let batch = {
            let mut queue = queue.lock().await;
            let Some(first) = queue.recv().await else {
                return;
            };
            let mut bytes = first.write.approx_bytes();
            let mut batch = vec![first];
            while batch.len() < BATCH_LEN_MAX && bytes < BATCH_BYTES_MAX {
                match queue.try_recv() {
                    Ok(next) => {
                        bytes += next.write.approx_bytes();
                        batch.push(next);
                    }
                    Err(_) => break,
                }
            }
            batch
        };
        let (writes, replies): (Vec<Write>, Vec<_>) =
            batch.into_iter().map(|p| (p.write, p.reply)).unzip();
        let count = writes.len();
        let result = match leader_elsewhere(&raft, member_id) {
            Some((leader, addr)) => forward(&raft, &*forwarder, leader, addr, writes).await,
            None => commit(&raft, &clock, &failure, writes)
                .await
                .map(|f| f.applied),
        };
        match result {
            Ok(applied) => {
                debug_assert_eq!(applied.len(), count, "one result per command");
                for (reply, applied) in replies.into_iter().zip(applied) {
                    let _ = reply.send(Ok(applied));
                }
            }
            Err(err) => {
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
}

/// Commits `writes` as one log entry through this member's Raft (which must lead).
pub(super) async fn commit(
    raft: &Raft<TypeConfig>,
    clock: &SharedClock,
    failure: &FirstFailure,
    writes: Vec<Write>,
) -> Result<Forwarded, ReplicaError> {
    // A leader times leases only once it has promoted itself (milliseconds after its
    // election): grants and renewals that arrive before then wait for it, bounded.
    if writes.iter().any(Write::is_lease_timed) && clock.get().is_none() {
        // Woken by the promotion; gives up (and answers "no leader") after the bound.
        clock.wait_timing(PROMOTION_WAIT_MAX).await;
    }
    let proposal = stamp_lease_times(clock, writes)?;
    commit_proposal(raft, failure, proposal).await
}

/// Commits a log entry of stamped commands through this member's Raft (which must lead).
pub(super) async fn commit_proposal(
    raft: &Raft<TypeConfig>,
    failure: &FirstFailure,
    proposal: Proposal,
) -> Result<Forwarded, ReplicaError> {
    match raft.client_write(proposal).await {
        Ok(resp) => Ok(Forwarded {
            log_index: resp.log_id.index,
            applied: resp.data,
        }),
        Err(e) => Err(failure.client_write_error(e)),
    }
}
