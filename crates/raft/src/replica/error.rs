//! Why the replica could not serve a request.

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
