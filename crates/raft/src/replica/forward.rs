//! What a follower hands to the leader (writes, read indexes, membership changes), and waiting
//! for the leader's answer without outliving its leadership; and what one member asks of any
//! other: its KV hash (for corruption checks).

use std::time::Duration;

use tokio::sync::watch;

pub use leasehold_consensus::reads::ReadProof;

use super::engine::EngineStatus;
use super::error::ReplicaError;
use crate::command::{Applied, Write};

/// A membership change: etcd's MemberAdd, MemberRemove, MemberPromote and MemberUpdate.
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
    /// New peer URL for a member (its id stays).
    Update {
        id: u64,
        peer_url: String,
    },
}

/// A member's KV hash at a revision, with what etcd's HashKV answer carries beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberHash {
    pub member: u64,
    /// The member's current revision when it hashed (etcd's response header revision).
    pub revision: i64,
    pub compact_revision: i64,
    pub hash: u32,
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
    /// What the follower must have heard from the leader before it reads (`None`: nothing, the
    /// leader being the only voter).
    pub proof: Option<ReadProof>,
}

/// How a follower reaches the leader for what only the leader can do: commit writes and give a
/// read index. The peer transport implements it; a one-member cluster never forwards.
pub trait Forwarder: Send + Sync + 'static {
    /// Has the leader (`leader`, at peer URL `addr`) stamp and commit `writes` as one log
    /// entry.
    fn forward(
        &self,
        leader: u64,
        addr: String,
        writes: Vec<Write>,
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
    /// Asks `member` (at peer URL `addr`, leader or not) for its KV hash at `revision`, as etcd
    /// asks a peer's `/members/hashkv`. `Ok(None)`: it cannot hash that revision (compacted
    /// there, or not applied yet).
    fn hash_kv(
        &self,
        member: u64,
        addr: String,
        revision: i64,
    ) -> BoxFuture<Result<Option<MemberHash>, ReplicaError>>;
}

/// The forwarder of a member without peers.
pub struct NoForwarding;

impl Forwarder for NoForwarding {
    fn forward(
        &self,
        _: u64,
        _: String,
        _: Vec<Write>,
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

    fn hash_kv(
        &self,
        _: u64,
        _: String,
        _: i64,
    ) -> BoxFuture<Result<Option<MemberHash>, ReplicaError>> {
        Box::pin(async { Err(ReplicaError::NoLeader) })
    }
}

/// How long a follower waits to apply what the leader committed for it.
pub(super) const APPLY_WAIT_MAX: Duration = Duration::from_secs(10);

/// The leader and its peer URL, if another member leads.
pub(super) fn leader_elsewhere(
    status: &watch::Receiver<EngineStatus>,
    member_id: u64,
) -> Option<(u64, String)> {
    let status = status.borrow();
    let leader = status.leader.filter(|l| *l != member_id)?;
    let addr = status.peer_url(leader)?.to_owned();
    Some((leader, addr))
}

/// Has the leader commit `writes`. The answer comes before this member has applied them: a
/// caller whose client may read here next waits for that with [`wait_applied`]. Given up with
/// "no leader" as soon as this member learns of another leader (or none): a leader that was
/// cut off may never answer, and the client should retry against the new one at once rather
/// than after a time-out.
pub(super) async fn forward(
    status: &watch::Receiver<EngineStatus>,
    forwarder: &dyn Forwarder,
    leader: u64,
    addr: String,
    writes: Vec<Write>,
) -> Result<Forwarded, ReplicaError> {
    let gone = move |s: &EngineStatus| s.leader != Some(leader);
    unless(
        status,
        gone,
        ReplicaError::NoLeader,
        forwarder.forward(leader, addr, writes),
    )
    .await
}

/// Runs `request`, but gives up with `error` as soon as this member's status meets `over` (or
/// the engine is gone).
pub(super) async fn unless<T>(
    status: &watch::Receiver<EngineStatus>,
    over: impl Fn(&EngineStatus) -> bool,
    error: ReplicaError,
    request: impl std::future::Future<Output = Result<T, ReplicaError>>,
) -> Result<T, ReplicaError> {
    let mut status = status.clone();
    let ended = async move {
        let _ = status.wait_for(over).await;
    };
    tokio::select! {
        result = request => result,
        () = ended => Err(error),
    }
}

/// Waits (at most [`APPLY_WAIT_MAX`]) until this member has applied `index`.
pub(super) async fn wait_applied(
    status: &watch::Receiver<EngineStatus>,
    index: u64,
) -> Result<(), ReplicaError> {
    let mut status = status.clone();
    let applied = status.wait_for(|s| s.applied_index >= index || s.stopped);
    match tokio::time::timeout(APPLY_WAIT_MAX, applied).await {
        Ok(Ok(s)) if s.applied_index >= index => Ok(()),
        Ok(_) => Err(ReplicaError::Stopped),
        Err(_) => Err(ReplicaError::NoLeader),
    }
}
