//! `/metrics`, read with curl and parsed strictly (the testkit's Prometheus reader), side by side
//! with a real etcd 3.4.23: the metrics dashboards and alerts use exist with etcd's names and
//! types, and they move with the work on both servers alike.

use leasehold_testkit as common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::prometheus::{self, Scrape};
use common::{Cluster, Kind};

/// The metrics issue #14 names, with etcd's types.
const ETCD_METRICS: [(&str, &str); 18] = [
    ("etcd_server_has_leader", "gauge"),
    ("etcd_server_is_leader", "gauge"),
    ("etcd_server_leader_changes_seen_total", "counter"),
    ("etcd_server_proposals_committed_total", "gauge"),
    ("etcd_server_proposals_applied_total", "gauge"),
    ("etcd_server_proposals_failed_total", "counter"),
    ("etcd_server_proposals_pending", "gauge"),
    ("etcd_server_version", "gauge"),
    ("etcd_mvcc_db_total_size_in_bytes", "gauge"),
    ("etcd_disk_wal_fsync_duration_seconds", "histogram"),
    ("etcd_disk_backend_commit_duration_seconds", "histogram"),
    ("etcd_debugging_lease_granted_total", "counter"),
    ("etcd_debugging_lease_revoked_total", "counter"),
    ("etcd_debugging_lease_renewed_total", "counter"),
    ("etcd_debugging_lease_ttl_total", "histogram"),
    ("etcd_debugging_server_lease_expired_total", "counter"),
    ("grpc_server_started_total", "counter"),
    ("grpc_server_handled_total", "counter"),
];

/// How long a member may take to elect a new leader after its leader is killed.
const FAILOVER_WAIT_MAX: Duration = Duration::from_secs(30);

/// `curl` over HTTP/1.1, as Prometheus scrapes; the body, parsed.
fn scrape(endpoint: &str) -> Scrape {
    let out = Command::new("curl")
        .args(["-sS", "--http1.1", "--max-time", "10", "--fail"])
        .arg(format!("{endpoint}/metrics"))
        .output()
        .expect("run curl");
    assert!(out.status.success(), "curl {endpoint}/metrics: {out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    prometheus::parse(&text).unwrap_or_else(|e| panic!("{endpoint}/metrics: {e}"))
}

/// The labels of a gRPC method's calls, with one status code or any.
fn grpc<'a>(method: &'a str, code: Option<&'a str>) -> Vec<(&'static str, &'a str)> {
    let mut labels = vec![("grpc_method", method)];
    labels.extend(code.map(|code| ("grpc_code", code)));
    labels
}

/// How much `name` (with `labels`) grew from `before` to `after`.
fn grew(before: &Scrape, after: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    after.count(name, labels) - before.count(name, labels)
}

/// Three grants, two renewals, a revoke of a lease that does not exist and a put, on etcd and on
/// leasehold: every metric of [`ETCD_METRICS`] has etcd's type on both, the lease and gRPC
/// counters move by the same amounts on both, and the client port and `--listen-metrics-urls`
/// serve the same metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_etcds_names_and_move_with_the_work() {
    let mut types_seen = Vec::new();
    let mut buckets_seen = Vec::new();
    for kind in [Kind::Etcd, Kind::Leasehold] {
        let metrics_url = format!("http://127.0.0.1:{}", common::free_port());
        let cluster = Cluster::start_with(kind, 1, &["--listen-metrics-urls", &metrics_url]).await;
        let server = &cluster.members[0];
        let side = server.label().to_owned();
        let ep = server.endpoint();
        let before = scrape(&ep);
        for (name, kind) in ETCD_METRICS {
            assert_eq!(
                before.types.get(name).map(String::as_str),
                Some(kind),
                "{side}: TYPE of {name}"
            );
        }
        types_seen.push(before.types.clone());
        let buckets: Vec<Vec<String>> = [
            "etcd_debugging_lease_ttl_total_bucket",
            "etcd_disk_wal_fsync_duration_seconds_bucket",
            "etcd_disk_backend_commit_duration_seconds_bucket",
        ]
        .iter()
        .map(|name| {
            before
                .samples
                .iter()
                .filter(|s| s.name == *name)
                .map(|s| s.labels["le"].clone())
                .collect()
        })
        .collect();
        buckets_seen.push(buckets);

        let mut client = server.client().await;
        let mut ids = Vec::new();
        for ttl in [5, 60, 3600] {
            ids.push(client.lease_grant(ttl, None).await.expect("grant").id());
        }
        // The client sends the stream's first renewal and reads its answer itself; one more.
        let (mut keeper, mut answers) = client.lease_keep_alive(ids[0]).await.expect("keepalive");
        keeper.keep_alive().await.expect("send a renewal");
        let renewed = answers.message().await.expect("renewal answer");
        assert!(renewed.is_some_and(|r| r.ttl() > 0), "{side}");
        let revoke_missing = client.lease_revoke(0x7777).await;
        assert!(revoke_missing.is_err(), "{side}: revoking an unknown lease");
        client.put("metrics-key", "v", None).await.expect("put");
        drop((keeper, answers));

        let after = scrape(&ep);
        let g = |name: &str, labels: &[(&str, &str)]| grew(&before, &after, name, labels);
        assert_eq!(g("etcd_debugging_lease_granted_total", &[]), 3.0, "{side}");
        assert_eq!(g("etcd_debugging_lease_renewed_total", &[]), 2.0, "{side}");
        assert_eq!(
            g("etcd_debugging_lease_ttl_total_count", &[]),
            3.0,
            "{side}"
        );
        assert_eq!(
            g("etcd_debugging_lease_ttl_total_bucket", &[("le", "64")]),
            2.0,
            "{side}: TTLs 5 and 60 are at most 64 s"
        );
        let grants = grpc("LeaseGrant", Some("OK"));
        assert_eq!(g("grpc_server_handled_total", &grants), 3.0, "{side}");
        let started = grpc("LeaseGrant", None);
        assert_eq!(g("grpc_server_started_total", &started), 3.0, "{side}");
        let missing = grpc("LeaseRevoke", Some("NotFound"));
        assert_eq!(g("grpc_server_handled_total", &missing), 1.0, "{side}");
        let puts = grpc("Put", Some("OK"));
        assert_eq!(g("grpc_server_handled_total", &puts), 1.0, "{side}");
        let stream = [
            ("grpc_method", "LeaseKeepAlive"),
            ("grpc_type", "bidi_stream"),
        ];
        assert_eq!(g("grpc_server_started_total", &stream), 1.0, "{side}");
        assert!(
            g("etcd_server_proposals_applied_total", &[]) >= 4.0,
            "{side}: three grants and a put are applied"
        );
        assert!(
            g("etcd_disk_wal_fsync_duration_seconds_count", &[]) >= 1.0,
            "{side}: the writes were synced"
        );
        assert_eq!(after.value("etcd_server_has_leader", &[]), Some(1.0));
        assert_eq!(after.value("etcd_server_is_leader", &[]), Some(1.0));
        let version = after
            .samples
            .iter()
            .find(|s| s.name == "etcd_server_version")
            .expect("etcd_server_version");
        assert!(
            version.labels["server_version"].starts_with("3."),
            "{side}: {version:?}"
        );
        assert!(after.count("etcd_mvcc_db_total_size_in_bytes", &[]) > 0.0);

        // The metrics port serves the same metrics, without gRPC.
        let on_metrics_port = scrape(&metrics_url);
        assert_eq!(
            on_metrics_port.count("etcd_debugging_lease_granted_total", &[]),
            after.count("etcd_debugging_lease_granted_total", &[]),
            "{side}"
        );
    }
    // The histograms have etcd's buckets, written as Go writes them.
    assert_eq!(
        buckets_seen[1], buckets_seen[0],
        "histogram buckets differ from etcd's"
    );
    assert_eq!(buckets_seen[0][0].len(), 25, "etcd's TTL buckets and +Inf");
    // Beyond the metrics named above: leasehold exports no etcd family with a type etcd gives
    // another.
    let (etcd, leasehold) = (&types_seen[0], &types_seen[1]);
    for (name, kind) in leasehold {
        if let Some(etcds) = etcd.get(name) {
            assert_eq!(kind, etcds, "TYPE of {name}");
        }
    }
}

/// A follower sees its leader killed and a new one elected: its
/// `etcd_server_leader_changes_seen_total` rises, on etcd and on leasehold, and the new leader
/// says `etcd_server_is_leader 1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_kill_raises_the_leader_change_counter() {
    for kind in [Kind::Etcd, Kind::Leasehold] {
        let mut cluster = Cluster::start(kind, 3).await;
        let leader = cluster.leader().await;
        let follower = (leader + 1) % 3;
        let side = cluster.members[follower].label().to_owned();
        let before = scrape(&cluster.members[follower].endpoint());
        let seen = before.count("etcd_server_leader_changes_seen_total", &[]);
        assert!(seen >= 1.0, "{side}: the first leader counts: {seen}");
        assert_eq!(before.value("etcd_server_is_leader", &[]), Some(0.0));
        cluster.members[leader].kill9();
        let new_leader = cluster.leader().await;
        assert_ne!(new_leader, leader);
        let deadline = Instant::now() + FAILOVER_WAIT_MAX;
        loop {
            let after = scrape(&cluster.members[follower].endpoint());
            let now_seen = after.count("etcd_server_leader_changes_seen_total", &[]);
            if now_seen > seen && after.value("etcd_server_has_leader", &[]) == Some(1.0) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{side}: leader changes still {now_seen} (was {seen}) {FAILOVER_WAIT_MAX:?} \
                 after the leader was killed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let led = scrape(&cluster.members[new_leader].endpoint());
        assert_eq!(led.value("etcd_server_is_leader", &[]), Some(1.0), "{side}");
    }
}

/// etcd 3.7's metrics beyond [`ETCD_METRICS`] that leasehold exports, with the types etcd 3.7
/// gives them (its source, `go.etcd.io/etcd/server/v3@v3.7.3`); the ones a 3-member cluster
/// adds are at the end.
const ETCD_37_METRICS: [(&str, &str); 43] = [
    ("etcd_cluster_version", "gauge"),
    ("etcd_debugging_auth_revision", "gauge"),
    ("etcd_debugging_mvcc_current_revision", "gauge"),
    ("etcd_debugging_mvcc_compact_revision", "gauge"),
    ("etcd_debugging_mvcc_keys_total", "gauge"),
    ("etcd_debugging_mvcc_db_compaction_keys_total", "counter"),
    ("etcd_debugging_mvcc_db_compaction_last", "gauge"),
    ("etcd_debugging_mvcc_events_total", "counter"),
    (
        "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds",
        "histogram",
    ),
    ("etcd_debugging_mvcc_slow_watcher_total", "gauge"),
    ("etcd_debugging_mvcc_total_put_size_in_bytes", "gauge"),
    ("etcd_debugging_mvcc_watch_stream_total", "gauge"),
    ("etcd_debugging_mvcc_watcher_total", "gauge"),
    ("etcd_disk_backend_defrag_duration_seconds", "histogram"),
    ("etcd_disk_backend_snapshot_duration_seconds", "histogram"),
    ("etcd_disk_defrag_inflight", "gauge"),
    ("etcd_disk_wal_write_bytes_total", "gauge"),
    ("etcd_disk_wal_write_duration_seconds", "histogram"),
    ("etcd_mvcc_db_total_size_in_use_in_bytes", "gauge"),
    ("etcd_mvcc_hash_duration_seconds", "histogram"),
    ("etcd_mvcc_hash_rev_duration_seconds", "histogram"),
    ("etcd_mvcc_put_total", "counter"),
    ("etcd_network_client_grpc_received_bytes_total", "counter"),
    ("etcd_network_client_grpc_sent_bytes_total", "counter"),
    ("etcd_network_known_peers", "gauge"),
    ("etcd_server_apply_duration_seconds", "histogram"),
    ("etcd_server_client_requests_total", "counter"),
    ("etcd_server_health_failures", "counter"),
    ("etcd_server_health_success", "counter"),
    ("etcd_server_heartbeat_send_failures_total", "counter"),
    ("etcd_server_id", "gauge"),
    ("etcd_server_learner_promote_successes", "counter"),
    ("etcd_server_quota_backend_bytes", "gauge"),
    ("etcd_server_range_duration_seconds", "histogram"),
    ("etcd_server_read_indexes_failed_total", "counter"),
    ("etcd_server_request_duration_seconds", "histogram"),
    ("etcd_server_slow_apply_total", "counter"),
    ("etcd_server_slow_read_indexes_total", "counter"),
    ("etcd_server_snapshot_apply_in_progress_total", "gauge"),
    ("grpc_server_msg_received_total", "counter"),
    ("grpc_server_msg_sent_total", "counter"),
    ("os_fd_used", "gauge"),
    ("os_fd_limit", "gauge"),
];

/// What only a member with peers exports (etcd 3.7's types).
const ETCD_37_PEER_METRICS: [(&str, &str); 3] = [
    ("etcd_network_active_peers", "gauge"),
    ("etcd_network_peer_received_bytes_total", "counter"),
    ("etcd_network_peer_sent_bytes_total", "counter"),
];

/// A member of three: every metric of [`ETCD_37_METRICS`] and [`ETCD_37_PEER_METRICS`] exists
/// with etcd 3.7's type, and they say what happened: the member's ID, its two peers active and
/// sent to, a put's messages and bytes, a health check, the default quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_37s_metrics_exist_with_their_types_and_count_the_work() {
    let cluster = Cluster::start(Kind::Leasehold, 3).await;
    let server = &cluster.members[0];
    let ep = server.endpoint();
    let mut client = server.client().await;
    let status = client.status().await.expect("status");
    let member_id = format!("{:x}", status.header().expect("header").member_id());
    let before = scrape(&ep);
    for (name, kind) in ETCD_37_METRICS.iter().chain(&ETCD_37_PEER_METRICS) {
        assert_eq!(
            before.types.get(*name).map(String::as_str),
            Some(*kind),
            "TYPE of {name}"
        );
    }
    client.put("m", "v", None).await.expect("put");
    // Two renewals on one stream: the client sends the first and reads its answer itself.
    let id = client.lease_grant(60, None).await.expect("grant").id();
    let (mut keeper, mut answers) = client.lease_keep_alive(id).await.expect("keepalive");
    keeper.keep_alive().await.expect("send a renewal");
    let answer = answers.message().await.expect("renewal answer");
    assert!(answer.is_some_and(|a| a.ttl() > 0));
    drop((keeper, answers));
    let health = Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "10"])
        .arg(format!("{ep}/health"))
        .output()
        .expect("run curl");
    assert!(health.status.success(), "{health:?}");
    // Peers are active once heard from: keepalives come every heartbeat (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let after = scrape(&ep);
        if after.count("etcd_network_active_peers", &[]) == 2.0 || Instant::now() > deadline {
            break after;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let g = |name: &str, labels: &[(&str, &str)]| grew(&before, &after, name, labels);
    assert_eq!(
        after.value("etcd_server_id", &[("server_id", &member_id)]),
        Some(1.0)
    );
    assert_eq!(
        after.count("etcd_network_known_peers", &[("Local", &member_id)]),
        3.0,
        "itself and two peers"
    );
    let peers: Vec<&common::prometheus::Sample> = after
        .samples
        .iter()
        .filter(|s| s.name == "etcd_network_active_peers")
        .collect();
    assert_eq!(peers.len(), 2, "{peers:?}");
    assert!(peers.iter().all(|s| s.value == 1.0), "{peers:?}");
    // Raft messages go between the leader and each follower (followers exchange keepalives,
    // which carry no message), so this member sent some bytes to at least one peer.
    for name in [
        "etcd_network_peer_sent_bytes_total",
        "etcd_network_peer_received_bytes_total",
    ] {
        assert!(after.count(name, &[]) > 0.0, "{name}");
    }
    let put = [("grpc_method", "Put")];
    assert_eq!(g("grpc_server_msg_received_total", &put), 1.0);
    assert_eq!(g("grpc_server_msg_sent_total", &put), 1.0);
    let renewals = [("grpc_method", "LeaseKeepAlive")];
    assert_eq!(g("grpc_server_msg_received_total", &renewals), 2.0);
    assert_eq!(g("grpc_server_msg_sent_total", &renewals), 2.0);
    assert!(g("etcd_network_client_grpc_received_bytes_total", &[]) >= 4.0);
    assert!(g("etcd_network_client_grpc_sent_bytes_total", &[]) > 0.0);
    assert_eq!(
        g(
            "etcd_server_request_duration_seconds_count",
            &[("type", "Put"), ("success", "true")]
        ),
        1.0
    );
    assert_eq!(
        g(
            "etcd_server_apply_duration_seconds_count",
            &[("op", "Put"), ("success", "true")]
        ),
        1.0
    );
    assert_eq!(g("etcd_debugging_mvcc_total_put_size_in_bytes", &[]), 2.0);
    assert_eq!(g("etcd_server_health_success", &[]), 1.0);
    assert!(
        g("etcd_disk_wal_write_bytes_total", &[]) > 0.0,
        "the put was logged"
    );
    assert_eq!(
        after.value("etcd_server_quota_backend_bytes", &[]),
        Some(2_147_483_648.0)
    );
    assert!(after.value("os_fd_used", &[]).is_some_and(|n| n > 0.0));
}
