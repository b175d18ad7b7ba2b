//! What the rest of the replica sees of the Raft engine (`rs.rs`): an [`EngineStatus`] on a
//! `watch` channel, published by the Raft thread after every change.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::command::MemberAttrs;

/// One member as the engine's membership has it (the state machine's own record of it).
pub(crate) type EngineMember = crate::position::Member;

/// Raft's progress as the replica reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct EngineStatus {
    pub(crate) term: u64,
    pub(crate) leader: Option<u64>,
    pub(crate) is_leader: bool,
    pub(crate) last_log_index: u64,
    pub(crate) applied_index: u64,
    /// Voters and learners by id.
    pub(crate) members: Arc<BTreeMap<u64, EngineMember>>,
    /// The engine has stopped (an orderly shutdown, or a failure `Replica::failed` reports).
    pub(crate) stopped: bool,
}

impl EngineStatus {
    /// The peer URL of `id`, if it is a member.
    pub(crate) fn peer_url(&self, id: u64) -> Option<&str> {
        self.members.get(&id).map(|m| m.peer_url.as_str())
    }
}

/// One member as the current membership config has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub id: u64,
    pub peer_url: String,
    pub learner: bool,
    /// What the member published about itself once it started (`None` before: etcd lists such
    /// a member as unstarted).
    pub published: Option<MemberAttrs>,
}
