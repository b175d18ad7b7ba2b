//! Read indexes in rounds: many concurrent linearizable reads share one leadership confirmation
//! (on the leader) or one read-index request to the leader (on a follower), as etcd batches its
//! read-index requests.
//!
//! A read may only use a confirmation that began after the read arrived, or it could miss a
//! write acknowledged just before. So a read joins the *next* round: while one round runs, the
//! reads that arrive wait together for the round after it, which starts as soon as the running
//! one ends. Every reader is answered by exactly one round that began after it joined.

use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, watch};

use super::engine::EngineStatus;
use super::error::ReplicaError;
use super::forward::{
    BoxFuture, Forwarder, ReadIndex, leader_elsewhere, unless_leader_changes, wait_applied,
};
use super::lease_time::SharedClock;
use super::rs::RsEngine;

type Round = Arc<dyn Fn() -> BoxFuture<Result<ReadIndex, ReplicaError>> + Send + Sync>;

/// Readers waiting for the next round, and whether a round is running.
#[derive(Default)]
struct Waiting {
    running: bool,
    next: Vec<oneshot::Sender<Result<ReadIndex, ReplicaError>>>,
}

/// One kind of read-index round (leader confirmation, or asking the leader), shared by callers.
#[derive(Clone)]
pub(super) struct ReadIndexRounds {
    round: Round,
    waiting: Arc<Mutex<Waiting>>,
}

impl ReadIndexRounds {
    fn new(round: Round) -> ReadIndexRounds {
        ReadIndexRounds {
            round,
            waiting: Arc::default(),
        }
    }

    /// On the leader: confirms leadership with a quorum (raft-rs's ReadIndex), waits until
    /// this member has applied that far, and reads the lease time.
    pub(super) fn leader(
        engine: Arc<RsEngine>,
        status: watch::Receiver<EngineStatus>,
        clock: SharedClock,
    ) -> ReadIndexRounds {
        ReadIndexRounds::new(Arc::new(move || {
            let (engine, status, clock) = (engine.clone(), status.clone(), clock.clone());
            Box::pin(async move {
                let index = engine.read_index().await?;
                wait_applied(&status, index).await?;
                Ok(ReadIndex {
                    index,
                    lease_now_ms: clock.get().map(|c| c.now_ms(std::time::Instant::now())),
                })
            })
        }))
    }

    /// On a follower: one read-index request to the current leader for the whole round, given up
    /// as soon as that leader is replaced.
    pub(super) fn follower(
        status: watch::Receiver<EngineStatus>,
        member_id: u64,
        forwarder: Arc<dyn Forwarder>,
    ) -> ReadIndexRounds {
        ReadIndexRounds::new(Arc::new(move || {
            let (status, forwarder) = (status.clone(), forwarder.clone());
            Box::pin(async move {
                let (leader, addr) =
                    leader_elsewhere(&status, member_id).ok_or(ReplicaError::NoLeader)?;
                unless_leader_changes(&status, leader, forwarder.read_index(leader, addr)).await
            })
        }))
    }

    /// A read index from a round that begins after this call (see the module doc).
    pub(super) async fn join(&self) -> Result<ReadIndex, ReplicaError> {
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut waiting = self.waiting.lock().expect("read index lock poisoned");
            waiting.next.push(answer);
            !std::mem::replace(&mut waiting.running, true)
        };
        if start {
            // Rounds run on their own task, so a reader that gives up does not strand the rest.
            tokio::spawn(run_rounds(self.round.clone(), self.waiting.clone()));
        }
        answered.await.map_err(|_| ReplicaError::Stopped)?
    }
}

/// Runs rounds while readers wait; each round answers the readers that joined before it began.
async fn run_rounds(round: Round, waiting: Arc<Mutex<Waiting>>) {
    loop {
        let readers = {
            let mut waiting = waiting.lock().expect("read index lock poisoned");
            if waiting.next.is_empty() {
                waiting.running = false;
                return;
            }
            std::mem::take(&mut waiting.next)
        };
        let result = round().await;
        for reader in readers {
            let _ = reader.send(result.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use tokio::sync::Semaphore;

    use super::*;

    /// Rounds that each wait for one permit of `gate`, and answer with their own number.
    fn gated(gate: Arc<Semaphore>, rounds: Arc<AtomicU64>) -> ReadIndexRounds {
        ReadIndexRounds::new(Arc::new(move || {
            let (gate, rounds) = (gate.clone(), rounds.clone());
            Box::pin(async move {
                let n = rounds.fetch_add(1, Ordering::SeqCst) + 1;
                gate.acquire().await.expect("gate open").forget();
                Ok(ReadIndex {
                    index: n,
                    lease_now_ms: None,
                })
            })
        }))
    }

    async fn until(what: impl Fn() -> bool) {
        for _ in 0..1_000 {
            if what() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("condition not reached in 1 s");
    }

    #[tokio::test]
    async fn readers_arriving_during_a_round_share_the_next_round_not_the_running_one() {
        let gate = Arc::new(Semaphore::new(0));
        let rounds = Arc::new(AtomicU64::new(0));
        let reads = gated(gate.clone(), rounds.clone());
        let first = tokio::spawn({
            let reads = reads.clone();
            async move { reads.join().await }
        });
        until(|| rounds.load(Ordering::SeqCst) == 1).await;
        // Round 1 is running: these must not be answered by it.
        let later: Vec<_> = (0..10)
            .map(|_| {
                let reads = reads.clone();
                tokio::spawn(async move { reads.join().await })
            })
            .collect();
        until(|| reads.waiting.lock().unwrap().next.len() == 10).await;
        gate.add_permits(1);
        assert_eq!(first.await.unwrap().unwrap().index, 1);
        until(|| rounds.load(Ordering::SeqCst) == 2).await;
        gate.add_permits(1);
        for read in later {
            assert_eq!(read.await.unwrap().unwrap().index, 2, "one shared round");
        }
        assert_eq!(rounds.load(Ordering::SeqCst), 2, "eleven reads, two rounds");
        // Idle again: the next reader starts a round of its own.
        gate.add_permits(1);
        assert_eq!(reads.join().await.unwrap().index, 3);
    }
}
