//! Alarms and the space quota, against real etcd.
//!
//! - Past `--quota-backend-bytes`, a put raises NOSPACE and is refused; while it is raised, puts,
//!   txns with puts and lease grants get `etcdserver: mvcc: database space exceeded`, while reads,
//!   deletes and compaction work; `etcdctl alarm list`, Status's `errors` and `/health` show it;
//!   after a compaction, a defragment and `etcdctl alarm disarm`, writes work again.
//! - CORRUPT raised through the Alarm RPC refuses every write with `etcdserver: corrupt cluster`
//!   until it is cleared.
//!
//! Each scenario records what etcdctl and the etcd-client crate answer, step by step, with the
//! member id masked, and the two recordings must be equal.

use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client, Compare, CompareOp, Txn, TxnOp};
use leasehold_testkit as common;

use common::{Etcd, Leasehold, Server, Setup, curl, etcdctl, etcdctl_ok, stdout_of};

/// Small enough that a few hundred 16 KiB values pass it on either server.
const QUOTA: &str = "--quota-backend-bytes=4194304";
/// Most puts tried before the quota must have been hit.
const PUTS_MAX: usize = 2_000;

fn quota() -> Setup {
    Setup {
        args: vec![QUOTA.into()],
        ..Setup::default()
    }
}

fn outcome<T>(r: Result<T, etcd_client::Error>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(etcd_client::Error::GRpcStatus(s)) => format!("{:?} {}", s.code(), s.message()),
        Err(other) => format!("not a gRPC status: {other}"),
    }
}

/// etcdctl's output (stdout, or its error line), with the member id masked.
async fn ctl(server: &Server, id: u64, args: &[&str]) -> String {
    let out = etcdctl(&server.endpoint(), args).await;
    let text = if out.status.success() {
        stdout_of(&out)
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        stderr.trim().lines().last().unwrap_or_default().to_owned()
    };
    text.replace(&id.to_string(), "ID")
        .replace(&format!("{id:x}"), "ID")
}

async fn member_id(client: &mut Client) -> u64 {
    client
        .status()
        .await
        .expect("status")
        .header()
        .expect("header")
        .member_id()
}

async fn no_space(server: &Server) -> Vec<String> {
    let mut client = server.client().await;
    let id = member_id(&mut client).await;
    let mut log = Vec::new();
    client.put("kept", "1", None).await.expect("put");
    let value = vec![b'x'; 16 * 1024];
    let mut refused = None;
    for i in 0..PUTS_MAX {
        if let Err(e) = client
            .put(format!("fill/{i:05}"), value.clone(), None)
            .await
        {
            refused = Some(outcome::<()>(Err(e)));
            break;
        }
    }
    let refused =
        refused.unwrap_or_else(|| panic!("{}: {PUTS_MAX} puts and no NOSPACE", server.label()));
    log.push(format!("the put past the quota: {refused}"));
    log.push(format!(
        "alarm list: {}",
        ctl(server, id, &["alarm", "list"]).await
    ));
    let status = client.status().await.expect("status");
    let errors: Vec<String> = status
        .errors()
        .iter()
        .map(|e| e.replace(&id.to_string(), "ID"))
        .collect();
    log.push(format!("status errors: {errors:?}"));
    log.push(format!(
        "put: {}",
        outcome(client.put("small", "1", None).await)
    ));
    let txn = Txn::new()
        .when([Compare::version("kept", CompareOp::Greater, 0)])
        .or_else([TxnOp::put("small", "1", None)]);
    log.push(format!(
        "txn with a put: {}",
        outcome(client.txn(txn).await)
    ));
    let read_only = Txn::new().and_then([TxnOp::get("kept", None)]);
    log.push(format!(
        "read-only txn: {}",
        outcome(client.txn(read_only).await)
    ));
    log.push(format!(
        "lease grant: {}",
        outcome(client.lease_grant(60, None).await)
    ));
    log.push(format!("get: {}", ctl(server, id, &["get", "kept"]).await));
    log.push(format!(
        "delete: {}",
        ctl(server, id, &["del", "--prefix", "fill/"])
            .await
            .lines()
            .count()
    ));
    let rev = client
        .get("kept", None)
        .await
        .expect("get")
        .header()
        .expect("h")
        .revision();
    log.push(format!(
        "compact: {}",
        outcome(
            client
                .compact(
                    rev,
                    Some(etcd_client::CompactionOptions::new().with_physical())
                )
                .await
        )
    ));
    etcdctl_ok(&server.endpoint(), &["defrag"]).await;
    log.push(format!(
        "alarm disarm: {}",
        ctl(server, id, &["alarm", "disarm"]).await
    ));
    log.push(format!(
        "alarm list: {:?}",
        ctl(server, id, &["alarm", "list"]).await
    ));
    log.push(format!(
        "put after disarm: {}",
        outcome(client.put("small", "2", None).await)
    ));
    log
}

async fn corrupt(server: &Server) -> Vec<String> {
    let mut client = server.client().await;
    let id = member_id(&mut client).await;
    let mut log = Vec::new();
    client.put("k", "1", None).await.expect("put");
    let lease = client.lease_grant(60, None).await.expect("grant").id();
    let mut on_me = AlarmOptions::new();
    on_me.with_member(id);
    let raised = client
        .alarm(
            AlarmAction::Activate,
            AlarmType::Corrupt,
            Some(on_me.clone()),
        )
        .await
        .expect("raise CORRUPT");
    let listed: Vec<String> = raised
        .alarms()
        .iter()
        .map(|a| format!("{} {:?}", a.member_id() == id, a.alarm()))
        .collect();
    log.push(format!("activate answers: {listed:?}"));
    log.push(format!(
        "alarm list: {}",
        ctl(server, id, &["alarm", "list"]).await
    ));
    log.push(format!(
        "put: {}",
        outcome(client.put("k", "2", None).await)
    ));
    log.push(format!(
        "delete: {}",
        outcome(client.delete("k", None).await)
    ));
    log.push(format!(
        "lease grant: {}",
        outcome(client.lease_grant(60, None).await)
    ));
    log.push(format!(
        "lease revoke: {}",
        outcome(client.lease_revoke(lease).await)
    ));
    log.push(format!(
        "compact: {}",
        outcome(client.compact(2, None).await)
    ));
    log.push(format!(
        "serializable get: {}",
        ctl(server, id, &["get", "k", "--consistency=s"]).await
    ));
    let cleared = client
        .alarm(
            AlarmAction::Deactivate,
            AlarmType::Corrupt,
            Some(on_me.clone()),
        )
        .await
        .expect("clear CORRUPT");
    log.push(format!(
        "deactivate answers {} alarm(s)",
        cleared.alarms().len()
    ));
    let again = client
        .alarm(AlarmAction::Deactivate, AlarmType::Corrupt, Some(on_me))
        .await
        .expect("clear CORRUPT again");
    log.push(format!(
        "a second deactivate answers {} alarm(s)",
        again.alarms().len()
    ));
    log.push(format!(
        "put after: {}",
        outcome(client.put("k", "3", None).await)
    ));
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_space_matches_etcd() {
    let etcd = Etcd::start_with(quota()).await;
    let leasehold = Leasehold::start_with(quota()).await;
    let want = no_space(&etcd).await;
    let got = no_space(&leasehold).await;
    eprintln!("etcd: {want:#?}");
    assert_eq!(got, want, "leasehold vs etcd");
    assert!(want[0].contains("database space exceeded"), "{want:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_matches_etcd() {
    let etcd = Etcd::start().await;
    let leasehold = Leasehold::start().await;
    let want = corrupt(&etcd).await;
    let got = corrupt(&leasehold).await;
    eprintln!("etcd: {want:#?}");
    assert_eq!(got, want, "leasehold vs etcd");
    assert!(
        want.iter().any(|l| l.contains("corrupt cluster")),
        "{want:#?}"
    );
}

/// `/health` fails while NOSPACE is raised, unless `?exclude=NOSPACE`; `/readyz` fails its
/// `data_corruption` check while CORRUPT is raised. (etcd 3.5's shapes; the etcd the tests run is
/// 3.4, whose `/health` has no `exclude`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_alarms() {
    let server = Leasehold::start().await;
    let mut client = server.client().await;
    let id = member_id(&mut client).await;
    let e = server.endpoint();
    let mut on_me = AlarmOptions::new();
    on_me.with_member(id);
    client
        .alarm(
            AlarmAction::Activate,
            AlarmType::Nospace,
            Some(on_me.clone()),
        )
        .await
        .expect("raise NOSPACE");
    let (code, body) = curl("GET", &e, "/health", None);
    assert_eq!(
        (code, body.as_str()),
        (503, r#"{"health":"false","reason":"ALARM NOSPACE"}"#)
    );
    let (code, body) = curl("GET", &e, "/health?exclude=NOSPACE", None);
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"health":"true","reason":""}"#)
    );
    client
        .alarm(AlarmAction::Activate, AlarmType::Corrupt, Some(on_me))
        .await
        .expect("raise CORRUPT");
    let (code, body) = curl("GET", &e, "/readyz?verbose", None);
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("[-]data_corruption failed: alarm activated: CORRUPT"),
        "{body}"
    );
}

/// An alarm raised through one member is held by every member: each refuses a put, and each
/// lists it; clearing it through another member lets writes through everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarms_are_replicated_to_every_member() {
    let cluster = common::InProcessCluster::start(3).await;
    let endpoints = cluster.endpoints();
    let mut clients = Vec::new();
    for e in &endpoints {
        clients.push(Client::connect([e.as_str()], None).await.expect("connect"));
    }
    let id = member_id(&mut clients[0]).await;
    let mut on_first = AlarmOptions::new();
    on_first.with_member(id);
    clients[0]
        .alarm(
            AlarmAction::Activate,
            AlarmType::Nospace,
            Some(on_first.clone()),
        )
        .await
        .expect("raise NOSPACE");
    for (i, client) in clients.iter_mut().enumerate() {
        // A follower applies the alarm a moment after the leader commits it; the listing reads
        // after everything committed is applied, so once it shows, the put must be refused.
        let listed = client
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .expect("alarm list");
        assert_eq!(listed.alarms().len(), 1, "member {i}");
        let put = outcome(client.put("k", "v", None).await);
        assert_eq!(
            put, "ResourceExhausted etcdserver: mvcc: database space exceeded",
            "member {i}"
        );
    }
    clients[2]
        .alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(on_first))
        .await
        .expect("clear NOSPACE");
    for (i, client) in clients.iter_mut().enumerate() {
        let listed = client
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .expect("alarm list");
        assert!(listed.alarms().is_empty(), "member {i}");
        assert_eq!(
            outcome(client.put("k", "v", None).await),
            "ok",
            "member {i}"
        );
    }
    cluster.shutdown().await;
}
