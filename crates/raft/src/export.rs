//! The state machine as another format sees it, in both directions:
//!
//! - [`StateView`]: one consistent view of the file (a redb read transaction, taken after the
//!   staged changes are written), rows streamed on demand, for an export such as etcd's snapshot
//!   file (`leasehold-snapshot`). Writes go on meanwhile: redb's readers see the state as of
//!   their transaction's start.
//! - [`restore_data_dir`]: a new data dir whose state machine is an imported state and whose
//!   Raft state is a cluster that already holds it, for `leasehold snapshot restore`.
//!
//! No format knowledge lives here: rows go out and come in as the core's own types.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use leasehold_auth::AuthState;
use leasehold_lease::{LeaseId, LeaseRecord};
use leasehold_mvcc::{Record, Revision};
use redb::{Durability, ReadableTable, ReadableTableMetadata};

use crate::command::{AlarmMember, MemberAttrs};
use crate::storage::{
    self, ALARMS, AUTH, COMPACT_REVISION, CURRENT_REVISION, KV, LAST_APPLIED, LEASE_CLOCK_MS,
    LEASES, MEMBER_ATTRS, MEMBERSHIP, SM_META, StorageError, decode, encode, lease_key,
};

/// A member as the view lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewMember {
    pub id: u64,
    pub peer_url: String,
    pub learner: bool,
    /// What it published about itself (`None`: it has not started yet).
    pub published: Option<MemberAttrs>,
}

/// One consistent view of the state machine as the file holds it.
pub struct StateView {
    txn: crate::storage::Txn<redb::ReadTransaction>,
    /// The last log index whose changes the view holds (etcd's consistent index).
    pub applied_index: u64,
    /// The term of that entry.
    pub applied_term: u64,
    pub current_revision: i64,
    pub compact_revision: i64,
    /// The lease time when the view was taken, against which leases' remaining time counts.
    pub lease_time_ms: u64,
    pub alarms: Vec<AlarmMember>,
    pub members: Vec<ViewMember>,
    pub auth: AuthState,
}

fn to_io(e: StorageError) -> io::Error {
    io::Error::other(e)
}

/// For `map_err`: a failed read of `what`, as an I/O error.
fn read_failed<E: Into<redb::Error>>(what: &'static str) -> impl FnOnce(E) -> io::Error {
    move |e| to_io(StorageError::read(what)(e))
}

impl StateView {
    /// Takes the view: writes the staged changes (durably), then begins a read transaction.
    /// Blocking.
    pub(crate) fn take(db: &storage::Db, lease_time_ms: u64) -> Result<StateView, StorageError> {
        db.flush_staged_sm()?;
        // The file given out says its compaction finished (etcd's `finishedCompactRev`): its
        // hidden rows go first. On a full disk they may not; then the view has them, as etcd's
        // own file has in the middle of a compaction.
        if let Err(e) = db.remove_all_compacted() {
            tracing::warn!("a state view with a compaction's rows still in it: {e}");
        }
        let txn = db
            .begin_read()
            .map_err(StorageError::read("a state view"))?;
        let meta = storage::SmMeta::read(&txn)?;
        let attrs: BTreeMap<u64, MemberAttrs> =
            meta.member_attrs.into_iter().map(|a| (a.id, a)).collect();
        let members = meta
            .membership
            .iter()
            .map(|(id, m)| ViewMember {
                id: *id,
                peer_url: m.peer_url.clone(),
                learner: m.learner,
                published: attrs.get(id).cloned(),
            })
            .collect();
        Ok(StateView {
            txn,
            applied_index: meta.last_applied.map_or(0, |l| l.index),
            applied_term: meta.last_applied.map_or(0, |l| l.term),
            current_revision: meta.current_revision,
            compact_revision: meta.compact_revision,
            lease_time_ms,
            alarms: meta.alarms,
            members,
            auth: meta.auth,
        })
    }

    /// How many stored versions (puts and tombstones) the view holds.
    pub fn record_count(&self) -> io::Result<u64> {
        let kv = self.txn.open_table(KV).map_err(read_failed("kv"))?;
        kv.len().map_err(read_failed("kv"))
    }

    /// Every stored version in revision order.
    pub fn for_each_record(
        &self,
        mut f: impl FnMut(Revision, Record) -> io::Result<()>,
    ) -> io::Result<()> {
        let kv = self.txn.open_table(KV).map_err(read_failed("kv"))?;
        for row in kv.iter().map_err(read_failed("kv"))? {
            let (k, v) = row.map_err(read_failed("kv"))?;
            let record = decode::<Record>("kv", v.value()).map_err(to_io)?;
            f(Revision::from_bytes(k.value()), record)?;
        }
        Ok(())
    }

    /// Every lease, in the order of its id's bytes, with its TTL and its deadline on the lease
    /// clock.
    pub fn for_each_lease(
        &self,
        mut f: impl FnMut(LeaseId, LeaseRecord) -> io::Result<()>,
    ) -> io::Result<()> {
        let leases = self.txn.open_table(LEASES).map_err(read_failed("leases"))?;
        for row in leases.iter().map_err(read_failed("leases"))? {
            let (k, v) = row.map_err(read_failed("leases"))?;
            let id = crate::state_machine::lease_id_of_row(k.value()).map_err(to_io)?;
            f(
                id,
                decode::<LeaseRecord>("leases", v.value()).map_err(to_io)?,
            )?;
        }
        Ok(())
    }
}

/// A lease as an import gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportedLease {
    pub id: LeaseId,
    pub ttl_secs: i64,
    /// Seconds left (the TTL when the source did not know).
    pub remaining_secs: i64,
}

/// A state machine to restore, apart from its versions (which stream).
#[derive(Clone, Debug)]
pub struct ImportedState {
    pub compact_revision: i64,
    pub leases: Vec<ImportedLease>,
    pub alarms: Vec<AlarmMember>,
    pub auth: AuthState,
}

/// What a restore wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    /// The newest revision of a version, or the compaction point if that is newer (etcd's rule).
    pub current_revision: i64,
    pub records: u64,
    pub leases: u64,
}

/// Why a restore failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("data-dir {0:?} not empty or could not be read")]
    NotEmpty(std::path::PathBuf),
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The source of the versions failed (it is unreadable or not what it claims).
    #[error("{0}")]
    Source(io::Error),
}

/// A sink for versions, in revision order.
pub type RecordSink<'a> = dyn FnMut(Revision, Record) -> io::Result<()> + 'a;

/// Creates `dir` holding `state` and the versions `fill` gives (in strictly increasing revision
/// order) as a member of a new cluster of `members` (id → peer URL, every one a voter) that has
/// already applied that state: the state machine's `last_applied` and the purged log both end
/// at log id (term 0, index 0), the one `Raft::initialize` writes, so every member restored from
/// the same source with the same members starts from the same state and elects a leader among
/// them. Refuses a `dir` that exists and is not empty; leaves nothing behind when it fails.
/// Blocking.
pub fn restore_data_dir(
    dir: &Path,
    members: &BTreeMap<u64, String>,
    state: &ImportedState,
    fill: impl FnOnce(&mut RecordSink<'_>) -> io::Result<()>,
) -> Result<Restored, RestoreError> {
    let empty = match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => true,
        Err(_) => false,
    };
    if !empty {
        return Err(RestoreError::NotEmpty(dir.to_path_buf()));
    }
    let existed = dir.exists();
    let written = write_restored(dir, members, state, fill);
    if written.is_err() {
        // Best effort: the failure is what the caller needs to hear about.
        let _ = if existed {
            std::fs::remove_file(dir.join("leasehold.redb"))
        } else {
            std::fs::remove_dir_all(dir)
        };
    }
    written
}

fn write_restored(
    dir: &Path,
    members: &BTreeMap<u64, String>,
    state: &ImportedState,
    fill: impl FnOnce(&mut RecordSink<'_>) -> io::Result<()>,
) -> Result<Restored, RestoreError> {
    const WHAT: &str = "a restore";
    let db = storage::open(dir)?;
    let mut txn = db.begin_write().map_err(StorageError::write(WHAT))?;
    txn.set_durability(Durability::Immediate)
        .map_err(StorageError::write(WHAT))?;
    let mut restored = Restored {
        current_revision: state.compact_revision.max(1),
        records: 0,
        leases: 0,
    };
    {
        let mut kv = txn.open_table(KV).map_err(StorageError::write(WHAT))?;
        let mut last: Option<Revision> = None;
        let mut sink = |rev: Revision, record: Record| -> io::Result<()> {
            if last.is_some_and(|l| l >= rev) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("revision {}_{} out of order", rev.main, rev.sub),
                ));
            }
            last = Some(rev);
            kv.insert(rev.to_bytes(), encode(&record).as_slice())
                .map_err(|e| to_io(StorageError::write(WHAT)(e)))?;
            restored.records += 1;
            restored.current_revision = restored.current_revision.max(rev.main);
            Ok(())
        };
        fill(&mut sink).map_err(RestoreError::Source)?;
        let mut leases = txn.open_table(LEASES).map_err(StorageError::write(WHAT))?;
        for (seq, lease) in state.leases.iter().enumerate() {
            let record = LeaseRecord {
                ttl_secs: lease.ttl_secs,
                deadline_ms: u64::try_from(lease.remaining_secs.max(0))
                    .unwrap_or(0)
                    .saturating_mul(1000),
                grant_seq: seq as u64,
            };
            leases
                .insert(lease_key(lease.id), encode(&record).as_slice())
                .map_err(StorageError::write(WHAT))?;
            restored.leases += 1;
        }
        let start = crate::position::LogPosition::default();
        let membership = crate::position::voters(members);
        let mut meta = txn.open_table(SM_META).map_err(StorageError::write(WHAT))?;
        LAST_APPLIED.put(&mut meta, &Some(start))?;
        MEMBERSHIP.put(&mut meta, &membership)?;
        CURRENT_REVISION.put(&mut meta, &restored.current_revision)?;
        COMPACT_REVISION.put(&mut meta, &state.compact_revision)?;
        LEASE_CLOCK_MS.put(&mut meta, &0)?;
        ALARMS.put(&mut meta, &state.alarms)?;
        MEMBER_ATTRS.put(&mut meta, &Vec::new())?;
        AUTH.put(&mut meta, &state.auth)?;
    }
    txn.commit().map_err(StorageError::commit(WHAT))?;
    Ok(restored)
}
