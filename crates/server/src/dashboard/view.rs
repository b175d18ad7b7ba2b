//! What the dashboard shows, computed from one member's applied state: pure functions of the
//! store, the lease table and the lease time, each copying a bounded part of the state (they run
//! under the state lock, so nothing here may walk the whole table unless the walk is bounded by
//! the caller: see [`scan_queue_names`]).
//!
//! The rule by which locks and elections are found: a key attached to a lease whose last path
//! segment is that lease's id in lowercase hex (Go's `%x`, as etcd's recipes and leasehold's
//! `v3lock`/`v3election` write it) is a queue key, and what comes before `/<hex>` is the queue's
//! name. The queue is then every key under `<name>/`, by create revision, as the recipes read
//! it: the first is the holder (or leader), the rest wait in that order. A queue whose holder has
//! an empty value is shown as a lock; one with a value is an election (the value is the leader's
//! proclamation). The two recipes lay out their keys alike, so nothing else tells them apart.

use std::collections::BTreeSet;

use leasehold_mvcc::{self as mvcc, RangeRequest, SortOrder, SortTarget, Store};
use leasehold_raft::{EndedLease, LeaseEnd, LeaseId, LeaseTable, LeaseView};
use serde_json::{Value, json};

use crate::recipe;

/// Leases on a page when the query names no `limit`.
pub(crate) const PAGE_LEN_DEFAULT: usize = 200;
/// The largest `limit` a query may ask for.
pub(crate) const PAGE_LEN_MAX: usize = 1_000;
/// The largest `offset`: walking to it costs one step per lease skipped, under the state lock.
pub(crate) const PAGE_OFFSET_MAX: usize = 10_000;
/// Keys listed per lease (the row says how many there are in all).
pub(crate) const LEASE_KEYS_SHOWN_MAX: usize = 5;
/// Bytes of a key or value shown; longer ones are cut and marked.
pub(crate) const BYTES_SHOWN_MAX: usize = 256;
/// The chart's buckets: one second each, the next 60 s.
pub(crate) const HISTOGRAM_BUCKET_MS: u64 = 1_000;
pub(crate) const HISTOGRAM_BUCKETS_LEN: usize = 60;
/// Queue names collected per scan; beyond it the page says there are more.
pub(crate) const QUEUE_NAMES_MAX: usize = 1_000;
/// Queues (locks and elections together) read in detail, first by name.
pub(crate) const QUEUES_SHOWN_MAX: usize = 100;
/// Waiters listed per queue (the row says how many wait in all).
pub(crate) const WAITERS_SHOWN_MAX: usize = 20;

/// What one page view asks for, from its query string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Query {
    /// Leases skipped, in deadline order.
    pub offset: usize,
    pub limit: usize,
    /// Show only this lease.
    pub lease: Option<LeaseId>,
    /// Show values (elections' proclamations).
    pub values: bool,
}

impl Default for Query {
    fn default() -> Query {
        Query {
            offset: 0,
            limit: PAGE_LEN_DEFAULT,
            lease: None,
            values: false,
        }
    }
}

impl Query {
    /// Parses `offset=N&limit=N&lease=HEX&values=1`; unknown names are ignored (so a later page
    /// may add some), bad values are refused with why.
    pub(crate) fn parse(raw: Option<&str>) -> Result<Query, String> {
        let mut query = Query::default();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "offset" => {
                    query.offset = parse_count(name, value, PAGE_OFFSET_MAX)?;
                }
                "limit" => {
                    query.limit = parse_count(name, value, PAGE_LEN_MAX)?;
                    if query.limit == 0 {
                        return Err("limit must be at least 1".to_owned());
                    }
                }
                "lease" if value.is_empty() => query.lease = None,
                "lease" => query.lease = Some(parse_lease_hex(value)?),
                "values" => {
                    query.values = match value {
                        "1" | "true" | "" => true,
                        "0" | "false" => false,
                        _ => return Err(format!("values must be 1 or 0, not {value:?}")),
                    }
                }
                _ => {}
            }
        }
        Ok(query)
    }

    /// Whether this view's lease page is the one every default view shares.
    pub(crate) fn is_first_page(&self) -> bool {
        self.offset == 0 && self.limit == PAGE_LEN_DEFAULT && self.lease.is_none()
    }
}

fn parse_count(name: &str, value: &str, max: usize) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        Ok(_) => Err(format!("{name} must be at most {max}")),
        Err(_) => Err(format!("{name} must be a number, not {value:?}")),
    }
}

/// A lease id as etcdctl takes one: hexadecimal (an optional `0x`), a minus sign allowed.
pub(crate) fn parse_lease_hex(text: &str) -> Result<LeaseId, String> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let digits = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
        .unwrap_or(digits);
    let bad = || format!("lease must be a lease id in hex, as etcdctl prints it, not {text:?}");
    if digits.is_empty() || digits.len() > 16 {
        return Err(bad());
    }
    let magnitude = u64::from_str_radix(digits, 16).map_err(|_| bad())?;
    let id = if negative {
        0i64.checked_sub_unsigned(magnitude).ok_or_else(bad)?
    } else {
        i64::try_from(magnitude).map_err(|_| bad())?
    };
    LeaseId::from_wire(id).ok_or_else(bad)
}

/// A lease id as etcdctl prints it (`%016x` of the int64).
pub(crate) fn lease_hex(id: LeaseId) -> String {
    let n = id.get();
    if n < 0 {
        format!("-{:015x}", n.unsigned_abs())
    } else {
        format!("{n:016x}")
    }
}

/// Bytes as the page shows them: UTF-8 (lossy), cut at [`BYTES_SHOWN_MAX`].
fn shown(bytes: &[u8]) -> Value {
    let cut = &bytes[..bytes.len().min(BYTES_SHOWN_MAX)];
    let text = String::from_utf8_lossy(cut);
    if cut.len() < bytes.len() {
        Value::from(format!("{text}…"))
    } else {
        Value::from(text)
    }
}

/// A lease's row on the page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseRow {
    pub id: LeaseId,
    pub ttl_secs: i64,
    pub deadline_ms: u64,
    /// The first [`LEASE_KEYS_SHOWN_MAX`] keys, in key order.
    pub keys: Vec<Vec<u8>>,
    pub keys_len: usize,
}

impl LeaseRow {
    fn of(view: LeaseView<'_>) -> LeaseRow {
        LeaseRow {
            id: view.id,
            ttl_secs: view.record.ttl_secs,
            deadline_ms: view.record.deadline_ms,
            keys: view
                .keys()
                .take(LEASE_KEYS_SHOWN_MAX)
                .map(<[u8]>::to_vec)
                .collect(),
            keys_len: view.keys_len(),
        }
    }

    /// `now_ms` is the lease time the page counts down from; `age_ms` how long ago it was read.
    fn to_json(&self, now_ms: u64, age_ms: u64) -> Value {
        let left = i128::from(self.deadline_ms) - i128::from(now_ms) - i128::from(age_ms);
        json!({
            "id": lease_hex(self.id),
            "id_dec": self.id.get().to_string(),
            "ttl": self.ttl_secs,
            "remaining_ms": i64::try_from(left).unwrap_or(i64::MAX),
            "keys": self.keys.iter().map(|k| shown(k)).collect::<Vec<_>>(),
            "keys_total": self.keys_len,
        })
    }
}

/// One page of the lease table, soonest deadline first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeasePage {
    pub offset: usize,
    pub limit: usize,
    pub search: Option<LeaseId>,
    /// Leases the page is a part of: all of them, or 0 or 1 for a search.
    pub total: usize,
    pub rows: Vec<LeaseRow>,
}

impl LeasePage {
    fn to_json(&self, now_ms: u64, age_ms: u64) -> Value {
        json!({
            "offset": self.offset,
            "limit": self.limit,
            "search": self.search.map(lease_hex),
            "total": self.total,
            "rows": self.rows.iter().map(|r| r.to_json(now_ms, age_ms)).collect::<Vec<_>>(),
        })
    }
}

/// The page `query` asks for. Costs `offset + limit` steps of the expiry queue (or one lookup
/// for a search).
pub(crate) fn lease_page(leases: &LeaseTable, query: &Query) -> LeasePage {
    let (total, rows) = match query.lease {
        Some(id) => {
            let rows: Vec<LeaseRow> = leases.view(id).map(LeaseRow::of).into_iter().collect();
            (rows.len(), rows)
        }
        None => (
            leases.len(),
            leases
                .iter_by_deadline()
                .skip(query.offset)
                .take(query.limit)
                .map(LeaseRow::of)
                .collect(),
        ),
    };
    debug_assert!(rows.len() <= query.limit.max(1));
    LeasePage {
        offset: query.offset,
        limit: query.limit,
        search: query.lease,
        total,
        rows,
    }
}

/// How many leases expire in each of the next [`HISTOGRAM_BUCKETS_LEN`] seconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Histogram {
    /// Past their deadline, not yet revoked (the leader revokes them a moment later; on a
    /// follower, until it applies the revoke).
    pub overdue: usize,
    /// `buckets[i]`: deadlines in `[now + i s, now + (i + 1) s)`.
    pub buckets: [usize; HISTOGRAM_BUCKETS_LEN],
    /// Beyond the last bucket.
    pub later: usize,
}

/// Costs one step per lease due within the chart's 60 s (at most every lease).
pub(crate) fn histogram(leases: &LeaseTable, now_ms: u64) -> Histogram {
    let span_ms = HISTOGRAM_BUCKET_MS * HISTOGRAM_BUCKETS_LEN as u64;
    let mut histogram = Histogram {
        overdue: 0,
        buckets: [0; HISTOGRAM_BUCKETS_LEN],
        later: 0,
    };
    let mut counted = 0;
    for deadline_ms in leases.deadlines_until(now_ms.saturating_add(span_ms - 1)) {
        counted += 1;
        // Due at `now_ms` counts as expired, as `LeaseTable::expired` counts it.
        if deadline_ms <= now_ms {
            histogram.overdue += 1;
        } else {
            let bucket = (deadline_ms - now_ms) / HISTOGRAM_BUCKET_MS;
            let bucket = usize::try_from(bucket).unwrap_or(usize::MAX);
            histogram.buckets[bucket.min(HISTOGRAM_BUCKETS_LEN - 1)] += 1;
        }
    }
    histogram.later = leases.len() - counted;
    debug_assert_eq!(
        histogram.overdue + histogram.buckets.iter().sum::<usize>() + histogram.later,
        leases.len()
    );
    histogram
}

impl Histogram {
    fn to_json(&self) -> Value {
        json!({
            "bucket_ms": HISTOGRAM_BUCKET_MS,
            "overdue": self.overdue,
            "buckets": self.buckets.to_vec(),
            "later": self.later,
        })
    }
}

/// The queue name `key` stands for, if it is a queue key of `lease` (see the module's rule).
#[cfg(test)]
pub(crate) fn queue_name(key: &[u8], lease: LeaseId) -> Option<&[u8]> {
    queue_name_with(key, &recipe::lease_key(b"/", lease))
}

/// [`queue_name`] with the lease's `/<hex>` suffix made once.
fn queue_name_with<'k>(key: &'k [u8], suffix: &[u8]) -> Option<&'k [u8]> {
    let name = key.strip_suffix(suffix)?;
    (!name.is_empty()).then_some(name)
}

/// One bounded step of the walk that finds queue names: visits leases after `after` in id order
/// until about `keys_max` keys were looked at, adding names to `names` (the first
/// [`QUEUE_NAMES_MAX`] + 1 by name: one more than shown tells the page there are more). Returns
/// where to go on from, or `None` once every lease was visited.
pub(crate) fn scan_queue_names(
    leases: &LeaseTable,
    after: Option<LeaseId>,
    keys_max: usize,
    names: &mut BTreeSet<Vec<u8>>,
) -> Option<LeaseId> {
    let mut visited = 0;
    let mut last = after;
    for view in leases.iter_by_id(after) {
        if visited >= keys_max {
            // Stopped before `view`: the next step starts after the last lease visited.
            return last;
        }
        visited += view.keys_len().max(1);
        last = Some(view.id);
        let suffix = recipe::lease_key(b"/", view.id);
        for key in view.keys() {
            if let Some(name) = queue_name_with(key, &suffix) {
                names.insert(name.to_vec());
            }
        }
        // Keep only the first QUEUE_NAMES_MAX + 1 names by name (one more than shown, so the
        // page can say there are more), so every scan shows the same ones.
        while names.len() > QUEUE_NAMES_MAX + 1 {
            names.pop_last();
        }
    }
    None
}

/// A queue key as the page shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QueueEntry {
    pub key: Vec<u8>,
    pub lease: Option<LeaseId>,
    /// The key's create revision: its place in the queue, and the holder's fencing token.
    pub create_revision: i64,
    /// At most [`BYTES_SHOWN_MAX`] bytes of the value.
    pub value: Vec<u8>,
    pub value_len: usize,
}

impl QueueEntry {
    fn of(kv: mvcc::KeyValue) -> QueueEntry {
        let value_len = kv.value.len();
        let value = kv.value[..value_len.min(BYTES_SHOWN_MAX)].to_vec();
        QueueEntry {
            key: kv.key,
            lease: kv.lease,
            create_revision: kv.create_revision,
            value,
            value_len,
        }
    }

    fn to_json(&self, values: bool) -> Value {
        let value = if values {
            let text = String::from_utf8_lossy(&self.value);
            if self.value.len() < self.value_len {
                Value::from(format!("{text}…"))
            } else {
                Value::from(text)
            }
        } else {
            Value::Null
        };
        json!({
            "key": shown(&self.key),
            "lease": self.lease.map(lease_hex),
            "revision": self.create_revision,
            "value": value,
            "value_bytes": self.value_len,
        })
    }
}

/// A lock or an election: every key under `<name>/`, by create revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Queue {
    pub name: Vec<u8>,
    pub holder: QueueEntry,
    /// The first [`WAITERS_SHOWN_MAX`] waiters, in the order they will be served.
    pub waiters: Vec<QueueEntry>,
    pub waiters_len: usize,
}

impl Queue {
    /// Whether this queue is an election (its leader proclaimed a value) rather than a lock.
    pub(crate) fn is_election(&self) -> bool {
        self.holder.value_len > 0
    }

    fn to_json(&self, values: bool) -> Value {
        json!({
            "name": shown(&self.name),
            "holder": self.holder.to_json(values),
            "waiters": self.waiters.iter().map(|w| w.to_json(values)).collect::<Vec<_>>(),
            "waiters_total": self.waiters_len,
        })
    }
}

/// The queue under `<name>/` (none if it emptied since its name was found). Costs one range of
/// the keys under the prefix.
pub(crate) fn queue(store: &Store, name: &[u8]) -> Option<Queue> {
    let prefix = recipe::queue_prefix(name);
    let found = store
        .range(&RangeRequest {
            range_end: mvcc::prefix_range_end(&prefix),
            key: prefix,
            limit: i64::try_from(WAITERS_SHOWN_MAX + 1).unwrap_or(i64::MAX),
            sort_order: SortOrder::Ascend,
            sort_target: SortTarget::Create,
            ..RangeRequest::default()
        })
        .ok()?;
    let total = usize::try_from(found.count).unwrap_or(0);
    let mut entries = found.kvs.into_iter().map(QueueEntry::of);
    let holder = entries.next()?;
    let waiters: Vec<QueueEntry> = entries.collect();
    debug_assert!(
        waiters
            .windows(2)
            .all(|w| w[0].create_revision < w[1].create_revision)
    );
    Some(Queue {
        name: name.to_vec(),
        holder,
        waiters,
        waiters_len: total.saturating_sub(1),
    })
}

/// A recent expiry or revocation as the page shows it.
pub(crate) fn ended_to_json(ended: &EndedLease, now_ms: u64, age_ms: u64) -> Value {
    json!({
        "id": lease_hex(ended.id),
        "id_dec": ended.id.get().to_string(),
        "how": match ended.end {
            LeaseEnd::Revoked => "revoked",
            LeaseEnd::Expired => "expired",
        },
        "ttl": ended.ttl_secs,
        "ago_ms": now_ms.saturating_sub(ended.at_ms).saturating_add(age_ms),
        "keys": ended.keys,
    })
}

/// What every view shares, computed once per update for all of them.
#[derive(Clone, Debug)]
pub(crate) struct Summary {
    pub revision: i64,
    /// The lease time this was computed at, and when (this process's monotonic clock).
    pub now_ms: u64,
    pub at: std::time::Instant,
    pub leases_len: usize,
    pub histogram: Histogram,
    /// The first page with the default query, which most views show.
    pub first_page: LeasePage,
    pub queues: Vec<Queue>,
    /// Queue names found (at most [`QUEUE_NAMES_MAX`]) and whether there were more.
    pub queue_names_len: usize,
    pub queue_names_more: bool,
    pub recent: Vec<EndedLease>,
    /// This member and the cluster as the member sees it, already in the page's shape.
    pub members: Value,
}

/// The parts of a [`Summary`] read in one go under the state lock (the queue scan is not: it is
/// walked in bounded steps and its queues read afterwards).
pub(crate) fn lease_parts(
    store: &Store,
    leases: &LeaseTable,
    now_ms: u64,
) -> (i64, usize, Histogram, LeasePage, Vec<EndedLease>) {
    (
        store.current_revision(),
        leases.len(),
        histogram(leases, now_ms),
        lease_page(leases, &Query::default()),
        leases.recent_ends().copied().collect(),
    )
}

impl Summary {
    /// The page's JSON for one view: the shared parts, `page` (the view's own lease page) and
    /// values only if the view asked.
    pub(crate) fn to_json(&self, page: &LeasePage, values: bool) -> String {
        let age_ms = u64::try_from(self.at.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (elections, locks): (Vec<&Queue>, Vec<&Queue>) =
            self.queues.iter().partition(|q| q.is_election());
        json!({
            "revision": self.revision,
            "members": self.members,
            "leases": {
                "total": self.leases_len,
                "histogram": self.histogram.to_json(),
                "page": page.to_json(self.now_ms, age_ms),
            },
            "locks": locks.iter().map(|q| q.to_json(values)).collect::<Vec<_>>(),
            "elections": elections.iter().map(|q| q.to_json(values)).collect::<Vec<_>>(),
            "queues_found": self.queue_names_len,
            "queues_more": self.queue_names_more,
            "queues_shown_max": QUEUES_SHOWN_MAX,
            "recent": self
                .recent
                .iter()
                .map(|e| ended_to_json(e, self.now_ms, age_ms))
                .collect::<Vec<_>>(),
            "values": values,
        })
        .to_string()
    }
}
