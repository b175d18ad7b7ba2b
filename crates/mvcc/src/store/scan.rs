//! Range reads in steps. A [`RangeScan`] reads one range at one revision, a bounded number of
//! keys per [`Store::range_step`], so that whoever guards the store can let it go between steps
//! and writes can go on meanwhile. A write between two steps adds versions above the scan's
//! revision, which the scan does not see; only a compaction past that revision can remove what
//! it reads, and the next step then answers [`Error::Compacted`] rather than a mixed result. (A
//! store replaced by an installed snapshot is the same history from a later point on: it holds
//! the scan's revision whole unless it was compacted past it, which the same check sees.)
//!
//! A whole [`Store::range`] is one scan taken in a single step, so there is one read path.
//!
//! Values the store released are read back from the file, which is slow beside a walk of the
//! index; a scan in key order leaves them for [`RangeScan::finish`], which the guard need not
//! cover. The step that ends the scan opens the reader under the guard: the rows it sees then
//! hold every value the scan picked, since each was durable before it was released and nothing
//! was compacted past the scan's revision (the step checked), and what is written or compacted
//! after does not change them.

use bytes::Bytes;
use std::cmp::Ordering;
use std::ops::Bound;

use super::{Found, Store, check_read_revision, compare_by, key_bounds, visible_at};
use crate::error::Error;
use crate::types::{Event, KeyValue, RangeRequest, RangeResponse, Revision, SortOrder, SortTarget};
use crate::values::{ReadBack, ValueReader};

/// How much one step may do: look at `keys` keys (visible at the scan's revision or not), or copy
/// about `bytes` bytes of keys and values, whichever comes first. A step always looks at one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanBudget {
    pub keys: usize,
    pub bytes: usize,
}

impl ScanBudget {
    /// The whole range in one step.
    pub const UNBOUNDED: ScanBudget = ScanBudget {
        keys: usize::MAX,
        bytes: usize::MAX,
    };
}

/// A range read under way: the request, the revision it reads at, where it stopped, and what it
/// has picked so far (in key order, or partly sorted when the request sorts with a limit).
#[derive(Debug)]
pub struct RangeScan {
    req: RangeRequest,
    /// The revision read at.
    at: i64,
    /// The store's revision when the scan began: what the response's header carries.
    header: i64,
    /// Where the next step starts; `None` once every key of the range has been looked at.
    resume: Option<Bound<Vec<u8>>>,
    /// The request's order, with etcd's defaults applied (`None`: key order, nothing to sort).
    order: SortOrder,
    /// How many results are enough to answer: the limit and one more (to know `more`), or all.
    keep: usize,
    /// Keys visible at `at` (before the revision filters and the limit), as etcd counts.
    count: i64,
    picked: Vec<KeyValue>,
    /// Values picked without their value, which the store had released: the place in `picked`
    /// and the version's revision, in key order. Only a scan in key order leaves them (nothing
    /// reorders `picked`), for [`RangeScan::finish`] to read back.
    deferred: Vec<(usize, Revision)>,
    /// Opened by the step that ended the scan, when `deferred` is not empty.
    reader: Option<DeferredReader>,
}

/// The reader [`RangeScan::finish`] reads deferred values with.
struct DeferredReader(Box<dyn ValueReader + Send>);

impl std::fmt::Debug for DeferredReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeferredReader")
    }
}

impl RangeScan {
    /// Whether every key of the range has been looked at.
    pub fn is_done(&self) -> bool {
        self.resume.is_none()
    }

    /// The revision the scan reads at.
    pub fn revision(&self) -> i64 {
        self.at
    }

    /// Whether the request's revision filters let `version` through.
    fn wanted(&self, mod_revision: i64, create_revision: i64) -> bool {
        let r = &self.req;
        (r.max_mod_revision == 0 || mod_revision <= r.max_mod_revision)
            && (r.min_mod_revision == 0 || mod_revision >= r.min_mod_revision)
            && (r.min_create_revision == 0 || create_revision >= r.min_create_revision)
            && (r.max_create_revision == 0 || create_revision <= r.max_create_revision)
    }

    /// The sort's comparison, in the request's direction. Stable sorts with it keep equal
    /// targets in key order both ways, as etcd's sort does on small inputs.
    fn ordering(&self, a: Ordering) -> Ordering {
        if self.order == SortOrder::Descend {
            a.reverse()
        } else {
            a
        }
    }

    /// Adds one step's finds (in key order, all after what was picked before), with their
    /// values read back from `values` where released.
    fn pick(&mut self, mut found: Vec<Found<'_>>, values: &mut ReadBack<'_>) -> Result<(), Error> {
        let sorting = self.order != SortOrder::None;
        let target = self.req.sort_target;
        // Sorting in place compares values held in memory; a past revision's may be released,
        // so a sort by value sorts what was copied instead.
        if sorting && target != SortTarget::Value && found.len() > self.keep {
            // Only the best `keep` of this step can be among the best of all: sort the finds in
            // place and copy those alone.
            found.sort_by(|a, b| self.ordering(compare_by(target, a, b)));
            found.truncate(self.keep);
        }
        // A sort by value needs the values even when only keys are returned.
        let with_value = !self.req.keys_only || (sorting && target == SortTarget::Value);
        for f in found {
            if with_value && !sorting && f.version.is_released() {
                self.deferred.push((self.picked.len(), f.version.rev));
                self.picked.push(f.to_kv(false, values)?);
            } else {
                self.picked.push(f.to_kv(with_value, values)?);
            }
        }
        if sorting && self.picked.len() > self.keep.saturating_mul(2) {
            self.sort_picked();
            self.picked.truncate(self.keep);
        }
        Ok(())
    }

    fn sort_picked(&mut self) {
        let target = self.req.sort_target;
        let mut picked = std::mem::take(&mut self.picked);
        picked.sort_by(|a, b| self.ordering(compare_kvs(target, a, b)));
        self.picked = picked;
    }

    /// The response, once the scan is done (what was picked, sorted and cut to the limit), with
    /// the released values it returns read back. Needs no access to the store: whoever guards it
    /// may have let it go. [`Error::Unreadable`] when a released value could not be read back.
    pub fn finish(mut self) -> Result<RangeResponse, Error> {
        debug_assert!(self.is_done(), "a scan finished before its last step");
        if self.order != SortOrder::None {
            self.sort_picked();
        }
        let mut more = false;
        if let Ok(limit) = usize::try_from(self.req.limit)
            && limit > 0
            && self.picked.len() > limit
        {
            self.picked.truncate(limit);
            more = true;
        }
        if self.req.keys_only {
            for kv in &mut self.picked {
                kv.value = Bytes::new();
            }
        }
        let returned = self.picked.len();
        self.deferred.retain(|(at, _)| *at < returned);
        if !self.deferred.is_empty() {
            let reader = &mut self
                .reader
                .as_mut()
                .ok_or_else(|| {
                    Error::Unreadable("a scan with released values ended with no reader".into())
                })?
                .0;
            // In revision order, the rows' own ([`ValueReader::read`]).
            self.deferred.sort_unstable_by_key(|(_, rev)| *rev);
            for &(at, rev) in &self.deferred {
                self.picked[at].value = reader.read(rev).map_err(Error::Unreadable)?;
            }
        }
        Ok(RangeResponse {
            revision: self.header,
            kvs: self.picked,
            more,
            count: self.count,
        })
    }
}

impl Store {
    /// Starts a read of `req` at `req.revision` (or the current one), checking the revision
    /// now; [`Store::range_step`] then reads it.
    pub fn range_scan(&self, req: RangeRequest) -> Result<RangeScan, Error> {
        check_read_revision(req.revision, self.current_revision, self.compact_revision)?;
        Ok(self.scan_at(req, self.current_revision))
    }

    /// A scan with `view` as the newest visible revision; the revision bounds are already
    /// checked.
    pub(super) fn scan_at(&self, req: RangeRequest, view: i64) -> RangeScan {
        let at = if req.revision <= 0 {
            view
        } else {
            req.revision
        };
        let mut order = req.sort_order;
        if req.sort_target != SortTarget::Key && order == SortOrder::None {
            // Results come in key order; any other target is sorted ascending by default.
            order = SortOrder::Ascend;
        } else if req.sort_target == SortTarget::Key && order == SortOrder::Ascend {
            order = SortOrder::None;
        }
        let keep = match usize::try_from(req.limit) {
            // One past the limit is enough to know whether there is more.
            Ok(limit) if limit > 0 => limit.saturating_add(1),
            _ => usize::MAX,
        };
        let resume = key_bounds(&req.key, &req.range_end).map(|(start, _)| match start {
            Bound::Included(k) => Bound::Included(k.to_vec()),
            Bound::Excluded(k) => Bound::Excluded(k.to_vec()),
            Bound::Unbounded => Bound::Unbounded,
        });
        RangeScan {
            req,
            at,
            header: view,
            resume,
            order,
            keep,
            count: 0,
            picked: Vec::new(),
            deferred: Vec::new(),
            reader: None,
        }
    }

    /// Reads the next part of `scan`, within `budget`; whether the scan is now done.
    /// [`Error::Compacted`] when the store no longer holds the scan's revision whole (it was
    /// compacted past it since the scan began): the scan cannot go on.
    pub fn range_step(&self, scan: &mut RangeScan, budget: ScanBudget) -> Result<bool, Error> {
        if scan.resume.is_none() {
            return Ok(true);
        }
        // (The scan is left as it was: an error never makes it look done.)
        if self.compact_revision > scan.at {
            return Err(Error::Compacted);
        }
        let Some(resume) = scan.resume.clone() else {
            return Ok(true);
        };
        let Some((_, end)) = key_bounds(&scan.req.key, &scan.req.range_end) else {
            return Ok(true);
        };
        let start = match &resume {
            Bound::Included(k) => Bound::Included(k.as_slice()),
            Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let (mut looked, mut bytes) = (0usize, 0usize);
        let mut last: Option<&[u8]> = None;
        let mut found = Vec::new();
        let mut stopped_early = false;
        let enough_unsorted = scan.order == SortOrder::None;
        for (key, history) in self.keys.range::<[u8], _>((start, end)) {
            if looked > 0 && (looked >= budget.keys || bytes >= budget.bytes) {
                stopped_early = true;
                break;
            }
            looked += 1;
            last = Some(key);
            let Some(version) = visible_at(history.as_slice(), scan.at) else {
                continue;
            };
            scan.count += 1;
            if scan.req.count_only
                || !scan.wanted(version.rev.main, version.create_revision)
                || (enough_unsorted && scan.picked.len() + found.len() >= scan.keep)
            {
                continue;
            }
            bytes =
                bytes.saturating_add(key.len() + version.value.as_deref().map_or(0, <[u8]>::len));
            found.push(Found { key, version });
        }
        let (count, picked, deferred) = (scan.count, scan.picked.len(), scan.deferred.len());
        let mut values = ReadBack::new(&*self.values);
        let picking = scan.pick(found, &mut values).and_then(|()| {
            if !stopped_early && !scan.deferred.is_empty() {
                // The last step: the rows as they stand now hold every deferred value.
                scan.reader = Some(DeferredReader(values.open()?));
            }
            Ok(())
        });
        if let Err(e) = picking {
            // As it was before the step, which can be taken again.
            scan.count = count;
            scan.picked.truncate(picked);
            scan.deferred.truncate(deferred);
            return Err(e);
        }
        scan.resume = if stopped_early {
            last.map(|k| Bound::Excluded(k.to_vec()))
        } else {
            None
        };
        Ok(scan.is_done())
    }
}

fn compare_kvs(target: SortTarget, a: &KeyValue, b: &KeyValue) -> Ordering {
    match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::Create => a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    }
}

/// A half-open key span `[start, end)`; no end: to the end of the key space.
type Span = (Vec<u8>, Option<Vec<u8>>);

/// Which events a history read returns: those of keys in some of the given ranges (every key,
/// unless narrowed), each with its key's previous version (`prev_kv`) only when asked. A watch
/// stream reads for its own watchers: what it would drop is never copied, nor read back from the
/// file if released.
#[derive(Clone, Debug)]
pub struct EventsFilter {
    /// Disjoint half-open key spans `[start, end)` in key order (`None`: to the end of the key
    /// space); `None` for every key.
    spans: Option<Vec<Span>>,
    prev_kv: bool,
}

impl EventsFilter {
    /// Every key's events, each with its previous version.
    pub fn everything() -> EventsFilter {
        EventsFilter {
            spans: None,
            prev_kv: true,
        }
    }

    /// The events of keys in any of `ranges` (etcd's key and range end: see
    /// [`crate::key_in_range`]), with their previous versions if `prev_kv`.
    pub fn keys<'r>(
        ranges: impl IntoIterator<Item = (&'r [u8], &'r [u8])>,
        prev_kv: bool,
    ) -> EventsFilter {
        let mut spans: Vec<Span> = ranges
            .into_iter()
            .filter_map(|(key, range_end)| {
                let end = match key_bounds(key, range_end)?.1 {
                    // The key alone: up to the key right after it.
                    Bound::Included(k) => Some([k, &[0][..]].concat()),
                    Bound::Excluded(end) => Some(end.to_vec()),
                    Bound::Unbounded => None,
                };
                Some((key.to_vec(), end))
            })
            .collect();
        spans.sort();
        let mut merged: Vec<Span> = Vec::with_capacity(spans.len());
        for (start, end) in spans {
            match merged.last_mut() {
                // Overlapping or touching the one before: one span.
                Some((_, last_end)) if last_end.as_ref().is_none_or(|e| start <= *e) => {
                    if let (Some(last), Some(end)) = (last_end.as_ref(), end.as_ref()) {
                        if end > last {
                            *last_end = Some(end.clone());
                        }
                    } else {
                        *last_end = None;
                    }
                }
                _ => merged.push((start, end)),
            }
        }
        EventsFilter {
            spans: Some(merged),
            prev_kv,
        }
    }

    /// Whether `key`'s events are wanted.
    pub fn wants(&self, key: &[u8]) -> bool {
        let Some(spans) = &self.spans else {
            return true;
        };
        let after = spans.partition_point(|(start, _)| start.as_slice() <= key);
        after > 0
            && spans[after - 1]
                .1
                .as_ref()
                .is_none_or(|end| key < end.as_slice())
    }
}

/// Watch history read in steps, as [`RangeScan`] reads a range: the events of revisions
/// `from..=to`, in revision order, up to `revisions_max` distinct revisions (of the events its
/// [`EventsFilter`] lets through).
#[derive(Clone, Debug)]
pub struct EventsScan {
    /// The next change to read; `None` once done.
    next: Option<Revision>,
    to: i64,
    revisions_max: usize,
    /// The store's compaction point when the scan began.
    compacted: i64,
    /// Distinct revisions read so far, and the last one.
    revisions: usize,
    last_main: Option<i64>,
    events: Vec<Event>,
    filter: EventsFilter,
}

impl EventsScan {
    pub fn is_done(&self) -> bool {
        self.next.is_none()
    }

    /// The scan, reading only what `filter` lets through.
    pub fn with_filter(self, filter: EventsFilter) -> EventsScan {
        EventsScan { filter, ..self }
    }

    /// The events read, once the scan is done.
    pub fn finish(self) -> Vec<Event> {
        debug_assert!(self.is_done(), "a scan finished before its last step");
        self.events
    }
}

impl Store {
    /// Starts a read of the watch history of revisions `from..=to` (at most `revisions_max`
    /// distinct ones). `compacted` is the compaction point the caller saw when it chose `from`
    /// (not below it): a compaction since then that reaches `from` is seen by the first step.
    pub fn events_scan(
        &self,
        from: i64,
        to: i64,
        revisions_max: usize,
        compacted: i64,
    ) -> EventsScan {
        EventsScan {
            next: Some(Revision { main: from, sub: 0 }),
            to,
            revisions_max,
            compacted,
            revisions: 0,
            last_main: None,
            events: Vec::new(),
            filter: EventsFilter::everything(),
        }
    }

    /// Reads the next part of `scan`, within `budget` (changes looked at, bytes of keys and
    /// values copied); whether the scan is now done. [`Error::Compacted`] when the history it
    /// has yet to read was compacted since it began.
    pub fn events_step(&self, scan: &mut EventsScan, budget: ScanBudget) -> Result<bool, Error> {
        let Some(next) = scan.next else {
            return Ok(true);
        };
        // A compaction removes the changes below its revision, and the deletes at it. (The
        // scan is left as it was: an error never makes it look done.)
        if self.compact_revision != scan.compacted && self.compact_revision >= next.main {
            return Err(Error::Compacted);
        }
        scan.next = None;
        let start = self.by_revision.partition_point(|(rev, _)| *rev < next);
        let mut values = ReadBack::new(&*self.values);
        let (mut looked, mut bytes) = (0usize, 0usize);
        for (rev, key) in self.by_revision.range(start..) {
            // The scan's own ends first, so that a part that ends at the budget and at the end
            // of the scan leaves nothing for another step.
            if rev.main > scan.to {
                break;
            }
            // A change the filter drops counts toward the step's budget (it was looked at) and
            // toward nothing else.
            let wanted = scan.filter.wants(key);
            let new_revision = wanted && scan.last_main != Some(rev.main);
            if new_revision && scan.revisions == scan.revisions_max {
                break;
            }
            if looked > 0 && (looked >= budget.keys || bytes >= budget.bytes) {
                scan.next = Some(*rev);
                break;
            }
            looked += 1;
            if !wanted {
                continue;
            }
            if new_revision {
                scan.revisions += 1;
                scan.last_main = Some(rev.main);
            }
            let event = match self.event_at(*rev, key, scan.filter.prev_kv, &mut values) {
                Ok(event) => event,
                Err(e) => {
                    // The step can be taken again from this change.
                    scan.next = Some(*rev);
                    return Err(e);
                }
            };
            bytes = bytes.saturating_add(
                event.kv.key.len()
                    + event.kv.value.len()
                    + event.prev_kv.as_ref().map_or(0, |p| p.value.len()),
            );
            scan.events.push(event);
        }
        Ok(scan.is_done())
    }
}
