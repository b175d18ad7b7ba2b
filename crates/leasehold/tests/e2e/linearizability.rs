//! Linearizability under faults: concurrent clients (each talking to a different member of a
//! 3-member cluster) put, get, compare-and-set, delete and attach keys to leases, and revoke
//! leases, while the test kills the leader and then a follower (each restarted), or — with the
//! members in network namespaces — cuts the leader off and heals the partition. The recorded
//! history is checked per key with the checker in `history/` (itself tested on histories known
//! to be linearizable and known not to be).
//!
//! Bounded: a fixed number of operations per client, a time limit on each, and on the run.

use leasehold_testkit as common;
use leasehold_testkit::history;
use leasehold_testkit::netns;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Cluster, Kind};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, LeaseGrantOptions, PutOptions, Txn, TxnOp,
};
use history::{Answer, Event, Op};

const CLIENTS: usize = 4;
const OPS_PER_CLIENT: usize = 60;
const KEYS: usize = 5;
const LEASES: [i64; 3] = [0x51, 0x52, 0x53];
const OP_TIMEOUT: Duration = Duration::from_secs(3);
const RUN_MAX: Duration = Duration::from_secs(120);

/// What a client heard: an answer, nothing it can be sure of (the write may or may not have
/// happened), or a definite refusal (the operation did not happen).
enum Heard {
    Answer(Answer),
    Unknown,
    Refused,
}

fn classify(e: &etcd_client::Error) -> Heard {
    match e {
        // The request was refused before it changed anything: a put naming a revoked lease.
        etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::NotFound => Heard::Refused,
        _ => Heard::Unknown,
    }
}

/// A tiny deterministic generator, so a failing run can be replayed by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The recorded history: each event with the key it touched (`None`: a revoke, every key).
type Log = Arc<Mutex<Vec<(Option<usize>, Event)>>>;

fn key(k: usize) -> String {
    format!("lin/{k}")
}

async fn run_client(client_no: usize, endpoint: String, seed: u64, log: Log, pause_max_ms: u64) {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(OP_TIMEOUT);
    let mut rng = Rng(seed);
    let mut client = None;
    for n in 0..OPS_PER_CLIENT {
        if client.is_none() {
            client = Client::connect([endpoint.clone()], Some(options.clone()))
                .await
                .ok();
        }
        let Some(c) = client.as_mut() else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let k = rng.next(KEYS as u64) as usize;
        let value = format!("c{client_no}-{n}");
        let roll = rng.next(100);
        let invoked = Instant::now();
        // (key or None for every key, op, what was heard)
        let (target, op, heard) = if roll < 35 {
            let lease = if rng.next(2) == 0 {
                0
            } else {
                LEASES[rng.next(LEASES.len() as u64) as usize]
            };
            let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
            let heard = match c.put(key(k), value.clone(), options).await {
                Ok(_) => Heard::Answer(Answer::Done),
                Err(e) => classify(&e),
            };
            (Some(k), Op::Put { value, lease }, heard)
        } else if roll < 70 {
            let heard = match c.get(key(k), None).await {
                Ok(r) => Heard::Answer(Answer::Value(
                    r.kvs()
                        .first()
                        .map(|kv| kv.value_str().unwrap_or("").to_owned()),
                )),
                Err(_) => Heard::Unknown,
            };
            (Some(k), Op::Get, heard)
        } else if roll < 88 {
            let expected = format!("c{}-{}", rng.next(CLIENTS as u64), rng.next(n as u64 + 1));
            let txn = Txn::new()
                .when([Compare::value(key(k), CompareOp::Equal, expected.clone())])
                .and_then([TxnOp::put(key(k), value.clone(), None)]);
            let heard = match c.txn(txn).await {
                Ok(r) => Heard::Answer(Answer::Swapped(r.succeeded())),
                Err(e) => classify(&e),
            };
            (
                Some(k),
                Op::Cas {
                    expected,
                    new: value,
                },
                heard,
            )
        } else if roll < 95 {
            let heard = match c.delete(key(k), None).await {
                Ok(_) => Heard::Answer(Answer::Done),
                Err(e) => classify(&e),
            };
            (Some(k), Op::Delete, heard)
        } else {
            let lease = LEASES[rng.next(LEASES.len() as u64) as usize];
            let heard = match c.lease_revoke(lease).await {
                Ok(_) => Heard::Answer(Answer::Done),
                Err(e) => classify(&e),
            };
            // Grant it again so that later puts can use it (not a key operation).
            let _ = c
                .lease_grant(300, Some(LeaseGrantOptions::new().with_id(lease)))
                .await;
            (None, Op::Revoke { lease }, heard)
        };
        let completed = match heard {
            Heard::Answer(a) => Some((Instant::now(), a)),
            Heard::Unknown => {
                // The member may be down or electing: back off rather than burn operations.
                tokio::time::sleep(Duration::from_millis(200)).await;
                None
            }
            Heard::Refused => continue,
        };
        log.lock().unwrap().push((
            target,
            Event {
                client: client_no,
                op,
                invoked,
                completed,
            },
        ));
        tokio::time::sleep(Duration::from_millis(rng.next(pause_max_ms))).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_and_lease_history_is_linearizable_across_leader_and_follower_kills() {
    let mut cluster = Cluster::start(Kind::Leasehold, 3).await;
    let mut admin = cluster.members[0].client().await;
    for lease in LEASES {
        admin
            .lease_grant(300, Some(LeaseGrantOptions::new().with_id(lease)))
            .await
            .expect("grant");
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    let seed = u64::from(std::process::id()) * 7919 + 1;
    eprintln!("history seed base {seed}");
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let endpoint = cluster.members[i % 3].endpoint();
            tokio::spawn(run_client(i, endpoint, seed + i as u64, log.clone(), 20))
        })
        .collect();
    let started = Instant::now();
    // Faults while the clients run: the leader, then a follower, each killed and restarted.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let leader = cluster.leader().await;
    cluster.members[leader].kill9();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.members[leader].spawn();
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    cluster.members[follower].kill9();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    cluster.members[follower].spawn();
    for c in clients {
        tokio::time::timeout(RUN_MAX.saturating_sub(started.elapsed()), c)
            .await
            .expect("clients finish in time")
            .expect("client task");
    }
    check_history(&log);
}

/// Splits the history by key (a revoke belongs to every key) and checks each.
fn check_history(log: &Log) {
    let log = log.lock().unwrap().clone();
    let mut per_key: BTreeMap<usize, Vec<Event>> = BTreeMap::new();
    for (target, event) in &log {
        match target {
            Some(k) => per_key.entry(*k).or_default().push(event.clone()),
            None => (0..KEYS).for_each(|k| per_key.entry(k).or_default().push(event.clone())),
        }
    }
    let answered = log.iter().filter(|(_, e)| e.completed.is_some()).count();
    let unknown = log.len() - answered;
    eprintln!(
        "history: {} operations ({answered} answered, {unknown} unknown), {} keys",
        log.len(),
        per_key.len()
    );
    assert!(
        answered > CLIENTS * OPS_PER_CLIENT / 2,
        "too few answered operations"
    );
    for (k, events) in &per_key {
        if let Err(e) = history::check(None, events) {
            panic!("key {}: {e}", key(*k));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_and_lease_history_is_linearizable_across_a_partition_of_the_leader() {
    let mut net =
        netns::NetCluster::create().expect("network namespaces (needs root and iproute2)");
    for i in 0..netns::MEMBERS {
        net.spawn(i);
    }
    let leader = net.agreed_leader().await;
    let mut admin = netns::client(&net.endpoint((leader + 1) % netns::MEMBERS))
        .await
        .expect("client");
    for lease in LEASES {
        admin
            .lease_grant(300, Some(LeaseGrantOptions::new().with_id(lease)))
            .await
            .expect("grant");
    }
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let seed = u64::from(std::process::id()) * 104_729 + 3;
    eprintln!("history seed base {seed}");
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let endpoint = net.endpoint(i % netns::MEMBERS);
            // Paced so that the run spans the partition (60 operations over about 5 s).
            tokio::spawn(run_client(i, endpoint, seed + i as u64, log.clone(), 150))
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(700)).await;
    net.set_link(leader, false);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    net.set_link(leader, true);
    for c in clients {
        tokio::time::timeout(RUN_MAX.saturating_sub(started.elapsed()), c)
            .await
            .expect("clients finish in time")
            .expect("client task");
    }
    check_history(&log);
}
