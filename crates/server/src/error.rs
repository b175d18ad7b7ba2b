//! The one place where errors become gRPC statuses, with etcd's exact codes and messages
//! (etcd's `api/v3rpc/rpctypes`). Every match is exhaustive: a new error variant does not compile
//! until it has its status.

use leasehold_auth::AuthError;
use leasehold_mvcc as mvcc;
use leasehold_raft::{LeaseError, MembershipError, ReplicaError};
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
    /// Bigger than the transport accepts: grpc-go's check, with its message.
    MessageTooLarge {
        len: usize,
        max: usize,
    },
    /// MemberAdd with a peer URL that is not `http(s)://host:port`.
    BadPeerUrls,
    /// A request leasehold does not serve (yet).
    Unimplemented(Unimplemented),
    /// Refused by the auth store.
    Auth(AuthError),
}

/// What leasehold answers `Unimplemented`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unimplemented {
    /// A gRPC method no service here has (tonic answers the same, with an empty message).
    UnknownMethod,
}

/// The lock (v3lock) and election (v3election) services, which word an expired session each
/// their own way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    Lock,
    Election,
}

/// Why a lock or election call failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RecipeError {
    /// A step failed as a KV or lease request would.
    Api(ApiError),
    /// The caller's key or lease went away before it could be told it owns the name.
    SessionExpired(Recipe),
    /// Proclaim (or a campaign with a new value) by a caller whose key is no longer the one it
    /// campaigned with.
    NotLeader,
    /// Leader: nobody is campaigning.
    NoLeader,
    /// Proclaim or Resign without a leader key.
    LeaderMissing,
}

impl From<ApiError> for RecipeError {
    fn from(e: ApiError) -> Self {
        RecipeError::Api(e)
    }
}

impl From<ReplicaError> for RecipeError {
    fn from(e: ReplicaError) -> Self {
        RecipeError::Api(e.into())
    }
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

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        ApiError::Auth(e)
    }
}

/// etcd's status for an auth error (`rpctypes`).
fn auth_status(e: AuthError) -> Status {
    use AuthError::*;
    let code = match e {
        RootUserNotExist | RootRoleNotExist | UserAlreadyExist | UserNotFound
        | RoleAlreadyExist | RoleNotFound | RoleNotGranted | PermissionNotGranted
        | AuthNotEnabled => Code::FailedPrecondition,
        UserEmpty | RoleEmpty | AuthFailed | InvalidAuthMgmt | AuthOldRevision => {
            Code::InvalidArgument
        }
        PermissionDenied => Code::PermissionDenied,
        LeaseNotFound => Code::NotFound,
        InvalidAuthToken => Code::Unauthenticated,
        NoPasswordUser => Code::Unknown,
    };
    Status::new(code, e.to_string())
}

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> Self {
        ApiError::Lease(e)
    }
}

impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        ApiError::Invalid(e)
    }
}

impl From<Unimplemented> for ApiError {
    fn from(e: Unimplemented) -> Self {
        ApiError::Unimplemented(e)
    }
}

impl From<RecipeError> for Status {
    fn from(e: RecipeError) -> Status {
        match e {
            // etcd's lock and election servers run their steps through an in-process client and
            // return its errors as plain errors: code Unknown with the message. Transient faults
            // keep Unavailable, so that clients retry.
            RecipeError::Api(e) => {
                let status = Status::from(e);
                match status.code() {
                    Code::Unavailable => status,
                    _ => Status::new(Code::Unknown, status.message()),
                }
            }
            RecipeError::SessionExpired(Recipe::Lock) => {
                Status::new(Code::Unknown, "mutex: session is expired")
            }
            // etcd 3.4 answers success here (etcd#11007); leasehold tells the campaigner.
            RecipeError::SessionExpired(Recipe::Election) => {
                Status::new(Code::Unknown, "election: session is expired")
            }
            RecipeError::NotLeader => Status::new(Code::Unknown, "election: not leader"),
            RecipeError::NoLeader => Status::new(Code::Unknown, "election: no leader"),
            RecipeError::LeaderMissing => {
                Status::new(Code::Unknown, "\"leader\" field must be provided")
            }
        }
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
                // The member's own file failed a read: no client caused it, and etcd has no
                // answer for it (it panics); the member stops.
                unreadable @ mvcc::Error::Unreadable(_) => {
                    Status::new(Code::Internal, unreadable.to_string())
                }
            },
            ApiError::Auth(e) => auth_status(e),
            ApiError::Replica(r) => match r {
                ReplicaError::Auth(e) => auth_status(e),
                ReplicaError::NoLeader | ReplicaError::LeaderUnreachable => {
                    Status::new(Code::Unavailable, "etcdserver: no leader")
                }
                ReplicaError::LeaderChanged => {
                    Status::new(Code::Unavailable, "etcdserver: leader changed")
                }
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
                ReplicaError::NoSpace => Status::new(
                    Code::ResourceExhausted,
                    "etcdserver: mvcc: database space exceeded",
                ),
                ReplicaError::Corrupt => Status::new(Code::DataLoss, "etcdserver: corrupt cluster"),
                // As grpc-go answers an error that is not a status (etcd returns bbolt's).
                ReplicaError::Defragment(e) => {
                    Status::new(Code::Unknown, format!("defragment: {e}"))
                }
                ReplicaError::Snapshot(e) => Status::new(Code::Unknown, format!("snapshot: {e}")),
                ReplicaError::NotLeader => {
                    Status::new(Code::FailedPrecondition, "etcdserver: not leader")
                }
                ReplicaError::BadLeaderTransferee => Status::new(
                    Code::FailedPrecondition,
                    "etcdserver: bad leader transferee",
                ),
                ReplicaError::LeaderTransferTimeout => Status::new(
                    Code::DeadlineExceeded,
                    "etcdserver: request timed out, leader transfer took too long",
                ),
                ReplicaError::WrongReply(reply) => {
                    tracing::error!("state machine answered with the wrong reply kind: {reply}");
                    Status::new(Code::Internal, "etcdserver: unexpected apply result")
                }
                ReplicaError::Membership(m) => {
                    let code = match m {
                        MembershipError::NotFound => Code::NotFound,
                        MembershipError::IdExists
                        | MembershipError::PeerUrlExists
                        | MembershipError::NotLearner
                        | MembershipError::LearnerNotReady
                        | MembershipError::NotEnoughStarted => Code::FailedPrecondition,
                        MembershipError::Unhealthy => Code::Unavailable,
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
            ApiError::MessageTooLarge { len, max } => Status::new(
                Code::ResourceExhausted,
                format!("grpc: received message larger than max ({len} vs. {max})"),
            ),
            ApiError::BadPeerUrls => Status::new(
                Code::InvalidArgument,
                "etcdserver: given member URLs are invalid",
            ),
            ApiError::Unimplemented(u) => {
                let msg = match u {
                    Unimplemented::UnknownMethod => "",
                };
                Status::new(Code::Unimplemented, msg)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_raft::Fatal;

    /// One status per error: etcd's code and message, byte for byte (the differential tests in
    /// crates/leasehold compare them with a real etcd).
    fn check(status: impl Into<Status>, code: Code, message: &str) {
        let status = status.into();
        assert_eq!(
            (status.code(), status.message()),
            (code, message),
            "{status:?}"
        );
    }

    fn api(e: impl Into<ApiError>, code: Code, message: &str) {
        check(e.into(), code, message);
    }

    #[test]
    fn every_api_error_has_etcds_status() {
        use Code::*;
        let invalid = [
            (Invalid::EmptyKey, "etcdserver: key is not provided"),
            (Invalid::ValueProvided, "etcdserver: value is provided"),
            (Invalid::LeaseProvided, "etcdserver: lease is provided"),
            (
                Invalid::TooManyOps,
                "etcdserver: too many operations in txn request",
            ),
            (
                Invalid::DuplicateKey,
                "etcdserver: duplicate key given in txn request",
            ),
            (Invalid::EmptyOp, "etcdserver: key not found"),
            (Invalid::SortOption, "etcdserver: invalid sort option"),
            (Invalid::RequestTooLarge, "etcdserver: request is too large"),
        ];
        for (e, message) in invalid {
            api(e, InvalidArgument, message);
        }
        let compacted = "etcdserver: mvcc: required revision has been compacted";
        api(mvcc::Error::Compacted, OutOfRange, compacted);
        let future = "etcdserver: mvcc: required revision is a future revision";
        api(mvcc::Error::FutureRevision, OutOfRange, future);
        api(
            mvcc::Error::KeyNotFound,
            InvalidArgument,
            "etcdserver: key not found",
        );
        let no_lease = "etcdserver: requested lease not found";
        api(mvcc::Error::LeaseNotFound, NotFound, no_lease);

        api(ReplicaError::NoLeader, Unavailable, "etcdserver: no leader");
        api(
            ReplicaError::LeaderChanged,
            Unavailable,
            "etcdserver: leader changed",
        );
        api(
            ReplicaError::Stopped,
            Unavailable,
            "etcdserver: server stopped",
        );
        let fatal = ReplicaError::Fatal(Fatal::Panicked);
        api(fatal, Unavailable, "etcdserver: server stopped");
        let refused = "a membership change is already in progress";
        api(
            ReplicaError::MembershipChange(refused.to_owned()),
            Internal,
            &format!("etcdserver: {refused}"),
        );
        let garbage = postcard::from_bytes::<bool>(&[7]).unwrap_err();
        let bad_answer = format!("etcdserver: undecodable answer from the leader: {garbage}");
        api(ReplicaError::BadAnswer(garbage), Internal, &bad_answer);
        let membership = [
            (
                MembershipError::NotFound,
                NotFound,
                "etcdserver: member not found",
            ),
            (
                MembershipError::IdExists,
                FailedPrecondition,
                "etcdserver: member ID already exist",
            ),
            (
                MembershipError::PeerUrlExists,
                FailedPrecondition,
                "etcdserver: Peer URLs already exists",
            ),
            (
                MembershipError::NotLearner,
                FailedPrecondition,
                "etcdserver: can only promote a learner member",
            ),
            (
                MembershipError::LearnerNotReady,
                FailedPrecondition,
                "etcdserver: can only promote a learner member which is in sync with leader",
            ),
            (
                MembershipError::NotEnoughStarted,
                FailedPrecondition,
                "etcdserver: re-configuration failed due to not enough started members",
            ),
            (
                MembershipError::Unhealthy,
                Unavailable,
                "etcdserver: unhealthy cluster",
            ),
        ];
        for (e, code, message) in membership {
            api(ReplicaError::Membership(e), code, message);
        }

        api(LeaseError::NotFound, NotFound, no_lease);
        let exists = "etcdserver: lease already exists";
        api(LeaseError::Exists, FailedPrecondition, exists);
        api(
            ApiError::LeaseTtlTooLarge,
            OutOfRange,
            "etcdserver: too large lease TTL",
        );
        let no_space = "etcdserver: mvcc: database space exceeded";
        api(ReplicaError::NoSpace, ResourceExhausted, no_space);
        api(
            ReplicaError::Corrupt,
            DataLoss,
            "etcdserver: corrupt cluster",
        );
        let unexpected = ApiError::from(ReplicaError::WrongReply("LeaseTick".into()));
        api(unexpected, Internal, "etcdserver: unexpected apply result");
        let too_large = ApiError::MessageTooLarge { len: 9, max: 4 };
        let too_large_message = "grpc: received message larger than max (9 vs. 4)";
        api(too_large, ResourceExhausted, too_large_message);
        let bad_urls = "etcdserver: given member URLs are invalid";
        api(ApiError::BadPeerUrls, InvalidArgument, bad_urls);
        api(super::Unimplemented::UnknownMethod, Code::Unimplemented, "");
    }

    #[test]
    fn lock_and_election_errors_are_unknown_except_transient_ones() {
        use Code::*;
        let recipe = |e: RecipeError, code, message: &str| check(e, code, message);
        // An Unlock without a key: the KV check's message, as a plain error.
        let no_key = ApiError::from(Invalid::EmptyKey);
        recipe(no_key.into(), Unknown, "etcdserver: key is not provided");
        let no_lease = ApiError::from(LeaseError::NotFound);
        recipe(
            no_lease.into(),
            Unknown,
            "etcdserver: requested lease not found",
        );
        let no_leader = RecipeError::from(ReplicaError::NoLeader);
        recipe(no_leader, Unavailable, "etcdserver: no leader");
        let stopped = RecipeError::from(ReplicaError::Stopped);
        recipe(stopped, Unavailable, "etcdserver: server stopped");
        let lock_expired = RecipeError::SessionExpired(Recipe::Lock);
        recipe(lock_expired, Unknown, "mutex: session is expired");
        let election_expired = RecipeError::SessionExpired(Recipe::Election);
        recipe(election_expired, Unknown, "election: session is expired");
        recipe(RecipeError::NotLeader, Unknown, "election: not leader");
        recipe(RecipeError::NoLeader, Unknown, "election: no leader");
        let missing = "\"leader\" field must be provided";
        recipe(RecipeError::LeaderMissing, Unknown, missing);
    }
}
