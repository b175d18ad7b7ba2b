//! The Raft engine under a replica, and what the rest of the replica sees of it: an
//! [`EngineStatus`] on a `watch` channel, the same shape whichever engine runs. raft-rs
//! (`leasehold-consensus`, see `rs.rs`) is the default; openraft 0.9 still runs the data dirs it
//! made, and any member started with `--experimental-raft-engine openraft`, until it goes.

use std::collections::BTreeMap;
use std::sync::Arc;

use openraft::{BasicNode, Raft, RaftMetrics};
use tokio::sync::watch;

use super::error::ReplicaError;
use super::forward::{BoxFuture, Forwarded};
use super::rs::RsEngine;
use super::transfer::ProposalGate;
use crate::TypeConfig;

/// Which engine a member runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    Openraft,
    #[default]
    RaftRs,
}

impl std::str::FromStr for EngineKind {
    type Err = String;

    fn from_str(s: &str) -> Result<EngineKind, String> {
        match s {
            "openraft" => Ok(EngineKind::Openraft),
            "raft-rs" => Ok(EngineKind::RaftRs),
            other => Err(format!(
                "unknown raft engine {other:?} (expected \"openraft\" or \"raft-rs\")"
            )),
        }
    }
}

/// One member as the engine's membership has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EngineMember {
    pub(crate) peer_url: String,
    pub(crate) learner: bool,
}

/// Raft's progress as the replica reads it, whichever engine runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct EngineStatus {
    pub(crate) term: u64,
    /// The leader as the engine knows it (openraft's leader may be cut off: see
    /// `Replica::counted_leader`).
    pub(crate) leader: Option<u64>,
    pub(crate) is_leader: bool,
    pub(crate) last_log_index: u64,
    pub(crate) applied_index: u64,
    /// Voters and learners by id.
    pub(crate) members: Arc<BTreeMap<u64, EngineMember>>,
    /// openraft's leader: how long since a quorum last acknowledged it (raft-rs's leader steps
    /// down on its own under CheckQuorum, so it leaves this `None`).
    pub(crate) millis_since_quorum_ack: Option<u64>,
    /// The engine has stopped (an orderly shutdown, or a failure `Replica::failed` reports).
    pub(crate) stopped: bool,
}

impl EngineStatus {
    /// The peer URL of `id`, if it is a member.
    pub(crate) fn peer_url(&self, id: u64) -> Option<&str> {
        self.members.get(&id).map(|m| m.peer_url.as_str())
    }
}

/// The engine a replica runs.
#[derive(Clone)]
pub(super) enum Engine {
    Openraft {
        raft: Raft<TypeConfig>,
        /// Closed while a leadership transfer waits for its transferee (see `transfer.rs`).
        gate: Arc<ProposalGate>,
    },
    RaftRs(Arc<RsEngine>),
}

impl Engine {
    /// openraft's handle, for what only openraft does (its RPCs, its transfer workaround).
    pub(super) fn openraft(&self) -> Option<&Raft<TypeConfig>> {
        match self {
            Engine::Openraft { raft, .. } => Some(raft),
            Engine::RaftRs(_) => None,
        }
    }
}

impl Engine {
    /// Proposes one entry of stamped commands on raft-rs, which takes it without waiting for the
    /// last one (openraft's proposals go through `batch::commit_proposal`).
    pub(super) fn submit(
        &self,
        proposal: crate::command::Proposal,
    ) -> BoxFuture<Result<Forwarded, ReplicaError>> {
        match self {
            Engine::RaftRs(rs) => rs.submit(proposal),
            Engine::Openraft { .. } => {
                Box::pin(async { Err(ReplicaError::Unsupported("submit on openraft".into())) })
            }
        }
    }
}

/// openraft's metrics as an [`EngineStatus`].
pub(super) fn from_openraft(m: &RaftMetrics<u64, BasicNode>) -> EngineStatus {
    let membership = m.membership_config.membership();
    let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
    let members = membership
        .nodes()
        .map(|(id, node)| {
            (
                *id,
                EngineMember {
                    peer_url: node.addr.clone(),
                    learner: !voters.contains(id),
                },
            )
        })
        .collect();
    EngineStatus {
        term: m.current_term,
        leader: m.current_leader,
        is_leader: m.state.is_leader(),
        last_log_index: m.last_log_index.unwrap_or(0),
        applied_index: m.last_applied.map_or(0, |l| l.index),
        members: Arc::new(members),
        millis_since_quorum_ack: m.millis_since_quorum_ack,
        stopped: m.running_state.is_err(),
    }
}

/// Publishes openraft's metrics as [`EngineStatus`] until openraft's channel closes (then
/// `stopped`).
pub(super) fn follow_openraft(raft: &Raft<TypeConfig>) -> watch::Receiver<EngineStatus> {
    let mut metrics = raft.metrics();
    let (status, watched) = watch::channel(from_openraft(&metrics.borrow_and_update()));
    tokio::spawn(async move {
        loop {
            if metrics.changed().await.is_err() {
                status.send_modify(|s| s.stopped = true);
                return;
            }
            let next = from_openraft(&metrics.borrow_and_update());
            status.send_if_modified(|s| {
                let changed = *s != next;
                *s = next;
                changed
            });
        }
    });
    watched
}
