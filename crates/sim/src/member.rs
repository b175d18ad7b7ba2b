//! One simulated member: the real consensus core on its simulated disk, the real state machine,
//! and around them the replica's own decisions (`leasehold_raft::steps`: what a leader does with
//! a write as it arrives, what becomes of each batch and when a new leader holds one, stamping,
//! promotion, the expiry pass, when a forwarded write is answered, append dates, which
//! read-index round answers which reader) and the Raft thread's own round (`leasehold_consensus::driver::round`),
//! driven event by event instead of on threads and tasks. Linearizable reads take the replica's
//! paths: on the leader (or a member that knows none) a round of the core's read index; on a
//! follower one read-index request to the leader over the peer line per round, given up when the
//! leader changes or after two election timeouts, then a wait to apply that far. What stays here
//! is the plumbing the replica does with tasks and channels: the write queue, waiting for an
//! entry to apply, forwarding a follower's writes, answering readers. Every clock read is this member's
//! simulated monotonic clock.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_auth::AuthChange;
use leasehold_consensus::driver::{self, Committed};
use leasehold_consensus::eraftpb::{self, Snapshot};
use leasehold_consensus::reads::{Confirmed, ReadBatcher, ReadError, ReadProof};
use leasehold_consensus::{
    Checkpoint, Core, CoreConfig, CoreError, HeartbeatSeen, Host, HostError, decode_peer_message,
    encode_message,
};
use leasehold_lease::{LeaseClock, LeaseId};
use leasehold_mvcc::RangeRequest;
use leasehold_raft::steps::{
    self, AfterEnd, Arrival, BatchFill, EntryOutcome, ExpiryConfig, ExpiryWork, FollowerRound,
    FollowerStep, Go, LeaderRenewals, LeaderRound, LeaderStep, Promotion, PromotionStep, Proposer,
    ReadRounds, RenewStep, RoundEnd, Waiters, after_end, answered_before_apply, expiry_pass,
    leader_arrival,
};
use leasehold_raft::{
    Applied, AuthWrite, Command, LeaseRenew, Machine, Proposal, Write, encode_proposal,
};
use leasehold_wal::WalOptions;
use leasehold_wal::proto::ConfState;

use crate::disk::SimFs;
use crate::{Variant, WAL_DIR};

/// A heartbeat interval: one Raft tick, 100 ms as etcd's default.
pub const TICK_US: u64 = 100_000;
/// A member saves its state machine and compacts its log this often (`rs::CHECKPOINT_EVERY`
/// is 100 ms; a longer one here keeps more log to replay and to send as snapshots).
pub const CHECKPOINT_TICKS: u64 = 10;

/// A member's monotonic clock: `rate_ppm` fast (or slow) against true time, from an offset.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub rate_ppm: i64,
    pub offset_us: u64,
}

impl Clock {
    pub fn local_us(&self, true_us: u64) -> u64 {
        let drift = (true_us as i128 * self.rate_ppm as i128) / 1_000_000;
        (self.offset_us as i128 + true_us as i128 + drift) as u64
    }

    /// The first true microsecond at which this clock reads at least `local`.
    pub fn true_at(&self, local: u64) -> u64 {
        let since = local.saturating_sub(self.offset_us) as i128;
        let mut t = ((since * 1_000_000) / (1_000_000 + self.rate_ppm as i128)).max(0) as u64;
        while self.local_us(t) < local {
            t += 1;
        }
        t
    }

    /// True microseconds for `local` microseconds of this clock to pass.
    pub fn true_span(&self, local: u64) -> u64 {
        ((local as i128 * 1_000_000) / (1_000_000 + self.rate_ppm as i128)) as u64
    }
}

/// Who is waiting for an answer.
#[derive(Clone, Debug)]
pub enum Origin {
    Client {
        client: usize,
        op: u64,
    },
    /// A follower's forwarded write, by its request number there.
    Forwarded {
        member: u64,
        request: u64,
    },
}

/// A client's request to a member.
#[derive(Clone, Debug)]
pub enum Request {
    Write(Write),
    /// A write by a user: while this member's applied auth store is on, it goes with the
    /// caller the user's token names here (the user at this member's auth revision), as the
    /// server's edge resolves a token (`Replica::auth_caller`).
    WriteAs(&'static str, Write),
    /// A range read of `[key, range_end)` (one key if `range_end` is empty).
    Range {
        key: Vec<u8>,
        range_end: Vec<u8>,
        linearizable: bool,
    },
}

/// A range: key and range end.
pub type Span = (Vec<u8>, Vec<u8>);

/// What a member answers.
#[derive(Clone, Debug)]
pub enum Answer {
    /// The write's reply, and for a grant or renewal when it was stamped: the true time and the
    /// lease time (what the simulator, not the client, knows: the lease checker counts from it).
    Applied {
        applied: Applied,
        /// The log index of the entry that held it, and the write's place among its commands.
        index: u64,
        pos: usize,
        stamped_at: Option<Stamp>,
    },
    /// A range's keys and values, in key order.
    Kvs(Vec<(Vec<u8>, Vec<u8>)>),
    Failed(#[allow(dead_code)] &'static str),
}

/// When a grant or renewal was stamped.
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    pub true_us: u64,
    pub lease_ms: u64,
    /// The log index of the entry that carried it (known once applied; 0 before).
    pub index: u64,
}

/// Member-to-member messages besides Raft's.
#[derive(Clone, Debug)]
pub enum PeerMsg {
    /// A follower's batch of writes, each with its request number there.
    ForwardBatch {
        from: u64,
        writes: Vec<(u64, Write)>,
    },
    Forwarded {
        request: u64,
        index: u64,
        answer: Answer,
    },
    /// A follower's read-index request for one round of its readers (`Forwarder::read_index`).
    ReadIndex { from: u64, request: u64 },
    /// The leader's read index for that round, applied there (`None`: no read index, the
    /// follower's readers fail and go again), and what proves the round to the follower
    /// (`ReadIndex::proof`).
    ReadIndexed {
        request: u64,
        index: Option<u64>,
        proof: Option<ReadProof>,
    },
}

/// What handling an input produced, for the world to deliver.
#[derive(Debug)]
pub enum Out {
    Raft {
        to: u64,
        bytes: Vec<u8>,
        after_sync: bool,
    },
    Peer {
        to: u64,
        msg: PeerMsg,
    },
    Reply {
        to: Origin,
        answer: Answer,
    },
    /// A lease left the state on this member at this apply (expired, or revoked by a renewal
    /// that found it past its deadline); `by_client` for a client's revoke.
    LeaseEnded {
        id: LeaseId,
        by_client: bool,
        index: u64,
        /// The place among the entry's commands of one that names the lease (each such
        /// command reports it).
        pos: usize,
    },
    /// A leader stamped a grant or renewal of this lease (answered or not, it may commit).
    Stamped {
        id: LeaseId,
        lease_ms: u64,
    },
    /// An auth change applied (ok) at this index, as the entry's `pos`th command.
    AuthChanged {
        index: u64,
        pos: usize,
        change: AuthChange,
    },
    /// The batcher takes what is queued at this true µs: the world wakes it then.
    FlushAt(u64),
    /// This member now times leases, from this lease time; inherited leases got at least
    /// `extend_ms` each.
    Promoted {
        lease_ms: u64,
        extend_ms: u64,
    },
    /// This member stopped timing leases (another member leads, or none does).
    Demoted,
    /// A line for the trace.
    Note(String),
}

/// One write of a proposed entry, waiting for it (the entry's waiters, by index and term, are
/// `steps::Waiters`'s).
struct Waiter {
    /// The write's place among its entry's commands.
    pos: usize,
    origin: Origin,
    stamped_at: Option<Stamp>,
    /// A renewal that found its lease past the deadline its holder was told, waiting for the
    /// lease's end (`RenewStep::Expire`): its lease, and how many times it was decided.
    /// `steps::after_end` then says whether it is answered TTL 0 or decided again.
    renewal_end: Option<(LeaseId, usize)>,
}

/// What the read batcher answered each leader round (by its number), for the member's next
/// step.
type ReadAnswers = Arc<Mutex<Vec<(u64, Result<Confirmed, ReadError>)>>>;

/// A reader of a leader round (the replica's `leader_read_index`): a client's linearizable
/// range, a follower's read-index request, or a promotion's confirmation.
enum LeaderReader {
    Client(Origin, Span),
    Peer { member: u64, request: u64 },
    Promotion(u64),
}

/// A leader round: the replica's own [`steps::LeaderRound`] (the core's read index, then a wait
/// until this member applied that far; failed at once if this member is deposed first), with
/// its number among the answers of the driver's read batcher, and its readers.
struct LeaderRead {
    number: u64,
    readers: Vec<LeaderReader>,
    round: LeaderRound,
}

/// A follower round: the replica's own [`steps::FollowerRound`] (when an answer counts, when to
/// ask again, when to give up), with what the peer line does for it here: the number of the
/// ask in flight and, while it is unanswered, when the line gives it up (true µs).
struct FollowerRead {
    round: FollowerRound<()>,
    request: u64,
    deadline: Option<u64>,
    readers: Vec<(Origin, Span)>,
}

/// What a follower round does next, in the simulator's terms.
type FollowerReadStep = FollowerStep<(), ()>;

pub struct Member {
    pub id: u64,
    pub disk: SimFs,
    pub core: Option<Core<SimFs>>,
    pub machine: Machine,
    /// The state machine as last saved (what a crash leaves).
    saved: Vec<u8>,
    pub clock: Clock,
    pub election_tick: usize,
    /// Until when the process is stopped (SIGSTOP): it runs nothing, its clock runs on.
    pub paused_until: u64,
    pub variant: Variant,
    /// When the world will wake this member's expiry driver (true µs), if it will.
    pub wake_at: Option<u64>,
    base: Instant,
    ticks: u64,
    /// This member's lease clock while it leads and times leases (the replica's `SharedClock`).
    lease_clock: Option<LeaseClock>,
    promotion: Promotion,
    /// A promotion's read index (term, index), waiting for this member to apply that far.
    confirming: Option<(u64, u64)>,
    /// A promotion's `LeasePromote` (term, index), waiting to be applied.
    promoting: Option<(u64, u64)>,
    /// The leader's renewals from memory (`steps::LeaderRenewals`), as the replica's.
    renewals: LeaderRenewals,
    /// Renewals whose end revoked nothing, to be decided again (`steps::after_end`), with how
    /// many times each was decided so far.
    decide_again: Vec<(Origin, LeaseId, usize)>,
    /// How far a renewal through the log covers beyond its deadline (`--lease-cover-margin`).
    pub cover_margin_ms: u64,
    /// Leases whose end, or background cover, is being committed at these indexes: they are
    /// done with once this member applies that far.
    ending: Vec<(u64, Vec<LeaseId>)>,
    covering: Vec<(u64, LeaseId)>,
    waiters: Waiters<Vec<Waiter>>,
    /// How long the batcher lets writes gather before it takes them (true µs): the proposer
    /// task's turn in production. 0: each write is its own entry, proposed as it arrives.
    pub batch_window_us: u64,
    /// Writes waiting for the batcher, and when it takes them.
    batch: VecDeque<(Origin, Write)>,
    batch_at: Option<u64>,
    /// What becomes of each batch, and the one a leader holds until it times leases
    /// (`steps::Proposer`, the replica's): nothing more is taken off `batch` meanwhile.
    proposer: Proposer<(Origin, Write)>,
    /// The driver's own batcher of ReadIndex rounds (retries included), and what it answered,
    /// collected for the next step.
    reads: ReadBatcher,
    read_answers: ReadAnswers,
    /// The replica's two kinds of read-index rounds (`steps::ReadRounds`) and the one of each
    /// running.
    leader_reads: ReadRounds<LeaderReader>,
    leader_round: Option<LeaderRead>,
    follower_reads: ReadRounds<(Origin, Span)>,
    follower_round: Option<FollowerRead>,
    /// Ranges of a follower round's readers, each waiting for this member to apply the leader's
    /// read index.
    ready_reads: Vec<(u64, Origin, Span)>,
    /// Forwarded writes by request number: who asked, and whether the answer waits for this
    /// member's own apply.
    forwarded: BTreeMap<u64, (Origin, bool)>,
    after_apply: Vec<(u64, Origin, Answer)>,
    next_ctx: u64,
    expiry: ExpiryConfig,
    /// The expiry driver's proposal in flight (its index): the driver awaits each one.
    duty: Option<u64>,
    /// A failed expiry proposal is retried at this true µs.
    duty_retry: u64,
    /// What a refusal to start said (a damaged log): the member stays down.
    pub refused: Option<String>,
    /// Removed from the cluster: it never runs again.
    pub removed: bool,
}

/// Where the core starts from a saved state, as the replica's `open_log` says: a member of a
/// new cluster starts with its log compacted at index 1 (term 1), so a member added later is
/// caught up by a snapshot, which carries the membership; a member that waits to be added (no
/// membership yet) starts from nothing.
fn checkpoint_of(machine: &Machine) -> Checkpoint {
    let (mut index, mut term) = machine.applied();
    let voters = machine.voters();
    if !voters.is_empty() && index < 1 {
        (index, term) = (1, 1);
    }
    Checkpoint {
        applied_index: index,
        applied_term: term,
        conf_state: ConfState {
            voters,
            learners: machine.learners(),
            ..ConfState::default()
        },
    }
}

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

impl Member {
    pub fn new(
        id: u64,
        voters: &[u64],
        disk: SimFs,
        clock: Clock,
        election_tick: usize,
        variant: Variant,
        base: Instant,
    ) -> Member {
        let machine = Machine::new(voters);
        Member {
            id,
            disk,
            core: None,
            saved: machine.to_bytes(),
            machine,
            clock,
            election_tick,
            paused_until: 0,
            variant,
            wake_at: None,
            base,
            ticks: 0,
            lease_clock: None,
            promotion: Promotion::default(),
            confirming: None,
            promoting: None,
            renewals: LeaderRenewals::default(),
            decide_again: Vec::new(),
            cover_margin_ms: leasehold_raft::LEASE_COVER_MARGIN_DEFAULT_MS,
            ending: Vec::new(),
            covering: Vec::new(),
            waiters: Waiters::default(),
            batch_window_us: 0,
            batch: VecDeque::new(),
            batch_at: None,
            proposer: Proposer::default(),
            reads: ReadBatcher::new(1, 1),
            read_answers: Arc::new(Mutex::new(Vec::new())),
            leader_reads: ReadRounds::default(),
            leader_round: None,
            follower_reads: ReadRounds::default(),
            follower_round: None,
            ready_reads: Vec::new(),
            forwarded: BTreeMap::new(),
            after_apply: Vec::new(),
            next_ctx: 1,
            expiry: ExpiryConfig::default(),
            duty: None,
            duty_retry: 0,
            refused: None,
            removed: false,
        }
    }

    fn config(&self) -> CoreConfig {
        let mut config = CoreConfig::new(self.id);
        config.election_tick = self.election_tick;
        config.max_election_tick = self.election_tick + 1;
        config.catch_up_entries = 64;
        // Little data stays in memory, so that catching a follower up reads entries back from
        // the write-ahead log under every fault the simulator injects.
        config.log_memory_bytes = 256;
        // And what is read back is sent a few entries at a time: raft-rs is refused the rest
        // until the core has handed over what waits (its asynchronous fetch, made again).
        config.catch_up_window_bytes = 512;
        config.wal = WalOptions {
            segment_bytes: 256 * 1024,
        };
        config
    }

    pub fn election_timeout_ms(&self) -> u64 {
        self.election_tick as u64 * TICK_US / 1000
    }

    fn instant(&self, now: u64) -> Instant {
        self.base + Duration::from_micros(self.clock.local_us(now))
    }

    pub fn is_up(&self) -> bool {
        self.core.is_some()
    }

    /// Starts the process from what its disk and saved state machine hold.
    pub fn start(&mut self) -> Result<(), String> {
        self.machine = Machine::from_bytes(&self.saved).map_err(|e| e.to_string())?;
        let checkpoint = checkpoint_of(&self.machine);
        let core = Core::open(
            self.disk.clone(),
            Path::new(WAL_DIR),
            &self.config(),
            checkpoint,
            &logger(),
        )
        .map_err(|e| e.to_string())?;
        self.core = Some(core);
        // As the replica's driver sets it up (`rs.rs`).
        self.reads = ReadBatcher::new(
            (self.election_tick as u64 / 2).max(1),
            self.election_tick as u64 * 2,
        );
        self.ticks = 0;
        self.lease_clock = None;
        self.promotion = Promotion::default();
        self.confirming = None;
        self.promoting = None;
        self.duty = None;
        self.duty_retry = 0;
        Ok(())
    }

    /// The process dies: everything in memory goes, and its waiters hear nothing.
    pub fn crash(&mut self) {
        self.core = None;
        self.lease_clock = None;
        self.forget_renewals();
        self.decide_again.clear();
        self.waiters.drain();
        self.batch.clear();
        self.batch_at = None;
        self.proposer = Proposer::default();
        self.reads.stop();
        self.read_answers.lock().expect("not poisoned").clear();
        self.leader_reads.clear();
        self.leader_round = None;
        self.follower_reads.clear();
        self.follower_round = None;
        self.ready_reads.clear();
        self.forwarded.clear();
        self.after_apply.clear();
    }

    pub fn status(&self) -> Option<leasehold_consensus::CoreStatus> {
        self.core.as_ref().map(|c| c.status())
    }

    pub fn tick(&mut self, now: u64, out: &mut Vec<Out>) {
        let Some(core) = self.core.as_mut() else {
            return;
        };
        core.tick();
        self.reads.tick(core);
        self.ticks += 1;
        if self.ticks.is_multiple_of(CHECKPOINT_TICKS) {
            self.checkpoint();
        }
        self.drive(now, out);
    }

    /// Saves the state machine (durably: what a crash leaves) and lets the log go behind it.
    fn checkpoint(&mut self) {
        let (index, term) = self.machine.applied();
        let Some(core) = self.core.as_mut() else {
            return;
        };
        let bytes = self.machine.to_bytes();
        if core.snapshot_wanted().is_some() && index > core.compacted_index() {
            let mut snapshot = Snapshot {
                data: bytes.clone().into(),
                ..Default::default()
            };
            let meta = snapshot.mut_metadata();
            meta.index = index;
            meta.term = term;
            let cs = eraftpb::ConfState {
                voters: self.machine.voters(),
                learners: self.machine.learners(),
                ..Default::default()
            };
            meta.set_conf_state(cs);
            self.saved = bytes;
            let _ = core.compact(snapshot);
        } else {
            self.saved = bytes;
            let _ = core.compact_log(index);
        }
    }

    pub fn step(&mut self, now: u64, bytes: &[u8], out: &mut Vec<Out>) {
        let Some(core) = self.core.as_mut() else {
            return;
        };
        match decode_peer_message(bytes, self.id) {
            Ok(message) => {
                let _ = core.step(message);
            }
            Err(e) => out.push(Out::Note(format!("m{} refused a message: {e}", self.id))),
        }
        self.drive(now, out);
    }

    /// A leader proposes one membership change (a voter added or removed); whether it took it.
    pub fn change_membership(
        &mut self,
        now: u64,
        kind: eraftpb::ConfChangeType,
        id: u64,
        out: &mut Vec<Out>,
    ) -> bool {
        let Some(core) = self.core.as_mut() else {
            return false;
        };
        let mut single = eraftpb::ConfChangeSingle::default();
        single.set_change_type(kind);
        single.node_id = id;
        let mut change = eraftpb::ConfChangeV2::default();
        change.mut_changes().push(single);
        let taken = core.propose_conf_change(&change).is_ok();
        self.drive(now, out);
        taken
    }

    /// A leader moves leadership to `to` (MoveLeader).
    pub fn transfer(&mut self, now: u64, to: u64, out: &mut Vec<Out>) {
        let Some(core) = self.core.as_mut() else {
            return;
        };
        core.transfer_leader(to);
        self.drive(now, out);
    }

    pub fn request(&mut self, now: u64, origin: Origin, request: Request, out: &mut Vec<Out>) {
        if self.core.is_none() {
            return;
        }
        match request {
            Request::Write(write) => self.write(now, origin, write, out),
            Request::WriteAs(user, write) => {
                let write = self.as_user(user, write);
                self.write(now, origin, write, out)
            }
            Request::Range {
                key,
                range_end,
                linearizable,
            } => {
                let span = (key, range_end);
                if !linearizable {
                    let answer = self.range(&span);
                    reply(out, origin, 0, answer);
                } else if let Some(leader) = self.leader_elsewhere() {
                    self.follower_read(now, leader, origin, span, out);
                } else {
                    self.leader_read(LeaderReader::Client(origin, span));
                }
            }
        }
        self.drive(now, out);
    }

    /// The leader this member follows, if another member leads (the replica's
    /// `leader_elsewhere`).
    fn leader_elsewhere(&self) -> Option<u64> {
        self.status()
            .map(|s| s.leader)
            .filter(|l| *l != 0 && *l != self.id)
    }

    /// Joins the next leader round (the replica's `leader_reads`), starting one if none runs.
    fn leader_read(&mut self, reader: LeaderReader) {
        if let Some(readers) = self.leader_reads.join(reader) {
            self.start_leader_round(readers);
        }
    }

    /// One leader round for `readers`: the core's read index, through the driver's batcher.
    fn start_leader_round(&mut self, readers: Vec<LeaderReader>) {
        let number = self.next_ctx();
        let status = self.status();
        let leading = status.is_some_and(|s| s.is_leader);
        let term = status.map_or(0, |s| s.term);
        let round = LeaderRound::start(leading, term);
        self.leader_round = Some(LeaderRead {
            number,
            readers,
            round,
        });
        let answers = self.read_answers.clone();
        self.reads.add(Box::new(move |result| {
            answers.lock().expect("not poisoned").push((number, result));
        }));
        if let Some(core) = self.core.as_mut() {
            self.reads.send(core);
        }
    }

    /// Ends the running leader round with `index` (`None`: it failed), answers its readers and
    /// starts the next round for those who joined meanwhile.
    fn finish_leader_round(&mut self, confirmed: Option<Confirmed>, out: &mut Vec<Out>) {
        let Some(round) = self.leader_round.take() else {
            return;
        };
        let (index, proof) = (confirmed.map(|c| c.index), confirmed.and_then(|c| c.proof));
        for reader in round.readers {
            match (reader, index) {
                (LeaderReader::Client(origin, span), Some(_)) => {
                    let answer = self.range(&span);
                    reply(out, origin, 0, answer);
                }
                (LeaderReader::Client(origin, _), None) => {
                    reply(out, origin, 0, Answer::Failed("read index timed out"));
                }
                (LeaderReader::Peer { member, request }, index) => out.push(Out::Peer {
                    to: member,
                    msg: PeerMsg::ReadIndexed {
                        request,
                        index,
                        proof,
                    },
                }),
                (LeaderReader::Promotion(term), Some(index)) => {
                    self.confirming = Some((term, index));
                }
                (LeaderReader::Promotion(term), None) => self.promotion.failed(term),
            }
        }
        if let Some(next) = self.leader_reads.finished() {
            self.start_leader_round(next);
        }
    }

    /// Joins the next follower round (the replica's `follower_reads`), starting one if none
    /// runs.
    fn follower_read(
        &mut self,
        now: u64,
        leader: u64,
        origin: Origin,
        span: Span,
        out: &mut Vec<Out>,
    ) {
        if let Some(readers) = self.follower_reads.join((origin, span)) {
            self.start_follower_round(now, leader, readers, out);
        }
    }

    /// One follower round to `leader` for `readers`.
    fn start_follower_round(
        &mut self,
        now: u64,
        leader: u64,
        readers: Vec<(Origin, Span)>,
        out: &mut Vec<Out>,
    ) {
        let election_timeout = Duration::from_millis(self.election_timeout_ms());
        let (round, step) = FollowerRound::start(leader, election_timeout);
        self.follower_round = Some(FollowerRead {
            round,
            request: 0,
            deadline: None,
            readers,
        });
        self.follower_step(now, step, out);
    }

    /// Carries out the running follower round's `step`: an ask goes over the peer line under a
    /// new number; a read or a failure ends the round.
    fn follower_step(&mut self, now: u64, step: FollowerReadStep, out: &mut Vec<Out>) {
        match step {
            FollowerStep::Ask => {
                let request = self.next_ctx();
                // The peer line's asks time out after two election timeouts (`leasehold_peer`).
                let deadline = now + 2 * self.election_timeout_ms() * 1000;
                let Some(read) = self.follower_round.as_mut() else {
                    return;
                };
                read.request = request;
                read.deadline = Some(deadline);
                out.push(Out::Peer {
                    to: read.round.leader(),
                    msg: PeerMsg::ReadIndex {
                        from: self.id,
                        request,
                    },
                });
            }
            // Looked at again after every event (`follow_round`).
            FollowerStep::AwaitProof { .. } => {}
            // The known-bad variant takes the round's read without the index it must apply
            // first: its readers read at once.
            FollowerStep::Read { .. } if self.variant == Variant::StaleFollowerRead => {
                self.finish_follower_round(now, Some(0), out)
            }
            FollowerStep::Read { index, .. } => self.finish_follower_round(now, Some(index), out),
            FollowerStep::Failed(_) => self.finish_follower_round(now, None, out),
        }
    }

    /// The leader's answer to the running follower round's ask (`index`: `None` if it failed).
    fn read_indexed(
        &mut self,
        now: u64,
        index: Option<u64>,
        proof: Option<ReadProof>,
        out: &mut Vec<Out>,
    ) {
        let seen = self.heartbeat_seen();
        let at = self.instant(now);
        let Some(read) = self.follower_round.as_mut() else {
            return;
        };
        read.deadline = None;
        let answer = index.map(|index| (index, proof, ())).ok_or(());
        let step = read.round.answered(answer, &seen, at);
        self.follower_step(now, step, out);
    }

    /// The newest leader heartbeat this member's core has stepped.
    fn heartbeat_seen(&self) -> HeartbeatSeen {
        self.core
            .as_ref()
            .map(|core| core.heartbeat_seen())
            .unwrap_or_default()
    }

    /// What the running follower round makes of this member now: its leader replaced, its ask
    /// timed out on the line, its proof heard, or its proof's deadline passed.
    fn follow_round(&mut self, now: u64, out: &mut Vec<Out>) {
        let leader = self.leader_elsewhere();
        let (seen, at) = (self.heartbeat_seen(), self.instant(now));
        let Some(read) = self.follower_round.as_mut() else {
            return;
        };
        let step = if let Some(step) = read.round.leader_is(leader) {
            Some(step)
        } else if read.deadline.is_some_and(|deadline| now >= deadline) {
            Some(FollowerStep::Failed(RoundEnd::Ask(())))
        } else {
            read.round.heard(&seen).or_else(|| read.round.timed_out(at))
        };
        if let Some(step) = step {
            self.follower_step(now, step, out);
        }
    }

    /// Ends the running follower round with the leader's read index (`None`: it failed): each
    /// reader reads once this member has applied that far. The next round, for those who joined
    /// meanwhile, goes to the leader this member knows now (none: they fail too).
    fn finish_follower_round(&mut self, now: u64, index: Option<u64>, out: &mut Vec<Out>) {
        let Some(round) = self.follower_round.take() else {
            return;
        };
        let mut readers = round.readers;
        let mut index = index;
        loop {
            for (origin, span) in readers {
                match index {
                    Some(index) => self.ready_reads.push((index, origin, span)),
                    None => reply(out, origin, 0, Answer::Failed("no leader")),
                }
            }
            let Some(next) = self.follower_reads.finished() else {
                return;
            };
            match self.leader_elsewhere() {
                Some(leader) => return self.start_follower_round(now, leader, next, out),
                None => {
                    readers = next;
                    index = None;
                }
            }
        }
    }

    /// `write` on behalf of `user`, as the server's edge sends it: with the caller its token
    /// names at this member's applied auth revision while auth is on, as it is otherwise.
    fn as_user(&self, user: &str, write: Write) -> Write {
        let auth = self.machine.auth();
        if !auth.enabled {
            return write;
        }
        let caller = auth.caller(user);
        match write {
            Write::Auth(AuthWrite { change, .. }) => Write::Auth(AuthWrite {
                caller: Some(caller),
                change,
            }),
            write => Write::As {
                caller,
                write: Box::new(write),
            },
        }
    }

    fn next_ctx(&mut self) -> u64 {
        self.next_ctx += 1;
        (self.id << 48) | self.next_ctx
    }

    fn range(&self, (key, range_end): &Span) -> Answer {
        let request = RangeRequest {
            key: key.clone(),
            range_end: range_end.clone(),
            ..RangeRequest::default()
        };
        match self.machine.store().range(&request) {
            Ok(r) => Answer::Kvs(
                r.kvs
                    .into_iter()
                    .map(|kv| (kv.key, kv.value.to_vec()))
                    .collect(),
            ),
            Err(_) => Answer::Failed("range"),
        }
    }

    /// A write, after its arrival (`arrive`), joins the write queue: taken at once (each write
    /// its own entry while nothing else is queued), or after the batching window in batching
    /// seeds, as the replica's proposer task takes what gathered during the last proposal.
    fn write(&mut self, now: u64, origin: Origin, write: Write, out: &mut Vec<Out>) {
        if let Some((origin, write)) = self.arrive(now, origin, write, out) {
            self.queue(now, origin, write, out);
        }
    }

    /// Into the write queue.
    fn queue(&mut self, now: u64, origin: Origin, write: Write, out: &mut Vec<Out>) {
        self.batch.push_back((origin, write));
        if self.batch_window_us == 0 {
            self.take_batches(now, out);
        } else if self.batch_at.is_none() {
            let at = now + self.batch_window_us;
            self.batch_at = Some(at);
            out.push(Out::FlushAt(at));
        }
    }

    /// A write as it reaches this member while it leads (`steps::leader_arrival`, as the
    /// replica's `renew_lease` and `leader_commit` take it): a renewal is decided at once, never
    /// after the batching window; what is left goes on to the write queue.
    fn arrive(
        &mut self,
        now: u64,
        origin: Origin,
        write: Write,
        out: &mut Vec<Out>,
    ) -> Option<(Origin, Write)> {
        if !self.status().is_some_and(|s| s.is_leader) {
            return Some((origin, write));
        }
        // The simulated disk never fills.
        match leader_arrival(&write, self.lease_clock.is_some(), false) {
            Arrival::Renew(id) => self.renew(now, origin, id, 1, out),
            Arrival::Queue | Arrival::NoSpace => Some((origin, write)),
        }
    }

    /// The batcher's turn (batching seeds): what gathered during the window.
    pub fn flush(&mut self, now: u64, out: &mut Vec<Out>) {
        if self.core.is_none() || self.batch_at.is_none_or(|at| at > now) {
            return;
        }
        self.batch_at = None;
        self.take_batches(now, out);
        self.drive(now, out);
    }

    /// Takes what is queued, a batch at a time (`steps::BatchFill`), as the replica's
    /// `propose_batches` does, until it is empty or a batch is held.
    fn take_batches(&mut self, now: u64, out: &mut Vec<Out>) {
        while self.proposer.holding().is_none() && !self.batch.is_empty() {
            let batch = BatchFill::take(&mut self.batch, |(_, write)| write);
            self.write_batch(now, batch, out);
        }
    }

    /// What becomes of one batch: `steps::Proposer`'s decision, carried out.
    fn write_batch(&mut self, now: u64, batch: Vec<(Origin, Write)>, out: &mut Vec<Out>) {
        let Some(status) = self.status() else { return };
        let at = self.instant(now);
        let step = self.proposer.batch(
            batch,
            |(_, write)| write,
            |(origin, _)| matches!(origin, Origin::Forwarded { .. }),
            self.id,
            status.is_leader,
            status.leader,
            self.lease_clock.is_some(),
            at,
        );
        for (origin, _) in step.no_leader {
            reply(out, origin, 0, Answer::Failed("no leader"));
        }
        match step.go {
            Go::Done => {}
            Go::Forward { leader, batch } => {
                self.note_batch(batch.len(), " (forwarded)", out);
                let mut writes = Vec::new();
                for (origin, write) in batch {
                    let request = self.next_ctx();
                    self.forwarded
                        .insert(request, (origin, write.answered_at_commit()));
                    writes.push((request, write));
                }
                out.push(Out::Peer {
                    to: leader,
                    msg: PeerMsg::ForwardBatch {
                        from: self.id,
                        writes,
                    },
                });
            }
            Go::Propose(batch) => {
                self.note_batch(batch.len(), "", out);
                self.stamp_and_propose(now, batch, out);
            }
            Go::Hold { .. } => out.push(Out::Note(format!(
                "m{} holds a batch until it times leases",
                self.id
            ))),
        }
    }

    fn note_batch(&self, len: usize, how: &str, out: &mut Vec<Out>) {
        if len > 1 {
            out.push(Out::Note(format!("m{} batches {len} writes{how}", self.id)));
        }
    }

    /// The held batch, once this member times leases or its wait has run out (stamped without
    /// lease time, it answers "no leader"); then what queued behind it.
    fn release_held(&mut self, now: u64, out: &mut Vec<Out>) {
        let at = self.instant(now);
        if let Some(batch) = self.proposer.release(self.lease_clock.is_some(), at) {
            self.stamp_and_propose(now, batch, out);
            if self.batch_at.is_none() {
                self.take_batches(now, out);
            }
        }
    }

    /// The stamp and the proposal of a leader's batch that passed the gate.
    fn stamp_and_propose(&mut self, now: u64, batch: Vec<(Origin, Write)>, out: &mut Vec<Out>) {
        let (origins, writes): (Vec<Origin>, Vec<Write>) = batch.into_iter().unzip();
        let timed: Vec<bool> = writes.iter().map(Write::is_lease_timed).collect();
        let proposal = match steps::stamp(
            self.lease_clock,
            self.instant(now),
            self.cover_margin_ms,
            writes,
        ) {
            Ok(proposal) => proposal,
            Err(_) => {
                for origin in origins {
                    reply(out, origin, 0, Answer::Failed("no leader"));
                }
                return;
            }
        };
        let mut waiters = Vec::new();
        for (pos, ((command, origin), timed)) in
            proposal.commands.iter().zip(origins).zip(timed).enumerate()
        {
            let command = match command {
                Command::As { command, .. } => command,
                command => command,
            };
            let mut stamped_at = None;
            if let Command::LeaseGrant { id, now_ms, .. }
            | Command::LeaseRenew { id, now_ms }
            | Command::LeaseCover { id, now_ms, .. } = command
            {
                out.push(Out::Stamped {
                    id: *id,
                    lease_ms: *now_ms,
                });
                stamped_at = timed.then_some(Stamp {
                    true_us: now,
                    lease_ms: *now_ms,
                    index: 0,
                });
            }
            waiters.push((pos, origin, stamped_at));
        }
        self.propose(proposal.commands, waiters, out);
    }

    /// A renewal on this member, which leads, decided as the replica's `renew_step` decides it
    /// (`steps::LeaderRenewals::renew`), for the `decisions`th time: answered from memory within
    /// the lease's cover (its cover extended in the background when less than half a margin is
    /// left), an end proposed for a lease past the deadline its holder was told, or returned to
    /// join the write queue (through the log, as a `LeaseCover`), as it is while this member does
    /// not time leases yet.
    fn renew(
        &mut self,
        now: u64,
        origin: Origin,
        id: LeaseId,
        decisions: usize,
        out: &mut Vec<Out>,
    ) -> Option<(Origin, Write)> {
        let Some(clock) = self.lease_clock else {
            return Some((origin, Write::LeaseRenew(LeaseRenew { id })));
        };
        let now_ms = clock.now_ms_ceil(self.instant(now));
        let applied = self.machine.applied().0;
        let answered = |ttl| Answer::Applied {
            applied: Applied::LeaseRenew(ttl),
            index: applied,
            pos: 0,
            stamped_at: Some(Stamp {
                true_us: now,
                lease_ms: now_ms,
                index: applied,
            }),
        };
        match self
            .renewals
            .renew(self.machine.leases(), id, now_ms, self.cover_margin_ms)
        {
            RenewStep::Answer { ttl_secs, cover } => {
                out.push(Out::Stamped {
                    id,
                    lease_ms: now_ms,
                });
                reply(out, origin, applied, answered(Some(ttl_secs)));
                if cover {
                    let renew = Write::LeaseRenew(LeaseRenew { id });
                    match steps::stamp(
                        self.lease_clock,
                        self.instant(now),
                        self.cover_margin_ms,
                        vec![renew],
                    ) {
                        Ok(proposal) => match self.propose(proposal.commands, Vec::new(), out) {
                            Some(index) => self.covering.push((index, id)),
                            None => self.renewals.covered(id),
                        },
                        Err(_) => self.renewals.covered(id),
                    }
                }
                None
            }
            RenewStep::NotFound => {
                reply(out, origin, applied, answered(None));
                None
            }
            RenewStep::Expire { cover_ms } => {
                let end = Command::LeaseExpireTold {
                    leases: vec![(id, cover_ms)],
                    now_ms,
                };
                let waiter = (0, origin, None);
                match self.propose_with(vec![end], vec![waiter], Some((id, decisions)), out) {
                    Some(index) => self.ending.push((index, vec![id])),
                    None => self.renewals.ended([id]),
                }
                None
            }
            RenewStep::ThroughLog => Some((origin, Write::LeaseRenew(LeaseRenew { id }))),
        }
    }

    /// Proposes one entry; each waiter is answered with its command's result (by `pos`).
    fn propose(
        &mut self,
        commands: Vec<Command>,
        waiters: Vec<(usize, Origin, Option<Stamp>)>,
        out: &mut Vec<Out>,
    ) -> Option<u64> {
        self.propose_with(commands, waiters, None, out)
    }

    /// [`Member::propose`]; `renewal_end`: the waiters are renewals waiting for their lease's
    /// end (see [`Waiter::renewal_end`]).
    fn propose_with(
        &mut self,
        commands: Vec<Command>,
        waiters: Vec<(usize, Origin, Option<Stamp>)>,
        renewal_end: Option<(LeaseId, usize)>,
        out: &mut Vec<Out>,
    ) -> Option<u64> {
        let core = self.core.as_mut()?;
        let data = encode_proposal(&Proposal { commands });
        if core.propose(data).is_err() {
            for (_, origin, _) in waiters {
                reply(out, origin, 0, Answer::Failed("proposal dropped"));
            }
            return None;
        }
        let status = core.status();
        if !waiters.is_empty() {
            let waiters = waiters
                .into_iter()
                .map(|(pos, origin, stamped_at)| Waiter {
                    pos,
                    origin,
                    stamped_at,
                    renewal_end,
                })
                .collect();
            self.waiters
                .insert(status.last_index, status.term, false, waiters);
        }
        Some(status.last_index)
    }

    pub fn peer(&mut self, now: u64, msg: PeerMsg, out: &mut Vec<Out>) {
        if self.core.is_none() {
            return;
        }
        match msg {
            // The leader takes a forwarded batch a write at a time, as they arrive, into its
            // own queue.
            PeerMsg::ForwardBatch { from, writes } => {
                for (request, write) in writes {
                    let origin = Origin::Forwarded {
                        member: from,
                        request,
                    };
                    self.write(now, origin, write, out);
                }
            }
            PeerMsg::ReadIndex { from, request } => self.leader_read(LeaderReader::Peer {
                member: from,
                request,
            }),
            PeerMsg::ReadIndexed {
                request,
                index,
                proof,
            } => {
                if self
                    .follower_round
                    .as_ref()
                    .is_some_and(|r| r.request == request && r.deadline.is_some())
                {
                    self.read_indexed(now, index, proof, out);
                }
            }
            PeerMsg::Forwarded {
                request,
                index,
                answer,
            } => {
                if let Some((origin, at_commit)) = self.forwarded.remove(&request) {
                    let applied_here = self.machine.applied().0 >= index;
                    let now_ok = match &answer {
                        Answer::Applied { applied, .. } => {
                            answered_before_apply(at_commit, applied)
                        }
                        _ => true,
                    };
                    if now_ok || applied_here {
                        reply(out, origin, 0, answer);
                    } else {
                        self.after_apply.push((index, origin, answer));
                    }
                }
            }
        }
        self.drive(now, out);
    }

    /// The expiry driver's clock is this member's; 1 ms ahead in the known-bad variant.
    fn expiry_skew(&self) -> Duration {
        if self.variant == Variant::EarlyExpiry {
            Duration::from_millis(1)
        } else {
            Duration::ZERO
        }
    }

    /// The expiry driver's pass (`steps::expiry_pass`), as the server's driver runs it: only on
    /// a leader that times leases, one proposal at a time, a failed one retried after the
    /// driver's retry interval.
    fn expiry_duties(&mut self, now: u64, out: &mut Vec<Out>) {
        let Some(clock) = self.lease_clock else {
            return;
        };
        if let Some(index) = self.duty {
            if self.machine.applied().0 < index {
                return;
            }
            self.duty = None;
        }
        if now < self.duty_retry {
            return;
        }
        let at = self.instant(now) + self.expiry_skew();
        let pass = expiry_pass(self.machine.leases(), &clock, at, &self.expiry);
        if let Some(work) = pass.work {
            // As `Replica::expiry_pass`: what it ends is marked before any renewal is decided.
            let ids: Vec<LeaseId> = match &work {
                ExpiryWork::Expire { leases, .. } => leases.iter().map(|(id, _)| *id).collect(),
                ExpiryWork::Tick { .. } => Vec::new(),
            };
            self.renewals.ending(ids.iter().copied());
            self.duty = self.propose(vec![work.command()], Vec::new(), out);
            match self.duty {
                Some(index) => self.ending.push((index, ids)),
                None => {
                    self.renewals.ended(ids);
                    self.duty_retry = now + self.expiry.retry.as_micros() as u64;
                }
            }
        }
    }

    /// When the expiry driver wakes next (true µs): the pass's own wake, as the server's driver
    /// sleeps until it; `None` while its proposal is in flight (its apply runs the next pass) or
    /// nothing is due.
    pub fn next_wake(&self, now: u64) -> Option<u64> {
        let clock = self.lease_clock?;
        if self.duty.is_some() {
            return None;
        }
        if now < self.duty_retry {
            return Some(self.duty_retry);
        }
        let skew = self.expiry_skew();
        let pass = expiry_pass(
            self.machine.leases(),
            &clock,
            self.instant(now) + skew,
            &self.expiry,
        );
        let at = pass.wake? - skew;
        let local =
            u64::try_from(at.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX);
        Some(self.clock.true_at(local))
    }

    /// The expiry driver wakes.
    pub fn wake(&mut self, now: u64, out: &mut Vec<Out>) {
        if self.core.is_none() {
            return;
        }
        self.expiry_duties(now, out);
        self.drive(now, out);
    }

    /// Handles every `Ready` there is with the Raft thread's own round, then what it made
    /// possible.
    fn drive(&mut self, now: u64, out: &mut Vec<Out>) {
        loop {
            self.after_progress(now, out);
            let Some(mut core) = self.core.take() else {
                return;
            };
            if !core.has_ready() {
                self.core = Some(core);
                break;
            }
            let mut reads = std::mem::replace(&mut self.reads, ReadBatcher::new(1, 1));
            let at = self.instant(now);
            let mut around = Around {
                member: self,
                out,
                sent: Vec::new(),
                wrote_log: false,
            };
            let round = driver::round(&mut core, &mut around, &mut reads, || at);
            let Around {
                sent, wrote_log, ..
            } = around;
            self.core = Some(core);
            self.reads = reads;
            for (to, bytes) in sent {
                out.push(Out::Raft {
                    to,
                    bytes,
                    after_sync: wrote_log,
                });
            }
            if let Err(e) = round {
                self.stopped(e, out);
                return;
            }
        }
    }

    /// The core stopped on an error: the member stops, as the replica's `failed` ends it.
    fn stopped(&mut self, e: CoreError, out: &mut Vec<Out>) {
        out.push(Out::Note(format!("m{} core stopped: {e}", self.id)));
        self.refused = Some(e.to_string());
        self.crash();
    }

    /// What the applied index now allows: reads, answers that wait for this member's apply,
    /// the next promotion step, the expiry driver's next pass; and what a change of leader ends.
    fn after_progress(&mut self, now: u64, out: &mut Vec<Out>) {
        let answers = std::mem::take(&mut *self.read_answers.lock().expect("not poisoned"));
        for (number, result) in answers {
            if self
                .leader_round
                .as_ref()
                .is_none_or(|r| r.number != number)
            {
                continue;
            }
            let applied = self.machine.applied().0;
            if let Some(read) = self.leader_round.as_mut()
                && let LeaderStep::Failed(_) = read.round.confirmed(result, applied)
            {
                self.finish_leader_round(None, out);
            }
        }
        // A leader round ends once this member has applied its read index, as the replica's
        // round waits to apply before it answers.
        let applied = self.machine.applied().0;
        if let Some(LeaderStep::Read(confirmed)) = self
            .leader_round
            .as_ref()
            .and_then(|r| r.round.applied::<ReadError>(applied))
        {
            self.finish_leader_round(Some(confirmed), out);
        }
        // A round still waiting for its read index fails once this member stops leading (only
        // with the core at hand: within the Raft thread's round it is out, and says nothing).
        if let Some(read) = &self.leader_round
            && let Some(status) = self.status()
            && read
                .round
                .leadership::<ReadError>(status.is_leader, status.term)
                .is_some()
        {
            self.finish_leader_round(None, out);
        }
        self.follow_round(now, out);
        let applied = self.machine.applied().0;
        let mut waiting = Vec::new();
        for (index, origin, span) in std::mem::take(&mut self.ready_reads) {
            if applied >= index {
                let answer = self.range(&span);
                reply(out, origin, 0, answer);
            } else {
                waiting.push((index, origin, span));
            }
        }
        self.ready_reads = waiting;
        let mut waiting = Vec::new();
        for (index, origin, answer) in std::mem::take(&mut self.after_apply) {
            if applied >= index {
                reply(out, origin, 0, answer);
            } else {
                waiting.push((index, origin, answer));
            }
        }
        self.after_apply = waiting;
        let (done, ending) = std::mem::take(&mut self.ending)
            .into_iter()
            .partition(|(index, _)| applied >= *index);
        self.ending = ending;
        for (_, ids) in done {
            self.renewals.ended(ids);
        }
        let (done, covering) = std::mem::take(&mut self.covering)
            .into_iter()
            .partition(|(index, _)| applied >= *index);
        self.covering = covering;
        for (_, id) in done {
            self.renewals.covered(id);
        }
        self.promotion_steps(now, out);
        for (origin, id, decisions) in std::mem::take(&mut self.decide_again) {
            if let Some((origin, write)) = self.renew(now, origin, id, decisions, out) {
                self.queue(now, origin, write, out);
            }
        }
        self.release_held(now, out);
        self.expiry_duties(now, out);
    }

    /// Drives `steps::Promotion` as the replica's `follow_leadership` does: a read index, then
    /// (once applied that far) the promotion's command, then (once that is applied) the clock.
    fn promotion_steps(&mut self, now: u64, out: &mut Vec<Out>) {
        let Some(status) = self.status() else { return };
        let applied = self.machine.applied().0;
        if let Some((term, index)) = self.confirming
            && applied >= index
        {
            self.confirming = None;
            // As the replica's `promote`: lease time goes on from the replicated lease time, so
            // the time no leader could take renewals is not counted against any lease.
            let lease_now_ms = self.machine.leases().clock_ms();
            let election_timeout = Duration::from_millis(self.election_timeout_ms());
            if let Some(command) = self
                .promotion
                .confirmed(term, lease_now_ms, election_timeout)
            {
                let mut commands = vec![command];
                if self.variant == Variant::FreshTtl {
                    // etcd's way: every inherited lease starts its TTL again.
                    commands.extend(self.machine.leases().by_deadline().into_iter().map(|id| {
                        Command::LeaseRenew {
                            id,
                            now_ms: lease_now_ms,
                        }
                    }));
                }
                match self.propose(commands, Vec::new(), out) {
                    Some(index) => self.promoting = Some((term, index)),
                    None => self.promotion.failed(term),
                }
            }
        }
        if let Some((term, index)) = self.promoting
            && applied >= index
        {
            self.promoting = None;
            if status.is_leader && status.term == term {
                if let Some(clock) = self.promotion.committed(term, self.instant(now)) {
                    let lease_ms = clock.now_ms(self.instant(now));
                    self.lease_clock = Some(clock);
                    self.forget_renewals();
                    out.push(Out::Promoted {
                        lease_ms,
                        extend_ms: self.election_timeout_ms(),
                    });
                    out.push(Out::Note(format!(
                        "m{} promoted at term {term}, lease time {lease_ms}",
                        self.id
                    )));
                }
            } else {
                // Another leader's entry took its place.
                self.promotion.failed(term);
            }
        }
        match self.promotion.leadership(status.is_leader, status.term) {
            PromotionStep::Confirm { term } => {
                self.confirming = None;
                self.promoting = None;
                self.leader_read(LeaderReader::Promotion(term));
            }
            PromotionStep::Demote => {
                self.lease_clock = None;
                self.forget_renewals();
                self.duty = None;
                out.push(Out::Demoted);
                out.push(Out::Note(format!("m{} demoted", self.id)));
            }
            PromotionStep::Wait => {}
        }
    }

    /// At promotion and demotion, as the replica's.
    fn forget_renewals(&mut self) {
        self.renewals.clear();
        self.ending.clear();
        self.covering.clear();
    }

    fn answer(
        &mut self,
        index: u64,
        term: u64,
        conf_change: bool,
        applied: Vec<Applied>,
        out: &mut Vec<Out>,
    ) {
        for (_, waiters, outcome) in self.waiters.applied(index, term, conf_change) {
            let entry_applied = outcome == EntryOutcome::Applied;
            for waiter in waiters {
                let renewal_end = waiter.renewal_end.filter(|_| entry_applied);
                let answer = if let Some((id, decisions)) = renewal_end {
                    // The replica's `renew_as_leader`: TTL 0 once the lease is gone; an end that
                    // found it renewed through the log first revoked nothing, and the renewal is
                    // decided again (once this apply is done).
                    match after_end(self.machine.leases().contains(id), decisions) {
                        AfterEnd::Gone => Answer::Applied {
                            applied: Applied::LeaseRenew(None),
                            index,
                            pos: waiter.pos,
                            stamped_at: None,
                        },
                        AfterEnd::DecideAgain => {
                            out.push(Out::Note(format!(
                                "m{} decides a renewal of {} again: its end revoked nothing",
                                self.id,
                                id.get()
                            )));
                            self.decide_again.push((waiter.origin, id, decisions + 1));
                            continue;
                        }
                        AfterEnd::GiveUp => Answer::Failed("no leader"),
                    }
                } else if entry_applied {
                    match applied.get(waiter.pos) {
                        Some(applied) => Answer::Applied {
                            applied: applied.clone(),
                            index,
                            pos: waiter.pos,
                            stamped_at: waiter.stamped_at.map(|s| Stamp { index, ..s }),
                        },
                        None => Answer::Failed("no reply"),
                    }
                } else {
                    Answer::Failed("no leader")
                };
                reply(out, waiter.origin, index, answer);
            }
        }
    }

    /// Applies one round's committed entries, as the replica's machine does on the Raft thread.
    fn apply(&mut self, committed: Vec<Committed>, out: &mut Vec<Out>) {
        for c in committed {
            let (index, term) = (c.entry().index, c.entry().term);
            let conf_change = matches!(c, Committed::ConfChange { .. });
            let applied = match c {
                Committed::Normal(entry) => {
                    let named = lease_ids_in(&entry.data);
                    let before: Vec<bool> = named
                        .iter()
                        .map(|(_, id, _)| self.machine.leases().contains(*id))
                        .collect();
                    let replies = self
                        .machine
                        .apply_normal(term, index, &entry.data)
                        .unwrap_or_else(|e| {
                            panic!("m{}: entry {index} does not decode: {e}", self.id)
                        });
                    for (pos, (change, applied)) in auth_changes_in(&entry.data)
                        .into_iter()
                        .zip(&replies)
                        .enumerate()
                    {
                        if let (Some(change), Applied::Auth(Ok(()))) = (change, applied) {
                            out.push(Out::AuthChanged { index, pos, change });
                        }
                    }
                    for ((pos, id, by_client), was) in named.into_iter().zip(before) {
                        if was && !self.machine.leases().contains(id) {
                            out.push(Out::LeaseEnded {
                                id,
                                by_client,
                                index,
                                pos,
                            });
                        }
                    }
                    replies
                }
                Committed::ConfChange { conf_state, .. } => {
                    self.machine.apply_membership(
                        term,
                        index,
                        &conf_state.voters,
                        &conf_state.learners,
                    );
                    Vec::new()
                }
            };
            self.answer(index, term, conf_change, applied, out);
        }
    }
}

/// A member during one round of its core: the replica's machine on the Raft thread, with the
/// messages it sends held until the round says whether it wrote the log (they then leave after
/// the simulated `fdatasync`).
struct Around<'a> {
    member: &'a mut Member,
    out: &'a mut Vec<Out>,
    sent: Vec<(u64, Vec<u8>)>,
    wrote_log: bool,
}

impl Host for Around<'_> {
    fn send(&mut self, messages: Vec<eraftpb::Message>) {
        for m in messages {
            self.sent.push((m.to, encode_message(&m)));
        }
    }

    fn install_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), HostError> {
        let m = &mut *self.member;
        match m.machine.install(&snapshot.data) {
            Ok(()) => {
                m.saved = snapshot.data.to_vec();
                let (index, _) = m.machine.applied();
                // As the replica's: proposals whose entries the snapshot covered are lost.
                for waiters in m.waiters.skipped_to(index) {
                    for waiter in waiters {
                        reply(self.out, waiter.origin, 0, Answer::Failed("no leader"));
                    }
                }
                self.out.push(Out::Note(format!(
                    "m{} installed a snapshot at {index}",
                    m.id
                )));
                Ok(())
            }
            Err(e) => panic!("m{}: a snapshot that does not decode: {e}", m.id),
        }
    }
}

impl driver::Machine for Around<'_> {
    fn apply(&mut self, committed: Vec<Committed>) {
        self.member.apply(committed, self.out);
    }

    fn failed(&mut self, _: CoreError) {
        // `round` returns the error; `Member::drive` stops the member on it.
    }

    fn log_written(&mut self, _took: Duration, _appended: Option<(u64, u64)>) {
        self.wrote_log = true;
    }
}

/// Answers whoever asked: a client directly, a follower's forwarded write over the peer link.
fn reply(out: &mut Vec<Out>, origin: Origin, index: u64, answer: Answer) {
    match origin {
        Origin::Forwarded { member, request } => out.push(Out::Peer {
            to: member,
            msg: PeerMsg::Forwarded {
                request,
                index,
                answer,
            },
        }),
        origin @ Origin::Client { .. } => out.push(Out::Reply { to: origin, answer }),
    }
}

/// A normal entry's commands, each as applied (a user's command unwrapped); none if it holds
/// no proposal (a new leader's blank entry).
fn commands_in(data: &[u8]) -> Vec<Command> {
    let commands = leasehold_raft::decode_proposal(data).map_or_else(Vec::new, |p| p.commands);
    commands
        .into_iter()
        .map(|c| match c {
            Command::As { command, .. } => *command,
            c => c,
        })
        .collect()
}

/// Each command of a normal entry: its auth change, if it is one.
fn auth_changes_in(data: &[u8]) -> Vec<Option<AuthChange>> {
    commands_in(data)
        .into_iter()
        .map(|c| match c {
            Command::Auth(AuthWrite { change, .. }) => Some(change),
            _ => None,
        })
        .collect()
}

/// The leases a normal entry's commands name (to see which of them it ended), each with whether
/// a client's revoke named it.
fn lease_ids_in(data: &[u8]) -> Vec<(usize, LeaseId, bool)> {
    commands_in(data)
        .into_iter()
        .enumerate()
        .flat_map(|(pos, c)| match c {
            Command::LeaseExpire { ids, .. } => {
                ids.into_iter().map(|id| (pos, id, false)).collect()
            }
            Command::LeaseExpireTold { leases, .. } => {
                leases.into_iter().map(|(id, _)| (pos, id, false)).collect()
            }
            Command::LeaseRenew { id, .. } | Command::LeaseCover { id, .. } => {
                vec![(pos, id, false)]
            }
            Command::LeaseRevoke { id } => vec![(pos, id, true)],
            _ => Vec::new(),
        })
        .collect()
}
