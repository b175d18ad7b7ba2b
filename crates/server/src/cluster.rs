//! Cluster: the member list and membership changes (MemberAdd, MemberRemove, MemberPromote,
//! MemberUpdate), made through Raft on the leader (forwarded there from a follower). Each member
//! publishes its name and client URLs through the log when it starts, so every member lists
//! every member's.

use std::sync::Arc;

use leasehold_api::etcdserverpb::{self as pb, cluster_server::Cluster};
use leasehold_raft::{MemberAttrs, MemberChange, MemberInfo};
use tonic::{Request, Response, Status};

use crate::context::ServerContext;
use crate::error::ApiError;
use crate::identity;

/// Whether `url` is `http://host:port` or `https://host:port` (an optional trailing slash), as
/// etcd requires of peer URLs.
fn is_peer_url(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return false;
    };
    let hostport = rest.strip_suffix('/').unwrap_or(rest);
    match hostport.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok()
        }
        None => false,
    }
}

/// Publishes this member's name and client URLs through the log, as etcd does when a member
/// starts, trying again after a failure once Raft's state here moves (or an election timeout
/// passes), until it is applied or `shutdown` turns true. Skipped when the state already holds
/// the same. `true` once the state holds them; `false` when it stopped first.
pub async fn publish_member(
    replica: Arc<leasehold_raft::Replica>,
    attrs: MemberAttrs,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> bool {
    let mut raft = replica.subscribe_raft_changes();
    loop {
        if *shutdown.borrow() {
            return false;
        }
        let known = replica.members().into_iter().find(|m| m.id == attrs.id);
        if known.is_some_and(|m| m.published.as_ref() == Some(&attrs)) {
            return true;
        }
        match replica.propose(attrs.clone()).await {
            Ok(()) => {
                tracing::info!(name = %attrs.name, client_urls = ?attrs.client_urls, "published this member's attributes");
                return true;
            }
            Err(e) => tracing::debug!("publishing this member's attributes: {e}; retrying"),
        }
        tokio::select! {
            alive = raft.next(replica.election_timeout()) => if !alive { return false; },
            _ = shutdown.changed() => {}
        }
    }
}

pub struct ClusterService {
    ctx: Arc<ServerContext>,
}

impl ClusterService {
    pub fn new(ctx: Arc<ServerContext>) -> ClusterService {
        ClusterService { ctx }
    }

    /// A member as etcd lists it: this member from its own flags; another with what it
    /// published when it started, or before that with its `--initial-cluster` name and no client
    /// URLs (a member added later has neither until it starts: etcdctl shows it "unstarted").
    fn member(&self, m: &MemberInfo) -> pb::Member {
        let this = m.id == self.ctx.member_id;
        let (name, client_urls) = match (&m.published, this) {
            (_, true) => (self.ctx.name.clone(), self.ctx.client_urls.clone()),
            (Some(published), false) => (published.name.clone(), published.client_urls.clone()),
            (None, false) => (
                self.ctx
                    .member_names
                    .get(&m.id)
                    .cloned()
                    .unwrap_or_default(),
                Vec::new(),
            ),
        };
        pb::Member {
            id: m.id,
            name,
            // This member's own flags may list several; the membership holds one per member.
            peer_ur_ls: if this && self.ctx.peer_urls.first() == Some(&m.peer_url) {
                self.ctx.peer_urls.clone()
            } else {
                vec![m.peer_url.clone()]
            },
            client_ur_ls: client_urls,
            is_learner: m.learner,
        }
    }

    fn members(&self) -> Vec<pb::Member> {
        self.ctx
            .replica
            .members()
            .iter()
            .map(|m| self.member(m))
            .collect()
    }

    /// etcd's Cluster service names the member and the term, but no revision.
    async fn header(&self) -> Result<Option<pb::ResponseHeader>, Status> {
        Ok(self.ctx.header().without_revision())
    }

    /// Membership changes need an admin while auth is on.
    fn admin<T>(&self, req: &Request<T>) -> Result<(), Status> {
        self.ctx.admin(req)?;
        Ok(())
    }

    async fn change(&self, change: MemberChange) -> Result<(), Status> {
        Ok(self
            .ctx
            .replica
            .change_members(change)
            .await
            .map_err(ApiError::from)?)
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        req: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        self.admin(&req)?;
        let req = req.into_inner();
        let peer_url = match req.peer_ur_ls.first() {
            Some(first) if req.peer_ur_ls.iter().all(|u| is_peer_url(u)) => first.clone(),
            _ => return Err(ApiError::BadPeerUrls.into()),
        };
        // etcd's: the URLs, the token and the second of the addition, so a member removed and
        // added back at the same URLs is a new member.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let id = identity::member_id(&req.peer_ur_ls, &self.ctx.cluster_token, Some(now));
        self.change(MemberChange::Add {
            id,
            peer_url,
            learner: req.is_learner,
        })
        .await?;
        let members = self.members();
        let member = pb::Member {
            id,
            name: String::new(),
            peer_ur_ls: req.peer_ur_ls,
            client_ur_ls: Vec::new(),
            is_learner: req.is_learner,
        };
        Ok(Response::new(pb::MemberAddResponse {
            header: self.header().await?,
            member: Some(member),
            members,
        }))
    }

    async fn member_remove(
        &self,
        req: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        self.admin(&req)?;
        self.change(MemberChange::Remove {
            id: req.get_ref().id,
        })
        .await?;
        Ok(Response::new(pb::MemberRemoveResponse {
            header: self.header().await?,
            members: self.members(),
        }))
    }

    async fn member_promote(
        &self,
        req: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        self.admin(&req)?;
        self.change(MemberChange::Promote {
            id: req.get_ref().id,
        })
        .await?;
        Ok(Response::new(pb::MemberPromoteResponse {
            header: self.header().await?,
            members: self.members(),
        }))
    }

    async fn member_update(
        &self,
        req: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        self.admin(&req)?;
        let req = req.into_inner();
        let peer_url = match req.peer_ur_ls.first() {
            Some(first) if req.peer_ur_ls.iter().all(|u| is_peer_url(u)) => first.clone(),
            _ => return Err(ApiError::BadPeerUrls.into()),
        };
        self.change(MemberChange::Update {
            id: req.id,
            peer_url,
        })
        .await?;
        Ok(Response::new(pb::MemberUpdateResponse {
            header: self.header().await?,
            members: self.members(),
        }))
    }

    async fn member_list(
        &self,
        req: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        // Any signed-in user may list (etcd 3.6+).
        self.ctx.signed_in(&req)?;
        Ok(Response::new(pb::MemberListResponse {
            header: self.header().await?,
            members: self.members(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_urls_must_be_scheme_host_port() {
        assert!(is_peer_url("http://127.0.0.1:2380"));
        assert!(is_peer_url("https://node-2.example:2380/"));
        assert!(is_peer_url("http://[::1]:2380"));
        assert!(!is_peer_url("127.0.0.1:2380"));
        assert!(!is_peer_url("http://127.0.0.1"));
        assert!(!is_peer_url("http://:2380"));
        assert!(!is_peer_url("http://127.0.0.1:99999"));
        assert!(!is_peer_url("http://h:1/path"));
        assert!(!is_peer_url("notaurl"));
    }
}
