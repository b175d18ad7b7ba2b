//! The etcd v3 gRPC services of leasehold. It owns the wire: validation in etcd's order,
//! conversion between protobuf and the core's types, and the mapping of every error to etcd's
//! status code and message. It must never touch storage or the log directly: everything goes
//! through [`leasehold_raft::Replica`].
//!
//! ```text
//!   client connection ─► AuthorityFix (a URL `:authority` becomes host:port) ─► hyper, tonic
//!   gRPC request ─► validate ─► convert ─► Replica::{read, write} ─► convert ─► gRPC response
//!                                    errors ─► error.rs ─► tonic::Status
//!   expiry driver (leader): sleep until the next deadline ─► propose LeaseExpire { due leases }
//!   watch stream: new revision published ─► read unseen events from history ─► responses
//!   lock / election: queue a key per lease by create revision ─► wait for the older key to go
//!                    ─► fencing check (key still ours, lease has time left) ─► answer
//! ```

mod authority;
mod cluster;
mod context;
mod convert;
mod election;
mod error;
mod expiry;
mod health;
pub mod identity;
mod kv;
mod lease;
mod lock;
mod maintenance;
mod recipe;
mod validate;
mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_api::etcdserverpb::cluster_server::ClusterServer;
use leasehold_api::etcdserverpb::kv_server::KvServer;
use leasehold_api::etcdserverpb::lease_server::LeaseServer;
use leasehold_api::etcdserverpb::maintenance_server::MaintenanceServer;
use leasehold_api::etcdserverpb::watch_server::WatchServer;
use leasehold_api::v3electionpb::election_server::ElectionServer;
use leasehold_api::v3lockpb::lock_server::LockServer;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;

pub use context::ServerContext;
pub use expiry::{ExpiryConfig, drive_lease_expiry};
pub use lease::LeaseIdGenerator;
pub use maintenance::ETCD_API_VERSION;
pub use validate::lease_ttl_secs_min;
pub use validate::{GRPC_MESSAGE_BYTES_MAX, REQUEST_BYTES_MAX, TXN_OPS_MAX};

/// Decoding limit handed to tonic: above grpc-go's limit so that our own check (with grpc-go's
/// message) decides, and bounded so a client cannot make us buffer arbitrary amounts.
const DECODE_BYTES_MAX: usize = 2 * GRPC_MESSAGE_BYTES_MAX;

/// Serves the client API on `listener` until `shutdown` completes, then drains in-flight calls.
pub async fn serve(
    ctx: Arc<ServerContext>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    // Small request/response pairs must not wait for Nagle's algorithm (40 ms with delayed ACKs).
    // Each connection reaches hyper through `AuthorityFix`, so etcdctl 3.4's URL `:authority`
    // is repaired before h2 refuses it (authority.rs).
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        conn.map(|stream| {
            if let Err(e) = stream.set_nodelay(true) {
                tracing::warn!("TCP_NODELAY: {e}");
            }
            authority::AuthorityFix::new(stream)
        })
    });
    let mut grpc = tonic::service::Routes::builder();
    grpc.add_service(
        KvServer::new(kv::KvService::new(ctx.clone())).max_decoding_message_size(DECODE_BYTES_MAX),
    )
    .add_service(LeaseServer::new(lease::LeaseService::new(ctx.clone())))
    .add_service(
        WatchServer::new(watch::WatchService::new(ctx.clone()))
            .max_decoding_message_size(DECODE_BYTES_MAX),
    )
    .add_service(MaintenanceServer::new(
        maintenance::MaintenanceService::new(ctx.clone()),
    ))
    .add_service(ClusterServer::new(cluster::ClusterService::new(
        ctx.clone(),
    )))
    .add_service(LockServer::new(lock::LockService::new(ctx.clone())))
    .add_service(ElectionServer::new(election::ElectionService::new(
        ctx.clone(),
    )))
    .add_service(grpc_health(&ctx));
    // etcd serves its HTTP endpoints on the client port too, over HTTP/1.1 as well as HTTP/2.
    let routes = tonic::service::Routes::from(
        grpc.routes()
            .into_axum_router()
            .merge(health::router(ctx))
            .fallback(health::not_found),
    );
    tonic::transport::Server::builder()
        .accept_http1(true)
        .http2_keepalive_interval(Some(Duration::from_secs(2 * 60 * 60)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Serves only the HTTP endpoints (no gRPC) on `listener`, as etcd serves
/// `--listen-metrics-urls`, until `shutdown` completes.
pub async fn serve_http(
    ctx: Arc<ServerContext>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let routes = tonic::service::Routes::from(health::router(ctx).fallback(health::not_found));
    tonic::transport::Server::builder()
        .accept_http1(true)
        .add_routes(routes)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await
}

/// `grpc.health.v1.Health`, as etcd registers it: the whole server ("") is serving until this
/// member stops.
fn grpc_health(
    ctx: &Arc<ServerContext>,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    let replica = ctx.replica.clone();
    tokio::spawn(async move {
        replica.stopping().await;
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
    });
    service
}
