//! The state machine's on-disk layout in one redb database (see docs/storage-format.md); the Raft
//! log is apart, in the write-ahead log. Applying stages the state machine's changes, and the
//! next checkpoint (`Db::checkpoint`, every 100 ms) writes them in one durable transaction. A
//! crash rolls the state machine back to its last checkpoint, and the log, which is compacted
//! only behind a durable checkpoint, replays what came after. Building a snapshot also writes the
//! stage, in a durable transaction of its own (`Db::flush_staged_sm`), so that the snapshot it
//! reads from the file holds everything applied; whichever writer takes the stage does so inside
//! redb's single write transaction, so stages reach the file whole and in order. A compaction's
//! hidden rows are the exception: they leave after its checkpoint, a batch at a time
//! (`removals.rs`).

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use std::collections::BTreeMap;

use leasehold_lease::{LeaseId, LeaseRecord};
use leasehold_mvcc::Change;
use redb::{Database, Durability, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::command::{AlarmMember, MemberAttrs};
use crate::position::{LogPosition, Members};
use crate::telemetry::Telemetry;
use leasehold_auth::AuthState;

mod error;
mod removals;
mod values;

pub use error::StorageError;
pub(crate) use removals::Scheduled;
pub(crate) use values::{FileValues, VALUES_HELD_BYTES};

/// Every stored version of every key, by revision (`main` then `sub`, big-endian).
pub(crate) const KV: TableDefinition<[u8; 16], &[u8]> = TableDefinition::new("kv");
/// Every lease, by id (`i64` as `u64`, big-endian): postcard-encoded `LeaseRecord`.
pub(crate) const LEASES: TableDefinition<[u8; 8], &[u8]> = TableDefinition::new("leases");
/// State-machine metadata: `last_applied`, `membership`, `current_revision`,
/// `compact_revision`.
pub(crate) const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");

/// redb's page cache. The file is read to write (the B-tree paths a commit changes: the end of
/// `kv`, scattered lease rows), to read back values the state machine released
/// (`storage/values.rs`: all but the newest 4 MiB) and to build snapshots; the kernel's page
/// cache holds the rest, outside the process. redb's default (1 GiB) kept the whole file resident a
/// second time: 250 bytes per key of RSS (docs/bench.md, "Memory"); 32 MiB was a sixth of the
/// peak under a Kubernetes control plane (docs/kubernetes.md).
const CACHE_BYTES: usize = 8 << 20;

/// The storage format version, stored under `format` in `SM_META`: 2 (1 was an engine's before
/// raft-rs, never released; such a file is refused as a format this build does not read).
pub(crate) const FORMAT_VERSION: u32 = 2;

/// A metadata row: its name and the one type it holds, so that what is written is always read
/// back as the same type.
pub(crate) struct MetaKey<T> {
    pub(crate) name: &'static str,
    _type: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> MetaKey<T> {
    const fn new(name: &'static str) -> MetaKey<T> {
        MetaKey {
            name,
            _type: PhantomData,
        }
    }

    pub(crate) fn get(
        &self,
        table: &impl ReadableTable<&'static str, &'static [u8]>,
    ) -> Result<Option<T>, StorageError> {
        match table
            .get(self.name)
            .map_err(StorageError::read(self.name))?
        {
            Some(v) => Ok(Some(decode(self.name, v.value())?)),
            None => Ok(None),
        }
    }

    pub(crate) fn put(
        &self,
        table: &mut redb::Table<&'static str, &'static [u8]>,
        value: &T,
    ) -> Result<(), StorageError> {
        table
            .insert(self.name, encode(value).as_slice())
            .map_err(StorageError::write(self.name))?;
        Ok(())
    }
}

pub(crate) const FORMAT: MetaKey<u32> = MetaKey::new("format");
pub(crate) const LAST_APPLIED: MetaKey<Option<LogPosition>> = MetaKey::new("last_applied");
pub(crate) const MEMBERSHIP: MetaKey<Members> = MetaKey::new("membership");
pub(crate) const CURRENT_REVISION: MetaKey<i64> = MetaKey::new("current_revision");
pub(crate) const COMPACT_REVISION: MetaKey<i64> = MetaKey::new("compact_revision");
pub(crate) const LEASE_CLOCK_MS: MetaKey<u64> = MetaKey::new("lease_clock_ms");
/// The alarms raised (absent in files written before alarms existed: none).
pub(crate) const ALARMS: MetaKey<Vec<AlarmMember>> = MetaKey::new("alarms");
/// What each member published about itself (absent in older files: nothing published).
pub(crate) const MEMBER_ATTRS: MetaKey<Vec<MemberAttrs>> = MetaKey::new("member_attrs");
/// The auth store (absent in older files: auth off, no users or roles).
pub(crate) const AUTH: MetaKey<AuthState> = MetaKey::new("auth");

pub(crate) fn lease_key(id: LeaseId) -> [u8; 8] {
    // Two's complement reinterpretation: negative ids are valid and sort after positive ones.
    (id.get() as u64).to_be_bytes()
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("in-memory serialization cannot fail")
}

/// Decodes `what` (a row, an entry or a snapshot) from its stored bytes.
pub(crate) fn decode<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, StorageError> {
    postcard::from_bytes(bytes).map_err(StorageError::decode(what))
}

/// What wakes the checkpointer: rows staged (by apply, or put back after a failed write: the
/// [`Db`] rings for both), a snapshot a follower wants (the Raft thread rings), and the stop.
/// Rings that come while it works fold into one.
#[derive(Default)]
pub(crate) struct Bell {
    rung: Mutex<Rung>,
    wake: Condvar,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Rung {
    pub(crate) staged: bool,
    pub(crate) snapshot: bool,
    pub(crate) stop: bool,
}

impl Bell {
    pub(crate) fn ring(&self, what: impl FnOnce(&mut Rung)) {
        what(&mut self.rung.lock().expect("bell lock poisoned"));
        self.wake.notify_one();
    }

    /// Sleeps until rung, and takes the ring (the stop stays rung).
    pub(crate) fn wait(&self) -> Rung {
        let rung = self.rung.lock().expect("bell lock poisoned");
        let mut rung = self
            .wake
            .wait_while(rung, |r| !(r.staged || r.snapshot || r.stop))
            .expect("bell lock poisoned");
        let taken = *rung;
        rung.staged = false;
        rung.snapshot = false;
        taken
    }

    /// Sleeps `at_most`, or until the stop rings; whether it did.
    pub(crate) fn stopped_within(&self, at_most: std::time::Duration) -> bool {
        let rung = self.rung.lock().expect("bell lock poisoned");
        let (rung, _) = self
            .wake
            .wait_timeout_while(rung, at_most, |r| !r.stop)
            .expect("bell lock poisoned");
        rung.stop
    }
}

/// The open database. Fields drop in order, so `closed` fires only once the file (and redb's
/// lock on it) is released: that is what a restart in the same process must wait for.
pub(crate) struct Db {
    /// Transactions begin under the read side; a defragmentation takes the write side, so that
    /// none begins while redb compacts the file (it needs the database to itself), and so does
    /// opening the file again after a write that ran out of space (`None` until that succeeds).
    db: RwLock<Option<Database>>,
    path: std::path::PathBuf,
    /// A write of the staged state, or of a compaction's removals, ran out of space, and the
    /// disk has not had room since (see [`Db::out_of_space`]). [`FULL_MARKER`] says so across a
    /// restart.
    out_of_space: AtomicBool,
    /// The last write ran out of space: redb takes no other until the file is opened again.
    reopen_needed: AtomicBool,
    /// Held by each writer of the state (the stage, a compaction's removals) from its look at
    /// `out_of_space` to its commit: redb takes no write after a failed one until the file is
    /// opened again, so a writer must not begin behind another's failure unawares; compactions
    /// are queued in the order their stages reached the file; and the removal queue changes
    /// under one remover at a time.
    writing: Mutex<()>,
    /// Transactions begun and not yet ended, which a defragmentation waits out.
    open: Arc<OpenTxns>,
    /// State-machine writes applied but not yet in the file; the next log commit (or snapshot
    /// build) writes them.
    staged_sm: Mutex<StagedSm>,
    /// Rung whenever rows are staged, so that the checkpointer writes them.
    checkpoint_bell: Arc<Bell>,
    /// The store's revision as of the newest durable state in the file: the rows of every
    /// version up to it can be read back ([`FileValues`]).
    durable_revision: std::sync::atomic::AtomicI64,
    /// Compactions whose rows are yet to leave the file (`removals.rs`).
    removals: removals::Removals,
    /// Rung when a compaction's rows are to be removed, so that the compactor removes them.
    compaction_bell: Arc<Bell>,
    closed: tokio::sync::watch::Sender<()>,
    /// Commit times and the other counters operators read.
    telemetry: Arc<Telemetry>,
}

#[derive(Default)]
struct StagedSm {
    changes: Vec<Change>,
    /// The latest state of every lease touched since the last write (`None`: removed).
    leases: BTreeMap<LeaseId, Option<LeaseRecord>>,
    meta: Option<SmMeta>,
    /// Compactions applied: their rows leave the file once this stage is in it.
    compactions: Vec<Scheduled>,
}

/// The state-machine metadata rows: written with its changes, read back whole (and sent whole at
/// the head of a snapshot's file).
#[derive(serde::Deserialize, Serialize)]
pub(crate) struct SmMeta {
    pub(crate) last_applied: Option<LogPosition>,
    pub(crate) membership: Members,
    pub(crate) current_revision: i64,
    pub(crate) compact_revision: i64,
    pub(crate) lease_clock_ms: u64,
    pub(crate) alarms: Vec<AlarmMember>,
    pub(crate) member_attrs: Vec<MemberAttrs>,
    pub(crate) auth: AuthState,
}

impl SmMeta {
    /// The rows as `txn` sees them (a new database's defaults where one is missing).
    pub(crate) fn read(txn: &redb::ReadTransaction) -> Result<SmMeta, StorageError> {
        let meta = txn
            .open_table(SM_META)
            .map_err(StorageError::read("sm_meta"))?;
        let fresh = leasehold_mvcc::Store::new();
        Ok(SmMeta {
            last_applied: LAST_APPLIED.get(&meta)?.flatten(),
            membership: MEMBERSHIP.get(&meta)?.unwrap_or_default(),
            current_revision: CURRENT_REVISION
                .get(&meta)?
                .unwrap_or(fresh.current_revision()),
            compact_revision: COMPACT_REVISION
                .get(&meta)?
                .unwrap_or(fresh.compact_revision()),
            lease_clock_ms: LEASE_CLOCK_MS.get(&meta)?.unwrap_or(0),
            alarms: ALARMS.get(&meta)?.unwrap_or_default(),
            member_attrs: MEMBER_ATTRS.get(&meta)?.unwrap_or_default(),
            auth: AUTH.get(&meta)?.unwrap_or_default(),
        })
    }
}

/// Writes state-machine changes and the metadata they lead to, in one transaction.
pub(crate) fn write_sm(
    txn: &redb::WriteTransaction,
    changes: &[Change],
    leases: &BTreeMap<LeaseId, Option<LeaseRecord>>,
    meta: &SmMeta,
) -> Result<(), StorageError> {
    let mut lease_table = txn
        .open_table(LEASES)
        .map_err(StorageError::write("leases"))?;
    for (id, record) in leases {
        match record {
            Some(record) => {
                lease_table
                    .insert(lease_key(*id), encode(record).as_slice())
                    .map_err(StorageError::write("leases"))?;
            }
            None => {
                lease_table
                    .remove(lease_key(*id))
                    .map_err(StorageError::write("leases"))?;
            }
        }
    }
    let mut kv = txn.open_table(KV).map_err(StorageError::write("kv"))?;
    for change in changes {
        match change {
            Change::Write { rev, record } => {
                kv.insert(rev.to_bytes(), encode(record).as_slice())
                    .map_err(StorageError::write("kv"))?;
            }
            Change::Remove { rev } => {
                kv.remove(rev.to_bytes())
                    .map_err(StorageError::write("kv"))?;
            }
        }
    }
    let mut m = txn
        .open_table(SM_META)
        .map_err(StorageError::write("sm_meta"))?;
    LAST_APPLIED.put(&mut m, &meta.last_applied)?;
    MEMBERSHIP.put(&mut m, &meta.membership)?;
    CURRENT_REVISION.put(&mut m, &meta.current_revision)?;
    COMPACT_REVISION.put(&mut m, &meta.compact_revision)?;
    LEASE_CLOCK_MS.put(&mut m, &meta.lease_clock_ms)?;
    ALARMS.put(&mut m, &meta.alarms)?;
    MEMBER_ATTRS.put(&mut m, &meta.member_attrs)?;
    AUTH.put(&mut m, &meta.auth)?;
    Ok(())
}

/// What a defragmentation did to the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defragmented {
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// How long opening the file again waits for transactions already running.
const REOPEN_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// What a transaction on a database not open again yet gets.
fn closed() -> redb::TransactionError {
    redb::TransactionError::Storage(redb::StorageError::DatabaseClosed)
}

/// How long a defragmentation waits for transactions already running (a snapshot being sent
/// holds a read transaction for its whole stream) before it gives up.
const DEFRAG_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// The count of transactions begun and not yet ended, with a signal for when it reaches zero.
#[derive(Default)]
struct OpenTxns {
    count: Mutex<usize>,
    none_open: Condvar,
}

impl OpenTxns {
    fn began(&self) {
        *self.count.lock().expect("open txns lock poisoned") += 1;
    }

    fn ended(&self) {
        let mut count = self.count.lock().expect("open txns lock poisoned");
        *count -= 1;
        if *count == 0 {
            self.none_open.notify_all();
        }
    }

    /// Waits, at most `bound`, until no transaction is open; whether none is.
    fn wait_none(&self, bound: std::time::Duration) -> bool {
        let count = self.count.lock().expect("open txns lock poisoned");
        let (count, _) = self
            .none_open
            .wait_timeout_while(count, bound, |open| *open > 0)
            .expect("open txns lock poisoned");
        *count == 0
    }
}

/// A redb transaction counted as open until it is committed, aborted or dropped.
pub(crate) struct Txn<T> {
    txn: Option<T>,
    open: Arc<OpenTxns>,
}

impl<T> Txn<T> {
    fn new(txn: T, open: &Arc<OpenTxns>) -> Txn<T> {
        open.began();
        Txn {
            txn: Some(txn),
            open: open.clone(),
        }
    }

    fn take(&mut self) -> T {
        self.txn
            .take()
            .expect("a transaction is used only until it ends")
    }
}

impl<T> Deref for Txn<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.txn
            .as_ref()
            .expect("a transaction is used only until it ends")
    }
}

impl<T> DerefMut for Txn<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.txn
            .as_mut()
            .expect("a transaction is used only until it ends")
    }
}

impl<T> Drop for Txn<T> {
    fn drop(&mut self) {
        // The transaction itself ends first, then the count.
        drop(self.txn.take());
        self.open.ended();
    }
}

impl Txn<redb::WriteTransaction> {
    pub(crate) fn commit(mut self) -> Result<(), redb::CommitError> {
        self.take().commit()
    }

    pub(crate) fn abort(mut self) -> Result<(), redb::StorageError> {
        self.take().abort()
    }
}

impl Db {
    pub(crate) fn begin_write(
        &self,
    ) -> Result<Txn<redb::WriteTransaction>, redb::TransactionError> {
        let db = self.db.read().expect("db lock poisoned");
        let db = db.as_ref().ok_or_else(closed)?;
        Ok(Txn::new(db.begin_write()?, &self.open))
    }

    pub(crate) fn begin_read(&self) -> Result<Txn<redb::ReadTransaction>, redb::TransactionError> {
        let db = self.db.read().expect("db lock poisoned");
        let db = db.as_ref().ok_or_else(closed)?;
        Ok(Txn::new(
            redb::ReadableDatabase::begin_read(db)?,
            &self.open,
        ))
    }

    /// [`Db::begin_read`] for a read the member cannot do without (a released value): a file
    /// that a write which ran out of space left refusing (redb then reads no table either, "a
    /// previous I/O error") or closed ([`Db::reopen`]) is opened again first.
    pub(crate) fn begin_read_reopened(
        &self,
        what: &'static str,
    ) -> Result<Txn<redb::ReadTransaction>, StorageError> {
        if self.reopen_needed.load(Ordering::SeqCst) {
            let _writing = self.writing.lock().expect("writing lock poisoned");
            self.reopen_if_full(what)?;
        }
        self.begin_read().map_err(StorageError::read(what))
    }

    /// A read found the file refusing reads (a write failed since it was opened, "a previous
    /// I/O error"): the next read that must get through ([`Db::begin_read_reopened`]), or the
    /// next write, opens it again.
    pub(crate) fn reopen_before_next_read(&self) {
        self.reopen_needed.store(true, Ordering::SeqCst);
    }

    /// Whether the disk ran out of space under a write of the staged state and has not had room
    /// since ([`Db::clear_full_if_room`]): writes that add data are refused meanwhile
    /// (`Replica::admit`, etcd's NOSPACE), reads go on from memory, and every checkpoint tries
    /// again, so the member resumes once space is freed.
    pub(crate) fn out_of_space(&self) -> bool {
        self.out_of_space.load(Ordering::SeqCst)
    }

    /// Marks the disk full after a write that ran out of space; whether it was not marked
    /// before. The empty [`FULL_MARKER`] (it takes no data blocks, so a full disk mostly still
    /// takes it) keeps the mark across a restart, as etcd's NOSPACE alarm outlives one.
    fn mark_full(&self) -> bool {
        self.reopen_needed.store(true, Ordering::SeqCst);
        if self.out_of_space.swap(true, Ordering::SeqCst) {
            return false;
        }
        if let Err(e) = std::fs::File::create(self.path.with_file_name(FULL_MARKER)) {
            tracing::debug!("could not mark the full disk in the data dir: {e}");
        }
        true
    }

    /// After a write got through (or found nothing to write) on a disk marked full: clears the
    /// mark once the disk has room again, free space for a quarter of the file and at least
    /// [`ROOM_MIN`]. A write that fits in pages the file already had free says nothing of the
    /// disk: after a restart on a full disk, redb finds such pages. Whether it cleared.
    fn clear_full_if_room(&self) -> bool {
        use leasehold_wal::Fs as _;
        if !self.out_of_space() {
            return false;
        }
        let file_bytes = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        let needed = (file_bytes / 4).max(ROOM_MIN);
        let dir = self.path.parent().unwrap_or(Path::new("."));
        if leasehold_wal::StdFs
            .available(dir)
            .is_some_and(|free| free < needed)
        {
            return false;
        }
        if let Err(e) = std::fs::remove_file(self.path.with_file_name(FULL_MARKER))
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("removing the full-disk mark from the data dir: {e}");
        }
        self.out_of_space.swap(false, Ordering::SeqCst)
    }

    /// redb refuses every write after one that failed, until its file is opened again (which
    /// brings back its last commit). Whether it is open again; with the disk still too full to
    /// open it, it stays closed until the next try.
    fn reopen(&self) -> Result<bool, StorageError> {
        let mut db = self.db.write().expect("db lock poisoned");
        if !self.open.wait_none(REOPEN_WAIT_MAX) {
            return Ok(false);
        }
        // The old handle (and redb's lock on the file) goes first.
        *db = None;
        match redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(&self.path)
        {
            Ok(reopened) => {
                *db = Some(reopened);
                Ok(true)
            }
            Err(e) => {
                let e = StorageError::Open {
                    path: self.path.clone(),
                    error: e.into(),
                };
                if e.is_out_of_space() {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Before a write (under `writing`): a file whose last write ran out of space is opened
    /// again ([`Db::reopen`]); an error naming `what` while the disk is still too full for that.
    fn reopen_if_full(&self, what: &'static str) -> Result<(), StorageError> {
        if self.reopen_needed.load(Ordering::SeqCst) {
            if !self.reopen()? {
                return Err(StorageError::Write {
                    what,
                    error: redb::Error::Io(std::io::Error::from(std::io::ErrorKind::StorageFull)),
                });
            }
            self.reopen_needed.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Puts staged changes whose write failed back on the stage, ahead of what was staged since,
    /// so the next write holds them (the Raft log is never compacted past an unwritten stage).
    fn restage(&self, older: StagedSm) {
        let mut staged = self.staged_sm.lock().expect("staged lock poisoned");
        let newer = std::mem::replace(&mut *staged, older);
        staged.changes.extend(newer.changes);
        staged.leases.extend(newer.leases);
        staged.compactions.extend(newer.compactions);
        if newer.meta.is_some() {
            staged.meta = newer.meta;
        }
        drop(staged);
        self.checkpoint_bell.ring(|r| r.staged = true);
    }

    /// Writes the staged state-machine changes in one durable transaction and returns the applied
    /// position they bring the file to (`None`: nothing was staged). A failed write leaves them
    /// staged ([`Db::restage`]); one that ran out of space also marks the disk full, until a
    /// later write gets through. Blocking.
    fn write_staged(&self, what: &'static str) -> Result<Option<LogPosition>, StorageError> {
        let _writing = self.writing.lock().expect("writing lock poisoned");
        self.reopen_if_full(what)?;
        // Taken once the write transaction has begun: transactions run one at a time, so what
        // is staged later lands in a later one, never under an older checkpoint.
        let mut txn = self.begin_write().map_err(StorageError::write(what))?;
        let mut staged = std::mem::take(&mut *self.staged_sm.lock().expect("staged lock poisoned"));
        let Some(meta) = staged.meta.as_ref() else {
            if self.clear_full_if_room() {
                tracing::warn!("the disk has room again: writes are admitted");
            }
            return Ok(None);
        };
        let applied = meta.last_applied;
        let revision = meta.current_revision;
        let written = txn
            .set_durability(Durability::Immediate)
            .map_err(StorageError::write(what))
            .and_then(|()| write_sm(&txn, &staged.changes, &staged.leases, meta));
        let committed = match written {
            Ok(()) => {
                let started = std::time::Instant::now();
                let committed = txn.commit().map_err(StorageError::commit(what));
                if committed.is_ok() {
                    self.telemetry.state_commit.observe(started.elapsed());
                }
                committed
            }
            Err(e) => Err(e),
        };
        match committed {
            Ok(()) => {
                if self.clear_full_if_room() {
                    tracing::warn!(
                        "the disk has room again: the state is written and writes are admitted"
                    );
                }
                self.schedule_removals(std::mem::take(&mut staged.compactions));
                self.set_durable_revision(revision);
                Ok(applied)
            }
            Err(e) => {
                self.restage(staged);
                if e.is_out_of_space() && self.mark_full() {
                    tracing::error!(
                        "the disk is full ({e}): writes that add data get NOSPACE and reads go on \
                         until space is freed; the state is written again at every checkpoint"
                    );
                }
                Err(e)
            }
        }
    }

    /// Compacts the file (etcd's defragment): every page in use is moved to the front and the
    /// file truncated. No transaction begins meanwhile, so writes wait for it, as they wait for
    /// etcd's. Blocking. `Ok(None)` when transactions already running did not end within
    /// [`DEFRAG_WAIT_MAX`].
    pub(crate) fn defragment(&self, path: &Path) -> Result<Option<Defragmented>, StorageError> {
        const WHAT: &str = "a defragmentation";
        let size = || std::fs::metadata(path).map_or(0, |m| m.len());
        let started = std::time::Instant::now();
        // What was applied goes into the file first, so the compacted file holds it: staged
        // rows written after the compaction (puts and the deletes that undo them, on the raft-rs
        // engine up to a checkpoint's worth) would grow the file again.
        self.flush_staged_sm()?;
        self.remove_all_compacted()?;
        let bytes_before = size();
        // No transaction begins from here on; those already open are waited out (woken as the
        // last one ends).
        let mut db = self.db.write().expect("db lock poisoned");
        if !self
            .open
            .wait_none(DEFRAG_WAIT_MAX.saturating_sub(started.elapsed()))
        {
            return Ok(None);
        }
        let Some(open) = db.as_mut() else {
            return Err(StorageError::write(WHAT)(closed()));
        };
        match open.compact() {
            Ok(_) => {
                drop(db);
                Ok(Some(Defragmented {
                    bytes_before,
                    bytes_after: size(),
                }))
            }
            // Not expected with every transaction counted; answered as a wait that ran out.
            Err(redb::CompactionError::TransactionInProgress) => Ok(None),
            Err(e) => Err(StorageError::write::<redb::Error>(WHAT)(e.into())),
        }
    }

    /// Bytes of the file that hold data (etcd's `db_size_in_use`): the pages allocated. Slow on a
    /// big file: it begins a write transaction (waiting for a commit in progress), and redb's
    /// `stats()` walks every table's pages, reading those not cached.
    pub(crate) fn bytes_in_use(&self) -> Option<u64> {
        let txn = self.begin_write().ok()?;
        let stats = txn.stats().ok();
        txn.abort().ok()?;
        let stats = stats?;
        Some(stats.allocated_pages() * stats.page_size() as u64)
    }

    /// Queues applied state-machine changes. They reach the file in the next checkpoint
    /// ([`Db::checkpoint`]): applying costs no write transaction of its own. Until then a crash
    /// loses them, and the entries are applied again from the log, which holds them durably.
    pub(crate) fn stage_sm(
        &self,
        changes: Vec<Change>,
        leases: impl IntoIterator<Item = (LeaseId, Option<LeaseRecord>)>,
        meta: SmMeta,
        compactions: Vec<Scheduled>,
    ) {
        let mut staged = self.staged_sm.lock().expect("staged lock poisoned");
        staged.changes.extend(changes);
        staged.leases.extend(leases);
        staged.compactions.extend(compactions);
        staged.meta = Some(meta);
        drop(staged);
        self.checkpoint_bell.ring(|r| r.staged = true);
    }

    /// The store's revision as of the newest durable state in the file.
    pub(crate) fn durable_revision(&self) -> i64 {
        self.durable_revision.load(Ordering::SeqCst)
    }

    /// The file now durably holds the state as of the store's `revision` (a checkpoint, an
    /// installed snapshot, or the state loaded at start).
    pub(crate) fn set_durable_revision(&self, revision: i64) {
        self.durable_revision.store(revision, Ordering::SeqCst);
    }

    /// What wakes this file's checkpointer ([`Bell`]).
    pub(crate) fn checkpoint_bell(&self) -> &Arc<Bell> {
        &self.checkpoint_bell
    }

    /// What wakes this file's compactor ([`Bell`]; `staged`: rows to remove).
    pub(crate) fn compaction_bell(&self) -> &Arc<Bell> {
        &self.compaction_bell
    }

    /// Writes the staged state-machine changes now, in a durable transaction of their own
    /// (a snapshot is about to read the file and must see everything applied so far). Blocking.
    pub(crate) fn flush_staged_sm(&self) -> Result<(), StorageError> {
        self.write_staged("staged state-machine changes")
            .map(|_| ())
    }

    /// The checkpoint: writes the staged state-machine changes durably, and returns the applied
    /// log position they bring the file to (`None`: nothing was written). The Raft log may be
    /// compacted up to it. A disk out of space is not an error here: the stage waits for the
    /// next checkpoint ([`Db::out_of_space`]). Blocking.
    pub(crate) fn checkpoint(&self) -> Result<Option<LogPosition>, StorageError> {
        // Nothing staged (an idle member, ten times a second): no transaction to begin. What is
        // staged after this look is the next checkpoint's. (Only here: a flush before a
        // snapshot or a defragment must begin its transaction, which waits for a checkpoint
        // still committing what it took.)
        if !self.out_of_space()
            && self
                .staged_sm
                .lock()
                .expect("staged lock poisoned")
                .meta
                .is_none()
        {
            return Ok(None);
        }
        match self.write_staged("the state machine's checkpoint") {
            Err(e) if e.is_out_of_space() => Ok(None),
            other => other,
        }
    }

    /// The directory the file is in (the data dir's own part of it).
    pub(crate) fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    pub(crate) fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }

    /// Drops staged changes that a snapshot install makes obsolete.
    pub(crate) fn discard_staged_sm(&self) {
        *self.staged_sm.lock().expect("staged lock poisoned") = StagedSm::default();
    }

    /// Completes (with an error, as the sender is gone) when the database is closed.
    pub(crate) fn closed(&self) -> tokio::sync::watch::Receiver<()> {
        self.closed.subscribe()
    }
}

/// The database's file in a data dir.
const DB_FILE: &str = "leasehold.redb";

/// An empty file beside [`DB_FILE`] while the disk is marked full ([`Db::mark_full`]).
const FULL_MARKER: &str = "leasehold.disk-full";

/// The least free space that clears a full-disk mark ([`Db::clear_full_if_room`]).
const ROOM_MIN: u64 = 8 << 20;

/// Opens (or creates) the database under `dir` and makes sure every table exists, so that
/// readers never meet a missing table. A database that has them all is only read here: a
/// restart on a full disk must not need the space a commit takes.
pub(crate) fn open(dir: &Path) -> Result<Arc<Db>, StorageError> {
    std::fs::create_dir_all(dir).map_err(|error| StorageError::CreateDir {
        dir: dir.to_path_buf(),
        error,
    })?;
    let path = dir.join(DB_FILE);
    let db = redb::Builder::new()
        .set_cache_size(CACHE_BYTES)
        .create(&path)
        .map_err(|e| StorageError::Open {
            path: path.clone(),
            error: e.into(),
        })?;
    if !tables_ready(&db)? {
        make_tables(&db)?;
    }
    let (closed, _) = tokio::sync::watch::channel(());
    let marked_full = path.with_file_name(FULL_MARKER).exists();
    if marked_full {
        tracing::warn!(
            "the disk was full when this member last ran: writes that add data get NOSPACE until \
             it has room again"
        );
    }
    Ok(Arc::new(Db {
        open: Arc::default(),
        db: RwLock::new(Some(db)),
        path,
        out_of_space: AtomicBool::new(marked_full),
        reopen_needed: AtomicBool::new(false),
        writing: Mutex::default(),
        staged_sm: Mutex::new(StagedSm::default()),
        durable_revision: std::sync::atomic::AtomicI64::new(0),
        checkpoint_bell: Arc::default(),
        removals: removals::Removals::default(),
        compaction_bell: Arc::default(),
        closed,
        telemetry: Arc::default(),
    }))
}

/// Whether every table exists and the format row says this build's format; an unknown format
/// is refused.
fn tables_ready(db: &Database) -> Result<bool, StorageError> {
    use redb::ReadableDatabase as _;
    let txn = db.begin_read().map_err(StorageError::read("the tables"))?;
    // A table that is missing is `None`; any other failure is an error.
    fn found<T>(opened: Result<T, redb::TableError>) -> Result<Option<T>, StorageError> {
        match opened {
            Ok(table) => Ok(Some(table)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(StorageError::read("the tables")(e)),
        }
    }
    let (Some(_), Some(_), Some(meta)) = (
        found(txn.open_table(KV))?,
        found(txn.open_table(LEASES))?,
        found(txn.open_table(SM_META))?,
    ) else {
        return Ok(false);
    };
    format_written(FORMAT.get(&meta)?)
}

/// Whether the format row (`found`) is written: it must be this build's format if it is.
fn format_written(found: Option<u32>) -> Result<bool, StorageError> {
    match found {
        None => Ok(false),
        Some(FORMAT_VERSION) => Ok(true),
        Some(found) => Err(StorageError::Format {
            found,
            supported: FORMAT_VERSION,
        }),
    }
}

/// Makes the tables and the format row that are missing.
fn make_tables(db: &Database) -> Result<(), StorageError> {
    let txn = db
        .begin_write()
        .map_err(StorageError::write("the tables"))?;
    {
        txn.open_table(KV)
            .map_err(StorageError::write("the tables"))?;
        txn.open_table(LEASES)
            .map_err(StorageError::write("the tables"))?;
        let mut meta = txn
            .open_table(SM_META)
            .map_err(StorageError::write("the tables"))?;
        if !format_written(FORMAT.get(&meta)?)? {
            FORMAT.put(&mut meta, &FORMAT_VERSION)?;
        }
    }
    txn.commit().map_err(StorageError::commit("the tables"))
}

#[cfg(test)]
mod bell_tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_checkpoint_bell_folds_rings_and_keeps_the_stop() {
        let bell = Arc::new(Bell::default());
        bell.ring(|r| r.staged = true);
        bell.ring(|r| r.staged = true);
        bell.ring(|r| r.snapshot = true);
        let rung = bell.wait();
        assert!(rung.staged && rung.snapshot && !rung.stop);
        // Taken: a window passes with nothing rung and no stop.
        assert!(!bell.stopped_within(Duration::from_millis(1)));
        // A sleeper is woken by a ring from another thread.
        let ringer = bell.clone();
        let thread = std::thread::spawn(move || ringer.ring(|r| r.staged = true));
        assert!(bell.wait().staged);
        thread.join().unwrap();
        // The stop wakes the window and stays rung.
        bell.ring(|r| r.stop = true);
        assert!(bell.stopped_within(Duration::from_secs(60)));
        assert!(bell.wait().stop);
        assert!(bell.wait().stop);
    }
}

#[cfg(test)]
mod open_tests {
    use super::*;

    /// A disk marked full stays marked across a restart, as etcd's NOSPACE alarm does, and the
    /// mark goes when a write gets through with room on the disk (then for good).
    #[test]
    fn a_full_disk_mark_outlives_a_restart_until_the_disk_has_room() {
        use leasehold_wal::Fs as _;
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path()).unwrap();
        assert!(!db.out_of_space());
        assert!(db.mark_full());
        assert!(!db.mark_full(), "marked once");
        drop(db);
        let db = open(dir.path()).unwrap();
        assert!(db.out_of_space(), "a restart keeps the mark");
        // The test's own disk has room: the next checkpoint (nothing staged) clears the mark.
        let free = leasehold_wal::StdFs
            .available(dir.path())
            .unwrap_or(u64::MAX);
        assert!(
            free >= 4 * ROOM_MIN,
            "the test needs {} MiB free",
            (4 * ROOM_MIN) >> 20
        );
        assert_eq!(db.checkpoint().unwrap(), None);
        assert!(!db.out_of_space());
        assert!(!dir.path().join(FULL_MARKER).exists());
        drop(db);
        assert!(!open(dir.path()).unwrap().out_of_space());
    }

    /// A member restarted on a full disk opens its database: that must not need a commit.
    #[test]
    fn a_database_that_has_its_tables_is_opened_without_a_write() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(DB_FILE);
        drop(open(dir.path()).unwrap());
        let made = std::fs::read(&file).unwrap();
        let db = open(dir.path()).unwrap();
        let opened = std::fs::read(&file).unwrap();
        // redb marks an open file in its header's flag byte (offset 9): a write in place, which
        // needs no space. Anything else written would be a commit.
        const REDB_FLAGS: usize = 9;
        let differ: Vec<usize> = (0..made.len().max(opened.len()))
            .filter(|&i| i != REDB_FLAGS && made.get(i) != opened.get(i))
            .collect();
        assert!(
            differ.is_empty(),
            "opening a database that has its tables changed its file ({} and {} bytes) at {:?}",
            made.len(),
            opened.len(),
            &differ[..differ.len().min(64)]
        );
        drop(db);
    }
}
