//! The raft-rs core's floor: N members in one process, each on its own Raft thread with its
//! write-ahead log on the disk under DIR, messages handed over in memory (no sockets). One
//! client proposes on the leader and waits until the leader has applied its entry, then
//! proposes the next; `CLIENTS` > 1 keeps that many in flight (they share appends).
//!
//! `cargo run --release -p leasehold-consensus --example commit_latency -- [MEMBERS] [PROPOSALS] [CLIENTS] [DIR]`

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_consensus::driver::{Committed, Driver, Input, Machine};
use leasehold_consensus::{
    Checkpoint, Core, CoreConfig, CoreError, CoreStatus, Host, HostError, eraftpb,
};
use leasehold_wal::StdFs;
use leasehold_wal::proto::ConfState;

type Inputs = Arc<Mutex<HashMap<u64, mpsc::Sender<Input<StdFs>>>>>;

/// What the client waits for.
enum Event {
    /// Proposal `seq` became the entry at `index`.
    Proposed { seq: usize, index: u64 },
    /// `member` applied everything up to `upto`.
    Applied { member: u64, upto: u64 },
}

struct Member {
    id: u64,
    peers: Inputs,
    /// What the leader applied, to the client.
    applied: mpsc::Sender<Event>,
    leader: Arc<std::sync::atomic::AtomicU64>,
}

impl Host for Member {
    fn send(&mut self, messages: Vec<eraftpb::Message>) {
        let peers = self.peers.lock().unwrap();
        for m in messages {
            // Through our codec, as a peer's bytes would come.
            let bytes = leasehold_consensus::encode_message(&m);
            let to = m.to;
            if let Some(peer) = peers.get(&to) {
                let m = leasehold_consensus::decode_peer_message(&bytes, to).expect("decodes");
                let _ = peer.send(Input::Step(m));
            }
        }
    }

    fn install_snapshot(&mut self, _: &eraftpb::Snapshot) -> Result<(), HostError> {
        Err(HostError("no snapshots in this example".into()))
    }
}

impl Machine for Member {
    fn apply(&mut self, committed: Vec<Committed>) {
        if let Some(last) = committed.last() {
            let _ = self.applied.send(Event::Applied {
                member: self.id,
                upto: last.entry().index,
            });
        }
    }
    fn status(&mut self, status: CoreStatus) {
        if status.is_leader {
            self.leader
                .store(status.id, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fn failed(&mut self, error: CoreError) {
        panic!("member {} failed: {error}", self.id);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let members: u64 = args.next().map_or(3, |a| a.parse().expect("MEMBERS"));
    let proposals: usize = args.next().map_or(5000, |a| a.parse().expect("PROPOSALS"));
    let clients: usize = args.next().map_or(1, |a| a.parse().expect("CLIENTS"));
    let base = args.next().unwrap_or_else(|| ".".into());
    let dir = tempfile::tempdir_in(&base).expect("a temporary directory");
    let ids: Vec<u64> = (1..=members).collect();
    let peers: Inputs = Arc::default();
    let leader = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (applied_tx, applied_rx) = mpsc::channel();
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let mut drivers = Vec::new();
    for &id in &ids {
        let mut config = CoreConfig::new(id);
        // 10 ms ticks: an election within ~100-200 ms of start.
        config.election_tick = 10;
        let checkpoint = Checkpoint {
            conf_state: ConfState {
                voters: ids.clone(),
                ..ConfState::default()
            },
            ..Checkpoint::default()
        };
        let core = Core::open(
            StdFs,
            &dir.path().join(format!("member-{id}")),
            &config,
            checkpoint,
            &logger,
        )
        .expect("open");
        let member = Member {
            id,
            peers: peers.clone(),
            applied: applied_tx.clone(),
            leader: leader.clone(),
        };
        let driver = Driver::start(
            core,
            member,
            Duration::from_millis(10),
            leasehold_consensus::reads::ReadBatcher::new(5, 500),
        );
        peers.lock().unwrap().insert(id, driver.inputs());
        drivers.push(driver);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let lead = loop {
        let l = leader.load(std::sync::atomic::Ordering::SeqCst);
        if l != 0 {
            break l;
        }
        assert!(Instant::now() < deadline, "no leader within 10 s");
        std::thread::sleep(Duration::from_millis(5));
    };
    let to_leader = peers.lock().unwrap()[&lead].clone();
    // Wait out the leader's first (empty) entry.
    std::thread::sleep(Duration::from_millis(100));
    while applied_rx.try_recv().is_ok() {}

    // Proposals go out without waiting for the Raft thread: each answer comes back on the
    // same channel as the leader's applies, from the same thread, so in order.
    let propose = |seq: usize| {
        let tx = applied_tx.clone();
        to_leader
            .send(Input::Propose(
                format!("put {seq}").into_bytes(),
                Box::new(move |r| {
                    let index = r.expect("the leader takes the proposal").index;
                    let _ = tx.send(Event::Proposed { seq, index });
                }),
            ))
            .expect("leader thread alive");
    };
    let mut latencies = Vec::with_capacity(proposals);
    let mut sent_at: HashMap<usize, Instant> = HashMap::new();
    let mut landed: HashMap<u64, usize> = HashMap::new();
    let start = Instant::now();
    let mut sent = 0;
    let mut done = 0;
    while done < proposals {
        while sent_at.len() < clients && sent < proposals {
            sent_at.insert(sent, Instant::now());
            propose(sent);
            sent += 1;
        }
        match applied_rx.recv().expect("events") {
            Event::Proposed { seq, index } => {
                landed.insert(index, seq);
            }
            Event::Applied { member, upto } if member == lead => {
                let finished: Vec<u64> = landed.keys().copied().filter(|i| *i <= upto).collect();
                for index in finished {
                    let seq = landed.remove(&index).expect("landed");
                    let at = sent_at.remove(&seq).expect("in flight");
                    latencies.push(at.elapsed());
                    done += 1;
                }
            }
            Event::Applied { .. } => {}
        }
    }
    let elapsed = start.elapsed();
    latencies.sort();
    let n = latencies.len();
    let q = |p: f64| latencies[((n as f64 * p) as usize).min(n - 1)].as_secs_f64() * 1e6;
    println!(
        "{members} member(s), {clients} client(s): {:.0} commits/s, p50 {:.0} us, p99 {:.0} us",
        n as f64 / elapsed.as_secs_f64(),
        q(0.5),
        q(0.99)
    );
    peers.lock().unwrap().clear();
    drop(to_leader);
    for driver in drivers {
        driver.stop();
    }
}
