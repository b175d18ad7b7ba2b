//! One append at a time, each made durable before the next, as a leader with one client in
//! flight does: this log's `append` (one frame, one `fdatasync`) against a redb commit of the
//! same bytes with `Durability::Immediate` (what a log kept in redb would pay per batch),
//! and a redb commit with `Durability::None` (what applying an entry will cost the raft-rs
//! engine's state machine, which the log makes durable instead).
//!
//! `cargo run --release -p leasehold-wal --example append_latency -- [DIR] [APPENDS] [BYTES]`
//! DIR defaults to a temporary directory under the current one (the disk being measured).

use std::time::{Duration, Instant};

use bytes::Bytes;
use leasehold_wal::proto::{Batch, Entry, HardState};
use leasehold_wal::{Wal, WalOptions};

fn main() {
    let mut args = std::env::args().skip(1);
    let base = args.next().unwrap_or_else(|| ".".into());
    let appends: u64 = args.next().map_or(2000, |a| a.parse().expect("APPENDS"));
    let bytes: usize = args.next().map_or(256, |a| a.parse().expect("BYTES"));
    let dir = tempfile::tempdir_in(&base).expect("a temporary directory");
    let payload = Bytes::from(vec![0x5Au8; bytes]);

    let (mut wal, _) = Wal::open(&dir.path().join("wal"), WalOptions::default()).expect("wal");
    let mut wal_times = Vec::with_capacity(appends as usize);
    for i in 1..=appends {
        let batch = Batch {
            compacted: None,
            entries: vec![Entry {
                entry_type: 0,
                term: 1,
                index: i,
                data: payload.clone(),
                context: Bytes::new(),
            }],
            hard_state: Some(HardState {
                term: 1,
                vote: 1,
                commit: i - 1,
            }),
        };
        let start = Instant::now();
        wal.append(&batch).expect("append");
        wal_times.push(start.elapsed());
    }

    let table: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("raft_log");
    let db = redb::Database::create(dir.path().join("log.redb")).expect("redb");
    let mut redb_times = Vec::with_capacity(appends as usize);
    for i in 1..=appends {
        let start = Instant::now();
        let txn = db.begin_write().expect("begin");
        {
            let mut t = txn.open_table(table).expect("table");
            t.insert(i, payload.as_ref()).expect("insert");
        }
        txn.commit().expect("commit");
        redb_times.push(start.elapsed());
    }

    let db = redb::Database::create(dir.path().join("state.redb")).expect("redb");
    let mut none_times = Vec::with_capacity(appends as usize);
    for i in 1..=appends {
        let start = Instant::now();
        let mut txn = db.begin_write().expect("begin");
        txn.set_durability(redb::Durability::None)
            .expect("durability");
        {
            let mut t = txn.open_table(table).expect("table");
            t.insert(i, payload.as_ref()).expect("insert");
        }
        txn.commit().expect("commit");
        none_times.push(start.elapsed());
    }

    report("wal append + fdatasync", &mut wal_times);
    report("redb commit (Immediate)", &mut redb_times);
    report("redb commit (None)", &mut none_times);
}

fn report(what: &str, times: &mut [Duration]) {
    times.sort();
    let n = times.len();
    let total: Duration = times.iter().sum();
    let at = |q: f64| times[((n as f64 * q) as usize).min(n - 1)];
    println!(
        "{what:<26} n={n} mean={:>7.1} us p50={:>7.1} us p99={:>7.1} us ({:.0}/s)",
        total.as_secs_f64() * 1e6 / n as f64,
        at(0.5).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6,
        n as f64 / total.as_secs_f64(),
    );
}
