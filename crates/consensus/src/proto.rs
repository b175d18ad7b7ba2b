//! Raft's messages as prost types of our own, with eraftpb's field numbers, and their conversion
//! to raft-rs's structs in memory.
//!
//! raft-rs 0.7 carries rust-protobuf 2, whose decoder recurses without a bound on crafted input
//! (RUSTSEC-2024-0437, not fixed in 2.x). So no byte from a peer or from disk is decoded by it:
//! [`decode_peer_message`] decodes with prost (which bounds nesting), refuses the message types
//! no peer may send, and converts field by field. Conf changes in the log are decoded here too
//! ([`decode_conf_change`]), never with rust-protobuf.

use bytes::Bytes;
use leasehold_wal::proto::{ConfState, Entry, EntryType, HardState};
use prost::Message as _;
use raft::eraftpb;

/// eraftpb's `MessageType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum MessageType {
    MsgHup = 0,
    MsgBeat = 1,
    MsgPropose = 2,
    MsgAppend = 3,
    MsgAppendResponse = 4,
    MsgRequestVote = 5,
    MsgRequestVoteResponse = 6,
    MsgSnapshot = 7,
    MsgHeartbeat = 8,
    MsgHeartbeatResponse = 9,
    MsgUnreachable = 10,
    MsgSnapStatus = 11,
    MsgCheckQuorum = 12,
    MsgTransferLeader = 13,
    MsgTimeoutNow = 14,
    MsgReadIndex = 15,
    MsgReadIndexResp = 16,
    MsgRequestPreVote = 17,
    MsgRequestPreVoteResponse = 18,
}

/// eraftpb `SnapshotMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotMetadata {
    #[prost(message, optional, tag = "1")]
    pub conf_state: Option<ConfState>,
    #[prost(uint64, tag = "2")]
    pub index: u64,
    #[prost(uint64, tag = "3")]
    pub term: u64,
}

/// eraftpb `Snapshot`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Snapshot {
    #[prost(bytes = "bytes", tag = "1")]
    pub data: Bytes,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<SnapshotMetadata>,
}

/// eraftpb `Message` (field 14, the deprecated priority, is not kept).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Message {
    #[prost(enumeration = "MessageType", tag = "1")]
    pub msg_type: i32,
    #[prost(uint64, tag = "2")]
    pub to: u64,
    #[prost(uint64, tag = "3")]
    pub from: u64,
    #[prost(uint64, tag = "4")]
    pub term: u64,
    #[prost(uint64, tag = "5")]
    pub log_term: u64,
    #[prost(uint64, tag = "6")]
    pub index: u64,
    #[prost(message, repeated, tag = "7")]
    pub entries: Vec<Entry>,
    #[prost(uint64, tag = "8")]
    pub commit: u64,
    #[prost(message, optional, tag = "9")]
    pub snapshot: Option<Snapshot>,
    #[prost(bool, tag = "10")]
    pub reject: bool,
    #[prost(uint64, tag = "11")]
    pub reject_hint: u64,
    #[prost(bytes = "bytes", tag = "12")]
    pub context: Bytes,
    #[prost(uint64, tag = "13")]
    pub request_snapshot: u64,
    #[prost(uint64, tag = "15")]
    pub commit_term: u64,
    #[prost(int64, tag = "16")]
    pub priority: i64,
}

/// eraftpb `ConfChangeType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ConfChangeType {
    AddNode = 0,
    RemoveNode = 1,
    AddLearnerNode = 2,
}

/// eraftpb `ConfChangeTransition`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ConfChangeTransition {
    Auto = 0,
    Implicit = 1,
    Explicit = 2,
}

/// eraftpb `ConfChange` (the v1 form).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfChange {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(enumeration = "ConfChangeType", tag = "2")]
    pub change_type: i32,
    #[prost(uint64, tag = "3")]
    pub node_id: u64,
    #[prost(bytes = "bytes", tag = "4")]
    pub context: Bytes,
}

/// eraftpb `ConfChangeSingle`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfChangeSingle {
    #[prost(enumeration = "ConfChangeType", tag = "1")]
    pub change_type: i32,
    #[prost(uint64, tag = "2")]
    pub node_id: u64,
}

/// eraftpb `ConfChangeV2`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfChangeV2 {
    #[prost(enumeration = "ConfChangeTransition", tag = "1")]
    pub transition: i32,
    #[prost(message, repeated, tag = "2")]
    pub changes: Vec<ConfChangeSingle>,
    #[prost(bytes = "bytes", tag = "3")]
    pub context: Bytes,
}

/// Why bytes from a peer were not taken as a Raft message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("malformed raft message: {0}")]
    Malformed(String),
    #[error("unknown raft message type {0}")]
    UnknownType(i32),
    /// A type raft-rs makes for itself (a tick, a local proposal, a report), or a proposal: this
    /// core forwards writes to the leader itself, never as Raft proposals.
    #[error("raft message type {0:?} is not taken from a peer")]
    NotFromPeers(MessageType),
    #[error("raft message for member {to:x} arrived at member {here:x}")]
    WrongMember { to: u64, here: u64 },
}

/// Decodes a peer's Raft message for member `here`: prost only, and only the types a peer sends.
pub fn decode_peer_message(bytes: &[u8], here: u64) -> Result<eraftpb::Message, DecodeError> {
    let message = Message::decode(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    let kind = MessageType::try_from(message.msg_type)
        .map_err(|_| DecodeError::UnknownType(message.msg_type))?;
    if !from_peers(kind) {
        return Err(DecodeError::NotFromPeers(kind));
    }
    if message.to != here {
        return Err(DecodeError::WrongMember {
            to: message.to,
            here,
        });
    }
    for entry in &message.entries {
        EntryType::try_from(entry.entry_type)
            .map_err(|_| DecodeError::Malformed(format!("entry type {}", entry.entry_type)))?;
    }
    Ok(message_to_raft(message))
}

/// Encodes a message raft-rs produced, for a peer.
pub fn encode_message(message: &eraftpb::Message) -> Vec<u8> {
    message_from_raft(message).encode_to_vec()
}

fn from_peers(kind: MessageType) -> bool {
    use MessageType::*;
    match kind {
        MsgAppend
        | MsgAppendResponse
        | MsgRequestVote
        | MsgRequestVoteResponse
        | MsgSnapshot
        | MsgHeartbeat
        | MsgHeartbeatResponse
        | MsgTransferLeader
        | MsgTimeoutNow
        | MsgReadIndex
        | MsgReadIndexResp
        | MsgRequestPreVote
        | MsgRequestPreVoteResponse => true,
        MsgHup | MsgBeat | MsgPropose | MsgUnreachable | MsgSnapStatus | MsgCheckQuorum => false,
    }
}

/// A conf change entry's payload, decoded here (never by rust-protobuf) and given as the v2 form.
pub fn decode_conf_change(entry: &eraftpb::Entry) -> Result<eraftpb::ConfChangeV2, DecodeError> {
    let malformed = |e: prost::DecodeError| DecodeError::Malformed(e.to_string());
    let v2 = match entry.get_entry_type() {
        eraftpb::EntryType::EntryConfChange => {
            let v1 = ConfChange::decode(entry.data.as_ref()).map_err(malformed)?;
            ConfChangeV2 {
                transition: ConfChangeTransition::Auto as i32,
                changes: vec![ConfChangeSingle {
                    change_type: v1.change_type,
                    node_id: v1.node_id,
                }],
                context: v1.context,
            }
        }
        eraftpb::EntryType::EntryConfChangeV2 => {
            ConfChangeV2::decode(entry.data.as_ref()).map_err(malformed)?
        }
        eraftpb::EntryType::EntryNormal => {
            return Err(DecodeError::Malformed("not a conf change entry".into()));
        }
    };
    let mut out = eraftpb::ConfChangeV2::default();
    out.set_transition(match ConfChangeTransition::try_from(v2.transition) {
        Ok(ConfChangeTransition::Auto) => eraftpb::ConfChangeTransition::Auto,
        Ok(ConfChangeTransition::Implicit) => eraftpb::ConfChangeTransition::Implicit,
        Ok(ConfChangeTransition::Explicit) => eraftpb::ConfChangeTransition::Explicit,
        Err(_) => {
            return Err(DecodeError::Malformed(format!(
                "transition {}",
                v2.transition
            )));
        }
    });
    for change in v2.changes {
        let mut single = eraftpb::ConfChangeSingle::default();
        single.set_change_type(conf_change_type(change.change_type)?);
        single.node_id = change.node_id;
        out.mut_changes().push(single);
    }
    out.context = v2.context;
    Ok(out)
}

/// Encodes a conf change for [`raft::RawNode::propose`] as an `EntryConfChangeV2` payload (so
/// rust-protobuf's encoder is not used either).
pub fn encode_conf_change(cc: &eraftpb::ConfChangeV2) -> Vec<u8> {
    ConfChangeV2 {
        transition: cc.get_transition() as i32,
        changes: cc
            .get_changes()
            .iter()
            .map(|c| ConfChangeSingle {
                change_type: c.get_change_type() as i32,
                node_id: c.node_id,
            })
            .collect(),
        context: cc.context.clone(),
    }
    .encode_to_vec()
}

fn conf_change_type(raw: i32) -> Result<eraftpb::ConfChangeType, DecodeError> {
    match ConfChangeType::try_from(raw) {
        Ok(ConfChangeType::AddNode) => Ok(eraftpb::ConfChangeType::AddNode),
        Ok(ConfChangeType::RemoveNode) => Ok(eraftpb::ConfChangeType::RemoveNode),
        Ok(ConfChangeType::AddLearnerNode) => Ok(eraftpb::ConfChangeType::AddLearnerNode),
        Err(_) => Err(DecodeError::Malformed(format!("conf change type {raw}"))),
    }
}

pub(crate) fn entry_to_raft(e: Entry) -> eraftpb::Entry {
    let mut out = eraftpb::Entry::default();
    out.set_entry_type(match EntryType::try_from(e.entry_type) {
        Ok(EntryType::EntryConfChange) => eraftpb::EntryType::EntryConfChange,
        Ok(EntryType::EntryConfChangeV2) => eraftpb::EntryType::EntryConfChangeV2,
        // Refused at decode; the log only holds entries that decoded.
        Ok(EntryType::EntryNormal) | Err(_) => eraftpb::EntryType::EntryNormal,
    });
    out.term = e.term;
    out.index = e.index;
    out.data = e.data;
    out.context = e.context;
    out
}

pub(crate) fn entry_from_raft(e: &eraftpb::Entry) -> Entry {
    Entry {
        entry_type: e.get_entry_type() as i32,
        term: e.term,
        index: e.index,
        data: e.data.clone(),
        context: e.context.clone(),
    }
}

pub(crate) fn hard_state_to_raft(hs: HardState) -> eraftpb::HardState {
    eraftpb::HardState {
        term: hs.term,
        vote: hs.vote,
        commit: hs.commit,
        ..Default::default()
    }
}

pub(crate) fn hard_state_from_raft(hs: &eraftpb::HardState) -> HardState {
    HardState {
        term: hs.term,
        vote: hs.vote,
        commit: hs.commit,
    }
}

pub(crate) fn conf_state_to_raft(cs: ConfState) -> eraftpb::ConfState {
    eraftpb::ConfState {
        voters: cs.voters,
        learners: cs.learners,
        voters_outgoing: cs.voters_outgoing,
        learners_next: cs.learners_next,
        auto_leave: cs.auto_leave,
        ..Default::default()
    }
}

pub(crate) fn conf_state_from_raft(cs: &eraftpb::ConfState) -> ConfState {
    ConfState {
        voters: cs.voters.clone(),
        learners: cs.learners.clone(),
        voters_outgoing: cs.voters_outgoing.clone(),
        learners_next: cs.learners_next.clone(),
        auto_leave: cs.auto_leave,
    }
}

fn message_to_raft(m: Message) -> eraftpb::Message {
    let mut out = eraftpb::Message::default();
    out.set_msg_type(raft_message_type(m.msg_type));
    out.to = m.to;
    out.from = m.from;
    out.term = m.term;
    out.log_term = m.log_term;
    out.index = m.index;
    out.entries = m.entries.into_iter().map(entry_to_raft).collect();
    out.commit = m.commit;
    out.commit_term = m.commit_term;
    if let Some(s) = m.snapshot {
        let mut snap = eraftpb::Snapshot {
            data: s.data,
            ..Default::default()
        };
        if let Some(meta) = s.metadata {
            let md = snap.mut_metadata();
            md.index = meta.index;
            md.term = meta.term;
            if let Some(cs) = meta.conf_state {
                md.set_conf_state(conf_state_to_raft(cs));
            }
        }
        out.set_snapshot(snap);
    }
    out.request_snapshot = m.request_snapshot;
    out.reject = m.reject;
    out.reject_hint = m.reject_hint;
    out.context = m.context;
    out.priority = m.priority;
    out
}

fn message_from_raft(m: &eraftpb::Message) -> Message {
    Message {
        msg_type: m.get_msg_type() as i32,
        to: m.to,
        from: m.from,
        term: m.term,
        log_term: m.log_term,
        index: m.index,
        entries: m.entries.iter().map(entry_from_raft).collect(),
        commit: m.commit,
        snapshot: m.snapshot.as_ref().map(|s| Snapshot {
            data: s.data.clone(),
            metadata: s.metadata.as_ref().map(|md| SnapshotMetadata {
                conf_state: md.conf_state.as_ref().map(conf_state_from_raft),
                index: md.index,
                term: md.term,
            }),
        }),
        reject: m.reject,
        reject_hint: m.reject_hint,
        context: m.context.clone(),
        request_snapshot: m.request_snapshot,
        commit_term: m.commit_term,
        priority: m.priority,
    }
}

fn raft_message_type(raw: i32) -> eraftpb::MessageType {
    use eraftpb::MessageType as R;
    match MessageType::try_from(raw).unwrap_or(MessageType::MsgHup) {
        MessageType::MsgHup => R::MsgHup,
        MessageType::MsgBeat => R::MsgBeat,
        MessageType::MsgPropose => R::MsgPropose,
        MessageType::MsgAppend => R::MsgAppend,
        MessageType::MsgAppendResponse => R::MsgAppendResponse,
        MessageType::MsgRequestVote => R::MsgRequestVote,
        MessageType::MsgRequestVoteResponse => R::MsgRequestVoteResponse,
        MessageType::MsgSnapshot => R::MsgSnapshot,
        MessageType::MsgHeartbeat => R::MsgHeartbeat,
        MessageType::MsgHeartbeatResponse => R::MsgHeartbeatResponse,
        MessageType::MsgUnreachable => R::MsgUnreachable,
        MessageType::MsgSnapStatus => R::MsgSnapStatus,
        MessageType::MsgCheckQuorum => R::MsgCheckQuorum,
        MessageType::MsgTransferLeader => R::MsgTransferLeader,
        MessageType::MsgTimeoutNow => R::MsgTimeoutNow,
        MessageType::MsgReadIndex => R::MsgReadIndex,
        MessageType::MsgReadIndexResp => R::MsgReadIndexResp,
        MessageType::MsgRequestPreVote => R::MsgRequestPreVote,
        MessageType::MsgRequestPreVoteResponse => R::MsgRequestPreVoteResponse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> eraftpb::Message {
        let mut m = eraftpb::Message::default();
        m.set_msg_type(eraftpb::MessageType::MsgAppend);
        m.to = 2;
        m.from = 1;
        m.term = 7;
        m.log_term = 6;
        m.index = 41;
        m.commit = 40;
        m.commit_term = 6;
        m.context = Bytes::from_static(b"ctx");
        m.priority = -3;
        let mut e = eraftpb::Entry::default();
        e.set_entry_type(eraftpb::EntryType::EntryConfChangeV2);
        e.term = 7;
        e.index = 42;
        e.data = Bytes::from_static(b"payload");
        m.entries.push(e);
        let mut snap = eraftpb::Snapshot {
            data: Bytes::from_static(b"state"),
            ..Default::default()
        };
        snap.mut_metadata().index = 30;
        snap.mut_metadata().term = 5;
        snap.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
        snap.mut_metadata().mut_conf_state().learners = vec![4];
        m.set_snapshot(snap);
        m
    }

    #[test]
    fn a_message_round_trips_through_our_codec_field_for_field() {
        let m = sample();
        let back = decode_peer_message(&encode_message(&m), 2).expect("decodes");
        assert_eq!(back, m);
    }

    #[test]
    fn our_bytes_are_what_rust_protobuf_reads_and_writes() {
        // Same field numbers: rust-protobuf (trusted here, on bytes we made) reads our encoding
        // as the same message, and we read its encoding.
        let m = sample();
        let ours = encode_message(&m);
        let theirs: eraftpb::Message =
            protobuf::Message::parse_from_bytes(&ours).expect("rust-protobuf reads ours");
        assert_eq!(theirs, m);
        let theirs_bytes = protobuf::Message::write_to_bytes(&m).expect("encodes");
        assert_eq!(
            decode_peer_message(&theirs_bytes, 2).expect("we read theirs"),
            m
        );
    }

    #[test]
    fn a_deeply_nested_crafted_message_is_refused_without_a_crash() {
        // 100,000 nested groups in an unknown field: the input that overflows rust-protobuf 2's
        // stack (RUSTSEC-2024-0437). prost stops at its recursion limit.
        let depth = 100_000;
        let mut bytes = Vec::with_capacity(depth * 2 + 8);
        bytes.extend_from_slice(&[0x08, 0x03]); // msg_type = MsgAppend
        for _ in 0..depth {
            bytes.push((99 << 3 | 3) as u8 & 0x7f | 0x80); // field 99, start group (varint key)
            bytes.push(((99 << 3 | 3) >> 7) as u8);
        }
        let refused = decode_peer_message(&bytes, 2);
        assert!(
            matches!(refused, Err(DecodeError::Malformed(_))),
            "{refused:?}"
        );
        // Nested snapshot metadata as deep as the schema allows is fine; a deep group inside an
        // entry is refused the same way.
        let mut in_entry = vec![0x08, 0x03, 0x3a];
        let mut inner = Vec::new();
        for _ in 0..depth {
            inner.push(0x9b);
            inner.push(0x06);
        }
        prost::encoding::encode_varint(inner.len() as u64, &mut in_entry);
        in_entry.extend(inner);
        assert!(matches!(
            decode_peer_message(&in_entry, 2),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn proposals_and_local_messages_are_not_taken_from_peers() {
        for kind in [
            eraftpb::MessageType::MsgPropose,
            eraftpb::MessageType::MsgHup,
            eraftpb::MessageType::MsgBeat,
            eraftpb::MessageType::MsgUnreachable,
            eraftpb::MessageType::MsgSnapStatus,
            eraftpb::MessageType::MsgCheckQuorum,
        ] {
            let mut m = eraftpb::Message::default();
            m.set_msg_type(kind);
            m.to = 2;
            assert!(
                matches!(
                    decode_peer_message(&encode_message(&m), 2),
                    Err(DecodeError::NotFromPeers(_))
                ),
                "{kind:?}"
            );
        }
        let mut m = sample();
        m.to = 3;
        assert_eq!(
            decode_peer_message(&encode_message(&m), 2),
            Err(DecodeError::WrongMember { to: 3, here: 2 })
        );
        let unknown = Message {
            msg_type: 77,
            to: 2,
            ..Message::default()
        };
        assert_eq!(
            decode_peer_message(&unknown.encode_to_vec(), 2),
            Err(DecodeError::UnknownType(77))
        );
    }

    #[test]
    fn conf_changes_decode_in_both_forms() {
        let mut cc = eraftpb::ConfChangeV2::default();
        cc.set_transition(eraftpb::ConfChangeTransition::Explicit);
        let mut add = eraftpb::ConfChangeSingle::default();
        add.set_change_type(eraftpb::ConfChangeType::AddLearnerNode);
        add.node_id = 9;
        cc.mut_changes().push(add);
        cc.context = Bytes::from_static(b"member json");
        let mut entry = eraftpb::Entry::default();
        entry.set_entry_type(eraftpb::EntryType::EntryConfChangeV2);
        entry.data = Bytes::from(encode_conf_change(&cc));
        assert_eq!(decode_conf_change(&entry).expect("v2"), cc);

        let v1 = ConfChange {
            id: 0,
            change_type: ConfChangeType::RemoveNode as i32,
            node_id: 5,
            context: Bytes::from_static(b"x"),
        };
        entry.set_entry_type(eraftpb::EntryType::EntryConfChange);
        entry.data = Bytes::from(v1.encode_to_vec());
        let got = decode_conf_change(&entry).expect("v1");
        assert_eq!(got.get_changes().len(), 1);
        assert_eq!(
            got.get_changes()[0].get_change_type(),
            eraftpb::ConfChangeType::RemoveNode
        );
        assert_eq!(got.get_changes()[0].node_id, 5);
    }
}
