//! The v3lock service (`v3lockpb.Lock`): a mutex per name, queued by create revision (see
//! `recipe.rs`). Lock blocks until the caller's key is the oldest under `<name>/`, then answers
//! only if the caller still holds its key and its lease has time left.

use std::sync::Arc;

use leasehold_api::v3lockpb::{self as pb, lock_server::Lock};
use leasehold_mvcc as mvcc;
use tonic::{Request, Response, Status};

use crate::context::ServerContext;
use crate::error::{ApiError, Invalid, Recipe, RecipeError};
use crate::recipe::{self, ReleaseOnDrop};
use leasehold_auth::Caller;

pub struct LockService {
    ctx: Arc<ServerContext>,
}

impl LockService {
    pub fn new(ctx: Arc<ServerContext>) -> LockService {
        LockService { ctx }
    }

    async fn acquire(
        &self,
        caller: Option<Caller>,
        req: pb::LockRequest,
    ) -> Result<pb::LockResponse, RecipeError> {
        let ctx = &self.ctx;
        let lease = recipe::session_lease(ctx, req.lease).await?;
        let prefix = recipe::queue_prefix(&req.name);
        let key = recipe::lease_key(&prefix, lease);
        // Queue the key unless this lease already has one (the lock is re-entrant per lease),
        // and see who is first, in one transaction.
        let first = mvcc::RequestOp::Range(recipe::first_created(&prefix));
        let queued = recipe::txn(
            ctx,
            caller.as_ref(),
            mvcc::TxnRequest {
                compare: vec![recipe::create_revision_is(&key, 0)],
                success: vec![
                    mvcc::RequestOp::Put(mvcc::PutRequest {
                        key: key.clone(),
                        lease: Some(lease),
                        ..mvcc::PutRequest::default()
                    }),
                    first.clone(),
                ],
                failure: vec![recipe::get(&key), first],
            },
        )
        .await?;
        let my_rev = if queued.succeeded {
            queued.revision
        } else {
            match queued.responses.first() {
                Some(mvcc::ResponseOp::Range(r)) if !r.kvs.is_empty() => r.kvs[0].create_revision,
                _ => return Err(RecipeError::SessionExpired(Recipe::Lock)),
            }
        };
        let release = ReleaseOnDrop::arm(ctx.clone(), caller, recipe::delete_txn(&key, None));
        let owned_at_once = match queued.responses.get(1) {
            Some(mvcc::ResponseOp::Range(r)) => {
                r.kvs.first().is_none_or(|kv| kv.create_revision == my_rev)
            }
            _ => false,
        };
        if !owned_at_once {
            recipe::wait_for_turn(ctx, Recipe::Lock, &prefix, &key, my_rev).await?;
        }
        let checked_at =
            recipe::confirm_owner(ctx, Recipe::Lock, &prefix, &key, my_rev, lease).await?;
        release.disarm();
        // etcd: the header of the queueing txn when the lock was free, else of the read after
        // the wait.
        let revision = if owned_at_once {
            queued.revision
        } else {
            checked_at
        };
        Ok(pb::LockResponse {
            header: ctx.header().at(revision),
            key,
        })
    }

    async fn release(
        &self,
        caller: Option<Caller>,
        req: pb::UnlockRequest,
    ) -> Result<pb::UnlockResponse, RecipeError> {
        if req.key.is_empty() {
            return Err(ApiError::from(Invalid::EmptyKey).into());
        }
        // Deleting a key that is not there succeeds, as in etcd.
        let deleted = recipe::txn(
            &self.ctx,
            caller.as_ref(),
            recipe::delete_txn(&req.key, None),
        )
        .await?;
        Ok(pb::UnlockResponse {
            header: self.ctx.header().at(deleted.revision),
        })
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(
        &self,
        req: Request<pb::LockRequest>,
    ) -> Result<Response<pb::LockResponse>, Status> {
        let caller = self.ctx.caller(&req)?;
        let req = req.into_inner();
        // etcd checks the transaction it makes of the request (a few bytes more: the queue
        // key is the name plus the lease id), as it checks every proposal.
        self.ctx.limits.proposal_size(&req)?;
        self.acquire(caller, req)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn unlock(
        &self,
        req: Request<pb::UnlockRequest>,
    ) -> Result<Response<pb::UnlockResponse>, Status> {
        let caller = self.ctx.caller(&req)?;
        self.release(caller, req.into_inner())
            .await
            .map(Response::new)
            .map_err(Status::from)
    }
}
