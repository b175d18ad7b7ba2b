//! The Raft log's record types, as protobuf messages of our own. `Entry`, `HardState` and
//! `ConfState` carry the field numbers of raft-rs's `eraftpb` (etcd's `raftpb`), so the
//! consensus core converts them to raft-rs's structs field by field, in memory, and no byte
//! read from disk or from a peer ever reaches rust-protobuf's decoder.
//!
//! `Frame`, `SegmentHeader` and `Batch` are this log's own: what one frame of a segment holds.

use bytes::Bytes;

/// eraftpb's `EntryType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum EntryType {
    EntryNormal = 0,
    EntryConfChange = 1,
    EntryConfChangeV2 = 2,
}

/// One Raft log entry (eraftpb `Entry`; field 5, `sync_log`, is obsolete and not kept).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    #[prost(enumeration = "EntryType", tag = "1")]
    pub entry_type: i32,
    #[prost(uint64, tag = "2")]
    pub term: u64,
    #[prost(uint64, tag = "3")]
    pub index: u64,
    #[prost(bytes = "bytes", tag = "4")]
    pub data: Bytes,
    #[prost(bytes = "bytes", tag = "6")]
    pub context: Bytes,
}

/// What a member must remember across restarts to vote safely (eraftpb `HardState`).
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct HardState {
    #[prost(uint64, tag = "1")]
    pub term: u64,
    #[prost(uint64, tag = "2")]
    pub vote: u64,
    #[prost(uint64, tag = "3")]
    pub commit: u64,
}

/// The voters and learners (eraftpb `ConfState`).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ConfState {
    #[prost(uint64, repeated, tag = "1")]
    pub voters: Vec<u64>,
    #[prost(uint64, repeated, tag = "2")]
    pub learners: Vec<u64>,
    #[prost(uint64, repeated, tag = "3")]
    pub voters_outgoing: Vec<u64>,
    #[prost(uint64, repeated, tag = "4")]
    pub learners_next: Vec<u64>,
    #[prost(bool, tag = "5")]
    pub auto_leave: bool,
}

/// The log is compacted up to `index` (its term kept, as Raft needs `term(first_index - 1)`):
/// the entries at and below it live in a snapshot of the state machine, not in this log. An
/// entry the log holds at `index` with another term means the entries after it are another
/// history's: they are dropped with it.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Compacted {
    #[prost(uint64, tag = "1")]
    pub index: u64,
    #[prost(uint64, tag = "2")]
    pub term: u64,
}

/// One append: written as one frame, so it is on disk whole or not at all. Replay applies it in
/// field order: the compaction mark, then the entries (an entry at an index the log already
/// holds replaces it and everything after it, as a Raft follower's conflicting suffix), then the
/// hard state, so a hard state is never ahead of the entries it was written with.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Batch {
    #[prost(message, optional, tag = "1")]
    pub compacted: Option<Compacted>,
    #[prost(message, repeated, tag = "2")]
    pub entries: Vec<Entry>,
    #[prost(message, optional, tag = "3")]
    pub hard_state: Option<HardState>,
}

/// The first frame of every segment: which segment this is, and the state the log had when it
/// was cut (so older segments can be deleted without losing the hard state or the mark).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SegmentHeader {
    #[prost(uint32, tag = "1")]
    pub format: u32,
    #[prost(uint64, tag = "2")]
    pub seq: u64,
    /// The index of the first entry this segment may hold (the log's last index + 1 when cut).
    #[prost(uint64, tag = "3")]
    pub first_index: u64,
    #[prost(message, optional, tag = "4")]
    pub compacted: Option<Compacted>,
    #[prost(message, optional, tag = "5")]
    pub hard_state: Option<HardState>,
}

/// What one frame holds.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Frame {
    #[prost(oneof = "FrameKind", tags = "1, 2")]
    pub kind: Option<FrameKind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum FrameKind {
    #[prost(message, tag = "1")]
    Header(SegmentHeader),
    #[prost(message, tag = "2")]
    Batch(Batch),
}
