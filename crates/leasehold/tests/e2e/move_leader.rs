//! `etcdctl move-leader` (Maintenance.MoveLeader) on three members, against etcd: leadership
//! moves to the member named, writes go on through the new leader, and the refusals (a
//! member that is not a voter of the cluster, a request to a member that does not lead) are
//! etcd's.

use etcd_client::Client;
use leasehold_testkit as common;

use common::{Cluster, Kind, describe_output, etcdctl};

/// What etcdctl and the RPC said, with member IDs named by their part.
async fn moves(kind: Kind) -> Vec<String> {
    let cluster = Cluster::start(kind, 3).await;
    let leader = cluster.leader().await;
    let mut ids = Vec::new();
    for member in &cluster.members {
        let mut client = member.client().await;
        let status = client.status().await.expect("status");
        ids.push(status.header().expect("header").member_id());
    }
    // Hand leadership to the next member, then back to the first leader.
    let target = (leader + 1) % 3;
    let name = |text: &str| {
        let mut text = text.to_owned();
        for (i, id) in ids.iter().enumerate() {
            let role = match i {
                i if i == leader => "the leader",
                i if i == target => "the next member",
                _ => "the third member",
            };
            text = text.replace(&format!("{id:x}"), role);
        }
        text
    };
    let all = cluster.endpoints().join(",");
    let mut out = Vec::new();
    // Writes all along, through the third member (bounded in count; errors while the leader
    // changes are allowed, a write acknowledged and then lost is not).
    let third = (0..3)
        .find(|i| *i != leader && *i != target)
        .expect("three");
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let mut writer = Client::connect([cluster.members[third].endpoint()], None)
        .await
        .expect("connect");
    let (count, mut counted) = tokio::sync::watch::channel(0usize);
    let writes = tokio::spawn(async move {
        let mut acked = Vec::new();
        for i in 0..5_000 {
            if *stopped.borrow_and_update() {
                break;
            }
            if writer.put(format!("load/{i:05}"), "v", None).await.is_ok() {
                acked.push(i);
                count.send_replace(acked.len());
            }
        }
        acked
    });
    // The moves start with writes under way.
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        counted.wait_for(|n| *n >= 5),
    )
    .await
    .expect("writes before the moves")
    .expect("the writer runs");
    for (to, from) in [(target, leader), (leader, target)] {
        let started = std::time::Instant::now();
        let run = etcdctl(&all, &["move-leader", &format!("{:x}", ids[to])]).await;
        eprintln!("{kind:?}: move-leader took {:?}", started.elapsed());
        assert!(run.status.success(), "{kind:?}: {}", describe_output(&run));
        out.push(name(&String::from_utf8_lossy(&run.stdout)));
        assert_eq!(
            cluster.leader().await,
            to,
            "{kind:?}: leader after the move"
        );
        // Writes go on, through any member.
        let mut client = Client::connect([cluster.members[from].endpoint()], None)
            .await
            .expect("connect");
        client.put("after-move", "v", None).await.expect("put");
    }
    // The writer's own writes, through the third member, go on after the moves too.
    let after_moves = *counted.borrow();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        counted.wait_for(|n| *n >= after_moves + 5),
    )
    .await
    .unwrap_or_else(|_| panic!("{kind:?}: the writer stalled after the moves at {after_moves}"))
    .expect("the writer runs");
    stop.send_replace(true);
    let acked = writes.await.expect("the writer");
    let mut client = cluster.members[leader].client().await;
    let stored = client
        .get(
            "load/",
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await
        .expect("get");
    let stored: std::collections::BTreeSet<String> = stored
        .kvs()
        .iter()
        .map(|kv| kv.key_str().expect("utf-8").to_owned())
        .collect();
    let lost: Vec<&i32> = acked
        .iter()
        .filter(|i| !stored.contains(&format!("load/{i:05}")))
        .collect();
    assert!(lost.is_empty(), "{kind:?}: acknowledged and lost: {lost:?}");
    // To itself: nothing to do.
    let run = etcdctl(&all, &["move-leader", &format!("{:x}", ids[leader])]).await;
    out.push(format!(
        "to itself: exit {:?} {}",
        run.status.code(),
        name(&String::from_utf8_lossy(&run.stdout))
    ));
    // No such member.
    let run = etcdctl(&all, &["move-leader", "1234"]).await;
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    let error = stderr
        .lines()
        .find(|l| l.starts_with("Error: "))
        .unwrap_or("");
    out.push(format!("unknown: exit {:?} {error}", run.status.code()));
    // Asked of followers only: etcdctl finds no leader among them.
    let followers: Vec<String> = (0..3)
        .filter(|i| *i != leader)
        .map(|i| cluster.members[i].endpoint())
        .collect();
    let run = etcdctl(
        &followers.join(","),
        &["move-leader", &format!("{:x}", ids[leader])],
    )
    .await;
    let mut said = String::from_utf8_lossy(&run.stderr).trim().to_owned();
    for (i, endpoint) in cluster.endpoints().iter().enumerate() {
        said = said.replace(endpoint.as_str(), &format!("endpoint-{i}"));
    }
    out.push(format!(
        "followers only: exit {:?} {}",
        run.status.code(),
        said.contains("no leader endpoint given")
    ));
    // The RPC itself on a follower: etcd's refusal.
    let mut follower = Client::connect([followers[0].as_str()], None)
        .await
        .expect("connect");
    match follower.move_leader(ids[leader]).await {
        Ok(_) => out.push("RPC on a follower: accepted".into()),
        Err(etcd_client::Error::GRpcStatus(s)) => {
            out.push(format!("RPC on a follower: {:?} {}", s.code(), s.message()))
        }
        Err(e) => out.push(format!("RPC on a follower: {e}")),
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_same_as_etcd() {
    let etcd = moves(Kind::Etcd).await;
    let leasehold = moves(Kind::Leasehold).await;
    assert_eq!(leasehold, etcd);
    assert_eq!(
        etcd[0], "Leadership transferred from the leader to the next member\n",
        "{etcd:?}"
    );
}
