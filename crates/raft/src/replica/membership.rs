//! Membership changes (etcd's MemberAdd, MemberRemove, MemberPromote, MemberUpdate) and the
//! member list.

use openraft::BasicNode;

use super::Replica;
use super::error::{MembershipError, ReplicaError};
use super::forward::leader_elsewhere;
use crate::command::MemberAttrs;

/// A membership change: etcd's MemberAdd, MemberRemove, MemberPromote and MemberUpdate.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum MemberChange {
    Add {
        id: u64,
        peer_url: String,
        learner: bool,
    },
    Remove {
        id: u64,
    },
    Promote {
        id: u64,
    },
    /// New peer URL for a member (openraft's node info; the member's id stays).
    Update {
        id: u64,
        peer_url: String,
    },
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

impl Replica {
    /// The current members, voters and learners, in id order.
    pub fn members(&self) -> Vec<MemberInfo> {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let state = self.shared.state.read().expect("state lock poisoned");
        membership
            .nodes()
            .map(|(id, node)| MemberInfo {
                id: *id,
                peer_url: node.addr.clone(),
                learner: !voters.contains(id),
                published: state.member_attrs.get(id).cloned(),
            })
            .collect()
    }

    /// Makes a membership change, on the leader (forwarded there from a follower); returns once
    /// the new configuration is committed.
    pub async fn change_members(&self, change: MemberChange) -> Result<(), ReplicaError> {
        match leader_elsewhere(&self.raft, self.member_id) {
            Some((leader, addr)) => self.forwarder.change_members(leader, addr, change).await,
            None => self.leader_change_members(change).await,
        }
    }

    /// The leader's side of [`Replica::change_members`].
    pub async fn leader_change_members(&self, change: MemberChange) -> Result<(), ReplicaError> {
        use openraft::ChangeMembers;
        let members = self.members();
        let find = |id: u64| members.iter().find(|m| m.id == id);
        let to_replica_error = |e| self.failure.client_write_error(e);
        match change {
            MemberChange::Add {
                id,
                peer_url,
                learner,
            } => {
                if find(id).is_some() {
                    return Err(MembershipError::IdExists.into());
                }
                if members.iter().any(|m| m.peer_url == peer_url) {
                    return Err(MembershipError::PeerUrlExists.into());
                }
                self.raft
                    .add_learner(id, BasicNode::new(&peer_url), false)
                    .await
                    .map_err(to_replica_error)?;
                if !learner {
                    self.raft
                        .change_membership(ChangeMembers::AddVoterIds([id].into()), false)
                        .await
                        .map_err(to_replica_error)?;
                }
            }
            MemberChange::Remove { id } => {
                let member = find(id).ok_or(MembershipError::NotFound)?;
                let change = if member.learner {
                    ChangeMembers::RemoveNodes([id].into())
                } else {
                    ChangeMembers::RemoveVoters([id].into())
                };
                self.raft
                    .change_membership(change, false)
                    .await
                    .map_err(to_replica_error)?;
            }
            MemberChange::Promote { id } => {
                let member = find(id).ok_or(MembershipError::NotFound)?;
                if !member.learner {
                    return Err(MembershipError::NotLearner.into());
                }
                self.raft
                    .change_membership(ChangeMembers::AddVoterIds([id].into()), false)
                    .await
                    .map_err(to_replica_error)?;
            }
            MemberChange::Update { id, peer_url } => {
                find(id).ok_or(MembershipError::NotFound)?;
                if members.iter().any(|m| m.id != id && m.peer_url == peer_url) {
                    return Err(MembershipError::PeerUrlExists.into());
                }
                let nodes = [(id, BasicNode::new(&peer_url))].into();
                self.raft
                    .change_membership(ChangeMembers::SetNodes(nodes), false)
                    .await
                    .map_err(to_replica_error)?;
            }
        }
        Ok(())
    }
}
