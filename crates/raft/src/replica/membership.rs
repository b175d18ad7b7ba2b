//! Membership changes (etcd's MemberAdd, MemberRemove, MemberPromote, MemberUpdate) and the
//! member list.

use openraft::BasicNode;

use super::Replica;
use super::engine::Engine;
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
        // openraft's metrics themselves, not their copy in the status (which a task makes, so
        // it may lag a change that has just returned).
        let members = match &self.engine {
            Engine::Openraft { raft, .. } => {
                super::engine::from_openraft(&raft.metrics().borrow()).members
            }
            Engine::RaftRs(_) => self.status.borrow().members.clone(),
        };
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
            Some((leader, addr)) => self.forwarder.change_members(leader, addr, change).await,
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
            MemberChange::Add { id, peer_url, .. } => {
                if find(*id).is_some() {
                    return Err(MembershipError::IdExists.into());
                }
                if members.iter().any(|m| m.peer_url == *peer_url) {
                    return Err(MembershipError::PeerUrlExists.into());
                }
            }
            MemberChange::Remove { id } => {
                learner_now = find(*id).ok_or(MembershipError::NotFound)?.learner;
            }
            MemberChange::Promote { id } => {
                if !find(*id).ok_or(MembershipError::NotFound)?.learner {
                    return Err(MembershipError::NotLearner.into());
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
        match &self.engine {
            Engine::RaftRs(rs) => rs.change_members(&change, learner_now).await,
            Engine::Openraft { raft, .. } => {
                self.openraft_change_members(raft, change, learner_now)
                    .await
            }
        }
    }

    /// A checked membership change through openraft's joint consensus.
    async fn openraft_change_members(
        &self,
        raft: &openraft::Raft<crate::TypeConfig>,
        change: MemberChange,
        learner_now: bool,
    ) -> Result<(), ReplicaError> {
        use openraft::ChangeMembers;
        let to_replica_error = |e| self.failure.client_write_error(e);
        match change {
            MemberChange::Add {
                id,
                peer_url,
                learner,
            } => {
                raft.add_learner(id, BasicNode::new(&peer_url), false)
                    .await
                    .map_err(to_replica_error)?;
                if !learner {
                    raft.change_membership(ChangeMembers::AddVoterIds([id].into()), false)
                        .await
                        .map_err(to_replica_error)?;
                }
            }
            MemberChange::Remove { id } => {
                let change = if learner_now {
                    ChangeMembers::RemoveNodes([id].into())
                } else {
                    ChangeMembers::RemoveVoters([id].into())
                };
                raft.change_membership(change, false)
                    .await
                    .map_err(to_replica_error)?;
            }
            MemberChange::Promote { id } => {
                raft.change_membership(ChangeMembers::AddVoterIds([id].into()), false)
                    .await
                    .map_err(to_replica_error)?;
            }
            MemberChange::Update { id, peer_url } => {
                let nodes = [(id, BasicNode::new(&peer_url))].into();
                raft.change_membership(ChangeMembers::SetNodes(nodes), false)
                    .await
                    .map_err(to_replica_error)?;
            }
        }
        Ok(())
    }
}
