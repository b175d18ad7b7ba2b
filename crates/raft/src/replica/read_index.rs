//! Read indexes in rounds ([`ReadRounds`] decides which round answers which reader):
//! on the leader a round confirms leadership with a quorum; on a follower it asks the leader for
//! its read index over the peer line, as the simulator's members do too.

use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, watch};

use super::engine::EngineStatus;
use super::error::ReplicaError;
use super::forward::{
    BoxFuture, Forwarder, ReadIndex, leader_elsewhere, unless_leader_changes, wait_applied,
};
use super::lease_time::SharedClock;
use super::rs::RsEngine;
use crate::steps::ReadRounds;
use crate::telemetry::Telemetry;

type Round = Arc<dyn Fn() -> BoxFuture<Result<ReadIndex, ReplicaError>> + Send + Sync>;

type Reader = oneshot::Sender<Result<ReadIndex, ReplicaError>>;

/// One kind of read-index round (leader confirmation, or asking the leader), shared by callers.
#[derive(Clone)]
pub(super) struct ReadIndexRounds {
    round: Round,
    waiting: Arc<Mutex<ReadRounds<Reader>>>,
    /// Where failed and slow rounds are counted.
    telemetry: Option<Arc<Telemetry>>,
}

impl ReadIndexRounds {
    fn new(round: Round) -> ReadIndexRounds {
        ReadIndexRounds {
            round,
            waiting: Arc::default(),
            telemetry: None,
        }
    }

    /// The same rounds, each counted in `telemetry` when it fails or is slow.
    pub(super) fn counted(self, telemetry: Arc<Telemetry>) -> ReadIndexRounds {
        ReadIndexRounds {
            telemetry: Some(telemetry),
            ..self
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
        let start = self
            .waiting
            .lock()
            .expect("read index lock poisoned")
            .join(answer);
        if let Some(readers) = start {
            // Rounds run on their own task, so a reader that gives up does not strand the rest.
            tokio::spawn(run_rounds(
                self.round.clone(),
                self.waiting.clone(),
                self.telemetry.clone(),
                readers,
            ));
        }
        answered.await.map_err(|_| ReplicaError::Stopped)?
    }
}

/// Runs rounds while readers wait, starting with one for `readers`; each round answers the
/// readers that joined before it began.
async fn run_rounds(
    round: Round,
    waiting: Arc<Mutex<ReadRounds<Reader>>>,
    telemetry: Option<Arc<Telemetry>>,
    mut readers: Vec<Reader>,
) {
    loop {
        let started = std::time::Instant::now();
        let result = round().await;
        if let Some(telemetry) = &telemetry {
            telemetry.read_index_round(result.is_err(), started.elapsed());
        }
        for reader in readers {
            let _ = reader.send(result.clone());
        }
        let next = waiting.lock().expect("read index lock poisoned").finished();
        match next {
            Some(next) => readers = next,
            None => return,
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
        until(|| reads.waiting.lock().unwrap().waiting() == 10).await;
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
