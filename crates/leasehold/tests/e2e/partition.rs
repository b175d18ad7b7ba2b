//! Network partitions, with network namespaces the test creates (iproute2, as root): each of
//! three leasehold members runs in its own namespace with its own address on a bridge in the
//! root namespace, where the test's clients live. Partitioning a member takes its link down, so
//! it can reach nobody and nobody can reach it; healing brings it back.
//!
//! What must hold while the leader is cut off with a lease expiring on its side:
//! - the old leader revokes nothing (its expiry proposals can never commit);
//! - no lease expires early (a lease kept alive through the majority survives; an abandoned one
//!   expires only after its TTL);
//! - the majority elects a leader and keeps serving;
//! - after healing, every member converges to the same state.
//!
//! Every namespace, link and process is removed on drop; every wait is bounded.

use leasehold_testkit as common;
use leasehold_testkit::netns;

use std::time::{Duration, Instant};

use etcd_client::{GetOptions, PutOptions};
use netns::{MEMBERS, NetCluster, POLL, READY_MAX, client};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_revokes_nothing_and_the_cluster_converges() {
    const TTL: i64 = 4;
    let mut net = NetCluster::create().expect("network namespaces (needs root and iproute2)");
    for i in 0..MEMBERS {
        net.spawn(i);
    }
    let leader = net.agreed_leader().await;
    let majority: Vec<usize> = (0..MEMBERS).filter(|i| *i != leader).collect();
    let mut c = client(&net.endpoint(majority[0])).await.expect("client");
    let kept = c.lease_grant(TTL, None).await.expect("grant").id();
    c.put("kept", "v", Some(PutOptions::new().with_lease(kept)))
        .await
        .expect("put");
    let abandoned = c.lease_grant(TTL, None).await.expect("grant").id();
    let abandoned_granted = Instant::now();
    c.put(
        "abandoned",
        "v",
        Some(PutOptions::new().with_lease(abandoned)),
    )
    .await
    .expect("put");

    // Cut the leader off. It still believes it leads for a while and its lease clock runs on:
    // `kept` passes its deadline on that side, but nothing it proposes can commit.
    net.set_link(leader, false);
    let partitioned_at = Instant::now();
    // The client keeps `kept` alive as clientv3 does, in a task of its own: every 500 ms, and on
    // a failed stream (renewals fail with "no leader" during the election) a new stream.
    let renewals = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let keep_alive = {
        let mut c = c.clone();
        let renewals = renewals.clone();
        tokio::spawn(async move {
            let mut stream = None;
            loop {
                if stream.is_none() {
                    stream = c.lease_keep_alive(kept).await.ok();
                }
                if let Some((keeper, answers)) = &mut stream {
                    let renewed = keeper.keep_alive().await.is_ok()
                        && matches!(answers.message().await, Ok(Some(a)) if a.ttl() > 0);
                    if renewed {
                        renewals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    } else {
                        stream = None;
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let mut abandoned_gone_after = None;
    let mut majority_writes = 0;
    while partitioned_at.elapsed() < Duration::from_secs(TTL as u64 * 3) {
        if c.put("majority", majority_writes.to_string(), None)
            .await
            .is_ok()
        {
            majority_writes += 1;
        }
        if abandoned_gone_after.is_none()
            && let Ok(r) = c.get("abandoned", None).await
            && r.count() == 0
        {
            abandoned_gone_after = Some(abandoned_granted.elapsed());
        }
        let r = c.get("kept", None).await;
        if let Ok(r) = r {
            assert_eq!(
                r.count(),
                1,
                "a lease kept alive through the majority expired"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(majority_writes > 0, "the majority did not serve writes");
    keep_alive.abort();
    assert!(
        renewals.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no renewal went through the majority"
    );
    let gone = abandoned_gone_after.expect("the abandoned lease never expired on the majority");
    assert!(
        gone >= Duration::from_secs(TTL as u64),
        "the abandoned lease expired early: {gone:?}"
    );

    // Heal; the old leader rejoins as a follower and converges.
    net.set_link(leader, true);
    let mut old = None;
    let started = Instant::now();
    while old.is_none() {
        old = client(&net.endpoint(leader)).await;
        assert!(
            started.elapsed() < READY_MAX,
            "the old leader is unreachable after healing"
        );
    }
    let mut old = old.expect("client");
    let started = Instant::now();
    let all = || Some(GetOptions::new().with_all_keys().with_serializable());
    let reference = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .expect("get");
    loop {
        if let Ok(r) = old.get("", all()).await
            && common::kvs_json(r.kvs()) == common::kvs_json(reference.kvs())
        {
            break;
        }
        assert!(
            started.elapsed() < READY_MAX,
            "the old leader did not converge to the majority's state"
        );
        tokio::time::sleep(POLL).await;
    }
    let r = old
        .get("kept", None)
        .await
        .expect("linearizable get on the old leader");
    assert_eq!(r.count(), 1, "the old leader's side revoked `kept`");
    let log = net.log(leader);
    assert!(!log.contains("panicked"), "the old leader panicked:\n{log}");
    // It did try: its expiry proposal for `kept` waited while it was cut off and failed when it
    // learnt of the new leader.
    assert!(
        log.contains("lease expiry:"),
        "the old leader never proposed an expiry, so the test proved nothing:\n{log}"
    );
}
