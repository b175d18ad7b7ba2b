//! The replicated state machine: applies committed commands to the MVCC store and the lease
//! table, and stages what they changed for persistence. This is the one place that composes the
//! two: a revoke deletes the lease's keys, and every KV change re-binds keys to leases. Applying
//! is deterministic; the only inputs are the state and the entry (lease time travels in it). The
//! exception is member-local: an applied Authenticate dates the simple token it registers with
//! this member's clock (`tokens.rs`), which no other member, file or snapshot sees.
//!
//! The state lock (`shared.state`) is never held across an `.await`.
//!
//! By job: `apply` (committed entries into the state), `check` (auth at apply), `snapshot` (the
//! whole state loaded, encoded and installed), `shared` (the state and the signals its readers
//! wait on) and `key_deletes` (waiting for one key's delete). This file holds the state itself and
//! the read helpers.

use std::sync::Arc;

use leasehold_lease::LeaseTable;
use leasehold_mvcc::Store;
use std::collections::{BTreeMap, BTreeSet};

use crate::command::{AlarmMember, MemberAttrs};
use crate::position::{LogPosition, Members};
use crate::storage::{Db, FileValues, SmMeta, StorageError, VALUES_HELD_BYTES};
use crate::tokens::SimpleTokens;
use leasehold_auth::AuthState;

mod apply;
mod check;
mod key_deletes;
mod machine;
mod shared;
mod snapshot;
mod transfer;

#[cfg(test)]
use apply::{Effects, apply_command};
#[cfg(test)]
use snapshot::SnapshotPayload;

pub use apply::KvOps;
pub use apply::rebind;
pub(crate) use apply::{Applying, apply_entries};
pub(crate) use key_deletes::KeyDeleteWaiter;
pub use machine::{Machine, decode_proposal, encode_proposal};
pub(crate) use shared::{RAISED_CORRUPT, RAISED_NO_SPACE, Shared, SharedState};
pub(crate) use snapshot::{install_snapshot_bytes, lease_id_of_row};
pub use transfer::SnapshotRef;
pub(crate) use transfer::{clear_files, install_file, outgoing_file, receive, write_outgoing};

/// Everything the state machine holds, behind one lock so that a snapshot sees the store and the
/// applied log id together.
#[derive(Debug, Default)]
pub(crate) struct SmState {
    pub(crate) store: Store,
    pub(crate) leases: LeaseTable,
    pub(crate) last_applied: Option<LogPosition>,
    pub(crate) membership: Members,
    /// The alarms raised, for every member (replicated: each member holds all of them).
    pub(crate) alarms: BTreeSet<AlarmMember>,
    /// What each member published about itself, by id; only members of the membership.
    pub(crate) member_attrs: BTreeMap<u64, MemberAttrs>,
    pub(crate) auth: AuthState,
    /// The simple tokens applied Authenticate entries registered (not persisted).
    pub(crate) tokens: SimpleTokens,
}

impl SmState {
    /// The store and lease table from persisted parts: keys are bound to their leases from the
    /// KV store's live keys (a key whose lease is gone stays unbound, as in etcd).
    fn assemble(
        store: Store,
        mut table: LeaseTable,
        last_applied: Option<LogPosition>,
        membership: Members,
    ) -> SmState {
        for (key, lease) in store.leased_keys() {
            if !table.attach(key, lease) {
                tracing::warn!(
                    lease = lease.get(),
                    "a key names a lease that no longer exists"
                );
            }
        }
        SmState {
            store,
            leases: table,
            last_applied,
            membership,
            alarms: BTreeSet::new(),
            member_attrs: BTreeMap::new(),
            auth: AuthState::default(),
            tokens: SimpleTokens::default(),
        }
    }

    /// Checks that the lease table's key sets are exactly what the store's live keys name:
    /// every live key that names an existing lease is in that lease's set, and nothing else is
    /// in any set (no binding outlives a delete, a revoke or a move). Linear in the state.
    pub(crate) fn validate_bindings(&self) {
        let mut named = 0;
        for (key, lease) in self.store.leased_keys() {
            if self.leases.contains(lease) {
                assert!(
                    self.leases.is_attached(&key, lease),
                    "{key:?} names lease {lease:?} but is not in its set"
                );
                named += 1;
            }
        }
        let attached: usize = self.leases.iter_by_id(None).map(|l| l.keys_len()).sum();
        assert_eq!(
            attached, named,
            "a lease's set holds a key that does not name it"
        );
    }

    fn meta(&self) -> SmMeta {
        SmMeta {
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            current_revision: self.store.current_revision(),
            compact_revision: self.store.compact_revision(),
            lease_clock_ms: self.leases.clock_ms(),
            alarms: self.alarms.iter().copied().collect(),
            member_attrs: self.member_attrs.values().cloned().collect(),
            auth: self.auth.clone(),
        }
    }
}

/// The state machine as loaded from the file: the shared state the replica applies to.
pub struct StateMachine {
    shared: Shared,
}

impl StateMachine {
    /// Loads the persisted state machine (an empty one on a new database).
    pub(crate) fn open(db: Arc<Db>) -> Result<StateMachine, StorageError> {
        let mut state = snapshot::load(&db)?;
        // Everything loaded is in the file: values go back to it at once (all but the newest).
        db.set_durable_revision(state.store.current_revision());
        state
            .store
            .set_value_source(Arc::new(FileValues::new(Arc::downgrade(&db))));
        state
            .store
            .release_values(state.store.current_revision(), VALUES_HELD_BYTES);
        Ok(StateMachine {
            shared: Arc::new(SharedState::new(state)),
        })
    }

    pub(crate) fn shared(&self) -> Shared {
        self.shared.clone()
    }
}

/// Reads run against the applied state under the read lock.
pub(crate) fn read<T>(shared: &Shared, f: impl FnOnce(&Store) -> T) -> T {
    let state = shared.state.read().expect("state lock poisoned");
    f(&state.store)
}

/// The replicated lease time, advanced by the time this process has seen pass since that value
/// was applied here (zero after a restart: nothing is known about the downtime), at `now` on
/// the replica's clock.
pub(crate) fn lease_time_now(shared: &Shared, now: std::time::Instant) -> u64 {
    let replicated = read_leases(shared, |t| t.clock_ms());
    let seen = *shared
        .lease_time_applied
        .lock()
        .expect("lease time lock poisoned");
    seen.now_ms(replicated, now)
}

/// The replicated lease time as this member last saw it move, and when the entry that moved it
/// reached this member: what a new leader promotes its lease clock from. The replica keeps one
/// beside its state, the simulator's [`Machine`] one of its own.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeaseTimeSeen(Option<(u64, std::time::Instant)>);

impl LeaseTimeSeen {
    /// The replicated lease time is `clock_ms` as of `at` (when the entry that set it was
    /// appended here); noted only if that moved it.
    pub fn note(&mut self, clock_ms: u64, at: std::time::Instant) {
        if self.0.is_none_or(|(ms, _)| clock_ms > ms) {
            self.0 = Some((clock_ms, at));
        }
    }

    /// The replicated lease time `replicated_ms` at `now`: [`lease_time_at`] from what was noted.
    pub fn now_ms(&self, replicated_ms: u64, now: std::time::Instant) -> u64 {
        lease_time_at(replicated_ms, self.0, now)
    }
}

/// The replicated lease time `replicated_ms`, advanced by what passed until `now` since `seen`
/// dated it (`seen`: the lease time last noted and when the entry carrying it was appended
/// here; no advance if it dates another value).
pub fn lease_time_at(
    replicated_ms: u64,
    seen: Option<(u64, std::time::Instant)>,
    now: std::time::Instant,
) -> u64 {
    match seen {
        Some((ms, at)) if ms == replicated_ms => {
            let passed = now.saturating_duration_since(at);
            replicated_ms.saturating_add(u64::try_from(passed.as_millis()).unwrap_or(u64::MAX))
        }
        _ => replicated_ms,
    }
}

pub(crate) fn read_leases<T>(shared: &Shared, f: impl FnOnce(&LeaseTable) -> T) -> T {
    let state = shared.state.read().expect("state lock poisoned");
    f(&state.leases)
}

pub(crate) fn read_state<T>(shared: &Shared, f: impl FnOnce(&Store, &LeaseTable) -> T) -> T {
    let state = shared.state.read().expect("state lock poisoned");
    f(&state.store, &state.leases)
}

#[cfg(test)]
mod apply_tests;
#[cfg(test)]
mod binding_tests;
#[cfg(test)]
mod snapshot_tests;
