//! The Lease service. Grants, revokes and renewals are proposed through the log with the
//! leader's lease time; TimeToLive and Leases read the applied lease table.

use std::sync::Arc;

use futures::stream::{FuturesOrdered, StreamExt as _};
use leasehold_api::etcdserverpb::{self as pb, lease_server::Lease};
use leasehold_raft::{LeaseGrant, LeaseId, LeaseRevoke, ReplicaError};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};

use crate::context::ServerContext;
use crate::error::ApiError;
use crate::validate;

/// Responses a keepalive stream may have queued before the sender waits for the client.
const KEEPALIVE_QUEUE_LEN_MAX: usize = 16;
/// With two election timeouts, how long a renewal waits for a leader (etcd's request timeout).
const RENEW_LEADER_WAIT_BASE: std::time::Duration = std::time::Duration::from_secs(5);
/// Renewals one keepalive stream has in flight at once (read ahead of their answers).
const KEEPALIVE_IN_FLIGHT_MAX: usize = 4096;

pub struct LeaseService {
    ctx: Arc<ServerContext>,
}

impl LeaseService {
    pub fn new(ctx: Arc<ServerContext>) -> LeaseService {
        LeaseService { ctx }
    }

    /// Opens one keepalive stream over `inbound` (the gRPC request stream, or the JSON
    /// gateway's decoded body) and returns its answers; see [`keep_alive_stream`].
    pub(crate) fn open_keep_alive<S>(
        &self,
        required: bool,
        inbound: S,
    ) -> BoxStream<pb::LeaseKeepAliveResponse>
    where
        S: futures::Stream<Item = Result<pb::LeaseKeepAliveRequest, Status>>
            + Unpin
            + Send
            + 'static,
    {
        let (tx, rx) = mpsc::channel(KEEPALIVE_QUEUE_LEN_MAX);
        let guard = (self.ctx.clone(), tx.clone());
        let task = keep_alive_stream(self.ctx.clone(), inbound, tx);
        tokio::spawn(async move {
            let (ctx, tx) = guard;
            ctx.guard_leader(required, tx, task).await;
        });
        Box::pin(ReceiverStream::new(rx))
    }
}

/// The store revision, for headers of lease responses (lease operations never change it unless a
/// revoke deletes keys).
async fn current_revision(ctx: &ServerContext) -> Result<i64, ApiError> {
    Ok(ctx.replica.read(false, |s| s.current_revision()).await?)
}

/// Grants lease `id` for `ttl_secs` (already validated), counting from the leader's lease time
/// (the member that commits the grant stamps it, whichever member a client talks to).
pub(crate) async fn grant(ctx: &ServerContext, id: LeaseId, ttl_secs: i64) -> Result<(), ApiError> {
    Ok(ctx.replica.propose(LeaseGrant { id, ttl_secs }).await??)
}

/// One renewal: the TTL renewed for, or 0 for an unknown (or expired, now revoked) lease.
///
/// A renewal that finds no leader (an election, or a leader that stopped answering) waits for
/// the next one and is tried again, for up to etcd's request timeout (5 s plus two election
/// timeouts), as etcd's `LeaseRenew` waits for a leader rather than failing the stream. A new
/// leader leaves inherited leases only the election timeout, so a holder that gave up here and
/// came back after its client-side pause could miss it. Renewing twice is harmless: a renewal
/// only ever sets `now + TTL` for a holder that asked.
async fn renew(ctx: &ServerContext, id: i64) -> Result<i64, ApiError> {
    let Some(id) = LeaseId::from_wire(id) else {
        return Ok(0);
    };
    let election_timeout = ctx.replica.election_timeout();
    let give_up = std::time::Instant::now() + RENEW_LEADER_WAIT_BASE + 2 * election_timeout;
    // Made before the first try, so a change while it is under way is not missed.
    let mut raft = ctx.replica.subscribe_raft_changes();
    loop {
        match ctx.replica.renew_lease(id).await {
            Ok(ttl) => return Ok(ttl.unwrap_or(0)),
            Err(ReplicaError::NoLeader) => {
                let left = give_up.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Err(ReplicaError::NoLeader.into());
                }
                // Again once Raft's state here moves (an election, a transfer that ends, the
                // next commit), or after an election timeout: never in a tight loop against a
                // leader that is known but not serving, and never later than raft-rs's own
                // timers settle what does not show in that state.
                if !raft.next(left.min(election_timeout)).await {
                    return Err(ReplicaError::Stopped.into());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Serves one keepalive stream. Requests are read ahead, up to [`KEEPALIVE_IN_FLIGHT_MAX`]
/// renewals are in flight at once (so they share log entries with each other and with every
/// other stream's), and answers go out in request order. An unknown lease gets TTL 0 and the
/// stream stays open; any other failure ends the stream with its status, as in etcd. When the
/// client closes its side, the renewals in flight are still answered.
async fn keep_alive_stream<S>(
    ctx: Arc<ServerContext>,
    mut inbound: S,
    tx: mpsc::Sender<Result<pb::LeaseKeepAliveResponse, Status>>,
) where
    S: futures::Stream<Item = Result<pb::LeaseKeepAliveRequest, Status>> + Unpin,
{
    let mut in_flight = FuturesOrdered::new();
    let mut inbound_open = true;
    let received = ctx
        .metrics
        .received_on("etcdserverpb.Lease", "LeaseKeepAlive");
    loop {
        tokio::select! {
            // Answers first: they free room for more requests and never wait on the client.
            biased;
            Some(answer) = in_flight.next(), if !in_flight.is_empty() => {
                let answer: Result<pb::LeaseKeepAliveResponse, Status> = answer;
                let failed = answer.is_err();
                if tx.send(answer).await.is_err() || failed {
                    return;
                }
            }
            msg = inbound.next(), if inbound_open && in_flight.len() < KEEPALIVE_IN_FLIGHT_MAX => {
                match msg {
                    Some(Ok(msg)) => {
                        received.one(prost::Message::encoded_len(&msg));
                        let ctx = ctx.clone();
                        in_flight.push_back(async move {
                            keep_alive_once(&ctx, msg.id).await.map_err(Status::from)
                        });
                    }
                    None | Some(Err(_)) => inbound_open = false,
                }
            }
            else => return,
        }
    }
}

/// One keepalive answer. The header is taken before the renewal, as etcd does.
async fn keep_alive_once(
    ctx: &ServerContext,
    id: i64,
) -> Result<pb::LeaseKeepAliveResponse, ApiError> {
    let revision = current_revision(ctx).await?;
    let ttl = renew(ctx, id).await?;
    Ok(pb::LeaseKeepAliveResponse {
        header: ctx.header().at(revision),
        id,
        ttl,
    })
}

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        req: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        // Any signed-in user may grant (etcd 3.6+).
        self.ctx.signed_in(&req)?;
        let req = req.into_inner();
        self.ctx.limits.proposal_size(&req)?;
        let ttl_secs = validate::lease_ttl(req.ttl, self.ctx.lease_ttl_secs_min)?;
        let id = LeaseId::from_wire(req.id).unwrap_or_else(|| self.ctx.lease_ids.next_id());
        grant(&self.ctx, id, ttl_secs).await?;
        self.ctx.metrics.lease_granted(ttl_secs);
        let revision = current_revision(&self.ctx).await?;
        Ok(Response::new(pb::LeaseGrantResponse {
            header: self.ctx.header().at(revision),
            id: id.get(),
            ttl: ttl_secs,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        req: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        // A signed-in caller (etcd 3.6+), who needs write permission on every key of the lease
        // (checked when applied).
        let caller = self.ctx.signed_in(&req)?;
        let req = req.into_inner();
        let Some(id) = LeaseId::from_wire(req.id) else {
            return Err(ApiError::from(leasehold_raft::LeaseError::NotFound).into());
        };
        let revision = self
            .ctx
            .replica
            .propose_as(caller, LeaseRevoke { id })
            .await
            .map_err(ApiError::from)?
            .map_err(ApiError::from)?;
        Ok(Response::new(pb::LeaseRevokeResponse {
            header: self.ctx.header().at(revision),
        }))
    }

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<BoxStream<pb::LeaseKeepAliveResponse>>, Status> {
        let required = self.ctx.require_leader(&req)?;
        Ok(Response::new(
            self.open_keep_alive(required, req.into_inner()),
        ))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        // A signed-in caller (etcd 3.6+), who must be able to read every key listed.
        let caller = self.ctx.signed_in(&req)?;
        let req = req.into_inner();
        // Measured against the leader's lease time, wherever the request arrives.
        let found = match LeaseId::from_wire(req.id) {
            Some(id) => self
                .ctx
                .replica
                .read_at_lease_time(|_, leases, at| at.time_to_live(leases, id, req.keys))
                .await
                .map_err(ApiError::from)?,
            None => None,
        };
        if let Some(found) = &found {
            for key in &found.keys {
                self.ctx.check_read(caller.as_ref(), key, &[])?;
            }
        }
        let revision = current_revision(&self.ctx).await?;
        // An unknown lease is not an error: TTL -1, as etcd answers.
        let (ttl, granted_ttl, keys) = match found {
            Some(t) => (
                t.remaining_secs,
                t.granted_ttl_secs,
                t.keys.iter().map(|k| k.to_vec()).collect(),
            ),
            None => (-1, 0, Vec::new()),
        };
        Ok(Response::new(pb::LeaseTimeToLiveResponse {
            header: self.ctx.header().at(revision),
            id: req.id,
            ttl,
            granted_ttl,
            keys,
        }))
    }

    async fn lease_leases(
        &self,
        req: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        // A signed-in caller (etcd 3.6+); one without the root role must be able to read every
        // key attached to any lease.
        let caller = self.ctx.signed_in(&req)?;
        let admin = self.ctx.check_admin(caller.as_ref()).is_ok();
        // Local, not linearizable, as in etcd.
        let (ids, keys) = self
            .ctx
            .replica
            .read_leases(false, |t| {
                let keys: Vec<Vec<u8>> = if admin {
                    Vec::new()
                } else {
                    t.iter_by_deadline()
                        .flat_map(|l| l.keys().map(<[u8]>::to_vec).collect::<Vec<_>>())
                        .collect()
                };
                (t.by_deadline(), keys)
            })
            .await
            .map_err(ApiError::from)?;
        for key in &keys {
            self.ctx.check_read(caller.as_ref(), key, &[])?;
        }
        let revision = current_revision(&self.ctx).await?;
        Ok(Response::new(pb::LeaseLeasesResponse {
            header: self.ctx.header().at(revision),
            leases: ids
                .into_iter()
                .map(|id| pb::LeaseStatus { id: id.get() })
                .collect(),
        }))
    }
}
