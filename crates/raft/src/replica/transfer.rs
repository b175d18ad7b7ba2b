//! Leadership transfer (etcd's MoveLeader), as etcd does it: raft-rs's TransferLeader. The
//! leader stops taking proposals, brings the transferee up to date and has it campaign at once
//! (`MsgTimeoutNow`); the voters grant that campaign inside their CheckQuorum lease.

use std::time::{Duration, Instant};

use super::Replica;
use super::error::ReplicaError;

impl Replica {
    /// Hands leadership to `target`, within `within`. This member must lead; `target` must be a
    /// voter (itself: nothing to do).
    pub async fn move_leader(&self, target: u64, within: Duration) -> Result<(), ReplicaError> {
        let deadline = Instant::now() + within;
        if !self.is_leader() {
            return Err(ReplicaError::NotLeader);
        }
        if !self
            .members()
            .into_iter()
            .any(|m| m.id == target && !m.learner)
        {
            return Err(ReplicaError::BadLeaderTransferee);
        }
        if target == self.member_id {
            return Ok(());
        }
        self.engine.transfer_leader(target);
        let mut status = self.status.clone();
        let moved = status.wait_for(|s| s.leader == Some(target) || s.stopped);
        match tokio::time::timeout_at(deadline.into(), moved).await {
            Ok(Ok(s)) if s.leader == Some(target) => Ok(()),
            Ok(_) => Err(ReplicaError::Stopped),
            Err(_) => Err(ReplicaError::LeaderTransferTimeout),
        }
    }
}

impl Replica {
    /// Before a graceful stop: hands leadership to the voter that holds the most of the log
    /// among those heard from within the last two heartbeats, so that the others need not wait
    /// out an election timeout, as etcd does when it stops (`TransferLeadershipOnShutdown`).
    /// Nothing when this member does not lead or leads alone, or when no voter answers lately.
    /// Bounded by `within`; a failure is logged and the stop goes on.
    pub async fn hand_over_leadership(&self, within: Duration) {
        if !self.is_leader() {
            return;
        }
        let voters: Vec<u64> = self
            .members()
            .into_iter()
            .filter(|m| !m.learner && m.id != self.member_id)
            .map(|m| m.id)
            .collect();
        if voters.is_empty() {
            return;
        }
        let Ok(heard) = self.engine.heard_ago_and_matched(voters).await else {
            return;
        };
        // A voter that stopped a moment ago was heard from within the election timeout still:
        // only one that answers heartbeats now is a transferee.
        let Some((target, ..)) = heard
            .into_iter()
            .filter(|&(_, ago, _)| ago.is_some_and(|t| t <= 2))
            .max_by_key(|&(id, _, matched)| (matched, std::cmp::Reverse(id)))
        else {
            tracing::warn!("stopping as leader, with no voter heard from to hand leadership to");
            return;
        };
        let started = Instant::now();
        match self.move_leader(target, within).await {
            Ok(()) => tracing::info!(
                transferee = %format!("{target:x}"),
                took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                "handed leadership over before stopping"
            ),
            Err(e) => tracing::warn!(
                transferee = %format!("{target:x}"),
                "could not hand leadership over before stopping: {e}"
            ),
        }
    }
}
