//! The replicated command: what a client write becomes in the Raft log, and what applying it
//! returns. Everything nondeterministic is decided before proposing, so that applying an entry is
//! a pure function of the state and the entry, identical on every member.

use leasehold_lease::{LeaseError, LeaseId};
use leasehold_mvcc as mvcc;
use serde::{Deserialize, Serialize};

/// One log entry: the client writes that arrived together, applied in order, each at its own
/// revision. Batching them is what lets concurrent writers share one fsync (group commit).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub commands: Vec<Command>,
}

/// One client write.
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
}

impl Command {
    /// Roughly the bytes this command adds to a log entry: what batch sizes are bounded by.
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
            Command::Put(p) => p.key.len() + p.value.len() + 16,
            Command::DeleteRange(d) => d.key.len() + d.range_end.len() + 8,
            Command::Txn(t) => txn(t),
            Command::Compact { .. } => 8,
            Command::LeaseGrant { .. }
            | Command::LeaseRevoke { .. }
            | Command::LeaseRenew { .. }
            | Command::LeaseTick { .. }
            | Command::LeasePromote { .. } => 24,
            Command::LeaseExpire { ids, .. } => 16 + 8 * ids.len(),
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
}
