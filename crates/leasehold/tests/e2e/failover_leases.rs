//! Leases kept alive through leader kills: 1,000 leases of TTL 3 s renewed over one
//! `LeaseKeepAlive` stream as clientv3 renews them (each a third of its TTL after the last), the
//! stream moving to another member when its own dies, while the leader of a 3-member cluster is
//! SIGKILLed twice. No lease whose client kept renewing it may be revoked: every renewal is
//! answered with TTL > 0, and every lease is alive at the end. On the raft-rs engine, whose
//! promise this is (docs/lease.md: no fresh TTL, and an election gap is given back).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use leasehold_api::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseTimeToLiveRequest, lease_client::LeaseClient,
};
use leasehold_testkit as common;
use tokio::sync::mpsc;
use tokio::time::Instant;

use common::{Cluster, Kind};

const LEASES: usize = 1_000;
const TTL_SECS: i64 = 3;
/// clientv3 renews a lease a third of its TTL after the last answer.
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How long a connection attempt or a stream without answers is waited for before the keeper
/// moves to the next member.
const STUCK_AFTER: Duration = Duration::from_millis(1500);

/// What the keeper saw.
#[derive(Default)]
struct Kept {
    /// Leases a renewal was answered TTL <= 0 for: revoked while their client was renewing.
    lost: BTreeSet<i64>,
    answered: u64,
    streams: u64,
}

/// Renews `ids` over one stream at a time, member after member, until `stop` is set.
async fn keep_alive(
    endpoints: Vec<String>,
    ids: Vec<i64>,
    kept: Arc<Mutex<Kept>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    // When each lease is due next.
    let mut due: HashMap<i64, Instant> = ids.iter().map(|id| (*id, Instant::now())).collect();
    for endpoint in endpoints.iter().cycle() {
        if *stop.borrow() {
            return;
        }
        let connected =
            tokio::time::timeout(STUCK_AFTER, LeaseClient::connect(endpoint.clone())).await;
        let Ok(Ok(mut client)) = connected else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let opened = tokio::time::timeout(
            STUCK_AFTER,
            client.lease_keep_alive(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)),
        )
        .await;
        let Ok(Ok(answers)) = opened else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        kept.lock().unwrap().streams += 1;
        let mut answers = answers.into_inner();
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let mut last_answer = Instant::now();
        let mut in_flight = 0usize;
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tick.tick() => {
                    if in_flight > 0 && last_answer.elapsed() > STUCK_AFTER {
                        break;
                    }
                    let now = Instant::now();
                    for (id, at) in due.iter_mut() {
                        if *at <= now {
                            // Not renewed again before its answer (or the stream's end).
                            *at = now + Duration::from_secs(3600);
                            in_flight += 1;
                            if tx.send(LeaseKeepAliveRequest { id: *id }).is_err() {
                                break;
                            }
                        }
                    }
                }
                answer = answers.next() => {
                    let Some(Ok(answer)) = answer else { break };
                    last_answer = Instant::now();
                    in_flight = in_flight.saturating_sub(1);
                    let mut kept = kept.lock().unwrap();
                    kept.answered += 1;
                    if answer.ttl <= 0 {
                        kept.lost.insert(answer.id);
                    } else if let Some(at) = due.get_mut(&answer.id) {
                        *at = Instant::now() + RENEW_EVERY;
                    }
                }
            }
        }
        // The stream ended: whatever it left unanswered is due now, on the next member.
        let now = Instant::now();
        for at in due.values_mut() {
            if *at > now + RENEW_EVERY {
                *at = now;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leader_kills_lose_none_of_a_thousand_kept_leases() {
    let mut cluster = Cluster::start(Kind::Leasehold, 3).await;
    let endpoints = cluster.endpoints();
    let client = cluster.members[0].client().await;
    let ids: Vec<i64> = futures::stream::iter(0..LEASES)
        .map(|_| {
            let mut client = client.clone();
            async move {
                client
                    .lease_grant(TTL_SECS, None)
                    .await
                    .expect("grant")
                    .id()
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let kept = Arc::new(Mutex::new(Kept::default()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let keeper = tokio::spawn(keep_alive(
        endpoints.clone(),
        ids.clone(),
        kept.clone(),
        stopped,
    ));

    for kill in 0..2 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let leader = cluster.leader().await;
        cluster.members[leader].kill9();
        // The others elect a leader and the keeper's stream carries on meanwhile.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let member = &mut cluster.members[leader];
        member.spawn();
        member.wait_ready().await;
        let kept = kept.lock().unwrap();
        assert!(
            kept.lost.is_empty(),
            "after kill {kill}: lost {:?}",
            kept.lost
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.send_replace(true);
    keeper.await.expect("the keeper ran");

    {
        let kept = kept.lock().unwrap();
        assert!(
            kept.lost.is_empty(),
            "revoked while kept alive: {:?}",
            kept.lost
        );
        assert!(
            kept.answered as usize >= 5 * LEASES,
            "the keeper renewed too little to show anything: {} answers over {} streams",
            kept.answered,
            kept.streams
        );
    }
    // Every lease is still there, with time left.
    let mut lease = LeaseClient::connect(endpoints[0].clone())
        .await
        .expect("connect");
    for id in ids.iter().step_by(50) {
        let left = lease
            .lease_time_to_live(LeaseTimeToLiveRequest {
                id: *id,
                keys: false,
            })
            .await
            .expect("time to live")
            .into_inner()
            .ttl;
        assert!(left > 0, "lease {id:x} is gone");
    }
}
