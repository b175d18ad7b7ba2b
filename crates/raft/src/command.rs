//! The replicated command: what a client write becomes in the Raft log, and what applying it
//! returns. Everything nondeterministic is decided before proposing, so that applying an entry is
//! a pure function of the state and the entry, identical on every member.

use leasehold_mvcc as mvcc;
use serde::{Deserialize, Serialize};

/// One client write, as proposed to the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Put(mvcc::PutRequest),
    DeleteRange(mvcc::DeleteRangeRequest),
    Txn(mvcc::TxnRequest),
    Compact { revision: i64 },
}

/// What applying one log entry produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    /// A blank or membership entry: nothing for a client.
    Nothing,
    Put(Result<mvcc::PutResponse, mvcc::Error>),
    DeleteRange(mvcc::DeleteRangeResponse),
    Txn(Result<mvcc::TxnResponse, mvcc::Error>),
    /// The header revision after the compaction.
    Compact(Result<i64, mvcc::Error>),
}
