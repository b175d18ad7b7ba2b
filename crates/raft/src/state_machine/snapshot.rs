//! The whole state machine as one value: loaded from the file at start, encoded from the file for
//! a follower, and installed from a leader's bytes.

use leasehold_lease::{LeaseId, LeaseRecord, LeaseTable};
use leasehold_mvcc::{Change, RELEASE_MIN, Record, Revision, Store};
use redb::{ReadableTable, ReadableTableMetadata};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::SmState;
use super::shared::Shared;
use crate::command::{AlarmMember, MemberAttrs};
use crate::position::{LogPosition, Members};
use crate::storage::{Db, KV, LEASES, SmMeta, StorageError, VALUES_HELD_BYTES, decode, write_sm};
use leasehold_auth::AuthState;

pub(super) fn by_id(attrs: Vec<MemberAttrs>) -> BTreeMap<u64, MemberAttrs> {
    attrs.into_iter().map(|a| (a.id, a)).collect()
}

/// What a snapshot carries: the whole state machine.
#[derive(Serialize, Deserialize)]
pub(super) struct SnapshotPayload {
    pub(super) last_applied: Option<LogPosition>,
    pub(super) membership: Members,
    pub(super) current_revision: i64,
    pub(super) compact_revision: i64,
    pub(super) records: Vec<(Revision, Record)>,
    pub(super) lease_clock_ms: u64,
    pub(super) leases: Vec<(LeaseId, LeaseRecord)>,
    pub(super) alarms: Vec<AlarmMember>,
    pub(super) member_attrs: Vec<MemberAttrs>,
    pub(super) auth: AuthState,
}

pub(crate) fn lease_id_of_row(key: [u8; 8]) -> Result<LeaseId, StorageError> {
    LeaseId::from_wire(u64::from_be_bytes(key) as i64).ok_or(StorageError::Corrupt {
        what: "leases",
        problem: "lease id 0",
    })
}

/// The state machine as the file holds it (an empty one on a new database). The leases (rows
/// and table) are read and built on a second thread while this one reads the keys and builds the
/// store: the two share nothing until keys are bound to their leases.
pub(super) fn load(db: &Db) -> Result<SmState, StorageError> {
    let started = std::time::Instant::now();
    let txn = db.begin_read().map_err(StorageError::read("sm_meta"))?;
    let meta = SmMeta::read(&txn)?;
    let ((store, hidden), table) = side_by_side(
        || {
            let records = kv_rows(&txn, RELEASE_MIN)?;
            Ok(Store::restore_released(
                meta.current_revision,
                meta.compact_revision,
                records,
            ))
        },
        || Ok(LeaseTable::restore(meta.lease_clock_ms, lease_rows(&txn)?)),
    )?;
    let built_ms = started.elapsed().as_millis();
    // A compaction a stop interrupted left these rows: their removal resumes.
    db.loaded_compaction(meta.compact_revision, hidden);
    let mut state = SmState::assemble(store, table, meta.last_applied, meta.membership);
    state.alarms = meta.alarms.into_iter().collect();
    state.member_attrs = by_id(meta.member_attrs);
    state.auth = meta.auth;
    tracing::info!(
        keys = state.store.key_history_len(),
        leases = state.leases.len(),
        revision = state.store.current_revision(),
        built_ms,
        total_ms = started.elapsed().as_millis(),
        "loaded the state machine"
    );
    Ok(state)
}

/// Builds the store and the lease table at the same time, on this thread and a second one.
fn side_by_side<S, E: Send>(
    store: impl FnOnce() -> Result<S, E>,
    table: impl FnOnce() -> Result<LeaseTable, E> + Send,
) -> Result<(S, LeaseTable), E> {
    std::thread::scope(|scope| {
        let table = std::thread::Builder::new()
            .name("leasehold-load-leases".into())
            .spawn_scoped(scope, table)
            .expect("spawn the lease-loading thread");
        let store = store();
        let table = table.join().expect("building the lease table panicked");
        Ok((store?, table?))
    })
}

/// The KV table's rows, decoded, in revision order; each value of `release_min` bytes or more
/// is dropped as it is read and its record marked released (read back from the file when
/// asked for), so that loading never holds every value at once.
fn kv_rows(
    txn: &redb::ReadTransaction,
    release_min: usize,
) -> Result<Vec<(Revision, Record, bool)>, StorageError> {
    let table = txn.open_table(KV).map_err(StorageError::read("kv"))?;
    let len = table.len().map_err(StorageError::read("kv"))?;
    let mut records = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    for row in table.iter().map_err(StorageError::read("kv"))? {
        let (k, v) = row.map_err(StorageError::read("kv"))?;
        let mut record = decode::<Record>("kv", v.value())?;
        let released = match &mut record {
            Record::Put(kv) if kv.value.len() >= release_min => {
                kv.value = Default::default();
                true
            }
            _ => false,
        };
        records.push((Revision::from_bytes(k.value()), record, released));
    }
    Ok(records)
}

/// The lease table's rows, decoded, in id order.
fn lease_rows(txn: &redb::ReadTransaction) -> Result<Vec<(LeaseId, LeaseRecord)>, StorageError> {
    let table = txn
        .open_table(LEASES)
        .map_err(StorageError::read("leases"))?;
    let len = table.len().map_err(StorageError::read("leases"))?;
    let mut leases = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    for row in table.iter().map_err(StorageError::read("leases"))? {
        let (k, v) = row.map_err(StorageError::read("leases"))?;
        leases.push((
            lease_id_of_row(k.value())?,
            decode::<LeaseRecord>("leases", v.value())?,
        ));
    }
    Ok(leases)
}

impl SnapshotPayload {
    /// The state this payload describes, at `at` (its applied log position and membership;
    /// `None`: the ones it holds).
    pub(super) fn into_state(self, at: Option<AppliedAt>) -> SmState {
        self.into_state_with_hidden(at).0
    }

    /// [`SnapshotPayload::into_state`], and the revisions of the records its compaction hides
    /// (a leader whose compaction had not yet removed them from its file sent them), which the
    /// state leaves out.
    pub(super) fn into_state_with_hidden(self, at: Option<AppliedAt>) -> (SmState, Vec<Revision>) {
        let (last_applied, membership) = at.unwrap_or((self.last_applied, self.membership));
        let (records, leases, clock_ms) = (self.records, self.leases, self.lease_clock_ms);
        let (current, compact) = (self.current_revision, self.compact_revision);
        let built: Result<_, std::convert::Infallible> = side_by_side(
            || Ok(Store::restore_with_hidden(current, compact, records)),
            || Ok(LeaseTable::restore(clock_ms, leases)),
        );
        let Ok(((store, hidden), table)) = built;
        let mut state = SmState::assemble(store, table, last_applied, membership);
        state.alarms = self.alarms.into_iter().collect();
        state.member_attrs = by_id(self.member_attrs);
        state.auth = self.auth;
        (state, hidden)
    }

    /// A state held in memory as a payload (what the simulator's members checkpoint and send).
    pub(super) fn from_state(state: &SmState) -> SnapshotPayload {
        SnapshotPayload {
            last_applied: state.last_applied,
            membership: state.membership.clone(),
            current_revision: state.store.current_revision(),
            compact_revision: state.store.compact_revision(),
            // The simulator's stores release nothing, so every value is held.
            records: state
                .store
                .records()
                .expect("a store that releases nothing reads nothing back"),
            lease_clock_ms: state.leases.clock_ms(),
            leases: state.leases.records(),
            alarms: state.alarms.iter().copied().collect(),
            member_attrs: state.member_attrs.values().cloned().collect(),
            auth: state.auth.clone(),
        }
    }

    /// The state machine as the file holds it (an empty one on a new database).
    #[cfg(test)]
    pub(super) fn read(db: &Db) -> Result<SnapshotPayload, StorageError> {
        let txn = db.begin_read().map_err(StorageError::read("sm_meta"))?;
        let meta = SmMeta::read(&txn)?;
        Ok(SnapshotPayload {
            last_applied: meta.last_applied,
            membership: meta.membership,
            current_revision: meta.current_revision,
            compact_revision: meta.compact_revision,
            records: kv_rows(&txn, usize::MAX)?
                .into_iter()
                .map(|(rev, record, _)| (rev, record))
                .collect(),
            lease_clock_ms: meta.lease_clock_ms,
            leases: lease_rows(&txn)?,
            alarms: meta.alarms,
            member_attrs: meta.member_attrs,
            auth: meta.auth,
        })
    }
}

/// Where a state is: its applied log position and membership.
pub(crate) type AppliedAt = (Option<LogPosition>, Members);

/// Replaces the state machine with a leader's snapshot held in the message (`bytes`: a postcard
/// [`SnapshotPayload`], as members before `transfer.rs` sent them) at `at` (the applied log id and membership; `None`: the ones the bytes hold),
/// durably: the file first, then the applied state. Blocking.
pub(crate) fn install_snapshot_bytes(
    shared: &Shared,
    db: &Db,
    bytes: &[u8],
    at: Option<AppliedAt>,
) -> Result<(), StorageError> {
    const WHAT: &str = "a snapshot";
    let telemetry = db.telemetry().clone();
    let _installing = telemetry.installing_snapshot();
    let payload: SnapshotPayload = decode(WHAT, bytes)?;
    // Staged changes predate the snapshot and must never be written over it.
    db.discard_staged_sm();
    let changes: Vec<Change> = payload
        .records
        .iter()
        .map(|(rev, record)| Change::Write {
            rev: *rev,
            record: record.clone(),
        })
        .collect();
    let leases: BTreeMap<LeaseId, Option<LeaseRecord>> = payload
        .leases
        .iter()
        .map(|(id, r)| (*id, Some(*r)))
        .collect();
    let (state, hidden) = payload.into_state_with_hidden(at);
    // The file gets only what the state holds.
    let changes: Vec<Change> = changes
        .into_iter()
        .filter(|change| match change {
            Change::Write { rev, .. } | Change::Remove { rev } => {
                hidden.binary_search(rev).is_err()
            }
        })
        .collect();
    tracing::info!(
        last_applied = ?state.last_applied,
        bytes = bytes.len(),
        revision = state.store.current_revision(),
        "installing a snapshot from the leader"
    );
    let row = state.meta();
    let txn = db.begin_write().map_err(StorageError::write(WHAT))?;
    drop(emptied_tables(&txn)?);
    write_sm(&txn, &changes, &leases, &row)?;
    let started = std::time::Instant::now();
    txn.commit().map_err(StorageError::commit(WHAT))?;
    db.telemetry().state_commit.observe(started.elapsed());
    // What the old state had yet to remove is gone with it.
    db.loaded_compaction(state.store.compact_revision(), Vec::new());
    replace_state(shared, db, state);
    Ok(())
}

/// The `kv` and `leases` tables of `txn`, emptied: what a snapshot's rows replace.
pub(super) type StateTables<'t> = (
    redb::Table<'t, [u8; 16], &'static [u8]>,
    redb::Table<'t, [u8; 8], &'static [u8]>,
);

pub(super) fn emptied_tables(
    txn: &redb::WriteTransaction,
) -> Result<StateTables<'_>, StorageError> {
    const WHAT: &str = "a snapshot";
    let mut kv = txn.open_table(KV).map_err(StorageError::write(WHAT))?;
    kv.retain(|_, _| false).map_err(StorageError::write(WHAT))?;
    let mut leases = txn.open_table(LEASES).map_err(StorageError::write(WHAT))?;
    leases
        .retain(|_, _| false)
        .map_err(StorageError::write(WHAT))?;
    Ok((kv, leases))
}

/// Puts `state`, which the file now holds, in place of the state machine's.
pub(super) fn replace_state(shared: &Shared, db: &Db, mut state: SmState) {
    let revision = state.store.current_revision();
    db.set_durable_revision(revision);
    {
        let mut current = shared.state.write().expect("state lock poisoned");
        // Tokens are this member's, not the snapshot's: they stay; so does where released
        // values are read back from, and the state's values go back to the file (all but the
        // newest).
        state.tokens = std::mem::take(&mut current.tokens);
        state.store.set_value_source(current.store.value_source());
        state.store.release_values(revision, VALUES_HELD_BYTES);
        *current = state;
        current.publish_flags(shared);
    }
    // The state it replaced is freed; give its memory back to the OS.
    leasehold_alloc::release_soon();
    shared.leases_moved();
    shared.publish_revision(revision);
    shared.key_deletes.replaced();
}
