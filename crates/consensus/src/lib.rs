//! The consensus core on raft-rs: one [`Core`] owns the Raft node and its write-ahead log, and
//! handles each `Ready` in the order raft-rs requires (the leader sends before it persists;
//! every other member persists before it answers). It must never read a clock (time arrives as
//! ticks), touch a socket (messages leave through [`Host`]), or let rust-protobuf decode a byte
//! it did not make (peers' messages and the log go through our own prost types, [`proto`]).
//!
//! ```text
//!   tick / step(decode_peer_message(bytes)) / propose / read_index / transfer_leader
//!        │
//!        ▼
//!   Core::handle_ready ─► Host::send(leader's messages)
//!                      ─► Host::install_snapshot (a follower behind the leader's log)
//!                      ─► Wal::append (entries + hard state, one fdatasync)
//!                      ─► Host::send(votes, acks)
//!                      ─► Handled { committed, read_states } ─► host applies ─► applied_to
//! ```

mod core;
pub mod driver;
mod logger;
pub mod proto;
pub mod reads;
mod storage;

pub use crate::core::{
    Checkpoint, Core, CoreConfig, CoreError, CoreStatus, Handled, HeartbeatSeen, Host, HostError,
};
pub use logger::tracing_logger;
pub use proto::{DecodeError, decode_conf_change, decode_peer_message, encode_message};
pub use raft::eraftpb;
pub use raft::{ReadState, StateRole};
pub use storage::WaitingBytes;

#[cfg(test)]
mod tests;
