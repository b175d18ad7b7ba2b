//! What every service needs: the replica, this member's identity and its per-member settings.

use std::sync::Arc;

use leasehold_raft::Replica;

use crate::convert::Header;
use crate::lease_ids::LeaseIdGenerator;
use crate::metrics::Metrics;

pub struct ServerContext {
    pub replica: Arc<Replica>,
    pub cluster_id: u64,
    pub member_id: u64,
    pub name: String,
    pub client_urls: Vec<String>,
    pub peer_urls: Vec<String>,
    /// etcd's minimum TTL for this member's timing (see `validate::lease_ttl_secs_min`).
    pub lease_ttl_secs_min: i64,
    pub lease_ids: LeaseIdGenerator,
    /// How often idle watchers that asked for progress notifications get one (etcd: 10 min).
    pub watch_progress_interval: std::time::Duration,
    /// `--initial-cluster-token`: mixed into the IDs of members added later.
    pub cluster_token: String,
    /// Names of the other members, as `--initial-cluster` gives them.
    pub member_names: std::collections::BTreeMap<u64, String>,
    /// What `/metrics` exports.
    pub metrics: Arc<Metrics>,
    /// `--max-request-bytes` and `--max-txn-ops`.
    pub limits: crate::Limits,
    /// `--grpc-keepalive-interval` and `--grpc-keepalive-timeout`, for the client server.
    pub keepalive: crate::GrpcKeepalive,
    /// `--enable-grpc-gateway`: serve the JSON gateway (`/v3/...`) on the client port.
    pub json_gateway: bool,
    /// `--bcrypt-cost`: of the passwords this member hashes.
    pub bcrypt_cost: u32,
    /// `--auth-token`: simple tokens, or JWTs signed and verified with these keys.
    pub tokens: crate::jwt::TokenMode,
}

impl ServerContext {
    /// The header parts that do not depend on the response: identity and the current term.
    pub fn header(&self) -> Header {
        Header {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            raft_term: self.replica.status().term,
        }
    }
}

/// etcd's `hasleader` metadata: a stream that carries it wants to fail rather than be served by
/// a member without a leader.
const REQUIRE_LEADER_KEY: &str = "hasleader";

impl ServerContext {
    /// etcd's check for streams that require a leader: `Unavailable "etcdserver: no leader"` if
    /// the request carries `hasleader: true` and this member knows no leader. Returns whether
    /// the stream requires a leader (see [`ServerContext::guard_leader`]).
    pub fn require_leader<T>(&self, req: &tonic::Request<T>) -> Result<bool, tonic::Status> {
        let required = req
            .metadata()
            .get(REQUIRE_LEADER_KEY)
            .is_some_and(|v| v.as_bytes() == b"true");
        if required && self.replica.status().leader.is_none() {
            return Err(no_leader());
        }
        Ok(required)
    }

    /// Runs a stream's task until it ends, or until the member stops (then the stream ends
    /// with `Unavailable "etcdserver: server stopped"`, so a client reconnects elsewhere and a
    /// graceful stop is not held up by open streams); if the stream requires a leader, also
    /// until this member has had no leader for three election timeouts (`Unavailable
    /// "etcdserver: no leader"`), as etcd does.
    pub async fn guard_leader<T>(
        &self,
        required: bool,
        tx: tokio::sync::mpsc::Sender<Result<T, tonic::Status>>,
        task: impl std::future::Future<Output = ()>,
    ) {
        let lost = async {
            if required {
                let lost_for = 3 * self.replica.election_timeout();
                self.replica.leader_lost_for(lost_for).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = task => {}
            () = lost => {
                let _ = tx.send(Err(no_leader())).await;
            }
            () = self.replica.stopping() => {
                let _ = tx.send(Err(stopped())).await;
            }
        }
    }
}

fn no_leader() -> tonic::Status {
    crate::error::ApiError::from(leasehold_raft::ReplicaError::NoLeader).into()
}

fn stopped() -> tonic::Status {
    crate::error::ApiError::from(leasehold_raft::ReplicaError::Stopped).into()
}
