//! A member's Raft thread: it owns the [`Core`], turns real time into ticks, takes every queued
//! input before each `Ready` (so proposals that arrive together share one append and one
//! `fdatasync`), and hands committed entries to the member's [`Machine`]. The thread blocks on
//! the log's `fdatasync`, so nothing else runs on it; the leader's messages are handed to
//! [`Host::send`] before that, and the transport sends them while the disk works.
//!
//! This is the only place of the crate that reads a clock; the simulator drives [`Core`] with its
//! own, through the same [`round`].

use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold_wal::Fs;
use raft::eraftpb::{self, ConfChangeV2, Entry, Snapshot};

use crate::core::{Core, CoreError, CoreStatus, Host};
use crate::reads::{ReadBatcher, ReadWaiter};

/// Where a proposal landed: the entry is the one at `index` only if it still has `term` when it
/// is applied (a leader change may replace it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proposed {
    pub index: u64,
    pub term: u64,
}

/// A one-shot answer, whatever the caller waits with.
pub type Reply<T> = Box<dyn FnOnce(T) + Send>;

/// Work run on the Raft thread with the core.
pub type WithCore<F> = Box<dyn FnOnce(&mut Core<F>) + Send>;

/// What the thread takes.
pub enum Input<F: Fs> {
    Step(eraftpb::Message),
    Propose(Vec<u8>, Reply<Result<Proposed, CoreError>>),
    ProposeConfChange(ConfChangeV2, Reply<Result<Proposed, CoreError>>),
    /// A linearizable read: answered with the read index to wait for (see [`crate::reads`]).
    Read(ReadWaiter),
    TransferLeader(u64),
    Campaign,
    Unreachable(u64),
    /// The transport heard from this peer without a Raft message (its link's keepalive): it is
    /// connected, for the reconfiguration checks (see [`Core::heard_for_ticks`]).
    Heard(u64),
    /// The machine made this snapshot durable (see [`Core::compact`]).
    Compact(Snapshot),
    /// Runs on the thread with the core (a status read, say).
    With(WithCore<F>),
    /// Ends the thread (sent by [`Driver::stop`] and on drop).
    Stop,
}

/// A committed entry as the machine gets it.
#[derive(Debug)]
pub enum Committed {
    Normal(Entry),
    /// A membership change, already applied to Raft's configuration; `conf_state` is the
    /// membership to persist with the machine's state.
    ConfChange {
        entry: Entry,
        change: ConfChangeV2,
        conf_state: leasehold_wal::proto::ConfState,
    },
}

impl Committed {
    pub fn entry(&self) -> &Entry {
        match self {
            Committed::Normal(e) => e,
            Committed::ConfChange { entry, .. } => entry,
        }
    }
}

/// The member around the core: its transport and its state machine.
pub trait Machine: Host {
    /// Applies committed entries, in order.
    fn apply(&mut self, committed: Vec<Committed>);
    /// Raft's progress after each round that changed the leader or the role.
    fn status(&mut self, _status: CoreStatus) {}
    /// What this follower has stepped of its leader's heartbeats, after each round that changed
    /// it ([`Core::heartbeat_seen`]).
    fn leader_heartbeat(&mut self, _seen: crate::HeartbeatSeen) {}
    /// The core stopped on an error (the log could not be written): this member must stop.
    fn failed(&mut self, error: CoreError);
    /// A round wrote the log and took `took`, its `fdatasync` included (for the member's disk
    /// metrics); `appended` names the entries it appended (first and last index), now durable.
    fn log_written(&mut self, _took: Duration, _appended: Option<(u64, u64)>) {}
    /// The bytes each append of a round wrote to the log's file, and how long each write took
    /// before its sync.
    fn log_bytes_written(&mut self, _writes: &[leasehold_wal::Written]) {}
    /// Whether the log has room set aside ([`Core::log_has_room`]): told once at the start and
    /// then on every change. Without it the member must take no writes that add data.
    fn log_room(&mut self, _has_room: bool) {}
    /// A follower needs a snapshot this member does not have yet ([`Core::snapshot_wanted`]):
    /// told after every turn of the Raft thread until one is given to [`Core::compact`].
    fn snapshot_wanted(&mut self) {}
}

/// The handle on a running thread; dropping it stops the thread and waits for it.
pub struct Driver<F: Fs> {
    inputs: mpsc::Sender<Input<F>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<F: Fs> std::fmt::Debug for Driver<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").finish_non_exhaustive()
    }
}

/// Inputs taken before a `Ready` at most, so one flood cannot hold back appends forever.
const INPUTS_PER_ROUND_MAX: usize = 4096;

impl<F: Fs> Driver<F>
where
    F::File: Send,
{
    /// Starts the thread; `tick` is the heartbeat interval (one Raft tick), `reads` how
    /// linearizable reads are batched and retried (in ticks).
    pub fn start(
        core: Core<F>,
        machine: impl Machine + Send + 'static,
        tick: Duration,
        reads: ReadBatcher,
    ) -> Driver<F> {
        let (inputs, queue) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("leasehold-raft".into())
            .spawn(move || run(core, machine, reads, queue, tick))
            .expect("spawn the raft thread");
        Driver {
            inputs,
            thread: Some(thread),
        }
    }

    /// A sender for inputs, for whoever feeds the thread (the transport, proposers).
    pub fn inputs(&self) -> mpsc::Sender<Input<F>> {
        self.inputs.clone()
    }

    /// Stops the thread after the inputs queued so far, and waits for it.
    pub fn stop(self) {
        drop(self);
    }
}

impl<F: Fs> Drop for Driver<F> {
    fn drop(&mut self) {
        let _ = self.inputs.send(Input::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run<F: Fs>(
    mut core: Core<F>,
    mut machine: impl Machine + Send + 'static,
    mut reads: ReadBatcher,
    queue: mpsc::Receiver<Input<F>>,
    tick: Duration,
) {
    let mut next_tick = Instant::now() + tick;
    let mut room = core.log_has_room();
    machine.log_room(room);
    loop {
        let wait = next_tick.saturating_duration_since(Instant::now());
        let mut taken = 0;
        match queue.recv_timeout(wait) {
            Ok(Input::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Stopped, or every sender is gone, the handle's too.
                reads.stop();
                return;
            }
            Ok(input) => {
                take(&mut core, &mut reads, input);
                taken += 1;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        while taken < INPUTS_PER_ROUND_MAX {
            match queue.try_recv() {
                Ok(Input::Stop) => {
                    reads.stop();
                    return;
                }
                Ok(input) => {
                    take(&mut core, &mut reads, input);
                    taken += 1;
                }
                Err(_) => break,
            }
        }
        reads.send(&mut core);
        let now = Instant::now();
        if now >= next_tick {
            core.tick();
            reads.tick(&mut core);
            next_tick += tick;
            if next_tick < now {
                // The thread was held up (a slow fsync): skip the ticks it missed rather than
                // firing them all at once.
                next_tick = now + tick;
            }
        }
        while core.has_ready() {
            if let Err(e) = round(&mut core, &mut machine, &mut reads, Instant::now) {
                tracing::error!("raft core stopped: {e}");
                reads.stop();
                machine.failed(e);
                return;
            }
        }
        if core.log_has_room() != room {
            room = !room;
            machine.log_room(room);
        }
        if core.snapshot_wanted().is_some() {
            machine.snapshot_wanted();
        }
    }
}

fn take<F: Fs>(core: &mut Core<F>, reads: &mut ReadBatcher, input: Input<F>) {
    match input {
        Input::Step(m) => {
            if let Err(e) = core.step(m) {
                tracing::debug!("raft message not taken: {e}");
            }
        }
        Input::Propose(data, reply) => {
            let proposed = core.propose(data).map(|()| landed(core));
            reply(proposed);
        }
        Input::ProposeConfChange(cc, reply) => {
            let proposed = core.propose_conf_change(&cc).map(|()| landed(core));
            reply(proposed);
        }
        Input::Read(answer) => reads.add(answer),
        Input::TransferLeader(to) => core.transfer_leader(to),
        Input::Campaign => {
            if let Err(e) = core.campaign() {
                tracing::warn!("campaign: {e}");
            }
        }
        Input::Unreachable(id) => core.report_unreachable(id),
        Input::Heard(id) => core.note_heard(id),
        Input::Compact(snapshot) => {
            if let Err(e) = core.compact(snapshot) {
                tracing::warn!("compacting the raft log: {e}");
            }
        }
        Input::With(f) => f(core),
        Input::Stop => unreachable!("the loop ends on Stop before taking it"),
    }
}

/// A proposal the leader took is the last entry of its log, in its term.
fn landed<F: Fs>(core: &Core<F>) -> Proposed {
    let status = core.status();
    Proposed {
        index: status.last_index,
        term: status.term,
    }
}

/// Handles one `Ready`: the log written and messages sent (through `machine` as the [`Host`]),
/// committed entries applied in order (membership changes applied to Raft first), then the read
/// states confirmed to `reads`. The Raft thread runs it while the core has a `Ready`; so does the
/// simulator, with `clock` its simulated one (read only to time the log write).
pub fn round<F: Fs>(
    core: &mut Core<F>,
    machine: &mut impl Machine,
    reads: &mut ReadBatcher,
    clock: impl Fn() -> Instant,
) -> Result<(), CoreError> {
    let started = clock();
    let handled = core.handle_ready(machine)?;
    if handled.wrote_log {
        machine.log_written(clock().saturating_duration_since(started), handled.appended);
    }
    if !handled.writes.is_empty() {
        machine.log_bytes_written(&handled.writes);
    }
    if !handled.committed.is_empty() {
        let last = handled.committed.last().map(|e| e.index);
        let mut committed = Vec::with_capacity(handled.committed.len());
        for entry in handled.committed {
            if entry.get_entry_type() == eraftpb::EntryType::EntryNormal {
                committed.push(Committed::Normal(entry));
            } else {
                let (change, conf_state) = core.apply_conf_change(&entry)?;
                committed.push(Committed::ConfChange {
                    entry,
                    change,
                    conf_state,
                });
            }
        }
        machine.apply(committed);
        if let Some(last) = last {
            core.applied_to(last);
        }
    }
    if !handled.read_states.is_empty() {
        reads.confirmed(&handled.read_states, core.read_proof());
        // A round may have ended: the readers waiting behind it go next.
        reads.send(core);
    }
    if handled.role_changed {
        machine.status(core.status());
    }
    if let Some(seen) = core.take_heartbeat_seen() {
        machine.leader_heartbeat(seen);
    }
    Ok(())
}
