//! Lock safety through the v3lock service, with etcd-client as the independent client:
//!
//! - contention: 10 clients take the same lock repeatedly; acquisitions follow create-revision
//!   order and no two clients are ever inside at once (nothing is paused);
//! - a Jepsen-style counter (etcd#11456, "Jepsen: etcd 3.4.3"): worker *processes* increment a
//!   counter while holding the lock with a short TTL, and the test pauses lock holders with
//!   SIGSTOP past their TTL. Without fencing, a resumed worker overwrites the counter with a
//!   stale value (lost updates: a lease-based lock alone cannot exclude a paused holder). With
//!   the write fenced (a Txn comparing the lock key's create revision, the fencing token), no
//!   acknowledged update is lost.
//!
//! The workers are this test binary re-executed to run the ignored test `jepsen_worker` (so
//! they can be paused as whole processes). Every loop is bounded in time and count.

use leasehold_testkit as common;
use leasehold_testkit::lock_with;

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Leasehold, Server};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LeaseGrantOptions, SortOrder, SortTarget, Txn, TxnOp,
};

const CONTENDERS: usize = 10;
const ROUNDS_PER_CONTENDER: usize = 3;
const CONTENTION_WAIT_MAX: Duration = Duration::from_secs(60);

/// Lock-holder TTL in the Jepsen test: the server's minimum with etcd's default timing.
const JEPSEN_TTL_SECS: i64 = 2;
/// How long a paused holder stays paused: past its TTL, so its lease expires meanwhile.
const JEPSEN_PAUSE: Duration = Duration::from_millis(3_000);
const JEPSEN_WORKERS: usize = 4;
/// How long the workers run, and how long they may take to finish after that.
const JEPSEN_RUN: Duration = Duration::from_secs(12);
const JEPSEN_EXIT_WAIT_MAX: Duration = Duration::from_secs(30);
/// Time a worker spends between reading the counter and writing it back: the window a pause
/// must hit to make a stale write.
const JEPSEN_HOLD: Duration = Duration::from_millis(150);
const JEPSEN_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

const LOCK_NAME: &str = "counter-lock";
const COUNTER_KEY: &str = "counter";

const WORKER_ENDPOINT_VAR: &str = "LEASEHOLD_JEPSEN_ENDPOINT";
const WORKER_FENCED_VAR: &str = "LEASEHOLD_JEPSEN_FENCED";
const WORKER_RUN_MS_VAR: &str = "LEASEHOLD_JEPSEN_RUN_MS";

async fn create_revision(client: &mut Client, key: &[u8]) -> Option<i64> {
    let r = client.get(key, None).await.ok()?;
    r.kvs().first().map(|kv| kv.create_revision())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_contenders_acquire_in_create_revision_order_one_at_a_time() {
    let server = Leasehold::start().await;
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    // (create revision of the acquiring key) in acquisition order.
    let acquisitions = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for n in 0..CONTENDERS {
        let mut client = server.client().await;
        let (inside, overlaps, acquisitions) =
            (inside.clone(), overlaps.clone(), acquisitions.clone());
        tasks.push(tokio::spawn(async move {
            let lease = client.lease_grant(30, None).await.expect("grant").id();
            for round in 0..ROUNDS_PER_CONTENDER {
                let locked = client
                    .lock(LOCK_NAME, lock_with(lease))
                    .await
                    .unwrap_or_else(|e| panic!("contender {n} round {round}: lock: {e}"));
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let rev = create_revision(&mut client, locked.key()).await;
                acquisitions.lock().unwrap().push(rev);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                client.unlock(locked.key()).await.expect("unlock");
            }
        }));
    }
    let all = futures::future::join_all(tasks);
    let results = tokio::time::timeout(CONTENTION_WAIT_MAX, all)
        .await
        .unwrap_or_else(|_| server.fail("contenders did not finish in time"));
    for r in results {
        r.expect("contender panicked");
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    let acquisitions = acquisitions.lock().unwrap().clone();
    assert_eq!(acquisitions.len(), CONTENDERS * ROUNDS_PER_CONTENDER);
    let revs: Vec<i64> = acquisitions
        .iter()
        .map(|r| r.expect("the holder's key exists while it holds the lock"))
        .collect();
    assert!(
        revs.windows(2).all(|w| w[0] < w[1]),
        "acquisitions out of create-revision order: {revs:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Jepsen-style counter
// ---------------------------------------------------------------------------------------------

/// What the driver learns from the workers.
#[derive(Debug, Default)]
struct Outcome {
    acknowledged: u64,
    paused_holders: u64,
    final_counter: u64,
    lost: u64,
    refused_fenced_writes: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_lock_holders_lose_no_fenced_update() {
    let unfenced = jepsen_run(false).await;
    let fenced = jepsen_run(true).await;
    eprintln!("jepsen unfenced: {unfenced:?}");
    eprintln!("jepsen fenced:   {fenced:?}");
    // The pauses must actually have hit holders, or the fenced result proves nothing.
    assert!(fenced.paused_holders >= 2, "too few pauses: {fenced:?}");
    assert!(fenced.acknowledged > 0, "no progress: {fenced:?}");
    assert_eq!(fenced.lost, 0, "fenced updates lost: {fenced:?}");
    assert!(
        fenced.refused_fenced_writes > 0,
        "no stale write was ever refused, so the pauses never hit the window: {fenced:?}"
    );
    // Unfenced writes are expected to lose updates; that is the reason to fence, and the count
    // is what docs/locks.md quotes. It is not asserted (a run may be lucky).
}

async fn jepsen_run(fenced: bool) -> Outcome {
    let server = Leasehold::start().await;
    let mut client = server.client().await;
    client
        .put(COUNTER_KEY, "0", None)
        .await
        .expect("put counter");
    let exe = std::env::current_exe().expect("current exe");
    let mut workers: Vec<Worker> = (0..JEPSEN_WORKERS)
        .map(|_| Worker::spawn(&exe, &server, fenced))
        .collect();
    let mut outcome = Outcome::default();
    let start = Instant::now();
    while start.elapsed() < JEPSEN_RUN {
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Pause whoever holds the lock now, past its TTL.
        let Some(holder) = current_holder(&mut client).await else {
            continue;
        };
        let Some(worker) = workers
            .iter()
            .find(|w| w.leases.lock().unwrap().contains(&holder))
        else {
            continue;
        };
        worker.signal("-STOP");
        tokio::time::sleep(JEPSEN_PAUSE).await;
        worker.signal("-CONT");
        outcome.paused_holders += 1;
    }
    let mut acked_values = Vec::new();
    for worker in &mut workers {
        let report = worker.finish().await;
        outcome.acknowledged += report.acknowledged;
        outcome.refused_fenced_writes += report.refused;
        acked_values.extend(report.values);
    }
    let counter = client.get(COUNTER_KEY, None).await.expect("get counter");
    let value = counter
        .kvs()
        .first()
        .expect("counter exists")
        .value_str()
        .expect("utf8");
    outcome.final_counter = value.parse().expect("counter is a number");
    outcome.lost = outcome.acknowledged.saturating_sub(outcome.final_counter);
    if fenced {
        // Every acknowledged fenced write wrote a distinct next value.
        acked_values.sort_unstable();
        let expected: Vec<u64> = (1..=outcome.acknowledged).collect();
        assert_eq!(
            acked_values, expected,
            "fenced writes were not a sequence: {outcome:?}"
        );
    }
    drop(server);
    outcome
}

/// The lease of the first-created key under the lock's prefix: the holder.
async fn current_holder(client: &mut Client) -> Option<i64> {
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let r = client
        .get(format!("{LOCK_NAME}/"), Some(options))
        .await
        .ok()?;
    r.kvs().first().map(|kv| kv.lease())
}

/// One worker process and what it has printed so far.
struct Worker {
    child: Child,
    /// Leases the worker announced (`LEASE <id>`).
    leases: Arc<Mutex<Vec<i64>>>,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct WorkerReport {
    acknowledged: u64,
    refused: u64,
    values: Vec<u64>,
}

impl Worker {
    fn spawn(exe: &std::path::Path, server: &Server, fenced: bool) -> Worker {
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "lock_safety::jepsen_worker",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(WORKER_ENDPOINT_VAR, server.endpoint())
            .env(WORKER_FENCED_VAR, if fenced { "1" } else { "0" })
            .env(WORKER_RUN_MS_VAR, JEPSEN_RUN.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn worker");
        let stdout = child.stdout.take().expect("stdout piped");
        let leases = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (l, ls) = (leases.clone(), lines.clone());
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest's "test jepsen_worker ... " precedes the first line.
                let Some(at) = line.find("JEPSEN ") else {
                    continue;
                };
                let line = line[at..].to_owned();
                if let Some(id) = line.strip_prefix("JEPSEN LEASE ")
                    && let Ok(id) = id.trim().parse()
                {
                    l.lock().unwrap().push(id);
                }
                ls.lock().unwrap().push(line);
            }
        });
        Worker {
            child,
            leases,
            lines,
            reader: Some(reader),
        }
    }

    fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status();
    }

    /// Waits (bounded) for the worker to exit and tallies its report.
    async fn finish(&mut self) -> WorkerReport {
        self.signal("-CONT");
        let start = Instant::now();
        while start.elapsed() < JEPSEN_EXIT_WAIT_MAX {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let mut report = WorkerReport::default();
        for line in self.lines.lock().unwrap().iter() {
            if let Some(v) = line.strip_prefix("JEPSEN ACK ") {
                report.acknowledged += 1;
                report.values.push(v.trim().parse().expect("acked value"));
            } else if line.starts_with("JEPSEN REFUSED") {
                report.refused += 1;
            }
        }
        report
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The worker process: runs only when re-executed by `jepsen_run` (it reads its endpoint from
/// the environment); as a plain ignored test it does nothing.
#[test]
#[ignore = "a worker process of paused_lock_holders_lose_no_fenced_update"]
fn jepsen_worker() {
    let Ok(endpoint) = std::env::var(WORKER_ENDPOINT_VAR) else {
        return;
    };
    let fenced = std::env::var(WORKER_FENCED_VAR).is_ok_and(|v| v == "1");
    let run_ms: u64 = std::env::var(WORKER_RUN_MS_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(worker_loop(endpoint, fenced, Duration::from_millis(run_ms)));
}

/// A session: a lease kept alive by a background task, until the lease is gone.
struct Session {
    lease: i64,
    alive: Arc<std::sync::atomic::AtomicBool>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Session {
    async fn start(client: &mut Client) -> Option<Session> {
        let lease = client
            .lease_grant(JEPSEN_TTL_SECS, Some(LeaseGrantOptions::new()))
            .await
            .ok()?
            .id();
        say(&format!("LEASE {lease}"));
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (mut keeper, mut responses) = client.lease_keep_alive(lease).await.ok()?;
        let flag = alive.clone();
        let keeper = tokio::spawn(async move {
            loop {
                if keeper.keep_alive().await.is_err() {
                    break;
                }
                match responses.message().await {
                    Ok(Some(r)) if r.ttl() > 0 => {}
                    _ => break,
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            flag.store(false, Ordering::SeqCst);
        });
        Some(Session {
            lease,
            alive,
            keeper,
        })
    }

    fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst) && !self.keeper.is_finished()
    }
}

async fn worker_loop(endpoint: String, fenced: bool, run: Duration) {
    let deadline = Instant::now() + run;
    let Ok(mut client) = Client::connect([endpoint], None).await else {
        return;
    };
    let mut session: Option<Session> = None;
    while Instant::now() < deadline {
        if !session.as_ref().is_some_and(Session::alive) {
            if let Some(old) = session.take() {
                old.keeper.abort();
            }
            session = Session::start(&mut client).await;
            if session.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        let lease = session.as_ref().map_or(0, |s| s.lease);
        let step = tokio::time::timeout(
            JEPSEN_REQUEST_TIMEOUT,
            increment_once(&mut client, lease, fenced),
        )
        .await;
        match step {
            Ok(Some(Written::Acked(value))) => say(&format!("ACK {value}")),
            Ok(Some(Written::Refused)) => say("REFUSED"),
            Ok(None) | Err(_) => {}
        }
    }
    if let Some(s) = session {
        let _ = client.lease_revoke(s.lease).await;
    }
}

/// One line of the worker's report to the driver, flushed at once (the driver reads it live).
fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "JEPSEN {line}");
    let _ = out.flush();
}

enum Written {
    Acked(u64),
    Refused,
}

/// Lock, read the counter, hold, write counter + 1 (fenced or not), unlock.
async fn increment_once(client: &mut Client, lease: i64, fenced: bool) -> Option<Written> {
    let locked = client.lock(LOCK_NAME, lock_with(lease)).await.ok()?;
    let key = locked.key().to_vec();
    let token = create_revision(client, &key).await;
    let written = match token {
        Some(token) => {
            let counter = client.get(COUNTER_KEY, None).await.ok()?;
            let value: u64 = counter.kvs().first()?.value_str().ok()?.parse().ok()?;
            tokio::time::sleep(JEPSEN_HOLD).await;
            let next = value + 1;
            if fenced {
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        key.clone(),
                        CompareOp::Equal,
                        token,
                    )])
                    .and_then([TxnOp::put(COUNTER_KEY, next.to_string(), None)]);
                match client.txn(txn).await {
                    Ok(r) if r.succeeded() => Some(Written::Acked(next)),
                    Ok(_) => Some(Written::Refused),
                    Err(_) => None,
                }
            } else {
                match client.put(COUNTER_KEY, next.to_string(), None).await {
                    Ok(_) => Some(Written::Acked(next)),
                    Err(_) => None,
                }
            }
        }
        None => None,
    };
    let _ = client.unlock(key).await;
    written
}
