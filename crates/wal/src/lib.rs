//! The Raft log's write-ahead log: what makes an acknowledged write survive `kill -9` and power
//! loss. It owns the segment files in one directory and nothing else; it knows Raft's record
//! shapes (entries, the hard state, the compaction mark) but never drives Raft, and never reads
//! a clock.
//!
//! ```text
//!   Wal::append(Batch) ─► one frame (magic, len, crc32c, payload) ─► write_at ─► fdatasync
//!   Wal::compact(mark) ─► a frame with the mark ─► delete the segments wholly at or below it
//!   Wal::open_on(fs)   ─► replay every segment ─► clear a torn last frame, refuse other damage
//! ```
//!
//! Every byte goes through [`Fs`], so tests and the simulator run it on [`MemFs`], which can
//! crash and tear writes.

mod error;
mod frame;
mod fs;
pub mod proto;
mod wal;

pub use error::WalError;
pub use frame::FRAME_PAYLOAD_BYTES_MAX;
pub use fs::{Crash, Fs, MemFile, MemFs, SECTOR_BYTES, StdFile, StdFs, WalFile};
pub use wal::{
    Recovered, SEGMENT_BYTES_DEFAULT, WAL_FORMAT, WRITTEN_KEPT_MAX, Wal, WalOptions, WalReader,
    Written,
};

#[cfg(test)]
mod suite;
