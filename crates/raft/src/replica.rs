//! One member of the replicated store: openraft wired to the redb log and state machine. The
//! server talks to this and nothing below it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_lease::{LeaseClock, LeaseTable};
use leasehold_mvcc::Store;
use openraft::error::{ClientWriteError, RaftError};
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
    pub data_dir: PathBuf,
    pub heartbeat_interval_ms: u64,
    pub election_timeout_ms: u64,
    /// Raft entries between state-machine snapshots (after which the log is purged).
    pub snapshot_log_entries_max: u64,
}

/// Most commands in one log entry.
const BATCH_LEN_MAX: usize = 512;
/// Soft bound on one log entry's size: a batch closes once it holds this much.
const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Proposals in flight at once: while one waits for its fsync, the next batch is forming.
const PROPOSERS: usize = 4;
/// Writes waiting to be batched before callers wait for room.
const QUEUE_LEN_MAX: usize = 16 * 1024;

/// A client write waiting for its batch.
struct Pending {
    command: Command,
    reply: oneshot::Sender<Result<Applied, ReplicaError>>,
}

/// Why a request could not be served. `NoLeader` is transient (clients retry it); `Stopped` and
/// `Storage` mean this member cannot serve any more.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("no leader")]
    NoLeader,
    #[error("raft stopped")]
    Stopped,
    #[error("storage: {0}")]
    Storage(String),
}

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
    lease_clock: std::sync::Mutex<Option<LeaseClock>>,
    election_timeout: Duration,
    proposals: mpsc::Sender<Pending>,
    /// Fires once openraft's tasks have let go of the database and the file is closed.
    db_closed: tokio::sync::watch::Receiver<()>,
    shared: Shared,
    member_id: u64,
    db_path: PathBuf,
}

/// Takes whatever writes are queued (at least one, at most a batch), proposes them as one log
/// entry, and answers each caller with its own result. Several of these run at once, so a batch
/// forms while the previous one is being made durable.
async fn propose_batches(
    raft: Raft<TypeConfig>,
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
        match raft.client_write(Proposal { commands }).await {
            Ok(resp) => {
                debug_assert_eq!(resp.data.len(), count, "one result per command");
                for (reply, applied) in replies.into_iter().zip(resp.data) {
                    let _ = reply.send(Ok(applied));
                }
            }
            Err(e) => {
                let err = match e {
                    RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => {
                        ReplicaError::NoLeader
                    }
                    RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                        ReplicaError::Storage(e.to_string())
                    }
                    RaftError::Fatal(_) => ReplicaError::Stopped,
                };
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
}

impl Replica {
    /// Opens storage, starts Raft and, on a new data dir, bootstraps a one-member cluster. Waits
    /// (bounded) until this member leads and has applied everything committed.
    pub async fn start(cfg: ReplicaConfig) -> Result<Arc<Replica>, std::io::Error> {
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
            max_in_snapshot_log_to_keep: 1000,
            ..Default::default()
        };
        let config = Arc::new(config.validate().map_err(storage::io_err)?);
        let raft = Raft::new(cfg.member_id, config, NoPeers, log, sm)
            .await
            .map_err(storage::io_err)?;
        if !raft.is_initialized().await.map_err(storage::io_err)? {
            let members = BTreeMap::from([(cfg.member_id, BasicNode::new(&cfg.peer_url))]);
            raft.initialize(members).await.map_err(storage::io_err)?;
        }
        let (proposals, queue) = mpsc::channel(QUEUE_LEN_MAX);
        let queue = Arc::new(tokio::sync::Mutex::new(queue));
        for _ in 0..PROPOSERS {
            tokio::spawn(propose_batches(raft.clone(), queue.clone()));
        }
        let replica = Arc::new(Replica {
            raft,
            lease_clock: std::sync::Mutex::new(None),
            election_timeout: Duration::from_millis(cfg.election_timeout_ms),
            proposals,
            db_closed,
            shared,
            member_id: cfg.member_id,
            db_path: cfg.data_dir.join("leasehold.redb"),
        });
        let bound = Duration::from_millis(cfg.election_timeout_ms * 20);
        replica
            .raft
            .wait(Some(bound))
            .metrics(|m| m.current_leader == Some(cfg.member_id), "become leader")
            .await
            .map_err(storage::io_err)?;
        replica
            .raft
            .ensure_linearizable()
            .await
            .map_err(storage::io_err)?;
        replica.promote().await.map_err(storage::io_err)?;
        Ok(replica)
    }

    /// Starts timing leases: proposes the extension of every inherited lease by the election
    /// timeout, then runs the lease clock on from the replicated value. Called once everything
    /// committed is applied.
    async fn promote(&self) -> Result<(), ReplicaError> {
        let replicated_ms = state_machine::read_leases(&self.shared, |t| t.clock_ms());
        let extend_ms = u64::try_from(self.election_timeout.as_millis()).unwrap_or(u64::MAX);
        self.write(Command::LeasePromote {
            now_ms: replicated_ms,
            extend_ms,
        })
        .await?;
        let clock = LeaseClock::promote(replicated_ms, Instant::now());
        *self.lease_clock.lock().expect("lease clock lock poisoned") = Some(clock);
        tracing::info!(lease_clock_ms = replicated_ms, "promoted: timing leases");
        Ok(())
    }

    /// The current lease time, if this member times leases (leads).
    pub fn lease_now_ms(&self) -> Result<u64, ReplicaError> {
        self.lease_clock()
            .map(|c| c.now_ms(Instant::now()))
            .ok_or(ReplicaError::NoLeader)
    }

    /// The lease time new deadlines count from (rounded up, see `LeaseClock::now_ms_ceil`).
    pub fn lease_deadline_base_ms(&self) -> Result<u64, ReplicaError> {
        self.lease_clock()
            .map(|c| c.now_ms_ceil(Instant::now()))
            .ok_or(ReplicaError::NoLeader)
    }

    /// The leader's lease clock, if this member leads.
    pub fn lease_clock(&self) -> Option<LeaseClock> {
        *self.lease_clock.lock().expect("lease clock lock poisoned")
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

    /// Reads the store and the lease table as one applied state (what a check that a key and
    /// its lease are both still there needs); linearizable as [`Replica::read`].
    pub async fn read_state<T>(
        &self,
        linearizable: bool,
        f: impl FnOnce(&Store, &LeaseTable) -> T,
    ) -> Result<T, ReplicaError> {
        if linearizable {
            self.ensure_linearizable().await?;
        }
        Ok(state_machine::read_state(&self.shared, f))
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

    async fn ensure_linearizable(&self) -> Result<(), ReplicaError> {
        self.raft
            .ensure_linearizable()
            .await
            .map(|_| ())
            .map_err(|e| match e {
                RaftError::APIError(_) => ReplicaError::NoLeader,
                RaftError::Fatal(_) => ReplicaError::Stopped,
            })
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

    /// The current members: (id, peer URL).
    pub fn members(&self) -> Vec<(u64, String)> {
        let m = self.raft.metrics().borrow().clone();
        m.membership_config
            .nodes()
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect()
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
