//! The replicated command: what a client write becomes in the Raft log, and what applying it
//! returns. Everything nondeterministic is decided before proposing, so that applying an entry is
//! a pure function of the state and the entry, identical on every member.
//!
//! Two types keep apart what a client asks for and what the log holds:
//! - a [`Write`] is a client write as proposed, on any member: it carries no time;
//! - a [`Command`] is a log entry's command: the member that commits a batch (the leader) turns
//!   each `Write` into one with [`Write::stamp`], giving grants and renewals its lease time.
//!   Leader-only commands (expiry, ticks, promotion) are built stamped.
//!
//! Proposing is typed: each request type ([`Compact`], [`LeaseGrant`], ..., and mvcc's put,
//! delete and txn requests) names its reply type through [`Propose`], so a caller gets its own
//! reply and never sees another command's.

use leasehold_auth::{AuthChange, AuthError, Caller};
use leasehold_lease::{LeaseError, LeaseId};
use leasehold_mvcc as mvcc;
use serde::{Deserialize, Serialize};

/// One log entry: the client writes that arrived together, applied in order, each at its own
/// revision. Batching them is what lets concurrent writers share one fsync (group commit).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub commands: Vec<Command>,
}

/// A client write as proposed: what a follower forwards to the leader, unstamped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Write {
    Put(mvcc::PutRequest),
    DeleteRange(mvcc::DeleteRangeRequest),
    Txn(mvcc::TxnRequest),
    Compact(Compact),
    LeaseGrant(LeaseGrant),
    LeaseRevoke(LeaseRevoke),
    LeaseRenew(LeaseRenew),
    Alarm(AlarmChange),
    Publish(MemberAttrs),
    /// A change to the auth store, by the caller the edge resolved.
    Auth(AuthWrite),
    /// A token for a user whose password the edge checked (etcd's Authenticate).
    Authenticate(Authenticate),
    /// A client write on behalf of a user (auth is on): applied only if the user's permissions,
    /// as of when the edge looked them up, still allow it when it is applied.
    As {
        caller: Caller,
        write: Box<Write>,
    },
}

/// A change to the auth store and who asked for it (`None`: no token).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthWrite {
    pub caller: Option<Caller>,
    pub change: AuthChange,
}

/// Registers a simple token `<prefix>.<log index>` for `user` on every member, if the auth store
/// is still at `revision` (the one the password was checked against).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authenticate {
    pub user: String,
    pub prefix: String,
    pub revision: u64,
}

/// What a member publishes about itself through the log when it starts (etcd's `publish`): its
/// name and client URLs, so that every member lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberAttrs {
    pub id: u64,
    pub name: String,
    pub client_urls: Vec<String>,
}

/// Compacts history up to `revision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compact {
    pub revision: i64,
}

/// Grants a lease with a validated, clamped TTL and an id chosen before proposing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    pub id: LeaseId,
    pub ttl_secs: i64,
}

/// Revokes a lease and deletes its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRevoke {
    pub id: LeaseId,
}

/// A keepalive: the lease's deadline becomes the leader's lease time + its TTL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRenew {
    pub id: LeaseId,
}

/// etcd's alarm types that can be raised (`NONE` only filters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Alarm {
    /// The database file passed `--quota-backend-bytes`: writes that add data are refused.
    NoSpace,
    /// A member's data was found corrupt: every write is refused.
    Corrupt,
}

/// An alarm raised for one member, as etcd lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AlarmMember {
    pub member: u64,
    pub alarm: Alarm,
}

/// Raises (`activate`) or clears an alarm for a member, through the log, so that every member
/// holds the same alarms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlarmChange {
    pub activate: bool,
    pub alarm: AlarmMember,
}

impl Write {
    /// Whether committing it needs the leader's lease time (grants and renewals).
    pub fn is_lease_timed(&self) -> bool {
        match self {
            Write::As { write, .. } => write.is_lease_timed(),
            _ => matches!(self, Write::LeaseGrant(_) | Write::LeaseRenew(_)),
        }
    }

    /// Whether it adds data (etcd's quota cost is not zero): a put, a txn with a put in either
    /// branch (nested ones too), a lease grant. These are refused while NOSPACE is raised.
    pub fn adds_data(&self) -> bool {
        if let Write::As { write, .. } = self {
            return write.adds_data();
        }
        fn txn_puts(t: &mvcc::TxnRequest) -> bool {
            t.success.iter().chain(&t.failure).any(|op| match op {
                mvcc::RequestOp::Put(_) => true,
                mvcc::RequestOp::Txn(nested) => txn_puts(nested),
                mvcc::RequestOp::Range(_) | mvcc::RequestOp::DeleteRange(_) => false,
            })
        }
        match self {
            Write::Put(_) | Write::LeaseGrant(_) => true,
            Write::Txn(t) => txn_puts(t),
            Write::DeleteRange(_)
            | Write::Compact(_)
            | Write::LeaseRevoke(_)
            | Write::LeaseRenew(_)
            | Write::Alarm(_)
            | Write::Publish(_)
            | Write::Auth(_)
            | Write::Authenticate(_)
            | Write::As { .. } => false,
        }
    }

    /// Whether it is refused while CORRUPT is raised: every KV and lease write but renewals
    /// (etcd's corrupt applier; keepalives do not go through it).
    pub fn refused_when_corrupt(&self) -> bool {
        match self {
            Write::As { write, .. } => write.refused_when_corrupt(),
            Write::LeaseRenew(_)
            | Write::Alarm(_)
            | Write::Publish(_)
            | Write::Auth(_)
            | Write::Authenticate(_) => false,
            _ => true,
        }
    }

    /// Whether a follower may answer it as soon as the leader has committed it, before applying
    /// it itself (unless the leader's answer says the renewal found no live lease: it may have
    /// revoked it, see `batch::answer_forwarded`). True of renewals only: a renewal changes nothing a client reads from this
    /// member's own state (lease time and deadlines are read through the leader, after a read
    /// index that covers the renewal), and the leader's answer already says what it did. Any
    /// other write is answered after this member applies it, so that a serializable read here
    /// afterwards sees it, as etcd's followers do.
    pub fn answered_at_commit(&self) -> bool {
        match self {
            Write::As { write, .. } => write.answered_at_commit(),
            _ => matches!(self, Write::LeaseRenew(_)),
        }
    }

    /// The log command, with `now_ms` (the committing leader's lease time) on grants and
    /// renewals; a renewal covers `margin_ms` beyond the deadline it gives (docs/lease.md).
    pub fn stamp(self, now_ms: u64, margin_ms: u64) -> Command {
        match self {
            Write::Put(p) => Command::Put(p),
            Write::DeleteRange(d) => Command::DeleteRange(d),
            Write::Txn(t) => Command::Txn(t),
            Write::Compact(Compact { revision }) => Command::Compact { revision },
            Write::LeaseGrant(LeaseGrant { id, ttl_secs }) => Command::LeaseGrant {
                id,
                ttl_secs,
                now_ms,
            },
            Write::LeaseRevoke(LeaseRevoke { id }) => Command::LeaseRevoke { id },
            Write::LeaseRenew(LeaseRenew { id }) => Command::LeaseCover {
                id,
                now_ms,
                margin_ms,
            },
            Write::Alarm(change) => Command::Alarm(change),
            Write::Publish(attrs) => Command::Publish(attrs),
            Write::Auth(auth) => Command::Auth(auth),
            Write::Authenticate(a) => Command::Authenticate(a),
            Write::As { caller, write } => Command::As {
                caller,
                command: Box::new(write.stamp(now_ms, margin_ms)),
            },
        }
    }

    /// Roughly the bytes this write adds to a log entry: what batch sizes are bounded by.
    pub fn approx_bytes(&self) -> usize {
        fn op(o: &mvcc::RequestOp) -> usize {
            match o {
                mvcc::RequestOp::Range(r) => r.key.len() + r.range_end.len() + 32,
                mvcc::RequestOp::Put(p) => p.key.len() + p.value.len() + 16,
                mvcc::RequestOp::DeleteRange(d) => d.key.len() + d.range_end.len() + 8,
                mvcc::RequestOp::Txn(t) => txn(t),
            }
        }
        fn txn(t: &mvcc::TxnRequest) -> usize {
            let compares: usize = t
                .compare
                .iter()
                .map(|c| c.key.len() + c.range_end.len() + 16)
                .sum();
            compares + t.success.iter().chain(&t.failure).map(op).sum::<usize>()
        }
        match self {
            Write::Put(p) => p.key.len() + p.value.len() + 16,
            Write::DeleteRange(d) => d.key.len() + d.range_end.len() + 8,
            Write::Txn(t) => txn(t),
            Write::Compact(_) => 8,
            Write::Alarm(_) => 16,
            Write::Auth(_) | Write::Authenticate(_) => 64,
            Write::As { caller, write } => caller.user.len() + 8 + write.approx_bytes(),
            Write::Publish(a) => {
                a.name.len() + a.client_urls.iter().map(String::len).sum::<usize>() + 16
            }
            Write::LeaseGrant(_) | Write::LeaseRevoke(_) | Write::LeaseRenew(_) => 24,
        }
    }
}

/// A request that can be proposed, and the reply its apply produces.
pub trait Propose: Into<Write> {
    type Reply;

    /// This request's reply out of what applying it produced; the `Applied` back if it is
    /// another command's (a broken state machine, never a client's doing).
    fn reply(applied: Applied) -> Result<Self::Reply, Applied>;
}

macro_rules! propose {
    ($request:ty, $write:ident, $reply:ty) => {
        impl From<$request> for Write {
            fn from(request: $request) -> Write {
                Write::$write(request)
            }
        }

        impl Propose for $request {
            type Reply = $reply;

            fn reply(applied: Applied) -> Result<$reply, Applied> {
                match applied {
                    Applied::$write(reply) => Ok(reply),
                    other => Err(other),
                }
            }
        }
    };
}

propose!(mvcc::PutRequest, Put, Result<mvcc::PutResponse, mvcc::Error>);
propose!(
    mvcc::DeleteRangeRequest,
    DeleteRange,
    mvcc::DeleteRangeResponse
);
propose!(mvcc::TxnRequest, Txn, Result<mvcc::TxnResponse, mvcc::Error>);
propose!(Compact, Compact, Result<i64, mvcc::Error>);
propose!(LeaseGrant, LeaseGrant, Result<(), LeaseError>);
propose!(LeaseRevoke, LeaseRevoke, Result<i64, LeaseError>);
propose!(LeaseRenew, LeaseRenew, Option<i64>);
propose!(AlarmChange, Alarm, Option<AlarmMember>);
propose!(MemberAttrs, Publish, ());
propose!(AuthWrite, Auth, Result<(), AuthError>);
propose!(Authenticate, Authenticate, Result<String, AuthError>);

/// One command of a log entry: a client write stamped by the leader that committed it, or one
/// of the leader's own lease commands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Put(mvcc::PutRequest),
    DeleteRange(mvcc::DeleteRangeRequest),
    Txn(mvcc::TxnRequest),
    Compact {
        revision: i64,
    },
    /// A lease with a validated, clamped TTL and an id chosen before proposing.
    LeaseGrant {
        id: LeaseId,
        ttl_secs: i64,
        now_ms: u64,
    },
    LeaseRevoke {
        id: LeaseId,
    },
    /// A keepalive: the deadline becomes `now_ms + ttl`. Renewals go through the log so that a
    /// restart or a new leader knows every deadline (docs/lease.md).
    LeaseRenew {
        id: LeaseId,
        now_ms: u64,
    },
    /// The leader saw these leases expired at `now_ms`; those still expired when applied are
    /// revoked, each at its own revision.
    LeaseExpire {
        ids: Vec<LeaseId>,
        now_ms: u64,
    },
    /// Moves the replicated lease clock, so that a restart loses at most one tick of lease time.
    LeaseTick {
        now_ms: u64,
    },
    /// A new leader's first lease act: every inherited lease gets `extend_ms` (the election
    /// timeout) beyond what it had left at `now_ms`.
    LeasePromote {
        now_ms: u64,
        extend_ms: u64,
    },
    Alarm(AlarmChange),
    Publish(MemberAttrs),
    Auth(AuthWrite),
    Authenticate(Authenticate),
    /// A client command on behalf of a user (see [`Write::As`]).
    As {
        caller: Caller,
        command: Box<Command>,
    },
    /// A renewal through the log: the deadline its holder is told becomes `now_ms + ttl`, and
    /// the lease's cover (the replicated deadline no member ends it before) at least
    /// `margin_ms` beyond that, so that the leader can answer the next renewals from memory
    /// (docs/lease.md). (Added after `LeaseRenew`, which old logs still hold; new variants go
    /// last, so every earlier entry decodes as it did.)
    LeaseCover {
        id: LeaseId,
        now_ms: u64,
        margin_ms: u64,
    },
    /// The leader saw these leases' told deadlines pass at `now_ms`; each is revoked, at its own
    /// revision, unless its cover is no longer the one the leader saw (a renewal through the log
    /// came first and was answered) and has not passed either.
    LeaseExpireTold {
        leases: Vec<(LeaseId, u64)>,
        now_ms: u64,
    },
}

impl Command {
    /// The command's kind as etcd's `apply_duration_seconds` names it in its `op` label (etcd's
    /// request types; leasehold's own lease commands by their own names).
    pub fn op_name(&self) -> &'static str {
        match self {
            Command::Put(_) => "Put",
            Command::DeleteRange(_) => "DeleteRange",
            Command::Txn(_) => "Txn",
            Command::Compact { .. } => "Compaction",
            Command::LeaseGrant { .. } => "LeaseGrant",
            // An expiry is a revoke in etcd.
            Command::LeaseRevoke { .. }
            | Command::LeaseExpire { .. }
            | Command::LeaseExpireTold { .. } => "LeaseRevoke",
            Command::LeaseRenew { .. } | Command::LeaseCover { .. } => "LeaseRenew",
            Command::LeaseTick { .. } => "LeaseTick",
            Command::LeasePromote { .. } => "LeasePromote",
            Command::Alarm(_) => "Alarm",
            Command::Publish(_) => "ClusterMemberAttrSet",
            Command::Auth(_) => "Auth",
            Command::Authenticate(_) => "Authenticate",
            Command::As { command, .. } => command.op_name(),
        }
    }
}

/// What applying one command produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    Put(Result<mvcc::PutResponse, mvcc::Error>),
    DeleteRange(mvcc::DeleteRangeResponse),
    Txn(Result<mvcc::TxnResponse, mvcc::Error>),
    /// The header revision after the compaction.
    Compact(Result<i64, mvcc::Error>),
    LeaseGrant(Result<(), LeaseError>),
    /// The header revision after the revoke (one new revision if the lease had keys).
    LeaseRevoke(Result<i64, LeaseError>),
    /// The TTL renewed for; `None` when the lease is unknown or had expired (and is now revoked).
    LeaseRenew(Option<i64>),
    /// How many leases were revoked.
    LeaseExpire(usize),
    LeaseTick,
    LeasePromote,
    /// The alarm raised (or already raised), or the one cleared; `None` when clearing one that
    /// was not raised.
    Alarm(Option<AlarmMember>),
    Publish(()),
    Auth(Result<(), AuthError>),
    /// The token registered.
    Authenticate(Result<String, AuthError>),
    /// A client command refused by the auth store when applied (no user while auth is on, a
    /// permission missing or changed since the edge looked): nothing was applied.
    Denied(AuthError),
    /// A follower's forwarded write that adds data, refused by a leader whose disk is full
    /// (etcd's NOSPACE): never proposed.
    NoSpace,
}

impl Applied {
    /// Whether the command did what it asked (etcd's `success` label): not refused, not an
    /// error.
    pub fn succeeded(&self) -> bool {
        match self {
            Applied::Put(r) => r.is_ok(),
            Applied::Txn(r) => r.is_ok(),
            Applied::Compact(r) => r.is_ok(),
            Applied::LeaseGrant(r) => r.is_ok(),
            Applied::LeaseRevoke(r) => r.is_ok(),
            Applied::Auth(r) => r.is_ok(),
            Applied::Authenticate(r) => r.is_ok(),
            Applied::LeaseRenew(ttl) => ttl.is_some(),
            Applied::Denied(_) | Applied::NoSpace => false,
            Applied::DeleteRange(_)
            | Applied::LeaseExpire(_)
            | Applied::LeaseTick
            | Applied::LeasePromote
            | Applied::Alarm(_)
            | Applied::Publish(()) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: i64) -> LeaseId {
        LeaseId::from_wire(n).expect("non-zero")
    }

    #[test]
    fn stamping_gives_grants_and_renewals_the_leaders_time_and_nothing_else() {
        let cases: Vec<(Write, bool, Command)> = vec![
            (
                LeaseGrant {
                    id: id(1),
                    ttl_secs: 5,
                }
                .into(),
                true,
                Command::LeaseGrant {
                    id: id(1),
                    ttl_secs: 5,
                    now_ms: 700,
                },
            ),
            (
                LeaseRenew { id: id(2) }.into(),
                true,
                Command::LeaseCover {
                    id: id(2),
                    now_ms: 700,
                    margin_ms: 40,
                },
            ),
            (
                LeaseRevoke { id: id(3) }.into(),
                false,
                Command::LeaseRevoke { id: id(3) },
            ),
            (
                Compact { revision: 9 }.into(),
                false,
                Command::Compact { revision: 9 },
            ),
            (
                mvcc::PutRequest::default().into(),
                false,
                Command::Put(mvcc::PutRequest::default()),
            ),
        ];
        for (write, timed, command) in cases {
            assert_eq!(write.is_lease_timed(), timed, "{write:?}");
            assert_eq!(write.stamp(700, 40), command);
        }
    }

    /// A follower answers only renewals before it applies them: a grant, revoke or put it
    /// answered early could be missing from a serializable read on the same member just after.
    #[test]
    fn only_renewals_are_answered_before_the_follower_applies_them() {
        let cases: Vec<(Write, bool)> = vec![
            (LeaseRenew { id: id(2) }.into(), true),
            (
                LeaseGrant {
                    id: id(1),
                    ttl_secs: 5,
                }
                .into(),
                false,
            ),
            (LeaseRevoke { id: id(3) }.into(), false),
            (Compact { revision: 9 }.into(), false),
            (mvcc::PutRequest::default().into(), false),
            (mvcc::DeleteRangeRequest::default().into(), false),
            (mvcc::TxnRequest::default().into(), false),
        ];
        for (write, at_commit) in cases {
            assert_eq!(write.answered_at_commit(), at_commit, "{write:?}");
        }
    }

    #[test]
    fn a_reply_of_another_kind_is_refused_not_reinterpreted() {
        assert_eq!(LeaseRenew::reply(Applied::LeaseRenew(Some(5))), Ok(Some(5)));
        assert_eq!(
            LeaseRenew::reply(Applied::LeaseTick),
            Err(Applied::LeaseTick)
        );
        assert_eq!(
            <mvcc::TxnRequest as Propose>::reply(Applied::LeaseRevoke(Ok(3))),
            Err(Applied::LeaseRevoke(Ok(3)))
        );
        assert_eq!(Compact::reply(Applied::Compact(Ok(4))), Ok(Ok(4)));
    }
}
