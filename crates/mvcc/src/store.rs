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
//!   and `create_revision` is the main revision of the generation's first put.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::error::Error;
use crate::types::{
    Change, Compare, CompareResult, CompareTarget, DeleteRangeRequest, DeleteRangeResponse, Event,
    EventKind, KeyValue, LeaseId, PutRequest, PutResponse, RangeRequest, RangeResponse, Record,
    RequestOp, ResponseOp, Revision, SortOrder, SortTarget, TxnRequest, TxnResponse,
};

/// One entry of a key's history: a value, or a tombstone (`kv == None`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Version {
    rev: Revision,
    kv: Option<KeyValue>,
}

/// The whole key space with its history. Pure in-memory state: persistence is the caller's, fed
/// by the [`Change`]s each write returns.
#[derive(Clone, Debug)]
pub struct Store {
    keys: BTreeMap<Vec<u8>, Vec<Version>>,
    /// Every stored version by revision: the index that replays history (watch) in order.
    by_revision: BTreeMap<Revision, Vec<u8>>,
    current_revision: i64,
    /// `-1` until the first compaction, as in etcd.
    compact_revision: i64,
}

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
            by_revision: BTreeMap::new(),
            current_revision: 1,
            compact_revision: -1,
        }
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

    /// Rebuilds a store from persisted records. They need not be sorted.
    pub fn restore(
        current_revision: i64,
        compact_revision: i64,
        records: impl IntoIterator<Item = (Revision, Record)>,
    ) -> Store {
        let mut records: Vec<(Revision, Record)> = records.into_iter().collect();
        records.sort_by_key(|(rev, _)| *rev);
        let mut keys: BTreeMap<Vec<u8>, Vec<Version>> = BTreeMap::new();
        let mut by_revision = BTreeMap::new();
        for (rev, record) in records {
            let (key, kv) = match record {
                Record::Put(kv) => (kv.key.clone(), Some(kv)),
                Record::Tombstone { key } => (key, None),
            };
            by_revision.insert(rev, key.clone());
            keys.entry(key).or_default().push(Version { rev, kv });
        }
        let store = Store {
            keys,
            by_revision,
            current_revision,
            compact_revision,
        };
        store.debug_validate();
        store
    }

    /// Every stored record in revision order: what a snapshot carries.
    pub fn records(&self) -> Vec<(Revision, Record)> {
        let mut out: Vec<(Revision, Record)> = self
            .keys
            .iter()
            .flat_map(|(key, history)| {
                history.iter().map(move |v| {
                    let record = match &v.kv {
                        Some(kv) => Record::Put(kv.clone()),
                        None => Record::Tombstone { key: key.clone() },
                    };
                    (v.rev, record)
                })
            })
            .collect();
        out.sort_by_key(|(rev, _)| *rev);
        out
    }

    /// The changes made at revisions `from..=to`, in revision order, as watch events, stopping
    /// after `revisions_max` distinct revisions. Only revisions above the compaction point are
    /// complete; the caller checks that first.
    pub fn events(&self, from: i64, to: i64, revisions_max: usize) -> Vec<Event> {
        let start = Revision { main: from, sub: 0 };
        let end = Revision {
            main: to,
            sub: i64::MAX,
        };
        let mut out = Vec::new();
        let mut revisions = 0;
        let mut last_main = None;
        for (rev, key) in self.by_revision.range(start..=end) {
            if last_main != Some(rev.main) {
                if revisions == revisions_max {
                    break;
                }
                revisions += 1;
                last_main = Some(rev.main);
            }
            let history = &self.keys[key];
            let at = history
                .binary_search_by_key(rev, |v| v.rev)
                .expect("the revision index names a stored version");
            let prev_kv = at.checked_sub(1).and_then(|i| history[i].kv.clone());
            out.push(match &history[at].kv {
                Some(kv) => Event {
                    kind: EventKind::Put,
                    kv: kv.clone(),
                    prev_kv,
                },
                // A delete carries only the key and the revision, as in etcd.
                None => Event {
                    kind: EventKind::Delete,
                    kv: KeyValue {
                        key: key.clone(),
                        mod_revision: rev.main,
                        ..KeyValue::default()
                    },
                    prev_kv,
                },
            });
        }
        out
    }

    /// Every live key that names a lease, with that lease: what rebuilds the key-to-lease
    /// bindings after a restart.
    pub fn leased_keys(&self) -> Vec<(Vec<u8>, LeaseId)> {
        self.keys
            .iter()
            .filter_map(|(key, history)| {
                let kv = history.last()?.kv.as_ref()?;
                Some((key.clone(), kv.lease?))
            })
            .collect()
    }

    /// A read at `req.revision` (or the current one).
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, Error> {
        check_read_revision(req.revision, self.current_revision, self.compact_revision)?;
        Ok(self.range_at(req, self.current_revision))
    }

    /// Reads with `view` as the newest visible revision; the revision bounds are already checked.
    fn range_at(&self, req: &RangeRequest, view: i64) -> RangeResponse {
        let rev = if req.revision <= 0 {
            view
        } else {
            req.revision
        };
        let visible = self.visible_in(&req.key, &req.range_end, rev);
        let count = visible.len() as i64;
        let mut resp = RangeResponse {
            revision: view,
            kvs: Vec::new(),
            more: false,
            count,
        };
        if req.count_only {
            return resp;
        }
        let filtered = req.min_mod_revision != 0
            || req.max_mod_revision != 0
            || req.min_create_revision != 0
            || req.max_create_revision != 0;
        let mut order = req.sort_order;
        if req.sort_target != SortTarget::Key && order == SortOrder::None {
            // Results come in key order; any other target is sorted ascending by default.
            order = SortOrder::Ascend;
        } else if req.sort_target == SortTarget::Key && order == SortOrder::Ascend {
            order = SortOrder::None;
        }
        let take = if req.limit > 0 && !filtered && order == SortOrder::None {
            // One past the limit is enough to know whether there is more.
            usize::try_from(req.limit)
                .unwrap_or(usize::MAX)
                .saturating_add(1)
        } else {
            usize::MAX
        };
        let mut kvs: Vec<KeyValue> = visible
            .into_iter()
            .filter(|kv| req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
            .filter(|kv| req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
            .filter(|kv| {
                req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision
            })
            .filter(|kv| {
                req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision
            })
            .take(take)
            .cloned()
            .collect();
        if order != SortOrder::None {
            // Stable, so equal targets keep key order in both directions, as etcd's sort does
            // on small inputs.
            let target = req.sort_target;
            kvs.sort_by(|a, b| {
                let ord = compare_by(target, a, b);
                if order == SortOrder::Descend {
                    ord.reverse()
                } else {
                    ord
                }
            });
        }
        if let Ok(limit) = usize::try_from(req.limit)
            && limit > 0
            && kvs.len() > limit
        {
            kvs.truncate(limit);
            resp.more = true;
        }
        if req.keys_only {
            for kv in &mut kvs {
                kv.value.clear();
            }
        }
        resp.kvs = kvs;
        resp
    }

    /// The live versions of the keys in `[key, range_end)` (etcd's range rules) as of `rev`.
    fn visible_in(&self, key: &[u8], range_end: &[u8], rev: i64) -> Vec<&KeyValue> {
        let Some(bounds) = key_bounds(key, range_end) else {
            return Vec::new();
        };
        self.keys
            .range::<[u8], _>(bounds)
            .filter_map(|(_, history)| visible_at(history, rev))
            .collect()
    }

    pub fn put(
        &mut self,
        req: &PutRequest,
        lease_exists: &dyn Fn(LeaseId) -> bool,
    ) -> Result<Written<PutResponse>, Error> {
        self.check_put(req, lease_exists)?;
        let mut w = Writer::new(self);
        let resp = w.put(req);
        Ok((resp, w.finish()))
    }

    pub fn delete_range(&mut self, req: &DeleteRangeRequest) -> Written<DeleteRangeResponse> {
        let mut w = Writer::new(self);
        let resp = w.delete_range(req);
        (resp, w.finish())
    }

    /// Deletes the given keys (those still live) at one new revision, in key order: what a lease
    /// revocation does.
    pub fn delete_keys<'k>(&mut self, keys: impl IntoIterator<Item = &'k [u8]>) -> Written<i64> {
        let mut keys: Vec<&[u8]> = keys.into_iter().collect();
        keys.sort_unstable();
        keys.dedup();
        let mut w = Writer::new(self);
        for key in keys {
            w.delete_range(&DeleteRangeRequest {
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
        self.compare_path(req, &mut path);
        self.check_txn(req, &path, &mut 0, lease_exists)?;
        let mut w = Writer::new(self);
        let mut resp = w.txn(req, &path, &mut 0);
        resp.revision = w.view_revision();
        Ok((resp, w.finish()))
    }

    /// Physically removes every version that no read at `revision` or later can see.
    pub fn compact(&mut self, revision: i64) -> Result<Written<i64>, Error> {
        if revision <= self.compact_revision {
            return Err(Error::Compacted);
        }
        if revision > self.current_revision {
            return Err(Error::FutureRevision);
        }
        let mut changes = Vec::new();
        let by_revision = &mut self.by_revision;
        self.keys.retain(|_, history| {
            let at_or_below = history.partition_point(|v| v.rev.main <= revision);
            if at_or_below == 0 {
                return true;
            }
            // Keep the newest version at or below `revision` if it is a value: reads at
            // `revision` still see it. A tombstone there hides nothing and goes too.
            let keep_from = if history[at_or_below - 1].kv.is_some() {
                at_or_below - 1
            } else {
                at_or_below
            };
            for v in history.drain(..keep_from) {
                by_revision.remove(&v.rev);
                changes.push(Change::Remove { rev: v.rev });
            }
            !history.is_empty()
        });
        self.compact_revision = revision;
        self.debug_validate();
        Ok((self.current_revision, changes))
    }

    fn compare_path(&self, req: &TxnRequest, path: &mut Vec<bool>) {
        let ok = req.compare.iter().all(|c| self.compare(c));
        path.push(ok);
        let ops = if ok { &req.success } else { &req.failure };
        for op in ops {
            if let RequestOp::Txn(nested) = op {
                self.compare_path(nested, path);
            }
        }
    }

    fn compare(&self, c: &Compare) -> bool {
        let kvs = self.visible_in(&c.key, &c.range_end, self.current_revision);
        if kvs.is_empty() {
            // A missing key has no value to compare; every other target compares as zero.
            if matches!(c.target, CompareTarget::Value(_)) {
                return false;
            }
            return compare_kv(c, &KeyValue::default());
        }
        kvs.into_iter().all(|kv| compare_kv(c, kv))
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

    fn latest(&self, key: &[u8]) -> Option<&KeyValue> {
        self.keys.get(key).and_then(|h| h.last()?.kv.as_ref())
    }

    /// Checks every invariant; panics with the broken one. Linear in the store's size.
    pub fn validate(&self) {
        assert!(self.current_revision >= 1, "revision starts at 1");
        assert!(
            self.compact_revision <= self.current_revision,
            "compact revision {} above current {}",
            self.compact_revision,
            self.current_revision
        );
        let versions: usize = self.keys.values().map(Vec::len).sum();
        assert_eq!(
            versions,
            self.by_revision.len(),
            "revision index covers every version"
        );
        for (key, history) in &self.keys {
            assert!(!history.is_empty(), "empty history for {key:?}");
            assert!(
                history[0].kv.is_some(),
                "history of {key:?} starts with a tombstone"
            );
            let mut generation_start: Option<i64> = None;
            let mut expected_version = 1;
            for (i, v) in history.iter().enumerate() {
                assert!(v.rev.main <= self.current_revision, "{key:?} above current");
                if i > 0 {
                    assert!(history[i - 1].rev < v.rev, "{key:?} history out of order");
                }
                match &v.kv {
                    Some(kv) => {
                        assert_eq!(&kv.key, key, "record filed under another key");
                        assert_eq!(kv.mod_revision, v.rev.main, "{key:?} mod revision");
                        // The first version kept after a compaction may be mid-generation.
                        let start = *generation_start.get_or_insert(kv.create_revision);
                        if i > 0 || kv.version == 1 {
                            assert_eq!(kv.create_revision, start, "{key:?} create revision");
                            if i > 0 {
                                assert_eq!(kv.version, expected_version, "{key:?} version");
                            }
                        }
                        expected_version = kv.version + 1;
                    }
                    None => {
                        assert!(
                            i > 0 && history[i - 1].kv.is_some(),
                            "{key:?} double delete"
                        );
                        generation_start = None;
                        expected_version = 1;
                    }
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

    fn put(&mut self, req: &PutRequest) -> PutResponse {
        let prev = self.store.latest(&req.key).cloned();
        let value = match (&prev, req.ignore_value) {
            (Some(prev), true) => prev.value.clone(),
            _ => req.value.clone(),
        };
        let lease = match (&prev, req.ignore_lease) {
            (Some(prev), true) => prev.lease,
            _ => req.lease,
        };
        let (create_revision, version) = match &prev {
            Some(prev) => (prev.create_revision, prev.version + 1),
            None => (self.main, 1),
        };
        let rev = self.next_revision();
        let kv = KeyValue {
            key: req.key.clone(),
            create_revision,
            mod_revision: rev.main,
            version,
            value,
            lease,
        };
        self.store
            .keys
            .entry(req.key.clone())
            .or_default()
            .push(Version {
                rev,
                kv: Some(kv.clone()),
            });
        self.store.by_revision.insert(rev, req.key.clone());
        self.changes.push(Change::Write {
            rev,
            record: Record::Put(kv),
        });
        PutResponse {
            revision: rev.main,
            prev_kv: if req.prev_kv { prev } else { None },
        }
    }

    fn delete_range(&mut self, req: &DeleteRangeRequest) -> DeleteRangeResponse {
        let doomed: Vec<KeyValue> = self
            .store
            .visible_in(&req.key, &req.range_end, i64::MAX)
            .into_iter()
            .cloned()
            .collect();
        for kv in &doomed {
            let rev = self.next_revision();
            let history = self
                .store
                .keys
                .get_mut(&kv.key)
                .expect("a visible key has a history");
            history.push(Version { rev, kv: None });
            self.store.by_revision.insert(rev, kv.key.clone());
            self.changes.push(Change::Write {
                rev,
                record: Record::Tombstone {
                    key: kv.key.clone(),
                },
            });
        }
        DeleteRangeResponse {
            revision: self.view_revision(),
            deleted: doomed.len() as i64,
            prev_kvs: if req.prev_kv { doomed } else { Vec::new() },
        }
    }

    fn txn(&mut self, req: &TxnRequest, path: &[bool], cursor: &mut usize) -> TxnResponse {
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
                    ResponseOp::Range(self.store.range_at(r, self.view_revision()))
                }
                RequestOp::Put(p) => ResponseOp::Put(self.put(p)),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.delete_range(d)),
                // A nested txn's own header carries no revision in etcd; only the outer one does.
                RequestOp::Txn(nested) => ResponseOp::Txn(self.txn(nested, path, cursor)),
            };
            responses.push(resp);
        }
        TxnResponse {
            revision: 0,
            succeeded,
            responses,
        }
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
                let history = &self.keys[record.key()];
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

fn visible_at(history: &[Version], rev: i64) -> Option<&KeyValue> {
    let newer = history.partition_point(|v| v.rev.main <= rev);
    history.get(newer.checked_sub(1)?)?.kv.as_ref()
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

fn compare_by(target: SortTarget, a: &KeyValue, b: &KeyValue) -> std::cmp::Ordering {
    match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::Create => a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    }
}

fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let ord = match &c.target {
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::Create(v) => kv.create_revision.cmp(v),
        CompareTarget::Mod(v) => kv.mod_revision.cmp(v),
        CompareTarget::Value(v) => kv.value.as_slice().cmp(v.as_slice()),
        CompareTarget::Lease(v) => LeaseId::to_wire(kv.lease).cmp(v),
    };
    match c.result {
        CompareResult::Equal => ord.is_eq(),
        CompareResult::NotEqual => ord.is_ne(),
        CompareResult::Greater => ord.is_gt(),
        CompareResult::Less => ord.is_lt(),
    }
}
