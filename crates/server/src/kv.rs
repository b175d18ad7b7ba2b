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

/// A RangeStream's first chunk holds at most this many keys; later ones grow or shrink toward
/// `--max-request-bytes` each.
const RANGE_STREAM_FIRST_CHUNK: i64 = 10;

/// The next chunk's key limit: doubled when the last chunk was under half the target size,
/// halved when it was over twice it, never below 1.
fn next_chunk_limit(limit: i64, last_bytes: usize, target_bytes: usize) -> i64 {
    let limit = if last_bytes < target_bytes / 2 {
        limit.saturating_mul(2)
    } else if last_bytes > target_bytes.saturating_mul(2) {
        limit / 2
    } else {
        limit
    };
    limit.max(1)
}

impl KvService {
    /// One serializable read of `r` from this member's applied state.
    async fn read_range(
        ctx: &ServerContext,
        r: &leasehold_mvcc::RangeRequest,
    ) -> Result<leasehold_mvcc::RangeResponse, ApiError> {
        Ok(ctx.replica.range(false, r.clone()).await??)
    }

    /// Sends `req`'s range as RangeStream chunks on `tx`, each read at the revision the first
    /// read pinned (a serializable read: the caller made the linearizable wait, if asked), so the
    /// state is held for one chunk at a time. Ends at the last chunk or at the first error, sent
    /// as the stream's status.
    async fn range_chunks(
        ctx: Arc<ServerContext>,
        req: pb::RangeRequest,
        tx: tokio::sync::mpsc::Sender<Result<pb::RangeStreamResponse, Status>>,
    ) {
        let total_limit = if req.limit > 0 { req.limit } else { i64::MAX };
        let target_bytes = ctx.limits.request_bytes_max;
        let count_only = req.count_only;
        let mut r = convert::range_request(req);
        r.serializable = true;
        let mut limit = RANGE_STREAM_FIRST_CHUNK.min(total_limit);
        let mut pinned = None;
        let mut sent: i64 = 0;
        loop {
            r.limit = if count_only { 0 } else { limit };
            let resp = match Self::read_range(&ctx, &r).await {
                Ok(resp) => resp,
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
            };
            let header_rev = *pinned.get_or_insert(resp.revision);
            if r.revision <= 0 {
                r.revision = header_rev;
            }
            if count_only {
                let out = pb::RangeResponse {
                    header: ctx.header().at(header_rev),
                    count: resp.count,
                    ..Default::default()
                };
                let _ = tx
                    .send(Ok(pb::RangeStreamResponse {
                        range_response: Some(out),
                    }))
                    .await;
                return;
            }
            sent += resp.kvs.len() as i64;
            let next_key = resp
                .more
                .then(|| {
                    resp.kvs
                        .last()
                        .map(|kv| [kv.key.as_slice(), b"\0"].concat())
                })
                .flatten();
            let done = !resp.more || sent >= total_limit;
            let mut out = pb::RangeResponse {
                header: None,
                kvs: resp.kvs.into_iter().map(convert::key_value).collect(),
                more: false,
                count: 0,
            };
            let chunk_bytes = prost::Message::encoded_len(&out);
            if done {
                out.header = ctx.header().at(header_rev);
                out.more = resp.more;
                out.count = sent;
                if let Some(next_key) = &next_key {
                    let mut rest = r.clone();
                    rest.key = next_key.clone();
                    rest.count_only = true;
                    rest.limit = 0;
                    match Self::read_range(&ctx, &rest).await {
                        Ok(left) => out.count += left.count,
                        Err(e) => {
                            let _ = tx.send(Err(e.into())).await;
                            return;
                        }
                    }
                }
            }
            let chunk = pb::RangeStreamResponse {
                range_response: Some(out),
            };
            if tx.send(Ok(chunk)).await.is_err() || done {
                return;
            }
            r.key = next_key.unwrap_or_default();
            limit = next_chunk_limit(limit, chunk_bytes, target_bytes).min(total_limit - sent);
        }
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    /// etcd 3.7's chunked range: the same keys as Range, in chunks near `--max-request-bytes`,
    /// at one revision. Default key order only, and no revision filters (etcd's Unimplemented
    /// answers otherwise).
    async fn range_stream(
        &self,
        req: Request<pb::RangeRequest>,
    ) -> Result<Response<tonic::codegen::BoxStream<pb::RangeStreamResponse>>, Status> {
        let caller = self.ctx.caller(&req)?;
        let req = req.into_inner();
        self.ctx.limits.message_size(&req)?;
        validate::range(&req).map_err(ApiError::from)?;
        let default_order = req.sort_order == pb::range_request::SortOrder::None as i32
            || (req.sort_target == pb::range_request::SortTarget::Key as i32
                && req.sort_order == pb::range_request::SortOrder::Ascend as i32);
        if !default_order {
            return Err(Status::unimplemented(
                "RangeStream does not support custom sort orders",
            ));
        }
        if req.min_mod_revision != 0
            || req.max_mod_revision != 0
            || req.min_create_revision != 0
            || req.max_create_revision != 0
        {
            return Err(Status::unimplemented(
                "RangeStream does not support revision filters",
            ));
        }
        if !req.serializable {
            self.ctx
                .replica
                .read(true, |_| ())
                .await
                .map_err(ApiError::from)?;
        }
        self.ctx
            .check_read(caller.as_ref(), &req.key, &req.range_end)?;
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(Self::range_chunks(self.ctx.clone(), req, tx));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

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
        let started = std::time::Instant::now();
        let resp = self.ctx.replica.range(linearizable, req).await;
        let ok = matches!(resp, Ok(Ok(_)));
        self.ctx.metrics.range_served(ok, started.elapsed());
        let resp = resp.map_err(ApiError::from)?.map_err(ApiError::from)?;
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
        // The compaction is applied (reads below it refused) by the time this member answers;
        // its rows leave the file afterwards, which `physical` waits for.
        let revision = self
            .propose(
                None,
                Compact {
                    revision: req.revision,
                },
            )
            .await?
            .map_err(ApiError::from)?;
        if req.physical {
            self.ctx
                .replica
                .compacted_physically(req.revision)
                .await
                .map_err(ApiError::from)?;
        }
        Ok(Response::new(pb::CompactionResponse {
            header: self.ctx.header().at(revision),
        }))
    }
}
