//! The multi-version key-value core of leasehold: etcd's revisions, generations, ranges, txns and
//! compaction, as a synchronous, deterministic state machine over in-memory data. It owns the
//! *semantics* of the KV API; it must never do I/O, read a clock or know about gRPC or Raft.
//! Persistence is the caller's: every write returns the [`Change`]s it made, in order. Values the
//! caller has made durable can be released from memory and read back through the caller's
//! [`ValueSource`].
//!
//! ```text
//!   request ──► Store::{put, delete_range, txn, compact} ──► (response, Vec<Change>) ──► storage
//!   request ──► Store::range ──► response
//!   request ──► Store::range_scan, then range_step a bounded part at a time,
//!               then RangeScan::finish (released values read back) ──► response
//! ```

mod error;
mod hash;
mod store;
mod types;
mod values;

pub use error::Error;
pub use hash::KvHash;
pub use leasehold_types::{Key, prefix_range_end};
pub use store::{
    CompactionHash, EventsFilter, EventsScan, RELEASE_MIN, RangeScan, ScanBudget, Store, Written,
    hash_in_background, key_in_range,
};
pub use types::{
    Change, Compare, CompareResult, CompareTarget, DeleteRangeRequest, DeleteRangeResponse, Event,
    EventKind, KeyValue, LeaseId, PutRequest, PutResponse, RangeRequest, RangeResponse, Record,
    RequestOp, ResponseOp, Revision, SortOrder, SortTarget, TxnRequest, TxnResponse,
};
pub use values::{NothingReleased, ValueReader, ValueSource};

#[cfg(test)]
mod tests;
