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
