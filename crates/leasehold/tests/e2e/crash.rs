//! Durability under SIGKILL: an acknowledged write is never lost.
//!
//! 16 writers put their own keys (`k-<writer>-<index>`, each key written once, writes of one
//! writer strictly sequential) while the server is SIGKILLed mid-stream; after a restart on the
//! same data dir every acknowledged write must be there with its value and mod_revision, and
//! nothing that was never written may be. Three kill/restart cycles, each bounded.

use leasehold_testkit as common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{Leasehold, Server};
use etcd_client::{Client, GetOptions, KeyValue};

const WRITERS: usize = 16;
const CYCLES: usize = 3;
/// How long writes run before the kill. Not a timing assertion: it only lets writes pile up.
const WRITE_PHASE: Duration = Duration::from_millis(1500);
/// A writer stops by itself after this many writes or this long, even if the kill never comes.
const WRITES_PER_WRITER_PER_CYCLE_MAX: u64 = 1_000_000;
const WRITER_RUN_MAX: Duration = Duration::from_secs(60);
/// How long writers may take to notice the kill (each request has its own timeout, shorter).
const WRITER_STOP_TIMEOUT: Duration = Duration::from_secs(30);
const PAGE_LEN: i64 = 1_000;
const PAGES_MAX: usize = 10_000;

fn key(writer: usize, index: u64) -> String {
    format!("k-{writer:02}-{index:08}")
}

fn value(writer: usize, index: u64) -> String {
    format!("value of writer {writer} write {index}")
}

/// Parses `k-<writer>-<index>`.
fn parse_key(key: &[u8]) -> Option<(usize, u64)> {
    let key = std::str::from_utf8(key).ok()?;
    let mut parts = key.strip_prefix("k-")?.split('-');
    let writer = parts.next()?.parse().ok()?;
    let index = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((writer, index))
}

#[derive(Clone, Debug)]
struct Ack {
    writer: usize,
    index: u64,
    mod_revision: i64,
}

/// What one writer did in one cycle.
struct WriterRun {
    acks: Vec<Ack>,
    /// The write that failed (the kill): it may or may not have been applied.
    in_doubt: Option<u64>,
    /// When and how that write failed.
    failure: Option<(Instant, String)>,
    /// The first index the next cycle may use.
    next_index: u64,
}

async fn writer(mut client: Client, writer: usize, first_index: u64) -> WriterRun {
    let started = Instant::now();
    let mut acks = Vec::new();
    for index in first_index..first_index + WRITES_PER_WRITER_PER_CYCLE_MAX {
        if started.elapsed() > WRITER_RUN_MAX {
            return WriterRun {
                acks,
                in_doubt: None,
                failure: None,
                next_index: index,
            };
        }
        match client
            .put(key(writer, index), value(writer, index), None)
            .await
        {
            Ok(response) => {
                let revision = response
                    .header()
                    .expect("put response has a header")
                    .revision();
                acks.push(Ack {
                    writer,
                    index,
                    mod_revision: revision,
                });
            }
            Err(e) => {
                let failure = Some((Instant::now(), e.to_string()));
                return WriterRun {
                    acks,
                    in_doubt: Some(index),
                    failure,
                    next_index: index + 1,
                };
            }
        }
    }
    WriterRun {
        acks,
        in_doubt: None,
        failure: None,
        next_index: first_index + WRITES_PER_WRITER_PER_CYCLE_MAX,
    }
}

/// Every key under `prefix` at one revision, read in pages. Returns (revision, kvs).
async fn read_prefix(client: &mut Client, prefix: &str) -> (i64, Vec<KeyValue>) {
    let end = {
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().expect("non-empty prefix") += 1;
        end
    };
    let mut kvs = Vec::new();
    let mut from = prefix.as_bytes().to_vec();
    let mut revision = 0;
    for _ in 0..PAGES_MAX {
        let options = GetOptions::new()
            .with_range(end.clone())
            .with_limit(PAGE_LEN)
            .with_revision(revision);
        let mut response = client
            .get(from.clone(), Some(options))
            .await
            .expect("range page");
        if revision == 0 {
            revision = response
                .header()
                .expect("range response has a header")
                .revision();
        }
        let more = response.more();
        let page = response.take_kvs();
        if let Some(last) = page.last() {
            from = last.key().to_vec();
            from.push(0);
        }
        kvs.extend(page);
        if !more {
            return (revision, kvs);
        }
    }
    panic!("more than {PAGES_MAX} pages of {PAGE_LEN} keys under {prefix}");
}

/// Checks the store against everything the writers did so far.
async fn verify(
    server: &Server,
    acks: &[Ack],
    in_doubt: &HashSet<(usize, u64)>,
    next_index: &[u64; WRITERS],
) -> i64 {
    let mut client = server.client().await;
    let (revision, kvs) = read_prefix(&mut client, "k-").await;
    let mut problems = Vec::new();

    let mut present: HashMap<(usize, u64), &KeyValue> = HashMap::new();
    for kv in &kvs {
        match parse_key(kv.key()) {
            Some((writer, index)) if writer < WRITERS => {
                present.insert((writer, index), kv);
            }
            _ => problems.push(format!(
                "unexpected key {:?}",
                String::from_utf8_lossy(kv.key())
            )),
        }
    }

    // 1. Every acknowledged write is there, with its value and revision.
    for ack in acks {
        match present.get(&(ack.writer, ack.index)) {
            None => problems.push(format!(
                "lost acknowledged write {} (acknowledged at revision {})",
                key(ack.writer, ack.index),
                ack.mod_revision
            )),
            Some(kv) => {
                if kv.value() != value(ack.writer, ack.index).as_bytes()
                    || kv.mod_revision() != ack.mod_revision
                {
                    problems.push(format!(
                        "{}: acknowledged value {:?} at revision {}, found {:?} at revision {}",
                        key(ack.writer, ack.index),
                        value(ack.writer, ack.index),
                        ack.mod_revision,
                        String::from_utf8_lossy(kv.value()),
                        kv.mod_revision()
                    ));
                }
            }
        }
    }

    // 2. Nothing that was never written is there; what is there is exactly what was written.
    let acked: HashSet<(usize, u64)> = acks.iter().map(|a| (a.writer, a.index)).collect();
    for (&(writer, index), kv) in &present {
        let attempted = index < next_index[writer];
        if !attempted || !(acked.contains(&(writer, index)) || in_doubt.contains(&(writer, index)))
        {
            problems.push(format!(
                "{} is present but was never written",
                key(writer, index)
            ));
        }
        if kv.value() != value(writer, index).as_bytes() {
            problems.push(format!(
                "{} has value {:?}",
                key(writer, index),
                String::from_utf8_lossy(kv.value())
            ));
        }
        if kv.version() != 1 || kv.create_revision() != kv.mod_revision() {
            problems.push(format!(
                "{} was written once but has version {}, create_revision {}, mod_revision {}",
                key(writer, index),
                kv.version(),
                kv.create_revision(),
                kv.mod_revision()
            ));
        }
        if kv.mod_revision() > revision {
            problems.push(format!(
                "{} has mod_revision {} above the store's {revision}",
                key(writer, index),
                kv.mod_revision()
            ));
        }
    }

    // 3. Revisions are unique, and each writer's sequential writes have increasing revisions.
    let mut by_revision: HashMap<i64, (usize, u64)> = HashMap::new();
    for (&id, kv) in &present {
        if let Some(other) = by_revision.insert(kv.mod_revision(), id) {
            problems.push(format!(
                "{} and {} share mod_revision {}",
                key(id.0, id.1),
                key(other.0, other.1),
                kv.mod_revision()
            ));
        }
    }
    let mut per_writer: BTreeMap<usize, BTreeMap<u64, i64>> = BTreeMap::new();
    for (&(writer, index), kv) in &present {
        per_writer
            .entry(writer)
            .or_default()
            .insert(index, kv.mod_revision());
    }
    for (writer, revisions) in &per_writer {
        let revisions: Vec<(&u64, &i64)> = revisions.iter().collect();
        for pair in revisions.windows(2) {
            if pair[1].1 <= pair[0].1 {
                problems.push(format!(
                    "writer {writer}: write {} (revision {}) after write {} (revision {})",
                    pair[1].0, pair[1].1, pair[0].0, pair[0].1
                ));
            }
        }
    }

    // 4. The store's revision covers every acknowledged write.
    let acked_revision_max = acks.iter().map(|a| a.mod_revision).max().unwrap_or(0);
    if revision < acked_revision_max {
        problems.push(format!(
            "store revision {revision} is below the acknowledged revision {acked_revision_max}"
        ));
    }

    if !problems.is_empty() {
        let shown: Vec<&String> = problems.iter().take(30).collect();
        server.fail(&format!(
            "{} problems after restart ({} acknowledged writes, {} keys present, revision {revision}); first ones:\n{}\n{}",
            problems.len(),
            acks.len(),
            present.len(),
            shown.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"),
            revision_table(acks, &present, acked_revision_max.max(revision))
        ));
    }

    // 5. New writes get revisions above everything before them.
    let response = client
        .put("after-restart", "x", None)
        .await
        .expect("put after restart");
    let new_revision = response.header().expect("header").revision();
    assert_eq!(
        new_revision,
        revision + 1,
        "the first write after restart follows the recovered revision {revision}"
    );
    assert!(new_revision > acked_revision_max);
    new_revision
}

/// Which key each of the last revisions belongs to, as acknowledged and as found: the shape
/// of a loss at a glance.
fn revision_table(acks: &[Ack], present: &HashMap<(usize, u64), &KeyValue>, top: i64) -> String {
    const ROWS: i64 = 8;
    let acked: HashMap<i64, String> = acks
        .iter()
        .map(|a| (a.mod_revision, key(a.writer, a.index)))
        .collect();
    let found: HashMap<i64, String> = present
        .iter()
        .map(|(&(w, i), kv)| (kv.mod_revision(), key(w, i)))
        .collect();
    let mut table = String::from("  revision  acknowledged        found after restart\n");
    for revision in (top - ROWS + 1).max(1)..=top {
        let cell =
            |m: &HashMap<i64, String>| m.get(&revision).cloned().unwrap_or_else(|| "-".into());
        table.push_str(&format!(
            "  {revision:>8}  {:<18}  {}\n",
            cell(&acked),
            cell(&found)
        ));
    }
    table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_writes_loses_no_acknowledged_write() {
    let mut server = Leasehold::start().await;
    let mut acks: Vec<Ack> = Vec::new();
    let mut in_doubt: HashSet<(usize, u64)> = HashSet::new();
    let mut next_index = [0u64; WRITERS];

    for cycle in 0..CYCLES {
        let client = server.client().await;
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| tokio::spawn(writer(client.clone(), w, next_index[w])))
            .collect();
        tokio::time::sleep(WRITE_PHASE).await;
        let killed_at = Instant::now();
        server.kill9();

        let mut acked_this_cycle = 0;
        for (w, handle) in writers.into_iter().enumerate() {
            let run = tokio::time::timeout(WRITER_STOP_TIMEOUT, handle)
                .await
                .unwrap_or_else(|_| {
                    panic!("writer {w} still running {WRITER_STOP_TIMEOUT:?} after the kill")
                })
                .expect("writer task panicked");
            // A single healthy server must not fail a put: the only failure allowed is the kill.
            match &run.failure {
                None => panic!(
                    "cycle {cycle}: writer {w} stopped before the kill ({} writes), so the kill did \
                     not interrupt it",
                    run.acks.len()
                ),
                Some((failed_at, error)) => assert!(
                    *failed_at >= killed_at,
                    "cycle {cycle}: writer {w}'s put failed before the kill: {error}\n{}",
                    server.log_tail()
                ),
            }
            in_doubt.extend(run.in_doubt.map(|i| (w, i)));
            next_index[w] = run.next_index;
            acked_this_cycle += run.acks.len();
            acks.extend(run.acks);
        }
        assert!(
            acked_this_cycle > 0,
            "cycle {cycle}: no write was acknowledged before the kill"
        );

        server.restart().await;
        let revision = verify(&server, &acks, &in_doubt, &next_index).await;
        eprintln!(
            "cycle {cycle}: {acked_this_cycle} writes acknowledged before SIGKILL, {} in total; \
             all present after restart; store at revision {revision}",
            acks.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_restart_keeps_acknowledged_writes() {
    let mut server = Leasehold::start().await;
    let mut client = server.client().await;
    let mut acks = Vec::new();
    for index in 0..200u64 {
        let writer = (index % 4) as usize;
        let response = client
            .put(key(writer, index), value(writer, index), None)
            .await
            .expect("put");
        acks.push(Ack {
            writer,
            index,
            mod_revision: response.header().expect("header").revision(),
        });
    }
    let last_revision = acks.last().expect("acks").mod_revision;
    let mut next_index = [0u64; WRITERS];
    for ack in &acks {
        next_index[ack.writer] = next_index[ack.writer].max(ack.index + 1);
    }
    drop(client);

    let status = server.terminate().await;
    eprintln!("leasehold exited after SIGTERM with {status}");
    server.restart().await;
    let revision_after = verify(&server, &acks, &HashSet::new(), &next_index).await;
    assert_eq!(
        revision_after,
        last_revision + 1,
        "after a graceful restart with nothing in flight the store is exactly at the last acknowledged revision"
    );
}
