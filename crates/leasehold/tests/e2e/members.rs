//! The member list and MemberUpdate on three members, against a real etcd cluster.
//!
//! - Every member lists every member with its name, peer URLs and client URLs (each member
//!   publishes its own through the log when it starts).
//! - `etcdctl member update` changes a member's peer URL, which every member then lists, and
//!   changing it back keeps the cluster serving; an unknown id and a URL another member has get
//!   etcd's errors.
//! - A member removed from the cluster stops by itself, its process exiting as etcd's does,
//!   while the other two go on serving.
//! - `--force-new-cluster` brings one member of a stopped cluster back alone, with its data, and
//!   again with the flag left on.

use std::time::{Duration, Instant};

use leasehold_testkit as common;
use serde_json::Value;

use common::{Cluster, Kind, Server, etcdctl, free_ports};

/// `etcdctl member list -w json` through `endpoint`: (name, peer URLs, client URLs), by name.
async fn listed(endpoint: &str) -> Vec<(String, Vec<String>, Vec<String>)> {
    let out = etcdctl(endpoint, &["member", "list", "-w", "json"]).await;
    assert!(out.status.success(), "{}", common::describe_output(&out));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut members: Vec<_> = json["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_owned(),
                strings(&m["peerURLs"]),
                strings(&m["clientURLs"]),
            )
        })
        .collect();
    members.sort();
    members
}

/// The id etcdctl prints for the member named `name` (hex), through `endpoint`.
async fn id_of(endpoint: &str, name: &str) -> String {
    let out = etcdctl(endpoint, &["member", "list"]).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.split(", ").nth(2) == Some(name))
        .and_then(|l| l.split(", ").next())
        .unwrap_or_else(|| panic!("{name} not in\n{text}"))
        .to_owned()
}

/// What a scenario shows, with ports and ids masked, for comparison with etcd.
async fn scenario(kind: Kind) -> Vec<String> {
    let cluster = Cluster::start(kind, 3).await;
    let endpoints: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let peers: Vec<String> = cluster.members.iter().map(|m| m.peer_url()).collect();
    let mask = |text: &str| {
        let mut text = text.to_owned();
        for (i, (e, p)) in endpoints.iter().zip(&peers).enumerate() {
            text = text.replace(e, &format!("CLIENT{}", i + 1));
            text = text.replace(p, &format!("PEER{}", i + 1));
        }
        text
    };
    let mut log = Vec::new();
    // Every member lists all three with their URLs once each has published (bounded wait).
    let expected: Vec<(String, Vec<String>, Vec<String>)> = (0..3)
        .map(|i| {
            (
                format!("m{}", i + 1),
                vec![peers[i].clone()],
                vec![endpoints[i].clone()],
            )
        })
        .collect();
    let started = Instant::now();
    for e in &endpoints {
        loop {
            let got = listed(e).await;
            if got == expected {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{kind:?} via {e}: {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    log.push("every member lists every member's name, peer and client URLs".to_owned());

    // A follower's peer URL to a new one, then back. (Not the leader's: with it unreachable the
    // followers could not forward the change back, on etcd as here.) Asked through the leader.
    let mut client = cluster.members[0].client().await;
    let leader = client.status().await.expect("status").leader();
    let mut target = None;
    let mut via = 0;
    for i in 0..3 {
        let id = id_of(&endpoints[0], &format!("m{}", i + 1)).await;
        if u64::from_str_radix(&id, 16).expect("hex id") == leader {
            via = i;
        } else if target.is_none() {
            target = Some((i, id));
        }
    }
    let (t, id) = target.expect("a follower");
    let leader_peer = peers[via].clone();
    let via = endpoints[via].as_str();
    let [_, unused] = free_ports::<2>();
    let moved = format!("http://127.0.0.1:{unused}");
    let to_moved = format!("--peer-urls={moved}");
    let out = etcdctl(via, &["member", "update", &id, &to_moved]).await;
    // etcdctl prints the ID with `%16x`: one that starts with a zero nibble comes out padded
    // with a space, on either side, as IDs are drawn from the ports.
    let text = String::from_utf8_lossy(&out.stdout)
        .replace(&id, "ID")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    log.push(format!(
        "update: {} {}",
        out.status.success(),
        mask(text.split(" in cluster").next().unwrap_or_default())
    ));
    let updated = listed(via)
        .await
        .into_iter()
        .find(|m| m.0 == format!("m{}", t + 1))
        .expect("the follower listed");
    log.push(format!(
        "its peer URLs after: {}",
        mask(&updated.1.join(",")).replace(&moved, "MOVED")
    ));
    let back = format!("--peer-urls={}", peers[t]);
    let out = etcdctl(via, &["member", "update", &id, &back]).await;
    log.push(format!("update back: {}", out.status.success()));
    let mut follower = cluster.members[t].client().await;
    follower
        .put("after", "1", None)
        .await
        .expect("put through the follower");

    // etcd's errors.
    for (what, args) in [
        (
            "unknown id",
            vec!["member", "update", "1234", "--peer-urls=http://127.0.0.1:1"],
        ),
        (
            "another member's URL",
            vec!["member", "update", &id, &leader_peer],
        ),
    ] {
        let args: Vec<String> = args
            .into_iter()
            .map(|a| {
                if a == leader_peer {
                    format!("--peer-urls={a}")
                } else {
                    a.to_owned()
                }
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = etcdctl(via, &args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.trim().lines().last().unwrap_or_default().to_owned();
        log.push(format!("{what}: {} {}", out.status.success(), mask(&last)));
    }
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_list_and_update_match_etcd() {
    let want = scenario(Kind::Etcd).await;
    let got = scenario(Kind::Leasehold).await;
    eprintln!("etcd: {want:#?}");
    assert_eq!(got, want, "leasehold vs etcd");
}

/// Three members of `kind` on `ports`, with one token: the cluster ID and each member's ID by
/// name, as `etcdctl member list -w json` prints them.
async fn ids_on(kind: Kind, ports: &[[u16; 2]]) -> (u64, Vec<(String, u64)>) {
    let initial = ports
        .iter()
        .enumerate()
        .map(|(i, [_, peer])| format!("m{}=http://127.0.0.1:{peer}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut members: Vec<Server> = ports
        .iter()
        .enumerate()
        .map(|(i, ports)| {
            Server::spawn_member(kind, &format!("m{}", i + 1), *ports, &initial, "ids", &[])
        })
        .collect();
    for member in &mut members {
        member.wait_ready().await;
    }
    let out = etcdctl(&members[0].endpoint(), &["member", "list", "-w", "json"]).await;
    assert!(out.status.success(), "{}", common::describe_output(&out));
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut ids: Vec<(String, u64)> = json["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            let name = m["name"].as_str().unwrap_or_default().to_owned();
            (name, m["ID"].as_u64().expect("ID"))
        })
        .collect();
    ids.sort();
    (
        json["header"]["cluster_id"].as_u64().expect("cluster_id"),
        ids,
    )
}

/// The same flags give the same member and cluster IDs as etcd's (etcd derives them from the
/// peer URLs and the token, and the cluster's from its members'), so tools and runbooks that
/// name members by ID read the same IDs. Both clusters run on the same ports, one after the
/// other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_and_cluster_ids_are_etcds() {
    let ports: Vec<[u16; 2]> = (0..3).map(|_| free_ports::<2>()).collect();
    let want = ids_on(Kind::Etcd, &ports).await;
    let got = ids_on(Kind::Leasehold, &ports).await;
    assert_eq!(want.1.len(), 3, "{want:?}");
    assert_eq!(got, want, "leasehold vs etcd");
}

/// Removes `m3` from three members and says how it went: whether the removed process exited by
/// itself (and with what status), and whether the other two still take writes.
async fn removal(kind: Kind) -> Vec<String> {
    let mut cluster = Cluster::start(kind, 3).await;
    let via = cluster.members[0].endpoint();
    let id = id_of(&via, "m3").await;
    // etcd refuses a removal until every member has been up for its health interval (5 s),
    // with `unhealthy cluster` (`--strict-reconfig-check`); so does leasehold. Bounded.
    let started = Instant::now();
    loop {
        let out = etcdctl(&via, &["member", "remove", &id]).await;
        if out.status.success() {
            break;
        }
        let unhealthy = String::from_utf8_lossy(&out.stderr).contains("unhealthy cluster");
        assert!(
            unhealthy && started.elapsed() < Duration::from_secs(15),
            "{}",
            common::describe_output(&out)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let removed = &mut cluster.members[2];
    let exited = removed.wait_exit(Duration::from_secs(15)).await;
    let mut log = vec![format!(
        "removed member exited: {:?}",
        exited.map(|status| status.code())
    )];
    if exited.is_none() {
        eprintln!(
            "{kind:?}: the removed member is still running:\n{}",
            removed.log_tail()
        );
    }
    // The removed member may have led: the other two may elect first (bounded).
    let started = Instant::now();
    let mut put = false;
    while !put && started.elapsed() < Duration::from_secs(10) {
        put = etcdctl(&via, &["put", "after", "removal"])
            .await
            .status
            .success();
    }
    log.push(format!("put after (within 10 s): {put}"));
    let names: Vec<String> = listed(&via).await.into_iter().map(|m| m.0).collect();
    log.push(format!("members: {names:?}"));
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_member_stops_by_itself_as_etcds_does() {
    let want = removal(Kind::Etcd).await;
    eprintln!("etcd: {want:#?}");
    assert!(
        want[0].contains("Some("),
        "etcd's removed member should exit: {want:?}"
    );
    let got = removal(Kind::Leasehold).await;
    assert_eq!(got, want, "leasehold vs etcd");
}

/// Three members with data, all stopped; the first started again with `--force-new-cluster`:
/// what the member list, the data and a new write show, and again after a restart with the
/// flag still on.
async fn forced(kind: Kind) -> Vec<String> {
    let mut cluster = Cluster::start(kind, 3).await;
    let via = cluster.members[0].endpoint();
    for i in 0..5 {
        let out = etcdctl(&via, &["put", &format!("k{i}"), &format!("v{i}")]).await;
        assert!(out.status.success(), "{}", common::describe_output(&out));
    }
    for member in &mut cluster.members {
        member.terminate().await;
    }
    let survivor = &mut cluster.members[0];
    survivor.add_args(&["--force-new-cluster"]);
    let mut log = Vec::new();
    for round in ["forced", "restarted with the flag on"] {
        survivor.restart().await;
        let names: Vec<String> = listed(&via).await.into_iter().map(|m| m.0).collect();
        log.push(format!("{round}: members {names:?}"));
        let out = etcdctl(&via, &["get", "k", "--prefix", "--print-value-only"]).await;
        log.push(format!(
            "{round}: values {:?}",
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .collect::<Vec<_>>()
        ));
        let out = etcdctl(&via, &["put", &format!("after {round}"), "x"]).await;
        log.push(format!("{round}: put {}", out.status.success()));
    }
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_new_cluster_brings_one_member_back_alone_with_its_data_as_etcd_does() {
    let want = forced(Kind::Etcd).await;
    eprintln!("etcd: {want:#?}");
    let got = forced(Kind::Leasehold).await;
    assert_eq!(got, want, "leasehold vs etcd");
    assert_eq!(got[0], "forced: members [\"m1\"]", "{got:?}");
}
