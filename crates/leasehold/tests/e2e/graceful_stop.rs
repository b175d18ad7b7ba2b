//! A member stops cleanly (as on SIGTERM) while clients wait on it: a Lock call queued behind
//! another holder waits for a delete that will never come, and must not hold up the drain of
//! client requests. The waiter is answered as etcd answers a request to a stopping member
//! (Unavailable, "etcdserver: server stopped"), so its client retries elsewhere. Members run
//! in-process: nothing here needs a real process.

use std::time::Duration;

use etcd_client::{Client, LockOptions};
use leasehold_testkit::{InProcessCluster, REQUEST_TIMEOUT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_lock_waiter_does_not_hold_up_a_stop() {
    let mut cluster = InProcessCluster::start(1).await;
    let mut holder = cluster.client().await;
    let lease = holder.lease_grant(60, None).await.expect("grant").id();
    holder
        .lock("l", Some(LockOptions::new().with_lease(lease)))
        .await
        .expect("the free lock");
    let mut waiter = cluster.client().await;
    let queued = tokio::spawn(async move {
        let lease = waiter.lease_grant(60, None).await.expect("grant").id();
        waiter
            .lock("l", Some(LockOptions::new().with_lease(lease)))
            .await
    });
    // The waiter's key is queued once there are two keys under the lock's prefix.
    wait_for_keys(&mut holder, "l/", 2).await;
    assert!(!queued.is_finished(), "the second locker must wait");
    // Bounded by the kit's stop timeout: it panics if the member is still draining then.
    cluster.members[0].stop().await;
    let answer = tokio::time::timeout(REQUEST_TIMEOUT, queued)
        .await
        .expect("the waiter is answered once the member stops")
        .expect("the waiter task");
    let err = answer.expect_err("a stopped member grants no lock");
    let etcd_client::Error::GRpcStatus(status) = err else {
        panic!("not a gRPC status: {err:?}");
    };
    assert_eq!(
        (status.code(), status.message()),
        (tonic::Code::Unavailable, "etcdserver: server stopped")
    );
    cluster.shutdown().await;
}

async fn wait_for_keys(client: &mut Client, prefix: &str, n: i64) {
    let give_up = tokio::time::Instant::now() + REQUEST_TIMEOUT;
    loop {
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        let found = client.get(prefix, Some(options)).await.expect("count");
        if found.count() >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{n} keys under {prefix} never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Long-lived streams (a watch, a keepalive stream) end when the member stops, with etcd's
/// Unavailable "etcdserver: server stopped", rather than holding up the drain until it is cut
/// off (which would break them without a status).
/// Reads a response stream (etcd-client's watch or keepalive stream) to its end, bounded:
/// `Ok` if it ended without a status, the error it ended with otherwise.
macro_rules! how_it_ends {
    ($stream:expr, $what:literal) => {
        tokio::time::timeout(REQUEST_TIMEOUT, async {
            loop {
                match $stream.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        })
        .await
        .expect($what)
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_watch_and_keepalive_streams_end_with_server_stopped() {
    let mut cluster = InProcessCluster::start(1).await;
    let mut client = cluster.client().await;
    let mut watch = client.watch("w", None).await.expect("watch");
    let lease = client.lease_grant(60, None).await.expect("grant").id();
    let (mut keeper, mut renewals) = client.lease_keep_alive(lease).await.expect("keepalive");
    keeper.keep_alive().await.expect("renew");
    renewals
        .message()
        .await
        .expect("a renewal answer")
        .expect("a message");
    cluster.members[0].stop().await;
    // Whatever the streams had queued (the watch's "created"), then how they ended.
    let watch_end = how_it_ends!(watch, "the watch stream ends once the member stops");
    let keepalive_end = how_it_ends!(renewals, "the keepalive stream ends once the member stops");
    for (name, end) in [("watch", watch_end), ("keepalive", keepalive_end)] {
        let Err(etcd_client::Error::GRpcStatus(status)) = end else {
            panic!("{name}: not ended with a status: {end:?}");
        };
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::Unavailable, "etcdserver: server stopped"),
            "{name}"
        );
    }
    cluster.shutdown().await;
}
