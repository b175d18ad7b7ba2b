//! etcd's HTTP endpoints on the client port, read with curl over HTTP/1.1 (as probes and load
//! balancers do), and `grpc.health.v1` read with a gRPC client; side by side with a real etcd
//! 3.4.23 where it has the endpoint. leasehold answers in etcd 3.5's shapes (the version it
//! reports): `/health` adds `"reason"`, and `/livez` and `/readyz` exist (etcd 3.4 answers 404).

use leasehold_testkit as common;

use std::time::{Duration, Instant};

use common::{Cluster, Etcd, Kind, Leasehold, Server};
use serde_json::Value;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Bound of waiting for a member to notice it has lost its leader.
const NO_LEADER_WAIT_MAX: Duration = Duration::from_secs(30);

/// `curl` over HTTP/1.1: the status code and the body.
fn get(endpoint: &str, path: &str) -> (u16, String) {
    request("GET", endpoint, path)
}

fn request(method: &str, endpoint: &str, path: &str) -> (u16, String) {
    common::curl(method, endpoint, path, None)
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

async fn grpc_health(server: &Server) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(server.endpoint())
        .expect("endpoint URL")
        .connect()
        .await
        .expect("connect");
    let mut client = HealthClient::new(channel);
    let status = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("grpc.health.v1 Check")
        .into_inner()
        .status;
    ServingStatus::try_from(status).expect("a known status")
}

/// What both servers answer alike: `/health` (plain and serializable) says healthy with 200,
/// `/version` names the server and cluster versions in etcd's key order, a POST gets etcd's
/// 405, an unknown path gets etcd's 404 page, and `grpc.health.v1` says SERVING.
async fn check_common(server: &Server) -> (Value, Value) {
    let side = server.label().to_owned();
    let ep = server.endpoint();
    let (code, body) = get(&ep, "/health");
    assert_eq!(code, 200, "{side} /health: {body}");
    let health = json(&body);
    assert_eq!(health["health"], "true", "{side}: {body}");
    let (code, body) = get(&ep, "/health?serializable=true");
    assert_eq!(code, 200, "{side} /health?serializable=true: {body}");
    assert_eq!(json(&body)["health"], "true", "{side}: {body}");
    let (code, body) = get(&ep, "/version");
    assert_eq!(code, 200, "{side} /version");
    assert!(
        body.starts_with(r#"{"etcdserver":"3."#) && body.contains(r#","etcdcluster":"3."#),
        "{side} /version: {body}"
    );
    let version = json(&body);
    assert!(
        version["etcdcluster"]
            .as_str()
            .is_some_and(|v| v.ends_with(".0")),
        "{side}: {body}"
    );
    assert_eq!(
        request("POST", &ep, "/health"),
        (405, "Method Not Allowed\n".to_owned()),
        "{side}"
    );
    let (code, body) = get(&ep, "/no/such/path");
    assert_eq!(
        (code, body.as_str()),
        (404, "404 page not found\n"),
        "{side}"
    );
    assert_eq!(grpc_health(server).await, ServingStatus::Serving, "{side}");
    (health, version)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_version_and_grpc_health_answer_as_etcd_does() {
    let etcd = Etcd::start().await;
    check_common(&etcd).await;
    let leasehold = Leasehold::start().await;
    let (health, version) = check_common(&leasehold).await;
    if leasehold.kind() == Kind::Etcd {
        return; // LEASEHOLD_DIFF_AGAINST_ETCD: the rest is leasehold's 3.5 shape.
    }
    assert_eq!(health, serde_json::json!({"health": "true", "reason": ""}));
    assert_eq!(
        version,
        serde_json::json!({"etcdserver": "3.7.3", "etcdcluster": "3.7.0"})
    );
    // etcd 3.4 has no /livez or /readyz.
    assert_eq!(get(&etcd.endpoint(), "/livez").0, 404);
    let ep = leasehold.endpoint();
    assert_eq!(get(&ep, "/livez"), (200, "ok".to_owned()));
    assert_eq!(get(&ep, "/readyz"), (200, "ok".to_owned()));
    assert_eq!(
        get(&ep, "/livez?verbose"),
        (
            200,
            "[+]serializable_read ok\nlivez check passed\n".to_owned()
        )
    );
    assert_eq!(
        get(&ep, "/readyz?verbose&exclude=non_learner"),
        (
            200,
            "[+]data_corruption ok\n[+]serializable_read ok\n[+]linearizable_read ok\n\
             [+]non_learner excluded: ok\nreadyz check passed\n"
                .to_owned()
        )
    );
}

/// A member whose two peers are gone has no leader, whether it led or followed: `/health` says
/// so with 503 on both (etcd
/// 3.5's reason `RAFT NO LEADER` on leasehold). leasehold's `/health?serializable=true` still
/// answers 200, as etcd 3.5's does (3.4 ignores the parameter), `/livez` stays ok (a local read
/// works) and `/readyz` fails on the linearizable read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_a_leader_is_unhealthy_but_alive() {
    // The survivor was the leader (it steps down for want of a quorum, as etcd's does) or a
    // follower (it stops naming the lost leader when it campaigns).
    let cases = [
        (Kind::Etcd, true),
        (Kind::Leasehold, true),
        (Kind::Leasehold, false),
    ];
    for (kind, survivor_led) in cases {
        let mut cluster = Cluster::start(kind, 3).await;
        let leader = cluster.leader().await;
        let survivor = if survivor_led {
            leader
        } else {
            (leader + 1) % 3
        };
        // Healthy first, the leader (which hears its peers' heartbeat answers) included.
        for member in &cluster.members {
            let (code, body) = get(&member.endpoint(), "/health");
            assert_eq!(code, 200, "{}: {body}", member.label());
        }
        for (i, member) in cluster.members.iter_mut().enumerate() {
            if i != survivor {
                member.kill9();
            }
        }
        let ep = cluster.members[survivor].endpoint();
        let side = format!(
            "{} ({})",
            cluster.members[survivor].label(),
            if survivor_led {
                "was leader"
            } else {
                "was follower"
            }
        );
        let deadline = Instant::now() + NO_LEADER_WAIT_MAX;
        // Until the member notices: at first a read fails (leasehold's reason `RANGE ERROR:`),
        // then its election timeout passes and it knows it has no leader.
        let (code, body) = loop {
            let (code, body) = get(&ep, "/health");
            let noticed =
                code == 503 && (kind == Kind::Etcd || json(&body)["reason"] == "RAFT NO LEADER");
            if noticed {
                break (code, body);
            }
            assert!(
                Instant::now() < deadline,
                "{side}: not unhealthy for want of a leader {NO_LEADER_WAIT_MAX:?} after \
                 losing both peers: {code} {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(code, 503, "{side}: {body}");
        let health = json(&body);
        assert_eq!(health["health"], "false", "{side}: {body}");
        if kind == Kind::Etcd {
            // etcd 3.4 knows no `?serializable` and answers 503 here too; 3.5 answers 200.
            continue;
        }
        let (code, serializable) = get(&ep, "/health?serializable=true");
        assert_eq!(code, 200, "{side} serializable: {serializable}");
        assert_eq!(
            json(&serializable)["health"],
            "true",
            "{side}: {serializable}"
        );
        assert_eq!(health["reason"], "RAFT NO LEADER", "{body}");
        assert_eq!(get(&ep, "/livez"), (200, "ok".to_owned()));
        let (code, body) = get(&ep, "/readyz?verbose");
        assert_eq!(code, 503, "{body}");
        assert!(
            body.contains("[+]serializable_read ok\n")
                && body.contains("[-]linearizable_read failed: ")
                && body.ends_with("readyz check failed\n"),
            "{body}"
        );
    }
}

/// `--listen-metrics-urls` serves the HTTP endpoints on a port of their own, as etcd does
/// (kubeadm's static pods probe `/health` and `/readyz` there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_urls_serve_the_health_endpoints() {
    for kind in [Kind::Etcd, Kind::Leasehold] {
        let metrics = format!("http://127.0.0.1:{}", common::free_port());
        let cluster = Cluster::start_with(kind, 1, &["--listen-metrics-urls", &metrics]).await;
        let side = cluster.members[0].label().to_owned();
        let (code, body) = get(&metrics, "/health?exclude=NOSPACE&serializable=true");
        assert_eq!(code, 200, "{side}: {body}");
        assert_eq!(json(&body)["health"], "true", "{side}: {body}");
        // The JSON gateway is on the client URLs only.
        assert_eq!(
            request("POST", &metrics, "/v3/kv/range"),
            (404, "404 page not found\n".to_owned()),
            "{side}"
        );
        if kind == Kind::Leasehold {
            assert_eq!(get(&metrics, "/readyz"), (200, "ok".to_owned()));
            assert_eq!(get(&metrics, "/livez"), (200, "ok".to_owned()));
            assert_eq!(get(&metrics, "/version").0, 200);
        }
    }
}
