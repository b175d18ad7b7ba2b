//! The applied state as the rest of the replica shares it, with the signals that tell its
//! followers (watchers, the expiry driver, admission) what moved without taking the state lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use super::SmState;
use super::key_deletes::KeyDeletes;
use crate::command::Alarm;

/// The state, plus signals for those who follow it.
#[derive(Debug)]
pub(crate) struct SharedState {
    pub(crate) state: RwLock<SmState>,
    /// Notified after every apply that touched a lease: the earliest deadline may have moved.
    pub(crate) leases_changed: tokio::sync::Notify,
    /// How many applies (and snapshot installs) have touched a lease: for any number of
    /// followers that want to know the lease table moved (the dashboard), where
    /// `leases_changed` wakes the one expiry driver.
    pub(crate) lease_changes: tokio::sync::watch::Sender<u64>,
    /// The store revision after the latest apply: what watchers wait on.
    pub(crate) revision: tokio::sync::watch::Sender<i64>,
    /// The replicated lease time after the latest apply that moved it, and when (on this
    /// process's monotonic clock) that apply happened. A member that becomes leader counts the
    /// time since then as lease time that has passed (a lower bound of what passed since the
    /// old leader stamped it), so an election does not stop the lease clock.
    pub(crate) lease_time_applied: std::sync::Mutex<super::LeaseTimeSeen>,
    /// Who waits for which key to be deleted.
    pub(crate) key_deletes: Arc<KeyDeletes>,
    /// Whether auth is enabled in the applied state, readable without the state lock: while it
    /// is off (the usual case) a request needs no look at the auth store at all.
    pub(crate) auth_enabled: AtomicBool,
    /// Which alarm types are raised for some member ([`RAISED_NO_SPACE`], [`RAISED_CORRUPT`]),
    /// readable without the state lock, so that admitting a write takes no lock.
    pub(crate) alarms_raised: std::sync::atomic::AtomicU8,
    /// The Raft log has no room set aside for its next segment on this member's disk
    /// (`Core::log_has_room`), told by the Raft thread: like a full redb file, it makes this
    /// member refuse writes that add data.
    pub(crate) log_without_room: AtomicBool,
    /// KV operations applied on this member since it started ([`super::apply::KvOps`]):
    /// puts, deletes, ranges in txns, txns.
    pub(crate) kv_ops: [std::sync::atomic::AtomicU64; 4],
}

pub(crate) const RAISED_NO_SPACE: u8 = 1;
pub(crate) const RAISED_CORRUPT: u8 = 2;

impl SmState {
    /// The [`SharedState::alarms_raised`] bits of this state.
    pub(super) fn alarms_raised(&self) -> u8 {
        self.alarms.iter().fold(0, |bits, a| {
            bits | match a.alarm {
                Alarm::NoSpace => RAISED_NO_SPACE,
                Alarm::Corrupt => RAISED_CORRUPT,
            }
        })
    }

    /// Publishes what requests read without the state lock.
    pub(super) fn publish_flags(&self, shared: &SharedState) {
        shared
            .auth_enabled
            .store(self.auth.enabled, Ordering::SeqCst);
        shared
            .alarms_raised
            .store(self.alarms_raised(), Ordering::SeqCst);
    }
}

impl SharedState {
    pub(super) fn new(state: SmState) -> SharedState {
        let (revision, _) = tokio::sync::watch::channel(state.store.current_revision());
        let auth_enabled = AtomicBool::new(state.auth.enabled);
        let alarms_raised = std::sync::atomic::AtomicU8::new(state.alarms_raised());
        SharedState {
            auth_enabled,
            alarms_raised,
            state: RwLock::new(state),
            leases_changed: tokio::sync::Notify::new(),
            lease_changes: tokio::sync::watch::Sender::new(0),
            revision,
            lease_time_applied: std::sync::Mutex::new(super::LeaseTimeSeen::default()),
            key_deletes: Arc::default(),
            log_without_room: AtomicBool::new(false),
            kv_ops: Default::default(),
        }
    }

    /// Adds one apply batch's KV operations to this member's counts.
    pub(super) fn count_kv_ops(&self, ops: super::KvOps) {
        for (counter, n) in self
            .kv_ops
            .iter()
            .zip([ops.puts, ops.deletes, ops.ranges, ops.txns])
        {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// The KV operations applied on this member since it started.
    pub(crate) fn kv_ops(&self) -> super::KvOps {
        let [puts, deletes, ranges, txns] =
            self.kv_ops.each_ref().map(|c| c.load(Ordering::Relaxed));
        super::KvOps {
            puts,
            deletes,
            ranges,
            txns,
        }
    }

    /// Records that the replicated lease time is `clock_ms` as of `at` (see [`LeaseTimeSeen`]).
    ///
    /// [`LeaseTimeSeen`]: super::LeaseTimeSeen
    pub(super) fn note_lease_time(&self, clock_ms: u64, at: std::time::Instant) {
        self.lease_time_applied
            .lock()
            .expect("lease time lock poisoned")
            .note(clock_ms, at);
    }

    /// Tells the expiry driver and every follower of the lease table that it moved.
    pub(super) fn leases_moved(&self) {
        self.leases_changed.notify_one();
        self.lease_changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Publishes the store revision (after an apply or a snapshot install).
    pub(super) fn publish_revision(&self, revision: i64) {
        self.revision.send_if_modified(|r| {
            let changed = *r != revision;
            *r = revision;
            changed
        });
    }
}

pub(crate) type Shared = Arc<SharedState>;
