//! One member of the replicated store: openraft wired to the redb log and state machine. The
//! server talks to this and nothing below it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_lease::{LeaseClock, LeaseTable};
use leasehold_mvcc::Store;
use openraft::error::{ClientWriteError, RaftError};
use openraft::network::RaftNetworkFactory;
use openraft::{BasicNode, Config, Raft, SnapshotPolicy};
use tokio::sync::{mpsc, oneshot};

use crate::command::{Applied, Command, Proposal};
use crate::log_store::LogStore;
use crate::network::NoPeers;
use crate::state_machine::{self, Shared, StateMachine};
use crate::{TypeConfig, storage};

/// How to start a member.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    pub member_id: u64,
    pub peer_url: String,
    /// The other members of the initial cluster (id → peer URL), to bootstrap a new cluster
    /// with; empty for a one-member cluster. Ignored once the data dir holds a cluster.
    pub initial_peers: BTreeMap<u64, String>,
    /// Whether a fresh data dir bootstraps a new cluster (etcd's `--initial-cluster-state new`)
    /// or waits to be added to a running one (`existing`: the leader sends it the state).
    pub bootstrap: bool,
    pub data_dir: PathBuf,
    pub heartbeat_interval_ms: u64,
    pub election_timeout_ms: u64,
    /// Raft entries between state-machine snapshots (after which the log is purged).
    pub snapshot_log_entries_max: u64,
}

/// Most commands in one log entry (a renewal is about 15 bytes of it, a 256-byte put about 280).
const BATCH_LEN_MAX: usize = 4096;
/// Soft bound on one log entry's size: a batch closes once it holds this much.
const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Proposals in flight at once. One: openraft 0.9 appends each proposal to the log and waits for
/// its fsync before it takes the next, so a second proposal in flight does not overlap the disk;
/// it only splits the writes that arrived meanwhile into two entries and two fsyncs. With one,
/// everything that arrives while an entry is being synced and applied forms the next entry.
/// Measured (64 clients, single node, release): 1 proposer 24,550 puts/s, 2: 21,074, 4: 13,260,
/// 8: 8,761 (docs/bench.md).
const PROPOSERS: usize = 1;
/// Writes waiting to be batched before callers wait for room.
const QUEUE_LEN_MAX: usize = 16 * 1024;

/// A client write waiting for its batch.
struct Pending {
    command: Command,
    reply: oneshot::Sender<Result<Applied, ReplicaError>>,
}

/// Why a request could not be served. `NoLeader` is transient (clients retry it); `Stopped` and
/// `Storage` mean this member cannot serve any more.
#[derive(Clone, Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ReplicaError {
    #[error("no leader")]
    NoLeader,
    #[error("raft stopped")]
    Stopped,
    #[error("storage: {0}")]
    Storage(String),
    #[error(transparent)]
    Membership(#[from] MembershipError),
}

/// Why a membership change was refused (etcd's messages).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize,
)]
pub enum MembershipError {
    #[error("etcdserver: member not found")]
    NotFound,
    #[error("etcdserver: member ID already exist")]
    IdExists,
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlExists,
    #[error("etcdserver: can only promote a learner member")]
    NotLearner,
}

/// A membership change: etcd's MemberAdd, MemberRemove and MemberPromote.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum MemberChange {
    Add {
        id: u64,
        peer_url: String,
        learner: bool,
    },
    Remove {
        id: u64,
    },
    Promote {
        id: u64,
    },
}

/// One member as the current membership config has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub id: u64,
    pub peer_url: String,
    pub learner: bool,
}

/// A boxed future, for the object-safe [`Forwarder`].
pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// What a follower's forwarded batch came back with: one result per command, and the log index
/// it was committed at (the follower answers once it has applied that far itself).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Forwarded {
    pub log_index: u64,
    pub applied: Vec<Applied>,
}

/// The leader's answer to a read-index request.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct ReadIndex {
    /// Apply this far, then read.
    pub index: u64,
    /// The leader's lease time when it confirmed its leadership (`None` until it has promoted
    /// itself).
    pub lease_now_ms: Option<u64>,
}

/// How a follower reaches the leader for what only the leader can do: commit writes and give a
/// read index. The peer transport implements it; a one-member cluster never forwards.
pub trait Forwarder: Send + Sync + 'static {
    /// Has the leader (`leader`, at peer URL `addr`) commit `proposal`.
    fn forward(
        &self,
        leader: u64,
        addr: String,
        proposal: Proposal,
    ) -> BoxFuture<Result<Forwarded, ReplicaError>>;
    /// Asks the leader for a read index: a log index that covers every write acknowledged
    /// before the call, and the leader's lease time at that point.
    fn read_index(&self, leader: u64, addr: String) -> BoxFuture<Result<ReadIndex, ReplicaError>>;
    /// Has the leader make a membership change.
    fn change_members(
        &self,
        leader: u64,
        addr: String,
        change: MemberChange,
    ) -> BoxFuture<Result<(), ReplicaError>>;
}

/// The forwarder of a member without peers.
pub struct NoForwarding;

impl Forwarder for NoForwarding {
    fn forward(
        &self,
        _: u64,
        _: String,
        _: Proposal,
    ) -> BoxFuture<Result<Forwarded, ReplicaError>> {
        Box::pin(async { Err(ReplicaError::NoLeader) })
    }

    fn read_index(&self, _: u64, _: String) -> BoxFuture<Result<ReadIndex, ReplicaError>> {
        Box::pin(async { Err(ReplicaError::NoLeader) })
    }

    fn change_members(
        &self,
        _: u64,
        _: String,
        _: MemberChange,
    ) -> BoxFuture<Result<(), ReplicaError>> {
        Box::pin(async { Err(ReplicaError::NoLeader) })
    }
}

/// How long lease grants and renewals wait for a newly elected leader to start timing leases.
const PROMOTION_WAIT_MAX: Duration = Duration::from_secs(2);

/// How long a follower waits to apply what the leader committed for it.
const APPLY_WAIT_MAX: Duration = Duration::from_secs(10);

/// A snapshot of Raft's progress, for headers and Status.
#[derive(Clone, Copy, Debug, Default)]
pub struct RaftStatus {
    pub term: u64,
    pub leader: Option<u64>,
    pub last_log_index: u64,
    pub applied_index: u64,
}

pub struct Replica {
    raft: Raft<TypeConfig>,
    /// This member's mapping from real time to lease time; `Some` while it leads (and so times
    /// leases). A single member leads from start-up on.
    lease_clock: SharedClock,
    election_timeout: Duration,
    proposals: mpsc::Sender<Pending>,
    /// Fires once openraft's tasks have let go of the database and the file is closed.
    db_closed: tokio::sync::watch::Receiver<()>,
    shared: Shared,
    member_id: u64,
    db_path: PathBuf,
    forwarder: Arc<dyn Forwarder>,
}

/// Takes whatever writes are queued (at least one, at most a batch), proposes them as one log
/// entry, and answers each caller with its own result. [`PROPOSERS`] of these run (one), so the
/// next batch forms while the previous one is being made durable. On a follower the batch goes
/// to the leader, and the callers are answered once this member has applied it too.
async fn propose_batches(
    raft: Raft<TypeConfig>,
    member_id: u64,
    clock: SharedClock,
    forwarder: Arc<dyn Forwarder>,
    queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Pending>>>,
) {
    loop {
        let batch = {
            let mut queue = queue.lock().await;
            let Some(first) = queue.recv().await else {
                return;
            };
            let mut bytes = first.command.approx_bytes();
            let mut batch = vec![first];
            while batch.len() < BATCH_LEN_MAX && bytes < BATCH_BYTES_MAX {
                match queue.try_recv() {
                    Ok(next) => {
                        bytes += next.command.approx_bytes();
                        batch.push(next);
                    }
                    Err(_) => break,
                }
            }
            batch
        };
        let (commands, replies): (Vec<Command>, Vec<_>) =
            batch.into_iter().map(|p| (p.command, p.reply)).unzip();
        let count = commands.len();
        let proposal = Proposal { commands };
        let result = match leader_elsewhere(&raft, member_id) {
            Some((leader, addr)) => forward(&raft, &*forwarder, leader, addr, proposal).await,
            None => commit(&raft, &clock, proposal).await.map(|f| f.applied),
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

/// The leader and its peer URL, if another member leads.
fn leader_elsewhere(raft: &Raft<TypeConfig>, member_id: u64) -> Option<(u64, String)> {
    let m = raft.metrics().borrow().clone();
    let leader = m.current_leader.filter(|l| *l != member_id)?;
    let addr = m
        .membership_config
        .nodes()
        .find(|(id, _)| **id == leader)?
        .1
        .addr
        .clone();
    Some((leader, addr))
}

/// The lease clock a leader times leases with, shared by the replica and its proposers.
#[derive(Clone, Default)]
struct SharedClock(Arc<std::sync::Mutex<Option<LeaseClock>>>);

impl SharedClock {
    fn get(&self) -> Option<LeaseClock> {
        *self.0.lock().expect("lease clock lock poisoned")
    }

    fn set(&self, clock: Option<LeaseClock>) {
        *self.0.lock().expect("lease clock lock poisoned") = clock;
    }
}

/// Gives every grant and renewal in `proposal` the leader's lease time, rounded up so that a
/// deadline never falls before its TTL has run (`LeaseClock::now_ms_ceil`). Commands are stamped
/// here, by the member that commits them, so a follower's forwarded grants and renewals count
/// from the leader's clock too.
fn stamp_lease_times(clock: &SharedClock, proposal: &mut Proposal) -> Result<(), ReplicaError> {
    let mut now = None;
    for command in &mut proposal.commands {
        if let Command::LeaseGrant { now_ms, .. } | Command::LeaseRenew { now_ms, .. } = command {
            let stamp = match now {
                Some(stamp) => stamp,
                None => {
                    let clock = clock.get().ok_or(ReplicaError::NoLeader)?;
                    let stamp = clock.now_ms_ceil(Instant::now());
                    now = Some(stamp);
                    stamp
                }
            };
            *now_ms = stamp;
        }
    }
    Ok(())
}

/// Commits `proposal` through this member's Raft (which must lead).
async fn commit(
    raft: &Raft<TypeConfig>,
    clock: &SharedClock,
    mut proposal: Proposal,
) -> Result<Forwarded, ReplicaError> {
    // A leader times leases only once it has promoted itself (milliseconds after its
    // election): grants and renewals that arrive before then wait for it, bounded.
    let stamps = proposal
        .commands
        .iter()
        .any(|c| matches!(c, Command::LeaseGrant { .. } | Command::LeaseRenew { .. }));
    if stamps && clock.get().is_none() {
        let give_up = Instant::now() + PROMOTION_WAIT_MAX;
        while clock.get().is_none() && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    stamp_lease_times(clock, &mut proposal)?;
    match raft.client_write(proposal).await {
        Ok(resp) => Ok(Forwarded {
            log_index: resp.log_id.index,
            applied: resp.data,
        }),
        Err(e) => Err(match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => ReplicaError::NoLeader,
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                ReplicaError::Storage(e.to_string())
            }
            RaftError::Fatal(_) => ReplicaError::Stopped,
        }),
    }
}

/// Has the leader commit `proposal`, then waits until this member has applied it, so a read
/// here after the answer sees the write.
async fn forward(
    raft: &Raft<TypeConfig>,
    forwarder: &dyn Forwarder,
    leader: u64,
    addr: String,
    proposal: Proposal,
) -> Result<Vec<Applied>, ReplicaError> {
    let forwarded =
        unless_leader_changes(raft, leader, forwarder.forward(leader, addr, proposal)).await?;
    wait_applied(raft, forwarded.log_index).await?;
    Ok(forwarded.applied)
}

/// Runs a request to `leader`, but gives up with "no leader" as soon as this member learns of
/// another leader (or none): a leader that was cut off may never answer, and the client should
/// retry against the new one at once rather than after a time-out.
async fn unless_leader_changes<T>(
    raft: &Raft<TypeConfig>,
    leader: u64,
    request: impl std::future::Future<Output = Result<T, ReplicaError>>,
) -> Result<T, ReplicaError> {
    let mut metrics = raft.metrics();
    let deposed = async move {
        loop {
            if metrics.borrow_and_update().current_leader != Some(leader) {
                return;
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        result = request => result,
        () = deposed => Err(ReplicaError::NoLeader),
    }
}

async fn wait_applied(raft: &Raft<TypeConfig>, index: u64) -> Result<(), ReplicaError> {
    raft.wait(Some(APPLY_WAIT_MAX))
        .applied_index_at_least(Some(index), "apply what the leader committed")
        .await
        .map(|_| ())
        .map_err(|e| match e {
            openraft::metrics::WaitError::Timeout(..) => ReplicaError::NoLeader,
            openraft::metrics::WaitError::ShuttingDown => ReplicaError::Stopped,
        })
}

impl Replica {
    /// Opens storage, starts Raft and, on a new data dir, bootstraps a one-member cluster. Waits
    /// (bounded) until this member leads and times leases.
    pub async fn start(cfg: ReplicaConfig) -> Result<Arc<Replica>, std::io::Error> {
        Replica::start_with(cfg, NoPeers, Arc::new(NoForwarding)).await
    }

    /// Like [`Replica::start`], with a peer transport: `network` carries openraft's RPCs and
    /// `forwarder` takes follower writes and reads to the leader. A member of a cluster with
    /// peers does not wait for a leader: the others may not be up yet.
    pub async fn start_with<N: RaftNetworkFactory<TypeConfig>>(
        cfg: ReplicaConfig,
        network: N,
        forwarder: Arc<dyn Forwarder>,
    ) -> Result<Arc<Replica>, std::io::Error> {
        let db = storage::open(&cfg.data_dir)?;
        let sm = StateMachine::open(db.clone())?;
        let shared = sm.shared();
        let db_closed = db.closed();
        let log = LogStore::new(db);
        let config = Config {
            cluster_name: "leasehold".into(),
            heartbeat_interval: cfg.heartbeat_interval_ms,
            election_timeout_min: cfg.election_timeout_ms,
            election_timeout_max: cfg.election_timeout_ms * 2,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_log_entries_max),
            // Entries kept behind a snapshot for followers that lag a little; one further
            // behind gets the snapshot.
            max_in_snapshot_log_to_keep: cfg.snapshot_log_entries_max.min(1000),
            ..Default::default()
        };
        let config = Arc::new(config.validate().map_err(storage::io_err)?);
        let raft = Raft::new(cfg.member_id, config, network, log, sm)
            .await
            .map_err(storage::io_err)?;
        if cfg.bootstrap && !raft.is_initialized().await.map_err(storage::io_err)? {
            let mut members = BTreeMap::from([(cfg.member_id, BasicNode::new(&cfg.peer_url))]);
            for (id, url) in &cfg.initial_peers {
                members.insert(*id, BasicNode::new(url));
            }
            raft.initialize(members).await.map_err(storage::io_err)?;
        }
        let (proposals, queue) = mpsc::channel(QUEUE_LEN_MAX);
        let queue = Arc::new(tokio::sync::Mutex::new(queue));
        let lease_clock = SharedClock::default();
        for _ in 0..PROPOSERS {
            tokio::spawn(propose_batches(
                raft.clone(),
                cfg.member_id,
                lease_clock.clone(),
                forwarder.clone(),
                queue.clone(),
            ));
        }
        let replica = Arc::new(Replica {
            raft,
            lease_clock,
            election_timeout: Duration::from_millis(cfg.election_timeout_ms),
            proposals,
            db_closed,
            shared,
            member_id: cfg.member_id,
            db_path: cfg.data_dir.join("leasehold.redb"),
            forwarder,
        });
        tokio::spawn(follow_leadership(Arc::downgrade(&replica)));
        if cfg.bootstrap && cfg.initial_peers.is_empty() && replica.members().len() <= 1 {
            let bound = Duration::from_millis(cfg.election_timeout_ms * 20);
            let start = tokio::time::Instant::now();
            while replica.lease_clock().is_none() {
                if start.elapsed() > bound {
                    return Err(storage::io_err("no leadership within 20 election timeouts"));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Ok(replica)
    }

    /// Stops timing leases: another member leads (or nobody does).
    fn demote(&self) {
        self.lease_clock.set(None);
        tracing::info!("demoted: no longer timing leases");
    }

    /// Starts timing leases: proposes the extension of every inherited lease by the election
    /// timeout, then runs the lease clock on from the replicated value. Called once everything
    /// committed is applied.
    async fn promote(&self) -> Result<(), ReplicaError> {
        // The old leader's last lease time, plus what this member has seen pass since it
        // applied it: the election gap counts, as it does for the clients.
        let replicated_ms = state_machine::lease_time_now(&self.shared);
        let extend_ms = u64::try_from(self.election_timeout.as_millis()).unwrap_or(u64::MAX);
        // Straight to this member's Raft, never forwarded: only a leader promotes itself.
        let proposal = Proposal {
            commands: vec![Command::LeasePromote {
                now_ms: replicated_ms,
                extend_ms,
            }],
        };
        commit(&self.raft, &self.lease_clock, proposal).await?;
        let clock = LeaseClock::promote(replicated_ms, Instant::now());
        self.lease_clock.set(Some(clock));
        tracing::info!(lease_clock_ms = replicated_ms, "promoted: timing leases");
        Ok(())
    }

    /// The current lease time, if this member times leases (leads).
    pub fn lease_now_ms(&self) -> Result<u64, ReplicaError> {
        self.lease_clock()
            .map(|c| c.now_ms(Instant::now()))
            .ok_or(ReplicaError::NoLeader)
    }

    /// The leader's lease clock, if this member leads.
    pub fn lease_clock(&self) -> Option<LeaseClock> {
        self.lease_clock.get()
    }

    /// Reads the lease table; linearizable reads first confirm leadership (read index).
    pub async fn read_leases<T>(
        &self,
        linearizable: bool,
        f: impl FnOnce(&LeaseTable) -> T,
    ) -> Result<T, ReplicaError> {
        if linearizable {
            self.ensure_linearizable().await?;
        }
        Ok(state_machine::read_leases(&self.shared, f))
    }

    /// Follows the applied store revision: changes after every apply that wrote something.
    pub fn subscribe_revisions(&self) -> tokio::sync::watch::Receiver<i64> {
        self.shared.revision.subscribe()
    }

    /// Lease events applied since this member started: what etcd exports as
    /// `etcd_debugging_lease_{granted,revoked,renewed}_total` and
    /// `etcd_debugging_server_lease_expired_total`.
    pub fn lease_counters(&self) -> leasehold_lease::Counters {
        state_machine::read_leases(&self.shared, |t| t.counters())
    }

    /// Completes after the next apply that touched a lease (the earliest deadline may have moved).
    pub async fn leases_changed(&self) {
        self.shared.leases_changed.notified().await;
    }

    /// Read index: on the leader, confirms leadership and waits until everything committed is
    /// applied; on a follower, asks the leader for its read index and waits to apply that far.
    /// Returns the leader's lease time at that point, if it has one.
    async fn read_index(&self) -> Result<Option<u64>, ReplicaError> {
        if let Some((leader, addr)) = leader_elsewhere(&self.raft, self.member_id) {
            let read =
                unless_leader_changes(&self.raft, leader, self.forwarder.read_index(leader, addr))
                    .await?;
            wait_applied(&self.raft, read.index).await?;
            return Ok(read.lease_now_ms);
        }
        self.leader_read_index().await.map(|read| read.lease_now_ms)
    }

    async fn ensure_linearizable(&self) -> Result<(), ReplicaError> {
        self.read_index().await.map(|_| ())
    }

    /// Reads the store and the lease table linearizably, with the leader's lease time (what
    /// remaining TTLs and lease liveness are measured against), wherever this member is.
    pub async fn read_at_lease_time<T>(
        &self,
        f: impl FnOnce(&Store, &LeaseTable, u64) -> T,
    ) -> Result<T, ReplicaError> {
        let now_ms = self.read_index().await?.ok_or(ReplicaError::NoLeader)?;
        Ok(state_machine::read_state(&self.shared, |store, leases| {
            f(store, leases, now_ms)
        }))
    }

    /// The leader's side of [`Forwarder::read_index`].
    pub async fn leader_read_index(&self) -> Result<ReadIndex, ReplicaError> {
        match self.raft.ensure_linearizable().await {
            Ok(read) => Ok(ReadIndex {
                index: read.map_or(0, |log_id| log_id.index),
                lease_now_ms: self.lease_now_ms().ok(),
            }),
            Err(RaftError::APIError(_)) => Err(ReplicaError::NoLeader),
            Err(RaftError::Fatal(_)) => Err(ReplicaError::Stopped),
        }
    }

    /// The leader's side of [`Forwarder::forward`]: commits a follower's batch.
    pub async fn leader_commit(&self, proposal: Proposal) -> Result<Forwarded, ReplicaError> {
        commit(&self.raft, &self.lease_clock, proposal).await
    }

    /// openraft's handle, for the peer transport's server side (append, vote, snapshot).
    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    pub fn member_id(&self) -> u64 {
        self.member_id
    }

    /// Proposes a command and waits until it is applied. Concurrent writes are batched into
    /// one log entry (see [`propose_batches`]).
    pub async fn write(&self, command: Command) -> Result<Applied, ReplicaError> {
        let (reply, applied) = oneshot::channel();
        self.proposals
            .send(Pending { command, reply })
            .await
            .map_err(|_| ReplicaError::Stopped)?;
        applied.await.map_err(|_| ReplicaError::Stopped)?
    }

    /// Reads the applied state. A linearizable read first confirms leadership and waits until
    /// everything committed before it is applied (read index).
    pub async fn read<T>(
        &self,
        linearizable: bool,
        f: impl FnOnce(&Store) -> T,
    ) -> Result<T, ReplicaError> {
        if linearizable {
            self.ensure_linearizable().await?;
        }
        Ok(state_machine::read(&self.shared, f))
    }

    pub fn status(&self) -> RaftStatus {
        let m = self.raft.metrics().borrow().clone();
        RaftStatus {
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
        }
    }

    /// The current members, voters and learners, in id order.
    pub fn members(&self) -> Vec<MemberInfo> {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| MemberInfo {
                id: *id,
                peer_url: node.addr.clone(),
                learner: !voters.contains(id),
            })
            .collect()
    }

    /// Makes a membership change, on the leader (forwarded there from a follower); returns once
    /// the new configuration is committed.
    pub async fn change_members(&self, change: MemberChange) -> Result<(), ReplicaError> {
        match leader_elsewhere(&self.raft, self.member_id) {
            Some((leader, addr)) => self.forwarder.change_members(leader, addr, change).await,
            None => self.leader_change_members(change).await,
        }
    }

    /// Commits `command` through this member's own Raft, only while it leads and times leases;
    /// never forwarded. For what only a leader may propose (expiries, clock ticks): a member that
    /// lost its leadership must not have its stale view committed by the new leader.
    pub async fn propose_as_leader(&self, command: Command) -> Result<Applied, ReplicaError> {
        if leader_elsewhere(&self.raft, self.member_id).is_some() || self.lease_clock().is_none() {
            return Err(ReplicaError::NoLeader);
        }
        let proposal = Proposal {
            commands: vec![command],
        };
        let mut done = commit(&self.raft, &self.lease_clock, proposal).await?;
        done.applied.pop().ok_or(ReplicaError::Stopped)
    }

    /// The election timeout this member runs with.
    pub fn election_timeout(&self) -> Duration {
        self.election_timeout
    }

    /// Completes once this member has known no leader for `period` without a break (etcd's
    /// condition for failing streams that require a leader). Never completes after shutdown.
    pub async fn leader_lost_for(&self, period: Duration) {
        let mut metrics = self.raft.metrics();
        loop {
            while metrics.borrow_and_update().current_leader.is_some() {
                if metrics.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
            let leader_back = async {
                loop {
                    if metrics.changed().await.is_err() {
                        return std::future::pending::<()>().await;
                    }
                    if metrics.borrow_and_update().current_leader.is_some() {
                        return;
                    }
                }
            };
            if tokio::time::timeout(period, leader_back).await.is_err() {
                return;
            }
        }
    }

    /// The leader's side of [`Replica::change_members`].
    pub async fn leader_change_members(&self, change: MemberChange) -> Result<(), ReplicaError> {
        use openraft::ChangeMembers;
        let members = self.members();
        let find = |id: u64| members.iter().find(|m| m.id == id);
        let to_replica_error = |e: RaftError<u64, ClientWriteError<u64, BasicNode>>| match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => ReplicaError::NoLeader,
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                ReplicaError::Storage(e.to_string())
            }
            RaftError::Fatal(_) => ReplicaError::Stopped,
        };
        match change {
            MemberChange::Add {
                id,
                peer_url,
                learner,
            } => {
                if find(id).is_some() {
                    return Err(MembershipError::IdExists.into());
                }
                if members.iter().any(|m| m.peer_url == peer_url) {
                    return Err(MembershipError::PeerUrlExists.into());
                }
                self.raft
                    .add_learner(id, BasicNode::new(&peer_url), false)
                    .await
                    .map_err(to_replica_error)?;
                if !learner {
                    self.raft
                        .change_membership(ChangeMembers::AddVoterIds([id].into()), false)
                        .await
                        .map_err(to_replica_error)?;
                }
            }
            MemberChange::Remove { id } => {
                let member = find(id).ok_or(MembershipError::NotFound)?;
                let change = if member.learner {
                    ChangeMembers::RemoveNodes([id].into())
                } else {
                    ChangeMembers::RemoveVoters([id].into())
                };
                self.raft
                    .change_membership(change, false)
                    .await
                    .map_err(to_replica_error)?;
            }
            MemberChange::Promote { id } => {
                let member = find(id).ok_or(MembershipError::NotFound)?;
                if !member.learner {
                    return Err(MembershipError::NotLearner.into());
                }
                self.raft
                    .change_membership(ChangeMembers::AddVoterIds([id].into()), false)
                    .await
                    .map_err(to_replica_error)?;
            }
        }
        Ok(())
    }

    /// Completes when this member's Raft core stops on its own, a storage failure (a full disk,
    /// an I/O error) or a panic, with what stopped it. Never completes after a shutdown this
    /// process asked for. Such a member can serve nothing any more, reads included: whoever
    /// runs it should end the process, so that a supervisor restarts it (etcd exits too).
    pub async fn failed(&self) -> String {
        let mut metrics = self.raft.metrics();
        loop {
            let stopped = match &metrics.borrow_and_update().running_state {
                Ok(()) => None,
                Err(openraft::error::Fatal::Stopped) => return std::future::pending().await,
                Err(fatal) => Some(fatal.to_string()),
            };
            if let Some(reason) = stopped {
                return reason;
            }
            if metrics.changed().await.is_err() {
                return match &metrics.borrow().running_state {
                    Err(openraft::error::Fatal::Stopped) => std::future::pending().await,
                    Err(fatal) => fatal.to_string(),
                    Ok(()) => "the raft core exited".to_owned(),
                };
            }
        }
    }

    /// Size of the database file in bytes.
    pub fn db_size_bytes(&self) -> u64 {
        std::fs::metadata(&self.db_path).map_or(0, |m| m.len())
    }

    /// Stops Raft and waits (bounded) until the storage tasks have closed the database, so a
    /// new replica can open the same data dir at once.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("raft shutdown: {e}");
        }
        let mut closed = self.db_closed.clone();
        let wait = closed.changed();
        if tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .is_err()
        {
            tracing::warn!("storage still open 10 s after raft shutdown");
        }
    }
}

/// Promotes this member when it becomes leader (once it has applied everything committed
/// before, so it inherits the latest lease deadlines) and demotes it as soon as it is not.
async fn follow_leadership(replica: std::sync::Weak<Replica>) {
    let (mut metrics, me) = match replica.upgrade() {
        Some(r) => (r.raft.metrics(), r.member_id),
        None => return,
    };
    let mut promoted_term: Option<u64> = None;
    loop {
        let (leading, term) = {
            let m = metrics.borrow_and_update();
            (
                m.current_leader == Some(me) && m.state == openraft::ServerState::Leader,
                m.current_term,
            )
        };
        let Some(r) = replica.upgrade() else {
            return;
        };
        if leading && promoted_term != Some(term) {
            let promoted = match r.raft.ensure_linearizable().await {
                Ok(_) => r.promote().await,
                Err(_) => Err(ReplicaError::NoLeader),
            };
            match promoted {
                Ok(()) => promoted_term = Some(term),
                Err(e) => {
                    if r.raft.metrics().borrow().running_state.is_err() {
                        // The Raft core has stopped (shutdown, or a fatal storage error that
                        // `Replica::failed` reports): nothing to promote any more.
                        return;
                    }
                    tracing::warn!("promotion at term {term} failed: {e}; retrying");
                    drop(r);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        } else if !leading && (promoted_term.is_some() || r.lease_clock().is_some()) {
            r.demote();
            promoted_term = None;
        }
        drop(r);
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
