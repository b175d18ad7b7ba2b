//! The event loop: simulated time, the network between members, faults drawn from the seed,
//! and the clients. Everything happens at a simulated microsecond, in (time, sequence) order;
//! every random choice comes from the run's one generator.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use leasehold_auth::{AuthChange, AuthError, PermKind, Permission, ROOT};
use leasehold_history::{self as history, Event as HEvent, Op as HOp};
use leasehold_lease::LeaseId;
use leasehold_mvcc::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp,
    ResponseOp, TxnRequest,
};
use leasehold_raft::steps;
use leasehold_raft::{Applied, AuthWrite, LeaseGrant, LeaseRenew, LeaseRevoke, Write};
use leasehold_wal::{Crash, MemFs};

use crate::check::{Leases, LogPos, check_auth, check_fenced, check_histories, converged};
use crate::disk::SimFs;
use crate::member::{Answer, Clock, Member, Origin, Out, PeerMsg, Request, TICK_US};
use crate::rng::Rng;
use crate::{Options, Variant, WAL_DIR};

const SEC: u64 = 1_000_000;
const MS: u64 = 1_000;
/// A client gives up on an answer after this long (the outcome of a write is then unknown).
const CLIENT_TIMEOUT: u64 = 1_500 * MS;
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

/// The fault mix of one seed (swarm testing: each seed draws its own).
#[derive(Clone, Debug)]
struct Faults {
    members: usize,
    latency_us: (u64, u64),
    drop: f64,
    dup: f64,
    fsync_us: (u64, u64),
    /// Mean seconds between faults of each kind; `None`: never.
    partition_every: Option<u64>,
    crash_every: Option<u64>,
    pause_every: Option<u64>,
    transfer_every: Option<u64>,
    membership_every: Option<u64>,
    torn_crashes: bool,
    bit_flips: bool,
    drift_ppm_max: i64,
}

impl Faults {
    fn draw(rng: &mut Rng) -> Faults {
        let sometimes =
            |rng: &mut Rng, p: f64, lo: u64, hi: u64| rng.chance(p).then(|| rng.range(lo, hi));
        let members = if rng.chance(0.25) { 5 } else { 3 };
        // Sometimes a fast network and disk, where a commit takes well under a millisecond.
        let fast = rng.chance(0.3);
        let lat_max = if fast {
            rng.range(150, 400)
        } else {
            rng.range(1, 40) * MS
        };
        Faults {
            members,
            latency_us: (100, lat_max),
            drop: if rng.chance(0.6) {
                rng.fraction() * 0.1
            } else {
                0.0
            },
            dup: if rng.chance(0.4) {
                rng.fraction() * 0.05
            } else {
                0.0
            },
            fsync_us: if fast {
                (20, rng.range(30, 200))
            } else {
                (50, rng.range(100, 10 * MS))
            },
            partition_every: sometimes(rng, 0.6, 2, 10),
            crash_every: sometimes(rng, 0.6, 2, 10),
            pause_every: sometimes(rng, 0.4, 3, 12),
            transfer_every: sometimes(rng, 0.4, 2, 8),
            membership_every: sometimes(rng, 0.3, 3, 10),
            torn_crashes: rng.chance(0.5),
            bit_flips: rng.chance(0.2),
            drift_ppm_max: if rng.chance(0.4) {
                0
            } else {
                rng.range(1, 100) as i64
            },
        }
    }
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Kv,
    Lease,
    /// A lease holder that takes the one lock (`LOCK_KEY`) and writes behind it with fencing.
    Lock,
    /// In auth seeds: sets up users and roles, turns auth on, then grants and revokes the KV
    /// clients' permission, as root.
    Admin,
}

/// The KV clients' user and role in auth seeds, and the keys the role's permission covers.
const KV_USER: &str = "app";
const KV_ROLE: &str = "kv";
const KV_PERM: (&[u8], &[u8]) = (b"k", b"l");

/// The auth store's setup, in order: root with the root role, the KV clients' role and user,
/// then auth on. The permission itself comes and goes afterwards.
fn auth_setup() -> VecDeque<AuthChange> {
    let user = |name: &str| AuthChange::UserAdd {
        name: name.into(),
        password_hash: None,
    };
    VecDeque::from([
        user(ROOT),
        AuthChange::UserGrantRole {
            user: ROOT.into(),
            role: ROOT.into(),
        },
        AuthChange::RoleAdd {
            name: KV_ROLE.into(),
        },
        user(KV_USER),
        AuthChange::UserGrantRole {
            user: KV_USER.into(),
            role: KV_ROLE.into(),
        },
        kv_permission(true, None),
        AuthChange::Enable,
    ])
}

/// The change that grants (or revokes) the KV role's read-write permission on the KV keys.
/// `bound`: the grant lives with this lease (leasehold's grants bound to leases).
fn kv_permission(grant: bool, bound: Option<LeaseId>) -> AuthChange {
    let (key, range_end) = (KV_PERM.0.to_vec(), KV_PERM.1.to_vec());
    if grant {
        AuthChange::RoleGrantPermission {
            role: KV_ROLE.into(),
            perm: Permission {
                kind: PermKind::ReadWrite,
                key,
                range_end,
                lease: bound.map(LeaseId::get),
            },
        }
    } else {
        AuthChange::RoleRevokePermission {
            role: KV_ROLE.into(),
            key,
            range_end,
        }
    }
}

/// An auth seed's state: the admin's script, and what the auth checker needs.
struct AuthRun {
    /// The admin's own draws, so that seeds without auth draw exactly as before.
    rng: Rng,
    setup: VecDeque<AuthChange>,
    /// Whether the KV permission is granted, as far as the admin knows.
    granted: bool,
    /// The lease the next or current grant is bound to, if it is bound to one.
    bound: Option<BoundGrant>,
    /// Every auth change applied, by log position (from whichever member applied it).
    applied: BTreeMap<LogPos, AuthChange>,
    /// Every lease that ended, by the log position that ended it (a grant bound to it ends
    /// there).
    lease_ends: BTreeSet<(LogPos, i64)>,
    /// Every KV write answered: its log position and whether auth let it through.
    writes: Vec<(LogPos, Result<(), AuthError>)>,
}

/// A grant bound to the admin's lease: the lease is granted first, the permission bound to it,
/// then the admin renews it a few times and lets it expire, which takes the grant with it.
#[derive(Clone, Copy, Debug)]
struct BoundGrant {
    id: LeaseId,
    leased: bool,
    renewals_left: u32,
}

/// The admin's lease's TTL.
const ADMIN_LEASE_TTL: i64 = 2;

/// The lock the lock clients share, and the key its holder writes, fenced by the lock key's
/// create revision (docs/locks.md's recipe).
/// Keys a KV client writes in each 2 s window.
const KV_KEYS: u64 = 4;
const LOCK_KEY: &[u8] = b"lock/a";
const FENCED_KEY: &[u8] = b"fenced/a";

/// Kill churn once healed: `every` is the period at which the leader is killed and restarted, in
/// the seeds that have it (`None` in the others, which move the leader every 3 s instead).
struct KillChurn {
    /// Its own draws, so that seeds without it draw exactly as before.
    rng: Rng,
    every: Option<u64>,
}

/// A lease client's one lease.
#[derive(Clone, Copy, Debug)]
struct Held {
    id: LeaseId,
    ttl_secs: i64,
    granted: bool,
}

struct Client {
    kind: Kind,
    member: usize,
    /// The op in flight: its number, what it is, when it was sent.
    pending: Option<(u64, ClientOp, u64)>,
    next_op: u64,
    held: Option<Held>,
    dead: bool,
    written: u64,
    /// A lock client's fencing token: the create revision of its lock key.
    token: Option<i64>,
    /// When its lease was last renewed (or granted).
    renewed_at: u64,
    /// It paused past its TTL while holding the lock and now writes with its old token.
    zombie: bool,
    /// A lease client that lives on after the faults stop, renewing through the leader changes
    /// (its lease must never be lost, `check::Leases::check`).
    keeper: bool,
}

#[derive(Clone, Debug)]
enum ClientOp {
    Put {
        key: String,
        value: String,
        history: usize,
    },
    /// Sets `new` if the key's value is `expected` (a txn).
    Cas {
        key: String,
        expected: String,
        new: String,
        history: usize,
    },
    /// A read of one key or of a window's keys: each key it covers, with its history event.
    Read {
        span: (Vec<u8>, Vec<u8>),
        keys: Vec<(String, usize)>,
        linearizable: bool,
    },
    Grant(Held),
    /// An admin's auth change.
    Admin(AuthChange),
    /// The admin's lease for a bound grant, granted ...
    AdminLease(LeaseId),
    /// ... and kept alive a while.
    AdminRenew(LeaseId),
    AttachKey(LeaseId),
    Renew(LeaseId),
    Revoke(LeaseId),
    /// Creates the lock key on the lease if nobody holds it; else reads who does.
    Acquire(LeaseId),
    /// Writes the fenced key if the lock key still has this create revision.
    Fenced(i64),
    /// Deletes the lock key if it still has this create revision.
    Release(i64),
}

/// A watch on every key from a revision, served by one member from its applied store (as the
/// server's watch streams pull `Store::events`), moving to another member when its member
/// goes down and resuming after the last revision it saw.
struct Watcher {
    member: usize,
    start: i64,
    next: i64,
    seen: Vec<WatchedEvent>,
}

/// The lock key's create revision is `revision` (0: the key does not exist).
fn created_at(revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal,
        target: CompareTarget::Create(revision),
        key: LOCK_KEY.to_vec(),
        range_end: Vec::new(),
    }
}

/// What a watcher is shown of one event: revision, key, and the value (`None`: a delete).
type WatchedEvent = (i64, Vec<u8>, Option<Vec<u8>>);

fn watched(event: &leasehold_mvcc::Event) -> WatchedEvent {
    let value = match event.kind {
        leasehold_mvcc::EventKind::Put => Some(event.kv.value.clone()),
        leasehold_mvcc::EventKind::Delete => None,
    };
    (event.kv.mod_revision, event.kv.key.clone(), value)
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
                    PeerMsg::Forward { from, request, .. } => (from, vec![request]),
                    PeerMsg::ForwardBatch { from, writes } => {
                        (from, writes.into_iter().map(|(r, _)| r).collect())
                    }
                    PeerMsg::ReadIndex { from, request } => {
                        let back = PeerMsg::ReadIndexed {
                            request,
                            index: None,
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
                    self.send(from, to, sync, true, |bytes| Ev::Raft { to, bytes }, bytes);
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

    fn latency(&mut self) -> u64 {
        let (lo, hi) = self.faults.latency_us;
        // Mostly short, sometimes long: the square of a uniform draw.
        let f = self.rng.fraction();
        lo + ((hi - lo) as f64 * f * f) as u64
    }

    /// A message over the network between members: cut links drop it; otherwise it may be
    /// dropped, duplicated (if `may_repeat`: Raft's messages, which raft-rs must take twice), and
    /// is delayed (which reorders).
    fn send<T: Clone>(
        &mut self,
        from: usize,
        to: usize,
        extra: u64,
        may_repeat: bool,
        ev: impl Fn(T) -> Ev,
        payload: T,
    ) {
        if from == to || self.cut.contains(&(from, to)) {
            return;
        }
        if !self.healed() && self.rng.chance(self.faults.drop) {
            return;
        }
        let copies = if may_repeat && !self.healed() && self.rng.chance(self.faults.dup) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = extra + self.latency();
            self.after(delay, ev(payload.clone()));
        }
    }

    fn start_member(&mut self, m: usize) {
        match self.members[m].start() {
            Ok(()) => self.note(format!("m{} started", m + 1)),
            Err(e) => {
                self.note(format!("m{} refuses to start: {e}", m + 1));
                self.members[m].refused = Some(e);
            }
        }
    }

    fn partition(&mut self) {
        if self.healed() {
            return;
        }
        let n = self.members.len();
        let one = self.rng.below(n as u64) as usize;
        let leader = self.members.iter().find_map(|mm| {
            mm.status()
                .filter(|s| s.is_leader)
                .map(|s| (s.id - 1) as usize)
        });
        match self.rng.below(3) {
            0 => {
                for other in 0..n {
                    if other != one {
                        self.cut.insert((one, other));
                        self.cut.insert((other, one));
                    }
                }
                self.note(format!("partition: m{} isolated", one + 1));
            }
            1 => {
                for other in 0..n {
                    if other != one {
                        self.cut.insert((one, other));
                    }
                }
                self.note(format!("partition: m{} can receive but not send", one + 1));
            }
            _ => {
                if let Some(l) = leader.filter(|l| *l != one) {
                    self.cut.insert((l, one));
                    self.cut.insert((one, l));
                    self.note(format!(
                        "partition: m{} cut off from the leader m{} only",
                        one + 1,
                        l + 1
                    ));
                }
            }
        }
        let lasts = self.rng.range(SEC / 2, 4 * SEC);
        self.after(lasts, Ev::HealNetwork);
        let every = self.faults.partition_every.expect("scheduled");
        let next = self.rng.range(lasts + SEC / 2, lasts + every * SEC);
        self.after(next, Ev::Partition);
    }

    fn crash(&mut self) {
        if self.healed() {
            return;
        }
        let m = self.rng.below(self.members.len() as u64) as usize;
        if self.members[m].is_up() {
            self.members[m].crash();
            let crash = if self.faults.torn_crashes {
                Crash::TearSectors(self.rng.next_u64())
            } else {
                Crash::LoseUnsynced
            };
            self.members[m].disk.mem().crash(crash);
            self.note(format!("m{} crashed ({crash:?})", m + 1));
            let down = self.rng.range(SEC / 5, 3 * SEC);
            self.after(down, Ev::Restart(m));
        }
        let every = self.faults.crash_every.expect("scheduled");
        let next = self.rng.range(SEC / 2, every * SEC);
        self.after(next, Ev::Crash);
    }

    fn restart(&mut self, m: usize) {
        if self.members[m].is_up() || self.members[m].refused.is_some() || self.members[m].removed {
            return;
        }
        // At most one member ever gets a rotten log, and only where no member is ever removed,
        // so a quorum always has intact ones.
        if self.faults.bit_flips
            && !self.healed()
            && self.faults.membership_every.is_none()
            && self.members.iter().all(|mm| mm.refused.is_none())
            && m == 0
            && self.rng.chance(0.5)
        {
            self.flip_bit(m);
        }
        self.start_member(m);
    }

    fn flip_bit(&mut self, m: usize) {
        let fs = self.members[m].disk.mem().clone();
        let dir = Path::new(WAL_DIR);
        let Ok(names) = leasehold_wal::Fs::list(&fs, dir) else {
            return;
        };
        if names.is_empty() {
            return;
        }
        let name = &names[self.rng.below(names.len() as u64) as usize];
        let path = dir.join(name);
        let Some(contents) = fs.contents(&path) else {
            return;
        };
        // Somewhere in what was written (the zero-filled tail is not data).
        let used = contents.iter().rposition(|b| *b != 0).unwrap_or(0);
        if used == 0 {
            return;
        }
        let byte = self.rng.below(used as u64 + 1) as usize;
        let bit = self.rng.below(8) as u8;
        fs.flip_bit(&path, byte, bit);
        self.note(format!(
            "m{}: bit {bit} of byte {byte} of {name} flipped",
            m + 1
        ));
    }

    fn pause(&mut self) {
        if self.healed() {
            return;
        }
        let m = self.rng.below(self.members.len() as u64) as usize;
        let lasts = self.rng.range(SEC / 5, 3 * SEC);
        self.members[m].paused_until = self.now + lasts;
        self.note(format!("m{} paused for {} ms", m + 1, lasts / MS));
        let every = self.faults.pause_every.expect("scheduled");
        let next = self.rng.range(lasts, lasts + every * SEC);
        self.after(next, Ev::Pause);
    }

    fn leader(&self) -> Option<usize> {
        self.members.iter().find_map(|mm| {
            mm.status()
                .filter(|s| s.is_leader)
                .map(|s| (s.id - 1) as usize)
        })
    }

    /// In half the seeds whose members are all up and whose membership is settled at heal, the
    /// leader is then killed and restarted every `3 × the longest election timeout + 0.2 to 2 s`
    /// (3: `Options::kill_churn_timeouts`):
    /// the longest election a kill can cause (two timeouts: the first candidate may be refused
    /// by a member that still heard the old leader, or have too short a log), plus what the new
    /// leader leaves each lease (the election timeout), plus time to commit. A dead holder's
    /// lease then still ends within the checked bound (`final_checks`). Churn faster than that can
    /// give a lease that is due the promotion's grace again and again, each leader gone before
    /// the grace runs out (docs/lease.md).
    fn choose_kill_churn(&mut self) {
        let chosen = self.kills.rng.chance(0.5);
        let extra = self.kills.rng.range(SEC / 5, 2 * SEC);
        let settled = self.removing.is_none()
            && self.adding.is_none()
            && self
                .members
                .iter()
                .all(|m| m.removed || (m.is_up() && m.refused.is_none()));
        if chosen && settled {
            let et = self.longest_election_timeout();
            let every = self.options.kill_churn_timeouts * et + extra;
            self.kills.every = Some(every);
            self.note(format!(
                "kill churn: the leader is killed every {} ms",
                every / MS
            ));
        }
    }

    fn longest_election_timeout(&self) -> u64 {
        self.members
            .iter()
            .map(|m| m.election_timeout_ms())
            .max()
            .unwrap_or(0)
            * MS
    }

    /// Kill churn: kill -9 the leader (losing what it had not synced) and start it again a little
    /// later, as `cluster.rs` did with real processes.
    fn kill_leader(&mut self) {
        let Some(every) = self.kills.every else {
            return;
        };
        if self.now > self.end.saturating_sub(8 * SEC) {
            return;
        }
        if let Some(l) = self.leader() {
            self.members[l].crash();
            self.reign_ends(l);
            let crash = if self.faults.torn_crashes {
                Crash::TearSectors(self.kills.rng.next_u64())
            } else {
                Crash::LoseUnsynced
            };
            self.members[l].disk.mem().crash(crash);
            self.note(format!("leader m{} killed ({crash:?})", l + 1));
            let down = self.kills.rng.range(SEC / 5, SEC);
            self.after(down, Ev::Restart(l));
        }
        self.after(every, Ev::KillLeader);
    }

    /// Member `m` stopped timing leases (demoted or killed).
    fn reign_ends(&mut self, m: usize) {
        if let Some(r) = self.reigning.remove(&m) {
            self.reigns[r].until = Some(self.now);
        }
    }

    /// MoveLeader to another member: in chaos at the drawn rate, and every 3 s once healed (a
    /// leader change for each lease to live through).
    fn transfer(&mut self) {
        let end_of_transfers = self.end.saturating_sub(8 * SEC);
        if self.now > end_of_transfers || (self.healed() && self.kills.every.is_some()) {
            return;
        }
        if let Some(l) = self.leader() {
            let n = self.members.len() as u64;
            let to = (l + 1 + self.rng.below(n - 1) as usize) % n as usize;
            if self.members[to].is_up() {
                self.note(format!("move leader m{} -> m{}", l + 1, to + 1));
                let mut out = Vec::new();
                self.members[l].transfer(self.now, to as u64 + 1, &mut out);
                self.deliver(l, out);
            }
        }
        let next = match (self.healed(), self.faults.transfer_every) {
            (true, _) => 3 * SEC,
            (false, Some(every)) => self.rng.range(SEC, every * SEC),
            (false, None) => return,
        };
        self.after(next, Ev::Transfer);
    }

    /// The leader removes a voter that is neither itself nor down: docs/testing.md.
    fn remove_member(&mut self) {
        let every = self.faults.membership_every.expect("scheduled");
        if self.healed() {
            return;
        }
        if self.removing.is_none()
            && self.adding.is_none()
            && let Some(l) = self.leader()
        {
            let voters = self.members[l].machine.voters();
            let candidates: Vec<usize> = voters
                .iter()
                .map(|id| (*id - 1) as usize)
                .filter(|m| *m != l && self.members[*m].is_up())
                .collect();
            // Only with every voter up (as an operator would): removing one while another is
            // down can leave no quorum once the down one is lost for good.
            let all_up = voters
                .iter()
                .all(|id| self.members[(*id - 1) as usize].is_up());
            if voters.len() >= 3 && all_up && !candidates.is_empty() {
                let gone = candidates[self.rng.below(candidates.len() as u64) as usize];
                let mut out = Vec::new();
                let kind = leasehold_consensus::eraftpb::ConfChangeType::RemoveNode;
                if self.members[l].change_membership(self.now, kind, gone as u64 + 1, &mut out) {
                    self.note(format!("m{} proposes to remove m{}", l + 1, gone + 1));
                    self.removing = Some((gone, self.now));
                    self.after(200 * MS, Ev::MembershipStep);
                }
                self.deliver(l, out);
            }
        }
        let next = self.rng.range(SEC, every * SEC);
        self.after(next, Ev::Membership);
    }

    fn membership_step(&mut self) {
        let Some((gone, since)) = self.removing else {
            return;
        };
        let applied = self.members.iter().filter(|m| m.is_up()).any(|m| {
            m.status().is_some_and(|s| s.is_leader)
                && !m.machine.voters().contains(&(gone as u64 + 1))
        });
        if applied {
            // The removed member stops for good; its disk goes with it.
            self.members[gone].crash();
            self.members[gone].removed = true;
            self.removing = None;
            self.note(format!("m{} is removed", gone + 1));
            let after = self.rng.range(SEC / 2, 2 * SEC);
            self.after(after, Ev::AddMember);
        } else if self.now.saturating_sub(since) > 10 * SEC {
            // Never committed (a leader change dropped it): no longer waited for.
            self.note(format!("the removal of m{} did not happen", gone + 1));
            self.removing = None;
        } else {
            self.after(200 * MS, Ev::MembershipStep);
        }
    }

    /// A new member, with an empty disk and no membership, is started and added: as a voter, or
    /// as a learner first and promoted once in sync (`steps::learner_in_sync`, the rule
    /// MemberPromote applies).
    fn add_member(&mut self) {
        let (new, as_learner) = match self.adding {
            Some((m, _, as_learner)) => (m, as_learner),
            None => {
                let id = self.members.len() as u64 + 1;
                let disk = if self.options.variant == Variant::AckBeforeFsync {
                    SimFs::Lying(MemFs::new())
                } else {
                    SimFs::Honest(MemFs::new())
                };
                let clock = Clock {
                    rate_ppm: 0,
                    offset_us: self.rng.range(0, 1000 * SEC),
                };
                let election_tick = self.rng.range(10, 15) as usize;
                let member = Member::new(
                    id,
                    &[],
                    disk,
                    clock,
                    election_tick,
                    self.options.variant,
                    self.base,
                );
                self.members.push(member);
                let m = self.members.len() - 1;
                self.members[m].batch_window_us = self.batch_window_us;
                self.members[m].cover_margin_ms = self.cover_margin_ms;
                self.start_member(m);
                let first = self.rng.range(0, TICK_US);
                self.after(first, Ev::Tick(m));
                let as_learner = self.rng.chance(0.5);
                self.adding = Some((m, self.now, as_learner));
                (m, as_learner)
            }
        };
        let id = new as u64 + 1;
        if let Some(l) = self.leader() {
            if self.members[l].machine.voters().contains(&id) {
                self.note(format!("m{id} is added"));
                self.adding = None;
                return;
            }
            use leasehold_consensus::eraftpb::ConfChangeType;
            let (kind, what) = if self.members[l].machine.learners().contains(&id) {
                let core = self.members[l].core.as_ref();
                let leader_match = core.and_then(|c| c.matched(l as u64 + 1));
                let learner_match = core.and_then(|c| c.matched(id));
                match leader_match {
                    Some(leader) if steps::learner_in_sync(leader, learner_match) => {
                        (Some(ConfChangeType::AddNode), "promote")
                    }
                    _ => (None, ""),
                }
            } else if as_learner {
                (Some(ConfChangeType::AddLearnerNode), "add as a learner")
            } else {
                (Some(ConfChangeType::AddNode), "add")
            };
            if let Some(kind) = kind {
                let mut out = Vec::new();
                if self.members[l].change_membership(self.now, kind, id, &mut out) {
                    self.note(format!("m{} proposes to {what} m{id}", l + 1));
                }
                self.deliver(l, out);
            }
        }
        self.after(500 * MS, Ev::AddMember);
    }

    /// The faults stop: the network heals, stopped members continue, crashed ones restart;
    /// every lease client dies a second later, and leaders change every 3 s.
    fn heal(&mut self) {
        self.healed_at = Some(self.now);
        self.cut.clear();
        self.note("heal: faults stop".into());
        for m in 0..self.members.len() {
            self.members[m].paused_until = self.members[m].paused_until.min(self.now);
            if !self.members[m].is_up()
                && self.members[m].refused.is_none()
                && !self.members[m].removed
            {
                self.start_member(m);
            }
        }
        // Half the lease clients keep their leases through what follows (drawn apart from the
        // main stream); the others die a second from now.
        for c in 0..self.clients.len() {
            if self.clients[c].kind == Kind::Lease
                && !self.clients[c].dead
                && self.keep_rng.chance(0.5)
            {
                self.clients[c].keeper = true;
                if let Some(held) = self.clients[c].held {
                    self.leases.kept(held.id.get());
                }
            }
        }
        self.choose_kill_churn();
        if self.kills.every.is_some() {
            self.after(3 * SEC, Ev::KillLeader);
        } else if self.faults.transfer_every.is_none() {
            self.after(3 * SEC, Ev::Transfer);
        }
        // And a watch from a past revision, as a client that reconnects asks for one.
        let current = self
            .members
            .iter()
            .map(|m| m.machine.store().current_revision())
            .max()
            .unwrap_or(1);
        let start = self.rng.range(1, current.max(1) as u64 + 1) as i64;
        self.new_watcher(start);
    }

    // ---- clients ----

    fn client_next(&mut self, c: usize) {
        let client = &self.clients[c];
        if client.dead || client.pending.is_some() {
            return;
        }
        if self.now + 4 * SEC > self.end {
            return;
        }
        if !matches!(client.kind, Kind::Kv | Kind::Admin)
            && !client.keeper
            && let Some(healed) = self.healed_at
            && self.now > healed + SEC
        {
            self.client_dies(c);
            return;
        }
        if client.kind == Kind::Lease
            && !self.healed()
            && client.held.is_some_and(|h| h.granted)
            && self.rng.chance(0.02)
        {
            // The holder dies mid-run; another client takes its place.
            self.client_dies(c);
            self.new_client(Kind::Lease, SEC);
            return;
        }
        let client = &self.clients[c];
        let op = match client.kind {
            Kind::Kv => self.kv_op(c),
            Kind::Lease => self.lease_op(c),
            Kind::Lock => self.lock_op(c),
            Kind::Admin => self.admin_op(),
        };
        let request = match &op {
            ClientOp::Put { key, value, .. } => Request::Write(Write::Put(PutRequest {
                key: key.clone().into_bytes(),
                value: value.clone().into_bytes(),
                ..PutRequest::default()
            })),
            ClientOp::Cas {
                key, expected, new, ..
            } => Request::Write(Write::Txn(TxnRequest {
                compare: vec![Compare {
                    result: CompareResult::Equal,
                    target: CompareTarget::Value(expected.clone().into_bytes()),
                    key: key.clone().into_bytes(),
                    range_end: Vec::new(),
                }],
                success: vec![RequestOp::Put(PutRequest {
                    key: key.clone().into_bytes(),
                    value: new.clone().into_bytes(),
                    ..PutRequest::default()
                })],
                failure: Vec::new(),
            })),
            ClientOp::Read {
                span: (key, range_end),
                linearizable,
                ..
            } => Request::Range {
                key: key.clone(),
                range_end: range_end.clone(),
                linearizable: *linearizable,
            },
            ClientOp::Admin(change) => Request::Write(Write::Auth(AuthWrite {
                caller: None,
                change: change.clone(),
            })),
            ClientOp::AdminLease(id) => Request::Write(Write::LeaseGrant(LeaseGrant {
                id: *id,
                ttl_secs: ADMIN_LEASE_TTL,
            })),
            ClientOp::AdminRenew(id) => Request::Write(Write::LeaseRenew(LeaseRenew { id: *id })),
            ClientOp::Grant(held) => Request::Write(Write::LeaseGrant(LeaseGrant {
                id: held.id,
                ttl_secs: held.ttl_secs,
            })),
            ClientOp::AttachKey(id) => Request::Write(Write::Put(PutRequest {
                key: format!("lease/{}", id.get()).into_bytes(),
                value: b"held".to_vec(),
                lease: Some(*id),
                ..PutRequest::default()
            })),
            ClientOp::Renew(id) => Request::Write(Write::LeaseRenew(LeaseRenew { id: *id })),
            ClientOp::Revoke(id) => Request::Write(Write::LeaseRevoke(LeaseRevoke { id: *id })),
            ClientOp::Acquire(id) => Request::Write(Write::Txn(TxnRequest {
                compare: vec![created_at(0)],
                success: vec![RequestOp::Put(PutRequest {
                    key: LOCK_KEY.to_vec(),
                    value: format!("client {c}").into_bytes(),
                    lease: Some(*id),
                    ..PutRequest::default()
                })],
                failure: vec![RequestOp::Range(RangeRequest {
                    key: LOCK_KEY.to_vec(),
                    ..RangeRequest::default()
                })],
            })),
            ClientOp::Fenced(token) => {
                self.clients[c].written += 1;
                Request::Write(Write::Txn(TxnRequest {
                    compare: vec![created_at(*token)],
                    success: vec![RequestOp::Put(PutRequest {
                        key: FENCED_KEY.to_vec(),
                        value: format!("c{c}-{}", self.clients[c].written).into_bytes(),
                        ..PutRequest::default()
                    })],
                    failure: Vec::new(),
                }))
            }
            ClientOp::Release(token) => Request::Write(Write::Txn(TxnRequest {
                compare: vec![created_at(*token)],
                success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
                    key: LOCK_KEY.to_vec(),
                    ..DeleteRangeRequest::default()
                })],
                failure: Vec::new(),
            })),
        };
        // In auth seeds, KV clients write as their user, the others as root.
        let request = match (request, &self.auth) {
            (Request::Write(write), Some(_)) => {
                let user = if self.clients[c].kind == Kind::Kv {
                    KV_USER
                } else {
                    ROOT
                };
                Request::WriteAs(user, write)
            }
            (request, _) => request,
        };
        let client = &mut self.clients[c];
        client.next_op += 1;
        let n = client.next_op;
        let to = client.member;
        client.pending = Some((n, op.clone(), self.now));
        let delay = self.latency();
        self.after(
            delay,
            Ev::Request {
                to,
                client: c,
                op: n,
                request,
            },
        );
        self.after(CLIENT_TIMEOUT, Ev::ClientTimeout { client: c, op: n });
    }

    /// A watcher from `start` (0: from the member's next revision), on a random member.
    fn new_watcher(&mut self, start: i64) {
        let member = self.rng.below(self.members.len() as u64) as usize;
        let start = if start > 0 {
            start
        } else {
            self.members[member].machine.store().current_revision() + 1
        };
        self.watchers.push(Watcher {
            member,
            start,
            next: start,
            seen: Vec::new(),
        });
        let w = self.watchers.len() - 1;
        self.after(SEC, Ev::WatchPoll(w));
    }

    fn watch_poll(&mut self, w: usize) {
        let m = self.watchers[w].member;
        if !self.members[m].is_up() {
            // Its stream broke: it watches again on another member, from where it was.
            let n = self.members.len() as u64;
            self.watchers[w].member = self.rng.below(n) as usize;
            self.note(format!(
                "watcher {w} moves to m{}",
                self.watchers[w].member + 1
            ));
        } else if self.members[m].paused_until <= self.now {
            let store = self.members[m].machine.store();
            let current = store.current_revision();
            let next = self.watchers[w].next;
            if current >= next {
                let events: Vec<WatchedEvent> = store
                    .events(next, current, usize::MAX)
                    .iter()
                    .map(watched)
                    .collect();
                self.watchers[w].seen.extend(events);
                self.watchers[w].next = current + 1;
            }
        }
        let again = self.rng.range(10 * MS, 100 * MS);
        self.after(again, Ev::WatchPoll(w));
    }

    fn client_dies(&mut self, c: usize) {
        self.clients[c].dead = true;
        if let Some(held) = self.clients[c].held {
            self.leases.holder_died(held.id.get(), self.now);
            self.note(format!("client {c} dies holding lease {}", held.id.get()));
        }
    }

    fn new_client(&mut self, kind: Kind, after: u64) {
        let member = self.rng.below(self.members.len() as u64) as usize;
        self.clients.push(Client {
            kind,
            member,
            pending: None,
            next_op: 0,
            held: None,
            dead: false,
            written: 0,
            token: None,
            renewed_at: 0,
            zombie: false,
            keeper: false,
        });
        let c = self.clients.len() - 1;
        self.after(after, Ev::ClientWakes(c));
    }

    /// The admin's next change: the setup's next step, then the KV permission turned over.
    /// Then, in turn: a plain grant that is later revoked, or a grant bound to a lease that the
    /// admin renews a few times and then lets expire.
    fn admin_op(&mut self) -> ClientOp {
        let auth = self.auth.as_mut().expect("an auth seed");
        if let Some(change) = auth.setup.front() {
            return ClientOp::Admin(change.clone());
        }
        match (auth.granted, auth.bound) {
            (true, Some(b)) if b.renewals_left > 0 => ClientOp::AdminRenew(b.id),
            (true, Some(_)) => {
                // Let go long enough ago for the lease, and the grant with it, to be gone (a
                // leader change extends a lease by its election timeout): grant again.
                auth.granted = false;
                auth.bound = None;
                self.admin_op()
            }
            (true, None) => ClientOp::Admin(kv_permission(false, None)),
            (false, Some(b)) if b.leased => ClientOp::Admin(kv_permission(true, Some(b.id))),
            (false, Some(b)) => ClientOp::AdminLease(b.id),
            (false, None) => {
                if auth.rng.chance(0.5) {
                    let id = LeaseId::from_wire(auth.rng.range(1, i64::MAX as u64) as i64)
                        .expect("not zero");
                    auth.bound = Some(BoundGrant {
                        id,
                        leased: false,
                        renewals_left: auth.rng.range(0, 4) as u32,
                    });
                    ClientOp::AdminLease(id)
                } else {
                    ClientOp::Admin(kv_permission(true, None))
                }
            }
        }
    }

    /// A KV write's outcome at apply, for the auth checker.
    fn auth_checked(&mut self, at: LogPos, result: Result<(), AuthError>) {
        if let Some(auth) = self.auth.as_mut() {
            auth.writes.push((at, result));
        }
    }

    fn kv_op(&mut self, c: usize) -> ClientOp {
        // Keys live for a window of 2 s each, so that no key's history outgrows the checker.
        let window = self.now / (2 * SEC);
        let key = format!("k{window}-{}", self.rng.below(KV_KEYS));
        let roll = self.rng.below(20);
        if roll < 11 {
            self.clients[c].written += 1;
            let value = format!("c{c}-{}", self.clients[c].written);
            if roll < 9 {
                let history = self.record(
                    &key,
                    HOp::Put {
                        value: value.clone(),
                        lease: 0,
                    },
                    false,
                );
                self.last_put.insert(key.clone(), value.clone());
                return ClientOp::Put {
                    key,
                    value,
                    history,
                };
            }
            // A compare-and-set on the value last put there (which may since have changed).
            let expected = self.last_put.get(&key).cloned().unwrap_or_default();
            let history = self.record(
                &key,
                HOp::Cas {
                    expected: expected.clone(),
                    new: value.clone(),
                },
                false,
            );
            self.last_put.insert(key.clone(), value.clone());
            return ClientOp::Cas {
                key,
                expected,
                new: value,
                history,
            };
        }
        // Reads: linearizable (11..17) or serializable (17..20); of one key, or of the whole
        // window (16 and 19).
        let linearizable = roll < 17;
        let (span, covered) = if roll == 16 || roll == 19 {
            let prefix = format!("k{window}-").into_bytes();
            let mut end = prefix.clone();
            *end.last_mut().expect("not empty") += 1;
            let keys = (0..KV_KEYS).map(|k| format!("k{window}-{k}")).collect();
            ((prefix, end), keys)
        } else {
            ((key.clone().into_bytes(), Vec::new()), vec![key])
        };
        let keys = covered
            .into_iter()
            .map(|k| {
                let h = self.record(&k, HOp::Get, !linearizable);
                (k, h)
            })
            .collect();
        ClientOp::Read {
            span,
            keys,
            linearizable,
        }
    }

    /// Records an operation on `key` invoked now; a serializable read as invoked at the start
    /// of the run instead, since it may return any state the key had before it completed (a
    /// member's applied state is a prefix of the log), never one it did not have.
    fn record(&mut self, key: &str, op: HOp, stale_ok: bool) -> usize {
        let invoked = self.instant(if stale_ok { 0 } else { self.now });
        let events = self.histories.entry(key.to_string()).or_default();
        events.push(HEvent {
            client: 0,
            op,
            invoked,
            completed: None,
        });
        events.len() - 1
    }

    /// A lock client: keeps its lease alive, takes the lock, writes behind it with its token,
    /// and lets it go; sometimes it pauses past its TTL holding the lock and then writes with
    /// the token it had (which the fence must refuse once the lock key is gone).
    fn lock_op(&mut self, c: usize) -> ClientOp {
        let client = &self.clients[c];
        let Some(held) = client.held.filter(|h| h.granted) else {
            return self.lease_op(c);
        };
        let (zombie, token, renewed_at) = (client.zombie, client.token, client.renewed_at);
        if zombie {
            self.clients[c].zombie = false;
            if let Some(token) = token {
                self.note(format!(
                    "client {c} wakes from a pause and writes with token {token}"
                ));
                return ClientOp::Fenced(token);
            }
        }
        if self.now.saturating_sub(renewed_at) > held.ttl_secs as u64 * SEC / 3 {
            return ClientOp::Renew(held.id);
        }
        match token {
            None => ClientOp::Acquire(held.id),
            Some(token) if self.rng.chance(0.2) => ClientOp::Release(token),
            Some(token) => ClientOp::Fenced(token),
        }
    }

    fn lease_op(&mut self, c: usize) -> ClientOp {
        match self.clients[c].held {
            None => {
                let id = LeaseId::from_wire(self.rng.range(1, i64::MAX as u64) as i64)
                    .expect("non-zero");
                let ttl_secs = self.rng.range(3, 9) as i64;
                let held = Held {
                    id,
                    ttl_secs,
                    granted: false,
                };
                self.leases.granting(id.get(), ttl_secs as u64);
                if self.clients[c].keeper {
                    self.leases.kept(id.get());
                }
                self.clients[c].held = Some(held);
                ClientOp::Grant(held)
            }
            Some(held) if !held.granted => ClientOp::Grant(held),
            Some(held) => {
                // Due a renewal a third of the TTL after the last one, as clientv3 renews
                // (`keepalive_wait` draws when it wakes); whatever else it does waits.
                let renewed_at = self.clients[c].renewed_at;
                let due =
                    self.now.saturating_sub(renewed_at) >= held.ttl_secs as u64 * SEC * 8 / 30;
                if due {
                    ClientOp::Renew(held.id)
                } else if self.rng.chance(0.03) && !self.healed() {
                    ClientOp::Revoke(held.id)
                } else if self.rng.chance(0.2) {
                    ClientOp::AttachKey(held.id)
                } else {
                    ClientOp::Renew(held.id)
                }
            }
        }
    }

    fn client_answer(&mut self, c: usize, op: u64, answer: Option<Answer>) {
        let Some((n, what, sent)) = self.clients[c].pending.clone() else {
            return;
        };
        if n != op {
            return;
        }
        self.clients[c].pending = None;
        let completed = self.instant(self.now);
        let failed = !matches!(answer, Some(Answer::Applied { .. } | Answer::Kvs(_)));
        let mut wait = self.rng.range(5 * MS, 60 * MS);
        match (what, answer) {
            (
                ClientOp::Put { key, history, .. },
                Some(Answer::Applied {
                    applied: Applied::Put(Ok(_)),
                    index,
                    pos,
                    ..
                }),
            ) => {
                self.auth_checked((index, pos), Ok(()));
                self.acked_writes += 1;
                self.histories.get_mut(&key).expect("recorded")[history].completed =
                    Some((completed, history::Answer::Done));
            }
            (
                ClientOp::Cas { key, history, .. },
                Some(Answer::Applied {
                    applied: Applied::Txn(Ok(txn)),
                    index,
                    pos,
                    ..
                }),
            ) => {
                self.auth_checked((index, pos), Ok(()));
                self.acked_writes += 1;
                self.histories.get_mut(&key).expect("recorded")[history].completed =
                    Some((completed, history::Answer::Swapped(txn.succeeded)));
            }
            (
                ClientOp::Put { key, history, .. } | ClientOp::Cas { key, history, .. },
                Some(Answer::Applied {
                    applied: Applied::Denied(e),
                    index,
                    pos,
                    ..
                }),
            ) => {
                // Refused at apply: it never took effect.
                self.auth_checked((index, pos), Err(e));
                let event = &mut self.histories.get_mut(&key).expect("recorded")[history];
                event.op = HOp::Get;
                event.completed = None;
            }
            (
                ClientOp::Admin(change),
                Some(Answer::Applied {
                    applied: Applied::Auth(result),
                    ..
                }),
            ) => {
                let auth = self.auth.as_mut().expect("an auth seed");
                let done = match result {
                    // Done, or done by an earlier try whose answer was lost.
                    Ok(())
                    | Err(
                        AuthError::UserAlreadyExist
                        | AuthError::RoleAlreadyExist
                        | AuthError::PermissionNotGranted,
                    ) => true,
                    // A stale token (the revision moved): again.
                    Err(_) => false,
                };
                if done {
                    if auth.setup.front() == Some(&change) {
                        auth.setup.pop_front();
                        wait = auth.rng.range(10 * MS, 100 * MS);
                    } else if let Some(b) = auth.bound {
                        // Renewals next; with none left, the grant lapses with its lease, or
                        // (half the time) is replaced by a plain grant before it does.
                        wait = if b.renewals_left > 0 || auth.rng.chance(0.5) {
                            auth.rng.range(400 * MS, 700 * MS)
                        } else {
                            (ADMIN_LEASE_TTL as u64 + 4) * SEC
                        };
                    } else {
                        wait = auth.rng.range(SEC, 4 * SEC);
                    }
                    match change {
                        AuthChange::RoleGrantPermission { .. } => auth.granted = true,
                        AuthChange::RoleRevokePermission { .. } => auth.granted = false,
                        _ => {}
                    }
                    self.note(format!("admin: {change:?} done"));
                } else if result == Err(AuthError::LeaseNotFound) {
                    // The lease ran out first: another one.
                    auth.bound = None;
                }
            }
            (
                ClientOp::AdminLease(id),
                Some(Answer::Applied {
                    applied: Applied::LeaseGrant(result),
                    ..
                }),
            ) => {
                let auth = self.auth.as_mut().expect("an auth seed");
                match (result, auth.bound.as_mut()) {
                    (Ok(()), Some(b)) if b.id == id => b.leased = true,
                    _ => auth.bound = None,
                }
            }
            (
                ClientOp::AdminRenew(id),
                Some(Answer::Applied {
                    applied: Applied::LeaseRenew(ttl),
                    ..
                }),
            ) => {
                let auth = self.auth.as_mut().expect("an auth seed");
                match (ttl, auth.bound.as_mut()) {
                    (Some(_), Some(b)) if b.id == id => {
                        b.renewals_left -= 1;
                        wait = if b.renewals_left == 0 {
                            (ADMIN_LEASE_TTL as u64 + 4) * SEC
                        } else {
                            auth.rng.range(400 * MS, 700 * MS)
                        };
                    }
                    _ => {
                        // The lease is gone, and the grant with it.
                        auth.granted = false;
                        auth.bound = None;
                    }
                }
            }
            (ClientOp::Read { keys, .. }, Some(Answer::Kvs(kvs))) => {
                for (key, h) in keys {
                    let value = kvs
                        .iter()
                        .find(|(k, _)| *k == key.as_bytes())
                        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
                    self.histories.get_mut(&key).expect("recorded")[h].completed =
                        Some((completed, history::Answer::Value(value)));
                }
            }
            (
                ClientOp::Grant(held),
                Some(Answer::Applied {
                    applied: Applied::LeaseGrant(result),
                    stamped_at,
                    ..
                }),
            ) => {
                if result.is_ok() || self.leases.known(held.id.get()) {
                    self.clients[c].held = Some(Held {
                        granted: true,
                        ..held
                    });
                    self.clients[c].renewed_at = sent;
                    if let (Ok(()), Some(at)) = (result, stamped_at) {
                        self.leases
                            .promised(held.id.get(), at, held.ttl_secs as u64);
                        self.note(format!(
                            "client {c}: lease {} granted for {} s, stamped at {} µs",
                            held.id.get(),
                            held.ttl_secs,
                            at.true_us
                        ));
                    }
                    wait = self.keepalive_wait(held.ttl_secs);
                } else {
                    // Granted by an earlier try whose answer was lost: the id exists.
                    self.clients[c].held = Some(Held {
                        granted: true,
                        ..held
                    });
                }
            }
            (
                ClientOp::Renew(id),
                Some(Answer::Applied {
                    applied: Applied::LeaseRenew(ttl),
                    stamped_at,
                    ..
                }),
            ) => match ttl {
                Some(ttl) if ttl > 0 => {
                    if let Some(at) = stamped_at {
                        self.leases.promised(id.get(), at, ttl as u64);
                        self.note(format!(
                            "client {c}: lease {} renewed for {ttl} s, stamped at {} µs (lease time {})",
                            id.get(),
                            at.true_us,
                            at.lease_ms
                        ));
                    }
                    wait = self.keepalive_wait(ttl);
                    self.clients[c].renewed_at = sent;
                }
                _ => {
                    self.note(format!("client {c}: lease {} is gone", id.get()));
                    self.clients[c].held = None;
                    self.clients[c].token = None;
                }
            },
            (
                ClientOp::Acquire(id),
                Some(Answer::Applied {
                    applied: Applied::Txn(Ok(response)),
                    ..
                }),
            ) => {
                let token = if response.succeeded {
                    Some(response.revision)
                } else {
                    // Held already: by this lease (an earlier try whose answer was lost), or
                    // by another.
                    response.responses.iter().find_map(|r| match r {
                        ResponseOp::Range(r) => r
                            .kvs
                            .first()
                            .filter(|kv| kv.lease == Some(id))
                            .map(|kv| kv.create_revision),
                        _ => None,
                    })
                };
                if let Some(token) = token {
                    self.clients[c].token = Some(token);
                    self.note(format!("client {c} holds the lock, token {token}"));
                    if !self.healed() && self.rng.chance(0.15) {
                        // A pause (GC, SIGSTOP) longer than its TTL, holding the lock.
                        let ttl = self.clients[c].held.map_or(3, |h| h.ttl_secs) as u64;
                        self.clients[c].zombie = true;
                        wait = ttl * SEC + self.rng.range(SEC, 2 * SEC);
                    }
                } else {
                    wait = self.rng.range(100 * MS, 400 * MS);
                }
            }
            (
                ClientOp::Fenced(token),
                Some(Answer::Applied {
                    applied: Applied::Txn(Ok(response)),
                    ..
                }),
            ) => {
                if response.succeeded {
                    self.fenced.push((response.revision, token));
                    self.note(format!(
                        "client {c}: fenced write with token {token} at revision {}",
                        response.revision
                    ));
                } else {
                    self.note(format!("client {c}: the fence refused token {token}"));
                    self.clients[c].token = None;
                }
            }
            (ClientOp::Release(_), Some(Answer::Applied { .. })) => {
                self.clients[c].token = None;
                wait = self.rng.range(50 * MS, 500 * MS);
            }
            (
                ClientOp::Revoke(id),
                Some(Answer::Applied {
                    applied: Applied::LeaseRevoke(_),
                    ..
                }),
            ) => {
                self.clients[c].held = None;
                let _ = id;
            }
            (ClientOp::AttachKey(_), Some(Answer::Applied { .. })) => {
                let ttl = self.clients[c].held.map_or(3, |h| h.ttl_secs);
                wait = self.keepalive_wait(ttl);
            }
            _ => {}
        }
        if self.clients[c].kind == Kind::Lock && !self.clients[c].zombie {
            // A lock client renews when it must (`lock_op`), and otherwise goes on working.
            wait = wait.min(self.rng.range(20 * MS, 200 * MS));
        }
        if failed {
            if std::env::var_os("SIM_DEBUG").is_some() {
                self.note(format!(
                    "DEBUG client {c} op failed at m{}",
                    self.clients[c].member + 1
                ));
            }
            // Another member next time, after a pause.
            let n = self.members.len() as u64;
            self.clients[c].member = self.rng.below(n) as usize;
            wait = self.rng.range(50 * MS, 300 * MS);
        }
        self.after(wait, Ev::ClientWakes(c));
    }

    /// Keepalives at a third of the TTL, with jitter (etcd's clients renew at TTL/3).
    fn keepalive_wait(&mut self, ttl_secs: i64) -> u64 {
        let third = ttl_secs as u64 * SEC / 3;
        self.rng.range(third * 8 / 10, third * 11 / 10)
    }

    // ---- the end ----

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

    /// The members that are up and in the membership a leader has applied (all that are up if
    /// none leads): a member removed by a change that committed after the world stopped waiting
    /// for it is still up, but no longer gets entries.
    fn up_members(&self) -> Vec<usize> {
        let members = self.leader().map(|l| {
            let machine = &self.members[l].machine;
            let mut ids = machine.voters();
            ids.extend(machine.learners());
            ids
        });
        (0..self.members.len())
            .filter(|m| {
                let m = &self.members[*m];
                m.is_up() && members.as_ref().is_none_or(|ids| ids.contains(&m.id))
            })
            .collect()
    }

    fn settled(&self) -> bool {
        let up: Vec<&Member> = self
            .up_members()
            .into_iter()
            .map(|m| &self.members[m])
            .collect();
        let Some(leader) = up.iter().find_map(|m| m.status().filter(|s| s.is_leader)) else {
            return false;
        };
        up.iter().all(|m| {
            m.machine.applied().0 >= leader.commit
                && m.status().is_some_and(|s| s.applied == leader.commit)
        })
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
