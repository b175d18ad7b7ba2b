//! The engine under the replica: `leasehold-consensus`'s Raft thread, with its log in
//! `leasehold-wal` and the state machine in redb.
//!
//! ```text
//!   propose_batches ─► RsEngine::submit ─► Raft thread (Core: one append + fdatasync per Ready)
//!        ▲                                      │ committed entries
//!        └── Waiters (index, term) ◄── RsMachine::apply ─► apply_entries (staged rows)
//!   checkpointer (rung by apply, or by a wanted snapshot): staged rows ─► redb, durably
//!                                                        ─► Core::compact_log
//! ```
//!
//! The log is the durability: applying writes nothing to disk, and the state machine reaches
//! its file in one durable commit that records the applied index, at most [`CHECKPOINT_EVERY`]
//! after it was staged. A restart replays the log from there. The log is compacted only up to a
//! durable checkpoint. An idle member's checkpointer sleeps: nothing wakes it but staged rows, a
//! snapshot a follower wants, or the stop.
//!
//! Membership changes are ConfChangeV2 entries whose context names the member's peer URL. A
//! new cluster's members start with their log compacted at [`INIT_INDEX`], so a member added
//! later, whose log is empty, is caught up by a snapshot, which carries the membership, never by
//! replaying entries that never held the initial members.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_consensus::driver::{Committed, Driver, Input, Machine, Proposed, Reply};
use leasehold_consensus::eraftpb;
use leasehold_consensus::reads::{Confirmed, ReadBatcher, ReadError, ReadWaiter};
use leasehold_consensus::{
    Checkpoint, Core, CoreConfig, CoreError, CoreStatus, HeartbeatSeen, Host, HostError,
    decode_peer_message, encode_message,
};
use leasehold_wal::StdFs;
use leasehold_wal::proto::ConfState;
use tokio::sync::{oneshot, watch};

use super::config::CompactionPace;
use super::engine::{EngineMember, EngineStatus};
use super::error::{Fatal, ReplicaError};
use super::forward::{BoxFuture, Forwarded, MemberChange};
use crate::clock::Clock;
use crate::command::Proposal;
use crate::position::{self, LogPosition};
use crate::state_machine::{self, Applying, Shared};
use crate::steps::{self, AppendTimes, EntryOutcome};
use crate::storage::{self, Bell, Db};
use crate::telemetry::Telemetry;

/// How often the applied state reaches its file (and the log may be compacted behind it).
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// Where the log of a member that holds a membership (bootstrapped or restored) starts at
/// least: compacted to this index and term, as if a snapshot of the initial state were there.
const INIT_INDEX: u64 = 1;

/// How long a proposer waits for its entry to be applied before it answers "no leader" (the
/// entry may still commit: the client's retry is then a second write, as with etcd's time-out).
const PROPOSAL_WAIT_MAX: Duration = Duration::from_secs(7);

/// The messages a member sends its peers, by Raft ID (the peer transport implements it).
pub trait RaftTransport: Send + Sync + 'static {
    /// The peers to keep links to, by ID and peer URL.
    fn set_peers(&self, peers: Vec<(u64, String)>);
    /// Queues one encoded message for `to` without waiting (best effort: Raft resends).
    fn send(&self, to: u64, message: Vec<u8>);
    /// The bytes of messages queued for peer `to` and not yet sent (Raft sends a follower that
    /// lags more of the log only as these go: see `CoreConfig::catch_up_window_bytes`).
    fn waiting_bytes(&self, to: u64) -> u64 {
        let _ = to;
        0
    }
    /// Streams the snapshot's file `request` names (a Raft snapshot's data) from member `from`
    /// into `into`. Blocking: called off the runtime.
    fn fetch_snapshot(
        &self,
        from: u64,
        request: Vec<u8>,
        into: &mut dyn std::io::Write,
    ) -> Result<(), String> {
        let _ = (request, into);
        Err(format!("no transport to fetch a snapshot from {from:x}"))
    }
}

/// A transport for a member without peers.
#[derive(Debug, Default)]
pub struct NoTransport;

impl RaftTransport for NoTransport {
    fn set_peers(&self, _: Vec<(u64, String)>) {}
    fn send(&self, _: u64, _: Vec<u8>) {}
}

/// Proposals waiting for their entries (`steps::Waiters` decides which entry answers which):
/// each answered with its entry's replies, or why not.
type Waiters = Arc<Mutex<steps::Waiters<oneshot::Sender<Result<Forwarded, ReplicaError>>>>>;

/// The engine's handle: inputs for the Raft thread, and the proposals waiting on it.
pub(crate) struct RsEngine {
    member_id: u64,
    inputs: std::sync::mpsc::Sender<Input<StdFs>>,
    driver: Mutex<Option<Driver<StdFs>>>,
    waiters: Waiters,
    fatal: watch::Sender<Option<Fatal>>,
    checkpointer: Mutex<Option<Worker>>,
    compactor: Mutex<Option<Worker>>,
    telemetry: Arc<Telemetry>,
    heartbeats: watch::Sender<HeartbeatSeen>,
    /// Weak: the file closes once the Raft thread and the workers let go of it.
    db: std::sync::Weak<Db>,
    transport: Arc<dyn RaftTransport>,
    /// A snapshot's file is being received (one at a time; see [`RsEngine::deliver`]).
    receiving: Arc<std::sync::atomic::AtomicBool>,
}

/// A storage thread: the checkpointer, or the compactor.
struct Worker {
    bell: Arc<Bell>,
    /// Joined by [`RsEngine::stop`]; left to finish by itself when dropped otherwise.
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What opening the log needs: where, how Raft is tuned, and the state machine's applied
/// position and membership as its file records them (read before the state itself is loaded, so
/// that the log and the state are read at the same time).
pub(super) struct LogOpening {
    pub(super) member_id: u64,
    pub(super) data_dir: std::path::PathBuf,
    pub(super) heartbeat_interval_ms: u64,
    pub(super) election_timeout_ms: u64,
    /// Entries the log keeps behind a checkpoint for followers that lag (`--snapshot-count`,
    /// at most etcd's 5,000 catch-up entries); one further behind gets a snapshot.
    pub(super) catch_up_entries: u64,
    /// `--force-new-cluster`, on a data dir that holds a cluster.
    pub(super) force_new_cluster: bool,
    pub(super) last_applied: Option<LogPosition>,
    /// The membership to start with ([`starting_membership`]).
    pub(super) members: position::Members,
}

/// The log, opened and recovered, with the Raft core over it: what [`RsEngine::start`] runs.
pub(super) struct OpenedLog {
    member_id: u64,
    core: Core<StdFs>,
    applied_index: u64,
    heartbeat_ms: u64,
    election_tick: u64,
    members: position::Members,
}

impl OpenedLog {
    /// The commit index the log holds: what this member applies at start without a leader.
    pub(super) fn commit_index(&self) -> u64 {
        self.core.status().commit
    }
}

/// The membership a member starts with: the one its file holds, or, in a data dir that holds
/// nothing yet, the new cluster's members (`bootstrap`) as voters.
pub(super) fn starting_membership(
    last_applied: Option<LogPosition>,
    membership: position::Members,
    bootstrap: Option<&BTreeMap<u64, String>>,
) -> position::Members {
    match bootstrap {
        Some(members) if last_applied.is_none() && membership.is_empty() => {
            position::voters(members)
        }
        _ => membership,
    }
}

/// Opens and recovers the log (every segment read and checked). Blocking; needs nothing of the
/// loaded state, so it runs while the state machine loads.
pub(super) fn open_log(opening: LogOpening) -> Result<OpenedLog, String> {
    let LogOpening {
        member_id,
        data_dir,
        heartbeat_interval_ms,
        election_timeout_ms,
        catch_up_entries,
        force_new_cluster,
        last_applied,
        members,
    } = opening;
    let (mut applied_index, mut applied_term) = last_applied.map_or((0, 0), |l| (l.index, l.term));
    if !members.is_empty() && applied_index < INIT_INDEX {
        (applied_index, applied_term) = (INIT_INDEX, 1);
    }
    let checkpoint = Checkpoint {
        applied_index,
        applied_term,
        conf_state: conf_state_of(&members),
    };
    let heartbeat_ms = heartbeat_interval_ms.max(1);
    let mut config = CoreConfig::new(member_id);
    config.election_tick =
        usize::try_from((election_timeout_ms / heartbeat_ms).max(2)).unwrap_or(usize::MAX);
    let election_tick = config.election_tick as u64;
    config.catch_up_entries = catch_up_entries.clamp(1, config.catch_up_entries);
    // A --snapshot-count raised above etcd's default asks for a long log, as etcd keeps that
    // many entries in memory: the byte bound on entries every follower holds is lifted.
    if catch_up_entries > crate::SNAPSHOT_COUNT_DEFAULT {
        config.catch_up_bytes = u64::MAX;
    }
    config.force_new_cluster = force_new_cluster;
    let logger = leasehold_consensus::tracing_logger();
    let core = Core::open(StdFs, &data_dir.join("wal"), &config, checkpoint, &logger)
        .map_err(|e| e.to_string())?;
    Ok(OpenedLog {
        member_id,
        core,
        applied_index,
        heartbeat_ms,
        election_tick,
        members,
    })
}

/// What starting the engine needs from the replica besides the opened log.
pub(super) struct RsStart {
    /// The peers `--initial-cluster` names: a member that waits to be added answers the
    /// leader there until a snapshot tells it the membership.
    pub(super) initial_peers: BTreeMap<u64, String>,
    pub(super) shared: Shared,
    pub(super) db: Arc<Db>,
    pub(super) telemetry: Arc<Telemetry>,
    pub(super) transport: Arc<dyn RaftTransport>,
    pub(super) compaction_pace: CompactionPace,
    /// Dates appended entries (`AppendTimes`) and the lease time applied (`crate::clock`).
    pub(super) clock: Arc<dyn Clock>,
}

impl RsEngine {
    /// Starts the Raft thread on the opened log, and the checkpointer; returns the handle and
    /// the status it publishes.
    pub(super) fn start(
        log: OpenedLog,
        start: RsStart,
    ) -> (Arc<RsEngine>, watch::Receiver<EngineStatus>) {
        let OpenedLog {
            member_id,
            mut core,
            applied_index,
            heartbeat_ms,
            election_tick,
            members,
        } = log;
        let RsStart {
            initial_peers,
            shared,
            db,
            telemetry,
            transport,
            compaction_pace,
            clock,
        } = start;
        // The membership the log was opened with ([`starting_membership`]): the loaded one, or a
        // new cluster's members on its first start.
        shared
            .state
            .write()
            .expect("state lock poisoned")
            .membership = members.clone();
        if members.is_empty() {
            transport.set_peers(initial_peers.into_iter().collect());
        } else {
            transport.set_peers(peers_of(&members, member_id));
        }
        let links = transport.clone();
        core.watch_transport(Box::new(move |to| links.waiting_bytes(to)));
        let (status, watched) = watch::channel(EngineStatus {
            members: Arc::new(members.clone()),
            applied_index,
            ..EngineStatus::default()
        });
        let (fatal, _) = watch::channel(None);
        let heartbeats = watch::Sender::new(HeartbeatSeen::default());
        let waiters = Waiters::default();
        state_machine::clear_files(&db);
        let machine = RsMachine {
            member_id,
            shared,
            db: db.clone(),
            transport: transport.clone(),
            waiters: waiters.clone(),
            status,
            fatal: fatal.clone(),
            telemetry: telemetry.clone(),
            core: CoreStatus::default(),
            members,
            append_times: AppendTimes::default(),
            clock,
            heartbeats: heartbeats.clone(),
        };
        let reads = ReadBatcher::new((election_tick / 2).max(1), election_tick * 2);
        let driver = Driver::start(core, machine, Duration::from_millis(heartbeat_ms), reads);
        let inputs = driver.inputs();
        let compactor = Worker::compactor(db.clone(), compaction_pace);
        let checkpointer = Worker::checkpointer(db.clone(), inputs.clone(), fatal.clone());
        let db = Arc::downgrade(&db);
        (
            Arc::new(RsEngine {
                member_id,
                inputs,
                driver: Mutex::new(Some(driver)),
                waiters,
                fatal,
                checkpointer: Mutex::new(Some(checkpointer)),
                compactor: Mutex::new(Some(compactor)),
                telemetry,
                heartbeats,
                db,
                transport,
                receiving: Arc::default(),
            }),
            watched,
        )
    }

    /// Proposes one entry of stamped commands; the future completes once this member has
    /// applied it (with its replies), or with why not.
    pub(super) fn submit(&self, proposal: Proposal) -> BoxFuture<Result<Forwarded, ReplicaError>> {
        let data = storage::encode(&proposal);
        self.propose(false, |landed| Input::Propose(data, landed))
    }

    /// Hands the Raft thread a proposal (made by `input` with the callback that registers it);
    /// completes once this member applied its entry, or with why not: "no leader" if Raft
    /// dropped it or another term's entry took its index, "stopped" if the thread is gone.
    fn propose(
        &self,
        conf_change: bool,
        input: impl FnOnce(Reply<Result<Proposed, CoreError>>) -> Input<StdFs>,
    ) -> BoxFuture<Result<Forwarded, ReplicaError>> {
        let (reply, answered) = oneshot::channel();
        let waiters = self.waiters.clone();
        let telemetry = self.telemetry.clone();
        let landed: Reply<Result<Proposed, CoreError>> = Box::new(move |proposed| match proposed {
            Ok(Proposed { index, term }) => {
                let mut waiters = waiters.lock().expect("waiters lock poisoned");
                waiters.insert(index, term, conf_change, reply);
            }
            Err(e) => {
                // Not the leader (any more), or a transfer is under way.
                tracing::debug!("proposal dropped: {e}");
                telemetry.proposal_failed();
                let _ = reply.send(Err(ReplicaError::NoLeader));
            }
        });
        let sent = self.inputs.send(input(landed)).is_ok();
        let telemetry = self.telemetry.clone();
        Box::pin(async move {
            if !sent {
                return Err(ReplicaError::Stopped);
            }
            let _pending = telemetry.proposing();
            match tokio::time::timeout(PROPOSAL_WAIT_MAX, answered).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(ReplicaError::Stopped),
                Err(_) => {
                    telemetry.proposal_failed();
                    Err(ReplicaError::NoLeader)
                }
            }
        })
    }

    /// Proposes a membership change (this member must lead); completes once it is applied here.
    pub(super) fn change_members(
        &self,
        change: &MemberChange,
        learner_now: bool,
    ) -> BoxFuture<Result<(), ReplicaError>> {
        let (kind, id, url) = match change {
            MemberChange::Add {
                id,
                peer_url,
                learner,
            } => {
                let kind = if *learner {
                    eraftpb::ConfChangeType::AddLearnerNode
                } else {
                    eraftpb::ConfChangeType::AddNode
                };
                (kind, *id, Some(peer_url.clone()))
            }
            MemberChange::Remove { id } => (eraftpb::ConfChangeType::RemoveNode, *id, None),
            MemberChange::Promote { id } => (eraftpb::ConfChangeType::AddNode, *id, None),
            // The same role again (a no-op for Raft) with the new URL in the context.
            MemberChange::Update { id, peer_url } => {
                let kind = if learner_now {
                    eraftpb::ConfChangeType::AddLearnerNode
                } else {
                    eraftpb::ConfChangeType::AddNode
                };
                (kind, *id, Some(peer_url.clone()))
            }
        };
        let mut single = eraftpb::ConfChangeSingle::default();
        single.set_change_type(kind);
        single.node_id = id;
        let mut cc = eraftpb::ConfChangeV2::default();
        cc.mut_changes().push(single);
        if let Some(url) = url {
            cc.context = storage::encode(&MemberUrl { id, peer_url: url }).into();
        }
        let proposed = self.propose(true, |landed| Input::ProposeConfChange(cc, landed));
        Box::pin(async move { proposed.await.map(|_| ()) })
    }

    /// What this follower has stepped of its leader's heartbeats ([`HeartbeatSeen`]).
    pub(super) fn heartbeats(&self) -> watch::Receiver<HeartbeatSeen> {
        self.heartbeats.subscribe()
    }

    /// A read index from a ReadIndex round that began after this call (this member must lead).
    /// With it, what proves the round to a follower ([`Confirmed::proof`]).
    pub(super) async fn read_index(&self) -> Result<Confirmed, ReplicaError> {
        let (answer, answered) = oneshot::channel();
        let waiter: ReadWaiter = Box::new(move |index| {
            let _ = answer.send(index);
        });
        self.inputs
            .send(Input::Read(waiter))
            .map_err(|_| ReplicaError::Stopped)?;
        match answered.await {
            Ok(Ok(confirmed)) => Ok(confirmed),
            Ok(Err(ReadError::Timeout)) => Err(ReplicaError::NoLeader),
            Ok(Err(_)) | Err(_) => Err(ReplicaError::Stopped),
        }
    }

    /// Whether learner `id` may be promoted, by etcd's rule: its match index is at least 90% of
    /// this leader's own (a learner the leader holds no progress for passes, as in etcd).
    /// `Err(NoLeader)` when this member does not lead.
    pub(super) async fn learner_in_sync(&self, id: u64, me: u64) -> Result<bool, ReplicaError> {
        let (answer, answered) = oneshot::channel();
        let asked = self.inputs.send(Input::With(Box::new(move |core| {
            let _ = answer.send((core.matched(me), core.matched(id)));
        })));
        if asked.is_err() {
            return Err(ReplicaError::Stopped);
        }
        match answered.await.map_err(|_| ReplicaError::Stopped)? {
            (None, _) => Err(ReplicaError::NoLeader),
            (Some(leader), learner) => Ok(crate::steps::learner_in_sync(leader, learner)),
        }
    }

    /// For each of `peers`: how many ticks ago it was last heard from, and, on a leader, the
    /// last index it is known to hold (`None`: never heard from / not known).
    pub(super) async fn heard_ago_and_matched(
        &self,
        peers: Vec<u64>,
    ) -> Result<Vec<(u64, Option<u64>, Option<u64>)>, ReplicaError> {
        let (answer, answered) = oneshot::channel();
        let asked = self.inputs.send(Input::With(Box::new(move |core| {
            let heard = peers
                .into_iter()
                .map(|p| (p, core.heard_ago_ticks(p), core.matched(p)))
                .collect();
            let _ = answer.send(heard);
        })));
        if asked.is_err() {
            return Err(ReplicaError::Stopped);
        }
        answered.await.map_err(|_| ReplicaError::Stopped)
    }

    /// For how many ticks each of `peers` has been heard from without a gap (`None`: not
    /// within the last election timeout); see `Core::heard_for_ticks`.
    pub(super) async fn heard_for_ticks(
        &self,
        peers: Vec<u64>,
    ) -> Result<Vec<(u64, Option<u64>)>, ReplicaError> {
        let (answer, answered) = oneshot::channel();
        let asked = self.inputs.send(Input::With(Box::new(move |core| {
            let heard = peers
                .into_iter()
                .map(|p| (p, core.heard_for_ticks(p)))
                .collect();
            let _ = answer.send(heard);
        })));
        if asked.is_err() {
            return Err(ReplicaError::Stopped);
        }
        answered.await.map_err(|_| ReplicaError::Stopped)
    }

    pub(super) fn transfer_leader(&self, to: u64) {
        let _ = self.inputs.send(Input::TransferLeader(to));
    }

    /// A peer's message (bytes as the transport carried them). A snapshot that names a file
    /// is stepped only once the file is here, fetched on a thread of its own from the member
    /// that sent it; while one is being fetched, others are dropped (the leader offers its
    /// snapshot again, `Core::resume_snapshot_waits`), as is one whose file did not arrive whole.
    pub(crate) fn deliver(&self, bytes: &[u8]) -> Result<(), String> {
        let message = decode_peer_message(bytes, self.member_id).map_err(|e| e.to_string())?;
        if message.get_msg_type() == eraftpb::MessageType::MsgSnapshot
            && let Some(reference) =
                state_machine::SnapshotRef::from_data(&message.get_snapshot().data)
        {
            self.receive_snapshot(reference, message);
            return Ok(());
        }
        self.inputs
            .send(Input::Step(message))
            .map_err(|_| "the member is stopping".to_owned())
    }

    fn receive_snapshot(&self, reference: state_machine::SnapshotRef, message: eraftpb::Message) {
        use std::sync::atomic::Ordering;
        if self.receiving.swap(true, Ordering::AcqRel) {
            tracing::debug!(
                index = reference.index,
                "a snapshot is being received: dropped another"
            );
            return;
        }
        let (transport, inputs) = (self.transport.clone(), self.inputs.clone());
        let (db, receiving) = (self.db.clone(), self.receiving.clone());
        let receiver = move || {
            let Some(db) = db.upgrade() else {
                receiving.store(false, Ordering::Release);
                return; // stopped
            };
            let (from, started) = (message.from, std::time::Instant::now());
            tracing::info!(from = %format!("{from:x}"), index = reference.index, bytes = reference.bytes, "receiving a snapshot's file");
            let received = state_machine::receive(&db, reference, |into| {
                transport.fetch_snapshot(from, reference.to_data(), into)
            });
            match received {
                Ok(()) => {
                    tracing::info!(index = reference.index, took = ?started.elapsed(), "received a snapshot's file");
                    let _ = inputs.send(Input::Step(message));
                }
                Err(e) => tracing::warn!(
                    index = reference.index,
                    "receiving a snapshot's file (the leader offers it again): {e}"
                ),
            }
            receiving.store(false, Ordering::Release);
        };
        let spawned = std::thread::Builder::new()
            .name("leasehold-snapshot-in".into())
            .spawn(receiver);
        if let Err(e) = spawned {
            tracing::warn!("starting to receive a snapshot: {e}");
            self.receiving.store(false, Ordering::Release);
        }
    }

    /// The path of the snapshot's file `request` names, if this member offers it.
    pub(crate) fn outgoing_snapshot(&self, request: &[u8]) -> Result<std::path::PathBuf, String> {
        let db = self.db.upgrade().ok_or("the member is stopping")?;
        state_machine::outgoing_file(&db, request)
    }

    /// The transport heard from peer `id` without a Raft message (see `Input::Heard`).
    pub(crate) fn heard(&self, id: u64) {
        let _ = self.inputs.send(Input::Heard(id));
    }

    /// A message to `id` could not be delivered.
    pub(crate) fn unreachable(&self, id: u64) {
        let _ = self.inputs.send(Input::Unreachable(id));
    }

    /// Completes with why the core stopped on its own.
    pub(super) async fn failed(&self) -> Fatal {
        let mut fatal = self.fatal.subscribe();
        let stopped = fatal
            .wait_for(Option::is_some)
            .await
            .map(|f| f.clone().unwrap_or(Fatal::Exited));
        match stopped {
            Ok(fatal) => fatal,
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops the Raft thread, the checkpointer, which writes what was applied last, and the
    /// compactor (a compaction it leaves unfinished resumes at the next start).
    /// Blocking: call it off the runtime.
    pub(super) fn stop(&self) {
        let driver = self.driver.lock().expect("driver lock poisoned").take();
        drop(driver);
        for worker in [&self.checkpointer, &self.compactor] {
            let worker = worker.lock().expect("worker lock poisoned").take();
            if let Some(mut w) = worker {
                w.bell.ring(|r| r.stop = true);
                if let Some(thread) = w.thread.take() {
                    let _ = thread.join();
                }
            }
        }
        let waiters = self.waiters.lock().expect("waiters lock poisoned").drain();
        for reply in waiters {
            let _ = reply.send(Err(ReplicaError::Stopped));
        }
    }
}

impl Worker {
    fn checkpointer(
        db: Arc<Db>,
        inputs: std::sync::mpsc::Sender<Input<StdFs>>,
        fatal: watch::Sender<Option<Fatal>>,
    ) -> Worker {
        let bell = db.checkpoint_bell().clone();
        let thread = std::thread::Builder::new()
            .name("leasehold-checkpoint".into())
            .spawn(move || run_checkpoints(&db, &inputs, &fatal))
            .expect("spawn the checkpoint thread");
        Worker {
            bell,
            thread: Some(thread),
        }
    }

    fn compactor(db: Arc<Db>, pace: CompactionPace) -> Worker {
        let bell = db.compaction_bell().clone();
        let thread = std::thread::Builder::new()
            .name("leasehold-compact".into())
            .spawn(move || run_compactions(&db, pace))
            .expect("spawn the compaction thread");
        Worker {
            bell,
            thread: Some(thread),
        }
    }
}

impl Drop for Worker {
    /// An engine dropped without [`RsEngine::stop`] (a start that failed after it, say) still
    /// ends its threads: the checkpointer writes what was staged and lets go of the file.
    fn drop(&mut self) {
        self.bell.ring(|r| r.stop = true);
    }
}

/// Sleeps until `bell` rings; then, after [`CHECKPOINT_EVERY`] (the window in which staged rows
/// gather into one commit), writes the staged state durably, lets the core compact its log
/// behind it, and offers a snapshot when a follower needs one. Once more when stopped.
fn run_checkpoints(
    db: &Db,
    inputs: &std::sync::mpsc::Sender<Input<StdFs>>,
    fatal: &watch::Sender<Option<Fatal>>,
) {
    let bell = db.checkpoint_bell();
    loop {
        let rung = bell.wait();
        let stopping = rung.stop || bell.stopped_within(CHECKPOINT_EVERY);
        let durable = match db.checkpoint() {
            Ok(durable) => durable,
            Err(e) => {
                tracing::error!("writing the state machine's checkpoint: {e}");
                fatal.send_replace(Some(Fatal::Storage(Arc::new(e))));
                return;
            }
        };
        if stopping {
            return;
        }
        if db.out_of_space() {
            // The stage waits for room: try again after the next window. (A write that fails
            // for want of space rings too, when it puts its rows back.)
            bell.ring(|r| r.staged = true);
        }
        if durable.is_none() && !rung.snapshot {
            continue;
        }
        // The core compacts its log behind the checkpoint and says whether a follower still
        // wants a snapshot (one built since may have served it); the answer is awaited, so the
        // snapshot is built on what the core says now.
        let (answer, wanted) = std::sync::mpsc::channel();
        let _ = inputs.send(Input::With(Box::new(move |core| {
            if let Some(applied) = durable
                && let Err(e) = core.compact_log(applied.index)
            {
                tracing::warn!("compacting the raft log: {e}");
            }
            let _ = answer.send(core.snapshot_wanted().is_some());
        })));
        if wanted.recv().unwrap_or(false) {
            match snapshot_for_followers(db) {
                Ok(snapshot) => {
                    let _ = inputs.send(Input::Compact(snapshot));
                }
                Err(e) => tracing::warn!("building a snapshot for a follower: {e}"),
            }
        }
    }
}

/// Sleeps until `bell` rings for a compaction's rows; then removes them from the file, at most
/// `pace.batch_limit` per durable transaction and `pace.pause` apart (etcd's scheduled
/// compaction), until none is left or the stop rings. A write that fails (the disk is full)
/// is tried again a pause later, at least a second.
fn run_compactions(db: &Db, pace: CompactionPace) {
    const RETRY_MIN: Duration = Duration::from_secs(1);
    let bell = db.compaction_bell();
    let mut failing = false;
    loop {
        if bell.wait().stop {
            return;
        }
        loop {
            let pause = match db.remove_compacted(pace.batch_limit.max(1)) {
                Ok(false) => break,
                Ok(true) => {
                    failing = false;
                    pace.pause
                }
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!("removing a compaction's rows (tried again later): {e}");
                    }
                    pace.pause.max(RETRY_MIN)
                }
            };
            if bell.stopped_within(pause) {
                return;
            }
        }
    }
}

/// A conf change's context: the member it adds or moves, and where it is reached.
#[derive(serde::Serialize, serde::Deserialize)]
struct MemberUrl {
    id: u64,
    peer_url: String,
}

/// The state machine's file as a Raft snapshot, for a follower the log no longer reaches: the
/// snapshot names a file written for it (`state_machine/transfer.rs`).
fn snapshot_for_followers(db: &Db) -> Result<eraftpb::Snapshot, crate::StorageError> {
    let (meta, reference) = state_machine::write_outgoing(db)?;
    let cs = conf_state_of(&meta.membership);
    let conf = eraftpb::ConfState {
        voters: cs.voters,
        learners: cs.learners,
        ..Default::default()
    };
    let mut snapshot = eraftpb::Snapshot {
        data: reference.to_data().into(),
        ..Default::default()
    };
    let m = snapshot.mut_metadata();
    m.index = reference.index;
    m.term = reference.term;
    m.set_conf_state(conf);
    tracing::info!(
        index = reference.index,
        bytes = reference.bytes,
        "offering a snapshot to a follower"
    );
    Ok(snapshot)
}

/// The member around the core, on the Raft thread.
struct RsMachine {
    member_id: u64,
    shared: Shared,
    db: Arc<Db>,
    transport: Arc<dyn RaftTransport>,
    waiters: Waiters,
    status: watch::Sender<EngineStatus>,
    fatal: watch::Sender<Option<Fatal>>,
    telemetry: Arc<Telemetry>,
    core: CoreStatus,
    members: BTreeMap<u64, EngineMember>,
    /// When the entries not yet applied were appended here, to date the lease time they carry.
    append_times: AppendTimes,
    clock: Arc<dyn Clock>,
    /// What this follower has stepped of its leader's heartbeats (a watch of its own: it moves
    /// at every heartbeat, which the status's many watchers need not wake for).
    heartbeats: watch::Sender<HeartbeatSeen>,
}

impl RsMachine {
    fn publish(&self, applied_index: Option<u64>) {
        let core = self.core;
        let members = &self.members;
        self.status.send_if_modified(|s| {
            let next = EngineStatus {
                term: core.term,
                leader: (core.leader != 0).then_some(core.leader),
                is_leader: core.is_leader,
                last_log_index: core.last_index.max(s.last_log_index),
                applied_index: applied_index.unwrap_or(s.applied_index),
                members: if *s.members == *members {
                    s.members.clone()
                } else {
                    Arc::new(members.clone())
                },
                stopped: s.stopped,
            };
            let changed = *s != next;
            *s = next;
            changed
        });
    }

    fn stop(&self, fatal: Fatal) {
        tracing::error!("the raft core stopped: {fatal}");
        self.fatal.send_replace(Some(fatal));
        self.status.send_modify(|s| s.stopped = true);
    }
}

impl Host for RsMachine {
    fn send(&mut self, messages: Vec<eraftpb::Message>) {
        for message in messages {
            self.transport.send(message.to, encode_message(&message));
        }
    }

    fn install_snapshot(&mut self, snapshot: &eraftpb::Snapshot) -> Result<(), HostError> {
        let installed = match state_machine::SnapshotRef::from_data(&snapshot.data) {
            Some(reference) => state_machine::install_file(&self.shared, &self.db, reference),
            None => {
                state_machine::install_snapshot_bytes(&self.shared, &self.db, &snapshot.data, None)
            }
        };
        installed.map_err(|e| HostError(e.to_string()))?;
        self.members = self
            .shared
            .state
            .read()
            .expect("state lock poisoned")
            .membership
            .clone();
        self.transport
            .set_peers(peers_of(&self.members, self.member_id));
        let index = snapshot.get_metadata().index;
        self.publish(Some(index));
        // Proposals whose entries the snapshot covered are never applied here one by one.
        let lost = self
            .waiters
            .lock()
            .expect("waiters lock poisoned")
            .skipped_to(index);
        for reply in lost {
            let _ = reply.send(Err(ReplicaError::NoLeader));
        }
        Ok(())
    }
}

impl Machine for RsMachine {
    fn leader_heartbeat(&mut self, seen: HeartbeatSeen) {
        self.heartbeats.send_replace(seen);
    }

    fn apply(&mut self, committed: Vec<Committed>) {
        let mut ids = Vec::with_capacity(committed.len());
        let mut entries = Vec::with_capacity(committed.len());
        for c in committed {
            let entry = c.entry();
            let position = LogPosition {
                term: entry.term,
                index: entry.index,
            };
            let payload = match &c {
                Committed::Normal(entry) if entry.data.is_empty() => Applying::Blank,
                Committed::Normal(entry) => {
                    match storage::decode::<Proposal>("a log entry", &entry.data) {
                        Ok(proposal) => Applying::Normal(proposal),
                        Err(e) => {
                            // Applying past an entry that cannot be read would fork this
                            // member's state from the others': stop instead.
                            self.stop(Fatal::Storage(Arc::new(e)));
                            return;
                        }
                    }
                }
                Committed::ConfChange {
                    change, conf_state, ..
                } => {
                    self.members = members_with(&self.members, conf_state);
                    if !change.context.is_empty() {
                        match storage::decode::<MemberUrl>("a conf change", &change.context) {
                            Ok(MemberUrl { id, peer_url }) => {
                                if let Some(m) = self.members.get_mut(&id) {
                                    m.peer_url = peer_url;
                                }
                            }
                            Err(e) => tracing::warn!("a conf change's context: {e}"),
                        }
                    }
                    self.transport
                        .set_peers(peers_of(&self.members, self.member_id));
                    if !self.members.contains_key(&self.member_id) && !self.members.is_empty() {
                        tracing::warn!("this member was removed from the cluster");
                    }
                    Applying::Membership(self.members.clone())
                }
            };
            let is_conf_change = matches!(c, Committed::ConfChange { .. });
            ids.push((entry.index, entry.term, is_conf_change));
            entries.push((position, payload));
        }
        let append_times = &mut self.append_times;
        let clock = &self.clock;
        let applied = state_machine::apply_entries(&self.shared, &self.db, entries, |index| {
            index
                .and_then(|index| append_times.appended_at(index))
                .unwrap_or_else(|| clock.now())
        });
        let replies = match applied {
            Ok(replies) => replies,
            Err(e) => {
                tracing::error!("applying committed entries: {e}");
                self.stop(Fatal::Storage(Arc::new(e)));
                return;
            }
        };
        // Published before anyone is answered: a caller that reads the members or waits to
        // apply an index next sees this apply.
        if let Some(last) = ids.last().map(|(index, ..)| *index) {
            self.telemetry.committed(last);
            self.core.applied = last;
            self.core.last_index = self.core.last_index.max(last);
            self.publish(Some(last));
        }
        {
            let mut waiters = self.waiters.lock().expect("waiters lock poisoned");
            for ((index, term, conf_change), applied) in ids.into_iter().zip(replies) {
                let mut applied = Some(applied);
                for (_, reply, outcome) in waiters.applied(index, term, conf_change) {
                    let answer = match outcome {
                        EntryOutcome::Applied => Ok(Forwarded {
                            log_index: index,
                            applied: applied.take().unwrap_or_default(),
                        }),
                        EntryOutcome::Lost => Err(ReplicaError::NoLeader),
                        EntryOutcome::ChangeInProgress => Err(ReplicaError::MembershipChange(
                            "a membership change is already in progress".into(),
                        )),
                    };
                    let _ = reply.send(answer);
                }
            }
        }
    }

    fn status(&mut self, status: CoreStatus) {
        let leader_changed = status.leader != self.core.leader;
        self.core = status;
        if leader_changed && status.leader != 0 {
            self.telemetry.leader_changed();
        }
        self.publish(None);
    }

    fn failed(&mut self, error: CoreError) {
        self.stop(Fatal::Core(error.to_string()));
    }

    fn snapshot_wanted(&mut self) {
        self.db.checkpoint_bell().ring(|r| r.snapshot = true);
    }

    fn log_room(&mut self, has_room: bool) {
        let was_without = self
            .shared
            .log_without_room
            .swap(!has_room, std::sync::atomic::Ordering::SeqCst);
        if !has_room && !was_without {
            tracing::error!(
                "the disk is full: the raft log has no room for its next segment; writes that \
                 add data get NOSPACE and reads go on until there is room"
            );
        } else if has_room && was_without {
            tracing::warn!("the raft log has room again: writes are taken again");
        }
    }

    fn log_bytes_written(&mut self, writes: &[leasehold_wal::Written]) {
        for write in writes {
            self.telemetry.wal_written(write.bytes, write.write);
        }
    }

    fn log_written(&mut self, took: Duration, appended: Option<(u64, u64)>) {
        self.telemetry.log_commit.observe(took);
        if let Some((first, last)) = appended {
            let now = self.clock.now();
            self.append_times.appended(first, last, now);
        }
    }
}

/// The members after a conf change: Raft's voters and learners, with the URLs known so far.
fn members_with(
    known: &BTreeMap<u64, EngineMember>,
    conf_state: &ConfState,
) -> BTreeMap<u64, EngineMember> {
    let url = |id: &u64| {
        known
            .get(id)
            .map(|m| m.peer_url.clone())
            .unwrap_or_default()
    };
    let voters = conf_state.voters.iter().map(|id| (*id, false));
    let learners = conf_state.learners.iter().map(|id| (*id, true));
    voters
        .chain(learners)
        .map(|(id, learner)| {
            (
                id,
                EngineMember {
                    peer_url: url(&id),
                    learner,
                },
            )
        })
        .collect()
}

fn conf_state_of(members: &BTreeMap<u64, EngineMember>) -> ConfState {
    ConfState {
        voters: members
            .iter()
            .filter(|(_, m)| !m.learner)
            .map(|(id, _)| *id)
            .collect(),
        learners: members
            .iter()
            .filter(|(_, m)| m.learner)
            .map(|(id, _)| *id)
            .collect(),
        ..ConfState::default()
    }
}

fn peers_of(members: &BTreeMap<u64, EngineMember>, me: u64) -> Vec<(u64, String)> {
    members
        .iter()
        .filter(|(id, _)| **id != me)
        .map(|(id, m)| (*id, m.peer_url.clone()))
        .collect()
}
