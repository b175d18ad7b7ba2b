//! The one owner of the Raft node: it ticks, steps, proposes, and handles each `Ready` in the
//! order raft-rs requires. It does no I/O but through the write-ahead log's [`Fs`] and the
//! host's [`Host`], and reads no clock: time reaches it only as [`Core::tick`].
//!
//! One `Ready`, in order (raft-rs.md §1, thesis §10.2.1):
//! 1. the leader's messages go out first, so followers write while the leader does;
//! 2. a snapshot from the leader is installed by the host, durably, then marked in the log;
//! 3. entries and the hard state are appended to the log in one frame and one `fdatasync`;
//! 4. the messages that promise something about the disk (votes, append acks) go out;
//! 5. committed entries are handed to the host, which applies them and reports back with
//!    [`Core::applied_to`];
//! 6. the light ready's commit index, messages and committed entries follow;
//! 7. if those entries hold a membership change, the commit index is written and synced first.
//!
//! Read-index requests that reach a leader before it has committed an entry of its own term are
//! held here and handed to raft-rs once it has (raft-rs drops them without an answer, which cost
//! every new leader's first reads, and its lease promotion, a retry: see [`Core::read_index`]).

use std::collections::BTreeMap;
use std::path::Path;

use leasehold_wal::proto::{Batch, Compacted};
use leasehold_wal::{Fs, Wal, WalError, WalOptions};
use raft::eraftpb::{self, Entry, Snapshot};
use raft::{RawNode, ReadState, StateRole};

use crate::proto::{
    conf_state_from_raft, conf_state_to_raft, entry_from_raft, entry_to_raft, hard_state_from_raft,
    hard_state_to_raft,
};
use crate::storage::LogStorage;

/// How a member runs Raft. The defaults are etcd's: a 100 ms tick as the heartbeat, an election
/// after 10 ticks without a leader, PreVote and CheckQuorum on, 1 MiB messages, 512 in flight.
#[derive(Clone, Debug)]
pub struct CoreConfig {
    /// This member's Raft ID (etcd's member ID); never 0.
    pub id: u64,
    pub election_tick: usize,
    /// Elections are timed out at a tick drawn from `[election_tick, max_election_tick)`; 0:
    /// raft-rs's default, twice `election_tick`. raft-rs draws with an unseeded generator, so
    /// a simulator that must replay makes the range one tick wide.
    pub max_election_tick: usize,
    pub heartbeat_tick: usize,
    pub pre_vote: bool,
    pub max_size_per_msg: u64,
    pub max_inflight_msgs: usize,
    /// Entries kept in the log behind a snapshot, for followers that lag a little (etcd's
    /// `SnapshotCatchUpEntries`).
    pub catch_up_entries: u64,
    /// Of those, the entries every follower already holds are kept only up to this many bytes
    /// of data: they serve no follower now, only one that may fall behind later (which then
    /// gets a snapshot).
    pub catch_up_bytes: u64,
    /// Of the entries the state machine holds durably, only the newest keep their data in
    /// memory, up to this many bytes; a follower that lags gets the older ones read back from
    /// the write-ahead log.
    pub log_memory_bytes: u64,
    /// Of the entries read back from the write-ahead log for a follower that lags, at most this
    /// many bytes wait to be sent to it at once, counting what the transport holds for it
    /// ([`Core::watch_transport`]); raft-rs sends it more once the transport has taken them.
    /// Keep it under the transport's own bound on what waits for one peer (leasehold-peer's
    /// `LINK_QUEUE_BYTES`, 2 MiB), which drops what is past it.
    pub catch_up_window_bytes: u64,
    pub wal: WalOptions,
    /// etcd's `--force-new-cluster`: at open, every other member is removed by membership
    /// changes appended to the log and committed with everything before them, so that this
    /// member leads a cluster of one with all the data it holds ([`forced_removals`]).
    pub force_new_cluster: bool,
}

impl CoreConfig {
    pub fn new(id: u64) -> CoreConfig {
        CoreConfig {
            id,
            election_tick: 10,
            max_election_tick: 0,
            heartbeat_tick: 1,
            pre_vote: true,
            max_size_per_msg: 1024 * 1024,
            max_inflight_msgs: 512,
            catch_up_entries: 5000,
            catch_up_bytes: 4 << 20,
            log_memory_bytes: 1 << 20,
            catch_up_window_bytes: 1 << 20,
            wal: WalOptions::default(),
            force_new_cluster: false,
        }
    }
}

/// What the host's state machine holds durably: the core starts from here and hands out the
/// committed entries after `applied_index` again.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoint {
    pub applied_index: u64,
    pub applied_term: u64,
    /// The membership as of `applied_index` (for a new cluster: its first voters).
    pub conf_state: leasehold_wal::proto::ConfState,
}

/// What the core needs of the member around it.
pub trait Host {
    /// Sends messages to their members (best effort: Raft retries what is lost).
    fn send(&mut self, messages: Vec<eraftpb::Message>);
    /// Replaces the state machine with a snapshot from the leader, durably, before returning.
    fn install_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), HostError>;
}

/// The host could not install a snapshot; the member must stop.
#[derive(Debug, thiserror::Error)]
#[error("installing a snapshot: {0}")]
pub struct HostError(pub String);

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The log and the state machine's checkpoint do not fit together.
    #[error("the raft log does not fit the state machine: {0}")]
    Mismatch(String),
}

/// What one round of [`Core::handle_ready`] produced for the host.
#[derive(Debug, Default)]
pub struct Handled {
    /// Committed entries to apply, in order.
    pub committed: Vec<Entry>,
    /// Read indexes confirmed (ReadIndex), each with its request's context.
    pub read_states: Vec<ReadState>,
    /// The leader or this member's role changed.
    pub role_changed: bool,
    /// The round appended to the log (and so waited for its `fdatasync`).
    pub wrote_log: bool,
    /// The first and last index of the entries this round appended to the log.
    pub appended: Option<(u64, u64)>,
    /// The round's appends as they reached the log's file.
    pub writes: Vec<leasehold_wal::Written>,
}

/// Ticks between tries to make the log's spare segment again while it has none.
const SPARE_RETRY_TICKS: u64 = 10;

/// Raft's progress as the host reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreStatus {
    pub id: u64,
    pub term: u64,
    /// 0: no leader known.
    pub leader: u64,
    pub is_leader: bool,
    pub commit: u64,
    pub applied: u64,
    pub last_index: u64,
}

pub struct Core<F: Fs> {
    node: RawNode<LogStorage>,
    wal: Wal<F>,
    catch_up_entries: u64,
    catch_up_bytes: u64,
    log_memory_bytes: u64,
    /// On a leader: for how many ticks each follower has waited in raft-rs's snapshot state.
    snapshot_ticks: BTreeMap<u64, usize>,
    /// How many ticks a follower may wait there before the leader probes it again.
    snapshot_ticks_max: usize,
    /// Read-index requests held while this member leads without an entry of its term committed:
    /// its own (by context) and its followers' (the message). At most [`HELD_READS_MAX`].
    held_reads: Vec<HeldRead>,
    /// Ticks since this core started.
    ticks: u64,
    /// From each peer: since which tick its messages have come without a gap of an election
    /// timeout, and the tick of the last one (etcd's peer "active since").
    heard: BTreeMap<u64, Heard>,
    election_tick: u64,
    /// On a follower: what its leader's heartbeats of the current term carried, and whether
    /// that changed since the host was last told.
    heartbeat_seen: HeartbeatSeen,
    heartbeat_told: bool,
}

/// What a follower has stepped of its leader's heartbeats in the leader's term: how many, and
/// the newest read-index context among them (raft-rs sends each read round's context on a
/// heartbeat to every member). A follower that holds a round's context has had traffic from the
/// leader after that round began, which a follower the leader cannot reach never has, even
/// when the leader confirms the round with the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeartbeatSeen {
    pub leader: u64,
    pub term: u64,
    pub heartbeats: u64,
    /// 0: no heartbeat of this leader's term carried a context of [`crate::reads`]'s form.
    pub context: u64,
}

impl HeartbeatSeen {
    /// Whether this follower has stepped a heartbeat of `leader` that proves `proof`: one of
    /// the round's term carrying its context or a later one.
    pub fn proves(&self, leader: u64, proof: crate::reads::ReadProof) -> bool {
        (self.leader, self.term) == (leader, proof.term) && self.context >= proof.context
    }
}

/// When messages from a peer began to come without a gap, and when the last one came (ticks).
#[derive(Clone, Copy, Debug)]
struct Heard {
    since: u64,
    last: u64,
}

/// A read-index request held until the leader has committed in its term.
#[derive(Debug)]
enum HeldRead {
    Own(Vec<u8>),
    Forwarded(eraftpb::Message),
}

/// More read-index requests than this, held at once, are dropped (as raft-rs drops them all):
/// each reader batches its reads into one request and retries it only every few ticks, so
/// a leader holds far fewer than this while it commits its first entry.
const HELD_READS_MAX: usize = 4096;

impl<F: Fs> std::fmt::Debug for Core<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("status", &self.status())
            .field("wal", &self.wal)
            .finish()
    }
}

/// The membership changes `--force-new-cluster` commits for member `me`: one per other member
/// (voter or learner) of the membership as of the log's last entry (the checkpoint's, then the
/// changes after it), each its own single change; first the promotion of `me` if it is a
/// learner. A member that is not in that membership is refused: it has no data of its own to
/// lead with.
fn forced_removals(
    me: u64,
    checkpoint: &Checkpoint,
    entries: &[Entry],
) -> Result<Vec<eraftpb::ConfChangeV2>, CoreError> {
    use eraftpb::ConfChangeType::{AddLearnerNode, AddNode, RemoveNode};
    let mut voters: std::collections::BTreeSet<u64> =
        checkpoint.conf_state.voters.iter().copied().collect();
    let mut learners: std::collections::BTreeSet<u64> =
        checkpoint.conf_state.learners.iter().copied().collect();
    let committed = entries
        .iter()
        .filter(|e| e.index > checkpoint.applied_index)
        .filter(|e| e.get_entry_type() != eraftpb::EntryType::EntryNormal);
    for entry in committed {
        let cc = crate::proto::decode_conf_change(entry)
            .map_err(|e| CoreError::Mismatch(format!("conf change at {}: {e}", entry.index)))?;
        for change in cc.get_changes() {
            let id = change.node_id;
            match change.get_change_type() {
                AddNode => {
                    learners.remove(&id);
                    voters.insert(id);
                }
                AddLearnerNode => {
                    voters.remove(&id);
                    learners.insert(id);
                }
                RemoveNode => {
                    voters.remove(&id);
                    learners.remove(&id);
                }
            }
        }
    }
    if !voters.contains(&me) && !learners.contains(&me) {
        return Err(CoreError::Mismatch(format!(
            "--force-new-cluster: member {me:x} is not in the cluster this data dir holds"
        )));
    }
    let single = |change_type, node_id| {
        let mut single = eraftpb::ConfChangeSingle::default();
        single.set_change_type(change_type);
        single.node_id = node_id;
        let mut cc = eraftpb::ConfChangeV2::default();
        cc.mut_changes().push(single);
        cc
    };
    let mut changes = Vec::new();
    if learners.contains(&me) {
        changes.push(single(AddNode, me));
    }
    for id in voters.iter().chain(&learners).filter(|id| **id != me) {
        changes.push(single(RemoveNode, *id));
    }
    Ok(changes)
}

impl<F: Fs> Core<F> {
    /// Opens the log in `dir` and starts Raft from the host's checkpoint. A member that is the
    /// only voter campaigns at once.
    pub fn open(
        fs: F,
        dir: &Path,
        config: &CoreConfig,
        checkpoint: Checkpoint,
        logger: &slog::Logger,
    ) -> Result<Core<F>, CoreError> {
        let (mut wal, recovered) = Wal::open_on(fs, dir, config.wal)?;
        let applied = checkpoint.applied_index;
        if recovered.compacted.index > applied {
            return Err(CoreError::Mismatch(format!(
                "the log is compacted to {} but the state machine has applied only {applied}",
                recovered.compacted.index
            )));
        }
        let mut entries: Vec<Entry> = recovered.entries.into_iter().map(entry_to_raft).collect();
        let mut compacted = (recovered.compacted.index, recovered.compacted.term);
        let held_term = if applied == compacted.0 {
            Some(compacted.1)
        } else {
            entries.iter().find(|e| e.index == applied).map(|e| e.term)
        };
        if applied > 0 && held_term != Some(checkpoint.applied_term) {
            // The host installed a snapshot and the process stopped before the log was marked:
            // mark it now, dropping what does not agree with the snapshot.
            let mark = Compacted {
                index: applied,
                term: checkpoint.applied_term,
            };
            wal.append(&Batch {
                compacted: Some(mark),
                ..Batch::default()
            })?;
            entries.clear();
            compacted = (applied, checkpoint.applied_term);
        }
        let mut hard_state = hard_state_to_raft(recovered.hard_state);
        // Applied entries were committed, whatever commit index last reached the disk; and no
        // term is older than the log's.
        hard_state.commit = hard_state.commit.max(applied);
        hard_state.term = hard_state.term.max(compacted.1);
        let last = entries.last().map_or(compacted.0, |e| e.index);
        if hard_state.commit > last {
            return Err(CoreError::Mismatch(format!(
                "commit index {} beyond the last entry {last}",
                hard_state.commit
            )));
        }
        if config.force_new_cluster {
            let changes = forced_removals(config.id, &checkpoint, &entries)?;
            if !changes.is_empty() {
                // The removals follow the last entry, in the current term, and are committed
                // with everything before them. etcd drops the entries its log does not record
                // as committed; this log records the commit index only now and then (with
                // membership changes), so entries other members acknowledged may lie past it:
                // all are kept. An entry never committed becomes committed: a write whose
                // client was told nothing (a timeout) may then appear.
                let first = entries.len();
                let mut index = last;
                for cc in &changes {
                    index += 1;
                    let mut e = Entry::default();
                    e.set_entry_type(eraftpb::EntryType::EntryConfChangeV2);
                    e.term = hard_state.term;
                    e.index = index;
                    e.data = crate::proto::encode_conf_change(cc).into();
                    entries.push(e);
                }
                hard_state.commit = index;
                wal.append(&Batch {
                    compacted: None,
                    entries: entries[first..].iter().map(entry_from_raft).collect(),
                    hard_state: Some(hard_state_from_raft(&hard_state)),
                })?;
                tracing::warn!(
                    removed = changes.len(),
                    commit = hard_state.commit,
                    "forcing a new cluster of this member alone (--force-new-cluster): every \
                     other member removed, every entry of the log committed"
                );
            }
        }
        let mut storage = LogStorage::new(
            hard_state,
            conf_state_to_raft(checkpoint.conf_state.clone()),
            compacted.0,
            compacted.1,
            entries,
            Box::new(wal.reader()),
        );
        storage.set_send_window(config.catch_up_window_bytes);
        let raft_config = raft::Config {
            id: config.id,
            election_tick: config.election_tick,
            min_election_tick: config.election_tick,
            max_election_tick: config.max_election_tick,
            heartbeat_tick: config.heartbeat_tick,
            applied,
            max_size_per_msg: config.max_size_per_msg,
            max_inflight_msgs: config.max_inflight_msgs,
            check_quorum: true,
            pre_vote: config.pre_vote,
            read_only_option: raft::ReadOnlyOption::Safe,
            ..raft::Config::default()
        };
        raft_config.validate()?;
        let mut node = RawNode::new(&raft_config, storage, logger)?;
        let voters = &checkpoint.conf_state.voters;
        if voters.len() == 1 && voters[0] == config.id && checkpoint.conf_state.learners.is_empty()
        {
            node.campaign()?;
        }
        Ok(Core {
            node,
            wal,
            catch_up_entries: config.catch_up_entries,
            catch_up_bytes: config.catch_up_bytes,
            log_memory_bytes: config.log_memory_bytes,
            snapshot_ticks: BTreeMap::new(),
            snapshot_ticks_max: 2 * config.election_tick,
            held_reads: Vec::new(),
            ticks: 0,
            heard: BTreeMap::new(),
            election_tick: config.election_tick as u64,
            heartbeat_seen: HeartbeatSeen::default(),
            heartbeat_told: true,
        })
    }

    /// One logical tick (a heartbeat interval of real time, counted by the host's clock).
    pub fn tick(&mut self) {
        self.ticks += 1;
        if self.ticks.is_multiple_of(SPARE_RETRY_TICKS) && !self.wal.has_spare() {
            // The disk may have room again (the spare is a whole segment: not tried each tick).
            self.wal.make_spare();
        }
        self.node.tick();
        self.resume_snapshot_waits();
        self.release_held_reads();
        self.resume_fetches();
    }

    /// How many bytes of messages the host's transport holds for a peer, not yet sent (read
    /// when entries are read back for that peer: see [`CoreConfig::catch_up_window_bytes`]).
    pub fn watch_transport(&mut self, waiting: crate::WaitingBytes) {
        self.node.mut_store().watch_transport(waiting);
    }

    /// Makes again the appends raft-rs was refused while the send window was shut, if it is
    /// open now. The appends of a follower that answers are made again anyway, when its answer
    /// comes; this is for one that has nothing in flight.
    fn resume_fetches(&mut self) {
        for context in self.node.store().take_fetch_waits() {
            self.node.on_entries_fetched(context);
        }
    }

    /// raft-rs sends a follower nothing more after a snapshot until that follower's append
    /// response says it installed it, or the host reports the snapshot done. The snapshot
    /// travels on the same stream as every message, so the host never learns that: a lost
    /// response (a dropped message, a broken stream) left the follower behind for good, and a
    /// two-voter cluster without a quorum (found by the simulator, seed 128). So a follower
    /// that waited two election timeouts is reported done: the leader probes it again, and
    /// sends another snapshot if the first never arrived.
    fn resume_snapshot_waits(&mut self) {
        if self.node.raft.state != StateRole::Leader {
            self.snapshot_ticks.clear();
            return;
        }
        let mut waiting = BTreeMap::new();
        let mut resumed = Vec::new();
        for (id, progress) in self.node.raft.prs().iter() {
            if progress.state == raft::ProgressState::Snapshot {
                let ticks = self.snapshot_ticks.get(id).copied().unwrap_or(0) + 1;
                if ticks > self.snapshot_ticks_max {
                    resumed.push(*id);
                } else {
                    waiting.insert(*id, ticks);
                }
            }
        }
        self.snapshot_ticks = waiting;
        for id in resumed {
            self.node.report_snapshot(id, raft::SnapshotStatus::Finish);
        }
    }

    /// A peer's message, decoded with [`crate::decode_peer_message`].
    pub fn step(&mut self, message: eraftpb::Message) -> Result<(), CoreError> {
        self.heard_from(message.from);
        if message.get_msg_type() == eraftpb::MessageType::MsgReadIndex && self.holds_reads() {
            self.hold(HeldRead::Forwarded(message));
            return Ok(());
        }
        let heartbeat = (message.get_msg_type() == eraftpb::MessageType::MsgHeartbeat)
            .then(|| (message.from, message.term, context_of(&message.context)));
        let stepped = match self.node.step(message) {
            // A response from a member no longer in the configuration, say: Raft ignores it.
            Err(raft::Error::StepPeerNotFound) => Ok(()),
            other => Ok(other?),
        };
        if let (Ok(()), Some((from, term, context))) = (&stepped, heartbeat) {
            self.saw_heartbeat(from, term, context);
        }
        self.release_held_reads();
        stepped
    }

    /// Records a heartbeat stepped from this follower's leader in the leader's term.
    fn saw_heartbeat(&mut self, from: u64, term: u64, context: Option<u64>) {
        let raft = &self.node.raft;
        if raft.state == StateRole::Leader || raft.term != term || raft.leader_id != from {
            return;
        }
        let seen = &mut self.heartbeat_seen;
        if (seen.leader, seen.term) != (from, term) {
            *seen = HeartbeatSeen {
                leader: from,
                term,
                ..HeartbeatSeen::default()
            };
        }
        seen.heartbeats += 1;
        seen.context = seen.context.max(context.unwrap_or(0));
        self.heartbeat_told = false;
    }

    /// [`Core::heartbeat_seen`] if it changed since the last call.
    pub fn take_heartbeat_seen(&mut self) -> Option<HeartbeatSeen> {
        (!std::mem::replace(&mut self.heartbeat_told, true)).then_some(self.heartbeat_seen)
    }

    /// What this follower has stepped of its leader's heartbeats ([`HeartbeatSeen`]).
    pub fn heartbeat_seen(&self) -> HeartbeatSeen {
        self.heartbeat_seen
    }

    /// The term whose leader's heartbeats prove a read round this member confirmed to the
    /// followers it reaches: `None` unless it leads with other voters (a lone voter confirms
    /// a round without a heartbeat).
    pub fn read_proof(&self) -> Option<u64> {
        let raft = &self.node.raft;
        (raft.state == StateRole::Leader && !raft.prs().is_singleton()).then_some(raft.term)
    }

    /// Proposes one normal entry (only a leader takes it: `ProposalDropped` otherwise, and
    /// while a leadership transfer runs).
    pub fn propose(&mut self, data: Vec<u8>) -> Result<(), CoreError> {
        Ok(self.node.propose(Vec::new(), data)?)
    }

    /// Proposes a membership change, encoded by us (see [`crate::encode_conf_change`]).
    pub fn propose_conf_change(&mut self, cc: &eraftpb::ConfChangeV2) -> Result<(), CoreError> {
        let data = crate::proto::encode_conf_change(cc);
        let mut entry = eraftpb::Message::default();
        entry.set_msg_type(eraftpb::MessageType::MsgPropose);
        entry.from = self.node.raft.id;
        let mut e = Entry::default();
        e.set_entry_type(eraftpb::EntryType::EntryConfChangeV2);
        e.data = data.into();
        entry.entries.push(e);
        Ok(self.node.step(entry)?)
    }

    /// Applies a committed membership change; returns the change (decoded by us, never by
    /// rust-protobuf) and the membership to persist with the state machine.
    pub fn apply_conf_change(
        &mut self,
        entry: &Entry,
    ) -> Result<(eraftpb::ConfChangeV2, leasehold_wal::proto::ConfState), CoreError> {
        let cc = crate::proto::decode_conf_change(entry)
            .map_err(|e| CoreError::Mismatch(format!("conf change at {}: {e}", entry.index)))?;
        let cs = self.node.apply_conf_change(&cc)?;
        self.node.mut_store().set_conf_state(cs.clone());
        Ok((cc, conf_state_from_raft(&cs)))
    }

    /// Asks for a read index; it comes back in [`Handled::read_states`] with `context`.
    ///
    /// raft-rs drops a read-index request, without an answer, while the leader has not yet
    /// committed an entry of its term (its commit index may be behind what the old leader
    /// committed). The asker then waited for its retry: a new leader's lease promotion, which
    /// starts with a read index, lost half a second, and a leader killed every two election
    /// timeouts kept dead clients' leases alive past their bound (found by the simulator, seed
    /// 119 with `--kill-churn-timeouts 2`). So such requests are held here, and handed to
    /// raft-rs as soon as the leader's first entry commits (or it stops leading).
    pub fn read_index(&mut self, context: Vec<u8>) {
        if self.holds_reads() {
            self.hold(HeldRead::Own(context));
        } else {
            self.own_read_index(context);
        }
    }

    /// Hands an own read-index request to raft-rs. A member that does not lead has raft-rs
    /// forward it, and the leader's heartbeats then carry it to every follower: a context of
    /// [`crate::reads`]'s form goes marked ([`FORWARDED_MARK`], taken off its answer), so that
    /// no follower counts it as a round of the leader's own ([`HeartbeatSeen`]).
    fn own_read_index(&mut self, mut context: Vec<u8>) {
        if self.node.raft.state != StateRole::Leader && context.len() == 8 {
            context.push(FORWARDED_MARK);
        }
        self.node.read_index(context);
    }

    /// Whether read-index requests are held now: this member leads and has not committed an
    /// entry of its term.
    fn holds_reads(&self) -> bool {
        self.node.raft.state == StateRole::Leader && !self.node.raft.commit_to_current_term()
    }

    fn hold(&mut self, read: HeldRead) {
        if self.held_reads.len() < HELD_READS_MAX {
            self.held_reads.push(read);
        }
    }

    /// Hands the held read-index requests to raft-rs once they need no longer be held.
    fn release_held_reads(&mut self) {
        if self.held_reads.is_empty() || self.holds_reads() {
            return;
        }
        for read in std::mem::take(&mut self.held_reads) {
            match read {
                HeldRead::Own(context) => self.own_read_index(context),
                HeldRead::Forwarded(message) => {
                    // An error (a sender no longer in the configuration) leaves the request
                    // unanswered, as raft-rs's drop did: its reader asks again.
                    let _ = self.node.step(message);
                }
            }
        }
    }

    /// Hands leadership to `to` (ignored unless this member leads and `to` is a voter).
    pub fn transfer_leader(&mut self, to: u64) {
        self.node.transfer_leader(to);
    }

    pub fn campaign(&mut self) -> Result<(), CoreError> {
        Ok(self.node.campaign()?)
    }

    /// A peer could not be reached: Raft stops sending it appends optimistically.
    pub fn report_unreachable(&mut self, id: u64) {
        self.node.report_unreachable(id);
    }

    /// The host applied everything up to `index`.
    pub fn applied_to(&mut self, index: u64) {
        self.node.advance_apply_to(index);
    }

    /// Whether the log has room set aside for what this member writes without clients
    /// ([`leasehold_wal::Wal::has_room`]): without it, the host takes no writes that add data.
    pub fn log_has_room(&self) -> bool {
        self.wal.has_room()
    }

    /// Whether [`Core::handle_ready`] has work.
    pub fn has_ready(&self) -> bool {
        self.node.has_ready()
    }

    pub fn status(&self) -> CoreStatus {
        let raft = &self.node.raft;
        CoreStatus {
            id: raft.id,
            term: raft.term,
            leader: raft.leader_id,
            is_leader: raft.state == StateRole::Leader,
            commit: raft.raft_log.committed,
            applied: raft.raft_log.applied,
            last_index: raft.raft_log.last_index(),
        }
    }

    /// For how many ticks messages from `peer` have come without a gap of an election timeout,
    /// if the last one came within one (etcd's "connected since", which its reconfiguration
    /// checks ask of the member that takes the change).
    pub fn heard_for_ticks(&self, peer: u64) -> Option<u64> {
        let heard = self.heard.get(&peer)?;
        (self.ticks - heard.last <= self.election_tick).then(|| self.ticks - heard.since)
    }

    /// How many ticks ago the last message from `peer` came; `None` if none ever did.
    pub fn heard_ago_ticks(&self, peer: u64) -> Option<u64> {
        self.heard.get(&peer).map(|h| self.ticks - h.last)
    }

    /// The transport heard from `peer` (a keepalive on its link, not a Raft message).
    pub fn note_heard(&mut self, peer: u64) {
        self.heard_from(peer);
    }

    fn heard_from(&mut self, peer: u64) {
        if peer == 0 || peer == self.node.raft.id {
            return;
        }
        let now = self.ticks;
        let election_tick = self.election_tick;
        self.heard
            .entry(peer)
            .and_modify(|h| {
                if now - h.last > election_tick {
                    h.since = now;
                }
                h.last = now;
            })
            .or_insert(Heard {
                since: now,
                last: now,
            });
    }

    /// On a leader, the last log index `id` is known to hold (Raft's match index for it; the
    /// leader's own for its own id). `None` off the leader or for a non-member.
    pub fn matched(&self, id: u64) -> Option<u64> {
        let raft = &self.node.raft;
        if raft.state != StateRole::Leader {
            return None;
        }
        raft.prs().get(id).map(|p| p.matched)
    }

    /// The index up to which the log holds the host's snapshot (and no entries).
    pub fn compacted_index(&self) -> u64 {
        self.node.store().compacted().0
    }

    /// Whether a leader needs a snapshot at or beyond this index to catch a follower up.
    pub fn snapshot_wanted(&self) -> Option<u64> {
        self.node.store().snapshot_wanted()
    }

    /// The host made `snapshot` durable (its data is the state machine at the snapshot's
    /// index): followers that lag get it, and the log keeps only
    /// [`CoreConfig::catch_up_entries`] entries behind it.
    pub fn compact(&mut self, snapshot: Snapshot) -> Result<(), CoreError> {
        let index = snapshot.get_metadata().index;
        if index > self.node.raft.raft_log.applied {
            return Err(CoreError::Mismatch(format!(
                "a snapshot at {index} beyond the applied index {}",
                self.node.raft.raft_log.applied
            )));
        }
        self.node.mut_store().set_snapshot(snapshot);
        self.compact_log(index)
    }

    /// The host's state at `index` (at most what it applied) is durable: the log keeps only
    /// [`CoreConfig::catch_up_entries`] entries behind it, and of those only
    /// [`CoreConfig::catch_up_bytes`] that every follower already holds. A follower that falls
    /// further behind needs a snapshot, which the host offers ([`Core::compact`]) once
    /// [`Core::snapshot_wanted`] says one is. Of the entries up to `index`, only the newest
    /// [`CoreConfig::log_memory_bytes`] keep their data in memory.
    pub fn compact_log(&mut self, index: u64) -> Result<(), CoreError> {
        let index = index.min(self.node.raft.raft_log.applied);
        let by_count = index.saturating_sub(self.catch_up_entries);
        let by_bytes = self
            .node
            .store()
            .first_within_bytes(index, self.catch_up_bytes)
            .saturating_sub(1);
        // What the slowest follower still lacks stays (a follower's leader knows; a follower
        // knows of no other).
        let raft = &self.node.raft;
        let lacked = if raft.state == StateRole::Leader {
            raft.prs()
                .iter()
                .filter(|(id, _)| **id != raft.id)
                .map(|(_, p)| p.matched)
                .min()
                .unwrap_or(u64::MAX)
        } else {
            u64::MAX
        };
        let keep_from = by_count.max(by_bytes.min(lacked));
        let store = self.node.store();
        if keep_from > store.compacted().0 {
            let term = store
                .term_of(keep_from)
                .ok_or_else(|| CoreError::Mismatch(format!("no entry at {keep_from}")))?;
            self.wal.compact(Compacted {
                index: keep_from,
                term,
            })?;
            self.node.mut_store().compact(keep_from);
        }
        let store = self.node.store();
        let in_memory_from = store.first_within_bytes(store.last(), self.log_memory_bytes);
        self.node
            .mut_store()
            .chill(index.min(in_memory_from.saturating_sub(1)));
        Ok(())
    }

    /// The bytes of entry data the log holds in memory.
    pub fn log_bytes_in_memory(&self) -> u64 {
        self.node.store().bytes_in_memory()
    }

    /// Handles one `Ready`, if there is one: see the module docs for the order.
    pub fn handle_ready(&mut self, host: &mut impl Host) -> Result<Handled, CoreError> {
        let mut handled = Handled::default();
        if !self.node.has_ready() {
            return Ok(handled);
        }
        let mut ready = self.node.ready();
        if !ready.messages().is_empty() {
            host.send(ready.take_messages());
        }
        if ready.ss().is_some() {
            handled.role_changed = true;
        }
        let mut installed = None;
        if !ready.snapshot().is_empty() {
            let snapshot = ready.snapshot().clone();
            installed = Some(snapshot.get_metadata().index);
            host.install_snapshot(&snapshot)?;
            let meta = snapshot.get_metadata();
            let mut hs = self.node.store().hard_state().clone();
            hs.term = hs.term.max(meta.term);
            hs.commit = hs.commit.max(meta.index);
            self.wal.append(&Batch {
                compacted: Some(Compacted {
                    index: meta.index,
                    term: meta.term,
                }),
                hard_state: Some(hard_state_from_raft(&hs)),
                ..Batch::default()
            })?;
            self.node.mut_store().apply_snapshot(&snapshot);
            self.node.mut_store().set_snapshot(snapshot);
        }
        let entries = ready.take_entries();
        if let (Some(first), Some(last)) = (entries.first(), entries.last()) {
            handled.appended = Some((first.index, last.index));
        }
        let hard_state = ready.hs().cloned();
        if !entries.is_empty() || (hard_state.is_some() && ready.must_sync()) {
            self.wal.append(&Batch {
                compacted: None,
                entries: entries.iter().map(entry_from_raft).collect(),
                hard_state: hard_state.as_ref().map(hard_state_from_raft),
            })?;
            handled.wrote_log = true;
        }
        self.node.mut_store().append(entries);
        if let Some(hs) = hard_state {
            self.node.mut_store().set_hard_state(hs);
        }
        if !ready.persisted_messages().is_empty() {
            host.send(ready.take_persisted_messages());
        }
        handled.committed = ready.take_committed_entries();
        handled.read_states = ready.take_read_states();
        for state in &mut handled.read_states {
            if state.request_ctx.len() == 9 && state.request_ctx.last() == Some(&FORWARDED_MARK) {
                state.request_ctx.pop();
            }
        }
        let mut light = self.node.advance_append(ready);
        if let Some(index) = installed {
            // The host's state is the snapshot's now. raft-rs learns that only from the host
            // (`advance_append` leaves its applied index where it was), and until it does, a
            // campaign reads the entries from there on, which the snapshot replaced: raft-rs
            // panics (found by the simulator, seed 280).
            self.node.advance_apply_to(index);
        }
        if let Some(commit) = light.commit_index() {
            // Not written on its own: a restart takes the commit index from the last hard state
            // written, raised to what the state machine applied (see `Core::open`).
            self.node.mut_store().set_commit(commit);
        }
        if !light.messages().is_empty() {
            host.send(light.take_messages());
        }
        handled.committed.extend(light.take_committed_entries());
        self.sync_commit_of_membership(&mut handled)?;
        handled.writes = self.wal.take_written();
        // A single member commits its first entry here, not in `step`.
        self.release_held_reads();
        // Every message made so far (the entries read back for them included) is the host's.
        self.node.store().sent();
        Ok(handled)
    }

    /// Writes the commit index durably before a membership change is handed over to apply. The
    /// commit index is otherwise written only with entries or a vote (a restart learns it again
    /// from the quorum), but once a removal is applied the operator may stop the removed member
    /// for good, and it may have been the only other voter that knew the change committed: a
    /// leader that then restarted with the commit index from before the change would be back
    /// in the old membership, waiting for a member that is gone (found by the simulator, seed
    /// 125 of an early build: a removal that left a leader and a new member still waiting
    /// for its snapshot).
    fn sync_commit_of_membership(&mut self, handled: &mut Handled) -> Result<(), CoreError> {
        let Some(last_change) = handled
            .committed
            .iter()
            .rev()
            .find(|e| e.get_entry_type() != eraftpb::EntryType::EntryNormal)
            .map(|e| e.index)
        else {
            return Ok(());
        };
        let mut hs = self.node.store().hard_state().clone();
        hs.commit = hs.commit.max(last_change);
        self.wal.append(&Batch {
            hard_state: Some(hard_state_from_raft(&hs)),
            ..Batch::default()
        })?;
        handled.wrote_log = true;
        Ok(())
    }
}

/// The byte a follower appends to a read-index context it has raft-rs forward to the leader.
const FORWARDED_MARK: u8 = 0xF0;

/// A read-index context of [`crate::reads`]'s form (8 bytes, big-endian, counting up from 1),
/// as the leader began it (a forwarded one is 9 bytes long: [`FORWARDED_MARK`]).
fn context_of(bytes: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(bytes).ok().map(u64::from_be_bytes)
}
