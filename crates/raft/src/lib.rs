//! The replicated store for leasehold: the replicated [`Command`], the redb state machine, and
//! [`Replica`], the one handle the server uses to write (through the Raft log) and read (at a
//! linearizable or serializable point), over the raft-rs core (`leasehold-consensus`) and its
//! write-ahead log. It owns durability; it must never know about gRPC.
//!
//! ```text
//!   Replica::propose(write) ──► Raft thread ──► WAL append (one fdatasync per Ready)
//!                                    └──► apply_entries ──► mvcc::Store (+ staged rows)
//!                                                              └──► redb checkpoint (100 ms)
//!   Replica::read(f)   ──► read index (ReadIndex round) ──► f(&Store)
//! ```

mod clock;
mod command;
mod export;
mod position;
mod replica;
mod state_machine;
pub mod steps;
mod storage;
mod telemetry;
mod tokens;

pub use clock::{Clock, ManualClock, SystemClock, system_clock};
pub use command::{
    Alarm, AlarmChange, AlarmMember, Applied, AuthWrite, Authenticate, Command, Compact,
    LeaseGrant, LeaseRenew, LeaseRevoke, MemberAttrs, Proposal, Propose, Write,
};
pub use export::{
    ImportedLease, ImportedState, RecordSink, RestoreError, Restored, StateView, ViewMember,
    restore_data_dir,
};
pub use leasehold_lease::{
    EndedLease, LEASE_TTL_SECS_MAX, LeaseClock, LeaseEnd, LeaseError, LeaseId, LeaseTable,
    LeaseView, RECENT_ENDS_LEN_MAX,
};
pub use replica::{
    BoxFuture, CompactionPace, Fatal, Forwarded, Forwarder, LEASE_COVER_MARGIN_DEFAULT_MS,
    LeadershipWatch, LeaseTime, MemberChange, MemberHash, MemberInfo, MembershipError,
    NoForwarding, NoTransport, RaftChanges, RaftStatus, RaftTransport, ReadIndex, ReadProof,
    Replica, ReplicaConfig, ReplicaError, SNAPSHOT_COUNT_DEFAULT, StartError,
};
pub use state_machine::{
    KvOps, LeaseTimeSeen, Machine, decode_proposal, encode_proposal, lease_time_at, rebind,
};
pub use storage::{Defragmented, StorageError};
pub use telemetry::{DISK_BUCKETS_SECS, HistogramReading, TelemetryReading};

#[cfg(test)]
mod tests;
