//! etcd's corruption checks, against etcd: three members, one of them restored from the wrong
//! backup (a snapshot whose history has other values at the same revisions), each cluster made
//! with its own tools (`etcdctl snapshot restore`, `leasehold snapshot restore`):
//!
//! - `--experimental-corrupt-check-time`: the leader finds the odd member out and raises
//!   CORRUPT for it (for the first member that disagrees with it, when the leader is the odd
//!   one; etcd 3.4 names member 0 instead, etcd 3.5 the member, as leasehold), and writes are
//!   then refused with `etcdserver: corrupt cluster`;
//! - `--experimental-initial-corrupt-check`: the odd member refuses to start once the others
//!   run, saying `found data inconsistency with peers`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client};
use leasehold_testkit as common;

use common::{Kind, Server, etcdctl_ok};

/// A one-member server of `kind` with `value` written at every key, saved as a snapshot file in
/// `dir`. Two calls with different values give files with the same revisions.
async fn backup(kind: Kind, dir: &Path, value: &str) -> PathBuf {
    let server = match kind {
        Kind::Etcd => common::Etcd::start().await,
        Kind::Leasehold => common::Leasehold::start().await,
    };
    let mut client = server.client().await;
    for i in 0..20 {
        client
            .put(format!("key/{i}"), value, None)
            .await
            .expect("put");
    }
    let path = dir.join(format!("{kind:?}-{value}.db"));
    etcdctl_ok(
        &server.endpoint(),
        &["snapshot", "save", path.to_str().expect("utf-8")],
    )
    .await;
    path
}

/// Three members of `kind`: `m0` and `m1` restored from `good`, `m2` from `odd`, each started
/// with `args` (`m2` with `odd_args` too); spawned, not waited for.
fn restored_cluster(
    kind: Kind,
    good: &Path,
    odd: &Path,
    args: &[&str],
    odd_args: &[&str],
) -> Vec<Server> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut with_odd = args.clone();
    with_odd.extend(odd_args.iter().map(|a| a.to_string()));
    common::spawn_restored_members(kind, &[good, good, odd], &[args.clone(), args, with_odd])
}

/// Member name → id, as `member list` gives them.
async fn ids(client: &mut Client) -> BTreeMap<String, u64> {
    client
        .member_list()
        .await
        .expect("member list")
        .members()
        .iter()
        .map(|m| (m.name().to_owned(), m.id()))
        .collect()
}

/// The CORRUPT alarms raised, once there is one (bounded).
async fn corrupt_alarms(client: &mut Client) -> Vec<u64> {
    let started = Instant::now();
    loop {
        let alarms = client
            .alarm(AlarmAction::Get, AlarmType::None, None::<AlarmOptions>)
            .await
            .expect("alarm list");
        let corrupt: Vec<u64> = alarms
            .alarms()
            .iter()
            .filter(|a| a.alarm() == AlarmType::Corrupt)
            .map(|a| a.member_id())
            .collect();
        if !corrupt.is_empty() {
            return corrupt;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no CORRUPT alarm after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Who is alarmed, in terms of the rule: `m2` (the odd one) when it does not lead; otherwise
/// one of the others (the first to disagree with the leader).
async fn periodic_check(kind: Kind) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let good = backup(kind, dir.path(), "good").await;
    let odd = backup(kind, dir.path(), "odd").await;
    let mut members = restored_cluster(
        kind,
        &good,
        &odd,
        &["--experimental-corrupt-check-time=1s"],
        &[],
    );
    for member in &mut members {
        member.wait_ready().await;
    }
    let mut client = members[0].client().await;
    let ids = ids(&mut client).await;
    let alarmed = corrupt_alarms(&mut client).await;
    let leader = client.status().await.expect("status").leader();
    assert_eq!(alarmed.len(), 1, "{kind:?}: one alarm a check: {alarmed:?}");
    let odd_id = ids["m2"];
    let verdict = if kind == Kind::Etcd && alarmed[0] == 0 {
        // etcd 3.4's peers answer without their member ID, so its leader raises the alarm for
        // member 0; etcd 3.5 names the member, as leasehold does.
        "member 0 (etcd 3.4)".to_owned()
    } else if leader != odd_id {
        assert_eq!(alarmed[0], odd_id, "{kind:?}: {ids:?}, leader {leader:x}");
        "the odd member".to_owned()
    } else {
        assert!(
            alarmed[0] != odd_id && ids.values().any(|id| *id == alarmed[0]),
            "{kind:?}: {ids:?}, leader {leader:x}, alarmed {alarmed:?}"
        );
        "another member (the odd one leads)".to_owned()
    };
    let refused = client
        .put("after", "x", None)
        .await
        .expect_err("writes are refused");
    format!("alarmed {verdict}; put: {refused}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_raises_corrupt_for_a_member_restored_from_another_history() {
    let etcd = periodic_check(Kind::Etcd).await;
    let leasehold = periodic_check(Kind::Leasehold).await;
    eprintln!("etcd: {etcd}\nleasehold: {leasehold}");
    assert!(etcd.contains("corrupt cluster"), "{etcd}");
    // Which member is alarmed depends on who leads; the error does not.
    let error = |s: &str| s.split("; put: ").nth(1).map(str::to_owned);
    assert_eq!(error(&leasehold), error(&etcd));
}

/// The odd member's exit and what its log says.
async fn initial_check(kind: Kind) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let good = backup(kind, dir.path(), "good").await;
    let odd = backup(kind, dir.path(), "odd").await;
    let mut members = restored_cluster(
        kind,
        &good,
        &odd,
        &[],
        &["--experimental-initial-corrupt-check=true"],
    );
    members[0].wait_ready().await;
    members[1].wait_ready().await;
    let exit = members[2]
        .wait_exit(Duration::from_secs(60))
        .await
        .unwrap_or_else(|| members[2].fail("the odd member still runs after 60 s"));
    assert!(!exit.success(), "{kind:?}: {exit}");
    let log = members[2].log();
    let line = log
        .lines()
        .find(|l| l.contains("found data inconsistency with peers"))
        .unwrap_or_else(|| members[2].fail("no inconsistency reported"));
    // The others serve on.
    let mut client = members[0].client().await;
    client.put("still", "up", None).await.expect("put");
    line.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restored_from_another_history_refuses_to_start_with_the_initial_check() {
    let etcd = initial_check(Kind::Etcd).await;
    let leasehold = initial_check(Kind::Leasehold).await;
    eprintln!("etcd: {etcd}\nleasehold: {leasehold}");
    assert!(
        etcd.contains("found data inconsistency with peers"),
        "{etcd}"
    );
    assert!(
        leasehold.contains("found data inconsistency with peers"),
        "{leasehold}"
    );
}
