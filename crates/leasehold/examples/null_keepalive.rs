//! A Lease service that does no work: grants hand out ids from a counter and renewals are echoed
//! at once, each stream answering as fast as it reads. It is the ceiling a real server's
//! keepalive throughput is compared with in docs/bench.md ("share of a no-work server"): the
//! same `leasehold bench lease-keepalive` client, the same gRPC stack, nothing behind it.
//!
//! ```text
//! cargo run --release -p leasehold --example null_keepalive -- 127.0.0.1:23999 &
//! leasehold bench lease-keepalive --leases 5000 --streams 1 --duration 8 \
//!     --endpoints http://127.0.0.1:23999
//! ```

use std::sync::atomic::{AtomicI64, Ordering};

use leasehold_api::etcdserverpb::lease_server::{Lease, LeaseServer};
use leasehold_api::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use tokio_stream::StreamExt as _;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};

#[derive(Default)]
struct NullLease {
    next_id: AtomicI64,
}

#[tonic::async_trait]
impl Lease for NullLease {
    async fn lease_grant(
        &self,
        req: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        Ok(Response::new(LeaseGrantResponse {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            ttl: req.into_inner().ttl,
            ..Default::default()
        }))
    }

    async fn lease_revoke(
        &self,
        _: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        Ok(Response::new(LeaseRevokeResponse::default()))
    }

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<BoxStream<LeaseKeepAliveResponse>>, Status> {
        let echoed = req.into_inner().map(|r| {
            r.map(|r| LeaseKeepAliveResponse {
                id: r.id,
                ttl: 60,
                ..Default::default()
            })
        });
        Ok(Response::new(Box::pin(echoed)))
    }

    async fn lease_time_to_live(
        &self,
        _: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        Err(Status::unimplemented("no-work server"))
    }

    async fn lease_leases(
        &self,
        _: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        Err(Status::unimplemented("no-work server"))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:23999".to_owned());
    tonic::transport::Server::builder()
        .add_service(LeaseServer::new(NullLease::default()))
        .serve(addr.parse()?)
        .await?;
    Ok(())
}
