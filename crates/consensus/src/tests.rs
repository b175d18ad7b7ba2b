//! Whole clusters of cores in one thread: members on [`MemFs`], a message queue as the network,
//! ticks as the only clock. Every loop is bounded in steps.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::PathBuf;

use bytes::Bytes;
use leasehold_wal::proto::ConfState;
use leasehold_wal::{Crash, MemFs, WalOptions};
use raft::eraftpb::{self, Snapshot};

use crate::storage::entry_size;
use crate::{Checkpoint, Core, CoreConfig, Host, HostError, decode_peer_message, encode_message};

/// A state machine that keeps the data of every normal entry applied, and a checkpoint of
/// itself that survives a crash.
#[derive(Clone, Debug, Default)]
struct Machine {
    applied: Vec<Bytes>,
    applied_index: u64,
    applied_term: u64,
    conf_state: ConfState,
    /// Snapshots installed from a leader.
    installs: usize,
    /// What a crash leaves: the last checkpoint.
    durable: Option<Box<Machine>>,
}

impl Machine {
    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            applied_index: self.applied_index,
            applied_term: self.applied_term,
            conf_state: self.conf_state.clone(),
        }
    }

    fn save(&mut self) {
        let mut copy = self.clone();
        copy.durable = None;
        self.durable = Some(Box::new(copy));
    }

    fn encode(&self) -> Bytes {
        let mut out = Vec::new();
        for data in &self.applied {
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(data);
        }
        Bytes::from(out)
    }

    fn decode(bytes: &[u8]) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            out.push(Bytes::copy_from_slice(&bytes[at + 4..at + 4 + len]));
            at += 4 + len;
        }
        out
    }
}

struct Member {
    fs: MemFs,
    core: Option<Core<MemFs>>,
    machine: Machine,
    read_states: Vec<(u64, Vec<u8>)>,
}

struct MemberHost<'a> {
    id: u64,
    outbox: &'a mut VecDeque<(u64, u64, Vec<u8>)>,
    machine: &'a mut Machine,
}

impl Host for MemberHost<'_> {
    fn send(&mut self, messages: Vec<eraftpb::Message>) {
        for m in messages {
            self.outbox.push_back((self.id, m.to, encode_message(&m)));
        }
    }

    fn install_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), HostError> {
        let meta = snapshot.get_metadata();
        self.machine.applied = Machine::decode(&snapshot.data);
        self.machine.applied_index = meta.index;
        self.machine.applied_term = meta.term;
        self.machine.conf_state = crate::proto::conf_state_from_raft(meta.get_conf_state());
        self.machine.installs += 1;
        self.machine.save();
        Ok(())
    }
}

struct Cluster {
    members: BTreeMap<u64, Member>,
    network: VecDeque<(u64, u64, Vec<u8>)>,
    /// Links that drop everything, both ways.
    cut: HashSet<(u64, u64)>,
    /// Links that drop the accepting append responses one way: (from, to).
    muted: HashSet<(u64, u64)>,
    /// Links that drop everything one way: (from, to).
    one_way: HashSet<(u64, u64)>,
    /// Every (term, leader) seen, to check one leader per term.
    leaders: BTreeMap<u64, u64>,
    catch_up_entries: u64,
    catch_up_bytes: u64,
    log_memory_bytes: u64,
    catch_up_window_bytes: u64,
    /// Every append delivered with entries: (from, to, the entries' size as raft-rs counts it).
    appends: Vec<(u64, u64, u64)>,
}

fn config(id: u64, catch_up_entries: u64, catch_up_bytes: u64) -> CoreConfig {
    let mut c = CoreConfig::new(id);
    c.catch_up_entries = catch_up_entries;
    c.catch_up_bytes = catch_up_bytes;
    // Entries chill (their data left in the write-ahead log only) from a few KiB back, so that
    // catching a follower up reads them back in the tests that write more.
    c.log_memory_bytes = 4096;
    c.wal = WalOptions {
        segment_bytes: 64 * 1024,
    };
    // Distinct election timeouts keep the tests from depending on raft-rs's unseeded draws
    // deciding who campaigns first (raft-rs.md §11).
    c
}

fn dir() -> PathBuf {
    PathBuf::from("/member/wal")
}

impl Cluster {
    fn new(ids: &[u64]) -> Cluster {
        Cluster::with_catch_up(ids, 5000)
    }

    fn with_catch_up(ids: &[u64], catch_up_entries: u64) -> Cluster {
        Cluster::with_catch_up_bytes(ids, catch_up_entries, CoreConfig::new(0).catch_up_bytes)
    }

    fn with_catch_up_bytes(ids: &[u64], catch_up_entries: u64, catch_up_bytes: u64) -> Cluster {
        let window = CoreConfig::new(0).catch_up_window_bytes;
        Cluster::with_limits(ids, catch_up_entries, catch_up_bytes, 4096, window)
    }

    fn with_limits(
        ids: &[u64],
        catch_up_entries: u64,
        catch_up_bytes: u64,
        log_memory_bytes: u64,
        catch_up_window_bytes: u64,
    ) -> Cluster {
        let mut cluster = Cluster {
            members: BTreeMap::new(),
            network: VecDeque::new(),
            cut: HashSet::new(),
            muted: HashSet::new(),
            one_way: HashSet::new(),
            leaders: BTreeMap::new(),
            catch_up_entries,
            catch_up_bytes,
            log_memory_bytes,
            catch_up_window_bytes,
            appends: Vec::new(),
        };
        for &id in ids {
            let machine = Machine {
                conf_state: ConfState {
                    voters: ids.to_vec(),
                    ..ConfState::default()
                },
                ..Machine::default()
            };
            let mut member = Member {
                fs: MemFs::new(),
                core: None,
                machine,
                read_states: Vec::new(),
            };
            member.machine.save();
            cluster.members.insert(id, member);
            cluster.start(id);
        }
        cluster
    }

    /// (Re)starts member `id` from what its disk and its checkpoint hold.
    fn start(&mut self, id: u64) {
        self.start_with(id, false);
    }

    /// [`Cluster::start`], with `--force-new-cluster` or not.
    fn start_with(&mut self, id: u64, force_new_cluster: bool) {
        let mut cfg = config(id, self.catch_up_entries, self.catch_up_bytes);
        cfg.log_memory_bytes = self.log_memory_bytes;
        cfg.catch_up_window_bytes = self.catch_up_window_bytes;
        cfg.force_new_cluster = force_new_cluster;
        let member = self.members.get_mut(&id).expect("member");
        let durable = member.machine.durable.clone().expect("a saved checkpoint");
        member.machine = *durable;
        member.machine.save();
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let core = Core::open(
            member.fs.clone(),
            &dir(),
            &cfg,
            member.machine.checkpoint(),
            &logger,
        )
        .expect("core opens");
        member.core = Some(core);
    }

    /// The power goes at member `id`: unsynced writes are lost and the machine reverts to its
    /// checkpoint.
    fn crash(&mut self, id: u64) {
        let member = self.members.get_mut(&id).expect("member");
        member.core = None;
        member.fs.crash(Crash::LoseUnsynced);
        self.network
            .retain(|(from, to, _)| *from != id && *to != id);
    }

    fn core(&mut self, id: u64) -> &mut Core<MemFs> {
        self.members
            .get_mut(&id)
            .and_then(|m| m.core.as_mut())
            .expect("a running member")
    }

    /// Handles every ready and delivers every message until nothing moves; `true` if anything
    /// did.
    fn settle(&mut self) -> bool {
        let mut moved = false;
        for _ in 0..10_000 {
            let mut progress = false;
            let ids: Vec<u64> = self.members.keys().copied().collect();
            for id in ids {
                progress |= self.handle(id);
            }
            while let Some((from, to, bytes)) = self.network.pop_front() {
                progress = true;
                let muted = self.muted.contains(&(from, to))
                    && decode_peer_message(&bytes, to).is_ok_and(|m| {
                        m.get_msg_type() == eraftpb::MessageType::MsgAppendResponse && !m.reject
                    });
                if self.cut.contains(&(from, to))
                    || self.cut.contains(&(to, from))
                    || self.one_way.contains(&(from, to))
                    || muted
                {
                    continue;
                }
                let Some(member) = self.members.get_mut(&to) else {
                    continue;
                };
                let Some(core) = member.core.as_mut() else {
                    continue;
                };
                let message = decode_peer_message(&bytes, to).expect("a message we encoded");
                if message.get_msg_type() == eraftpb::MessageType::MsgAppend
                    && !message.entries.is_empty()
                {
                    let size = message.entries.iter().map(entry_size).sum();
                    self.appends.push((from, to, size));
                }
                core.step(message).expect("step");
            }
            if !progress {
                return moved;
            }
            moved = true;
        }
        panic!("the cluster never settled");
    }

    fn handle(&mut self, id: u64) -> bool {
        let member = self.members.get_mut(&id).expect("member");
        let Some(core) = member.core.as_mut() else {
            return false;
        };
        if !core.has_ready() {
            return false;
        }
        let mut host = MemberHost {
            id,
            outbox: &mut self.network,
            machine: &mut member.machine,
        };
        let handled = core.handle_ready(&mut host).expect("ready handled");
        for entry in handled.committed {
            assert_eq!(
                entry.index,
                member.machine.applied_index + 1,
                "member {id} applies in order"
            );
            match entry.get_entry_type() {
                eraftpb::EntryType::EntryNormal => {
                    if !entry.data.is_empty() {
                        member.machine.applied.push(entry.data.clone());
                    }
                }
                _ => {
                    member.machine.conf_state = core.apply_conf_change(&entry).expect("conf").1;
                }
            }
            member.machine.applied_index = entry.index;
            member.machine.applied_term = entry.term;
            core.applied_to(entry.index);
        }
        for rs in handled.read_states {
            member.read_states.push((rs.index, rs.request_ctx));
        }
        let status = core.status();
        if status.is_leader {
            let seen = self.leaders.entry(status.term).or_insert(id);
            assert_eq!(*seen, id, "two leaders in term {}", status.term);
        }
        true
    }

    /// `id` checkpoints its machine as a snapshot and compacts its log behind it, so that a
    /// member that lacks the compacted entries needs the snapshot; the machine checkpointed.
    fn compact_with_snapshot(&mut self, id: u64) -> Machine {
        let machine = self.members[&id].machine.clone();
        let mut snapshot = Snapshot {
            data: machine.encode(),
            ..Default::default()
        };
        snapshot.mut_metadata().index = machine.applied_index;
        snapshot.mut_metadata().term = machine.applied_term;
        snapshot
            .mut_metadata()
            .set_conf_state(crate::proto::conf_state_to_raft(machine.conf_state.clone()));
        self.core(id).compact(snapshot).expect("compact");
        machine
    }

    fn tick_all(&mut self) {
        for member in self.members.values_mut() {
            if let Some(core) = member.core.as_mut() {
                core.tick();
            }
        }
    }

    /// Ticks until `done` holds, settling after each tick; panics after `ticks` ticks.
    fn run_until(&mut self, ticks: usize, mut done: impl FnMut(&mut Cluster) -> bool) {
        for _ in 0..ticks {
            self.settle();
            if done(self) {
                return;
            }
            self.tick_all();
        }
        panic!("not done within {ticks} ticks");
    }

    fn leader(&self) -> Option<u64> {
        self.members.iter().find_map(|(id, m)| {
            m.core
                .as_ref()
                .filter(|c| c.status().is_leader)
                .map(|_| *id)
        })
    }

    fn elect(&mut self) -> u64 {
        self.run_until(200, |c| c.leader().is_some());
        self.leader().expect("a leader")
    }

    fn applied(&self, id: u64) -> &[Bytes] {
        &self.members[&id].machine.applied
    }

    /// Every member's applied data is a prefix of the longest.
    fn check_prefixes(&self) {
        let longest = self
            .members
            .values()
            .map(|m| &m.machine.applied)
            .max_by_key(|a| a.len())
            .expect("members");
        for (id, m) in &self.members {
            assert_eq!(
                &longest[..m.machine.applied.len()],
                &m.machine.applied[..],
                "member {id} applied something else"
            );
        }
    }

    fn propose(&mut self, id: u64, data: &str) {
        self.core(id)
            .propose(data.as_bytes().to_vec())
            .expect("the leader takes a proposal");
    }
}

fn data(items: &[Bytes]) -> Vec<String> {
    items
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect()
}

#[test]
fn a_single_member_leads_at_once_and_commits_alone() {
    let mut c = Cluster::new(&[1]);
    c.settle();
    assert_eq!(c.leader(), Some(1), "a lone voter campaigns at start");
    c.propose(1, "a");
    c.propose(1, "b");
    c.settle();
    assert_eq!(data(c.applied(1)), ["a", "b"]);
}

#[test]
fn three_members_elect_one_leader_and_apply_the_same_entries() {
    let mut c = Cluster::new(&[1, 2, 3]);
    let leader = c.elect();
    for i in 0..50 {
        c.propose(leader, &format!("put {i}"));
        if i % 7 == 0 {
            c.settle();
        }
    }
    c.run_until(50, |c| {
        c.members.keys().all(|id| c.applied(*id).len() == 50)
    });
    c.check_prefixes();
    assert_eq!(data(c.applied(2))[49], "put 49");
}

#[test]
fn a_follower_that_crashes_loses_nothing_it_acknowledged_and_catches_up() {
    let mut c = Cluster::new(&[1, 2, 3]);
    let leader = c.elect();
    let follower = *c.members.keys().find(|id| **id != leader).unwrap();
    for i in 0..20 {
        c.propose(leader, &format!("a{i}"));
    }
    c.run_until(50, |c| c.applied(follower).len() == 20);
    c.crash(follower);
    for i in 0..20 {
        c.propose(leader, &format!("b{i}"));
    }
    c.settle();
    c.start(follower);
    c.run_until(100, |c| c.applied(follower).len() == 40);
    c.check_prefixes();
}

#[test]
fn a_new_leader_is_elected_after_the_leader_crashes_and_committed_entries_survive() {
    let mut c = Cluster::new(&[1, 2, 3]);
    let old = c.elect();
    for i in 0..10 {
        c.propose(old, &format!("x{i}"));
    }
    c.run_until(50, |c| {
        c.members.keys().all(|id| c.applied(*id).len() == 10)
    });
    c.crash(old);
    c.run_until(300, |c| c.leader().is_some_and(|l| l != old));
    let new = c.leader().unwrap();
    c.propose(new, "after");
    c.run_until(50, |c| c.applied(new).len() == 11);
    c.start(old);
    c.run_until(200, |c| c.applied(old).len() == 11);
    c.check_prefixes();
    assert_eq!(data(c.applied(old))[10], "after");
}

#[test]
fn a_whole_cluster_restart_keeps_every_committed_entry() {
    let mut c = Cluster::new(&[1, 2, 3]);
    let leader = c.elect();
    for i in 0..30 {
        c.propose(leader, &format!("k{i}"));
    }
    c.run_until(50, |c| {
        c.members.keys().all(|id| c.applied(*id).len() == 30)
    });
    for id in [1, 2, 3] {
        // Half the members checkpointed their machine on the way; the others replay it all.
        if id % 2 == 0 {
            c.members.get_mut(&id).unwrap().machine.save();
        }
        c.crash(id);
    }
    for id in [1, 2, 3] {
        c.start(id);
    }
    let leader = c.elect();
    c.propose(leader, "again");
    c.run_until(100, |c| {
        c.members.keys().all(|id| c.applied(*id).len() == 31)
    });
    c.check_prefixes();
}

#[test]
fn linearizable_reads_get_a_read_index_on_the_leader_and_on_a_follower() {
    let mut c = Cluster::new(&[1, 2, 3]);
    let leader = c.elect();
    c.propose(leader, "v");
    c.settle();
    let follower = *c.members.keys().find(|id| **id != leader).unwrap();
    c.core(leader).read_index(b"r1".to_vec());
    c.core(follower).read_index(b"r2".to_vec());
    c.run_until(20, |c| {
        !c.members[&leader].read_states.is_empty() && !c.members[&follower].read_states.is_empty()
    });
    let commit = c.core(leader).status().commit;
    assert_eq!(
        c.members[&leader].read_states,
        vec![(commit, b"r1".to_vec())]
    );
    assert_eq!(
        c.members[&follower].read_states,
        vec![(commit, b"r2".to_vec())]
    );
}

/// Three members with a leader that has committed an entry of its term, everything delivered:
/// the cluster, the leader and the two followers.
fn three_with_an_entry() -> (Cluster, u64, [u64; 2]) {
    let mut c = Cluster::new(&[1, 2, 3]);
    let leader = c.elect();
    c.propose(leader, "v");
    c.settle();
    let mut followers = c.members.keys().copied().filter(|id| *id != leader);
    let followers = [
        followers.next().expect("two followers"),
        followers.next().expect("two followers"),
    ];
    (c, leader, followers)
}

/// Each read round's context reaches, on the leader's heartbeat, every follower the leader's
/// traffic reaches; a follower that hears nothing from the leader (its inbound link dropped, its
/// outbound working) holds none, though the leader confirms the round with the third member.
/// That is what a follower's read waits for, so that it fails there as etcd's does.
#[test]
fn a_read_rounds_context_reaches_only_the_followers_the_leader_reaches() {
    let (mut c, leader, [reached, unreached]) = three_with_an_entry();
    let term = c.core(leader).status().term;
    c.one_way.insert((leader, unreached));
    c.core(leader).read_index(7u64.to_be_bytes().to_vec());
    c.run_until(20, |c| !c.members[&leader].read_states.is_empty());
    assert_eq!(
        c.members[&leader].read_states.len(),
        1,
        "the round is confirmed"
    );
    let seen = c.core(reached).heartbeat_seen();
    assert_eq!((seen.leader, seen.term), (leader, term));
    assert!(seen.context >= 7, "{seen:?}");
    assert!(
        c.core(unreached).heartbeat_seen().context < 7,
        "{:?}",
        c.core(unreached).heartbeat_seen()
    );
    assert_eq!(c.core(leader).read_proof(), Some(term));
    assert_eq!(c.core(reached).read_proof(), None);
}

/// A follower's own read round, which raft-rs forwards to the leader, comes back under the
/// context it was asked with; the leader's heartbeats carry it to the other follower, which does
/// not count it as a round of the leader's own (its count is the follower's, not the leader's).
#[test]
fn a_forwarded_read_round_is_not_taken_for_the_leaders_own() {
    let (mut c, leader, [asker, other]) = three_with_an_entry();
    let context = 1_000u64.to_be_bytes().to_vec();
    c.core(asker).read_index(context.clone());
    c.run_until(20, |c| !c.members[&asker].read_states.is_empty());
    // Everything the leader sent meanwhile, its heartbeats with the round's context included,
    // reaches the other follower.
    c.settle();
    let commit = c.core(leader).status().commit;
    assert_eq!(c.members[&asker].read_states, vec![(commit, context)]);
    assert!(
        c.core(other).heartbeat_seen().heartbeats > 0,
        "the other follower hears the leader"
    );
    assert_eq!(c.core(other).heartbeat_seen().context, 0);
}

/// A lone voter confirms a read round without a heartbeat: it offers no proof.
#[test]
fn a_lone_voter_offers_no_read_proof() {
    let mut c = Cluster::new(&[1]);
    let leader = c.elect();
    assert_eq!(c.core(leader).read_proof(), None);
}

/// raft-rs drops a read index that reaches a leader before it has committed an entry of its
/// term; the core holds such requests, its own and its followers', until that entry commits, so
/// they are answered then, not only when their reader asks again.
#[test]
fn reads_asked_of_a_new_leader_before_its_first_commit_are_answered_once_it_commits() {
    let mut c = Cluster::new(&[1, 2, 3]);
    let leader = c.elect();
    c.propose(leader, "v");
    c.settle();
    let target = *c.members.keys().find(|id| **id != leader).unwrap();
    let other = *c
        .members
        .keys()
        .find(|id| ![leader, target].contains(id))
        .unwrap();
    // The new leader hears no append acknowledged, so its first entry cannot commit.
    c.muted.insert((leader, target));
    c.muted.insert((other, target));
    c.core(leader).transfer_leader(target);
    c.run_until(30, |c| {
        c.leader() == Some(target) && c.core(other).status().leader == target
    });
    let status = c.core(target).status();
    assert!(
        status.commit < status.last_index,
        "the first entry is not committed yet"
    );
    c.core(target).read_index(b"own".to_vec());
    c.core(other).read_index(b"forwarded".to_vec());
    c.settle();
    assert!(c.members[&target].read_states.is_empty());
    assert!(c.members[&other].read_states.is_empty());
    c.muted.clear();
    c.run_until(30, |c| {
        !c.members[&target].read_states.is_empty() && !c.members[&other].read_states.is_empty()
    });
    let commit = c.core(target).status().commit;
    assert_eq!(c.core(target).status().last_index, commit);
    assert_eq!(
        c.members[&target].read_states,
        vec![(commit, b"own".to_vec())]
    );
    assert_eq!(
        c.members[&other].read_states,
        vec![(commit, b"forwarded".to_vec())]
    );
}

#[test]
fn leadership_moves_to_the_member_asked_for() {
    let mut c = Cluster::new(&[1, 2, 3, 4, 5]);
    let leader = c.elect();
    let target = *c.members.keys().rev().find(|id| **id != leader).unwrap();
    c.core(leader).transfer_leader(target);
    c.run_until(30, |c| c.leader() == Some(target));
    c.propose(target, "from the new leader");
    c.run_until(30, |c| c.members.keys().all(|id| c.applied(*id).len() == 1));
}

#[test]
fn a_minority_cut_off_cannot_elect_and_the_majority_goes_on() {
    let mut c = Cluster::new(&[1, 2, 3]);
    let leader = c.elect();
    let lone = *c.members.keys().find(|id| **id != leader).unwrap();
    for other in [1, 2, 3] {
        if other != lone {
            c.cut.insert((lone, other));
        }
    }
    for _ in 0..100 {
        c.tick_all();
        c.settle();
    }
    assert!(
        !c.core(lone).status().is_leader,
        "a member alone never leads"
    );
    assert_eq!(
        c.leader(),
        Some(leader),
        "PreVote: the cut-off member disturbed nobody"
    );
    c.propose(leader, "while cut");
    c.settle();
    c.cut.clear();
    c.run_until(50, |c| c.applied(lone).len() == 1);
    c.check_prefixes();
}

/// A 3-member cluster whose leader has taken 40 entries while one member was down, then
/// checkpointed and compacted its log: the entries that member lacks are gone, so only a
/// snapshot catches it up. The cluster, its leader, the (still down) member and the snapshot's
/// machine.
fn behind_a_snapshot() -> (Cluster, u64, u64, Machine) {
    let mut c = Cluster::with_catch_up(&[1, 2, 3], 5);
    let leader = c.elect();
    let behind = *c.members.keys().find(|id| **id != leader).unwrap();
    c.crash(behind);
    for i in 0..40 {
        c.propose(leader, &format!("s{i}"));
    }
    c.settle();
    let machine = c.compact_with_snapshot(leader);
    (c, leader, behind, machine)
}

/// Past the byte bound, the log keeps only what a follower still lacks: everything once every
/// follower holds it, and a down follower's missing entries (within the count bound), which
/// catch it up without a snapshot.
#[test]
fn the_log_keeps_past_its_byte_bound_only_what_a_follower_lacks() {
    // Ten entries proposed and applied, then the leader's log compacted behind them: where
    // the leader applied to.
    fn ten_then_compact(c: &mut Cluster, leader: u64, name: &str) -> u64 {
        for i in 0..10 {
            c.propose(leader, &format!("{name}{i}"));
        }
        c.settle();
        let applied = c.members[&leader].machine.applied_index;
        c.core(leader).compact_log(applied).unwrap();
        applied
    }
    let mut c = Cluster::with_catch_up_bytes(&[1, 2, 3], 5000, 0);
    let leader = c.elect();
    let applied = ten_then_compact(&mut c, leader, "a");
    assert_eq!(
        c.core(leader).compacted_index(),
        applied,
        "every follower holds it all"
    );
    let behind = *c.members.keys().find(|id| **id != leader).unwrap();
    c.crash(behind);
    let applied_now = ten_then_compact(&mut c, leader, "b");
    assert!(applied_now > applied);
    assert_eq!(
        c.core(leader).compacted_index(),
        applied,
        "what the down member lacks stays"
    );
    c.start(behind);
    c.run_until(100, |c| c.applied(behind).len() == 20);
    assert_eq!(
        c.members[&behind].machine.installs, 0,
        "caught up from the log"
    );
    c.check_prefixes();
}

/// Three members with the default log limits but no applied entry's data kept in memory, and a
/// leader elected: (cluster, leader, one follower).
fn no_log_data_in_memory() -> (Cluster, u64, u64) {
    no_log_data_in_memory_within(CoreConfig::new(0).catch_up_window_bytes)
}

/// [`no_log_data_in_memory`], with at most `window` bytes read back waiting to be sent.
fn no_log_data_in_memory_within(window: u64) -> (Cluster, u64, u64) {
    let defaults = CoreConfig::new(0);
    let mut c = Cluster::with_limits(
        &[1, 2, 3],
        defaults.catch_up_entries,
        defaults.catch_up_bytes,
        0,
        window,
    );
    let leader = c.elect();
    let behind = *c.members.keys().find(|id| **id != leader).unwrap();
    (c, leader, behind)
}

/// `behind` goes down while the leader applies 30 entries ("while down 0".."while down 29") and
/// compacts its log behind them; what the leader applied to.
fn thirty_while_down(c: &mut Cluster, leader: u64, behind: u64) -> u64 {
    c.crash(behind);
    for i in 0..30 {
        c.propose(leader, &format!("while down {i}"));
    }
    c.settle();
    let applied = c.members[&leader].machine.applied_index;
    c.core(leader).compact_log(applied).unwrap();
    applied
}

/// With no entry's data kept in memory, a follower that was down is caught up from entries read
/// back from the write-ahead log, data and all, without a snapshot.
#[test]
fn a_follower_that_was_down_is_caught_up_from_entries_read_back_from_the_log() {
    let (mut c, leader, behind) = no_log_data_in_memory();
    let applied = thirty_while_down(&mut c, leader, behind);
    assert_eq!(
        c.core(leader).compacted_index(),
        0,
        "what the follower lacks is kept"
    );
    assert_eq!(
        c.core(leader).log_bytes_in_memory(),
        0,
        "no applied entry's data stays in memory"
    );
    c.start(behind);
    c.run_until(100, |c| c.applied(behind).len() == 30);
    assert_eq!(
        c.members[&behind].machine.installs, 0,
        "caught up from the log"
    );
    // What it applied is what the leader applied, byte for byte.
    c.check_prefixes();
    assert_eq!(c.members[&behind].machine.applied_index, applied);
}

/// What is read back for a follower that lags waits for its link: while the link holds a
/// window's worth the follower is sent none of it, whatever the other links hold; once the link
/// has taken it, the follower catches up in appends of at most a window (and an entry) each,
/// where raft-rs alone would read the whole backlog into one.
#[test]
fn a_follower_that_lags_is_sent_entries_read_back_only_as_its_link_takes_them() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let entry = entry_size(&eraftpb::Entry {
        data: b"while down 10".to_vec().into(),
        ..Default::default()
    });
    let window = 3 * entry;
    let (mut c, leader, behind) = no_log_data_in_memory_within(window);
    let other = *c
        .members
        .keys()
        .find(|id| ![leader, behind].contains(id))
        .unwrap();
    let applied = thirty_while_down(&mut c, leader, behind);
    // Bytes waiting on the link to `behind`, and on the link to the other follower.
    let (to_behind, to_other) = (
        Arc::new(AtomicU64::new(window)),
        Arc::new(AtomicU64::new(0)),
    );
    let (b, o) = (to_behind.clone(), to_other.clone());
    c.core(leader).watch_transport(Box::new(move |to| match to {
        to if to == behind => b.load(Ordering::Relaxed),
        to if to == other => o.load(Ordering::Relaxed),
        _ => panic!("no link to member {to}"),
    }));
    c.start(behind);
    for _ in 0..30 {
        c.settle();
        c.tick_all();
    }
    assert!(
        !data(c.applied(behind))
            .iter()
            .any(|d| d.starts_with("while down")),
        "nothing read back is sent while its link holds a window"
    );
    assert_eq!(c.core(leader).status().commit, applied, "the others go on");
    c.appends.clear();
    to_behind.store(0, Ordering::Relaxed);
    to_other.store(10 * window, Ordering::Relaxed);
    c.run_until(100, |c| c.applied(behind).len() == 30);
    c.check_prefixes();
    assert_eq!(c.members[&behind].machine.applied_index, applied);
    let sizes: Vec<u64> = c
        .appends
        .iter()
        .filter(|(from, to, _)| (*from, *to) == (leader, behind))
        .map(|(_, _, size)| *size)
        .collect();
    assert!(sizes.len() >= 30 / 4, "{sizes:?}");
    assert!(
        sizes.iter().all(|size| *size <= window + entry),
        "appends of {sizes:?} bytes, the window {window}"
    );
}

/// An entry whose frame no longer reads back (a bit rotted on the leader's disk) is never sent:
/// the follower that needs it gets a snapshot, and not an older one the leader still has, which
/// would leave it needing the same entry again.
#[test]
fn a_follower_whose_entries_do_not_read_back_gets_a_snapshot_past_them() {
    use leasehold_wal::Fs;
    let (mut c, leader, behind) = no_log_data_in_memory();
    let old = c.compact_with_snapshot(leader);
    thirty_while_down(&mut c, leader, behind);
    // One bit of the frame that holds the fourth entry written while it was down.
    let fs = c.members[&leader].fs.clone();
    let rotted = fs
        .list(&dir())
        .unwrap()
        .into_iter()
        .filter(|name| name.ends_with(".wal"))
        .find_map(|name| {
            let path = dir().join(name);
            let bytes = fs.contents(&path)?;
            let at = bytes.windows(12).position(|w| w == b"while down 3")?;
            Some((path, at))
        });
    let (path, at) = rotted.expect("the entry is in a segment");
    fs.flip_bit(&path, at, 0);
    c.start(behind);
    c.run_until(20, |c| c.core(leader).snapshot_wanted().is_some());
    assert!(
        c.core(leader).snapshot_wanted().unwrap() > old.applied_index,
        "the old snapshot is not enough"
    );
    c.compact_with_snapshot(leader);
    c.run_until(100, |c| c.applied(behind).len() == c.applied(leader).len());
    assert_eq!(c.members[&behind].machine.installs, 1);
    c.check_prefixes();
}

#[test]
fn a_follower_far_behind_is_caught_up_with_a_snapshot() {
    let (mut c, leader, behind, _) = behind_a_snapshot();
    assert!(c.core(leader).compacted_index() > 1);
    c.start(behind);
    c.run_until(100, |c| c.applied(behind).len() == 40);
    assert_eq!(
        c.members[&behind].machine.installs, 1,
        "caught up through the snapshot"
    );
    c.check_prefixes();
    // And it restarts from the installed snapshot.
    c.crash(behind);
    c.start(behind);
    assert_eq!(c.applied(behind).len(), 40);
}

/// Found by the simulator (seed 280): a member that had just installed a snapshot, with no entry
/// committed after it, panicked inside raft-rs when asked to campaign (MoveLeader's TimeoutNow),
/// because raft-rs still counted it applied only up to where it was before the snapshot and
/// read the compacted entries in between.
#[test]
fn a_member_that_just_installed_a_snapshot_can_take_over_leadership() {
    let (mut c, leader, behind, machine) = behind_a_snapshot();
    c.start(behind);
    c.run_until(100, |c| c.members[&behind].machine.installs == 1);
    assert_eq!(
        c.core(behind).status().applied,
        machine.applied_index,
        "raft-rs counts the snapshot applied"
    );
    c.core(leader).transfer_leader(behind);
    c.run_until(50, |c| c.leader() == Some(behind));
    c.propose(behind, "after");
    c.run_until(50, |c| c.applied(leader).len() == 41);
    c.check_prefixes();
}

/// Found by the simulator (seed 128): a follower installed a snapshot, and its answer never
/// reached the leader. raft-rs then waited for that answer for good, sending the follower
/// nothing more; with two voters, nothing could commit. The leader now probes such a follower
/// again after two election timeouts.
#[test]
fn a_follower_whose_answer_to_a_snapshot_was_lost_is_caught_up() {
    let (mut c, leader, behind, _) = behind_a_snapshot();
    // The member behind's answer to the snapshot is lost (its refusals of appends the leader
    // can no longer send get through, so the leader learns it needs the snapshot).
    c.muted.insert((behind, leader));
    c.start(behind);
    c.run_until(100, |c| c.members[&behind].machine.installs == 1);
    c.muted.clear();
    c.propose(leader, "after");
    c.run_until(100, |c| c.applied(behind).len() == 41);
    c.check_prefixes();
}

/// Three members, and a follower removed through a ConfChangeV2 the leader has applied:
/// (cluster, leader, the removed member).
fn a_follower_removed() -> (Cluster, u64, u64) {
    let mut c = Cluster::new(&[1, 2, 3]);
    let leader = c.elect();
    let gone = *c.members.keys().find(|id| **id != leader).unwrap();
    let mut remove = eraftpb::ConfChangeV2::default();
    let mut single = eraftpb::ConfChangeSingle::default();
    single.set_change_type(eraftpb::ConfChangeType::RemoveNode);
    single.node_id = gone;
    remove.mut_changes().push(single);
    c.core(leader)
        .propose_conf_change(&remove)
        .expect("propose");
    c.run_until(30, |c| {
        !c.members[&leader].machine.conf_state.voters.contains(&gone)
    });
    (c, leader, gone)
}

#[test]
fn membership_changes_through_conf_change_v2() {
    let (mut c, leader, gone) = a_follower_removed();
    assert_eq!(c.members[&leader].machine.conf_state.voters.len(), 2);
    c.crash(gone);
    c.propose(leader, "two voters");
    c.run_until(30, |c| c.applied(leader).len() == 1);
}

/// A leader that applied a removal, then lost power at once (the removed member already stopped
/// for good, as an operator stops it once MemberRemove returns), restarts with a commit index
/// that covers the removal: had it restarted in the old membership, the removed member could
/// have been the vote it needed.
#[test]
fn a_membership_change_is_applied_only_once_its_commit_is_durable() {
    let (mut c, leader, gone) = a_follower_removed();
    let removal = c.members[&leader].machine.applied_index;
    c.crash(gone);
    c.crash(leader);
    c.start(leader);
    let commit = c.core(leader).status().commit;
    assert!(
        commit >= removal,
        "restarted with commit index {commit}, before the removal at {removal}"
    );
}

mod driver {
    //! The real-time driver: three members on their own Raft threads, messages through our
    //! codec in memory. Bounded waits only; nothing here times a lease.

    use std::collections::HashMap;
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use leasehold_wal::MemFs;
    use leasehold_wal::proto::ConfState;
    use raft::eraftpb;

    use crate::driver::{Committed, Driver, Input, Machine};
    use crate::{Checkpoint, Core, CoreError, CoreStatus, Host, HostError};

    type Inputs = Arc<Mutex<HashMap<u64, mpsc::Sender<Input<MemFs>>>>>;

    struct Member {
        peers: Inputs,
        applied: mpsc::Sender<(u64, Vec<u8>)>,
        id: u64,
        leader: mpsc::Sender<u64>,
    }

    impl Host for Member {
        fn send(&mut self, messages: Vec<eraftpb::Message>) {
            let peers = self.peers.lock().unwrap();
            for m in messages {
                let bytes = crate::encode_message(&m);
                if let Some(peer) = peers.get(&m.to) {
                    let m = crate::decode_peer_message(&bytes, m.to).expect("decodes");
                    let _ = peer.send(Input::Step(m));
                }
            }
        }
        fn install_snapshot(&mut self, _: &eraftpb::Snapshot) -> Result<(), HostError> {
            Err(HostError("none here".into()))
        }
    }

    impl Machine for Member {
        fn apply(&mut self, committed: Vec<Committed>) {
            for c in committed {
                if let Committed::Normal(e) = c
                    && !e.data.is_empty()
                {
                    let _ = self.applied.send((self.id, e.data.to_vec()));
                }
            }
        }
        fn status(&mut self, status: CoreStatus) {
            if status.is_leader {
                let _ = self.leader.send(status.id);
            }
        }
        fn failed(&mut self, error: CoreError) {
            panic!("member {} failed: {error}", self.id);
        }
    }

    #[test]
    fn three_members_on_their_own_threads_elect_and_apply_the_proposals_in_one_order() {
        let peers: Inputs = Arc::default();
        let (applied_tx, applied) = mpsc::channel();
        let (leader_tx, leaders) = mpsc::channel();
        let mut drivers = Vec::new();
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        for id in 1..=3u64 {
            let checkpoint = Checkpoint {
                conf_state: ConfState {
                    voters: vec![1, 2, 3],
                    ..ConfState::default()
                },
                ..Checkpoint::default()
            };
            let core = Core::open(
                MemFs::new(),
                std::path::Path::new("/wal"),
                &super::config(id, 5000, 4 << 20),
                checkpoint,
                &logger,
            )
            .expect("open");
            let member = Member {
                peers: peers.clone(),
                applied: applied_tx.clone(),
                id,
                leader: leader_tx.clone(),
            };
            let driver = Driver::start(
                core,
                member,
                Duration::from_millis(10),
                crate::reads::ReadBatcher::new(5, 500),
            );
            peers.lock().unwrap().insert(id, driver.inputs());
            drivers.push(driver);
        }
        let leader = leaders
            .recv_timeout(Duration::from_secs(20))
            .expect("a leader within 20 s");
        let to_leader = peers.lock().unwrap()[&leader].clone();
        // Proposals sent together: the driver takes them all before its next append.
        let (answers_tx, answers) = mpsc::channel();
        for i in 0..100u32 {
            let tx = answers_tx.clone();
            to_leader
                .send(Input::Propose(
                    i.to_le_bytes().to_vec(),
                    Box::new(move |r| {
                        let _ = tx.send(r.map(|p| p.index));
                    }),
                ))
                .expect("leader alive");
        }
        let mut indexes = Vec::new();
        for _ in 0..100 {
            let answer = answers
                .recv_timeout(Duration::from_secs(20))
                .expect("an answer");
            match answer {
                Ok(index) => indexes.push(index),
                // Leadership moved before the proposal arrived: nothing to check for it.
                Err(CoreError::Raft(raft::Error::ProposalDropped)) => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert!(
            indexes.windows(2).all(|w| w[1] > w[0]),
            "each proposal lands after the one before: {indexes:?}"
        );
        // Every member applies the same entries in the same order. If leadership moved while
        // the proposals were in flight (a thread held up past an election timeout), entries the
        // old leader took may be replaced; then only the agreement is checked.
        let mut per_member: HashMap<u64, Vec<Vec<u8>>> = HashMap::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match applied.recv_timeout(left.min(Duration::from_millis(500))) {
                Ok((id, data)) => per_member.entry(id).or_default().push(data),
                Err(_) if leaders.try_recv().is_ok() => break,
                Err(_) => {}
            }
            let all = (1..=3u64).all(|id| per_member.get(&id).map_or(0, Vec::len) == indexes.len());
            if all {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not applied everywhere within 20 s"
            );
        }
        let shortest = (1..=3u64)
            .map(|id| per_member.get(&id).map_or(0, Vec::len))
            .min()
            .unwrap_or(0);
        let prefix = |id: u64| per_member.get(&id).map_or(&[][..], |v| &v[..shortest]);
        for id in 2..=3u64 {
            assert_eq!(prefix(id), prefix(1), "member {id} applied something else");
        }
        // Linearizable reads on every member: a read index at or past every entry the leader
        // had taken before the reads were asked for.
        let (read_tx, read_answers) = mpsc::channel();
        for id in 1..=3u64 {
            for _ in 0..3 {
                let tx = read_tx.clone();
                peers.lock().unwrap()[&id]
                    .send(Input::Read(Box::new(move |r| {
                        let _ = tx.send((id, r.map(|c| c.index)));
                    })))
                    .expect("member alive");
            }
        }
        let last_taken = indexes.last().copied().unwrap_or(0);
        for _ in 0..9 {
            let (id, answer) = read_answers
                .recv_timeout(Duration::from_secs(20))
                .expect("a read answered within 20 s");
            match answer {
                Ok(index) => assert!(index >= last_taken, "member {id}: {index} < {last_taken}"),
                // Only if leadership moved meanwhile (see above).
                Err(e) => assert!(leaders.try_recv().is_ok(), "member {id}: {e}"),
            }
        }
        peers.lock().unwrap().clear();
        drop(to_leader);
        for d in drivers {
            d.stop();
        }
    }
}

#[test]
fn force_new_cluster_leaves_the_member_alone_with_its_committed_data() {
    let mut c = Cluster::new(&[1, 2, 3]);
    let leader = c.elect();
    for i in 0..10 {
        c.propose(leader, &format!("c{i}"));
    }
    c.run_until(50, |c| {
        c.members.keys().all(|id| c.applied(*id).len() == 10)
    });
    // The leader alone takes one more write: never committed, but in its log.
    for other in [1, 2, 3].into_iter().filter(|id| *id != leader) {
        c.cut.insert((leader, other));
    }
    c.propose(leader, "never committed");
    c.settle();
    for id in [1, 2, 3] {
        c.crash(id);
    }
    c.cut.clear();
    // The old leader comes back alone, forced: the others are removed, every entry of its log
    // is committed (its log does not record how far the cluster committed), and it leads a
    // cluster of one.
    c.start_with(leader, true);
    c.run_until(100, |c| c.leader() == Some(leader));
    assert_eq!(c.members[&leader].machine.conf_state.voters, vec![leader]);
    assert!(c.members[&leader].machine.conf_state.learners.is_empty());
    c.propose(leader, "alone");
    c.run_until(50, |c| c.applied(leader).len() == 12);
    let applied = data(c.applied(leader));
    let committed: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    assert_eq!(applied[..10], committed);
    assert_eq!(applied[10..], ["never committed", "alone"]);
    // Forced again (etcd's flag left on): nothing left to remove, and it still leads alone.
    c.crash(leader);
    c.start_with(leader, true);
    c.run_until(100, |c| c.leader() == Some(leader));
    c.propose(leader, "again");
    c.run_until(50, |c| c.applied(leader).len() == 13);
}

#[test]
fn force_new_cluster_refuses_a_member_that_is_not_in_the_cluster() {
    let mut c = Cluster::new(&[1, 2, 3]);
    c.elect();
    c.crash(1);
    let member = c.members.get_mut(&1).expect("member");
    let mut cfg = config(9, 5000, 4 << 20);
    cfg.force_new_cluster = true;
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let opened = Core::open(
        member.fs.clone(),
        &dir(),
        &cfg,
        member.machine.checkpoint(),
        &logger,
    );
    let Err(e) = opened else {
        panic!("a member outside the cluster was forced into it")
    };
    assert!(e.to_string().contains("not in the cluster"), "{e}");
}
