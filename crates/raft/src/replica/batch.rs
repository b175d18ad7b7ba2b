//! Group commit: concurrent writes become one log entry, proposed on this member's Raft when it
//! leads and forwarded to the leader when it does not.

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use super::engine::EngineStatus;
use super::error::ReplicaError;
use super::forward::{Forwarded, Forwarder, forward, wait_applied};
use super::lease_time::{SharedClock, stamp_lease_times};
use super::rs::RsEngine;
use crate::command::{Applied, Write};
use crate::steps::{BatchFill, Go, Proposer, answered_before_apply};

/// Writes waiting to be batched before callers wait for room.
pub(super) const QUEUE_LEN_MAX: usize = 16 * 1024;

/// Forwarded batches a follower keeps in flight to the leader at once. The leader folds them
/// into its own batches (see [`crate::Replica::leader_commit`]), so a follower need not wait for
/// one to commit before it sends the next: what its clients write meanwhile joins the leader's
/// next log entry instead of waiting a whole commit round trip here.
pub(super) const FORWARDS_IN_FLIGHT_MAX: usize = 8;

/// A write waiting for its batch.
pub(super) struct Pending {
    pub(super) write: Write,
    /// Forwarded to this member by a follower: never forwarded again (a member that no longer
    /// leads answers "no leader", and the follower retries with the new leader).
    pub(super) from_peer: bool,
    pub(super) reply: oneshot::Sender<Result<Committed, ReplicaError>>,
}

/// A write's outcome: what applying it produced, and the index of the log entry that held it.
#[derive(Debug)]
pub(super) struct Committed {
    pub(super) log_index: u64,
    pub(super) applied: Applied,
}

/// Takes whatever writes are queued (at least one, at most a batch), proposes them as one log
/// entry, and answers each caller with its own result. The Raft thread takes a proposal without
/// waiting for the last one's fsync, so the next batch forms at once. On a follower the batch
/// goes to the leader, up to [`FORWARDS_IN_FLIGHT_MAX`] batches at once, and the callers are
/// answered once this member has applied it too. What becomes of each batch is
/// [`Proposer::batch`]'s decision, which the simulator's members take too.
pub(super) async fn propose_batches(
    engine: Arc<RsEngine>,
    status: watch::Receiver<EngineStatus>,
    member_id: u64,
    clock: SharedClock,
    cover_margin_ms: u64,
    forwarder: Arc<dyn Forwarder>,
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Pending>>>,
) {
    let forwards = Arc::new(Semaphore::new(FORWARDS_IN_FLIGHT_MAX));
    let mut proposer = Proposer::default();
    loop {
        let mut receiver = queue.lock().await;
        let batch = {
            let queue = &mut *receiver;
            let Some(first) = queue.recv().await else {
                return;
            };
            let mut fill = BatchFill::default();
            fill.add(&first.write);
            let mut batch = vec![first];
            while fill.open() {
                match queue.try_recv() {
                    Ok(next) => {
                        fill.add(&next.write);
                        batch.push(next);
                    }
                    Err(_) => break,
                }
            }
            batch
        };
        drop(receiver);
        let step = {
            let status = status.borrow();
            proposer.batch(
                batch,
                |p| &p.write,
                |p| p.from_peer,
                member_id,
                status.is_leader,
                status.leader.unwrap_or(0),
                clock.get().is_some(),
                tokio::time::Instant::now().into_std(),
            )
        };
        for p in step.no_leader {
            let _ = p.reply.send(Err(ReplicaError::NoLeader));
        }
        let own = match step.go {
            Go::Done => continue,
            Go::Forward { leader, batch } => {
                let Some(addr) = status.borrow().peer_url(leader).map(str::to_owned) else {
                    answer(
                        batch.into_iter().map(|p| p.reply).collect(),
                        Err(ReplicaError::NoLeader),
                    );
                    continue;
                };
                let Ok(permit) = forwards.clone().acquire_owned().await else {
                    return;
                };
                let (status, forwarder) = (status.clone(), forwarder.clone());
                tokio::spawn(async move {
                    let (writes, replies): (Vec<Write>, Vec<_>) =
                        batch.into_iter().map(|p| (p.write, p.reply)).unzip();
                    let at_commit: Vec<bool> =
                        writes.iter().map(Write::answered_at_commit).collect();
                    let result = forward(&status, &*forwarder, leader, addr, writes).await;
                    drop(permit);
                    answer_forwarded(&status, replies, &at_commit, result).await;
                });
                continue;
            }
            Go::Propose(batch) => batch,
            // The proposer waits with it, taking nothing more off the queue: woken by the
            // promotion, or at the bound (the stamp then answers "no leader").
            Go::Hold { until } => loop {
                let now = tokio::time::Instant::now().into_std();
                if let Some(batch) = proposer.release(clock.get().is_some(), now) {
                    break batch;
                }
                clock
                    .wait_timing(until.saturating_duration_since(now))
                    .await;
            },
        };
        // Submitted in order; the Raft thread puts whatever arrived together into one append.
        let (writes, replies): (Vec<Write>, Vec<_>) =
            own.into_iter().map(|p| (p.write, p.reply)).unzip();
        match stamp_lease_times(&clock, cover_margin_ms, writes).map(|p| engine.submit(p)) {
            Ok(committed) => {
                tokio::spawn(async move { answer(replies, committed.await) });
            }
            Err(e) => answer(replies, Err(e)),
        }
    }
}

/// Answers a forwarded batch: renewals at once (see [`Write::answered_at_commit`]), every other
/// write once this member has applied the entry that holds it.
async fn answer_forwarded(
    status: &watch::Receiver<EngineStatus>,
    replies: Vec<oneshot::Sender<Result<Committed, ReplicaError>>>,
    at_commit: &[bool],
    result: Result<Forwarded, ReplicaError>,
) {
    let Forwarded { log_index, applied } = match result {
        Ok(forwarded) => forwarded,
        Err(e) => return answer(replies, Err(e)),
    };
    debug_assert_eq!(applied.len(), replies.len(), "one result per command");
    let mut after_apply = Vec::new();
    for ((reply, applied), at_commit) in replies.into_iter().zip(applied).zip(at_commit) {
        if answered_before_apply(*at_commit, &applied) {
            let _ = reply.send(Ok(Committed { log_index, applied }));
        } else {
            after_apply.push((reply, applied));
        }
    }
    if after_apply.is_empty() {
        return;
    }
    let (replies, applied): (Vec<_>, Vec<_>) = after_apply.into_iter().unzip();
    let result = wait_applied(status, log_index)
        .await
        .map(|()| Forwarded { log_index, applied });
    answer(replies, result);
}

/// Answers each write of a batch with its own result (or the batch's error).
fn answer(
    replies: Vec<oneshot::Sender<Result<Committed, ReplicaError>>>,
    result: Result<Forwarded, ReplicaError>,
) {
    match result {
        Ok(Forwarded { log_index, applied }) => {
            debug_assert_eq!(applied.len(), replies.len(), "one result per command");
            for (reply, applied) in replies.into_iter().zip(applied) {
                let _ = reply.send(Ok(Committed { log_index, applied }));
            }
        }
        Err(err) => {
            for reply in replies {
                let _ = reply.send(Err(err.clone()));
            }
        }
    }
}
