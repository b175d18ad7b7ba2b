//! openraft glue for leasehold: the replicated [`Command`], the redb-backed Raft log and state
//! machine, and [`Replica`], the one handle the server uses to write (through the log) and read
//! (at a linearizable or serializable point). It owns durability; it must never know about gRPC.
//!
//! ```text
//!   Replica::propose(write) ──► openraft ──► LogStore::append (redb, fsync per batch)
//!                                   └──► StateMachine::apply ──► mvcc::Store (+ staged rows)
//!   Replica::read(f)   ──► read index (ensure_linearizable) ──► f(&Store)
//! ```

mod command;
mod export;
mod log_store;
mod network;
mod replica;
mod state_machine;
mod storage;
mod telemetry;
mod tokens;

use std::io::Cursor;

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
pub use network::NoPeers;
pub use replica::{
    BoxFuture, EngineKind, Fatal, Forwarded, Forwarder, MemberChange, MemberHash, MemberInfo,
    MembershipError, NoForwarding, NoTransport, RaftStatus, RaftTransport, ReadIndex, Replica,
    ReplicaConfig, ReplicaError, StartError, engine_of_data_dir,
};
pub use state_machine::rebind;
pub use storage::{Defragmented, StorageError};
pub use telemetry::{DISK_BUCKETS_SECS, HistogramReading, TelemetryReading};

openraft::declare_raft_types!(
    /// The Raft type configuration of leasehold.
    pub TypeConfig:
        D = Proposal,
        R = Vec<Applied>,
);

#[cfg(test)]
mod tests;
