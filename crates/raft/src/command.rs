//! The replicated command: what a client write becomes in the Raft log, and what applying it
//! returns. Everything nondeterministic is decided before proposing, so that applying an entry is
//! a pure function of the state and the entry, identical on every member.

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
    Compact { revision: i64 },
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
}
