//! Why the replica could not serve a request, and why it stopped. openraft's two levels: what
//! the caller handles (no leader, a refused membership change) apart from what ends this member
//! (a [`Fatal`] failure of its Raft core).

use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use openraft::error::{ChangeMembershipError, InitializeError, RaftError};

use crate::storage::{FirstFailure, StorageError};

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
    /// An orderly stop: this process is shutting the member down.
    #[error("raft stopped")]
    Stopped,
    /// The Raft core stopped on its own, with why: this member serves nothing more.
    #[error("raft core failed: {0}")]
    Fatal(Fatal),
    /// openraft refused a membership change (one is in progress, it would leave no voter, the
    /// member to promote is unknown).
    #[error(transparent)]
    MembershipChange(ChangeMembershipError<u64>),
    /// A membership change refused by etcd's rules, before openraft saw it.
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
    /// What the engine this member runs cannot do yet (the raft-rs engine while it is
    /// experimental).
    #[error("not supported by this member's raft engine: {0}")]
    Unsupported(String),
}

/// Why this member's Raft core stopped on its own (openraft's `Fatal`, apart from the orderly
/// `Stopped`). Whoever runs the member should end the process; a restart recovers from the log.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Fatal {
    /// A storage failure, as this crate saw it: what failed and the source error.
    #[error(transparent)]
    Storage(Arc<StorageError>),
    /// A storage failure openraft reported that this crate did not build (its own checks).
    #[error(transparent)]
    Raft(Box<openraft::StorageError<u64>>),
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

impl FirstFailure {
    /// What openraft's `Fatal` means here: `None` for an orderly stop, else the fatal reason,
    /// with the typed storage failure when this crate recorded one.
    pub(crate) fn explain(&self, fatal: &openraft::error::Fatal<u64>) -> Option<Fatal> {
        match fatal {
            openraft::error::Fatal::Stopped => None,
            openraft::error::Fatal::Panicked => Some(Fatal::Panicked),
            openraft::error::Fatal::StorageError(e) => Some(match self.get() {
                Some(typed) => Fatal::Storage(typed),
                None => Fatal::Raft(Box::new(e.clone())),
            }),
        }
    }

    /// A request's error when Raft answered it with `Fatal`.
    pub(crate) fn replica_error(&self, fatal: &openraft::error::Fatal<u64>) -> ReplicaError {
        self.explain(fatal)
            .map_or(ReplicaError::Stopped, ReplicaError::Fatal)
    }

    /// A request's error from a failed membership change or write.
    pub(crate) fn client_write_error(
        &self,
        e: RaftError<u64, openraft::error::ClientWriteError<u64, BasicNode>>,
    ) -> ReplicaError {
        use openraft::error::ClientWriteError;
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => ReplicaError::NoLeader,
            RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
                ReplicaError::MembershipChange(e)
            }
            RaftError::Fatal(fatal) => self.replica_error(&fatal),
        }
    }
}

/// [`ReplicaError`] as a leader sends it to a follower (postcard: the variant's index, then its
/// fields; keep the order). A leader's `Fatal` reaches the follower as `Stopped`: the leader has
/// stopped, the follower has not, and the typed reason (with its source error) stays with the
/// member whose storage failed.
#[derive(serde::Serialize, serde::Deserialize)]
enum WireError {
    NoLeader,
    Stopped,
    MembershipChange(ChangeMembershipError<u64>),
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
    Unsupported(String),
}

impl From<ReplicaError> for WireError {
    fn from(e: ReplicaError) -> WireError {
        match e {
            ReplicaError::NoLeader => WireError::NoLeader,
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
            ReplicaError::Unsupported(e) => WireError::Unsupported(e),
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
            WireError::Unsupported(e) => ReplicaError::Unsupported(e),
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
}

/// Why [`crate::Replica::start`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Opening or loading the data dir.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The Raft settings are inconsistent (e.g. a heartbeat not below the election timeout).
    #[error("raft config: {0}")]
    Config(#[from] openraft::ConfigError),
    /// The Raft core could not start, or stopped while starting.
    #[error("starting raft: {0}")]
    Raft(#[from] openraft::error::Fatal<u64>),
    /// Bootstrapping the initial membership.
    #[error("bootstrapping the cluster: {0}")]
    Initialize(#[from] RaftError<u64, InitializeError<u64, BasicNode>>),
    /// The raft-rs core could not open its log or start.
    #[error("starting raft: {0}")]
    Core(String),
    /// A single new member did not come to lead within the bound.
    #[error("no leadership within {0:?}")]
    NoLeadership(Duration),
}
