//! A member never takes another cluster's log, against etcd: cluster B's configuration names a
//! member of cluster A by its peer URL (a port reused, a copy-pasted `--initial-cluster`). B's
//! leader keeps sending to that URL; A's member refuses every request (the sender's cluster ID
//! is not its own: etcd's `request cluster ID mismatch`) and keeps exactly A's data, and both
//! clusters serve on.

use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use leasehold_testkit as common;

use common::{Cluster, Kind, Server, free_ports};

/// Every key and value `client` reads from its member alone (serializable).
async fn local_keys(client: &mut Client) -> Vec<String> {
    let got = client
        .get(
            "",
            Some(GetOptions::new().with_from_key().with_serializable()),
        )
        .await
        .expect("get");
    got.kvs()
        .iter()
        .map(|kv| {
            format!(
                "{}={}",
                kv.key_str().expect("utf-8"),
                kv.value_str().expect("utf-8")
            )
        })
        .collect()
}

async fn stray_cluster(kind: Kind) -> Vec<String> {
    let a = Cluster::start(kind, 3).await;
    let mut a_client = a.members[0].client().await;
    for i in 0..5 {
        a_client
            .put(format!("a/{i}"), "from A", None)
            .await
            .expect("put on A");
    }
    // B: two members of its own and, as its third, A's third member's peer URL.
    let ports = [free_ports::<2>(), free_ports::<2>()];
    let b_cluster = format!(
        "b0=http://127.0.0.1:{},b1=http://127.0.0.1:{},b2={}",
        ports[0][1],
        ports[1][1],
        a.members[2].peer_url()
    );
    let token = format!("cluster-b-{}", ports[0][1]);
    let mut b: Vec<Server> = (0..2)
        .map(|i| Server::spawn_member(kind, &format!("b{i}"), ports[i], &b_cluster, &token, &[]))
        .collect();
    for member in &mut b {
        member.wait_ready().await;
    }
    let mut b_client = b[0].client().await;
    b_client.put("b/1", "from B", None).await.expect("put on B");
    // B's leader has tried A's member: A's member said so in its log (bounded wait).
    let started = Instant::now();
    while !a.members[2].log().contains("cluster ID mismatch") {
        if started.elapsed() > Duration::from_secs(20) {
            a.members[2].fail("no refusal of cluster B's requests logged in 20 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut out = Vec::new();
    // A's third member holds A's data and nothing of B's; A and B both take writes.
    a_client
        .put("a/after", "from A", None)
        .await
        .expect("A serves on");
    b_client
        .put("b/2", "from B", None)
        .await
        .expect("B serves on");
    let mut third = a.members[2].client().await;
    let started = Instant::now();
    let want = local_keys(&mut a_client).await;
    loop {
        let got = local_keys(&mut third).await;
        if got == want {
            out.push(format!("A's third member: {got:?}"));
            break;
        }
        assert!(
            !got.iter().any(|k| k.starts_with("b/")),
            "{kind:?}: A's member took B's data: {got:?}"
        );
        if started.elapsed() > Duration::from_secs(10) {
            panic!("{kind:?}: A's third member holds {got:?}, A holds {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    out.push(format!("B: {:?}", local_keys(&mut b_client).await));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_refuses_another_clusters_requests_same_as_etcd() {
    let etcd = stray_cluster(Kind::Etcd).await;
    let leasehold = stray_cluster(Kind::Leasehold).await;
    assert_eq!(leasehold, etcd);
}
