//! `/metrics`: etcd's Prometheus metrics, with etcd's names, types, labels and buckets, in the
//! Prometheus text format (0.0.4) etcd serves, so dashboards and alerts written for etcd read
//! leasehold unchanged. leasehold's own figures are named `leasehold_*`.
//!
//! Two kinds of source:
//! - read at scrape time, from the replica ([`MemberCollector`]): leadership, the log's commit
//!   and apply indexes, proposals, disk commit times, lease counters, the database size. Nothing
//!   is counted twice and a scrape costs a few lock-free loads and two short lock holds;
//! - counted as they happen, here: gRPC calls started and handled (a middleware on the gRPC
//!   routes), granted TTLs, and the expiry driver's lag and batch sizes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use leasehold_raft::{DISK_BUCKETS_SECS, HistogramReading, Replica};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::version::ETCD_API_VERSION;

/// Every metric this member exports, and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    grpc_started: Family<StartedLabels, Counter>,
    grpc_handled: Family<HandledLabels, Counter>,
    lease_ttl: Histogram,
    expiry_lag: Histogram,
    expiry_batch: Histogram,
    /// Range calls this member answered (ranges inside txns are counted at apply).
    ranges_served: Arc<AtomicU64>,
    /// A unary call slower than this is logged (`--warning-unary-request-duration`).
    slow_request: std::time::Duration,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new(replica: Arc<Replica>) -> Metrics {
        let mut registry = Registry::default();
        let grpc_started = Family::<StartedLabels, Counter>::default();
        registry.register(
            "grpc_server_started",
            "gRPC calls started on this member, by method",
            grpc_started.clone(),
        );
        let grpc_handled = Family::<HandledLabels, Counter>::default();
        registry.register(
            "grpc_server_handled",
            "gRPC calls this member finished, by method and status code",
            grpc_handled.clone(),
        );
        // etcd's buckets: 1 s doubling, 24 of them (to about three months).
        let lease_ttl = Histogram::new(exponential_buckets(1.0, 2.0, 24));
        registry.register(
            "etcd_debugging_lease_ttl_total",
            "TTLs granted through this member, in seconds",
            lease_ttl.clone(),
        );
        // From 1 ms to about 33 s: the lag is milliseconds when all is well.
        let expiry_lag = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "leasehold_lease_expiry_lag_seconds",
            "From a lease's deadline to the commit of its revocation by this member as leader",
            expiry_lag.clone(),
        );
        let expiry_batch = Histogram::new(exponential_buckets(1.0, 4.0, 8));
        registry.register(
            "leasehold_lease_expiry_batch_leases",
            "Leases revoked by one expiry log entry proposed by this member as leader",
            expiry_batch.clone(),
        );
        let ranges_served = Arc::new(AtomicU64::new(0));
        registry.register_collector(Box::new(MemberCollector {
            replica,
            ranges_served: ranges_served.clone(),
        }));
        Metrics {
            registry,
            grpc_started,
            grpc_handled,
            lease_ttl,
            expiry_lag,
            expiry_batch,
            ranges_served,
            slow_request: std::time::Duration::from_millis(300),
        }
    }

    /// Logs unary calls slower than `after` as warnings (etcd's `request stats`).
    pub fn warn_of_requests_over(mut self, after: std::time::Duration) -> Metrics {
        self.slow_request = after;
        self
    }

    /// The Prometheus text of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// A Range call answered by this member.
    pub(crate) fn range_served(&self) {
        self.ranges_served.fetch_add(1, Ordering::Relaxed);
    }

    /// A lease granted through this member, with its TTL after clamping.
    pub(crate) fn lease_granted(&self, ttl_secs: i64) {
        self.lease_ttl.observe(ttl_secs as f64);
    }

    /// One expiry entry committed: its leases' lags behind their deadlines.
    pub(crate) fn leases_expired(&self, lags: impl ExactSizeIterator<Item = std::time::Duration>) {
        self.expiry_batch.observe(lags.len() as f64);
        for lag in lags {
            self.expiry_lag.observe(lag.as_secs_f64());
        }
    }

    fn handled(&self, method: &GrpcMethod, code: tonic::Code) {
        let labels = HandledLabels {
            grpc_code: leasehold_api::go_code_name(code),
            grpc_method: method.method,
            grpc_service: method.service,
            grpc_type: method.kind,
        };
        self.grpc_handled.get_or_create(&labels).inc();
    }
}

/// `GET /metrics`.
pub(crate) async fn serve_metrics(State(ctx): State<Arc<crate::ServerContext>>) -> Response {
    let headers = [(
        header::CONTENT_TYPE,
        prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
    )];
    (StatusCode::OK, headers, ctx.metrics.encode()).into_response()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StartedLabels {
    grpc_method: &'static str,
    grpc_service: &'static str,
    grpc_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandledLabels {
    grpc_code: &'static str,
    grpc_method: &'static str,
    grpc_service: &'static str,
    grpc_type: &'static str,
}

/// A method this member serves (or answers Unimplemented for, as etcd registers it), with the
/// kind grpc-go's Prometheus labels give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GrpcMethod {
    service: &'static str,
    method: &'static str,
    kind: &'static str,
}

const UNARY: &str = "unary";
const SERVER_STREAM: &str = "server_stream";
const BIDI_STREAM: &str = "bidi_stream";

/// The gRPC services etcd registers and their methods; a method not named in the streaming
/// list is unary. Only these are counted, so a client cannot grow the label sets.
const SERVICES: [(&str, &[&str]); 9] = [
    (
        "etcdserverpb.KV",
        &["Range", "Put", "DeleteRange", "Txn", "Compact"],
    ),
    ("etcdserverpb.Watch", &["Watch"]),
    (
        "etcdserverpb.Lease",
        &[
            "LeaseGrant",
            "LeaseRevoke",
            "LeaseKeepAlive",
            "LeaseTimeToLive",
            "LeaseLeases",
        ],
    ),
    (
        "etcdserverpb.Cluster",
        &[
            "MemberAdd",
            "MemberRemove",
            "MemberUpdate",
            "MemberList",
            "MemberPromote",
        ],
    ),
    (
        "etcdserverpb.Maintenance",
        &[
            "Alarm",
            "Status",
            "Defragment",
            "Hash",
            "HashKV",
            "Snapshot",
            "MoveLeader",
            "Downgrade",
        ],
    ),
    (
        "etcdserverpb.Auth",
        &[
            "AuthEnable",
            "AuthDisable",
            "AuthStatus",
            "Authenticate",
            "UserAdd",
            "UserGet",
            "UserList",
            "UserDelete",
            "UserChangePassword",
            "UserGrantRole",
            "UserRevokeRole",
            "RoleAdd",
            "RoleGet",
            "RoleList",
            "RoleDelete",
            "RoleGrantPermission",
            "RoleRevokePermission",
        ],
    ),
    ("v3lockpb.Lock", &["Lock", "Unlock"]),
    (
        "v3electionpb.Election",
        &["Campaign", "Proclaim", "Leader", "Observe", "Resign"],
    ),
    ("grpc.health.v1.Health", &["Check", "Watch"]),
];

/// (service, method, kind) of every streaming method in [`SERVICES`].
const STREAMING: [(&str, &str, &str); 5] = [
    ("etcdserverpb.Watch", "Watch", BIDI_STREAM),
    ("etcdserverpb.Lease", "LeaseKeepAlive", BIDI_STREAM),
    ("etcdserverpb.Maintenance", "Snapshot", SERVER_STREAM),
    ("v3electionpb.Election", "Observe", SERVER_STREAM),
    ("grpc.health.v1.Health", "Watch", SERVER_STREAM),
];

impl GrpcMethod {
    /// The method a request path (`/service/method`) names, if it is one of [`SERVICES`].
    fn of(path: &str) -> Option<GrpcMethod> {
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        let (service, methods) = SERVICES.iter().find(|(s, _)| *s == service)?;
        let method = methods.iter().find(|m| **m == method)?;
        let kind = STREAMING
            .iter()
            .find(|(s, m, _)| s == service && m == method)
            .map_or(UNARY, |(_, _, kind)| kind);
        Some(GrpcMethod {
            service,
            method,
            kind,
        })
    }
}

/// The status a `grpc-status` header or trailer carries, if there is one.
fn grpc_status(headers: &HeaderMap) -> Option<tonic::Code> {
    headers
        .get("grpc-status")
        .map(|v| tonic::Code::from_bytes(v.as_bytes()))
}

/// Middleware on the gRPC routes: counts a call as started when it arrives, and as handled with
/// its status when its response ends (at once for a trailers-only error answer, otherwise at
/// the trailers; a response dropped before its trailers, as when the client goes away, counts as
/// `Canceled`, as grpc-go counts a call whose context was cancelled).
pub(crate) async fn count_grpc(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(method) = GrpcMethod::of(request.uri().path()) else {
        return next.run(request).await;
    };
    let started = StartedLabels {
        grpc_method: method.method,
        grpc_service: method.service,
        grpc_type: method.kind,
    };
    metrics.grpc_started.get_or_create(&started).inc();
    let began = std::time::Instant::now();
    let response = next.run(request).await;
    if method.kind == UNARY {
        request_stats(&method, began.elapsed(), metrics.slow_request);
    }
    if let Some(code) = grpc_status(response.headers()) {
        metrics.handled(&method, code);
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = CountedBody {
        inner: body,
        pending: Some((metrics, method)),
    };
    Response::from_parts(parts, Body::new(body))
}

/// etcd's `request stats` line for a unary call: a warning when it took longer than
/// `warn_after`, at debug level otherwise (etcd logs every call at debug).
fn request_stats(method: &GrpcMethod, spent: std::time::Duration, warn_after: std::time::Duration) {
    let response_type = format!("/{}/{}", method.service, method.method);
    let spent_text = format!("{spent:?}");
    if spent > warn_after {
        tracing::warn!(
            "time spent" = %spent_text,
            "response type" = %response_type,
            "request stats"
        );
    } else {
        tracing::debug!(
            "time spent" = %spent_text,
            "response type" = %response_type,
            "request stats"
        );
    }
}

/// A response body that counts its call as handled when its trailers pass (or when it ends or
/// is dropped without any).
struct CountedBody {
    inner: Body,
    /// Taken once the call is counted.
    pending: Option<(Arc<Metrics>, GrpcMethod)>,
}

impl CountedBody {
    fn count(&mut self, code: tonic::Code) {
        if let Some((metrics, method)) = self.pending.take() {
            metrics.handled(&method, code);
        }
    }
}

impl http_body::Body for CountedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(grpc_status) {
                    self.count(code);
                }
            }
            Poll::Ready(Some(Err(_))) => self.count(tonic::Code::Unknown),
            // A gRPC response always ends with trailers; one that does not was cut short.
            Poll::Ready(None) => self.count(tonic::Code::Unknown),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for CountedBody {
    fn drop(&mut self) {
        self.count(tonic::Code::Cancelled);
    }
}

/// The metrics read from the replica at scrape time.
struct MemberCollector {
    replica: Arc<Replica>,
    ranges_served: Arc<AtomicU64>,
}

impl std::fmt::Debug for MemberCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberCollector").finish_non_exhaustive()
    }
}

impl Collector for MemberCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let status = self.replica.status();
        let telemetry = self.replica.telemetry();
        let leases = self.replica.lease_counters();
        let ops = self.replica.kv_ops_applied();
        let (live_keys, current_revision, compact_revision) = self.replica.kv_gauges();
        let is_learner = self.replica.is_learner();
        let mut gauge = |name: &str, help: &str, value: i64| {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
        };
        gauge(
            "etcd_server_has_leader",
            "1 while this member knows a leader that has heard from a quorum lately, else 0.",
            i64::from(status.leader.is_some()),
        )?;
        gauge(
            "etcd_server_is_leader",
            "1 while this member is the leader, else 0.",
            i64::from(self.replica.is_leader()),
        )?;
        gauge(
            "etcd_server_proposals_committed_total",
            "The highest log index this member knows to be committed.",
            clamp(telemetry.committed_index),
        )?;
        gauge(
            "etcd_server_proposals_applied_total",
            "The highest log index this member has applied.",
            clamp(status.applied_index),
        )?;
        gauge(
            "etcd_server_proposals_pending",
            "Log entries this member has proposed and not yet seen committed.",
            telemetry.proposals_pending,
        )?;
        gauge(
            "etcd_server_is_learner",
            "1 while this member is a learner, else 0.",
            i64::from(is_learner),
        )?;
        gauge(
            "etcd_debugging_mvcc_keys_total",
            "Keys whose newest version is a value.",
            clamp(live_keys as u64),
        )?;
        gauge(
            "etcd_debugging_mvcc_current_revision",
            "The applied store's revision.",
            current_revision,
        )?;
        gauge(
            "etcd_debugging_mvcc_compact_revision",
            "The revision of the last compaction (-1 before the first).",
            compact_revision,
        )?;
        gauge(
            "etcd_mvcc_db_total_size_in_bytes",
            "Size of this member's database file, in bytes.",
            clamp(self.replica.db_size_bytes()),
        )?;
        gauge(
            "leasehold_leases_live",
            "Leases this member holds, expired ones not yet revoked included.",
            clamp(self.replica.leases_live() as u64),
        )?;
        let mut counter = |name: &str, help: &str, value: u64| {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)
        };
        counter(
            "etcd_server_leader_changes_seen",
            "Times this member has learned of a new leader.",
            telemetry.leader_changes,
        )?;
        counter(
            "etcd_server_proposals_failed",
            "Log entries this member proposed that failed to commit.",
            telemetry.proposals_failed,
        )?;
        counter(
            "etcd_mvcc_put",
            "Puts applied on this member (each put of a txn too).",
            ops.puts,
        )?;
        counter(
            "etcd_mvcc_delete",
            "Delete-range operations applied on this member (one per operation, not per key).",
            ops.deletes,
        )?;
        counter(
            "etcd_mvcc_range",
            "Range calls this member answered, and ranges inside txns it applied.",
            ops.ranges + self.ranges_served.load(Ordering::Relaxed),
        )?;
        counter(
            "etcd_mvcc_txn",
            "Txns applied on this member that ran more than one operation.",
            ops.txns,
        )?;
        counter(
            "etcd_debugging_lease_granted",
            "Leases granted, as applied on this member.",
            leases.granted,
        )?;
        counter(
            "etcd_debugging_lease_revoked",
            "Leases revoked (by request or by expiry), as applied on this member.",
            leases.revoked,
        )?;
        counter(
            "etcd_debugging_lease_renewed",
            "Lease renewals: those applied on this member, and those it answered from memory while it led.",
            leases.renewed,
        )?;
        counter(
            "etcd_debugging_server_lease_expired",
            "Leases revoked because their deadline passed, as applied on this member.",
            leases.expired,
        )?;
        let version = [("server_version", ETCD_API_VERSION)];
        let gauge = ConstGauge::new(1i64);
        gauge.encode(
            encoder
                .encode_descriptor(
                    "etcd_server_version",
                    "The etcd version this member answers as, in its label.",
                    None,
                    MetricType::Gauge,
                )?
                .encode_family(&version)?,
        )?;
        // etcd's cluster version: the server's major.minor.
        let minor = ETCD_API_VERSION
            .rsplit_once('.')
            .map_or(ETCD_API_VERSION, |(major_minor, _)| major_minor);
        let cluster = [("cluster_version", minor)];
        let gauge = ConstGauge::new(1i64);
        gauge.encode(
            encoder
                .encode_descriptor(
                    "etcd_cluster_version",
                    "The cluster version this member runs at, in its label.",
                    None,
                    MetricType::Gauge,
                )?
                .encode_family(&cluster)?,
        )?;
        histogram(
            &mut encoder,
            "etcd_disk_wal_fsync_duration_seconds",
            "Durable commits of the Raft log (fsync included), in seconds.",
            &telemetry.log_commit,
        )?;
        histogram(
            &mut encoder,
            "etcd_disk_backend_commit_duration_seconds",
            "Durable commits that wrote state-machine rows, in seconds (the log and the state \
             machine share one transaction, so most are also counted as log commits).",
            &telemetry.state_commit,
        )
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn histogram(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    reading: &HistogramReading,
) -> Result<(), std::fmt::Error> {
    let buckets: Vec<(f64, u64)> = DISK_BUCKETS_SECS
        .iter()
        .copied()
        .zip(reading.bucket_counts)
        .collect();
    encoder
        .encode_descriptor(name, help, None, MetricType::Histogram)?
        .encode_histogram::<NoLabelSet>(reading.sum_secs, reading.count, &buckets, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_found_with_their_kind_and_nothing_else_is() {
        let check = |path: &str, expected: Option<(&str, &str, &str)>| {
            let found = GrpcMethod::of(path).map(|m| (m.service, m.method, m.kind));
            assert_eq!(found, expected, "{path}");
        };
        check(
            "/etcdserverpb.KV/Range",
            Some(("etcdserverpb.KV", "Range", UNARY)),
        );
        check(
            "/etcdserverpb.Lease/LeaseKeepAlive",
            Some(("etcdserverpb.Lease", "LeaseKeepAlive", BIDI_STREAM)),
        );
        check(
            "/etcdserverpb.Watch/Watch",
            Some(("etcdserverpb.Watch", "Watch", BIDI_STREAM)),
        );
        check(
            "/v3electionpb.Election/Observe",
            Some(("v3electionpb.Election", "Observe", SERVER_STREAM)),
        );
        check(
            "/grpc.health.v1.Health/Check",
            Some(("grpc.health.v1.Health", "Check", UNARY)),
        );
        check("/etcdserverpb.KV/Nope", None);
        check("/etcdserverpb.Nope/Range", None);
        check("/health", None);
        check("", None);
    }

    #[test]
    fn every_streaming_method_is_a_served_method() {
        for (service, method, _) in STREAMING {
            let found = GrpcMethod::of(&format!("/{service}/{method}")).unwrap();
            assert_ne!(found.kind, UNARY, "{service}/{method}");
        }
    }

    #[test]
    fn code_names_are_gos() {
        let name = leasehold_api::go_code_name;
        assert_eq!(name(tonic::Code::Cancelled), "Canceled");
        assert_eq!(name(tonic::Code::from_i32(14)), "Unavailable");
    }
}
