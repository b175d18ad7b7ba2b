//! Membership changes (etcd's MemberAdd, MemberRemove, MemberPromote, MemberUpdate) and the
//! member list.

use super::Replica;
use super::engine::MemberInfo;
use super::error::{MembershipError, ReplicaError};
use super::forward::{MemberChange, leader_elsewhere};
use crate::steps::reconfig;

impl Replica {
    /// The current members, voters and learners, in id order.
    pub fn members(&self) -> Vec<MemberInfo> {
        // The Raft thread publishes a change before it answers the change's caller.
        let members = self.status.borrow().members.clone();
        let state = self.shared.state.read().expect("state lock poisoned");
        members
            .iter()
            .map(|(id, m)| MemberInfo {
                id: *id,
                peer_url: m.peer_url.clone(),
                learner: m.learner,
                published: state.member_attrs.get(id).cloned(),
            })
            .collect()
    }

    /// Makes a membership change, on the leader (forwarded there from a follower); returns once
    /// the new configuration is committed.
    pub async fn change_members(&self, change: MemberChange) -> Result<(), ReplicaError> {
        match leader_elsewhere(&self.status, self.member_id) {
            Some((leader, addr)) => {
                self.forwarder.change_members(leader, addr, change).await?;
                // Answer with the change applied here too, as etcd's member that took the
                // request does: its member list already shows it. Best effort: a member that
                // removed itself has no leader to ask.
                let _ = self.ensure_linearizable().await;
                Ok(())
            }
            None => self.leader_change_members(change).await,
        }
    }

    /// The leader's side of [`Replica::change_members`]: etcd's checks, then the engine's
    /// change.
    pub async fn leader_change_members(&self, change: MemberChange) -> Result<(), ReplicaError> {
        let members = self.members();
        let find = |id: u64| members.iter().find(|m| m.id == id);
        let mut learner_now = false;
        match &change {
            MemberChange::Add {
                id,
                peer_url,
                learner,
            } => {
                if find(*id).is_some() {
                    return Err(MembershipError::IdExists.into());
                }
                if members.iter().any(|m| m.peer_url == *peer_url) {
                    return Err(MembershipError::PeerUrlExists.into());
                }
                if self.strict_reconfig_check {
                    let voters = self.reconfig_voters(&members).await?;
                    reconfig::may_add(&voters, self.member_id, *learner)
                        .map_err(MembershipError::from)?;
                }
            }
            MemberChange::Remove { id } => {
                learner_now = find(*id).ok_or(MembershipError::NotFound)?.learner;
                if self.strict_reconfig_check && !learner_now {
                    let voters = self.reconfig_voters(&members).await?;
                    reconfig::may_remove(&voters, self.member_id, *id)
                        .map_err(MembershipError::from)?;
                }
            }
            MemberChange::Promote { id } => {
                if !find(*id).ok_or(MembershipError::NotFound)?.learner {
                    return Err(MembershipError::NotLearner.into());
                }
                // A voter that holds little of the log would count in every quorum at once
                // (promoting a learner that never started made a one-member cluster lose its
                // leader); etcd refuses it the same way.
                if !self.engine.learner_in_sync(*id, self.member_id).await? {
                    return Err(MembershipError::LearnerNotReady.into());
                }
                learner_now = true;
            }
            MemberChange::Update { id, peer_url } => {
                learner_now = find(*id).ok_or(MembershipError::NotFound)?.learner;
                if members
                    .iter()
                    .any(|m| m.id != *id && m.peer_url == *peer_url)
                {
                    return Err(MembershipError::PeerUrlExists.into());
                }
            }
        }
        let promoting = matches!(change, MemberChange::Promote { .. });
        self.engine.change_members(&change, learner_now).await?;
        if promoting {
            self.telemetry
                .learners_promoted
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// The voters as `--strict-reconfig-check` sees them from here: started or not, and for
    /// how long this member has heard from each.
    async fn reconfig_voters(
        &self,
        members: &[MemberInfo],
    ) -> Result<Vec<reconfig::Voter>, ReplicaError> {
        let voters: Vec<&MemberInfo> = members.iter().filter(|m| !m.learner).collect();
        let heard = self
            .engine
            .heard_for_ticks(voters.iter().map(|m| m.id).collect())
            .await?;
        let tick = std::time::Duration::from_millis(self.heartbeat_interval_ms);
        Ok(voters
            .iter()
            .map(|m| {
                let heard_for = heard
                    .iter()
                    .find(|(id, _)| *id == m.id)
                    .and_then(|(_, ticks)| *ticks)
                    .map(|t| tick * u32::try_from(t).unwrap_or(u32::MAX));
                reconfig::Voter {
                    id: m.id,
                    // etcd counts a member named in `--initial-cluster` as started; here one
                    // that published itself, or that this member hears from, is.
                    started: m.published.is_some() || m.id == self.member_id || heard_for.is_some(),
                    heard_for,
                }
            })
            .collect())
    }
}
