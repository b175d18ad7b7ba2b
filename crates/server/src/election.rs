//! The v3election service (`v3electionpb.Election`): campaigners queue a key under `<name>/`
//! by create revision (see `recipe.rs`); the oldest key is the leader and its value the
//! proclaimed value. Observe follows the leader key from history, as a watch would.

use std::sync::Arc;

use leasehold_api::v3electionpb::{self as pb, election_server::Election};
use leasehold_mvcc::{self as mvcc, EventKind};
use leasehold_raft::LeaseId;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use crate::context::ServerContext;
use crate::convert;
use crate::error::{ApiError, Recipe, RecipeError};
use crate::recipe::{self, ReleaseOnDrop};
use leasehold_auth::Caller;

/// Observe responses a stream may have queued before the observer waits for the client.
const OBSERVE_QUEUE_LEN_MAX: usize = 16;
/// Revisions of history one Observe pass reads at most.
const OBSERVE_REVISIONS_PER_PASS: i64 = 10_000;

pub struct ElectionService {
    ctx: Arc<ServerContext>,
}

impl ElectionService {
    pub fn new(ctx: Arc<ServerContext>) -> ElectionService {
        ElectionService { ctx }
    }

    async fn campaign(
        &self,
        caller: Option<Caller>,
        req: pb::CampaignRequest,
    ) -> Result<pb::CampaignResponse, RecipeError> {
        let ctx = &self.ctx;
        let lease = recipe::session_lease(ctx, req.lease).await?;
        let prefix = recipe::queue_prefix(&req.name);
        let key = recipe::lease_key(&prefix, lease);
        let queued = recipe::txn(
            ctx,
            caller.as_ref(),
            mvcc::TxnRequest {
                compare: vec![recipe::create_revision_is(&key, 0)],
                success: vec![put(&key, req.value.clone(), lease)],
                failure: vec![recipe::get(&key)],
            },
        )
        .await?;
        let my_rev = if queued.succeeded {
            queued.revision
        } else {
            let existing = match queued.responses.first() {
                Some(mvcc::ResponseOp::Range(r)) => r.kvs.first().cloned(),
                _ => None,
            };
            let Some(existing) = existing else {
                return Err(RecipeError::SessionExpired(Recipe::Election));
            };
            if existing.value != req.value {
                // Already campaigning with another value: proclaim the new one.
                let proclaimed = proclaim(
                    ctx,
                    caller.as_ref(),
                    &key,
                    existing.create_revision,
                    lease,
                    req.value,
                )
                .await?;
                if !proclaimed.succeeded {
                    return Err(RecipeError::NotLeader);
                }
            }
            existing.create_revision
        };
        let resign = ReleaseOnDrop::arm(
            ctx.clone(),
            caller.clone(),
            recipe::delete_txn(&key, Some(my_rev)),
        );
        recipe::wait_for_turn(ctx, Recipe::Election, &prefix, &key, my_rev).await?;
        recipe::confirm_owner(ctx, Recipe::Election, &prefix, &key, my_rev, lease).await?;
        resign.disarm();
        Ok(pb::CampaignResponse {
            // etcd: the header of the campaign's own transaction.
            header: ctx.header().at(queued.revision),
            leader: Some(pb::LeaderKey {
                name: req.name,
                key,
                rev: my_rev,
                lease: lease.get(),
            }),
        })
    }

    async fn proclaim(
        &self,
        caller: Option<Caller>,
        req: pb::ProclaimRequest,
    ) -> Result<pb::ProclaimResponse, RecipeError> {
        let leader = leader_key(req.leader)?;
        // As etcd's server: a leader key without a lease proclaims with a fresh session lease.
        let lease = recipe::session_lease(&self.ctx, leader.lease).await?;
        let proclaimed = proclaim(
            &self.ctx,
            caller.as_ref(),
            &leader.key,
            leader.rev,
            lease,
            req.value,
        )
        .await?;
        if !proclaimed.succeeded {
            return Err(RecipeError::NotLeader);
        }
        Ok(pb::ProclaimResponse {
            header: self.ctx.header().at(proclaimed.revision),
        })
    }

    async fn leader(&self, req: pb::LeaderRequest) -> Result<pb::LeaderResponse, RecipeError> {
        let prefix = recipe::queue_prefix(&req.name);
        let (revision, first) = self
            .ctx
            .replica
            .read(true, |store| {
                store
                    .range(&recipe::first_created(&prefix))
                    .map(|r| (r.revision, r.kvs.into_iter().next()))
            })
            .await?
            .map_err(ApiError::from)?;
        let kv = first.ok_or(RecipeError::NoLeader)?;
        Ok(leader_response(&self.ctx, revision, kv))
    }

    async fn resign(
        &self,
        caller: Option<Caller>,
        req: pb::ResignRequest,
    ) -> Result<pb::ResignResponse, RecipeError> {
        let leader = leader_key(req.leader)?;
        // Not being the leader (any more) is not an error, as in etcd.
        let release = recipe::delete_txn(&leader.key, Some(leader.rev));
        let resigned = recipe::txn(&self.ctx, caller.as_ref(), release).await?;
        Ok(pb::ResignResponse {
            header: self.ctx.header().at(resigned.revision),
        })
    }
}

fn put(key: &[u8], value: Vec<u8>, lease: LeaseId) -> mvcc::RequestOp {
    mvcc::RequestOp::Put(mvcc::PutRequest {
        key: key.to_vec(),
        value,
        lease: Some(lease),
        ..mvcc::PutRequest::default()
    })
}

/// Puts `value` on the leader key if it is still the one created at `rev`.
async fn proclaim(
    ctx: &ServerContext,
    caller: Option<&Caller>,
    key: &[u8],
    rev: i64,
    lease: LeaseId,
    value: Vec<u8>,
) -> Result<mvcc::TxnResponse, ApiError> {
    recipe::txn(
        ctx,
        caller,
        mvcc::TxnRequest {
            compare: vec![recipe::create_revision_is(key, rev)],
            success: vec![put(key, value, lease)],
            failure: Vec::new(),
        },
    )
    .await
}

fn leader_key(leader: Option<pb::LeaderKey>) -> Result<pb::LeaderKey, RecipeError> {
    leader.ok_or(RecipeError::LeaderMissing)
}

fn leader_response(ctx: &ServerContext, revision: i64, kv: mvcc::KeyValue) -> pb::LeaderResponse {
    pb::LeaderResponse {
        header: ctx.header().at(revision),
        kv: Some(convert::key_value(kv)),
    }
}

/// Where Observe is: waiting for a first campaigner, or following the leader key.
enum Observed {
    NoLeader,
    Leader(Vec<u8>),
}

/// Streams the leader's key/value: the current one (or the first put under the prefix when
/// there is none), every put to that key, and after its deletion the next leader.
async fn observe(
    ctx: Arc<ServerContext>,
    prefix: Vec<u8>,
    tx: mpsc::Sender<Result<pb::LeaderResponse, Status>>,
) {
    let mut revisions = ctx.replica.subscribe_revisions();
    'leader: loop {
        revisions.borrow_and_update();
        let first = ctx
            .replica
            .read(true, |store| {
                let first = store
                    .range(&recipe::first_created(&prefix))
                    .map(|r| r.kvs.into_iter().next());
                (store.current_revision(), first)
            })
            .await;
        let (mut seen, first) = match first {
            Ok((rev, Ok(first))) => (rev, first),
            Ok((_, Err(e))) => return send_error(&tx, ApiError::from(e).into()).await,
            Err(e) => return send_error(&tx, ApiError::from(e).into()).await,
        };
        let mut state = match first {
            Some(kv) => {
                let key = kv.key.clone();
                if tx.send(Ok(leader_response(&ctx, seen, kv))).await.is_err() {
                    return;
                }
                Observed::Leader(key)
            }
            None => Observed::NoLeader,
        };
        loop {
            tokio::select! {
                changed = revisions.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tx.closed() => return,
            }
            let current = *revisions.borrow_and_update();
            while seen < current {
                let to = current.min(seen + OBSERVE_REVISIONS_PER_PASS);
                let events = ctx
                    .replica
                    .read(false, |store| {
                        (store.compact_revision() < seen + 1)
                            .then(|| store.events(seen + 1, to, usize::MAX))
                    })
                    .await;
                let events = match events {
                    Ok(Some(Ok(events))) => events,
                    // History gone (compacted): start over from the current leader.
                    Ok(None) => continue 'leader,
                    Ok(Some(Err(e))) => return send_error(&tx, ApiError::Mvcc(e).into()).await,
                    Err(e) => return send_error(&tx, ApiError::from(e).into()).await,
                };
                seen = to;
                for event in events {
                    match &state {
                        Observed::NoLeader => {
                            let under_prefix = event.kv.key.starts_with(&prefix);
                            if under_prefix && event.kind == EventKind::Put {
                                let key = event.kv.key.clone();
                                let rev = event.kv.mod_revision;
                                if tx
                                    .send(Ok(leader_response(&ctx, rev, event.kv)))
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                                state = Observed::Leader(key);
                            }
                        }
                        Observed::Leader(key) if *key == event.kv.key => match event.kind {
                            EventKind::Put => {
                                let rev = event.kv.mod_revision;
                                if tx
                                    .send(Ok(leader_response(&ctx, rev, event.kv)))
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                            }
                            // The leader is gone: whoever is first now leads.
                            EventKind::Delete => continue 'leader,
                        },
                        Observed::Leader(_) => {}
                    }
                }
            }
        }
    }
}

async fn send_error(tx: &mpsc::Sender<Result<pb::LeaderResponse, Status>>, e: RecipeError) {
    let _ = tx.send(Err(e.into())).await;
}

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(
        &self,
        req: Request<pb::CampaignRequest>,
    ) -> Result<Response<pb::CampaignResponse>, Status> {
        let caller = self.ctx.caller(&req)?;
        let req = req.into_inner();
        // As for a lock: etcd checks the transaction it makes of the request.
        self.ctx.limits.proposal_size(&req)?;
        ElectionService::campaign(self, caller, req)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn proclaim(
        &self,
        req: Request<pb::ProclaimRequest>,
    ) -> Result<Response<pb::ProclaimResponse>, Status> {
        let caller = self.ctx.caller(&req)?;
        let req = req.into_inner();
        self.ctx.limits.proposal_size(&req)?;
        ElectionService::proclaim(self, caller, req)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn leader(
        &self,
        req: Request<pb::LeaderRequest>,
    ) -> Result<Response<pb::LeaderResponse>, Status> {
        ElectionService::leader(self, req.into_inner())
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn observe(
        &self,
        req: Request<pb::LeaderRequest>,
    ) -> Result<Response<BoxStream<pb::LeaderResponse>>, Status> {
        let required = self.ctx.require_leader(&req)?;
        let prefix = recipe::queue_prefix(&req.into_inner().name);
        let (tx, rx) = mpsc::channel(OBSERVE_QUEUE_LEN_MAX);
        let ctx = self.ctx.clone();
        let task = observe(self.ctx.clone(), prefix, tx.clone());
        tokio::spawn(async move { ctx.guard_leader(required, tx, task).await });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn resign(
        &self,
        req: Request<pb::ResignRequest>,
    ) -> Result<Response<pb::ResignResponse>, Status> {
        let caller = self.ctx.caller(&req)?;
        ElectionService::resign(self, caller, req.into_inner())
            .await
            .map(Response::new)
            .map_err(Status::from)
    }
}
