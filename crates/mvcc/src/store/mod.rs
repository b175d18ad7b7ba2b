//! The multi-version store: every key keeps its versions ordered by revision, so any revision at
//! or above the compaction point can be read. Writes go through a [`Writer`], which gives every
//! change of one request the same main revision and pre-checks the request, so that a request
//! either applies whole or not at all.
//!
//! Invariants (checked by [`Store::validate`]):
//! - `compact_revision <= current_revision`;
//! - every key's history is non-empty, strictly ordered by revision, never above the current
//!   revision, and never starts with a tombstone;
//! - within a generation (the versions between creation and deletion) `version` counts up from 1
//!   and `create_revision` is the main revision of the generation's first put;
//! - `releasable_bytes` counts the values of [`RELEASE_MIN`] bytes or more still held, each named
//!   once in `releasable`.

mod hashes;
mod scan;

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;
use leasehold_types::Key;

pub use hashes::{CompactionHash, hash_in_background};
pub use scan::{EventsFilter, EventsScan, RangeScan, ScanBudget};

use crate::error::Error;
use crate::hash::KvHash;
use crate::types::{
    Change, Compare, CompareResult, CompareTarget, DeleteRangeRequest, DeleteRangeResponse, Event,
    EventKind, KeyValue, LeaseId, PutRequest, PutResponse, RangeRequest, RangeResponse, Record,
    RequestOp, ResponseOp, Revision, SortTarget, TxnRequest, TxnResponse,
};
use crate::values::{NothingReleased, ReadBack, ValueSource};

/// One entry of a key's history: a value, or a tombstone (`version == 0`). The key is not
/// repeated here; it is the key map's.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Version {
    rev: Revision,
    create_revision: i64,
    /// 1 and up within a generation; 0 for a tombstone.
    version: i64,
    /// Shared with every answer and event that carries it: a read takes a reference, not a copy.
    /// `None` for a tombstone, and for a value the store released ([`Store::release_values`]),
    /// which is read back from the store's [`ValueSource`].
    value: Option<Bytes>,
    lease: Option<LeaseId>,
}

// The sizes `Store`'s documentation states per key (on 64-bit targets).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<Version>() == 72);
    assert!(size_of::<History>() == 80);
    assert!(size_of::<(Revision, Key)>() == 32);
};

/// Values shorter than this are copied rather than shared ([`share`]).
const SHARED_VALUE_MIN: usize = 64;

/// Values shorter than this are never released: reading one back would cost more than the few
/// bytes it holds.
pub const RELEASE_MIN: usize = 128;

/// `value` for an answer, an event or another version. A long value is shared (a reference
/// count). A short one is copied: the first share of a value allocates its count's header
/// (about 32 bytes), which then lives as long as the value does, so sharing a 16-byte value once
/// would cost a key more than copying it each time.
fn share(value: &Bytes) -> Bytes {
    if value.len() < SHARED_VALUE_MIN {
        Bytes::copy_from_slice(value)
    } else {
        value.clone()
    }
}

impl Version {
    /// The tombstone a delete at `rev` leaves.
    fn tombstone(rev: Revision) -> Version {
        Version {
            rev,
            create_revision: 0,
            version: 0,
            value: None,
            lease: None,
        }
    }

    fn is_live(&self) -> bool {
        self.version != 0
    }

    /// A live version whose value the store let go of ([`Store::release_values`]).
    fn is_released(&self) -> bool {
        self.value.is_none() && self.is_live()
    }

    /// Bytes this version's value holds in memory that [`Store::release_values`] may let go of.
    fn releasable_bytes(&self) -> usize {
        self.value
            .as_ref()
            .map_or(0, |v| if v.len() >= RELEASE_MIN { v.len() } else { 0 })
    }
}

/// A key's versions, oldest first, never empty. Most keys have one version (no history kept, or
/// compacted), so that one is held without a vector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum History {
    One(Version),
    Many(Vec<Version>),
}

impl History {
    fn as_slice(&self) -> &[Version] {
        match self {
            History::One(v) => std::slice::from_ref(v),
            History::Many(vs) => vs,
        }
    }

    fn latest(&self) -> &Version {
        match self {
            History::One(v) => v,
            History::Many(vs) => vs.last().expect("a history is never empty"),
        }
    }

    fn push(&mut self, version: Version) {
        match self {
            History::Many(vs) => vs.push(version),
            History::One(_) => {
                let History::One(first) = std::mem::replace(self, History::Many(Vec::new())) else {
                    unreachable!("matched above")
                };
                *self = History::Many(vec![first, version]);
            }
        }
    }

    /// Removes the `n` oldest versions, calling `removed` with each; `false` if nothing is left.
    /// What remains is held as compactly as a fresh history.
    fn drop_oldest(&mut self, n: usize, mut removed: impl FnMut(&Version)) -> bool {
        if n == 0 {
            return true;
        }
        match self {
            History::One(v) => {
                removed(v);
                false
            }
            History::Many(vs) => {
                for v in vs.drain(..n) {
                    removed(&v);
                }
                match vs.len() {
                    0 => false,
                    1 => {
                        *self = History::One(vs.pop().expect("one left"));
                        true
                    }
                    len => {
                        if vs.capacity() > 2 * len {
                            vs.shrink_to_fit();
                        }
                        true
                    }
                }
            }
        }
    }
}

/// A version read in place, with its key: what reads filter, sort and compare before copying
/// only what they return.
#[derive(Clone, Copy, Debug)]
struct Found<'s> {
    key: &'s [u8],
    version: &'s Version,
}

impl<'s> Found<'s> {
    /// The version as an answer carries it, its value read back from `values` if it was released.
    fn to_kv(self, with_value: bool, values: &mut ReadBack<'_>) -> Result<KeyValue, Error> {
        let v = self.version;
        Ok(KeyValue {
            key: self.key.to_vec(),
            create_revision: v.create_revision,
            mod_revision: v.rev.main,
            version: v.version,
            value: if with_value {
                value_of(v, values)?
            } else {
                Bytes::new()
            },
            lease: v.lease,
        })
    }

    /// The value, read back from `values` if it was released.
    fn value(self, values: &mut ReadBack<'_>) -> Result<Bytes, Error> {
        value_of(self.version, values)
    }
}

/// `version`'s value for an answer: shared (or copied, [`share`]) when held, read back from
/// `values` when released; empty for a tombstone.
fn value_of(version: &Version, values: &mut ReadBack<'_>) -> Result<Bytes, Error> {
    match &version.value {
        Some(value) => Ok(share(value)),
        None if version.is_released() => values.read(version.rev),
        None => Ok(Bytes::new()),
    }
}

/// The whole key space with its history. Pure in-memory state: persistence is the caller's, fed
/// by the [`Change`]s each write returns.
///
/// What a key costs: one key map entry (the shared key and a boxed [`History`]), the key's bytes
/// once (a [`Key`], shared with the revision index and with the lease the key is attached to),
/// and per version 72 bytes plus its value. Each version at or above the compaction point also has a
/// revision index entry (32 bytes). A value of [`RELEASE_MIN`] bytes or more is held (with a
/// 32-byte queue entry) only until [`Store::release_values`] lets it go.
#[derive(Clone, Debug)]
pub struct Store {
    keys: BTreeMap<Key, Box<History>>,
    /// Every version at or above the compaction point, by revision, oldest first: the index that
    /// replays history (watch) in order. Writes only append (revisions only grow), and
    /// compaction only removes from the front, so a queue is enough.
    by_revision: VecDeque<(Revision, Key)>,
    current_revision: i64,
    /// `-1` until the first compaction, as in etcd.
    compact_revision: i64,
    /// Keys whose newest version is a value (etcd's `etcd_debugging_mvcc_keys_total`). Only
    /// [`Store::push_version`] changes which version is newest; a compaction keeps a live key's.
    live_keys: usize,
    /// The hashes this store's latest compactions took of what they removed, as `HashKV` at
    /// each compaction revision answers them (newest last, at most [`COMPACTION_HASHES_KEPT`]),
    /// each computed when first asked for or by the hashing worker (`hashes.rs`). Like etcd's,
    /// they live in memory only: after a restart `HashKV` at the compaction revision hashes what
    /// is left.
    compaction_hashes: VecDeque<Arc<CompactionHash>>,
    /// Versions whose values are held and may be released, in revision order. An entry whose
    /// version a compaction removed is skipped when it comes up.
    releasable: VecDeque<(Revision, Key)>,
    /// Bytes of the values `releasable` names that are still held.
    releasable_bytes: usize,
    /// Where released values are read back from.
    values: Arc<dyn ValueSource>,
}

/// How many compactions' hashes a store remembers (etcd keeps 10).
const COMPACTION_HASHES_KEPT: usize = 10;

impl Default for Store {
    fn default() -> Self {
        Store::new()
    }
}

/// The result of a write: the response, and the changes to persist (empty when nothing changed).
pub type Written<T> = (T, Vec<Change>);

impl Store {
    /// An empty store. Its revision is 1, as in etcd: the first write creates revision 2.
    pub fn new() -> Store {
        Store {
            keys: BTreeMap::new(),
            by_revision: VecDeque::new(),
            current_revision: 1,
            compact_revision: -1,
            live_keys: 0,
            compaction_hashes: VecDeque::new(),
            releasable: VecDeque::new(),
            releasable_bytes: 0,
            values: Arc::new(NothingReleased),
        }
    }

    /// Where this store reads released values back from.
    pub fn value_source(&self) -> Arc<dyn ValueSource> {
        self.values.clone()
    }

    /// Reads released values back from `values` from now on: the caller's persisted rows.
    pub fn set_value_source(&mut self, values: Arc<dyn ValueSource>) {
        self.values = values;
    }

    /// Releases the values of versions at or below revision `durable` (the caller has made them
    /// durable and can read them back through the [`ValueSource`]), oldest first, until at most
    /// `keep_bytes` of releasable values are held. Returns the bytes released.
    pub fn release_values(&mut self, durable: i64, keep_bytes: usize) -> usize {
        let mut released = 0;
        while self.releasable_bytes > keep_bytes {
            let Some((rev, _)) = self.releasable.front() else {
                break;
            };
            if rev.main > durable {
                break;
            }
            let (rev, key) = self.releasable.pop_front().expect("looked at above");
            let Some(history) = self.keys.get_mut(&key) else {
                continue;
            };
            let version = match &mut **history {
                History::One(v) => Some(v).filter(|v| v.rev == rev),
                History::Many(versions) => versions
                    .binary_search_by_key(&rev, |v| v.rev)
                    .ok()
                    .map(|at| &mut versions[at]),
            };
            let Some(version) = version else {
                continue;
            };
            let bytes = version.releasable_bytes();
            if bytes > 0 {
                version.value = None;
                self.releasable_bytes -= bytes;
                released += bytes;
            }
        }
        if self.releasable.capacity() > 2 * self.releasable.len() + 1024 {
            self.releasable.shrink_to_fit();
        }
        released
    }

    /// Bytes of values held that [`Store::release_values`] may let go of.
    pub fn releasable_bytes(&self) -> usize {
        self.releasable_bytes
    }

    pub fn current_revision(&self) -> i64 {
        self.current_revision
    }

    pub fn compact_revision(&self) -> i64 {
        self.compact_revision
    }

    /// Number of keys that have a history (live or deleted but not yet compacted).
    pub fn key_history_len(&self) -> usize {
        self.keys.len()
    }

    /// The hashes this store's latest compactions took (newest last), as `HashKV` at each
    /// compaction revision answers them. One not computed yet is computed here (see
    /// [`Store::newest_compaction_hash`]); one whose values could not be read is left out.
    pub fn compaction_hashes(&self) -> Vec<KvHash> {
        self.compaction_hashes
            .iter()
            .filter_map(|h| h.resolve().ok())
            .collect()
    }

    /// The hash the newest compaction took: computed when first asked for, so the caller hands
    /// it to a worker ([`hash_in_background`]) to have it ready without holding up what
    /// follows the compaction.
    pub fn newest_compaction_hash(&self) -> Option<Arc<CompactionHash>> {
        self.compaction_hashes.back().cloned()
    }

    /// Number of keys whose newest version is a value.
    pub fn live_keys(&self) -> usize {
        self.live_keys
    }

    /// Rebuilds a store from persisted records. They need not be sorted (sorting is skipped when
    /// they are, as the revision-keyed table yields them).
    ///
    /// Built in bulk rather than one insert at a time: the versions are grouped by key with one
    /// sort, each key's bytes allocated once, and the key map built from its sorted entries
    /// (full B-tree nodes, where inserting in revision order leaves them about half full).
    ///
    /// Versions a compaction at `compact_revision` hides (a file whose compaction a stop
    /// interrupted still holds some) are left out: see [`Store::restore_with_hidden`].
    pub fn restore(
        current_revision: i64,
        compact_revision: i64,
        records: impl IntoIterator<Item = (Revision, Record)>,
    ) -> Store {
        Store::restore_with_hidden(current_revision, compact_revision, records).0
    }

    /// [`Store::restore`], and the revisions of the records it left out because the compaction
    /// at `compact_revision` hides them: what is left of that compaction's removals.
    pub fn restore_with_hidden(
        current_revision: i64,
        compact_revision: i64,
        records: impl IntoIterator<Item = (Revision, Record)>,
    ) -> (Store, Vec<Revision>) {
        let records = records
            .into_iter()
            .map(|(rev, record)| (rev, record, false));
        Store::restore_released(current_revision, compact_revision, records)
    }

    /// [`Store::restore_with_hidden`] from records some of whose values were left where they
    /// were read from: a record marked `true` is a put whose value is released (its `value`
    /// unread, read back through the value source set next, [`Store::set_value_source`]), so
    /// that a store restored from a file never holds every value at once.
    pub fn restore_released(
        current_revision: i64,
        compact_revision: i64,
        records: impl IntoIterator<Item = (Revision, Record, bool)>,
    ) -> (Store, Vec<Revision>) {
        let mut records: Vec<(Revision, Record, bool)> = records.into_iter().collect();
        if !records.is_sorted_by_key(|(rev, _, _)| *rev) {
            records.sort_by_key(|(rev, _, _)| *rev);
        }
        let mut key_bytes: Vec<Vec<u8>> = Vec::with_capacity(records.len());
        let mut revs: Vec<Revision> = Vec::with_capacity(records.len());
        let mut versions: Vec<Option<Version>> = Vec::with_capacity(records.len());
        for (rev, record, released) in records {
            let (key, version) = match record {
                Record::Put(kv) => (
                    kv.key,
                    Version {
                        rev,
                        create_revision: kv.create_revision,
                        version: kv.version,
                        value: (!released).then_some(kv.value),
                        lease: kv.lease,
                    },
                ),
                Record::Tombstone { key } => (key, Version::tombstone(rev)),
            };
            key_bytes.push(key);
            revs.push(rev);
            versions.push(Some(version));
        }
        // Positions in revision order, sorted by key; a stable sort keeps each key's versions in
        // revision order.
        let mut by_key: Vec<usize> = (0..key_bytes.len()).collect();
        by_key.sort_by(|&a, &b| key_bytes[a].cmp(&key_bytes[b]));
        let mut shared: Vec<Option<Key>> = vec![None; key_bytes.len()];
        let mut entries: Vec<(Key, Box<History>)> = Vec::new();
        let mut hidden: Vec<Revision> = Vec::new();
        for group in by_key.chunk_by(|&a, &b| key_bytes[a] == key_bytes[b]) {
            let key = Key::from(key_bytes[group[0]].as_slice());
            let mut history: Vec<Version> = group
                .iter()
                .map(|&at| versions[at].take().expect("each position is grouped once"))
                .collect();
            let gone = hidden_by_compaction(&history, compact_revision);
            hidden.extend(history.drain(..gone).map(|v| v.rev));
            if history.is_empty() {
                continue;
            }
            // The positions of the versions kept: the group's last ones, as it is in revision
            // order.
            for &at in &group[gone..] {
                shared[at] = Some(key.clone());
            }
            let history = match history.len() {
                1 => History::One(history.pop().expect("one version")),
                _ => History::Many(history),
            };
            entries.push((key, Box::new(history)));
        }
        drop(key_bytes);
        // In revision order again: the index of what a watch may replay.
        let by_revision: VecDeque<(Revision, Key)> = revs
            .into_iter()
            .zip(shared)
            .filter(|(rev, _)| rev.main >= compact_revision)
            .filter_map(|(rev, key)| Some((rev, key?)))
            .collect();
        let live_keys = entries.iter().filter(|(_, h)| h.latest().is_live()).count();
        // Every value held is releasable, oldest first.
        let mut releasable: Vec<(Revision, Key)> = Vec::new();
        let mut releasable_bytes = 0;
        for (key, history) in &entries {
            for v in history.as_slice() {
                if v.releasable_bytes() > 0 {
                    releasable_bytes += v.releasable_bytes();
                    releasable.push((v.rev, key.clone()));
                }
            }
        }
        releasable.sort_unstable_by_key(|(rev, _)| *rev);
        let store = Store {
            keys: entries.into_iter().collect(),
            by_revision,
            current_revision,
            compact_revision,
            live_keys,
            compaction_hashes: VecDeque::new(),
            releasable: releasable.into(),
            releasable_bytes,
            values: Arc::new(NothingReleased),
        };
        store.debug_validate();
        hidden.sort_unstable();
        (store, hidden)
    }

    /// Appends a version to `key`'s history (creating it) and to the revision index if it is at
    /// or above the compaction point.
    fn push_version(&mut self, key: &[u8], version: Version) {
        let rev = version.rev;
        let shared = match self.keys.get_key_value(key) {
            Some((shared, _)) => shared.clone(),
            None => Key::from(key),
        };
        let live_after = version.is_live();
        let bytes = version.releasable_bytes();
        if bytes > 0 {
            self.releasable_bytes += bytes;
            self.releasable.push_back((rev, shared.clone()));
        }
        match self.keys.get_mut(key) {
            Some(history) => {
                let live_before = history.latest().is_live();
                history.push(version);
                match (live_before, live_after) {
                    (false, true) => self.live_keys += 1,
                    (true, false) => self.live_keys -= 1,
                    _ => {}
                }
            }
            None => {
                self.live_keys += usize::from(live_after);
                self.keys
                    .insert(shared.clone(), Box::new(History::One(version)));
            }
        }
        if rev.main >= self.compact_revision {
            debug_assert!(self.by_revision.back().is_none_or(|(last, _)| *last < rev));
            self.by_revision.push_back((rev, shared));
        }
    }

    /// Every stored record in revision order: what a snapshot carries.
    pub fn records(&self) -> Result<Vec<(Revision, Record)>, Error> {
        let mut out: Vec<(Revision, Record)> = Vec::new();
        let mut values = ReadBack::new(&*self.values);
        for (key, history) in &self.keys {
            for v in history.as_slice() {
                let record = if v.is_live() {
                    Record::Put(Found { key, version: v }.to_kv(true, &mut values)?)
                } else {
                    Record::Tombstone { key: key.to_vec() }
                };
                out.push((v.rev, record));
            }
        }
        out.sort_by_key(|(rev, _)| *rev);
        Ok(out)
    }

    /// The changes made at revisions `from..=to`, in revision order, as watch events, stopping
    /// after `revisions_max` distinct revisions. Only revisions at or above the compaction point
    /// are held; the caller checks that first. One [`EventsScan`] in a single step.
    pub fn events(&self, from: i64, to: i64, revisions_max: usize) -> Result<Vec<Event>, Error> {
        let mut scan = self.events_scan(from, to, revisions_max, self.compact_revision);
        self.events_step(&mut scan, ScanBudget::UNBOUNDED)?;
        Ok(scan.finish())
    }

    /// The event of the version at `rev` of `key` (whose history holds it), with the version
    /// before it as `prev_kv` when that one is live and `with_prev`.
    fn event_at(
        &self,
        rev: Revision,
        key: &Key,
        with_prev: bool,
        values: &mut ReadBack<'_>,
    ) -> Result<Event, Error> {
        let history = self.keys[key].as_slice();
        let at = history
            .binary_search_by_key(&rev, |v| v.rev)
            .expect("the revision index names a stored version");
        let prev_kv = at
            .checked_sub(1)
            .filter(|_| with_prev)
            .map(|i| &history[i])
            .filter(|v| v.is_live())
            .map(|version| Found { key, version }.to_kv(true, values))
            .transpose()?;
        let version = &history[at];
        Ok(if version.is_live() {
            Event {
                kind: EventKind::Put,
                kv: Found { key, version }.to_kv(true, values)?,
                prev_kv,
            }
        } else {
            // A delete carries only the key and the revision, as in etcd.
            Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    key: key.to_vec(),
                    mod_revision: rev.main,
                    ..KeyValue::default()
                },
                prev_kv,
            }
        })
    }

    /// Every live key that names a lease, with that lease: what rebuilds the key-to-lease
    /// bindings after a restart. The keys are the store's own, shared.
    pub fn leased_keys(&self) -> Vec<(Key, LeaseId)> {
        self.keys
            .iter()
            .filter_map(|(key, history)| {
                let latest = history.latest();
                latest
                    .lease
                    .filter(|_| latest.is_live())
                    .map(|lease| (key.clone(), lease))
            })
            .collect()
    }

    /// The lease that `key` named just before `rev`: that of the version preceding the one at
    /// `rev` in its history, if that version is a value. What a write's change moved the key
    /// from.
    pub fn lease_before(&self, key: &[u8], rev: Revision) -> Option<LeaseId> {
        let history = self.keys.get(key)?.as_slice();
        let at = history.partition_point(|v| v.rev < rev);
        let prev = &history[at.checked_sub(1)?];
        prev.lease.filter(|_| prev.is_live())
    }

    /// The store's shared copy of `key`'s bytes, if it has a history.
    pub fn shared_key(&self, key: &[u8]) -> Option<Key> {
        self.keys.get_key_value(key).map(|(k, _)| k.clone())
    }

    /// A read at `req.revision` (or the current one): one [`RangeScan`] in a single step.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, Error> {
        let mut scan = self.range_scan(req.clone())?;
        self.range_step(&mut scan, ScanBudget::UNBOUNDED)?;
        scan.finish()
    }

    /// Reads with `view` as the newest visible revision; the revision bounds are already checked.
    fn range_at(&self, req: &RangeRequest, view: i64) -> Result<RangeResponse, Error> {
        let mut scan = self.scan_at(req.clone(), view);
        self.range_step(&mut scan, ScanBudget::UNBOUNDED)?;
        scan.finish()
    }

    /// The live versions of the keys in `[key, range_end)` (etcd's range rules) as of `rev`.
    fn visible_in(&self, key: &[u8], range_end: &[u8], rev: i64) -> Vec<Found<'_>> {
        let Some(bounds) = key_bounds(key, range_end) else {
            return Vec::new();
        };
        self.keys
            .range::<[u8], _>(bounds)
            .filter_map(|(key, history)| {
                visible_at(history.as_slice(), rev).map(|version| Found { key, version })
            })
            .collect()
    }

    pub fn put(
        &mut self,
        req: &PutRequest,
        lease_exists: &dyn Fn(LeaseId) -> bool,
    ) -> Result<Written<PutResponse>, Error> {
        self.check_put(req, lease_exists)?;
        let mut w = Writer::new(self);
        let resp = w.put(req)?;
        Ok((resp, w.finish()))
    }

    /// [`Error::Unreadable`] is the only error: see there.
    pub fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> Result<Written<DeleteRangeResponse>, Error> {
        let mut w = Writer::new(self);
        let resp = w.delete_range(req)?;
        Ok((resp, w.finish()))
    }

    /// Deletes the given keys (those still live) at one new revision, in key order: what a lease
    /// revocation does.
    pub fn delete_keys<'k>(&mut self, keys: impl IntoIterator<Item = &'k [u8]>) -> Written<i64> {
        let mut keys: Vec<&[u8]> = keys.into_iter().collect();
        keys.sort_unstable();
        keys.dedup();
        let mut w = Writer::new(self);
        for key in keys {
            // Without prev_kv a delete reads no value, and so cannot fail.
            let _ = w.delete_range(&DeleteRangeRequest {
                key: key.to_vec(),
                range_end: Vec::new(),
                prev_kv: false,
            });
        }
        let rev = w.view_revision();
        (rev, w.finish())
    }

    pub fn txn(
        &mut self,
        req: &TxnRequest,
        lease_exists: &dyn Fn(LeaseId) -> bool,
    ) -> Result<Written<TxnResponse>, Error> {
        // Every compare, also of nested txns, is evaluated against the state before the txn.
        let mut path = Vec::new();
        self.compare_path(req, &mut path)?;
        self.check_txn(req, &path, &mut 0, lease_exists)?;
        let mut w = Writer::new(self);
        let mut resp = w.txn(req, &path, &mut 0)?;
        resp.revision = w.view_revision();
        Ok((resp, w.finish()))
    }

    /// etcd's `HashKV` of the history up to `revision` (0: the current one); see [`crate::hash`]
    /// for what is hashed. Linear in the store's size, plus a sort of what it hashes.
    ///
    /// At a revision a compaction of this store's ended at, the hash that compaction took before
    /// it removed anything (etcd's: every member then answers the same, however its compactions
    /// fell); at the compaction revision without one (after a restart), what is left there.
    pub fn hash_kv(&self, revision: i64) -> Result<KvHash, Error> {
        if revision > 0 && revision < self.compact_revision {
            return Err(Error::Compacted);
        }
        if let Some(taken) = self
            .compaction_hashes
            .iter()
            .find(|h| revision > 0 && h.hash_revision() == revision)
        {
            return taken.resolve();
        }
        if revision > self.current_revision {
            return Err(Error::FutureRevision);
        }
        let at = if revision == 0 {
            self.current_revision
        } else {
            revision
        };
        Ok(KvHash {
            hash: self.pick_for_hash(at)?.hash()?,
            hash_revision: at,
            compact_revision: self.compact_revision,
        })
    }

    /// What `HashKV` at `at` covers (at or below the current revision, and not below the
    /// compaction point), in revision order, with a view of the released values among them
    /// opened now.
    fn pick_for_hash(&self, at: i64) -> Result<hashes::Picked, Error> {
        // What a compaction at `at` would keep of what lies at or below the compaction point:
        // each key's newest version at `at`, if it is a value. etcd hashes everything there
        // when no key has one.
        let newest_live = |versions: &[Version]| {
            let upto = versions.partition_point(|v| v.rev.main <= at);
            upto.checked_sub(1)
                .map(|i| &versions[i])
                .filter(|v| v.is_live())
                .map(|v| v.rev)
        };
        let any_kept = self
            .keys
            .values()
            .any(|h| newest_live(h.as_slice()).is_some());
        let mut versions: Vec<(Key, Version)> = Vec::new();
        let mut released = false;
        for (key, history) in &self.keys {
            let history = history.as_slice();
            let kept = newest_live(history);
            for v in history.iter().take_while(|v| v.rev.main <= at) {
                if v.rev.main <= self.compact_revision && any_kept && kept != Some(v.rev) {
                    continue;
                }
                released |= v.is_released();
                versions.push((
                    key.clone(),
                    Version {
                        value: v.value.as_ref().map(share),
                        ..*v
                    },
                ));
            }
        }
        versions.sort_unstable_by_key(|(_, v)| v.rev);
        let reader = if released {
            Some(ReadBack::new(&*self.values).open()?)
        } else {
            None
        };
        Ok(hashes::Picked { versions, reader })
    }

    /// Physically removes every version that no read at `revision` or later can see.
    pub fn compact(&mut self, revision: i64) -> Result<Written<i64>, Error> {
        if revision <= self.compact_revision {
            return Err(Error::Compacted);
        }
        if revision > self.current_revision {
            return Err(Error::FutureRevision);
        }
        // Picked before anything is removed; hashed later, away from the caller's apply.
        let picked = self.pick_for_hash(revision)?;
        if self.compaction_hashes.len() == COMPACTION_HASHES_KEPT {
            self.compaction_hashes.pop_front();
        }
        self.compaction_hashes
            .push_back(Arc::new(CompactionHash::pending(
                revision,
                self.compact_revision,
                picked,
            )));
        let mut changes = Vec::new();
        let mut releasable_gone = 0;
        self.keys.retain(|_, history| {
            let gone = hidden_by_compaction(history.as_slice(), revision);
            history.drop_oldest(gone, |v| {
                releasable_gone += v.releasable_bytes();
                changes.push(Change::Remove { rev: v.rev });
            })
        });
        self.releasable_bytes -= releasable_gone;
        // Nothing reads history below the compaction point: its index goes. A watch may start
        // at the compaction point itself, so what is kept there stays indexed (a tombstone
        // there included).
        let below = self
            .by_revision
            .partition_point(|(rev, _)| rev.main < revision);
        self.by_revision.drain(..below);
        let at = self
            .by_revision
            .partition_point(|(rev, _)| rev.main == revision);
        let kept: Vec<(Revision, Key)> = self
            .by_revision
            .drain(..at)
            .filter(|(rev, key)| {
                self.keys
                    .get(key)
                    .is_some_and(|h| h.as_slice().iter().any(|v| v.rev == *rev))
            })
            .collect();
        for entry in kept.into_iter().rev() {
            self.by_revision.push_front(entry);
        }
        if self.by_revision.capacity() > 2 * self.by_revision.len() + 1024 {
            self.by_revision.shrink_to_fit();
        }
        self.compact_revision = revision;
        self.debug_validate();
        Ok((self.current_revision, changes))
    }

    fn compare_path(&self, req: &TxnRequest, path: &mut Vec<bool>) -> Result<(), Error> {
        let mut ok = true;
        for c in &req.compare {
            if !self.compare(c)? {
                ok = false;
                break;
            }
        }
        path.push(ok);
        let ops = if ok { &req.success } else { &req.failure };
        for op in ops {
            if let RequestOp::Txn(nested) = op {
                self.compare_path(nested, path)?;
            }
        }
        Ok(())
    }

    fn compare(&self, c: &Compare) -> Result<bool, Error> {
        let kvs = self.visible_in(&c.key, &c.range_end, self.current_revision);
        if kvs.is_empty() {
            // A missing key has no value to compare; every other target compares as zero.
            if matches!(c.target, CompareTarget::Value(_)) {
                return Ok(false);
            }
            return compare_kv(c, None, &mut ReadBack::new(&*self.values));
        }
        let mut values = ReadBack::new(&*self.values);
        for found in kvs {
            if !compare_kv(c, Some(found), &mut values)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The checks etcd makes before a txn touches anything: puts name live leases and, with
    /// `ignore_*`, existing keys; ranges read readable revisions.
    fn check_txn(
        &self,
        req: &TxnRequest,
        path: &[bool],
        cursor: &mut usize,
        lease_exists: &dyn Fn(LeaseId) -> bool,
    ) -> Result<(), Error> {
        let ops = if path[*cursor] {
            &req.success
        } else {
            &req.failure
        };
        *cursor += 1;
        for op in ops {
            match op {
                RequestOp::Range(r) => {
                    check_read_revision(r.revision, self.current_revision, self.compact_revision)?;
                }
                RequestOp::Put(p) => self.check_put(p, lease_exists)?,
                RequestOp::DeleteRange(_) => {}
                RequestOp::Txn(nested) => self.check_txn(nested, path, cursor, lease_exists)?,
            }
        }
        Ok(())
    }

    fn check_put(
        &self,
        req: &PutRequest,
        lease_exists: &dyn Fn(LeaseId) -> bool,
    ) -> Result<(), Error> {
        if let Some(lease) = req.lease
            && !lease_exists(lease)
        {
            return Err(Error::LeaseNotFound);
        }
        if (req.ignore_value || req.ignore_lease) && self.latest(&req.key).is_none() {
            return Err(Error::KeyNotFound);
        }
        Ok(())
    }

    /// The live version of `key`, if any.
    fn latest(&self, key: &[u8]) -> Option<Found<'_>> {
        let (key, history) = self.keys.get_key_value(key)?;
        let version = history.latest();
        version.is_live().then_some(Found { key, version })
    }

    /// Checks every invariant; panics with the broken one. Linear in the store's size.
    pub fn validate(&self) {
        assert!(self.current_revision >= 1, "revision starts at 1");
        let held: usize = self
            .keys
            .values()
            .flat_map(|h| h.as_slice().iter().map(Version::releasable_bytes))
            .sum();
        assert_eq!(
            held, self.releasable_bytes,
            "releasable bytes count the values held"
        );
        assert_eq!(
            self.live_keys,
            self.keys.values().filter(|h| h.latest().is_live()).count(),
            "live key count"
        );
        assert!(
            self.compact_revision <= self.current_revision,
            "compact revision {} above current {}",
            self.compact_revision,
            self.current_revision
        );
        let above: usize = self
            .keys
            .values()
            .map(|h| {
                let versions = h.as_slice();
                versions.len() - versions.partition_point(|v| v.rev.main < self.compact_revision)
            })
            .sum();
        assert_eq!(
            above,
            self.by_revision.len(),
            "revision index covers every version at or above the compaction point"
        );
        for pair in self.by_revision.iter().zip(self.by_revision.iter().skip(1)) {
            assert!(pair.0.0 < pair.1.0, "revision index out of order");
        }
        for (rev, key) in &self.by_revision {
            assert!(
                rev.main >= self.compact_revision,
                "index entry below compaction"
            );
            let history = self.keys.get(key).expect("index names a stored key");
            assert!(
                history.as_slice().iter().any(|v| v.rev == *rev),
                "index names a stored version"
            );
        }
        for (key, history) in &self.keys {
            if let History::Many(vs) = &**history {
                assert!(
                    vs.len() > 1,
                    "{key:?}: a one-version history is held as one"
                );
            }
            let history = history.as_slice();
            assert!(
                history[0].is_live() || history[0].rev.main == self.compact_revision,
                "history of {key:?} starts with a tombstone below the compaction revision"
            );
            let mut generation_start: Option<i64> = None;
            let mut expected_version = 1;
            for (i, v) in history.iter().enumerate() {
                assert!(v.rev.main <= self.current_revision, "{key:?} above current");
                if i > 0 {
                    assert!(history[i - 1].rev < v.rev, "{key:?} history out of order");
                }
                if v.is_live() {
                    // The first version kept after a compaction may be mid-generation.
                    let start = *generation_start.get_or_insert(v.create_revision);
                    if i > 0 || v.version == 1 {
                        assert_eq!(v.create_revision, start, "{key:?} create revision");
                        if i > 0 {
                            assert_eq!(v.version, expected_version, "{key:?} version");
                        }
                    }
                    expected_version = v.version + 1;
                } else {
                    // A compaction at a tombstone's revision keeps the tombstone alone.
                    let kept_alone = i == 0 && v.rev.main == self.compact_revision;
                    assert!(
                        kept_alone || (i > 0 && history[i - 1].is_live()),
                        "{key:?} double delete"
                    );
                    assert_eq!(v.lease, None, "{key:?}: a tombstone names no lease");
                    generation_start = None;
                    expected_version = 1;
                }
            }
        }
    }

    fn debug_validate(&self) {
        if cfg!(debug_assertions) {
            self.validate();
        }
    }
}

/// How many of a key's oldest versions (`versions`, in revision order) a compaction at
/// `revision` removes: every one no read at `revision` or later sees. The newest version at or
/// below `revision` stays if it is a value (reads at `revision` still see it); a tombstone below
/// `revision` hides nothing and goes too, but one at `revision` itself stays, as etcd 3.6+ keeps
/// it (etcd#18089), so that a watch from the compaction revision sees the delete. The next
/// compaction past it takes it.
fn hidden_by_compaction(versions: &[Version], revision: i64) -> usize {
    let at_or_below = versions.partition_point(|v| v.rev.main <= revision);
    let Some(newest) = at_or_below.checked_sub(1).map(|i| &versions[i]) else {
        return 0;
    };
    if newest.is_live() || newest.rev.main == revision {
        at_or_below - 1
    } else {
        at_or_below
    }
}

/// The one write in progress: all its changes share `main`, ordered by `sub`.
struct Writer<'s> {
    store: &'s mut Store,
    main: i64,
    sub: i64,
    changes: Vec<Change>,
}

impl<'s> Writer<'s> {
    fn new(store: &'s mut Store) -> Writer<'s> {
        let main = store.current_revision + 1;
        Writer {
            store,
            main,
            sub: 0,
            changes: Vec::new(),
        }
    }

    /// The newest revision this write can see: its own once it has changed something.
    fn view_revision(&self) -> i64 {
        if self.changes.is_empty() {
            self.store.current_revision
        } else {
            self.main
        }
    }

    fn next_revision(&mut self) -> Revision {
        let rev = Revision {
            main: self.main,
            sub: self.sub,
        };
        self.sub += 1;
        rev
    }

    fn put(&mut self, req: &PutRequest) -> Result<PutResponse, Error> {
        let prev = self.store.latest(&req.key);
        let value = match (prev, req.ignore_value) {
            // The newest version's value, read back if it was released.
            (Some(prev), true) => prev.value(&mut ReadBack::new(&*self.store.values))?,
            _ => Bytes::copy_from_slice(&req.value),
        };
        let lease = match (prev, req.ignore_lease) {
            (Some(prev), true) => prev.version.lease,
            _ => req.lease,
        };
        let (create_revision, version) = match prev {
            Some(prev) => (prev.version.create_revision, prev.version.version + 1),
            None => (self.main, 1),
        };
        let prev_kv = prev
            .filter(|_| req.prev_kv)
            .map(|p| p.to_kv(true, &mut ReadBack::new(&*self.store.values)))
            .transpose()?;
        let rev = self.next_revision();
        let kv = KeyValue {
            key: req.key.clone(),
            create_revision,
            mod_revision: rev.main,
            version,
            value: share(&value),
            lease,
        };
        self.store.push_version(
            &req.key,
            Version {
                rev,
                create_revision,
                version,
                value: Some(value),
                lease,
            },
        );
        self.changes.push(Change::Write {
            rev,
            record: Record::Put(kv),
        });
        Ok(PutResponse {
            revision: rev.main,
            prev_kv,
        })
    }

    fn delete_range(&mut self, req: &DeleteRangeRequest) -> Result<DeleteRangeResponse, Error> {
        let doomed: Vec<KeyValue> = {
            let mut values = ReadBack::new(&*self.store.values);
            self.store
                .visible_in(&req.key, &req.range_end, i64::MAX)
                .into_iter()
                .map(|f| f.to_kv(req.prev_kv, &mut values))
                .collect::<Result<_, _>>()?
        };
        for kv in &doomed {
            let rev = self.next_revision();
            self.store.push_version(&kv.key, Version::tombstone(rev));
            self.changes.push(Change::Write {
                rev,
                record: Record::Tombstone {
                    key: kv.key.clone(),
                },
            });
        }
        Ok(DeleteRangeResponse {
            revision: self.view_revision(),
            deleted: doomed.len() as i64,
            prev_kvs: if req.prev_kv { doomed } else { Vec::new() },
        })
    }

    fn txn(
        &mut self,
        req: &TxnRequest,
        path: &[bool],
        cursor: &mut usize,
    ) -> Result<TxnResponse, Error> {
        let succeeded = path[*cursor];
        *cursor += 1;
        let ops = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            let resp = match op {
                RequestOp::Range(r) => {
                    ResponseOp::Range(self.store.range_at(r, self.view_revision())?)
                }
                RequestOp::Put(p) => ResponseOp::Put(self.put(p)?),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.delete_range(d)?),
                // A nested txn's own header carries no revision in etcd; only the outer one does.
                RequestOp::Txn(nested) => ResponseOp::Txn(self.txn(nested, path, cursor)?),
            };
            responses.push(resp);
        }
        Ok(TxnResponse {
            revision: 0,
            succeeded,
            responses,
        })
    }

    fn finish(self) -> Vec<Change> {
        if !self.changes.is_empty() {
            self.store.current_revision = self.main;
        }
        self.store.debug_validate_touched(&self.changes);
        self.changes
    }
}

impl Store {
    /// Cheap post-condition of a write: every change it reports is in the history of its key,
    /// at the revision the store now stands at.
    fn debug_validate_touched(&self, changes: &[Change]) {
        if !cfg!(debug_assertions) {
            return;
        }
        for change in changes {
            if let Change::Write { rev, record } = change {
                let history = self.keys[record.key()].as_slice();
                assert!(
                    history.iter().any(|v| v.rev == *rev),
                    "change not in history"
                );
                assert_eq!(
                    rev.main, self.current_revision,
                    "change at another revision"
                );
            }
        }
    }
}

fn check_read_revision(revision: i64, current: i64, compacted: i64) -> Result<(), Error> {
    if revision > current {
        return Err(Error::FutureRevision);
    }
    let rev = if revision <= 0 { current } else { revision };
    if rev < compacted {
        return Err(Error::Compacted);
    }
    Ok(())
}

fn visible_at(history: &[Version], rev: i64) -> Option<&Version> {
    let newer = history.partition_point(|v| v.rev.main <= rev);
    let version = history.get(newer.checked_sub(1)?)?;
    version.is_live().then_some(version)
}

/// Whether `candidate` is in the range `key`/`range_end` under etcd's rules (empty end: the key
/// itself; `[0]`: every key from `key` on; otherwise `[key, range_end)`).
pub fn key_in_range(key: &[u8], range_end: &[u8], candidate: &[u8]) -> bool {
    match range_end {
        [] => candidate == key,
        [0] => candidate >= key,
        end => candidate >= key && candidate < end,
    }
}

/// Bounds of a key range over the key map.
type KeyBounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// etcd's key-range rules as map bounds; `None` when the range is empty.
fn key_bounds<'a>(key: &'a [u8], range_end: &'a [u8]) -> Option<KeyBounds<'a>> {
    match range_end {
        [] => Some((Bound::Included(key), Bound::Included(key))),
        [0] => Some((Bound::Included(key), Bound::Unbounded)),
        end if end <= key => None,
        end => Some((Bound::Included(key), Bound::Excluded(end))),
    }
}

fn compare_by(target: SortTarget, a: &Found<'_>, b: &Found<'_>) -> std::cmp::Ordering {
    let (x, y) = (a.version, b.version);
    match target {
        SortTarget::Key => a.key.cmp(b.key),
        SortTarget::Version => x.version.cmp(&y.version),
        SortTarget::Create => x.create_revision.cmp(&y.create_revision),
        SortTarget::Mod => x.rev.main.cmp(&y.rev.main),
        // Values may be released: a sort by value sorts the copies ([`RangeScan`]'s `pick`).
        SortTarget::Value => std::cmp::Ordering::Equal,
    }
}

/// Evaluates one compare against a live version, or against a missing key (`None`), which
/// compares as zero on every target but the value.
fn compare_kv(
    c: &Compare,
    found: Option<Found<'_>>,
    values: &mut ReadBack<'_>,
) -> Result<bool, Error> {
    let (version, create, modified, lease) = found.map_or((0, 0, 0, None), |f| {
        let v = f.version;
        (v.version, v.create_revision, v.rev.main, v.lease)
    });
    let ord = match &c.target {
        CompareTarget::Version(v) => version.cmp(v),
        CompareTarget::Create(v) => create.cmp(v),
        CompareTarget::Mod(v) => modified.cmp(v),
        CompareTarget::Value(v) => match found {
            Some(f) => f.value(values)?.as_ref().cmp(v.as_slice()),
            None => [].as_slice().cmp(v.as_slice()),
        },
        CompareTarget::Lease(v) => LeaseId::to_wire(lease).cmp(v),
    };
    Ok(match c.result {
        CompareResult::Equal => ord.is_eq(),
        CompareResult::NotEqual => ord.is_ne(),
        CompareResult::Greater => ord.is_gt(),
        CompareResult::Less => ord.is_lt(),
    })
}
