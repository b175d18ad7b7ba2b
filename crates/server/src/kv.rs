//! The KV service: validate, convert, then read from the applied state or write through the log.

use std::sync::Arc;

use leasehold_api::etcdserverpb::{self as pb, kv_server::Kv};
use leasehold_auth::Caller;
use leasehold_raft::{Compact, Propose};
use tonic::{Request, Response, Status};

use crate::context::ServerContext;
use crate::convert;
use crate::error::ApiError;
use crate::validate;

pub struct KvService {
    ctx: Arc<ServerContext>,
}

impl KvService {
    pub fn new(ctx: Arc<ServerContext>) -> KvService {
        KvService { ctx }
    }

    /// Proposes a write on behalf of `caller`; its reply, or why it was not applied.
    async fn propose<P: Propose>(
        &self,
        caller: Option<Caller>,
        request: P,
    ) -> Result<P::Reply, ApiError> {
        Ok(self.ctx.replica.propose_as(caller, request).await?)
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(
        &self,
        req: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        let caller = self.ctx.caller(&req)?;
        let req = req.into_inner();
        self.ctx.limits.message_size(&req)?;
        validate::range(&req).map_err(ApiError::from)?;
        self.ctx
            .check_read(caller.as_ref(), &req.key, &req.range_end)?;
        let linearizable = !req.serializable;
        let req = convert::range_request(req);
        let resp = self
            .ctx
            .replica
            .read(linearizable, |store| store.range(&req))
            .await
            .map_err(ApiError::from)?
            .map_err(ApiError::from)?;
        let header = self.ctx.header().at(resp.revision);
        Ok(Response::new(convert::range_response(header, resp)))
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        let caller = self.ctx.caller(&req)?;
        let req = req.into_inner();
        self.ctx.limits.proposal_size(&req)?;
        validate::put(&req).map_err(ApiError::from)?;
        let resp = self
            .propose(caller, convert::put_request(req))
            .await?
            .map_err(ApiError::from)?;
        let header = self.ctx.header().at(resp.revision);
        Ok(Response::new(convert::put_response(header, resp)))
    }

    async fn delete_range(
        &self,
        req: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let caller = self.ctx.caller(&req)?;
        let req = req.into_inner();
        self.ctx.limits.proposal_size(&req)?;
        validate::delete(&req).map_err(ApiError::from)?;
        let resp = self.propose(caller, convert::delete_request(req)).await?;
        let header = self.ctx.header().at(resp.revision);
        Ok(Response::new(convert::delete_response(header, resp)))
    }

    async fn txn(&self, req: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        let caller = self.ctx.caller(&req)?;
        let req = req.into_inner();
        // etcd's order: grpc-go's transport limit, then etcd's txn check, then the log's limit.
        self.ctx.limits.message_size(&req)?;
        validate::txn(&req, self.ctx.limits.txn_ops_max).map_err(ApiError::from)?;
        self.ctx.limits.proposal_size(&req)?;
        let resp = self
            .propose(caller, convert::txn_request(req))
            .await?
            .map_err(ApiError::from)?;
        let header = self.ctx.header().at(resp.revision);
        Ok(Response::new(convert::txn_response(header, resp)))
    }

    async fn compact(
        &self,
        req: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        // An admin's (etcd 3.6+).
        self.ctx.admin(&req)?;
        let req = req.into_inner();
        self.ctx.limits.proposal_size(&req)?;
        // Compaction is applied synchronously with the log entry, so `physical` is always
        // satisfied by the time the response is sent.
        let revision = self
            .propose(
                None,
                Compact {
                    revision: req.revision,
                },
            )
            .await?
            .map_err(ApiError::from)?;
        Ok(Response::new(pb::CompactionResponse {
            header: self.ctx.header().at(revision),
        }))
    }
}
