//! Read indexes in rounds ([`ReadRounds`] decides which round answers which reader):
//! on the leader a round confirms leadership with a quorum; on a follower it asks the leader for
//! its read index over the peer line, as the simulator's members do too.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_consensus::HeartbeatSeen;
use tokio::sync::{oneshot, watch};

use super::engine::EngineStatus;
use super::error::ReplicaError;
use super::forward::{BoxFuture, Forwarder, ReadIndex, leader_elsewhere, wait_applied};
use super::lease_time::SharedClock;
use super::rs::RsEngine;
use crate::steps::{
    FollowerRound, FollowerStep, LeaderEnd, LeaderRound, LeaderStep, ReadRounds, RoundEnd,
};
use crate::telemetry::Telemetry;
use ReplicaError::LeaderChanged;

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

    /// On the leader: one [`LeaderRound`] (a quorum confirms leadership through raft-rs's
    /// ReadIndex, then this member applies that far; a leader deposed before the confirmation
    /// fails it with "leader changed" at once, as etcd's does), carried out here on the engine
    /// and the status watch; the answer carries the lease time.
    pub(super) fn leader(
        engine: Arc<RsEngine>,
        status: watch::Receiver<EngineStatus>,
        clock: SharedClock,
    ) -> ReadIndexRounds {
        ReadIndexRounds::new(Arc::new(move || {
            let (engine, status, clock) = (engine.clone(), status.clone(), clock.clone());
            Box::pin(async move {
                let (term, leading) = {
                    let s = status.borrow();
                    (s.term, s.is_leader)
                };
                let mut round = LeaderRound::start(leading, term);
                let watched = round;
                let deposed = |s: &EngineStatus| {
                    watched
                        .leadership::<ReplicaError>(s.is_leader, s.term)
                        .is_some()
                };
                let mut leadership = status.clone();
                let step = tokio::select! {
                    answer = engine.read_index() => {
                        round.confirmed(answer, status.borrow().applied_index)
                    }
                    now = leadership.wait_for(deposed) => {
                        now.map_err(|_| ReplicaError::Stopped)?;
                        LeaderStep::Failed(LeaderEnd::LeaderChanged)
                    }
                };
                let confirmed = match step {
                    LeaderStep::Read(confirmed) => confirmed,
                    LeaderStep::AwaitApply(confirmed) => {
                        wait_applied(&status, confirmed.index).await?;
                        confirmed
                    }
                    LeaderStep::Failed(LeaderEnd::Index(e)) => return Err(e),
                    LeaderStep::Failed(LeaderEnd::LeaderChanged) => return Err(LeaderChanged),
                };
                Ok(ReadIndex {
                    index: confirmed.index,
                    lease_now_ms: clock.lease_now_ms(),
                    proof: confirmed.proof,
                })
            })
        }))
    }

    /// On a follower: one [`FollowerRound`] to the current leader (the decisions are the
    /// round's: when its answer counts, when to ask again, when to give up), carried out here
    /// with the peer line for its asks and this member's core for the leader's heartbeats.
    pub(super) fn follower(
        status: watch::Receiver<EngineStatus>,
        member_id: u64,
        forwarder: Arc<dyn Forwarder>,
        heartbeats: watch::Receiver<HeartbeatSeen>,
        election_timeout: Duration,
    ) -> ReadIndexRounds {
        ReadIndexRounds::new(Arc::new(move || {
            let (status, forwarder) = (status.clone(), forwarder.clone());
            let heartbeats = heartbeats.clone();
            Box::pin(async move {
                let (leader, addr) =
                    leader_elsewhere(&status, member_id).ok_or(ReplicaError::NoLeader)?;
                let (round, first) = FollowerRound::start(leader, election_timeout);
                follower_round(round, first, status, &*forwarder, addr, heartbeats).await
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

/// Carries out `round` from its `step` on: asks over the peer line, waits for this member's
/// core to step the leader's heartbeats or for the round's deadline, and watches for the leader
/// to change, handing each to the round until it is over.
async fn follower_round(
    mut round: FollowerRound<Option<u64>>,
    mut step: FollowerStep<Option<u64>, ReplicaError>,
    mut status: watch::Receiver<EngineStatus>,
    forwarder: &dyn Forwarder,
    addr: String,
    mut heartbeats: watch::Receiver<HeartbeatSeen>,
) -> Result<ReadIndex, ReplicaError> {
    let leader = round.leader();
    loop {
        let lost = status.wait_for(|s| s.leader != Some(leader));
        step = match step {
            FollowerStep::Read { index, with } => {
                return Ok(ReadIndex {
                    index,
                    lease_now_ms: with,
                    proof: None,
                });
            }
            FollowerStep::Failed(end) => {
                return Err(match end {
                    RoundEnd::Ask(e) => e,
                    RoundEnd::Unproven => ReplicaError::NoLeader,
                    RoundEnd::LeaderChanged => LeaderChanged,
                });
            }
            FollowerStep::Ask => {
                let ask = forwarder.read_index(leader, addr.clone());
                tokio::select! {
                    answer = ask => {
                        let answer = answer.map(|r| (r.index, r.proof, r.lease_now_ms));
                        let seen = *heartbeats.borrow_and_update();
                        round.answered(answer, &seen, tokio::time::Instant::now().into_std())
                    }
                    now = lost => leader_lost(&mut round, now.map(|s| s.leader))?,
                }
            }
            FollowerStep::AwaitProof { until } => {
                let deadline = tokio::time::Instant::from_std(until);
                tokio::select! {
                    changed = heartbeats.changed() => {
                        changed.map_err(|_| ReplicaError::Stopped)?;
                        let seen = *heartbeats.borrow_and_update();
                        round.heard(&seen).unwrap_or(FollowerStep::AwaitProof { until })
                    }
                    () = tokio::time::sleep_until(deadline) => round
                        .timed_out(tokio::time::Instant::now().into_std())
                        .unwrap_or(FollowerStep::AwaitProof { until }),
                    now = lost => leader_lost(&mut round, now.map(|s| s.leader))?,
                }
            }
        };
    }
}

/// The round's step once this member's known leader became `leader` (an error: the engine is
/// gone).
fn leader_lost<A>(
    round: &mut FollowerRound<A>,
    leader: Result<Option<u64>, watch::error::RecvError>,
) -> Result<FollowerStep<A, ReplicaError>, ReplicaError> {
    let leader = leader.map_err(|_| ReplicaError::Stopped)?;
    Ok(round
        .leader_is(leader)
        .unwrap_or(FollowerStep::Failed(RoundEnd::LeaderChanged)))
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

    use leasehold_consensus::reads::ReadProof;
    use tokio::sync::Semaphore;

    use super::*;
    use crate::steps::PROOF_ASKS;
    use crate::steps::follower_round_heard::{PROOF, seen};

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
                    proof: None,
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

    /// A leader (member 2) that answers every read-index ask with index 9 and `proof`, counting
    /// the asks.
    struct ProvingLeader {
        asks: Arc<AtomicU64>,
        proof: Option<ReadProof>,
    }

    impl Forwarder for ProvingLeader {
        fn forward(
            &self,
            _: u64,
            _: String,
            _: Vec<crate::Write>,
        ) -> BoxFuture<Result<super::super::Forwarded, ReplicaError>> {
            unreachable!("reads only")
        }

        fn read_index(&self, leader: u64, _: String) -> BoxFuture<Result<ReadIndex, ReplicaError>> {
            assert_eq!(leader, 2);
            self.asks.fetch_add(1, Ordering::SeqCst);
            let proof = self.proof;
            Box::pin(async move {
                Ok(ReadIndex {
                    index: 9,
                    lease_now_ms: Some(1),
                    proof,
                })
            })
        }

        fn change_members(
            &self,
            _: u64,
            _: String,
            _: super::super::MemberChange,
        ) -> BoxFuture<Result<(), ReplicaError>> {
            unreachable!("reads only")
        }

        fn hash_kv(
            &self,
            _: u64,
            _: String,
            _: i64,
        ) -> BoxFuture<Result<Option<super::super::MemberHash>, ReplicaError>> {
            unreachable!("reads only")
        }
    }

    /// Member 1's follower rounds to leader 2, which proves its rounds with `proof`, with the
    /// heartbeats member 1 has stepped on `seen`.
    fn follower_of_2(
        asks: Arc<AtomicU64>,
        proof: Option<ReadProof>,
        seen: &watch::Sender<HeartbeatSeen>,
    ) -> (ReadIndexRounds, watch::Sender<EngineStatus>) {
        let members = [1, 2]
            .into_iter()
            .map(|id| {
                let member = crate::position::Member {
                    peer_url: format!("http://m{id}"),
                    learner: false,
                };
                (id, member)
            })
            .collect();
        let status = watch::Sender::new(EngineStatus {
            term: 3,
            leader: Some(2),
            members: Arc::new(members),
            ..EngineStatus::default()
        });
        let rounds = ReadIndexRounds::follower(
            status.subscribe(),
            1,
            Arc::new(ProvingLeader { asks, proof }),
            seen.subscribe(),
            Duration::from_millis(1_000),
        );
        (rounds, status)
    }

    /// The leader's answer counts once the follower has stepped the leader's heartbeat of the
    /// round's term carrying its context or a later one; before that it waits.
    #[tokio::test(start_paused = true)]
    async fn a_follower_round_counts_once_the_leaders_heartbeat_for_it_arrives() {
        let asks = Arc::new(AtomicU64::new(0));
        let heartbeats = watch::Sender::new(seen(2, 3, 4));
        let (rounds, _status) = follower_of_2(asks.clone(), Some(PROOF), &heartbeats);
        let read = tokio::spawn({
            let rounds = rounds.clone();
            async move { rounds.join().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!read.is_finished(), "context 4 does not prove round 5");
        // Another leader's, or another term's, context proves nothing.
        heartbeats.send_replace(seen(3, 3, 9));
        heartbeats.send_replace(seen(2, 2, 9));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!read.is_finished(), "not this leader's term");
        heartbeats.send_replace(seen(2, 3, 6));
        let read = read.await.unwrap().expect("proven");
        assert_eq!((read.index, read.lease_now_ms), (9, Some(1)));
        assert_eq!(asks.load(Ordering::SeqCst), 1);
        // Already proven when the answer comes: answered at once.
        assert_eq!(rounds.join().await.unwrap().index, 9);
    }

    /// A follower the leader's heartbeats do not reach (a one-way partition: its asks get
    /// through, the leader's traffic does not) asks again each half election timeout, and its
    /// reads fail with "no leader" after the last ask.
    #[tokio::test(start_paused = true)]
    async fn a_follower_that_never_hears_the_leader_fails_its_reads() {
        let asks = Arc::new(AtomicU64::new(0));
        let heartbeats = watch::Sender::new(HeartbeatSeen::default());
        let (rounds, _status) = follower_of_2(asks.clone(), Some(PROOF), &heartbeats);
        let started = tokio::time::Instant::now();
        let read = rounds.join().await;
        assert!(matches!(read, Err(ReplicaError::NoLeader)), "{read:?}");
        assert_eq!(asks.load(Ordering::SeqCst), PROOF_ASKS as u64);
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(500) * PROOF_ASKS as u32
        );
    }

    /// A follower that loses its leader while it waits for the round's heartbeat fails the
    /// round at once with etcd's "leader changed".
    #[tokio::test(start_paused = true)]
    async fn a_follower_round_fails_with_leader_changed_when_the_leader_goes() {
        let asks = Arc::new(AtomicU64::new(0));
        let heartbeats = watch::Sender::new(HeartbeatSeen::default());
        let (rounds, status) = follower_of_2(asks.clone(), Some(PROOF), &heartbeats);
        let read = tokio::spawn(async move { rounds.join().await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!read.is_finished());
        status.send_modify(|s| s.leader = None);
        let read = read.await.unwrap();
        assert!(matches!(read, Err(ReplicaError::LeaderChanged)), "{read:?}");
        assert_eq!(asks.load(Ordering::SeqCst), 1);
    }

    /// A leader's answer without a proof (it is the only voter) counts at once.
    #[tokio::test(start_paused = true)]
    async fn an_answer_without_proof_counts_at_once() {
        let asks = Arc::new(AtomicU64::new(0));
        let heartbeats = watch::Sender::new(HeartbeatSeen::default());
        let (rounds, _status) = follower_of_2(asks.clone(), None, &heartbeats);
        let started = tokio::time::Instant::now();
        assert_eq!(rounds.join().await.unwrap().index, 9);
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(asks.load(Ordering::SeqCst), 1);
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
