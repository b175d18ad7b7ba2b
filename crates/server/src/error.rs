//! The one place where errors become gRPC statuses, with etcd's exact codes and messages
//! (etcd's `api/v3rpc/rpctypes`). Every match is exhaustive: a new error variant does not compile
//! until it has its status.

use leasehold_mvcc as mvcc;
use leasehold_raft::{Applied, LeaseError, MembershipError, ReplicaError};
use tonic::{Code, Status};

/// Everything a client request can fail with at the gRPC edge.
#[derive(Debug)]
#[non_exhaustive]
pub enum ApiError {
    /// Rejected by validation before reaching the log.
    Invalid(Invalid),
    /// Refused by the store when applied (or read).
    Mvcc(mvcc::Error),
    Replica(ReplicaError),
    Lease(LeaseError),
    /// A lease TTL above etcd's maximum (9e9 s).
    LeaseTtlTooLarge,
    /// The state machine answered a command with another command's reply: a bug, not a request
    /// problem.
    UnexpectedReply(String),
    /// Bigger than the transport accepts: grpc-go's check, with its message.
    MessageTooLarge {
        len: usize,
        max: usize,
    },
}

/// Request validation failures (etcd's `v3rpc/key.go` checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    EmptyKey,
    ValueProvided,
    LeaseProvided,
    TooManyOps,
    DuplicateKey,
    /// An empty `RequestOp` in a txn; etcd answers this with "key not found".
    EmptyOp,
    SortOption,
    RequestTooLarge,
}

impl From<mvcc::Error> for ApiError {
    fn from(e: mvcc::Error) -> Self {
        ApiError::Mvcc(e)
    }
}

impl From<ReplicaError> for ApiError {
    fn from(e: ReplicaError) -> Self {
        ApiError::Replica(e)
    }
}

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> Self {
        ApiError::Lease(e)
    }
}

impl ApiError {
    pub fn unexpected(applied: &Applied) -> ApiError {
        ApiError::UnexpectedReply(format!("{applied:?}"))
    }
}

impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        ApiError::Invalid(e)
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        match e {
            ApiError::Invalid(i) => {
                let msg = match i {
                    Invalid::EmptyKey => "etcdserver: key is not provided",
                    Invalid::ValueProvided => "etcdserver: value is provided",
                    Invalid::LeaseProvided => "etcdserver: lease is provided",
                    Invalid::TooManyOps => "etcdserver: too many operations in txn request",
                    Invalid::DuplicateKey => "etcdserver: duplicate key given in txn request",
                    Invalid::EmptyOp => "etcdserver: key not found",
                    Invalid::SortOption => "etcdserver: invalid sort option",
                    Invalid::RequestTooLarge => "etcdserver: request is too large",
                };
                Status::new(Code::InvalidArgument, msg)
            }
            ApiError::Mvcc(m) => match m {
                mvcc::Error::Compacted => Status::new(
                    Code::OutOfRange,
                    "etcdserver: mvcc: required revision has been compacted",
                ),
                mvcc::Error::FutureRevision => Status::new(
                    Code::OutOfRange,
                    "etcdserver: mvcc: required revision is a future revision",
                ),
                mvcc::Error::KeyNotFound => {
                    Status::new(Code::InvalidArgument, "etcdserver: key not found")
                }
                mvcc::Error::LeaseNotFound => {
                    Status::new(Code::NotFound, "etcdserver: requested lease not found")
                }
            },
            ApiError::Replica(r) => match r {
                ReplicaError::NoLeader => Status::new(Code::Unavailable, "etcdserver: no leader"),
                ReplicaError::Stopped => {
                    Status::new(Code::Unavailable, "etcdserver: server stopped")
                }
                // The member is going down (the binary exits on `Replica::failed`); to the client
                // it has stopped, as a member that shuts down has.
                ReplicaError::Fatal(fatal) => {
                    tracing::error!("a request found the raft core failed: {fatal}");
                    Status::new(Code::Unavailable, "etcdserver: server stopped")
                }
                ReplicaError::MembershipChange(e) => {
                    tracing::warn!("raft refused a membership change: {e}");
                    Status::new(Code::Internal, format!("etcdserver: {e}"))
                }
                ReplicaError::BadAnswer(e) => {
                    tracing::error!(
                        "the leader's answer to a forwarded request did not decode: {e}"
                    );
                    Status::new(
                        Code::Internal,
                        format!("etcdserver: undecodable answer from the leader: {e}"),
                    )
                }
                ReplicaError::Membership(m) => {
                    let code = match m {
                        MembershipError::NotFound => Code::NotFound,
                        MembershipError::IdExists
                        | MembershipError::PeerUrlExists
                        | MembershipError::NotLearner => Code::FailedPrecondition,
                    };
                    Status::new(code, m.to_string())
                }
            },
            ApiError::Lease(l) => match l {
                LeaseError::NotFound => {
                    Status::new(Code::NotFound, "etcdserver: requested lease not found")
                }
                LeaseError::Exists => {
                    Status::new(Code::FailedPrecondition, "etcdserver: lease already exists")
                }
            },
            ApiError::LeaseTtlTooLarge => {
                Status::new(Code::OutOfRange, "etcdserver: too large lease TTL")
            }
            ApiError::UnexpectedReply(reply) => {
                tracing::error!("state machine answered with the wrong reply kind: {reply}");
                Status::new(Code::Internal, "etcdserver: unexpected apply result")
            }
            ApiError::MessageTooLarge { len, max } => Status::new(
                Code::ResourceExhausted,
                format!("grpc: received message larger than max ({len} vs. {max})"),
            ),
        }
    }
}
