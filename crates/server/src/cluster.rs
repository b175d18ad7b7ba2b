//! Cluster: the member list and membership changes (MemberAdd, MemberRemove, MemberPromote),
//! made through Raft on the leader (forwarded there from a follower). MemberUpdate (changing a
//! member's peer URLs) answers `Unimplemented`.

use std::sync::Arc;

use leasehold_api::etcdserverpb::{self as pb, cluster_server::Cluster};
use leasehold_raft::{MemberChange, MemberInfo};
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

pub struct ClusterService {
    ctx: Arc<ServerContext>,
}

impl ClusterService {
    pub fn new(ctx: Arc<ServerContext>) -> ClusterService {
        ClusterService { ctx }
    }

    /// A member as etcd lists it. This member knows its own name and client URLs; the others'
    /// names come from `--initial-cluster` (members added later have none, which etcdctl shows
    /// as "unstarted"), and their client URLs are not known.
    fn member(&self, m: &MemberInfo) -> pb::Member {
        let this = m.id == self.ctx.member_id;
        pb::Member {
            id: m.id,
            name: if this {
                self.ctx.name.clone()
            } else {
                self.ctx
                    .member_names
                    .get(&m.id)
                    .cloned()
                    .unwrap_or_default()
            },
            peer_ur_ls: if this {
                self.ctx.peer_urls.clone()
            } else {
                vec![m.peer_url.clone()]
            },
            client_ur_ls: if this {
                self.ctx.client_urls.clone()
            } else {
                Vec::new()
            },
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
        let req = req.into_inner();
        let peer_url = match req.peer_ur_ls.first() {
            Some(first) if req.peer_ur_ls.iter().all(|u| is_peer_url(u)) => first.clone(),
            _ => return Err(ApiError::BadPeerUrls.into()),
        };
        let id = identity::member_id(&req.peer_ur_ls, &self.ctx.cluster_token);
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
        self.change(MemberChange::Promote {
            id: req.get_ref().id,
        })
        .await?;
        Ok(Response::new(pb::MemberPromoteResponse {
            header: self.header().await?,
            members: self.members(),
        }))
    }

    async fn member_list(
        &self,
        _req: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
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
