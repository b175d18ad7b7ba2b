//! The v3lock and v3election services, differentially: each scenario runs against a fresh real
//! etcd 3.4 and a fresh leasehold through etcd-client's lock and election clients, and every
//! response (header revision, keys, leader keys, key-values, errors as gRPC code + message) must
//! be the same. Behaviour numbers refer to §6 of the lease specification
//! (`/work/shared/reference/lease-spec.md`).
//!
//! Blocking calls run as tasks; "still blocked" is established by the caller's key being queued
//! (polled, bounded) and the task not having finished, never by sleeping. Every wait is bounded.

use leasehold_testkit as common;
use leasehold_testkit::lock_with;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{Recorder, differential, error_json, header_json, kv_json};
use etcd_client::{
    Client, GetOptions, LeaderKey, LeaseGrantOptions, ObserveStream, PutOptions, ResignOptions,
    SortOrder, SortTarget, WatchOptions,
};
use etcd_client::{Error as EtcdError, ProclaimOptions};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// How long a blocked call may take to return once what it waits for is gone.
const UNBLOCK_MAX: Duration = Duration::from_secs(10);
/// How long to poll for a waiter's key to be queued.
const QUEUED_WAIT_MAX: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_millis(10);
const OBSERVE_MESSAGE_MAX: Duration = Duration::from_secs(5);

async fn grant(client: &mut Client, r: &mut Recorder, id: i64, ttl: i64) {
    r.record(
        format!("grant {id}"),
        client
            .lease_grant(ttl, Some(LeaseGrantOptions::new().with_id(id)))
            .await,
    );
}

/// Polls until `key` exists (a waiter has queued), bounded.
async fn until_queued(client: &mut Client, key: &str) -> bool {
    let start = Instant::now();
    while start.elapsed() < QUEUED_WAIT_MAX {
        if let Ok(r) = client.get(key, None).await
            && r.count() == 1
        {
            return true;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    false
}

/// The result of a blocked call once it returns, bounded by [`UNBLOCK_MAX`].
async fn join_within<T>(task: JoinHandle<T>) -> Option<T> {
    tokio::time::timeout(UNBLOCK_MAX, task)
        .await
        .ok()
        .map(|r| r.expect("task panicked"))
}

fn spawn<T: Send + 'static>(f: impl Future<Output = T> + Send + 'static) -> JoinHandle<T> {
    tokio::spawn(f)
}

async fn next_observed(stream: &mut ObserveStream) -> Value {
    match tokio::time::timeout(OBSERVE_MESSAGE_MAX, stream.message()).await {
        Ok(Ok(Some(r))) => json!({
            "header": header_json(r.header()),
            "kv": r.kv().map_or(Value::Null, kv_json),
        }),
        Ok(Ok(None)) => json!("observe stream ended"),
        Ok(Err(e)) => error_json(&e),
        Err(_) => json!(format!("no message within {OBSERVE_MESSAGE_MAX:?}")),
    }
}

fn record_result<T: common::Record>(
    r: &mut Recorder,
    label: &str,
    result: Option<Result<T, EtcdError>>,
) -> Option<T> {
    match result {
        Some(result) => r.record(label, result),
        None => {
            r.note(label, json!(format!("still blocked after {UNBLOCK_MAX:?}")));
            None
        }
    }
}

/// 57, 58, 59, 61: the key, value, lease and header of a free lock; re-locking with the same
/// lease; an unknown lease; unlocking a missing key; a lock without a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_unlock_same_as_etcd() {
    differential("lock_and_unlock_same_as_etcd", |c, r| {
        Box::pin(async move {
            grant(c, r, 1001, 30).await;
            r.record("put other", c.put("other", "x", None).await);
            let locked = r.record("lock mylock 1001", c.lock("mylock", lock_with(1001)).await);
            r.record("get mylock/3e9", c.get("mylock/3e9", None).await);
            r.record(
                "lock mylock 1001 again",
                c.lock("mylock", lock_with(1001)).await,
            );
            r.record(
                "lock mylock unknown lease",
                c.lock("mylock", lock_with(4242)).await,
            );
            r.record(
                "lock other name 1001",
                c.lock("other", lock_with(1001)).await,
            );
            r.record("unlock missing key", c.unlock("nope/1").await);
            if let Some(locked) = locked {
                r.record("unlock mylock/3e9", c.unlock(locked.key()).await);
            }
            r.record(
                "get mylock/3e9 after unlock",
                c.get("mylock/3e9", None).await,
            );
            // A lock without a lease: the server grants one (60 s) nobody renews.
            match c.lock("nolease", None).await {
                Ok(locked) => {
                    let key = String::from_utf8_lossy(locked.key()).into_owned();
                    let hex = key.strip_prefix("nolease/").unwrap_or("");
                    let id = i64::from_str_radix(hex, 16).unwrap_or(0);
                    let ttl = c.lease_time_to_live(id, None).await;
                    r.note(
                        "lock without lease",
                        json!({
                            "key under nolease/": !hex.is_empty(),
                            "lease granted ttl": ttl.map(|t| t.granted_ttl()).ok(),
                        }),
                    );
                }
                Err(e) => r.note("lock without lease", error_json(&e)),
            }
        })
    })
    .await;
}

/// 60: a waiter acquires once the holder's lease is revoked; the queue follows create revision
/// (the third waiter gets the lock only after the second unlocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_acquire_in_create_revision_order_same_as_etcd() {
    differential(
        "waiters_acquire_in_create_revision_order_same_as_etcd",
        |c, r| {
            Box::pin(async move {
                for id in [0xa, 0xb, 0xc] {
                    grant(c, r, id, 30).await;
                }
                r.record("lock L2 by a", c.lock("L2", lock_with(0xa)).await);
                let mut cb = c.clone();
                let b = spawn(async move { cb.lock("L2", lock_with(0xb)).await });
                r.fact("b queued", until_queued(c, "L2/b").await);
                let mut cc = c.clone();
                let cw = spawn(async move { cc.lock("L2", lock_with(0xc)).await });
                r.fact("c queued", until_queued(c, "L2/c").await);
                r.fact("b still blocked", !b.is_finished());
                r.record("revoke a", c.lease_revoke(0xa).await);
                let b = record_result(r, "lock L2 by b returns", join_within(b).await);
                r.fact("c still blocked after b acquired", !cw.is_finished());
                if let Some(b) = b {
                    r.record("unlock b", c.unlock(b.key()).await);
                }
                record_result(r, "lock L2 by c returns", join_within(cw).await);
                r.record(
                    "queue",
                    c.get("L2/", Some(GetOptions::new().with_prefix())).await,
                );
            })
        },
    )
    .await;
}

/// A waiter whose own lease is revoked while it waits must not be told it holds the lock
/// (etcd#11456, found by Jepsen). This is where leasehold deliberately differs from etcd 3.4:
/// etcd's lock service still answers with the key once the holder unlocks, although the key is
/// gone; leasehold refuses with etcd's mutex error ("mutex: session is expired", code Unknown)
/// as soon as the waiter's key is deleted. The test runs the scenario against both and asserts
/// each side's answer, so a change in either shows up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_whose_lease_is_revoked_is_refused_unlike_etcd() {
    if common::against_etcd() {
        return; // The point of this test is the difference.
    }
    let (etcd, leasehold) = tokio::join!(common::Etcd::start(), common::Leasehold::start());
    for server in [&etcd, &leasehold] {
        let mut c = server.client().await;
        for id in [0xa, 0xb] {
            c.lease_grant(30, Some(LeaseGrantOptions::new().with_id(id)))
                .await
                .expect("grant");
        }
        let held = c.lock("L3", lock_with(0xa)).await.expect("lock by a");
        let mut cb = c.clone();
        let b = spawn(async move { cb.lock("L3", lock_with(0xb)).await });
        assert!(until_queued(&mut c, "L3/b").await, "b never queued");
        c.lease_revoke(0xb).await.expect("revoke b");
        c.unlock(held.key()).await.expect("unlock a");
        let answer = join_within(b).await;
        let gone = c.get("L3/b", None).await.expect("get").count() == 0;
        assert!(gone, "{}: the revoke left b's key", server.label());
        match (server.kind(), answer) {
            (common::Kind::Etcd, Some(Ok(locked))) => assert_eq!(locked.key(), b"L3/b"),
            (common::Kind::Leasehold, Some(Err(EtcdError::GRpcStatus(status)))) => {
                assert_eq!(status.code(), tonic::Code::Unknown);
                assert_eq!(status.message(), "mutex: session is expired");
            }
            (kind, other) => server.fail(&format!("{kind:?} answered the waiter with {other:?}")),
        }
    }
}

fn leader_of(name: &str, key: &str, rev: i64, lease: i64) -> LeaderKey {
    LeaderKey::new()
        .with_name(name)
        .with_key(key)
        .with_rev(rev)
        .with_lease(lease)
}

/// 62–65: no leader; campaign; observe; a blocked second campaigner; proclaim (right and wrong
/// rev, missing leader); leader; resign and hand-over; resign when no longer leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_same_as_etcd() {
    differential("election_same_as_etcd", |c, r| {
        Box::pin(async move {
            r.record("leader with no campaigners", c.leader("el").await);
            grant(c, r, 3001, 30).await;
            grant(c, r, 3002, 30).await;
            let a = r.record("campaign a", c.campaign("el", "v1", 3001).await);
            let a_leader = a.and_then(|a| a.leader().cloned());
            let mut observe = c.observe("el").await.expect("observe");
            r.note("observe: current leader", next_observed(&mut observe).await);
            let mut cb = c.clone();
            let b = spawn(async move { cb.campaign("el", "v2", 3002).await });
            r.fact("b queued", until_queued(c, "el/bba").await);
            r.fact("b still blocked", !b.is_finished());
            if let Some(leader) = &a_leader {
                r.record(
                    "proclaim v1b",
                    c.proclaim(
                        "v1b",
                        Some(ProclaimOptions::new().with_leader(leader.clone())),
                    )
                    .await,
                );
                r.note("observe: proclaimed", next_observed(&mut observe).await);
                let wrong = leader_of("el", "el/bb9", leader.rev() + 1, 3001);
                r.record(
                    "proclaim with wrong rev",
                    c.proclaim("x", Some(ProclaimOptions::new().with_leader(wrong)))
                        .await,
                );
            }
            r.record("proclaim without leader", c.proclaim("x", None).await);
            r.record("leader while a leads", c.leader("el").await);
            r.record("resign without leader", c.resign(None).await);
            if let Some(leader) = &a_leader {
                r.record(
                    "resign a",
                    c.resign(Some(ResignOptions::new().with_leader(leader.clone())))
                        .await,
                );
            }
            record_result(r, "campaign b returns", join_within(b).await);
            r.note("observe: b leads", next_observed(&mut observe).await);
            r.record("leader after hand-over", c.leader("el").await);
            if let Some(leader) = &a_leader {
                r.record(
                    "resign a again",
                    c.resign(Some(ResignOptions::new().with_leader(leader.clone())))
                        .await,
                );
            }
        })
    })
    .await;
}

/// Campaigning again with the same lease and another value proclaims the new value; an unknown
/// lease fails; observing a name nobody campaigns for yet reports the first campaigner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_edges_same_as_etcd() {
    differential("election_edges_same_as_etcd", |c, r| {
        Box::pin(async move {
            grant(c, r, 0x77, 30).await;
            r.record("campaign unknown lease", c.campaign("e2", "v", 0x99).await);
            // etcd sends the stream's headers only with its first message, so the call returns
            // only once somebody campaigns.
            let mut co = c.clone();
            let observe = spawn(async move { co.observe("e2").await });
            r.record("campaign", c.campaign("e2", "first", 0x77).await);
            let mut observe = join_within(observe)
                .await
                .expect("observe call returned")
                .expect("observe");
            r.note(
                "observe: first campaigner",
                next_observed(&mut observe).await,
            );
            r.record(
                "campaign again, new value",
                c.campaign("e2", "second", 0x77).await,
            );
            r.note("observe: new value", next_observed(&mut observe).await);
            r.record("leader", c.leader("e2").await);
            r.record("revoke", c.lease_revoke(0x77).await);
            r.record("leader after revoke", c.leader("e2").await);
        })
    })
    .await;
}

/// 66: the query a mutex waiter makes (the newest older key, by create revision) and a watch
/// from that read's header revision see a delete committed between the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_query_then_watch_misses_no_delete_same_as_etcd() {
    differential(
        "waiter_query_then_watch_misses_no_delete_same_as_etcd",
        |c, r| {
            Box::pin(async move {
                grant(c, r, 0x1, 30).await;
                grant(c, r, 0x2, 30).await;
                let lease = |id| Some(PutOptions::new().with_lease(id));
                r.record("put m/1", c.put("m/1", "", lease(0x1)).await);
                let mine = r.record("put m/2", c.put("m/2", "", lease(0x2)).await);
                let my_rev = mine
                    .and_then(|m| m.header().map(|h| h.revision()))
                    .unwrap_or(0);
                let older = r.record(
                    "newest older key",
                    c.get(
                        "m/",
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_sort(SortTarget::Create, SortOrder::Descend)
                                .with_limit(1)
                                .with_max_create_revision(my_rev - 1),
                        ),
                    )
                    .await,
                );
                let from = older
                    .as_ref()
                    .and_then(|o| o.header().map(|h| h.revision()))
                    .unwrap_or(0);
                r.record("delete m/1 in between", c.delete("m/1", None).await);
                let mut stream = c
                    .watch("m/1", Some(WatchOptions::new().with_start_revision(from)))
                    .await
                    .expect("watch");
                r.record_watch("watch: created", &mut stream).await;
                r.record_watch("watch: the delete", &mut stream).await;
            })
        },
    )
    .await;
}
