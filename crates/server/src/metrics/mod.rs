//! `/metrics`: etcd's Prometheus metrics, with etcd's names, types, labels and buckets, in the
//! Prometheus text format (0.0.4) etcd serves, so dashboards and alerts written for etcd read
//! leasehold unchanged. leasehold's own figures are named `leasehold_*`.
//!
//! Three kinds of source:
//! - read at scrape time, from the replica ([`MemberCollector`]): leadership, the log's commit
//!   and apply indexes, proposals, disk and apply times, lease counters, the database size.
//!   Nothing is counted twice and a scrape costs a few lock-free loads and short lock holds;
//! - counted as they happen, here: gRPC calls, their messages and bytes (`grpc.rs`, a
//!   middleware on the gRPC routes), granted TTLs, the expiry driver's lag and batch sizes,
//!   health checks, hashes, defragmentations, snapshots sent, and watch streams;
//! - the process (`process.rs`): its file descriptors.
//!
//! Not exported: Go's runtime metrics (`go_*`, `promhttp_*`: there is no Go runtime here), the
//! v2 store's (`etcd_debugging_store_*`) and etcd grpc-proxy's, which leasehold does not have.

mod grpc;
mod process;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use leasehold_raft::{HistogramReading, Replica};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub(crate) use grpc::count_grpc;

use crate::version::ETCD_API_VERSION;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SuccessLabel {
    success: &'static str,
}

fn success(ok: bool) -> SuccessLabel {
    SuccessLabel {
        success: if ok { "true" } else { "false" },
    }
}

/// The watch streams and watchers open on this member, and the events they sent.
#[derive(Debug, Default)]
pub(crate) struct WatchCounts {
    pub(crate) streams: Gauge,
    pub(crate) watchers: Gauge,
    /// Watchers that had events left to send when their stream's last pass ended.
    pub(crate) slow_watchers: Gauge,
    pub(crate) events: Counter,
}

/// One peer's traffic, as the node reads it from its peer links.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTraffic {
    pub id: u64,
    pub sent_bytes: u64,
    pub received_bytes: u64,
    pub sent_failures: u64,
    /// Heard from lately.
    pub active: bool,
}

/// Reads every peer's traffic at scrape time.
pub type PeerTrafficSource = Arc<dyn Fn() -> Vec<PeerTraffic> + Send + Sync>;

/// Every metric this member exports, and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    grpc: grpc::Grpc,
    lease_ttl: Histogram,
    expiry_lag: Histogram,
    expiry_batch: Histogram,
    /// Range calls this member answered (ranges inside txns are counted at apply).
    ranges_served: Arc<AtomicU64>,
    range_duration: Family<SuccessLabel, Histogram, fn() -> Histogram>,
    /// Counters etcd names without `_total`, written by [`Metrics::encode`] itself
    /// (prometheus-client adds `_total` to every counter it encodes).
    health_success: AtomicU64,
    health_failures: AtomicU64,
    replica: Arc<Replica>,
    hash: Histogram,
    hash_rev: Histogram,
    defrag: Histogram,
    defrag_inflight: Gauge,
    snapshot_sent: Histogram,
    pub(crate) watch: Arc<WatchCounts>,
    /// The bytes of the database that hold data, read by the `/metrics` handler before it
    /// encodes (reading them takes a write transaction, which a collector cannot wait for).
    db_in_use: Arc<AtomicU64>,
    peer_traffic: Arc<std::sync::OnceLock<PeerTrafficSource>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// The metrics of the member `replica` runs; `extensive` (`--metrics=extensive`) adds the
    /// gRPC handling-time histograms.
    pub fn new(replica: Arc<Replica>, extensive: bool) -> Metrics {
        let mut registry = Registry::default();
        let grpc = grpc::Grpc::register(&mut registry, extensive);
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
        let range_duration: Family<SuccessLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0001, 2.0, 20)));
        registry.register(
            "etcd_server_range_duration_seconds",
            "Seconds a Range call's read took on this member (a linearizable one's wait for the \
             leader's read index included), by whether it succeeded",
            range_duration.clone(),
        );
        let hash = Histogram::new(exponential_buckets(0.01, 2.0, 15));
        registry.register(
            "etcd_mvcc_hash_duration_seconds",
            "Seconds a Hash call's hash of the whole store took",
            hash.clone(),
        );
        let hash_rev = Histogram::new(exponential_buckets(0.01, 2.0, 15));
        registry.register(
            "etcd_mvcc_hash_rev_duration_seconds",
            "Seconds a HashKV call's hash up to a revision took",
            hash_rev.clone(),
        );
        let defrag = Histogram::new(exponential_buckets(0.1, 2.0, 13));
        registry.register(
            "etcd_disk_backend_defrag_duration_seconds",
            "Seconds a defragmentation of this member's database file took",
            defrag.clone(),
        );
        let defrag_inflight = Gauge::default();
        registry.register(
            "etcd_disk_defrag_inflight",
            "1 while this member's database file is being defragmented, else 0",
            defrag_inflight.clone(),
        );
        let snapshot_sent = Histogram::new(exponential_buckets(0.01, 2.0, 17));
        registry.register(
            "etcd_disk_backend_snapshot_duration_seconds",
            "Seconds from a Snapshot call's start to the last byte of the snapshot sent",
            snapshot_sent.clone(),
        );
        let watch = Arc::new(WatchCounts::default());
        registry.register(
            "etcd_debugging_mvcc_watch_stream_total",
            "Watch streams open on this member",
            watch.streams.clone(),
        );
        registry.register(
            "etcd_debugging_mvcc_watcher_total",
            "Watchers open on this member",
            watch.watchers.clone(),
        );
        registry.register(
            "etcd_debugging_mvcc_slow_watcher_total",
            "Watchers behind the store's revision after their stream's last delivery pass",
            watch.slow_watchers.clone(),
        );
        registry.register(
            "etcd_debugging_mvcc_events",
            "Watch events this member sent",
            watch.events.clone(),
        );
        let ranges_served = Arc::new(AtomicU64::new(0));
        let db_in_use = Arc::new(AtomicU64::new(0));
        let peer_traffic = Arc::new(std::sync::OnceLock::new());
        registry.register_collector(Box::new(MemberCollector {
            replica: replica.clone(),
            ranges_served: ranges_served.clone(),
            db_in_use: db_in_use.clone(),
            peer_traffic: peer_traffic.clone(),
        }));
        registry.register_collector(Box::new(process::ProcessCollector));
        Metrics {
            registry,
            grpc,
            lease_ttl,
            expiry_lag,
            expiry_batch,
            ranges_served,
            range_duration,
            health_success: AtomicU64::new(0),
            health_failures: AtomicU64::new(0),
            replica: replica.clone(),
            hash,
            hash_rev,
            defrag,
            defrag_inflight,
            snapshot_sent,
            watch,
            db_in_use,
            peer_traffic,
        }
    }

    /// Exports the peers' traffic (`etcd_network_peer_*`, `etcd_network_active_peers`) as
    /// `source` reads it.
    pub fn with_peer_traffic(self, source: PeerTrafficSource) -> Metrics {
        let _ = self.peer_traffic.set(source);
        self
    }

    /// Logs unary calls slower than `after` as warnings (etcd's `request stats`).
    pub fn warn_of_requests_over(mut self, after: std::time::Duration) -> Metrics {
        self.grpc.slow_request = after;
        self
    }

    /// The Prometheus text of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        let learners_promoted = self.replica.telemetry().learners_promoted;
        for (name, help, value) in [
            (
                "etcd_server_health_success",
                "GET /health answered healthy",
                self.health_success.load(Ordering::Relaxed),
            ),
            (
                "etcd_server_health_failures",
                "GET /health answered unhealthy",
                self.health_failures.load(Ordering::Relaxed),
            ),
            (
                "etcd_server_learner_promote_successes",
                "Learners this member promoted while it led",
                learners_promoted,
            ),
        ] {
            text.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
            ));
        }
        text
    }

    /// A Range call answered by this member, or refused, after `took`.
    pub(crate) fn range_served(&self, ok: bool, took: std::time::Duration) {
        if ok {
            self.ranges_served.fetch_add(1, Ordering::Relaxed);
        }
        self.range_duration
            .get_or_create(&success(ok))
            .observe(took.as_secs_f64());
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

    /// A `/health` answer.
    pub(crate) fn health_checked(&self, healthy: bool) {
        let counter = if healthy {
            &self.health_success
        } else {
            &self.health_failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A Hash call's hash (`up_to_revision`: a HashKV call's).
    pub(crate) fn hashed(&self, up_to_revision: bool, took: std::time::Duration) {
        let histogram = if up_to_revision {
            &self.hash_rev
        } else {
            &self.hash
        };
        histogram.observe(took.as_secs_f64());
    }

    /// Marks a defragmentation in progress until the guard drops, which times it.
    pub(crate) fn defragmenting(&self) -> Defragmenting<'_> {
        self.defrag_inflight.set(1);
        Defragmenting {
            metrics: self,
            began: std::time::Instant::now(),
        }
    }

    /// A snapshot sent whole, `took` after its call began.
    pub(crate) fn snapshot_sent(&self, took: std::time::Duration) {
        self.snapshot_sent.observe(took.as_secs_f64());
    }
}

/// A defragmentation in progress ([`Metrics::defragmenting`]).
pub(crate) struct Defragmenting<'a> {
    metrics: &'a Metrics,
    began: std::time::Instant,
}

impl Drop for Defragmenting<'_> {
    fn drop(&mut self) {
        self.metrics
            .defrag
            .observe(self.began.elapsed().as_secs_f64());
        self.metrics.defrag_inflight.set(0);
    }
}

/// `GET /metrics`.
pub(crate) async fn serve_metrics(State(ctx): State<Arc<crate::ServerContext>>) -> Response {
    let in_use = ctx.replica.db_size_in_use_recent().await;
    ctx.metrics.db_in_use.store(in_use, Ordering::Relaxed);
    let headers = [(
        header::CONTENT_TYPE,
        prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
    )];
    (StatusCode::OK, headers, ctx.metrics.encode()).into_response()
}

/// The metrics read from the replica at scrape time.
struct MemberCollector {
    replica: Arc<Replica>,
    ranges_served: Arc<AtomicU64>,
    db_in_use: Arc<AtomicU64>,
    peer_traffic: Arc<std::sync::OnceLock<PeerTrafficSource>>,
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
        )?;
        self.encode_more(&mut encoder, &telemetry)
    }
}

impl MemberCollector {
    /// The peers' traffic, as etcd labels it (peers by hex ID).
    fn encode_peers(
        &self,
        encoder: &mut DescriptorEncoder,
        local: &str,
    ) -> Result<(), std::fmt::Error> {
        let Some(source) = self.peer_traffic.get() else {
            return Ok(());
        };
        let member_id = self.replica.member_id();
        let peers: Vec<PeerTraffic> = source().into_iter().filter(|p| p.id != member_id).collect();
        if peers.is_empty() {
            return Ok(());
        }
        let hex: Vec<String> = peers.iter().map(|p| format!("{:x}", p.id)).collect();
        type Count = fn(&PeerTraffic) -> u64;
        let counters: [(&str, &str, &str, Count); 3] = [
            (
                "etcd_network_peer_sent_bytes",
                "Bytes of Raft messages this member sent to each peer",
                "To",
                |p| p.sent_bytes,
            ),
            (
                "etcd_network_peer_received_bytes",
                "Bytes of Raft messages this member received from each peer",
                "From",
                |p| p.received_bytes,
            ),
            (
                "etcd_network_peer_sent_failures",
                "Raft messages to each peer that could not be sent",
                "To",
                |p| p.sent_failures,
            ),
        ];
        for (name, help, label, value) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (peer, id) in peers.iter().zip(&hex) {
                let counter = ConstCounter::new(value(peer));
                counter.encode(family.encode_family(&[(label, id.as_str())])?)?;
            }
        }
        let mut active = encoder.encode_descriptor(
            "etcd_network_active_peers",
            "1 for each peer this member heard from in the last few seconds, else 0",
            None,
            MetricType::Gauge,
        )?;
        for (peer, id) in peers.iter().zip(&hex) {
            let gauge = ConstGauge::new(i64::from(peer.active));
            gauge.encode(active.encode_family(&[("Local", local), ("Remote", id.as_str())])?)?;
        }
        Ok(())
    }

    /// The metrics added for etcd's full set: the member's identity and quota, applies,
    /// compactions, read indexes, snapshots installed.
    fn encode_more(
        &self,
        encoder: &mut DescriptorEncoder,
        telemetry: &leasehold_raft::TelemetryReading,
    ) -> Result<(), std::fmt::Error> {
        let member_id = self.replica.member_id();
        let members = self.replica.members();
        let db_size = self.replica.db_size_bytes();
        let in_use = match self.db_in_use.load(Ordering::Relaxed) {
            0 => db_size,
            bytes => bytes,
        };
        // etcd names some counters without `_total`; they are exported as gauges under
        // etcd's names (prometheus-client adds `_total` to what it encodes as a counter).
        let gauges: [(&str, &str, i64); 7] = [
            (
                "etcd_server_quota_backend_bytes",
                "The database's space quota in bytes (0: none)",
                clamp(self.replica.quota_bytes().unwrap_or(0)),
            ),
            (
                "etcd_mvcc_db_total_size_in_use_in_bytes",
                "Bytes of this member's database file that hold data",
                clamp(in_use),
            ),
            (
                "etcd_debugging_auth_revision",
                "The auth store's revision",
                clamp(self.replica.auth_revision()),
            ),
            (
                "etcd_disk_wal_write_bytes_total",
                "Bytes written to the Raft log's file",
                clamp(telemetry.wal_bytes),
            ),
            (
                "etcd_debugging_mvcc_total_put_size_in_bytes",
                "Bytes of keys and values put, as applied on this member",
                clamp(telemetry.put_bytes),
            ),
            (
                "etcd_debugging_mvcc_db_compaction_last",
                "Unix time of the last compaction applied here since this member started (0: none)",
                clamp(telemetry.compacted_last_unix_secs),
            ),
            (
                "etcd_server_snapshot_apply_in_progress_total",
                "1 while this member installs a leader's snapshot, else 0",
                i64::from(telemetry.snapshot_installing),
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let counters: [(&str, &str, u64); 5] = [
            (
                "etcd_server_heartbeat_send_failures",
                "Times a peer's link could not take or deliver this member's Raft messages (a full \
                 queue, or a broken connection)",
                self.replica.messages_dropped(),
            ),
            (
                "etcd_server_read_indexes_failed",
                "Read-index rounds that got no index (no leader, or no quorum in time)",
                telemetry.read_indexes_failed,
            ),
            (
                "etcd_server_slow_read_indexes",
                "Read-index rounds that took longer than 500 ms",
                telemetry.read_indexes_slow,
            ),
            (
                "etcd_server_slow_apply",
                "Commands whose apply on this member took longer than 100 ms",
                telemetry.slow_applies,
            ),
            (
                "etcd_debugging_mvcc_db_compaction_keys",
                "Versions compactions removed from this member's store",
                telemetry.compacted_versions,
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        let id = format!("{member_id:x}");
        let gauge = ConstGauge::new(1i64);
        gauge.encode(
            encoder
                .encode_descriptor(
                    "etcd_server_id",
                    "This member's ID, in hex, in its label",
                    None,
                    MetricType::Gauge,
                )?
                .encode_family(&[("server_id", id.as_str())])?,
        )?;
        let mut known = encoder.encode_descriptor(
            "etcd_network_known_peers",
            "The members this member knows of (itself included), 1 each",
            None,
            MetricType::Gauge,
        )?;
        for member in &members {
            let remote = format!("{:x}", member.id);
            let gauge = ConstGauge::new(1i64);
            gauge.encode(known.encode_family(&[("Local", id.as_str()), ("Remote", &remote)])?)?;
        }
        let mut applies = encoder.encode_descriptor(
            "etcd_server_apply_duration_seconds",
            "Seconds applying a command took on this member, by its kind and whether it \
             succeeded",
            None,
            MetricType::Histogram,
        )?;
        for (op, ok, reading) in &telemetry.apply {
            let labels = [
                ("version", "v3"),
                ("op", op),
                ("success", if *ok { "true" } else { "false" }),
            ];
            let buckets = bucket_pairs(reading, 1.0);
            applies
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(reading.sum_secs, reading.count, &buckets, None)?;
        }
        self.encode_peers(encoder, &id)?;
        histogram_scaled(
            encoder,
            "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds",
            "Milliseconds each compaction held the apply back while it dropped the old versions",
            &telemetry.compaction_pause,
            1000.0,
        )?;
        histogram(
            encoder,
            "etcd_disk_wal_write_duration_seconds",
            "Seconds each write to the Raft log's file took, before its sync",
            &telemetry.wal_write,
        )?;
        histogram(
            encoder,
            "etcd_snap_db_save_total_duration_seconds",
            "Seconds installing a leader's snapshot took, from its arrival to its durable commit",
            &telemetry.snapshot_install,
        )
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A reading's buckets as (upper bound, count), the bounds multiplied by `scale`.
fn bucket_pairs(reading: &HistogramReading, scale: f64) -> Vec<(f64, u64)> {
    reading
        .bounds_secs
        .iter()
        .map(|b| b * scale)
        .zip(reading.bucket_counts.iter().copied())
        .collect()
}

fn histogram(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    reading: &HistogramReading,
) -> Result<(), std::fmt::Error> {
    histogram_scaled(encoder, name, help, reading, 1.0)
}

/// A histogram of seconds in another unit: `scale` units a second.
fn histogram_scaled(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    reading: &HistogramReading,
    scale: f64,
) -> Result<(), std::fmt::Error> {
    let buckets = bucket_pairs(reading, scale);
    encoder
        .encode_descriptor(name, help, None, MetricType::Histogram)?
        .encode_histogram::<NoLabelSet>(reading.sum_secs * scale, reading.count, &buckets, None)
}
