//! The replicated state machine: applies committed commands to the MVCC store and persists what
//! they changed. Applying is deterministic; the only inputs are the state and the entry.
//!
//! Lock order: `shared` (the state) before `current` (the snapshot); neither is ever held across
//! an `.await`.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use leasehold_mvcc::{Change, LeaseId, Record, Revision, Store};
use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, StorageError, StorageIOError,
    StoredMembership,
};
use redb::{ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};

use crate::TypeConfig;
use crate::command::{Applied, Command, Proposal};
use crate::storage::{
    COMPACT_REVISION, CURRENT_REVISION, Db, KV, LAST_APPLIED, MEMBERSHIP, SM_META, SmMeta, decode,
    encode, io_err, write_sm,
};

/// Everything the state machine holds, behind one lock so that a snapshot sees the store and the
/// applied log id together.
#[derive(Debug, Default)]
pub(crate) struct SmState {
    pub(crate) store: Store,
    pub(crate) last_applied: Option<LogId<u64>>,
    pub(crate) membership: StoredMembership<u64, BasicNode>,
}

pub(crate) type Shared = Arc<RwLock<SmState>>;

/// What a snapshot carries: the whole state machine.
#[derive(Serialize, Deserialize)]
struct SnapshotPayload {
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    current_revision: i64,
    compact_revision: i64,
    records: Vec<(Revision, Record)>,
}

pub struct StateMachine {
    db: Arc<Db>,
    shared: Shared,
    /// The last snapshot built or installed: what `get_current_snapshot` returns. Kept in
    /// memory only; after a restart the current state is snapshotted on demand instead.
    current: Arc<Mutex<Option<StoredSnapshot>>>,
}

#[derive(Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta<u64, BasicNode>,
    bytes: Vec<u8>,
}

/// Distinguishes snapshots taken at the same applied index.
static SNAPSHOT_SEQ: AtomicU64 = AtomicU64::new(0);

impl StateMachine {
    /// Loads the persisted state machine (an empty one on a new database).
    pub(crate) fn open(db: Arc<Db>) -> Result<StateMachine, std::io::Error> {
        let txn = db.begin_read().map_err(io_err)?;
        let meta = txn.open_table(SM_META).map_err(io_err)?;
        let last_applied = LAST_APPLIED.get(&meta)?.flatten();
        let membership = MEMBERSHIP.get(&meta)?.unwrap_or_default();
        let fresh = Store::new();
        let current = CURRENT_REVISION
            .get(&meta)?
            .unwrap_or(fresh.current_revision());
        let compacted = COMPACT_REVISION
            .get(&meta)?
            .unwrap_or(fresh.compact_revision());
        let table = txn.open_table(KV).map_err(io_err)?;
        let mut records = Vec::new();
        for row in table.iter().map_err(io_err)? {
            let (k, v) = row.map_err(io_err)?;
            records.push((
                Revision::from_bytes(k.value()),
                decode::<Record>(v.value())?,
            ));
        }
        let store = Store::restore(current, compacted, records);
        Ok(StateMachine {
            db,
            shared: Arc::new(RwLock::new(SmState {
                store,
                last_applied,
                membership,
            })),
            current: Arc::new(Mutex::new(None)),
        })
    }

    pub(crate) fn shared(&self) -> Shared {
        self.shared.clone()
    }

    /// Snapshots the current state and makes it the current snapshot.
    fn snapshot(&self) -> Snapshot<TypeConfig> {
        let stored = {
            let state = self.shared.read().expect("state lock poisoned");
            let payload = SnapshotPayload {
                last_applied: state.last_applied,
                membership: state.membership.clone(),
                current_revision: state.store.current_revision(),
                compact_revision: state.store.compact_revision(),
                records: state.store.records(),
            };
            let seq = SNAPSHOT_SEQ.fetch_add(1, Ordering::Relaxed);
            let snapshot_id = format!("{}-{seq}", state.last_applied.map_or(0, |l| l.index));
            StoredSnapshot {
                meta: SnapshotMeta {
                    last_log_id: state.last_applied,
                    last_membership: state.membership.clone(),
                    snapshot_id,
                },
                bytes: encode(&payload),
            }
        };
        *self.current.lock().expect("snapshot lock poisoned") = Some(stored.clone());
        stored.into_snapshot()
    }
}

impl StoredSnapshot {
    fn into_snapshot(self) -> Snapshot<TypeConfig> {
        Snapshot {
            meta: self.meta,
            snapshot: Box::new(Cursor::new(self.bytes)),
        }
    }
}

/// Applies one command. No lease can exist until the Lease service lands, so a put naming a
/// lease fails with etcd's "requested lease not found", as etcd does for an unknown lease.
fn apply_command(store: &mut Store, cmd: &Command, changes: &mut Vec<Change>) -> Applied {
    let lease_exists = |_: LeaseId| false;
    let mut keep = |written: Vec<Change>| changes.extend(written);
    match cmd {
        Command::Put(req) => Applied::Put(store.put(req, &lease_exists).map(|(resp, c)| {
            keep(c);
            resp
        })),
        Command::DeleteRange(req) => {
            let (resp, c) = store.delete_range(req);
            keep(c);
            Applied::DeleteRange(resp)
        }
        Command::Txn(req) => Applied::Txn(store.txn(req, &lease_exists).map(|(resp, c)| {
            keep(c);
            resp
        })),
        Command::Compact { revision } => {
            Applied::Compact(store.compact(*revision).map(|(rev, c)| {
                keep(c);
                rev
            }))
        }
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        Ok(self.snapshot())
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let state = self.shared.read().expect("state lock poisoned");
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<Applied>>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut replies = Vec::new();
        let mut changes = Vec::new();
        let meta = {
            let mut guard = self.shared.write().expect("state lock poisoned");
            let state = &mut *guard;
            for entry in entries {
                state.last_applied = Some(entry.log_id);
                let reply = match entry.payload {
                    EntryPayload::Blank => Vec::new(),
                    EntryPayload::Membership(m) => {
                        state.membership = StoredMembership::new(Some(entry.log_id), m);
                        Vec::new()
                    }
                    EntryPayload::Normal(Proposal { commands }) => commands
                        .iter()
                        .map(|cmd| apply_command(&mut state.store, cmd, &mut changes))
                        .collect(),
                };
                replies.push(reply);
            }
            SmMeta {
                last_applied: state.last_applied,
                membership: state.membership.clone(),
                current_revision: state.store.current_revision(),
                compact_revision: state.store.compact_revision(),
            }
        };
        // No commit of its own: the log already holds these entries durably, and the changes are
        // written with the next log commit (see `Db::stage_sm`).
        self.db.stage_sm(changes, meta);
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        StateMachine {
            db: self.db.clone(),
            shared: self.shared.clone(),
            current: self.current.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let to_err = |e: std::io::Error| StorageIOError::read_snapshot(Some(meta.signature()), &e);
        let payload: SnapshotPayload = decode(snapshot.get_ref()).map_err(to_err)?;
        let store = Store::restore(
            payload.current_revision,
            payload.compact_revision,
            payload.records.clone(),
        );
        let row = SmMeta {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            current_revision: payload.current_revision,
            compact_revision: payload.compact_revision,
        };
        // Staged changes predate the snapshot and must never be written over it.
        self.db.discard_staged_sm();
        let db = self.db.clone();
        let changes: Vec<Change> = payload
            .records
            .into_iter()
            .map(|(rev, record)| Change::Write { rev, record })
            .collect();
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_write().map_err(io_err)?;
            {
                let mut kv = txn.open_table(KV).map_err(io_err)?;
                kv.retain(|_, _| false).map_err(io_err)?;
            }
            write_sm(&txn, &changes, &row)?;
            txn.commit().map_err(io_err)
        })
        .await
        .map_err(io_err)
        .and_then(|r| r)
        .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        let bytes = snapshot.into_inner();
        *self.shared.write().expect("state lock poisoned") = SmState {
            store,
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        *self.current.lock().expect("snapshot lock poisoned") = Some(StoredSnapshot {
            meta: meta.clone(),
            bytes,
        });
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        if let Some(stored) = self.current.lock().expect("snapshot lock poisoned").clone() {
            return Ok(Some(stored.into_snapshot()));
        }
        // After a restart: the current state is a valid snapshot at `last_applied`, which is
        // never below the purged log, so none has to be kept on disk.
        let applied = self
            .shared
            .read()
            .expect("state lock poisoned")
            .last_applied;
        Ok(applied.map(|_| self.snapshot()))
    }
}

/// Reads run against the applied state under the read lock.
pub(crate) fn read<T>(shared: &Shared, f: impl FnOnce(&Store) -> T) -> T {
    let state = shared.read().expect("state lock poisoned");
    f(&state.store)
}
