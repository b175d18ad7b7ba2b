//! Cluster: the member list. Membership changes arrive with the replicated-cluster work and
//! answer `Unimplemented` until then.

use std::sync::Arc;

use leasehold_api::etcdserverpb::{self as pb, cluster_server::Cluster};
use tonic::{Request, Response, Status};

use crate::context::ServerContext;

pub struct ClusterService {
    ctx: Arc<ServerContext>,
}

impl ClusterService {
    pub fn new(ctx: Arc<ServerContext>) -> ClusterService {
        ClusterService { ctx }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_list(
        &self,
        _req: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        let members = self
            .ctx
            .replica
            .members()
            .into_iter()
            .map(|(id, peer_url)| {
                let this = id == self.ctx.member_id;
                pb::Member {
                    id,
                    name: if this {
                        self.ctx.name.clone()
                    } else {
                        String::new()
                    },
                    peer_ur_ls: if this {
                        self.ctx.peer_urls.clone()
                    } else {
                        vec![peer_url]
                    },
                    client_ur_ls: if this {
                        self.ctx.client_urls.clone()
                    } else {
                        Vec::new()
                    },
                    is_learner: false,
                }
            })
            .collect();
        let revision = self
            .ctx
            .replica
            .read(false, |s| s.current_revision())
            .await
            .map_err(crate::error::ApiError::from)?;
        Ok(Response::new(pb::MemberListResponse {
            header: self.ctx.header().at(revision),
            members,
        }))
    }
}
