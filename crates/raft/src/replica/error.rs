//! Why the replica could not serve a request, and why it stopped: what the caller handles (no
//! leader, a refused membership change) apart from what ends this member (a [`Fatal`] failure
//! of its Raft core).

use std::sync::Arc;
use std::time::Duration;

use crate::storage::StorageError;

/// Why a request could not be served. `NoLeader` is transient (clients retry it); a
/// `MembershipChange` or `Membership` refusal is the caller's; `Stopped` (this process shuts
/// the member down) and `Fatal` (its Raft core stopped on its own) mean this member cannot serve
/// any more.
///
/// Not `#[non_exhaustive]`: the server matches it exhaustively to give each case etcd's status.
/// On the wire (a leader answering a follower's forwarded request) it travels as [`WireError`].
#[derive(Clone, Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(into = "WireError", from = "WireError")]
pub enum ReplicaError {
    #[error("no leader")]
    NoLeader,
    /// The leader could not be reached, and the request was never handed to it: sending it
    /// again cannot apply it twice. A client write waits for the next leader and goes again
    /// (`Replica::write`); whatever gives up on it answers as for `NoLeader`.
    #[error("the leader could not be reached")]
    LeaderUnreachable,
    /// The leader changed while a linearizable read waited for its read index (etcd's
    /// `ErrLeaderChanged`): a member cut off from its leader loses it, a leader cut off from its
    /// quorum steps down. The client reads again.
    #[error("leader changed")]
    LeaderChanged,
    /// An orderly stop: this process is shutting the member down.
    #[error("raft stopped")]
    Stopped,
    /// The Raft core stopped on its own, with why: this member serves nothing more.
    #[error("raft core failed: {0}")]
    Fatal(Fatal),
    /// Raft refused a membership change (another one is in progress): why.
    #[error("{0}")]
    MembershipChange(String),
    /// A membership change refused by etcd's rules, before Raft saw it.
    #[error(transparent)]
    Membership(#[from] MembershipError),
    /// The auth store refused the request (when applied, or at the edge).
    #[error(transparent)]
    Auth(#[from] leasehold_auth::AuthError),
    /// NOSPACE is raised, or this write would take the file past its quota.
    #[error("database space exceeded")]
    NoSpace,
    /// CORRUPT is raised: no write is taken.
    #[error("corrupt cluster")]
    Corrupt,
    /// Compacting the database file failed: the storage error's text.
    #[error("defragment: {0}")]
    Defragment(String),
    /// Reading the state for a snapshot failed: the storage error's text.
    #[error("snapshot: {0}")]
    Snapshot(String),
    /// Only the leader hands leadership on.
    #[error("not leader")]
    NotLeader,
    /// The member asked to lead is not a voter of this cluster.
    #[error("bad leader transferee")]
    BadLeaderTransferee,
    /// The transferee did not take over in time.
    #[error("leader transfer took too long")]
    LeaderTransferTimeout,
    /// The leader's answer to a forwarded request did not decode (members of different builds).
    #[error("undecodable answer from the leader: {0}")]
    BadAnswer(postcard::Error),
    /// Applying a request produced another request's reply: a broken state machine, never the
    /// client's doing. Found in one place, [`crate::Replica::propose`].
    #[error("the state machine answered with another command's reply: {0}")]
    WrongReply(String),
}

/// Why this member's Raft core stopped on its own (apart from the orderly `Stopped`). Whoever runs the member should end the process; a restart recovers from the log.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Fatal {
    /// A storage failure, as this crate saw it: what failed and the source error.
    #[error(transparent)]
    Storage(Arc<StorageError>),
    /// The Raft core panicked.
    #[error("the raft core panicked")]
    Panicked,
    /// The Raft core exited without saying why.
    #[error("the raft core exited")]
    Exited,
    /// The raft-rs core stopped: its log could not be written, or a snapshot not installed.
    #[error("the raft core stopped: {0}")]
    Core(String),
}

/// [`ReplicaError`] as a leader sends it to a follower (postcard: the variant's index, then its
/// fields; keep the order). A leader's `Fatal` reaches the follower as `Stopped`: the leader has
/// stopped, the follower has not, and the typed reason (with its source error) stays with the
/// member whose storage failed.
#[derive(serde::Serialize, serde::Deserialize)]
enum WireError {
    NoLeader,
    Stopped,
    MembershipChange(String),
    Membership(MembershipError),
    BadAnswer(postcard::Error),
    WrongReply(String),
    Defragment(String),
    NoSpace,
    Corrupt,
    Auth(leasehold_auth::AuthError),
    Snapshot(String),
    NotLeader,
    BadLeaderTransferee,
    LeaderTransferTimeout,
    LeaderChanged,
}

impl From<ReplicaError> for WireError {
    fn from(e: ReplicaError) -> WireError {
        match e {
            ReplicaError::NoLeader | ReplicaError::LeaderUnreachable => WireError::NoLeader,
            ReplicaError::Stopped | ReplicaError::Fatal(_) => WireError::Stopped,
            ReplicaError::MembershipChange(e) => WireError::MembershipChange(e),
            ReplicaError::Membership(e) => WireError::Membership(e),
            ReplicaError::BadAnswer(e) => WireError::BadAnswer(e),
            ReplicaError::WrongReply(e) => WireError::WrongReply(e),
            ReplicaError::Defragment(e) => WireError::Defragment(e),
            ReplicaError::NoSpace => WireError::NoSpace,
            ReplicaError::Corrupt => WireError::Corrupt,
            ReplicaError::Auth(e) => WireError::Auth(e),
            ReplicaError::Snapshot(e) => WireError::Snapshot(e),
            ReplicaError::NotLeader => WireError::NotLeader,
            ReplicaError::BadLeaderTransferee => WireError::BadLeaderTransferee,
            ReplicaError::LeaderTransferTimeout => WireError::LeaderTransferTimeout,
            ReplicaError::LeaderChanged => WireError::LeaderChanged,
        }
    }
}

impl From<WireError> for ReplicaError {
    fn from(e: WireError) -> ReplicaError {
        match e {
            WireError::NoLeader => ReplicaError::NoLeader,
            WireError::Stopped => ReplicaError::Stopped,
            WireError::MembershipChange(e) => ReplicaError::MembershipChange(e),
            WireError::Membership(e) => ReplicaError::Membership(e),
            WireError::BadAnswer(e) => ReplicaError::BadAnswer(e),
            WireError::WrongReply(e) => ReplicaError::WrongReply(e),
            WireError::Defragment(e) => ReplicaError::Defragment(e),
            WireError::NoSpace => ReplicaError::NoSpace,
            WireError::Corrupt => ReplicaError::Corrupt,
            WireError::Auth(e) => ReplicaError::Auth(e),
            WireError::Snapshot(e) => ReplicaError::Snapshot(e),
            WireError::NotLeader => ReplicaError::NotLeader,
            WireError::BadLeaderTransferee => ReplicaError::BadLeaderTransferee,
            WireError::LeaderTransferTimeout => ReplicaError::LeaderTransferTimeout,
            WireError::LeaderChanged => ReplicaError::LeaderChanged,
        }
    }
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
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    NotEnoughStarted,
    #[error("etcdserver: unhealthy cluster")]
    Unhealthy,
}

impl From<crate::steps::NotTimingLeases> for ReplicaError {
    fn from(_: crate::steps::NotTimingLeases) -> ReplicaError {
        // The callers go again, to the leader once one times leases.
        ReplicaError::NoLeader
    }
}

impl From<crate::steps::reconfig::ReconfigRefusal> for MembershipError {
    fn from(r: crate::steps::reconfig::ReconfigRefusal) -> MembershipError {
        match r {
            crate::steps::reconfig::ReconfigRefusal::NotEnoughStarted => {
                MembershipError::NotEnoughStarted
            }
            crate::steps::reconfig::ReconfigRefusal::Unhealthy => MembershipError::Unhealthy,
        }
    }
}

/// Why [`crate::Replica::start`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Opening or loading the data dir.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The Raft core could not open its log or start.
    #[error("starting raft: {0}")]
    Core(String),
    /// A single new member did not come to lead within the bound.
    #[error("no leadership within {0:?}")]
    NoLeadership(Duration),
}
