//! Leadership transfer (etcd's MoveLeader). openraft 0.9 has none, so the leader makes one of
//! Raft's own moves: it stops proposing, waits until the transferee holds its whole log, and has
//! the transferee campaign (`trigger().elect()`). The campaign is at a higher term with a log as
//! long as anyone's, so the old leader grants its vote and steps down, and the transferee has a
//! majority of three with its own. Two rules of openraft's shape the wait:
//!
//! - a member refuses every vote while its leader lease runs (the maximum election timeout
//!   since it last heard from a leader, or since it was elected itself): the old leader, which
//!   hears from nobody, waits until it has led that long; followers keep hearing heartbeats, so
//!   in clusters of more than three voters the transferee cannot gather the others' votes in
//!   time and the transfer times out (and the leader steps down, as after any failed campaign);
//! - the transferee must hold the leader's last log id, or the leader refuses it for its log:
//!   nothing is proposed meanwhile (`ProposalGate`), so the log stops growing.

use std::time::{Duration, Instant};

use super::Replica;
use super::error::ReplicaError;

/// Shuts proposing on this member while a transfer waits for the transferee: every commit holds
/// the read side, a transfer the write side.
#[derive(Default)]
pub(super) struct ProposalGate(tokio::sync::RwLock<()>);

impl ProposalGate {
    pub(super) async fn open(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.0.read().await
    }

    async fn close(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.0.write().await
    }
}

impl Replica {
    /// Hands leadership to `target`, within `within`. This member must lead; `target` must be a
    /// voter (itself: nothing to do).
    pub async fn move_leader(&self, target: u64, within: Duration) -> Result<(), ReplicaError> {
        let deadline = Instant::now() + within;
        if !self.is_leader() {
            return Err(ReplicaError::NotLeader);
        }
        let Some(transferee) = self
            .members()
            .into_iter()
            .find(|m| m.id == target && !m.learner)
        else {
            return Err(ReplicaError::BadLeaderTransferee);
        };
        if target == self.member_id {
            return Ok(());
        }
        let (raft, gate) = match &self.engine {
            super::engine::Engine::Openraft { raft, gate } => (raft, gate),
            super::engine::Engine::RaftRs(rs) => {
                // raft-rs transfers as etcd does: the leader stops taking proposals, brings the
                // transferee up to date and has it campaign at once (MsgTimeoutNow).
                rs.transfer_leader(target);
                let mut status = self.status.clone();
                let moved = status.wait_for(|s| s.leader == Some(target) || s.stopped);
                return match tokio::time::timeout_at(deadline.into(), moved).await {
                    Ok(Ok(s)) if s.leader == Some(target) => Ok(()),
                    Ok(_) => Err(ReplicaError::Stopped),
                    Err(_) => Err(ReplicaError::LeaderTransferTimeout),
                };
            }
        };
        // openraft's leader lease is its maximum election timeout (twice ours).
        let lease = self.election_timeout * 2;
        if let Some(since) = self.leading_since() {
            let votes_again = since + lease + Duration::from_millis(50);
            tokio::time::sleep_until(votes_again.min(deadline).into()).await;
        }
        let closed = tokio::time::timeout_at(deadline.into(), gate.close())
            .await
            .map_err(|_| ReplicaError::LeaderTransferTimeout)?;
        wait_caught_up(raft, target, deadline).await?;
        tracing::info!(target = %format!("{target:x}"), "leadership transfer: the transferee campaigns");
        self.forwarder.campaign(target, transferee.peer_url).await?;
        let mut metrics = raft.metrics();
        let moved = metrics.wait_for(|m| m.current_leader == Some(target));
        let moved = tokio::time::timeout_at(deadline.into(), moved).await;
        drop(closed);
        match moved {
            Ok(Ok(_)) => {
                tracing::info!(target = %format!("{target:x}"), "leadership transfer finished");
                Ok(())
            }
            Ok(Err(_)) => Err(ReplicaError::Stopped),
            Err(_) => Err(ReplicaError::LeaderTransferTimeout),
        }
    }

    /// Campaigns for leadership now (a leader's transfer asks its transferee to).
    pub async fn campaign(&self) -> Result<(), ReplicaError> {
        match &self.engine {
            super::engine::Engine::Openraft { raft, .. } => raft
                .trigger()
                .elect()
                .await
                .map_err(|_| ReplicaError::Stopped),
            super::engine::Engine::RaftRs(rs) => {
                rs.campaign();
                Ok(())
            }
        }
    }
}

/// Waits (until `deadline`) until `target` has matched this leader's whole log.
async fn wait_caught_up(
    raft: &openraft::Raft<crate::TypeConfig>,
    target: u64,
    deadline: Instant,
) -> Result<(), ReplicaError> {
    {
        let mut metrics = raft.metrics();
        let caught_up = metrics.wait_for(|m| {
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(&target).copied().flatten());
            m.last_log_index.is_some() && matched.map(|l| l.index) == m.last_log_index
        });
        match tokio::time::timeout_at(deadline.into(), caught_up).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(ReplicaError::Stopped),
            Err(_) => Err(ReplicaError::LeaderTransferTimeout),
        }
    }
}
