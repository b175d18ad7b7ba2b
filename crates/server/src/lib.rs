//! The etcd v3 gRPC services of leasehold. It owns the wire: validation in etcd's order,
//! conversion between protobuf and the core's types, and the mapping of every error to etcd's
//! status code and message. It must never touch storage or the log directly: everything goes
//! through [`leasehold_raft::Replica`].
//!
//! ```text
//!   client connection ─► AuthorityFix (a URL `:authority` becomes host:port) ─► hyper, tonic
//!   gRPC request ─► validate ─► convert ─► Replica::{read, write} ─► convert ─► gRPC response
//!                                    errors ─► error.rs ─► tonic::Status
//!   JSON gateway: POST /v3/... ─► gateway.rs: JSON ─► the same services' trait methods ─► JSON
//!   expiry driver (leader): sleep until the next deadline ─► propose LeaseExpire { due leases }
//!   watch stream: new revision published ─► read unseen events from history ─► responses
//!   lock / election: queue a key per lease by create revision ─► wait for the older key to go
//!                    ─► fencing check (key still ours, lease has time left) ─► answer
//! ```

mod auth;
mod authority;
mod cluster;
mod coalesce;
mod compactor;
mod context;
mod convert;
mod corruption;
mod dashboard;
mod deep_txn;
mod election;
mod error;
mod expiry;
mod gateway;
mod health;
pub mod identity;
pub mod jwt;
mod kv;
mod lease;
mod lease_ids;
mod lock;
mod maintenance;
mod metrics;
mod oversize;
mod recipe;
#[cfg(test)]
mod test_support;
mod validate;
mod version;
mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use leasehold_api::etcdserverpb::auth_server::AuthServer;
use leasehold_api::etcdserverpb::cluster_server::ClusterServer;
use leasehold_api::etcdserverpb::kv_server::KvServer;
use leasehold_api::etcdserverpb::lease_server::LeaseServer;
use leasehold_api::etcdserverpb::maintenance_server::MaintenanceServer;
use leasehold_api::etcdserverpb::watch_server::WatchServer;
use leasehold_api::v3electionpb::election_server::ElectionServer;
use leasehold_api::v3lockpb::lock_server::LockServer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

pub use cluster::publish_member;
pub use compactor::{AutoCompaction, drive_auto_compaction};

/// What the server knows of a client connection: its TCP peer, and the common name of the client
/// certificate a TLS handshake verified (etcd takes a request without a token as that user).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub tcp: tonic::transport::server::TcpConnectInfo,
    pub common_name: Option<String>,
}
pub use context::ServerContext;
pub use corruption::{drive_compaction_hash_checks, drive_corruption_checks, initial_check};
pub use expiry::{ExpiryConfig, drive_lease_expiry};
pub use lease_ids::LeaseIdGenerator;
pub use metrics::{Metrics, PeerTraffic, PeerTrafficSource};
pub use validate::lease_ttl_secs_min;
pub use validate::{Limits, REQUEST_BYTES_MAX_DEFAULT, TXN_OPS_MAX_DEFAULT};
pub use version::ETCD_API_VERSION;

/// The client server's HTTP/2 keepalive, etcd's `--grpc-keepalive-interval` and
/// `--grpc-keepalive-timeout`: after `interval` without activity the server pings the client,
/// and closes the connection if no answer comes within `timeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcKeepalive {
    pub interval: Duration,
    pub timeout: Duration,
}

impl Default for GrpcKeepalive {
    /// etcd's defaults, which are also grpc-go's.
    fn default() -> GrpcKeepalive {
        GrpcKeepalive {
            interval: Duration::from_secs(2 * 60 * 60),
            timeout: Duration::from_secs(20),
        }
    }
}

impl GrpcKeepalive {
    /// As etcd hands them to grpc-go: a zero in either means "not configured", which gives
    /// grpc-go's defaults (the same as etcd's); grpc-go raises an interval under a second to one.
    pub fn effective(self) -> GrpcKeepalive {
        if self.interval.is_zero() || self.timeout.is_zero() {
            return GrpcKeepalive::default();
        }
        GrpcKeepalive {
            interval: self.interval.max(Duration::from_secs(1)),
            timeout: self.timeout,
        }
    }
}

/// A connection the servers take: plain TCP or TLS, whichever the caller accepted.
pub trait Connection: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static> Connection for T {}

/// Serves the client API on the connections `incoming` yields (plain TCP or TLS, whichever the
/// caller accepts) until `shutdown` completes, then drains in-flight calls.
pub async fn serve<I, IO, E>(
    ctx: Arc<ServerContext>,
    incoming: I,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error>
where
    I: Stream<Item = Result<IO, E>> + Send + 'static,
    IO: Connection,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    serve_client(ctx, incoming, shutdown, ClientRoutes::All).await
}

/// What a client listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientRoutes {
    /// gRPC and the HTTP endpoints (the JSON gateway, `/health`, `/metrics`, ...): etcd's
    /// `--listen-client-urls`.
    All,
    /// gRPC only: `--listen-client-urls` when `--listen-client-http-urls` are given.
    GrpcOnly,
    /// The HTTP endpoints only: `--listen-client-http-urls`.
    HttpOnly,
}

/// [`serve`], with the routes `routes` names.
pub async fn serve_client<I, IO, E>(
    ctx: Arc<ServerContext>,
    incoming: I,
    shutdown: impl Future<Output = ()> + Send,
    routes: ClientRoutes,
) -> Result<(), tonic::transport::Error>
where
    I: Stream<Item = Result<IO, E>> + Send + 'static,
    IO: Connection,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    // Decoding limit handed to tonic: above grpc-go's limit so that our own check (with
    // grpc-go's message) decides, and bounded so a client cannot make us buffer arbitrary
    // amounts.
    let decode_bytes_max = ctx.limits.grpc_message_bytes_max().saturating_mul(2);
    let keepalive = ctx.keepalive.effective();
    // Each connection reaches hyper through `AuthorityFix`, so etcdctl 3.4's URL `:authority`
    // is repaired before h2 refuses it (authority.rs); TLS, if any, is already terminated.
    // `CoalescedWrites` makes the responses that are ready together leave in one write.
    let incoming = incoming.map(|conn| {
        conn.map(|conn| coalesce::CoalescedWrites::new(authority::AuthorityFix::new(conn)))
    });
    let mut grpc = tonic::service::Routes::builder();
    let limit = decode_bytes_max;
    grpc.add_service(
        KvServer::new(kv::KvService::new(ctx.clone())).max_decoding_message_size(limit),
    )
    .add_service(
        LeaseServer::new(lease::LeaseService::new(ctx.clone())).max_decoding_message_size(limit),
    )
    .add_service(
        WatchServer::new(watch::WatchService::new(ctx.clone())).max_decoding_message_size(limit),
    )
    .add_service(
        MaintenanceServer::new(maintenance::MaintenanceService::new(ctx.clone()))
            .max_decoding_message_size(limit),
    )
    .add_service(
        ClusterServer::new(cluster::ClusterService::new(ctx.clone()))
            .max_decoding_message_size(limit),
    )
    .add_service(
        LockServer::new(lock::LockService::new(ctx.clone())).max_decoding_message_size(limit),
    )
    .add_service(
        AuthServer::new(auth::AuthService::new(ctx.clone())).max_decoding_message_size(limit),
    )
    .add_service(
        ElectionServer::new(election::ElectionService::new(ctx.clone()))
            .max_decoding_message_size(limit),
    )
    .add_service(grpc_health(&ctx));
    // etcd serves its HTTP endpoints and its JSON gateway (`/v3/...`) on the client port too,
    // over HTTP/1.1 as well as HTTP/2. Only the gRPC routes are counted as gRPC calls.
    let counted = axum::middleware::from_fn_with_state(ctx.metrics.clone(), metrics::count_grpc);
    // Inside the counter, so the call is counted with the code the client gets.
    let oversize = axum::middleware::from_fn_with_state(
        ctx.limits.grpc_message_bytes_max(),
        oversize::etcd_answer,
    );
    // Without the gateway (`--enable-grpc-gateway=false`) its paths get etcd's 404 page.
    let grpc_router = grpc
        .routes()
        .into_axum_router()
        .route(
            deep_txn::PATH,
            axum::routing::any(deep_txn_route(&ctx, decode_bytes_max)),
        )
        .layer(oversize)
        .layer(counted);
    let mut http = match routes {
        ClientRoutes::All | ClientRoutes::GrpcOnly => grpc_router,
        ClientRoutes::HttpOnly => axum::Router::new(),
    };
    if routes != ClientRoutes::GrpcOnly {
        http = http
            .merge(dashboard::router(ctx.clone()))
            .merge(health::router(ctx.clone()));
        if ctx.json_gateway {
            http = http.merge(gateway::router(ctx));
        }
    }
    if http2_debug() {
        http = http.layer(axum::middleware::from_fn(log_authority));
    }
    let routes = tonic::service::Routes::from(http.fallback(health::not_found));
    tonic::transport::Server::builder()
        .accept_http1(true)
        .http2_keepalive_interval(Some(keepalive.interval))
        .http2_keepalive_timeout(Some(keepalive.timeout))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Whether `GODEBUG` asks for Go's verbose HTTP/2 log (`http2debug=2`), which etcd's own tests
/// read to see the `:authority` each client sent.
fn http2_debug() -> bool {
    std::env::var("GODEBUG").is_ok_and(|v| v.split(',').any(|kv| kv.trim() == "http2debug=2"))
}

/// Logs an HTTP/2 request's `:authority` as Go's server does under `GODEBUG=http2debug=2`.
async fn log_authority(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if req.version() == http::Version::HTTP_2
        && let Some(authority) = req.uri().authority()
    {
        eprintln!(
            "http2: decoded hpack field header field \":authority\" = {:?}",
            authority.as_str()
        );
    }
    next.run(req).await
}

/// The `KV/Txn` route that decodes nested txns as deep as etcd does (deep_txn.rs); it takes
/// that one path from the generated KV service.
fn deep_txn_route(
    ctx: &Arc<ServerContext>,
    decode_bytes_max: usize,
) -> impl Fn(axum::extract::Request) -> futures::future::BoxFuture<'static, axum::response::Response>
+ Clone
+ Send
+ Sync
+ 'static {
    let kv = Arc::new(kv::KvService::new(ctx.clone()));
    let txn_ops_max = ctx.limits.txn_ops_max;
    move |request| {
        Box::pin(deep_txn::serve(
            kv.clone(),
            txn_ops_max,
            decode_bytes_max,
            request,
        ))
    }
}

/// Serves only the HTTP endpoints (no gRPC) on the connections `incoming` yields, as etcd serves
/// `--listen-metrics-urls`, until `shutdown` completes.
pub async fn serve_http<I, IO, E>(
    ctx: Arc<ServerContext>,
    incoming: I,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error>
where
    I: Stream<Item = Result<IO, E>> + Send + 'static,
    IO: Connection,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    let routes = tonic::service::Routes::from(health::router(ctx).fallback(health::not_found));
    tonic::transport::Server::builder()
        .accept_http1(true)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_is_configured_as_etcd_configures_grpc_go() {
        let secs = Duration::from_secs;
        let set = |interval, timeout| GrpcKeepalive { interval, timeout }.effective();
        assert_eq!(
            set(secs(30), secs(5)),
            GrpcKeepalive {
                interval: secs(30),
                timeout: secs(5)
            }
        );
        // A zero leaves grpc-go's defaults (etcd hands grpc-go no keepalive parameters).
        assert_eq!(set(Duration::ZERO, secs(5)), GrpcKeepalive::default());
        assert_eq!(set(secs(30), Duration::ZERO), GrpcKeepalive::default());
        assert_eq!(set(Duration::from_millis(10), secs(5)).interval, secs(1));
    }
}
