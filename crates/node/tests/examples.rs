//! The runnable examples, run: `examples/fenced_counter.rs` is included as a module, so these
//! tests exercise exactly the code docs/locks.md points users to.

mod common;

#[allow(dead_code)]
#[path = "../examples/fenced_counter.rs"]
mod fenced_counter;

use std::time::Duration;

use common::{Etcd, Leasehold, Server};
use fenced_counter::{Increment, fenced_write, increment, lock, read_counter};

const CLIENTS: u64 = 3;
const INCREMENTS_PER_CLIENT: u64 = 5;
const RUN_MAX: Duration = Duration::from_secs(60);

async fn concurrent_increments(server: &Server) {
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let lease = client.lease_grant(30, None).await.expect("grant").id();
            let mut outcomes = Vec::new();
            for _ in 0..INCREMENTS_PER_CLIENT {
                outcomes.push(increment(&mut client, lease).await.expect("increment"));
            }
            outcomes
        }));
    }
    let results = tokio::time::timeout(RUN_MAX, futures::future::join_all(tasks))
        .await
        .unwrap_or_else(|_| server.fail("increments did not finish"));
    let mut written: Vec<u64> = Vec::new();
    for outcomes in results {
        for outcome in outcomes.expect("client task") {
            match outcome {
                Increment::Written(v) => written.push(v),
                Increment::Fenced => server.fail("a holder that kept its lease was fenced"),
            }
        }
    }
    written.sort_unstable();
    let expected: Vec<u64> = (1..=CLIENTS * INCREMENTS_PER_CLIENT).collect();
    assert_eq!(
        written,
        expected,
        "{}: increments were lost or repeated",
        server.label()
    );
    let mut client = server.client().await;
    assert_eq!(
        read_counter(&mut client).await.expect("read"),
        CLIENTS * INCREMENTS_PER_CLIENT
    );
}

/// Concurrent holders that keep their leases: every fenced increment commits, none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_counter_counts_every_increment() {
    let (etcd, leasehold) = tokio::join!(Etcd::start(), Leasehold::start());
    concurrent_increments(&etcd).await;
    concurrent_increments(&leasehold).await;
}

/// A holder that lost its lock between reading and writing (its lease revoked, standing in for
/// an expiry during a pause) is fenced: its stale write does not commit, so the next holder's
/// increment survives. An unfenced write at the same point would have overwritten it.
async fn stale_holder_is_fenced(server: &Server) {
    let mut a = server.client().await;
    let mut b = server.client().await;
    let lease_a = a.lease_grant(30, None).await.expect("grant a").id();
    let lease_b = b.lease_grant(30, None).await.expect("grant b").id();
    let (key_a, token_a) = lock(&mut a, lease_a).await.expect("a locks");
    let seen_by_a = read_counter(&mut a).await.expect("a reads");
    // a "pauses"; its lease runs out.
    a.lease_revoke(lease_a).await.expect("revoke a");
    assert_eq!(
        increment(&mut b, lease_b).await.expect("b increments"),
        Increment::Written(seen_by_a + 1)
    );
    // a wakes up and writes what it computed before the pause.
    assert_eq!(
        fenced_write(&mut a, &key_a, token_a, seen_by_a + 1)
            .await
            .expect("a writes"),
        Increment::Fenced,
        "{}: the stale holder's write committed",
        server.label()
    );
    assert_eq!(read_counter(&mut b).await.expect("read"), seen_by_a + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_counter_refuses_a_stale_holder() {
    let (etcd, leasehold) = tokio::join!(Etcd::start(), Leasehold::start());
    stale_holder_is_fenced(&etcd).await;
    stale_holder_is_fenced(&leasehold).await;
}
