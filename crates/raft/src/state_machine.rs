//! The replicated state machine: applies committed commands to the MVCC store and the lease
//! table, and stages what they changed for persistence. This is the one place that composes the
//! two: a revoke deletes the lease's keys, and every KV change re-binds keys to leases. Applying
//! is deterministic; the only inputs are the state and the entry (lease time travels in it). The
//! exception is member-local: an applied Authenticate dates the simple token it registers with
//! this member's clock (`tokens.rs`), which no other member, file or snapshot sees.
//!
//! The state lock (`shared.state`) is never held across an `.await`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use leasehold_lease::{LeaseId, LeaseRecord, LeaseTable, Renewal};
use leasehold_mvcc::{Change, Record, Revision, Store};
use redb::{ReadableTable, ReadableTableMetadata};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tokio::sync::oneshot;

use crate::command::{
    Alarm, AlarmChange, AlarmMember, Applied, AuthWrite, Authenticate, Command, MemberAttrs,
    Proposal,
};
use crate::position::{LogPosition, Members};
use crate::storage::{Db, KV, LEASES, SmMeta, StorageError, decode, write_sm};
use crate::tokens::SimpleTokens;
use leasehold_auth::{Access, AuthChange, AuthError, AuthState, Caller};

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
        lease_clock_ms: u64,
        leases: Vec<(LeaseId, LeaseRecord)>,
        last_applied: Option<LogPosition>,
        membership: Members,
    ) -> SmState {
        let mut table = LeaseTable::restore(lease_clock_ms, leases);
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
    #[cfg(test)]
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

/// Whether the auth store lets `caller` (`None`: no token) make a client command, as etcd checks
/// at apply: a put needs write on its key (and on every key of the lease it attaches the key to),
/// read too with `prev_kv`; a delete write on its range; a txn read on every compare and what each
/// op of both branches needs (nested ones too); a lease revoke write on every key of the lease.
/// Anything else (compaction, grants, renewals, the leader's own commands) is not checked.
fn check_command(state: &SmState, caller: Option<&Caller>, cmd: &Command) -> Result<(), AuthError> {
    if !state.auth.enabled {
        return Ok(());
    }
    let check = Check { state, caller };
    match cmd {
        Command::Put(p) => check.put(p),
        Command::DeleteRange(d) => check.delete(d),
        Command::Txn(t) => check.txn(t),
        Command::LeaseRevoke { id } => check.lease_keys(*id),
        _ => Ok(()),
    }
}

/// One caller's permission checks against the applied state (see [`check_command`]).
struct Check<'s> {
    state: &'s SmState,
    caller: Option<&'s Caller>,
}

impl Check<'_> {
    fn key(&self, key: &[u8], range_end: &[u8], access: Access) -> Result<(), AuthError> {
        self.state
            .auth
            .check_key(self.caller, key, range_end, access)
    }

    fn lease_keys(&self, id: LeaseId) -> Result<(), AuthError> {
        if let Some(lease) = self.state.leases.view(id) {
            for k in lease.keys() {
                self.key(k, b"", Access::Write)?;
            }
        }
        Ok(())
    }

    fn put(&self, p: &leasehold_mvcc::PutRequest) -> Result<(), AuthError> {
        self.key(&p.key, b"", Access::Write)?;
        if let Some(lease) = p.lease {
            self.lease_keys(lease)?;
        }
        if p.prev_kv {
            self.key(&p.key, b"", Access::Read)?;
        }
        Ok(())
    }

    fn delete(&self, d: &leasehold_mvcc::DeleteRangeRequest) -> Result<(), AuthError> {
        self.key(&d.key, &d.range_end, Access::Write)?;
        if d.prev_kv {
            self.key(&d.key, &d.range_end, Access::Read)?;
        }
        Ok(())
    }

    fn txn(&self, t: &leasehold_mvcc::TxnRequest) -> Result<(), AuthError> {
        use leasehold_mvcc::RequestOp;
        for c in &t.compare {
            self.key(&c.key, &c.range_end, Access::Read)?;
        }
        for op in t.success.iter().chain(&t.failure) {
            match op {
                RequestOp::Range(r) => self.key(&r.key, &r.range_end, Access::Read)?,
                RequestOp::Put(p) => self.put(p)?,
                RequestOp::DeleteRange(d) => self.delete(d)?,
                RequestOp::Txn(nested) => self.txn(nested)?,
            }
        }
        Ok(())
    }
}

fn by_id(attrs: Vec<MemberAttrs>) -> BTreeMap<u64, MemberAttrs> {
    attrs.into_iter().map(|a| (a.id, a)).collect()
}

fn state_membership_has(membership: &Members, id: u64) -> bool {
    membership.contains_key(&id)
}

/// Raises or clears an alarm; what etcd's alarm store answers (the alarm raised, or already
/// raised; the one cleared, `None` if it was not raised).
fn apply_alarm(alarms: &mut BTreeSet<AlarmMember>, change: AlarmChange) -> Option<AlarmMember> {
    if change.activate {
        alarms.insert(change.alarm);
        Some(change.alarm)
    } else {
        alarms.remove(&change.alarm).then_some(change.alarm)
    }
}

/// The state, plus signals for those who follow it.
#[derive(Debug)]
pub(crate) struct SharedState {
    pub(crate) state: RwLock<SmState>,
    /// Notified after every apply that touched a lease: the earliest deadline may have moved.
    pub(crate) leases_changed: tokio::sync::Notify,
    /// The store revision after the latest apply: what watchers wait on.
    pub(crate) revision: tokio::sync::watch::Sender<i64>,
    /// The replicated lease time after the latest apply that moved it, and when (on this
    /// process's monotonic clock) that apply happened. A member that becomes leader counts the
    /// time since then as lease time that has passed (a lower bound of what passed since the
    /// old leader stamped it), so an election does not stop the lease clock.
    pub(crate) lease_time_applied: std::sync::Mutex<Option<(u64, std::time::Instant)>>,
    /// Who waits for which key to be deleted.
    pub(crate) key_deletes: KeyDeletes,
    /// Whether auth is enabled in the applied state, readable without the state lock: while it
    /// is off (the usual case) a request needs no look at the auth store at all.
    pub(crate) auth_enabled: AtomicBool,
    /// Which alarm types are raised for some member ([`RAISED_NO_SPACE`], [`RAISED_CORRUPT`]),
    /// readable without the state lock, so that admitting a write takes no lock.
    pub(crate) alarms_raised: std::sync::atomic::AtomicU8,
}

pub(crate) const RAISED_NO_SPACE: u8 = 1;
pub(crate) const RAISED_CORRUPT: u8 = 2;

impl SmState {
    /// The [`SharedState::alarms_raised`] bits of this state.
    fn alarms_raised(&self) -> u8 {
        self.alarms.iter().fold(0, |bits, a| {
            bits | match a.alarm {
                Alarm::NoSpace => RAISED_NO_SPACE,
                Alarm::Corrupt => RAISED_CORRUPT,
            }
        })
    }

    /// Publishes what requests read without the state lock.
    fn publish_flags(&self, shared: &SharedState) {
        shared
            .auth_enabled
            .store(self.auth.enabled, Ordering::SeqCst);
        shared
            .alarms_raised
            .store(self.alarms_raised(), Ordering::SeqCst);
    }
}

/// Waiters for the deletion of one key each, woken by the apply that deletes it (writes a
/// tombstone) or by a snapshot install (which replaces every key at once), and by nothing else.
/// This is what a lock queue waits on: a release wakes the one waiter queued behind the released
/// key, not everyone who waits on the store. Entries are removed when fired or when their waiter
/// gives up ([`KeyDeleteWaiter`]'s drop), so the map holds no more than the waiters that exist.
///
/// Lock order: taken after `state` is released (apply fires once the store shows the delete).
#[derive(Debug, Default)]
pub(crate) struct KeyDeletes {
    waiters: Mutex<HashMap<Vec<u8>, Vec<KeyDeleteSlot>>>,
    next_id: AtomicU64,
    /// Set by [`KeyDeletes::close`]: every waiter, present and future, is told the replica
    /// stopped.
    closed: AtomicBool,
}

impl KeyDeletes {
    fn register(&self, key: &[u8]) -> (u64, oneshot::Receiver<()>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut waiters = self.waiters.lock().expect("key deletes lock poisoned");
        // Checked under the lock that `close` empties the map under, so a registration is
        // either emptied by `close` or sees the flag: no waiter outlives the close.
        if !self.closed.load(Ordering::SeqCst) {
            waiters.entry(key.to_vec()).or_default().push((id, tx));
        }
        (id, rx)
    }

    fn unregister(&self, key: &[u8], id: u64) {
        let mut waiters = self.waiters.lock().expect("key deletes lock poisoned");
        if let Some(list) = waiters.get_mut(key) {
            list.retain(|(other, _)| *other != id);
            if list.is_empty() {
                waiters.remove(key);
            }
        }
    }

    /// Wakes whoever waits for one of `keys` (keys just deleted).
    fn deleted<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) {
        let mut waiters = self.waiters.lock().expect("key deletes lock poisoned");
        if waiters.is_empty() {
            return;
        }
        for key in keys {
            for (_, tx) in waiters.remove(key).into_iter().flatten() {
                let _ = tx.send(());
            }
        }
    }

    /// Ends every wait, present and future, with "stopped" (the sender is dropped, not fired):
    /// the member is shutting down or its Raft core failed, and a lock waiter must not hold up
    /// the drain of client requests forever.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let waiters = std::mem::take(&mut *self.waiters.lock().expect("key deletes lock poisoned"));
        drop(waiters);
    }

    /// Wakes every waiter: the whole store was replaced (they look again).
    fn replaced(&self) {
        let waiters = std::mem::take(&mut *self.waiters.lock().expect("key deletes lock poisoned"));
        for (_, tx) in waiters.into_values().flatten() {
            let _ = tx.send(());
        }
    }
}

/// One waiter's registration: its id and how to wake it.
type KeyDeleteSlot = (u64, oneshot::Sender<()>);

/// One registration in [`KeyDeletes`]; removes itself when dropped (a waiter that gives up).
pub(crate) struct KeyDeleteWaiter {
    shared: Shared,
    key: Vec<u8>,
    id: u64,
    fired: oneshot::Receiver<()>,
}

impl KeyDeleteWaiter {
    /// Registers for the next delete of `key`. Register before looking at the store, so that a
    /// delete applied after the look is never missed.
    pub(crate) fn register(shared: &Shared, key: &[u8]) -> KeyDeleteWaiter {
        let (id, fired) = shared.key_deletes.register(key);
        KeyDeleteWaiter {
            shared: shared.clone(),
            key: key.to_vec(),
            id,
            fired,
        }
    }

    /// Completes when the key is deleted (or the store replaced); `false` if the state machine
    /// is gone first.
    pub(crate) async fn fired(&mut self) -> bool {
        (&mut self.fired).await.is_ok()
    }
}

impl Drop for KeyDeleteWaiter {
    fn drop(&mut self) {
        self.shared.key_deletes.unregister(&self.key, self.id);
    }
}

impl SharedState {
    fn new(state: SmState) -> SharedState {
        let (revision, _) = tokio::sync::watch::channel(state.store.current_revision());
        let auth_enabled = AtomicBool::new(state.auth.enabled);
        let alarms_raised = std::sync::atomic::AtomicU8::new(state.alarms_raised());
        SharedState {
            auth_enabled,
            alarms_raised,
            state: RwLock::new(state),
            leases_changed: tokio::sync::Notify::new(),
            revision,
            lease_time_applied: std::sync::Mutex::new(None),
            key_deletes: KeyDeletes::default(),
        }
    }

    /// Records that the replicated lease time is `clock_ms` as of `at` (when the entry that
    /// set it reached this member), if that moved it.
    fn note_lease_time(&self, clock_ms: u64, at: std::time::Instant) {
        let mut seen = self
            .lease_time_applied
            .lock()
            .expect("lease time lock poisoned");
        if seen.is_none_or(|(ms, _)| clock_ms > ms) {
            *seen = Some((clock_ms, at));
        }
    }

    /// Publishes the store revision (after an apply or a snapshot install).
    fn publish_revision(&self, revision: i64) {
        self.revision.send_if_modified(|r| {
            let changed = *r != revision;
            *r = revision;
            changed
        });
    }
}

pub(crate) type Shared = Arc<SharedState>;

/// What a snapshot carries: the whole state machine.
#[derive(Serialize, Deserialize)]
struct SnapshotPayload {
    last_applied: Option<LogPosition>,
    membership: Members,
    current_revision: i64,
    compact_revision: i64,
    records: Vec<(Revision, Record)>,
    lease_clock_ms: u64,
    leases: Vec<(LeaseId, LeaseRecord)>,
    alarms: Vec<AlarmMember>,
    member_attrs: Vec<MemberAttrs>,
    auth: AuthState,
}

/// The state machine as loaded from the file: the shared state the replica applies to.
pub struct StateMachine {
    shared: Shared,
}

impl StateMachine {
    /// Loads the persisted state machine (an empty one on a new database).
    pub(crate) fn open(db: Arc<Db>) -> Result<StateMachine, StorageError> {
        let started = std::time::Instant::now();
        let persisted = SnapshotPayload::read(&db)?;
        let read_ms = started.elapsed().as_millis();
        let store = Store::restore(
            persisted.current_revision,
            persisted.compact_revision,
            persisted.records,
        );
        let mut state = SmState::assemble(
            store,
            persisted.lease_clock_ms,
            persisted.leases,
            persisted.last_applied,
            persisted.membership,
        );
        state.alarms = persisted.alarms.into_iter().collect();
        state.member_attrs = by_id(persisted.member_attrs);
        state.auth = persisted.auth;
        tracing::info!(
            keys = state.store.key_history_len(),
            leases = state.leases.len(),
            revision = state.store.current_revision(),
            read_ms,
            total_ms = started.elapsed().as_millis(),
            "loaded the state machine"
        );
        Ok(StateMachine {
            shared: Arc::new(SharedState::new(state)),
        })
    }

    pub(crate) fn shared(&self) -> Shared {
        self.shared.clone()
    }
}

pub(crate) fn lease_id_of_row(key: [u8; 8]) -> Result<LeaseId, StorageError> {
    LeaseId::from_wire(u64::from_be_bytes(key) as i64).ok_or(StorageError::Corrupt {
        what: "leases",
        problem: "lease id 0",
    })
}

impl SnapshotPayload {
    /// The state machine as the file holds it (an empty one on a new database).
    fn read(db: &Db) -> Result<SnapshotPayload, StorageError> {
        let txn = db.begin_read().map_err(StorageError::read("sm_meta"))?;
        let meta = SmMeta::read(&txn)?;
        let table = txn.open_table(KV).map_err(StorageError::read("kv"))?;
        let mut records = Vec::new();
        for row in table.iter().map_err(StorageError::read("kv"))? {
            let (k, v) = row.map_err(StorageError::read("kv"))?;
            records.push((
                Revision::from_bytes(k.value()),
                decode::<Record>("kv", v.value())?,
            ));
        }
        let lease_rows = txn
            .open_table(LEASES)
            .map_err(StorageError::read("leases"))?;
        let mut leases = Vec::new();
        for row in lease_rows.iter().map_err(StorageError::read("leases"))? {
            let (k, v) = row.map_err(StorageError::read("leases"))?;
            leases.push((
                lease_id_of_row(k.value())?,
                decode::<LeaseRecord>("leases", v.value())?,
            ));
        }
        Ok(SnapshotPayload {
            last_applied: meta.last_applied,
            membership: meta.membership,
            current_revision: meta.current_revision,
            compact_revision: meta.compact_revision,
            records,
            lease_clock_ms: meta.lease_clock_ms,
            leases,
            alarms: meta.alarms,
            member_attrs: meta.member_attrs,
            auth: meta.auth,
        })
    }

    /// The file's state encoded exactly as postcard encodes the [`SnapshotPayload`] that
    /// [`SnapshotPayload::read`] would return (what `install_snapshot` decodes), but streamed
    /// from the rows: a stored `Record` or `LeaseRecord` is already that encoding, so it is
    /// copied, not decoded and encoded again.
    fn encode_from_file(db: &Db) -> Result<(SmMeta, Vec<u8>), StorageError> {
        const WHAT: &str = "a snapshot";
        fn put<T: Serialize>(out: Vec<u8>, value: &T) -> Vec<u8> {
            postcard::to_extend(value, out).expect("in-memory serialization cannot fail")
        }
        let txn = db.begin_read().map_err(StorageError::read(WHAT))?;
        let meta = SmMeta::read(&txn)?;
        let kv = txn.open_table(KV).map_err(StorageError::read("kv"))?;
        let leases = txn
            .open_table(LEASES)
            .map_err(StorageError::read("leases"))?;
        let mut out = put(Vec::new(), &meta.last_applied);
        out = put(out, &meta.membership);
        out = put(out, &meta.current_revision);
        out = put(out, &meta.compact_revision);
        // A sequence is its length, then its elements.
        out = put(out, &kv.len().map_err(StorageError::read("kv"))?);
        for row in kv.iter().map_err(StorageError::read("kv"))? {
            let (k, v) = row.map_err(StorageError::read("kv"))?;
            out = put(out, &Revision::from_bytes(k.value()));
            out.extend_from_slice(v.value());
        }
        out = put(out, &meta.lease_clock_ms);
        out = put(out, &leases.len().map_err(StorageError::read("leases"))?);
        for row in leases.iter().map_err(StorageError::read("leases"))? {
            let (k, v) = row.map_err(StorageError::read("leases"))?;
            out = put(out, &lease_id_of_row(k.value())?);
            out.extend_from_slice(v.value());
        }
        out = put(out, &meta.alarms);
        out = put(out, &meta.member_attrs);
        out = put(out, &meta.auth);
        Ok((meta, out))
    }
}

/// What one apply batch changed, to stage for persistence.
#[derive(Default)]
struct Effects {
    changes: Vec<Change>,
    leases_touched: BTreeSet<LeaseId>,
}

impl Effects {
    /// Records KV changes and keeps key bindings in step with them.
    fn kv(&mut self, store: &Store, leases: &mut LeaseTable, changes: Vec<Change>) {
        rebind(store, leases, &changes);
        self.changes.extend(changes);
    }

    /// Deletes a revoked lease's keys, all at one new revision; returns the header revision.
    fn revoked(&mut self, state: &mut SmState, id: LeaseId, keys: &[leasehold_mvcc::Key]) -> i64 {
        self.leases_touched.insert(id);
        let (revision, changes) = state.store.delete_keys(keys.iter().map(|k| &**k));
        self.kv(&state.store, &mut state.leases, changes);
        // Grants bound to the lease go in the same command (leasehold's extension).
        state.auth.end_lease(id.get());
        revision
    }
}

/// Keeps the key bindings in step with KV changes just made to `store`: a write moves its key
/// from the lease its previous version named (the store says which) to the one it names, if any
/// (a delete names none). The one place where KV writes change bindings.
pub fn rebind(store: &Store, leases: &mut LeaseTable, changes: &[Change]) {
    for change in changes {
        if let Change::Write { rev, record } = change {
            let key = record.key();
            let now = match record {
                Record::Put(kv) => kv.lease,
                Record::Tombstone { .. } => None,
            };
            if let Some(before) = store.lease_before(key, *rev)
                && Some(before) != now
            {
                leases.detach(key, before);
            }
            if let Some(now) = now {
                let shared = store.shared_key(key).expect("a written key has a history");
                leases.attach(shared, now);
            }
        }
    }
}

/// Applies one command to the state: a client command only if the auth store allows its caller
/// (see [`check_command`]).
fn apply_command(state: &mut SmState, cmd: &Command, fx: &mut Effects) -> Applied {
    let (caller, cmd) = match cmd {
        Command::As { caller, command } => (Some(caller), &**command),
        other => (None, other),
    };
    if let Err(e) = check_command(state, caller, cmd) {
        return Applied::Denied(e);
    }
    let SmState {
        store,
        leases,
        alarms,
        member_attrs,
        membership,
        auth,
        tokens,
        last_applied,
    } = state;
    let lease_exists = |id: LeaseId| leases.contains(id);
    match cmd {
        Command::Put(req) => Applied::Put(store.put(req, &lease_exists).map(|(resp, c)| {
            fx.kv(store, leases, c);
            resp
        })),
        Command::DeleteRange(req) => {
            let (resp, c) = store.delete_range(req);
            fx.kv(store, leases, c);
            Applied::DeleteRange(resp)
        }
        Command::Txn(req) => Applied::Txn(store.txn(req, &lease_exists).map(|(resp, c)| {
            fx.kv(store, leases, c);
            resp
        })),
        Command::Compact { revision } => {
            Applied::Compact(store.compact(*revision).map(|(rev, c)| {
                fx.changes.extend(c);
                // The history just dropped should leave the process, not only the store.
                leasehold_alloc::release_soon();
                rev
            }))
        }
        Command::LeaseGrant {
            id,
            ttl_secs,
            now_ms,
        } => {
            let result = leases.grant(*id, *ttl_secs, *now_ms).map(|_| ());
            fx.leases_touched.insert(*id);
            Applied::LeaseGrant(result)
        }
        Command::LeaseRevoke { id } => match leases.revoke(*id) {
            Ok(keys) => Applied::LeaseRevoke(Ok(fx.revoked(state, *id, &keys))),
            Err(e) => Applied::LeaseRevoke(Err(e)),
        },
        Command::LeaseRenew { id, now_ms } => match leases.renew(*id, *now_ms) {
            Renewal::Renewed { ttl_secs } => {
                fx.leases_touched.insert(*id);
                Applied::LeaseRenew(Some(ttl_secs))
            }
            Renewal::NotFound => Applied::LeaseRenew(None),
            Renewal::Expired => {
                // Too late to renew: revoke it now, so the answer (TTL 0) follows the revoke.
                if let Some(keys) = leases.expire(*id, *now_ms) {
                    fx.revoked(state, *id, &keys);
                }
                Applied::LeaseRenew(None)
            }
        },
        Command::LeaseExpire { ids, now_ms } => {
            let mut revoked = 0;
            for id in ids {
                if let Some(keys) = state.leases.expire(*id, *now_ms) {
                    fx.revoked(state, *id, &keys);
                    revoked += 1;
                }
            }
            Applied::LeaseExpire(revoked)
        }
        Command::LeaseTick { now_ms } => {
            leases.advance(*now_ms);
            Applied::LeaseTick
        }
        Command::LeasePromote { now_ms, extend_ms } => {
            // Only the leases whose deadline moved are written again: rewriting a million
            // unchanged rows stalled every write (and a stop) for 2 s after each promotion.
            fx.leases_touched
                .extend(leases.extend_all(*now_ms, *extend_ms));
            Applied::LeasePromote
        }
        Command::Alarm(change) => Applied::Alarm(apply_alarm(alarms, *change)),
        Command::Auth(AuthWrite { caller, change }) => {
            let applied = match change {
                AuthChange::RoleGrantPermission {
                    perm:
                        leasehold_auth::Permission {
                            lease: Some(lease), ..
                        },
                    ..
                } if !LeaseId::from_wire(*lease).is_some_and(|id| leases.contains(id)) => {
                    Err(AuthError::LeaseNotFound)
                }
                _ => auth.apply(caller.as_ref(), change),
            };
            if applied.is_ok() {
                if let Some(user) = change.ends_tokens_of() {
                    tokens.end_user(user);
                }
                if !auth.enabled {
                    tokens.end_all();
                }
            }
            Applied::Auth(applied)
        }
        Command::Authenticate(Authenticate {
            user,
            prefix,
            revision,
        }) => Applied::Authenticate(if !auth.enabled {
            Err(AuthError::AuthNotEnabled)
        } else if *revision != auth.revision || !auth.users.contains_key(user) {
            // The password was checked against an auth store that has changed since.
            Err(AuthError::AuthFailed)
        } else {
            let index = last_applied.map_or(0, |l| l.index);
            let token = format!("{prefix}.{index}");
            tokens.register(token.clone(), user.clone(), std::time::Instant::now());
            Ok(token)
        }),
        // A command on behalf of a user on behalf of a user: never proposed.
        Command::As { .. } => Applied::Denied(AuthError::PermissionDenied),
        Command::Publish(attrs) => {
            // Only a member of the membership (a removed one may still publish late).
            if state_membership_has(membership, attrs.id) {
                member_attrs.insert(attrs.id, attrs.clone());
            }
            Applied::Publish(())
        }
    }
}

/// A committed entry as [`apply_entries`] takes it.
pub(crate) enum Applying {
    /// A new leader's first entry.
    Blank,
    /// A new membership (its members' attributes are kept, the others' dropped).
    Membership(Members),
    Normal(Proposal),
}

/// Applies committed entries, in order, to the state machine: one reply per entry (one
/// `Applied` per command). The changes are staged (`Db::stage_sm`), not written: the log holds
/// the entries durably, and the staged rows reach the file with the next checkpoint. `dated`
/// tells when an entry reached this member, if known, which dates the replicated lease time it
/// carries (now, if not).
pub(crate) fn apply_entries(
    shared: &Shared,
    db: &Db,
    entries: impl IntoIterator<Item = (LogPosition, Applying)>,
    mut dated: impl FnMut(u64) -> Option<std::time::Instant>,
) -> Vec<Vec<Applied>> {
    let mut replies = Vec::new();
    let mut fx = Effects::default();
    let (meta, lease_rows, lease_clock_ms, clock_moved_at) = {
        let mut guard = shared.state.write().expect("state lock poisoned");
        let state = &mut *guard;
        // The last entry that moved the lease clock.
        let mut clock_moved_at = None;
        for (position, payload) in entries {
            let clock_before = state.leases.clock_ms();
            state.last_applied = Some(position);
            let reply = match payload {
                Applying::Blank => Vec::new(),
                Applying::Membership(m) => {
                    // A removed member's attributes go with it.
                    state.member_attrs.retain(|id, _| m.contains_key(id));
                    state.membership = m;
                    Vec::new()
                }
                Applying::Normal(Proposal { commands }) => commands
                    .iter()
                    .map(|cmd| apply_command(state, cmd, &mut fx))
                    .collect(),
            };
            replies.push(reply);
            if state.leases.clock_ms() > clock_before {
                clock_moved_at = Some(position.index);
            }
        }
        if cfg!(debug_assertions) && !fx.leases_touched.is_empty() {
            state.leases.validate();
        }
        state.publish_flags(shared);
        let lease_rows: Vec<(LeaseId, Option<LeaseRecord>)> = fx
            .leases_touched
            .iter()
            .map(|id| (*id, state.leases.record(*id)))
            .collect();
        (
            state.meta(),
            lease_rows,
            state.leases.clock_ms(),
            clock_moved_at,
        )
    };
    let dated = clock_moved_at
        .and_then(&mut dated)
        .unwrap_or_else(std::time::Instant::now);
    shared.note_lease_time(lease_clock_ms, dated);
    if !lease_rows.is_empty() {
        shared.leases_changed.notify_one();
    }
    shared.publish_revision(meta.current_revision);
    shared
        .key_deletes
        .deleted(fx.changes.iter().filter_map(|change| match change {
            Change::Write {
                record: Record::Tombstone { key },
                ..
            } => Some(key.as_slice()),
            Change::Write { .. } | Change::Remove { .. } => None,
        }));
    db.stage_sm(fx.changes, lease_rows, meta);
    replies
}

/// Where a state is: its applied log position and membership.
pub(crate) type AppliedAt = (Option<LogPosition>, Members);

/// Replaces the state machine with a leader's snapshot (`bytes`, as [`snapshot_bytes_from_file`]
/// makes them) at `at` (the applied log id and membership; `None`: the ones the bytes hold),
/// durably: the file first, then the applied state. Blocking.
pub(crate) fn install_snapshot_bytes(
    shared: &Shared,
    db: &Db,
    bytes: &[u8],
    at: Option<AppliedAt>,
) -> Result<(), StorageError> {
    const WHAT: &str = "a snapshot";
    let payload: SnapshotPayload = decode(WHAT, bytes)?;
    let (last_applied, membership) =
        at.unwrap_or_else(|| (payload.last_applied, payload.membership.clone()));
    tracing::info!(
        last_applied = ?last_applied,
        bytes = bytes.len(),
        revision = payload.current_revision,
        "installing a snapshot from the leader"
    );
    let store = Store::restore(
        payload.current_revision,
        payload.compact_revision,
        payload.records.clone(),
    );
    let mut state = SmState::assemble(
        store,
        payload.lease_clock_ms,
        payload.leases.clone(),
        last_applied,
        membership,
    );
    state.alarms = payload.alarms.iter().copied().collect();
    state.member_attrs = by_id(payload.member_attrs.clone());
    state.auth = payload.auth.clone();
    let row = state.meta();
    // Staged changes predate the snapshot and must never be written over it.
    db.discard_staged_sm();
    let changes: Vec<Change> = payload
        .records
        .into_iter()
        .map(|(rev, record)| Change::Write { rev, record })
        .collect();
    let leases: BTreeMap<LeaseId, Option<LeaseRecord>> = payload
        .leases
        .into_iter()
        .map(|(id, r)| (id, Some(r)))
        .collect();
    let txn = db.begin_write().map_err(StorageError::write(WHAT))?;
    {
        let mut kv = txn.open_table(KV).map_err(StorageError::write(WHAT))?;
        kv.retain(|_, _| false).map_err(StorageError::write(WHAT))?;
        let mut lease_table = txn.open_table(LEASES).map_err(StorageError::write(WHAT))?;
        lease_table
            .retain(|_, _| false)
            .map_err(StorageError::write(WHAT))?;
    }
    write_sm(&txn, &changes, &leases, &row)?;
    let started = std::time::Instant::now();
    txn.commit().map_err(StorageError::commit(WHAT))?;
    db.telemetry().state_commit.observe(started.elapsed());
    let revision = state.store.current_revision();
    {
        let mut current = shared.state.write().expect("state lock poisoned");
        // Tokens are this member's, not the snapshot's: they stay.
        state.tokens = std::mem::take(&mut current.tokens);
        *current = state;
        current.publish_flags(shared);
    }
    // The state it replaced is freed; give its memory back to the OS.
    leasehold_alloc::release_soon();
    shared.leases_changed.notify_one();
    shared.publish_revision(revision);
    shared.key_deletes.replaced();
    Ok(())
}

/// The state machine as its file holds it, as a snapshot's bytes, with the metadata they are
/// at: the staged changes are written first (durably), so nothing applied is missing. Blocking.
pub(crate) fn snapshot_bytes_from_file(db: &Db) -> Result<(SmMeta, Vec<u8>), StorageError> {
    db.flush_staged_sm()?;
    SnapshotPayload::encode_from_file(db)
}

/// Reads run against the applied state under the read lock.
pub(crate) fn read<T>(shared: &Shared, f: impl FnOnce(&Store) -> T) -> T {
    let state = shared.state.read().expect("state lock poisoned");
    f(&state.store)
}

/// The replicated lease time, advanced by the time this process has seen pass since that value
/// was applied here (zero after a restart: nothing is known about the downtime).
pub(crate) fn lease_time_now(shared: &Shared) -> u64 {
    let replicated = read_leases(shared, |t| t.clock_ms());
    let seen = *shared
        .lease_time_applied
        .lock()
        .expect("lease time lock poisoned");
    match seen {
        Some((ms, at)) if ms == replicated => {
            let passed = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
            replicated.saturating_add(passed)
        }
        _ => replicated,
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
