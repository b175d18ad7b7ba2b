//! The event loop: simulated time, and every event in (time, sequence) order, handed to the
//! member it is for; what members say is delivered here, and the final checks run here. Every
//! random choice comes from the run's one generator. Around it: `network.rs` (latency, drops,
//! duplicates, cut links), `faults.rs` (what the seed draws, and each fault), `cluster.rs`
//! (members as processes, membership changes, the leader) and `workload.rs` (the clients and
//! watchers). Adding a fault or a client touches one of those.

mod cluster;
mod faults;
mod network;
mod workload;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use leasehold_history::{self as history, Event as HEvent, Op as HOp};
use leasehold_wal::MemFs;

use crate::check::{Leases, check_auth, check_fenced, check_histories, converged};
use crate::disk::SimFs;
use crate::member::{Answer, Clock, Member, Origin, Out, PeerMsg, Request, TICK_US};
use crate::rng::Rng;
use crate::{Options, Variant};
use faults::{Faults, KillChurn};
use workload::{AuthRun, Client, Kind, LOCK_KEY, WatchedEvent, Watcher, auth_setup, watched};

const SEC: u64 = 1_000_000;

const MS: u64 = 1_000;

/// How many trace lines a failure shows.
const TRACE_TAIL: usize = 60;

/// What one seed's run found.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    /// FNV-1a over every trace line: equal for equal runs.
    pub trace_hash: u64,
    pub failures: Vec<String>,
    /// The last trace lines (all of them with `Options::full_trace`).
    pub trace: Vec<String>,
    pub simulated_secs: f64,
    pub faults: String,
    pub stats: String,
}

#[derive(Debug)]
enum Ev {
    Tick(usize),
    /// A member's expiry driver wakes.
    Wake(usize),
    /// A member's batcher takes what is queued (batching seeds).
    Flush(usize),
    Raft {
        to: usize,
        bytes: Vec<u8>,
    },
    Peer {
        to: usize,
        msg: PeerMsg,
    },
    Request {
        to: usize,
        client: usize,
        op: u64,
        request: Request,
    },
    Reply {
        client: usize,
        op: u64,
        answer: Answer,
    },
    ClientWakes(usize),
    ClientTimeout {
        client: usize,
        op: u64,
    },
    Partition,
    HealNetwork,
    Crash,
    Restart(usize),
    Pause,
    Transfer,
    /// Once healed, in kill-churn seeds: the leader is killed (kill -9) and restarted.
    KillLeader,
    /// The leader removes a voter (which never runs again) ...
    Membership,
    /// ... sees whether the removal applied ...
    MembershipStep,
    /// ... and adds a new, empty member in its place, which a snapshot catches up.
    AddMember,
    Heal,
    Stop,
    /// A watcher pulls what its member applied since it last looked.
    WatchPoll(usize),
}

struct Scheduled {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

struct World {
    now: u64,
    seq: u64,
    base: Instant,
    rng: Rng,
    /// Which lease clients keep their leases once healed: its own generator.
    keep_rng: Rng,
    faults: Faults,
    options: Options,
    queue: BinaryHeap<Reverse<Scheduled>>,
    members: Vec<Member>,
    /// One-way links that drop everything: (from, to) by index.
    cut: BTreeSet<(usize, usize)>,
    /// One-way links that drop Raft's messages only: (from, to) by index. The peer line's
    /// messages still go (a follower's line to the leader is a connection the follower opened,
    /// and answers come back on it, where `from` cannot open one to `to`).
    raft_cut: BTreeSet<(usize, usize)>,
    /// Which partitions of a member from its leader cut the leader's Raft traffic only: its
    /// own generator, so that the other draws stay as they were.
    raft_cut_rng: Rng,
    clients: Vec<Client>,
    watchers: Vec<Watcher>,
    /// Fenced writes the store accepted: (revision, the token they carried).
    fenced: Vec<(i64, i64)>,
    /// Per key: its history of puts, compare-and-sets and reads.
    histories: BTreeMap<String, Vec<HEvent>>,
    /// The value last sent to each key, which compare-and-sets expect.
    last_put: BTreeMap<String, String>,
    /// Auth seeds only.
    auth: Option<AuthRun>,
    /// Each member's batcher window (0: every write its own entry), drawn apart.
    batch_window_us: u64,
    leases: Leases,
    healed_at: Option<u64>,
    /// A membership change under way: the member being removed (and since when), or `None`
    /// once it is gone and until the new one is in.
    removing: Option<(usize, u64)>,
    /// A new member being added, and since when.
    /// A member being added: which, since when, and whether it joins as a learner first.
    adding: Option<(usize, u64, bool)>,
    /// Every reign once healed: (true µs of the promotion, lease ms, the election timeout it
    /// left each inherited lease at least, until when it timed leases), how lease time maps to
    /// true time while each leader times leases (lease time does not count what the cluster
    /// spent without a leader); by member index, the reign it is in.
    reigns: Vec<crate::check::Reign>,
    reigning: BTreeMap<usize, usize>,
    /// The cover margin every member renews with (`--lease-cover-margin`), drawn per seed.
    cover_margin_ms: u64,
    /// Kill churn once healed (in some seeds, instead of the transfers): its own generator and
    /// the period at which the leader is killed, chosen at heal.
    kills: KillChurn,
    /// The highest log index any member has applied.
    applied_max: u64,
    end: u64,
    trace_hash: u64,
    trace: VecDeque<String>,
    failures: Vec<String>,
    events: u64,
    acked_writes: u64,
    lease_ends: u64,
}

/// Runs one seed.
pub fn run(seed: u64, options: Options) -> Outcome {
    let mut rng = Rng::new(seed);
    let faults = Faults::draw(&mut rng);
    let base = Instant::now();
    let ids: Vec<u64> = (1..=faults.members as u64).collect();
    let members: Vec<Member> = ids
        .iter()
        .map(|id| {
            let disk = if options.variant == Variant::AckBeforeFsync {
                SimFs::Lying(MemFs::new())
            } else {
                SimFs::Honest(MemFs::new())
            };
            let drift = if faults.drift_ppm_max == 0 {
                0
            } else {
                rng.range(0, 2 * faults.drift_ppm_max as u64 + 1) as i64 - faults.drift_ppm_max
            };
            let clock = Clock {
                rate_ppm: drift,
                offset_us: rng.range(0, 1000 * SEC),
            };
            // Each member its own election timeout, 1 to 1.5 s (raft-rs's own draw is unseeded).
            let election_tick = rng.range(10, 15) as usize;
            Member::new(*id, &ids, disk, clock, election_tick, options.variant, base)
        })
        .collect();
    let chaos = options.chaos_secs * SEC;
    let mut world = World {
        now: 0,
        seq: 0,
        base,
        rng,
        keep_rng: Rng::new(seed ^ 0x6ee9_0000_0000_0006),
        faults,
        options,
        queue: BinaryHeap::new(),
        members,
        cut: BTreeSet::new(),
        raft_cut: BTreeSet::new(),
        raft_cut_rng: Rng::new(seed ^ 0x0e3a_0000_0000_0007),
        clients: Vec::new(),
        watchers: Vec::new(),
        fenced: Vec::new(),
        histories: BTreeMap::new(),
        last_put: BTreeMap::new(),
        auth: None,
        batch_window_us: 0,
        leases: Leases::default(),
        healed_at: None,
        removing: None,
        adding: None,
        reigns: Vec::new(),
        reigning: BTreeMap::new(),
        cover_margin_ms: 0,
        kills: KillChurn {
            rng: Rng::new(seed ^ 0x4b11_0000_0000_0002),
            every: None,
        },
        applied_max: 0,
        end: 2 * chaos + 10 * SEC,
        trace_hash: 0xcbf2_9ce4_8422_2325,
        trace: VecDeque::new(),
        failures: Vec::new(),
        events: 0,
        acked_writes: 0,
        lease_ends: 0,
    };
    world.note(format!(
        "seed {seed} faults {:?} variant {:?}",
        world.faults, options.variant
    ));
    // Batching in half the seeds, drawn apart from the main stream: writes that reach a member
    // within the window share one entry (a follower's, one forwarded batch).
    let mut batch_rng = Rng::new(seed ^ 0xba7c_0000_0000_0003);
    if batch_rng.chance(0.5) {
        world.batch_window_us = batch_rng.range(20, 1000);
        world.note(format!("batching: a {} µs window", world.batch_window_us));
        for member in &mut world.members {
            member.batch_window_us = world.batch_window_us;
        }
    }
    // The cover margin, drawn apart from the main stream: 0 (every renewal through the log),
    // 1 s, or the default, 5 s (most renewals answered from the leader's memory).
    let mut margin_rng = Rng::new(seed ^ 0xc0_7e40_0000_0005);
    world.cover_margin_ms =
        [0, 1_000, leasehold_raft::LEASE_COVER_MARGIN_DEFAULT_MS][margin_rng.below(3) as usize];
    world.note(format!("cover margin: {} ms", world.cover_margin_ms));
    for member in &mut world.members {
        member.cover_margin_ms = world.cover_margin_ms;
    }
    // Auth in 40 % of seeds, drawn apart from the main stream.
    let mut auth_rng = Rng::new(seed ^ 0xa17b_0000_0000_0001);
    if auth_rng.chance(0.4) {
        world.note("auth: an admin sets up users and turns auth on".into());
        world.auth = Some(AuthRun {
            rng: auth_rng,
            setup: auth_setup(),
            granted: false,
            bound: None,
            applied: BTreeMap::new(),
            lease_ends: BTreeSet::new(),
            writes: Vec::new(),
        });
        world.new_client(Kind::Admin, SEC);
    }
    for i in 0..world.members.len() {
        world.start_member(i);
        let first = world.rng.range(0, TICK_US);
        world.at(first, Ev::Tick(i));
    }
    for kind in [
        Kind::Kv,
        Kind::Kv,
        Kind::Kv,
        Kind::Lease,
        Kind::Lease,
        Kind::Lease,
        Kind::Lock,
        Kind::Lock,
    ] {
        let after = world.rng.range(2 * SEC, 3 * SEC);
        world.new_client(kind, after);
    }
    for _ in 0..2 {
        world.new_watcher(0);
    }
    for (every, ev) in [
        (world.faults.partition_every, Ev::Partition),
        (world.faults.crash_every, Ev::Crash),
        (world.faults.pause_every, Ev::Pause),
        (world.faults.transfer_every, Ev::Transfer),
        (world.faults.membership_every, Ev::Membership),
    ] {
        if let Some(every) = every {
            let at = world.rng.range(SEC, every * SEC + SEC);
            world.at(at, ev);
        }
    }
    world.at(chaos, Ev::Heal);
    let end = world.end;
    world.at(end, Ev::Stop);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| world.run_loop()));
    if let Err(panic) = result {
        let text = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        world
            .failures
            .push(format!("panicked at {} µs: {text}", world.now));
    } else {
        world.final_checks();
    }
    Outcome {
        seed,
        trace_hash: world.trace_hash,
        failures: world.failures,
        trace: world.trace.into_iter().collect(),
        simulated_secs: world.now as f64 / SEC as f64,
        faults: format!("{:?}", world.faults),
        stats: format!(
            "{} events, {} acked writes, {} leases ended",
            world.events, world.acked_writes, world.lease_ends
        ),
    }
}

/// The member an event runs on, if any (a stopped member runs it later).
fn target(ev: &Ev) -> Option<usize> {
    match ev {
        Ev::Tick(m)
        | Ev::Wake(m)
        | Ev::Flush(m)
        | Ev::Raft { to: m, .. }
        | Ev::Peer { to: m, .. }
        | Ev::Request { to: m, .. } => Some(*m),
        _ => None,
    }
}

impl World {
    fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            ev,
        }));
    }

    fn after(&mut self, delay: u64, ev: Ev) {
        self.at(self.now + delay, ev);
    }

    fn note(&mut self, line: String) {
        let line = format!("{:>10} {line}", self.now);
        for b in line.as_bytes().iter().chain(b"\n") {
            self.trace_hash ^= u64::from(*b);
            self.trace_hash = self.trace_hash.wrapping_mul(0x0100_0000_01b3);
        }
        self.trace.push_back(line);
        if !self.options.full_trace && self.trace.len() > TRACE_TAIL {
            self.trace.pop_front();
        }
    }

    fn instant(&self, at: u64) -> Instant {
        self.base + Duration::from_micros(at)
    }

    fn healed(&self) -> bool {
        self.healed_at.is_some()
    }

    fn run_loop(&mut self) {
        while let Some(Reverse(next)) = self.queue.pop() {
            self.now = next.at;
            self.events += 1;
            if let Some(m) = target(&next.ev)
                && self.members[m].paused_until > self.now
            {
                // Stopped: it runs the event once it is continued.
                let at = self.members[m].paused_until;
                self.at(at, next.ev);
                continue;
            }
            if matches!(next.ev, Ev::Stop) {
                self.note("stop".into());
                return;
            }
            self.handle(next.ev);
        }
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Tick(m) => {
                let mut out = Vec::new();
                self.members[m].tick(self.now, &mut out);
                self.deliver(m, out);
                let span = self.members[m].clock.true_span(TICK_US);
                self.after(span, Ev::Tick(m));
            }
            Ev::Wake(m) => {
                self.members[m].wake_at = None;
                let mut out = Vec::new();
                self.members[m].wake(self.now, &mut out);
                self.deliver(m, out);
            }
            Ev::Flush(m) => {
                let mut out = Vec::new();
                self.members[m].flush(self.now, &mut out);
                self.deliver(m, out);
            }
            Ev::Raft { to, bytes } => {
                let mut out = Vec::new();
                self.members[to].step(self.now, &bytes, &mut out);
                self.deliver(to, out);
            }
            Ev::Peer { to, msg } if !self.members[to].is_up() => {
                // The peer line to a stopped member breaks: what a follower forwarded on it
                // fails with "no leader" (`leasehold_peer`'s line), and its clients go again.
                let (from, requests) = match msg {
                    PeerMsg::ForwardBatch { from, writes } => {
                        (from, writes.into_iter().map(|(r, _)| r).collect::<Vec<_>>())
                    }
                    PeerMsg::ReadIndex { from, request } => {
                        let back = PeerMsg::ReadIndexed {
                            request,
                            index: None,
                            proof: None,
                        };
                        let delay = self.latency();
                        let to = (from - 1) as usize;
                        self.after(delay, Ev::Peer { to, msg: back });
                        return;
                    }
                    PeerMsg::Forwarded { .. } | PeerMsg::ReadIndexed { .. } => return,
                };
                for request in requests {
                    let back = PeerMsg::Forwarded {
                        request,
                        index: 0,
                        answer: Answer::Failed("no leader"),
                    };
                    let delay = self.latency();
                    let to = (from - 1) as usize;
                    self.after(delay, Ev::Peer { to, msg: back });
                }
            }
            Ev::Peer { to, msg } => {
                let mut out = Vec::new();
                self.members[to].peer(self.now, msg, &mut out);
                self.deliver(to, out);
            }
            Ev::Request { to, client, op, .. } if !self.members[to].is_up() => {
                // A stopped member refuses the connection at once.
                let delay = self.latency();
                let answer = Answer::Failed("connection refused");
                self.after(delay, Ev::Reply { client, op, answer });
            }
            Ev::Request {
                to,
                client,
                op,
                request,
            } => {
                let mut out = Vec::new();
                self.members[to].request(
                    self.now,
                    Origin::Client { client, op },
                    request,
                    &mut out,
                );
                self.deliver(to, out);
            }
            Ev::Reply { client, op, answer } => self.client_answer(client, op, Some(answer)),
            Ev::ClientTimeout { client, op } => self.client_answer(client, op, None),
            Ev::ClientWakes(c) => self.client_next(c),
            Ev::Partition => self.partition(),
            Ev::HealNetwork => {
                self.cut.clear();
                self.raft_cut.clear();
                self.note("network healed".into());
            }
            Ev::Crash => self.crash(),
            Ev::Restart(m) => self.restart(m),
            Ev::Pause => self.pause(),
            Ev::Transfer => self.transfer(),
            Ev::KillLeader => self.kill_leader(),
            Ev::Membership => self.remove_member(),
            Ev::MembershipStep => self.membership_step(),
            Ev::AddMember => self.add_member(),
            Ev::Heal => self.heal(),
            Ev::Stop => {}
            Ev::WatchPoll(w) => self.watch_poll(w),
        }
    }

    /// Schedules what a member's handling produced, and its expiry driver's next wake.
    fn deliver(&mut self, from: usize, out: Vec<Out>) {
        let applied_before = self.applied_max;
        if let Some(at) = self.members[from].next_wake(self.now) {
            // Something already due that the driver could not expire (no proposal taken during
            // a transfer): tried again after the driver's retry interval, 100 ms.
            let at = if at <= self.now {
                self.now + 100 * MS
            } else {
                at
            };
            if self.members[from].wake_at.is_none_or(|w| at < w) {
                self.members[from].wake_at = Some(at);
                self.at(at, Ev::Wake(from));
            }
        }
        for o in out {
            match o {
                Out::Raft {
                    to,
                    bytes,
                    after_sync,
                } => {
                    let to = (to - 1) as usize;
                    let sync = if after_sync {
                        self.rng
                            .range(self.faults.fsync_us.0, self.faults.fsync_us.1)
                    } else {
                        0
                    };
                    if !self.raft_cut.contains(&(from, to)) {
                        self.send(from, to, sync, true, |bytes| Ev::Raft { to, bytes }, bytes);
                    }
                }
                Out::Peer { to, msg } => {
                    let to = (to - 1) as usize;
                    // The peer line is one gRPC stream: it may break (dropping what
                    // was on it) but never delivers a message twice.
                    self.send(from, to, 0, false, |msg| Ev::Peer { to, msg }, msg);
                }
                Out::Reply {
                    to: Origin::Client { client, op },
                    answer,
                } => {
                    let delay = self.latency();
                    self.after(delay, Ev::Reply { client, op, answer });
                }
                Out::Reply {
                    to: Origin::Forwarded { .. },
                    ..
                } => unreachable!("forwarded answers travel as peer messages"),
                // Only the first apply of an entry anywhere: a restarted member replays entries
                // whose leases ended long ago (and may since have been granted again).
                Out::LeaseEnded {
                    id,
                    by_client,
                    index,
                    pos,
                } if index > applied_before => {
                    if let Some(auth) = self.auth.as_mut() {
                        auth.lease_ends.insert(((index, pos), id.get()));
                    }
                    if self.leases.ended(id.get(), self.now, by_client, index) {
                        self.lease_ends += 1;
                        self.note(format!(
                            "lease {} ended{}",
                            id.get(),
                            if by_client { " (revoked)" } else { "" }
                        ));
                    }
                }
                Out::Stamped { id, lease_ms } => {
                    self.leases.stamped(id.get(), lease_ms);
                    self.note(format!(
                        "m{} stamps lease {} at {lease_ms}",
                        from + 1,
                        id.get()
                    ));
                }
                Out::Promoted {
                    lease_ms,
                    extend_ms,
                } => {
                    if self.healed() {
                        self.reigns.push(crate::check::Reign {
                            from: self.now,
                            lease_ms,
                            extend_ms,
                            until: None,
                        });
                        self.reigning.insert(from, self.reigns.len() - 1);
                    }
                }
                Out::Demoted => self.reign_ends(from),
                Out::LeaseEnded { .. } => {}
                Out::AuthChanged { index, pos, change } => {
                    if let Some(auth) = self.auth.as_mut() {
                        auth.applied.insert((index, pos), change);
                    }
                }
                Out::FlushAt(at) => self.at(at, Ev::Flush(from)),
                Out::Note(line) => self.note(line),
            }
        }
        self.applied_max = self.applied_max.max(self.members[from].machine.applied().0);
    }

    fn final_checks(&mut self) {
        // Settle: no clients, no faults, until every member has applied what the leader did.
        let mut rounds = 0;
        while rounds < 200 && !self.settled() {
            rounds += 1;
            let until = self.now + 100 * MS;
            while let Some(Reverse(next)) = self.queue.pop() {
                if next.at > until {
                    self.queue.push(Reverse(next));
                    break;
                }
                self.now = next.at;
                if !matches!(
                    next.ev,
                    Ev::ClientWakes(_)
                        | Ev::Request { .. }
                        | Ev::Transfer
                        | Ev::KillLeader
                        | Ev::Stop
                ) {
                    self.handle(next.ev);
                }
            }
            self.now = until;
        }
        for m in 0..self.members.len() {
            let line = match self.members[m].status() {
                Some(s) => format!(
                    "m{}: term {} leader {} commit {} applied {} last {} voters {:?}",
                    m + 1,
                    s.term,
                    s.leader,
                    s.commit,
                    s.applied,
                    s.last_index,
                    self.members[m].machine.voters()
                ),
                None => format!("m{}: down", m + 1),
            };
            self.note(line);
        }
        let in_membership = self.up_members();
        let up: Vec<&Member> = in_membership.iter().map(|m| &self.members[*m]).collect();
        if let Err(e) = converged(&up) {
            self.failures.push(e);
        }
        // The converged store is a last read of every key.
        let reader = up.first().map(|m| {
            self.histories
                .keys()
                .map(|k| {
                    let kvs = m.machine.store().range(&leasehold_mvcc::RangeRequest {
                        key: k.clone().into_bytes(),
                        ..Default::default()
                    });
                    kvs.ok()
                        .and_then(|r| r.kvs.into_iter().next())
                        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
                })
                .collect::<Vec<_>>()
        });
        if let Some(values) = reader {
            let at = self.instant(self.now);
            for (events, value) in self.histories.values_mut().zip(values) {
                events.push(HEvent {
                    client: usize::MAX,
                    op: HOp::Get,
                    invoked: at,
                    completed: Some((at, history::Answer::Value(value))),
                });
            }
        }
        self.failures.extend(check_histories(&self.histories));
        if let Some(auth) = &self.auth {
            self.failures
                .extend(check_auth(&auth.applied, &auth.lease_ends, &auth.writes));
        }
        if let Some(m) = up.first() {
            self.failures
                .extend(check_fenced(m.machine.store(), LOCK_KEY, &self.fenced));
        }
        if let Some(m) = up.first() {
            for (w, watcher) in self.watchers.iter().enumerate() {
                let Some(last) = watcher.seen.last().map(|e| e.0) else {
                    continue;
                };
                let want: Vec<WatchedEvent> = m
                    .machine
                    .store()
                    .events(watcher.start, last, usize::MAX)
                    .expect("the simulator's stores release no value")
                    .iter()
                    .map(watched)
                    .collect();
                if let Some(i) = (0..want.len().max(watcher.seen.len()))
                    .find(|i| want.get(*i) != watcher.seen.get(*i))
                {
                    self.failures.push(format!(
                        "watcher {w} (from revision {}) saw {} events; the store's history from there has {}; first difference at event {i}: saw {:?}, history {:?}",
                        watcher.start,
                        watcher.seen.len(),
                        want.len(),
                        watcher.seen.get(i),
                        want.get(i)
                    ));
                }
            }
        }
        let tolerance =
            |ttl_us: u64| 2 * self.faults.drift_ppm_max as u64 * (ttl_us + 30 * SEC) / 1_000_000;
        self.failures.extend(self.leases.check(
            &self.reigns,
            self.healed_at,
            self.now,
            self.cover_margin_ms,
            1_500 * MS,
            tolerance,
        ));
        if self.failures.is_empty() {
            self.note("all checks pass".into());
        } else {
            let failures = self.failures.clone();
            for f in failures {
                self.note(format!("FAILED: {f}"));
            }
        }
    }
}
