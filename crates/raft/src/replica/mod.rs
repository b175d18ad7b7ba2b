//! One member of the replicated store: the raft-rs engine (`rs.rs`) over the write-ahead log,
//! applying to the redb state machine. The server talks to this and nothing below it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use leasehold_lease::{LeaseClock, LeaseId, LeaseTable};
use leasehold_mvcc::Store;
use tokio::sync::{mpsc, oneshot, watch};

mod batch;
mod config;
mod engine;
mod error;
mod forward;
mod hashes;
mod lease_time;
mod membership;
mod promotion;
mod read_index;
mod renew;
mod rs;
mod scans;
mod transfer;

pub use rs::{NoTransport, RaftTransport};

pub use config::{
    CompactionPace, LEASE_COVER_MARGIN_DEFAULT_MS, ReplicaConfig, SNAPSHOT_COUNT_DEFAULT,
};
pub use engine::MemberInfo;
pub use error::{Fatal, MembershipError, ReplicaError, StartError};
pub use forward::{
    BoxFuture, Forwarded, Forwarder, MemberChange, MemberHash, NoForwarding, ReadIndex, ReadProof,
};

use batch::{Committed, Pending, QUEUE_LEN_MAX, propose_batches};
use engine::EngineStatus;
use forward::{leader_elsewhere, wait_applied};
use lease_time::SharedClock;
use read_index::ReadIndexRounds;
use rs::RsEngine;

use crate::command::{Alarm, AlarmChange, AlarmMember, Applied, Command, Proposal, Propose, Write};
use crate::state_machine::{self, KeyDeleteWaiter, Shared, StateMachine};
use crate::steps;
use crate::storage;
use crate::storage::Defragmented;
use crate::telemetry::{Telemetry, TelemetryReading};
use leasehold_auth::{AuthError, AuthState, Caller};

/// The leader's lease time for a read, and whether the member reading knows the deadlines the
/// leader told from memory (it is the leader). A follower bounds a lease's deadline by its cover
/// instead (`LeaseTable::follower_deadline_ms`).
#[derive(Clone, Copy, Debug)]
pub struct LeaseTime {
    pub now_ms: u64,
    pub told_known: bool,
}

impl LeaseTime {
    /// The lease's deadline as this read knows it: the told one on the leader, the follower's
    /// bound elsewhere.
    pub fn deadline_ms(&self, leases: &LeaseTable, id: LeaseId) -> Option<u64> {
        if self.told_known {
            leases.told_ms(id)
        } else {
            leases.follower_deadline_ms(id, self.now_ms)
        }
    }

    /// TimeToLive of `id`, as this read knows it.
    pub fn time_to_live(
        &self,
        leases: &LeaseTable,
        id: LeaseId,
        with_keys: bool,
    ) -> Option<leasehold_lease::TimeToLive> {
        leases.time_to_live_by(id, self.now_ms, with_keys, self.told_known)
    }
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
    engine: Arc<RsEngine>,
    /// Raft's progress, as the Raft thread publishes it.
    status: watch::Receiver<EngineStatus>,
    /// This member's mapping from real time to lease time; `Some` while it leads (and so times
    /// leases). A single member leads from start-up on.
    lease_clock: SharedClock,
    election_timeout: Duration,
    /// `--lease-cover-margin`, in ms (see [`ReplicaConfig::lease_cover_margin_ms`]).
    cover_margin_ms: u64,
    /// The leader's renewals and expiries, decided under this lock (`steps::LeaderRenewals`).
    renewals: Arc<std::sync::Mutex<crate::steps::LeaderRenewals>>,
    /// Renewals this member answered from memory while it led (they apply nowhere, so the
    /// lease table's counters miss them).
    memory_renewals: std::sync::atomic::AtomicU64,
    proposals: mpsc::Sender<Pending>,
    /// Fires once the Raft thread and the checkpointer have let go of the database and the file
    /// is closed.
    db_closed: tokio::sync::watch::Receiver<()>,
    /// Counters for operators (see [`Replica::telemetry`]).
    telemetry: Arc<Telemetry>,
    shared: Shared,
    member_id: u64,
    db_path: PathBuf,
    /// The database, for maintenance (defragment, space in use); weak, so that the file closes
    /// once the engine lets go of it.
    db: std::sync::Weak<storage::Db>,
    forwarder: Arc<dyn Forwarder>,
    /// Leadership confirmations, shared by concurrent linearizable reads here and by the
    /// followers' read-index requests.
    leader_reads: ReadIndexRounds,
    /// Read-index requests to the leader, shared by concurrent reads on this follower.
    follower_reads: ReadIndexRounds,
    /// Set once the member is stopping (see [`Replica::stop_waiters`]).
    stopping: tokio::sync::watch::Sender<bool>,
    /// `--quota-backend-bytes` (see [`ReplicaConfig::quota_bytes`]).
    quota_bytes: Option<u64>,
    /// The file size as the quota check last read it.
    quota_size: QuotaSize,
    /// The bytes in use as the quota check last read them, once the file reached the quota
    /// (shared with the task that reads them again in the background).
    quota_in_use: Arc<QuotaSize>,
    /// `--strict-reconfig-check` (see [`ReplicaConfig::strict_reconfig_check`]).
    strict_reconfig_check: bool,
    /// One Raft tick (`--heartbeat-interval`).
    heartbeat_interval_ms: u64,
}

/// A size the quota check reads (the file's, or the bytes in use), kept for a while so that a
/// put does not pay for reading it: the quota is a bound on the file, and etcd's check is
/// approximate too. A size slow to read is kept longer (ten times what reading it took).
#[derive(Debug)]
struct QuotaSize {
    since: std::time::Instant,
    /// When `bytes` was read, in ms since `since`; `u64::MAX` before the first read.
    read_at_ms: std::sync::atomic::AtomicU64,
    bytes: std::sync::atomic::AtomicU64,
    fresh_for_ms: std::sync::atomic::AtomicU64,
    /// A background reading is under way ([`Replica::refresh_in_use`]).
    refreshing: std::sync::atomic::AtomicBool,
}

impl QuotaSize {
    const FRESH_FOR: Duration = Duration::from_millis(100);

    fn new() -> QuotaSize {
        QuotaSize {
            since: std::time::Instant::now(),
            read_at_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
            bytes: std::sync::atomic::AtomicU64::new(0),
            fresh_for_ms: std::sync::atomic::AtomicU64::new(Self::FRESH_FOR.as_millis() as u64),
            refreshing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// The file shrank (a defragment): the next check reads it again.
    fn forget(&self) {
        self.read_at_ms
            .store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
    }

    /// The size last read, unless it is stale.
    fn cached(&self) -> Option<u64> {
        self.last()
            .and_then(|(bytes, fresh)| fresh.then_some(bytes))
    }

    /// The size last read, and whether it is still fresh; `None` before the first reading.
    fn last(&self) -> Option<(u64, bool)> {
        use std::sync::atomic::Ordering::Relaxed;
        let at = self.read_at_ms.load(Relaxed);
        if at == u64::MAX {
            return None;
        }
        let fresh = self.now_ms().saturating_sub(at) < self.fresh_for_ms.load(Relaxed);
        Some((self.bytes.load(Relaxed), fresh))
    }

    /// Keeps `bytes`, read just now in `took`.
    fn record(&self, bytes: u64, took: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let keep = Self::FRESH_FOR.max(took * 10);
        self.fresh_for_ms
            .store(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX), Relaxed);
        self.bytes.store(bytes, Relaxed);
        self.read_at_ms.store(self.now_ms(), Relaxed);
    }

    fn get(&self, read: impl FnOnce() -> u64) -> u64 {
        self.cached().unwrap_or_else(|| {
            let started = std::time::Instant::now();
            let bytes = read();
            self.record(bytes, started.elapsed());
            bytes
        })
    }
}

/// The bytes of the database file that hold data ([`storage::Db::bytes_in_use`], slow on a big
/// file), or the file's size once the database is closed. Blocks.
fn in_use_or_file_size(db: &std::sync::Weak<storage::Db>, path: &std::path::Path) -> u64 {
    db.upgrade()
        .and_then(|db| db.bytes_in_use())
        .unwrap_or_else(|| std::fs::metadata(path).map_or(0, |m| m.len()))
}

impl Replica {
    /// Opens storage, starts Raft (raft-rs, on its own thread) and, on a new data dir,
    /// bootstraps a one-member cluster. Waits (bounded) until this member leads and times
    /// leases.
    pub async fn start(cfg: ReplicaConfig) -> Result<Arc<Replica>, StartError> {
        Replica::start_with(cfg, Arc::new(NoTransport), Arc::new(NoForwarding)).await
    }

    /// Like [`Replica::start`], with peers: `transport` carries Raft's messages to them (theirs
    /// arrive through [`Replica::deliver_raft_message`]) and `forwarder` takes follower writes
    /// and reads to the leader. A member of a cluster with peers does not wait for a leader:
    /// the others may not be up yet.
    pub async fn start_with(
        cfg: ReplicaConfig,
        transport: Arc<dyn RaftTransport>,
        forwarder: Arc<dyn Forwarder>,
    ) -> Result<Arc<Replica>, StartError> {
        let db = storage::open(&cfg.data_dir)?;
        let (last_applied, membership) = {
            let txn = db
                .begin_read()
                .map_err(storage::StorageError::read("sm_meta"))?;
            let meta = storage::SmMeta::read(&txn)?;
            (meta.last_applied, meta.membership)
        };
        let bootstrap = cfg.bootstrap.then(|| {
            let mut members = cfg.initial_peers.clone();
            members.insert(cfg.member_id, cfg.peer_url.clone());
            members
        });
        // As etcd's: only a data dir that holds a cluster (a log, or an applied state) is
        // forced; a new one starts as it would without the flag.
        let holds_cluster = last_applied.is_some() || cfg.data_dir.join("wal").exists();
        let force_new_cluster = cfg.force_new_cluster && holds_cluster;
        if cfg.force_new_cluster && !holds_cluster {
            tracing::warn!("--force-new-cluster ignored: the data dir holds no cluster yet");
        }
        let opening = rs::LogOpening {
            member_id: cfg.member_id,
            data_dir: cfg.data_dir.clone(),
            heartbeat_interval_ms: cfg.heartbeat_interval_ms,
            election_timeout_ms: cfg.election_timeout_ms,
            catch_up_entries: cfg.snapshot_log_entries_max,
            force_new_cluster,
            last_applied,
            members: rs::starting_membership(last_applied, membership, bootstrap.as_ref()),
        };
        // The log and the state machine are read at the same time: neither needs the other.
        let (log, sm) = tokio::task::spawn_blocking({
            let db = db.clone();
            let token_ttl = cfg.auth_token_ttl;
            move || {
                let log = std::thread::Builder::new()
                    .name("leasehold-log-open".into())
                    .spawn(move || rs::open_log(opening))
                    .expect("spawn the log-opening thread");
                let sm = open_state_machine(db, token_ttl);
                let log = log
                    .join()
                    .map_err(|_| StartError::Core("opening the log panicked".into()))
                    .and_then(|opened| opened.map_err(StartError::Core));
                (log, sm)
            }
        })
        .await
        .map_err(|e| StartError::Core(e.to_string()))?;
        let sm = sm?;
        let log = log?;
        let shared = sm.shared();
        drop(sm);
        let db_closed = db.closed();
        let db_weak = Arc::downgrade(&db);
        let telemetry = db.telemetry().clone();
        let start = rs::RsStart {
            initial_peers: cfg.initial_peers.clone(),
            shared: shared.clone(),
            db,
            telemetry: telemetry.clone(),
            transport,
            compaction_pace: cfg.compaction_pace,
            clock: cfg.clock.clone(),
        };
        let replayed_to = log.commit_index();
        let (engine, status) = RsEngine::start(log, start);
        // The proposer, the read rounds, leadership following.
        let (proposals, queue) = mpsc::channel(QUEUE_LEN_MAX);
        let queue = Arc::new(tokio::sync::Mutex::new(queue));
        let lease_clock = SharedClock::new(cfg.clock.clone());
        tokio::spawn(propose_batches(
            engine.clone(),
            status.clone(),
            cfg.member_id,
            lease_clock.clone(),
            cfg.lease_cover_margin_ms,
            forwarder.clone(),
            queue.clone(),
        ));
        let leader_reads =
            ReadIndexRounds::leader(engine.clone(), status.clone(), lease_clock.clone())
                .counted(telemetry.clone());
        let follower_reads = ReadIndexRounds::follower(
            status.clone(),
            cfg.member_id,
            forwarder.clone(),
            engine.heartbeats(),
            Duration::from_millis(cfg.election_timeout_ms),
        )
        .counted(telemetry.clone());
        let replica = Arc::new(Replica {
            engine,
            status,
            lease_clock,
            leader_reads,
            follower_reads,
            election_timeout: Duration::from_millis(cfg.election_timeout_ms),
            cover_margin_ms: cfg.lease_cover_margin_ms,
            renewals: Arc::default(),
            memory_renewals: std::sync::atomic::AtomicU64::new(0),
            proposals,
            db_closed,
            telemetry: telemetry.clone(),
            shared,
            member_id: cfg.member_id,
            db_path: cfg.data_dir.join("leasehold.redb"),
            db: db_weak,
            forwarder,
            stopping: tokio::sync::watch::Sender::new(false),
            quota_bytes: cfg.quota_bytes,
            quota_size: QuotaSize::new(),
            quota_in_use: Arc::new(QuotaSize::new()),
            strict_reconfig_check: cfg.strict_reconfig_check,
            heartbeat_interval_ms: cfg.heartbeat_interval_ms,
        });
        replica.warn_if_not_a_member();
        replica.checkpoint_replayed(replayed_to).await;
        tokio::spawn(Replica::follow_leadership(Arc::downgrade(&replica)));
        if cfg.bootstrap && cfg.initial_peers.is_empty() && replica.members().len() <= 1 {
            let bound = Duration::from_millis(cfg.election_timeout_ms * 20);
            if !replica.lease_clock.wait_timing(bound).await {
                return Err(StartError::NoLeadership(bound));
            }
        }
        Ok(replica)
    }

    /// Applies what the log committed beyond the last checkpoint (up to `replayed_to`) and
    /// writes it once, before this member serves: on a disk that filled before a restart, the
    /// write finds no room and marks the disk full, so the first client write already gets
    /// NOSPACE (as etcd's alarm outlives its restart) rather than entering the log while the
    /// checkpointer waits out its window. Any other failure is the checkpointer's to report.
    async fn checkpoint_replayed(&self, replayed_to: u64) {
        let mut status = self.status.clone();
        let _ = status
            .wait_for(|s| s.applied_index >= replayed_to || s.stopped)
            .await;
        let Some(db) = self.db.upgrade() else {
            return;
        };
        match tokio::task::spawn_blocking(move || db.checkpoint()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!("writing what the log replayed at start: {e}"),
            Err(e) => tracing::warn!("writing what the log replayed at start: {e}"),
        }
    }

    /// Warns when the data dir holds a cluster without this member: its ID comes from the
    /// flags, so a data dir restored (or first started) with another name, cluster, token or
    /// peer URL belongs to another member, and this one cannot lead or vote.
    fn warn_if_not_a_member(&self) {
        let members = self.members();
        if !members.is_empty() && !members.iter().any(|m| m.id == self.member_id) {
            tracing::warn!(
                member_id = %format!("{:x}", self.member_id),
                members = ?members.iter().map(|m| format!("{:x}", m.id)).collect::<Vec<_>>(),
                "this member is not in the cluster its data dir holds (restored or started \
                 with other --name, --initial-cluster, --initial-cluster-token or \
                 --initial-advertise-peer-urls?): it cannot lead or vote until it is added"
            );
        }
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

    /// Ends every [`Replica::key_gone`] wait, present and future, with `Stopped`, and
    /// completes [`Replica::stopping`]: for a member that is shutting down (so that a lock
    /// waiter or a long-lived stream does not hold up the drain of client requests forever) or
    /// whose Raft core failed.
    pub fn stop_waiters(&self) {
        self.shared.key_deletes.close();
        self.stopping.send_replace(true);
    }

    /// Whether [`Replica::stop_waiters`] was called.
    pub fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Completes once [`Replica::stop_waiters`] was called: long-lived streams end on it.
    pub async fn stopping(&self) {
        let mut stopping = self.stopping.subscribe();
        let _ = stopping.wait_for(|s| *s).await;
    }

    /// Completes once `key` has no live version created at `create_revision` (at once if it has
    /// none now). Woken only by an apply that deletes `key` (or a snapshot install), never by
    /// writes to other keys; it registers before it looks, so a delete applied between a
    /// caller's read and this call is not missed. `Stopped` if the replica goes first.
    pub async fn key_gone(&self, key: &[u8], create_revision: i64) -> Result<(), ReplicaError> {
        let mut waiter = KeyDeleteWaiter::register(&self.shared.key_deletes, key);
        loop {
            let live = state_machine::read(&self.shared, |store| {
                let point = leasehold_mvcc::RangeRequest {
                    key: key.to_vec(),
                    keys_only: true,
                    ..leasehold_mvcc::RangeRequest::default()
                };
                store
                    .range(&point)
                    .ok()
                    .and_then(|r| r.kvs.first().map(|kv| kv.create_revision))
            });
            if live != Some(create_revision) {
                return Ok(());
            }
            if !waiter.fired().await {
                return Err(ReplicaError::Stopped);
            }
            // Fired by a delete of `key` (so that version is gone) or a snapshot install (look
            // again, registered anew first).
            waiter = KeyDeleteWaiter::register(&self.shared.key_deletes, key);
        }
    }

    /// Lease events applied since this member started: what etcd exports as
    /// `etcd_debugging_lease_{granted,revoked,renewed}_total` and
    /// `etcd_debugging_server_lease_expired_total`.
    pub fn lease_counters(&self) -> leasehold_lease::Counters {
        let mut counters = state_machine::read_leases(&self.shared, |t| t.counters());
        counters.renewed += self
            .memory_renewals
            .load(std::sync::atomic::Ordering::Relaxed);
        counters
    }

    /// The KV operations this member has applied since it started, as etcd's
    /// `etcd_mvcc_{put,delete,range,txn}_total` count them (ranges here: those inside txns).
    pub fn kv_ops_applied(&self) -> state_machine::KvOps {
        self.shared.kv_ops()
    }

    /// `--quota-backend-bytes` as applied (`None`: no quota).
    pub fn quota_bytes(&self) -> Option<u64> {
        self.quota_bytes
    }

    /// Whether this member is a learner in its current membership.
    pub fn is_learner(&self) -> bool {
        self.status
            .borrow()
            .members
            .get(&self.member_id)
            .is_some_and(|m| m.learner)
    }

    /// The applied store's live keys, current revision and compaction revision (`-1` before
    /// the first compaction), for the metrics: one short read of the state.
    pub fn kv_gauges(&self) -> (usize, i64, i64) {
        state_machine::read_state(&self.shared, |store, _| {
            (
                store.live_keys(),
                store.current_revision(),
                store.compact_revision(),
            )
        })
    }

    /// How many leases this member holds (applied, expired or not).
    pub fn leases_live(&self) -> usize {
        state_machine::read_leases(&self.shared, LeaseTable::len)
    }

    /// Follows the lease table: the receiver sees a change after every apply that touched a
    /// lease (a grant, renewal, revoke or expiry) and after a snapshot install.
    pub fn subscribe_lease_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.lease_changes.subscribe()
    }

    /// Follows the leadership as this member sees it (the term and the leader).
    pub fn subscribe_leadership(&self) -> LeadershipWatch {
        let mut status = self.status.clone();
        let seen = {
            let s = status.borrow_and_update();
            (s.term, s.leader)
        };
        LeadershipWatch { status, seen }
    }

    /// Follows every change of this member's Raft state (term, leader, role, log and applied
    /// index, members): what a write that found no leader waits on before it goes again.
    pub fn subscribe_raft_changes(&self) -> RaftChanges {
        let mut status = self.status.clone();
        status.borrow_and_update();
        RaftChanges { status }
    }

    /// Completes after the next apply that touched a lease (the earliest deadline may have moved).
    pub async fn leases_changed(&self) {
        self.shared.leases_changed.notified().await;
    }

    /// Read index: on the leader, confirms leadership and waits until everything committed is
    /// applied; on a follower, asks the leader for its read index and waits to apply that far.
    /// Returns the leader's lease time at that point, if it has one.
    async fn read_index(&self) -> Result<Option<u64>, ReplicaError> {
        self.read_index_where().await.map(|(now_ms, _)| now_ms)
    }

    /// [`Replica::read_index`], and whether this member answered it as leader (and so knows
    /// the deadlines it told from memory).
    async fn read_index_where(&self) -> Result<(Option<u64>, bool), ReplicaError> {
        if leader_elsewhere(&self.status, self.member_id).is_some() {
            let read = self.follower_reads.join().await?;
            wait_applied(&self.status, read.index).await?;
            return Ok((read.lease_now_ms, false));
        }
        let read = self.leader_read_index().await?;
        Ok((read.lease_now_ms, true))
    }

    async fn ensure_linearizable(&self) -> Result<(), ReplicaError> {
        self.read_index().await.map(|_| ())
    }

    /// Reads the store and the lease table linearizably, with the leader's lease time (what
    /// remaining TTLs and lease liveness are measured against), wherever this member is.
    pub async fn read_at_lease_time<T>(
        &self,
        f: impl FnOnce(&Store, &LeaseTable, LeaseTime) -> T,
    ) -> Result<T, ReplicaError> {
        let (now_ms, told_known) = self.read_index_where().await?;
        let at = LeaseTime {
            now_ms: now_ms.ok_or(ReplicaError::NoLeader)?,
            told_known,
        };
        Ok(state_machine::read_state(&self.shared, |store, leases| {
            f(store, leases, at)
        }))
    }

    /// Reads this member's applied store and lease table together, with no read index, and the
    /// lease time as this member knows it: its lease clock while it leads, otherwise the
    /// replicated lease time plus what this member has seen pass since it applied that value.
    /// For operators' views (the dashboard): on a follower both lag the leader by its
    /// replication delay. `f` runs under the state lock, so it must copy a bounded part only.
    pub fn read_local<T>(&self, f: impl FnOnce(&Store, &LeaseTable, u64) -> T) -> T {
        let now_ms = match self.lease_clock.lease_now_ms() {
            Some(now_ms) => now_ms,
            None => state_machine::lease_time_now(&self.shared, self.lease_clock.now()),
        };
        state_machine::read_state(&self.shared, |store, leases| f(store, leases, now_ms))
    }

    /// The leader's side of [`Forwarder::read_index`].
    pub async fn leader_read_index(&self) -> Result<ReadIndex, ReplicaError> {
        self.leader_reads.join().await
    }

    /// The leader's side of [`Forwarder::forward`]: a follower's batch joins this member's own
    /// write queue, so forwarded writes share log entries (and fsyncs) with every other
    /// client's; answered with the replies and the last log index that held them. A member that
    /// does not lead answers "no leader" (it never forwards a forwarded write again).
    pub async fn leader_commit(&self, writes: Vec<Write>) -> Result<Forwarded, ReplicaError> {
        if leader_elsewhere(&self.status, self.member_id).is_some() {
            return Err(ReplicaError::NoLeader);
        }
        enum Wait {
            Queued(oneshot::Receiver<Result<Committed, ReplicaError>>),
            Done(Applied, u64),
            Renewal(LeaseId, renew::Step),
        }
        // Each write as it arrives (`steps::leader_arrival`): the disk's rule, which the
        // followers' own admission could not see, one write at a time; renewals decided at once,
        // answered from memory where they can be (`steps::LeaderRenewals`).
        let disk_full = self.disk_full();
        let mut waits = Vec::with_capacity(writes.len());
        for write in writes {
            let timing = self.lease_clock().is_some();
            waits.push(match steps::leader_arrival(&write, timing, disk_full) {
                steps::Arrival::NoSpace => Wait::Done(Applied::NoSpace, 0),
                steps::Arrival::Renew(id) => match self.renew_step(id) {
                    Ok(renew::Step::Answered(ttl, index)) => {
                        Wait::Done(Applied::LeaseRenew(ttl), index)
                    }
                    Ok(step) => Wait::Renewal(id, step),
                    // Demoted since: through the queue, which waits for a promotion or answers
                    // "no leader".
                    Err(_) => Wait::Queued(self.enqueue(write, true).await?),
                },
                steps::Arrival::Queue => Wait::Queued(self.enqueue(write, true).await?),
            });
        }
        // Waited for together: renewals that go through the log share entries with each other
        // and with the batch's other writes, rather than taking one commit each in turn.
        let finished = futures::future::join_all(waits.into_iter().map(|wait| async move {
            match wait {
                Wait::Done(applied, index) => Ok::<_, ReplicaError>((applied, index)),
                Wait::Queued(wait) => {
                    let committed = wait.await.map_err(|_| ReplicaError::Stopped)??;
                    Ok((committed.applied, committed.log_index))
                }
                Wait::Renewal(id, step) => {
                    let (ttl, index) = self.renew_as_leader(id, Some(step)).await?;
                    Ok((Applied::LeaseRenew(ttl), index))
                }
            }
        }))
        .await;
        let mut forwarded = Forwarded {
            log_index: 0,
            applied: Vec::with_capacity(finished.len()),
        };
        for result in finished {
            let (applied, index) = result?;
            forwarded.log_index = forwarded.log_index.max(index);
            forwarded.applied.push(applied);
        }
        Ok(forwarded)
    }

    /// A peer's Raft message, as the peer transport carried it; `Err` names why it was
    /// refused (bytes that are not a message for this member).
    pub fn deliver_raft_message(&self, bytes: &[u8]) -> Result<(), String> {
        self.engine.deliver(bytes)
    }

    /// The file of the snapshot this member offered that `request` names (a Raft snapshot's
    /// data, as a follower sends it back to fetch the file); `Err` says why there is none.
    pub fn outgoing_snapshot(&self, request: &[u8]) -> Result<PathBuf, String> {
        self.engine.outgoing_snapshot(request)
    }

    /// The transport heard from peer `id` without a Raft message: its link's keepalive, which
    /// every member sends every other, so that a follower knows for how long it has been
    /// connected to the others as etcd's members do (what a new leader's reconfiguration checks
    /// ask).
    pub fn peer_heard(&self, id: u64) {
        self.engine.heard(id);
    }

    /// The transport could not deliver a raft-rs message to `id`.
    pub fn report_unreachable(&self, id: u64) {
        self.telemetry
            .undelivered
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.engine.unreachable(id);
    }

    /// How many times the transport could not deliver this member's Raft messages
    /// ([`Replica::report_unreachable`]).
    pub fn messages_dropped(&self) -> u64 {
        self.telemetry
            .undelivered
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Follows this member's lease clock: `Some` while it leads and times leases. For drivers
    /// that have work only on the leader, so they wait instead of polling.
    pub fn subscribe_lease_clock(&self) -> tokio::sync::watch::Receiver<Option<LeaseClock>> {
        self.lease_clock.subscribe()
    }

    pub fn member_id(&self) -> u64 {
        self.member_id
    }

    /// Proposes a client write and waits until it is applied; answers with the write's own
    /// reply. Concurrent writes are batched into one log entry (see [`propose_batches`]).
    pub async fn propose<P: Propose>(&self, request: P) -> Result<P::Reply, ReplicaError> {
        self.propose_as(None, request).await
    }

    /// [`Replica::propose`] on behalf of `caller` (resolved from the request's token with
    /// [`Replica::auth_caller`]): applied only if the auth store, when it is applied, still lets
    /// the caller make it (`None`: no caller, refused while auth is on if it touches keys).
    pub async fn propose_as<P: Propose>(
        &self,
        caller: Option<Caller>,
        request: P,
    ) -> Result<P::Reply, ReplicaError> {
        let write = request.into();
        self.admit(&write).await?;
        let write = match caller {
            Some(caller) => Write::As {
                caller,
                write: Box::new(write),
            },
            None => write,
        };
        let applied = self.write(write).await?;
        match applied {
            Applied::Denied(e) => return Err(ReplicaError::Auth(e)),
            Applied::NoSpace => return Err(ReplicaError::NoSpace),
            _ => {}
        }
        P::reply(applied).map_err(|other| {
            tracing::error!("the state machine answered with another command's reply: {other:?}");
            ReplicaError::WrongReply(format!("{other:?}"))
        })
    }

    /// Who a request's token (gRPC metadata `token`) names, as of the current auth revision.
    /// `None` while auth is off (a token is then ignored, as etcd 3.5 ignores it) or without a
    /// token; an unknown or expired token is `InvalidAuthToken`.
    pub fn auth_caller(&self, token: Option<&str>) -> Result<Option<Caller>, AuthError> {
        if !self.auth_enabled() {
            return Ok(None);
        }
        let state = self.shared.state.read().expect("state lock poisoned");
        if !state.auth.enabled {
            return Ok(None);
        }
        let Some(token) = token else {
            return Ok(None);
        };
        match state.tokens.user(token, std::time::Instant::now()) {
            Some(user) => Ok(Some(state.auth.caller(&user))),
            None => Err(AuthError::InvalidAuthToken),
        }
    }

    /// Whether auth is enabled in the applied state (no lock taken).
    pub fn auth_enabled(&self) -> bool {
        self.shared
            .auth_enabled
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Reads the applied auth store.
    pub fn read_auth<T>(&self, f: impl FnOnce(&AuthState) -> T) -> T {
        let state = self.shared.state.read().expect("state lock poisoned");
        f(&state.auth)
    }

    /// The alarms raised, for every member.
    pub fn alarms(&self) -> Vec<AlarmMember> {
        let mut alarms: Vec<AlarmMember> = {
            let state = self.shared.state.read().expect("state lock poisoned");
            state.alarms.iter().copied().collect()
        };
        // This member's own disk out of space: NOSPACE for this member, raised and cleared here
        // with the disk (not through the log, which may have no room), so it clears itself.
        let disk_full = AlarmMember {
            member: self.member_id,
            alarm: Alarm::NoSpace,
        };
        if self.disk_full() && !alarms.contains(&disk_full) {
            alarms.push(disk_full);
        }
        alarms
    }

    /// Whether this member's disk ran out of space under its last checkpoint (see
    /// `storage::Db::out_of_space`), or has no room for the Raft log's next segment (see
    /// `Core::log_has_room`).
    pub fn disk_full(&self) -> bool {
        self.shared
            .log_without_room
            .load(std::sync::atomic::Ordering::SeqCst)
            || self.db.upgrade().is_some_and(|db| db.out_of_space())
    }

    /// The part of [`Replica::admit`] that is this member's disk: with it full, what adds data
    /// gets NOSPACE (a leader applies the same rule to what followers forward, in
    /// `steps::leader_arrival`).
    fn refused_by_disk(&self, write: &Write) -> bool {
        write.adds_data() && self.disk_full()
    }

    /// Refuses what etcd refuses while an alarm is raised, or past the space quota (raising
    /// NOSPACE for this member then, as etcd does). Checked here, on the member the client
    /// asked, against its applied alarms, as etcd checks its quota before proposing.
    async fn admit(&self, write: &Write) -> Result<(), ReplicaError> {
        let raised = self
            .shared
            .alarms_raised
            .load(std::sync::atomic::Ordering::SeqCst);
        let corrupt = raised & state_machine::RAISED_CORRUPT != 0;
        let no_space = raised & state_machine::RAISED_NO_SPACE != 0;
        if corrupt && write.refused_when_corrupt() {
            return Err(ReplicaError::Corrupt);
        }
        if self.refused_by_disk(write) {
            return Err(ReplicaError::NoSpace);
        }
        if !write.adds_data() {
            return Ok(());
        }
        if no_space {
            return Err(ReplicaError::NoSpace);
        }
        let Some(quota) = self.quota_bytes else {
            return Ok(());
        };
        let cost = u64::try_from(write.approx_bytes()).unwrap_or(u64::MAX);
        let size = self.quota_size.get(|| self.db_size_bytes());
        if size.saturating_add(cost) < quota {
            if size >= quota / 4 && self.quota_in_use.last().is_none() {
                // The first reading of the bytes in use, ahead of the first write that needs it
                // (redb grows its file in big steps: its last size below the quota can be far below).
                self.refresh_in_use();
            }
            return Ok(());
        }
        // The file reached the quota. It counts the pages that hold data, as etcd's file size
        // does: redb's file starts at about a MiB and grows ahead of its data (an empty one
        // holds 24 KiB, as etcd's empty file is 20 KiB), and pages a compaction freed are
        // written again before the file grows.
        // Reading the bytes in use takes a second or more on a big file under load (see
        // `Db::bytes_in_use`): a put never waits for it while a past reading says the write fits.
        // A stale reading is read again in the background; only a refusal reads it first.
        if let Some((in_use, fresh)) = self.quota_in_use.last() {
            if !fresh {
                self.refresh_in_use();
            }
            if in_use.saturating_add(cost) < quota {
                return Ok(());
            }
        }
        let started = std::time::Instant::now();
        let in_use = self.db_size_in_use_bytes().await;
        self.quota_in_use.record(in_use, started.elapsed());
        if in_use.saturating_add(cost) < quota {
            return Ok(());
        }
        tracing::warn!(
            quota_bytes = quota,
            db_size_bytes = self.db_size_bytes(),
            "the database is past its space quota; raising NOSPACE"
        );
        let raise = AlarmChange {
            activate: true,
            alarm: AlarmMember {
                member: self.member_id,
                alarm: Alarm::NoSpace,
            },
        };
        if let Err(e) = self.write(raise.into()).await {
            tracing::warn!("raising NOSPACE: {e}");
        }
        Err(ReplicaError::NoSpace)
    }

    /// Writes `write` and waits until it is applied here. While no leader is known (an election
    /// is under way), or the known one cannot be reached and the write was never handed to it,
    /// the write waits for the next leader and goes to it, as etcd's proposals wait, for at most
    /// [`Replica::leader_wait`]; then it answers "no leader". Answering "no leader" at once
    /// failed every write a client sent during an election: etcd's clients send a Put or a Txn
    /// again only when it never left them.
    async fn write(&self, mut write: Write) -> Result<Applied, ReplicaError> {
        let deadline = tokio::time::Instant::now() + self.leader_wait();
        let mut unreachable = None;
        loop {
            self.await_leader(deadline, unreachable).await;
            let leader = self.status.borrow().leader;
            // Kept only where it may go again: a write forwarded to another member.
            let again = leader_elsewhere(&self.status, self.member_id).map(|_| write.clone());
            let committed = self.enqueue(write, false).await?;
            match committed.await.map_err(|_| ReplicaError::Stopped)? {
                Err(ReplicaError::LeaderUnreachable) => match again {
                    Some(w) if tokio::time::Instant::now() < deadline => {
                        write = w;
                        unreachable = leader;
                    }
                    _ => return Err(ReplicaError::NoLeader),
                },
                other => return other.map(|c| c.applied),
            }
        }
    }

    /// How long a client write waits for a leader: three election timeouts, time for the
    /// members to notice a dead leader and elect the next one (etcd's own bound is its request
    /// timeout, 5 s and two election timeouts).
    fn leader_wait(&self) -> Duration {
        self.election_timeout * 3
    }

    /// Waits, until `deadline`, for a leader other than `not` to be known (or for this member
    /// to stop).
    async fn await_leader(&self, deadline: tokio::time::Instant, not: Option<u64>) {
        let known = |s: &EngineStatus| s.stopped || s.leader.is_some_and(|l| Some(l) != not);
        if known(&self.status.borrow()) {
            return;
        }
        let mut status = self.status.clone();
        let _ = tokio::time::timeout_at(deadline, status.wait_for(known)).await;
    }

    /// Queues `write` for the next batch; the receiver gets its outcome.
    async fn enqueue(
        &self,
        write: Write,
        from_peer: bool,
    ) -> Result<oneshot::Receiver<Result<Committed, ReplicaError>>, ReplicaError> {
        let (reply, committed) = oneshot::channel();
        self.proposals
            .send(Pending {
                write,
                from_peer,
                reply,
            })
            .await
            .map_err(|_| ReplicaError::Stopped)?;
        Ok(committed)
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
        let s = self.status.borrow().clone();
        RaftStatus {
            term: s.term,
            leader: s.leader,
            last_log_index: s.last_log_index,
            applied_index: s.applied_index,
        }
    }

    /// The leader's expiry driver's pass ([`crate::steps::expiry_pass`]) on this member's
    /// lease table, under the renewals' lock: the leases it finds due are marked as ending
    /// before the lock is let go, so that no renewal of one is answered from memory until
    /// [`Replica::expire_leases`] has committed (or failed to commit) their end.
    pub fn expiry_pass(
        &self,
        clock: &LeaseClock,
        now: std::time::Instant,
        cfg: &crate::steps::ExpiryConfig,
    ) -> crate::steps::ExpiryPass {
        state_machine::read_leases(&self.shared, |table| {
            let mut renewals = self.renewals();
            let pass = crate::steps::expiry_pass(table, clock, now, cfg);
            if let Some(crate::steps::ExpiryWork::Expire { leases, .. }) = &pass.work {
                renewals.ending(leases.iter().map(|(id, _)| *id));
            }
            pass
        })
    }

    /// The leader's expiry: revokes those of `leases` (each with the cover the expiry pass saw)
    /// whose cover is unchanged, or passed, when applied at lease time `now_ms`; how many were
    /// revoked. Only as leader: a member that was deposed meanwhile must not get its expiries
    /// committed by the new leader (etcd#15247).
    pub async fn expire_leases(
        &self,
        leases: Vec<(LeaseId, u64)>,
        now_ms: u64,
    ) -> Result<usize, ReplicaError> {
        let ids: Vec<LeaseId> = leases.iter().map(|(id, _)| *id).collect();
        let done = self
            .propose_as_leader(Command::LeaseExpireTold { leases, now_ms })
            .await;
        self.renewals().ended(ids);
        match done? {
            Applied::LeaseExpire(revoked) => Ok(revoked),
            other => Err(ReplicaError::WrongReply(format!("{other:?}"))),
        }
    }

    /// The leader's tick of the replicated lease clock to `now_ms`, so a restart loses at most a
    /// tick of lease time.
    pub async fn tick_lease_clock(&self, now_ms: u64) -> Result<(), ReplicaError> {
        match self
            .propose_as_leader(Command::LeaseTick { now_ms })
            .await?
        {
            Applied::LeaseTick => Ok(()),
            other => Err(ReplicaError::WrongReply(format!("{other:?}"))),
        }
    }

    /// Commits a leader-only command on this member's Raft, never forwarded; `NoLeader` unless
    /// this member leads and times leases.
    async fn propose_as_leader(&self, command: Command) -> Result<Applied, ReplicaError> {
        if leader_elsewhere(&self.status, self.member_id).is_some() || self.lease_clock().is_none()
        {
            return Err(ReplicaError::NoLeader);
        }
        self.commit_here(command).await
    }

    /// Commits one command of the leader's own straight on this member's Raft (never
    /// forwarded), through the proposal gate like every commit.
    async fn commit_here(&self, command: Command) -> Result<Applied, ReplicaError> {
        let proposal = Proposal {
            commands: vec![command],
        };
        let mut done = self.engine.submit(proposal).await?;
        done.applied.pop().ok_or(ReplicaError::Stopped)
    }

    /// The election timeout this member runs with.
    pub fn election_timeout(&self) -> Duration {
        self.election_timeout
    }

    /// Waits (at most `bound`) until this member knows a leader; whether it does.
    pub async fn wait_for_leader(&self, bound: Duration) -> bool {
        let mut status = self.status.clone();
        let known = status.wait_for(|s| s.leader.is_some());
        matches!(tokio::time::timeout(bound, known).await, Ok(Ok(_)))
    }

    /// Completes once this member has known no leader for `period` without a break (etcd's
    /// condition for failing streams that require a leader). Never completes after shutdown.
    pub async fn leader_lost_for(&self, period: Duration) {
        let mut status = self.status.clone();
        loop {
            while status.borrow_and_update().leader.is_some() {
                if status.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
            let leader_back = async {
                loop {
                    if status.changed().await.is_err() {
                        return std::future::pending::<()>().await;
                    }
                    if status.borrow_and_update().leader.is_some() {
                        return;
                    }
                }
            };
            if tokio::time::timeout(period, leader_back).await.is_err() {
                return;
            }
        }
    }

    /// Completes when this member's Raft core stops on its own, a storage failure (a full disk,
    /// an I/O error) or a panic, with what stopped it (a storage failure typed, with its source
    /// error). Never completes after a shutdown this process asked for. Such a member can serve
    /// nothing any more, reads included: whoever runs it should end the process, so that a
    /// supervisor restarts it (etcd exits too).
    pub async fn failed(&self) -> Fatal {
        self.engine.failed().await
    }

    /// Completes once this member has applied its own removal from the cluster (a membership
    /// that holds other members and not this one). Such a member has no part in the cluster
    /// any more: whoever runs it should stop it, as etcd stops a removed member ("the member
    /// has been permanently removed from the cluster"). Never completes for a member that was
    /// not removed, or that stopped before it learnt of its removal.
    pub async fn removed(&self) {
        let mut status = self.status.clone();
        let me = self.member_id;
        // An error means the Raft thread is gone: this member is not going to learn of it.
        if status
            .wait_for(|s| !s.members.is_empty() && !s.members.contains_key(&me))
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }

    /// What this member has counted about itself (commit times, proposals, leader changes).
    pub fn telemetry(&self) -> TelemetryReading {
        self.telemetry.read()
    }

    /// Whether this member leads (Raft's view, as etcd's `is_leader` gauge).
    pub fn is_leader(&self) -> bool {
        self.status.borrow().is_leader
    }

    /// Returns once this member leads (at once if it does), or never if it stops first: what
    /// the leader's periodic duties sleep on while this member follows, instead of a timer.
    pub async fn until_leading(&self) {
        let mut status = self.status.clone();
        let leading =
            matches!(status.wait_for(|s| s.is_leader || s.stopped).await, Ok(s) if s.is_leader);
        if !leading {
            std::future::pending::<()>().await;
        }
    }

    /// Size of the database file in bytes.
    pub fn db_size_bytes(&self) -> u64 {
        std::fs::metadata(&self.db_path).map_or(0, |m| m.len())
    }

    /// Bytes of the database file that hold data (etcd's `db_size_in_use`); the file's size
    /// when that cannot be read (the member is stopping). Slow on a big file (see
    /// `Db::bytes_in_use`).
    pub async fn db_size_in_use_bytes(&self) -> u64 {
        let (db, path) = (self.db.clone(), self.db_path.clone());
        tokio::task::spawn_blocking(move || in_use_or_file_size(&db, &path))
            .await
            .unwrap_or_else(|_| self.db_size_bytes())
    }

    /// Reads the bytes in use again for the quota check, in the background, unless a reading is
    /// already under way.
    fn refresh_in_use(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.quota_in_use.refreshing.swap(true, Relaxed) {
            return;
        }
        let (quota, db, path) = (
            self.quota_in_use.clone(),
            self.db.clone(),
            self.db_path.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let bytes = in_use_or_file_size(&db, &path);
            quota.record(bytes, started.elapsed());
            quota.refreshing.store(false, Relaxed);
        });
    }

    /// [`Replica::db_size_in_use_bytes`], read again only when the last reading (this one's or
    /// the quota check's) is stale.
    pub async fn db_size_in_use_recent(&self) -> u64 {
        if let Some(bytes) = self.quota_in_use.cached() {
            return bytes;
        }
        let started = std::time::Instant::now();
        let bytes = self.db_size_in_use_bytes().await;
        self.quota_in_use.record(bytes, started.elapsed());
        bytes
    }

    /// The auth store's revision, as applied here (etcd's `etcd_debugging_auth_revision`).
    pub fn auth_revision(&self) -> u64 {
        self.shared
            .state
            .read()
            .expect("state lock poisoned")
            .auth
            .revision
    }

    /// Waits until this member's file holds no row that a compaction at `revision` hides (it
    /// leaves a batch at a time after the compaction is applied): etcd's `physical` compaction.
    pub async fn compacted_physically(&self, revision: i64) -> Result<(), ReplicaError> {
        let mut finished = self
            .db
            .upgrade()
            .ok_or(ReplicaError::Stopped)?
            .compaction_finished();
        finished
            .wait_for(|done| *done >= revision)
            .await
            .map(|_| ())
            .map_err(|_| ReplicaError::Stopped)
    }

    /// Compacts this member's database file (etcd's Defragment, which is per member too).
    /// Writes wait meanwhile. `Ok(None)`: transactions already running (a snapshot being sent)
    /// did not end within a few seconds; nothing was done.
    pub async fn defragment(&self) -> Result<Option<Defragmented>, ReplicaError> {
        let db = self.db.upgrade().ok_or(ReplicaError::Stopped)?;
        let path = self.db_path.clone();
        let done = tokio::task::spawn_blocking(move || db.defragment(&path))
            .await
            .map_err(|_| ReplicaError::Stopped)?
            .map_err(|e| ReplicaError::Defragment(e.to_string()));
        self.quota_size.forget();
        self.quota_in_use.forget();
        done
    }

    /// The data dir: where this member's database file lives (and where a snapshot's temporary
    /// file goes).
    pub fn data_dir(&self) -> &std::path::Path {
        self.db_path.parent().unwrap_or(std::path::Path::new("."))
    }

    /// One consistent view of this member's state as its file holds it (after writing what is
    /// staged), for an export; writes go on while it is read. Its leases' remaining time counts
    /// from this member's lease time now.
    pub async fn view_state(&self) -> Result<crate::StateView, ReplicaError> {
        let db = self.db.upgrade().ok_or(ReplicaError::Stopped)?;
        let lease_time_ms = state_machine::lease_time_now(&self.shared, self.lease_clock.now());
        tokio::task::spawn_blocking(move || crate::StateView::take(&db, lease_time_ms))
            .await
            .map_err(|_| ReplicaError::Stopped)?
            .map_err(|e| ReplicaError::Snapshot(e.to_string()))
    }

    /// Stops Raft and waits (bounded) until the storage tasks have closed the database, so a
    /// new replica can open the same data dir at once.
    pub async fn shutdown(&self) {
        self.stop_waiters();
        let rs = self.engine.clone();
        if tokio::task::spawn_blocking(move || rs.stop())
            .await
            .is_err()
        {
            tracing::warn!("stopping the raft thread panicked");
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

    /// Whether the database is closed (every handle on it dropped, redb's file closed).
    pub fn storage_closed(&self) -> bool {
        self.db_closed.has_changed().is_err()
    }
}

/// The leadership as a member sees it, followed: see [`Replica::subscribe_leadership`].
pub struct LeadershipWatch {
    status: watch::Receiver<EngineStatus>,
    seen: (u64, Option<u64>),
}

impl LeadershipWatch {
    /// Completes once the term or the leader differs from what this watch last saw; `false` if
    /// the member is gone.
    pub async fn changed(&mut self) -> bool {
        loop {
            if self.status.changed().await.is_err() {
                return false;
            }
            let now = {
                let s = self.status.borrow_and_update();
                (s.term, s.leader)
            };
            if now != self.seen {
                self.seen = now;
                return true;
            }
        }
    }
}

/// See [`Replica::subscribe_raft_changes`].
pub struct RaftChanges {
    status: watch::Receiver<EngineStatus>,
}

impl RaftChanges {
    /// Completes at the first change of Raft's state since this watch was made or last
    /// completed, or after `bound` without one (raft-rs's own timers, a leader transfer that
    /// gives up or a leader deposed for want of a quorum, act within an election timeout, and not
    /// every one of them shows in the state). `false` once the member is gone.
    pub async fn next(&mut self, bound: Duration) -> bool {
        match tokio::time::timeout(bound, self.status.changed()).await {
            Ok(Err(_)) => false,
            Ok(Ok(())) | Err(_) => {
                self.status.borrow_and_update();
                true
            }
        }
    }
}

/// Loads the state machine, with this member's token TTL. Blocking.
fn open_state_machine(
    db: Arc<storage::Db>,
    token_ttl: Duration,
) -> Result<StateMachine, StartError> {
    let sm = StateMachine::open(db)?;
    sm.shared()
        .state
        .write()
        .expect("state lock poisoned")
        .tokens
        .set_ttl(token_ttl);
    Ok(sm)
}

#[cfg(test)]
mod quota_size_tests {
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;

    use super::QuotaSize;

    #[test]
    fn a_reading_goes_stale_but_is_kept() {
        let size = QuotaSize::new();
        assert_eq!(size.last(), None, "nothing read yet");
        assert_eq!(size.cached(), None);
        size.record(1000, Duration::from_millis(1));
        assert_eq!(size.last(), Some((1000, true)));
        assert_eq!(size.cached(), Some(1000));
        // Past its freshness: the admission check still has the number, marked stale.
        size.fresh_for_ms.store(0, Relaxed);
        assert_eq!(size.last(), Some((1000, false)));
        assert_eq!(size.cached(), None, "a stale reading is not fresh");
        size.forget();
        assert_eq!(size.last(), None, "a defragment forgets it");
    }

    #[test]
    fn a_slow_reading_stays_fresh_ten_times_as_long() {
        let size = QuotaSize::new();
        size.record(7, Duration::from_secs(2));
        assert_eq!(size.fresh_for_ms.load(Relaxed), 20_000);
        size.record(7, Duration::from_millis(1));
        assert_eq!(
            size.fresh_for_ms.load(Relaxed),
            QuotaSize::FRESH_FOR.as_millis() as u64
        );
    }
}
