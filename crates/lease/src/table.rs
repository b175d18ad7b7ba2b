//! The replicated lease table.
//!
//! Invariants (checked by [`LeaseTable::validate`]):
//! - the expiry queue holds exactly one entry per lease, at its current deadline;
//! - no key is in two leases' key sets (which lease a key names is the KV store's to say; the
//!   caller moves a key with [`LeaseTable::detach`] and [`LeaseTable::attach`]);
//! - a renewal never moves a deadline earlier;
//! - every lease's told deadline is at most its deadline (its cover), and at most
//!   [`LeaseTable::cover_margin_max_ms`] before it.
//!
//! Two deadlines per lease (docs/lease.md, "Renewals"):
//! - the **deadline** (`LeaseRecord::deadline_ms`, the *cover*) is replicated and persisted: no
//!   member ends the lease before it, and a new leader inherits it;
//! - the **told** deadline is the latest deadline a holder was told, at most the cover. Applied
//!   renewals set it on every member; the leader also moves it in memory, without a log write,
//!   for a renewal its cover already covers ([`LeaseTable::renew_in_memory`]). It is not
//!   persisted: a restart or a new leader starts it at the cover, so a dead holder's lease then
//!   lives at most one margin longer than it was told.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use leasehold_types::{Key, LeaseId};
use serde::{Deserialize, Serialize};

/// What is persisted of a lease (its keys are rebuilt from the KV store).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The granted TTL, after clamping.
    pub ttl_secs: i64,
    /// When it expires, on the lease clock.
    pub deadline_ms: u64,
    /// Grant order: breaks ties between equal deadlines, as etcd lists leases in grant order.
    pub grant_seq: u64,
}

/// After a promotion, at most this many inherited leases expire in any one second of lease time
/// (etcd spreads a pile-up to 750/s; the rest of the time leasehold revokes without a cap).
///
/// Set from what leasehold can revoke: `leasehold bench expiry-storm --aligned` with 400,000
/// leases, one key each, all due in the same second, revoked them at 176,000/s on a 2-core
/// machine (a watch taking every delete, the load generator on the same cores; docs/bench.md).
/// 125,000/s stays below that, and spreads a pile-up of 1,000,000 inherited leases over 8 s: no
/// lease gets more than 8 s beyond what it had left plus the election timeout. (1,000/s, the
/// previous value, gave such a lease up to 1,000 s.)
pub const PROMOTION_EXPIRIES_PER_SEC_MAX: u64 = 125_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum LeaseError {
    #[error("etcdserver: requested lease not found")]
    NotFound,
    #[error("etcdserver: lease already exists")]
    Exists,
}

/// What a leader's renewal from memory found ([`LeaseTable::renew_in_memory`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryRenewal {
    /// Renewed for `ttl_secs`, within the cover; `slack_ms` is how much of the cover is left
    /// beyond the new told deadline (a small one asks for the cover to be extended).
    Renewed {
        ttl_secs: i64,
        slack_ms: u64,
    },
    NotFound,
    /// The deadline its holder was told has passed: the leader ends it (and answers TTL 0).
    /// `cover_ms` is its cover now, which the expiry names.
    Expired {
        cover_ms: u64,
    },
    /// The new deadline is beyond the cover: only a renewal through the log may give it.
    Uncovered,
}

/// The outcome of a renewal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Renewed for this many seconds.
    Renewed {
        ttl_secs: i64,
    },
    NotFound,
    /// Its deadline had passed: the caller revokes it (and answers TTL 0).
    Expired,
}

/// A lease as TimeToLive reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeToLive {
    /// Whole seconds left, truncated; 0 once the deadline has passed.
    pub remaining_secs: i64,
    pub granted_ttl_secs: i64,
    /// Attached keys, in key order.
    pub keys: Vec<Key>,
}

/// Event counts since this member started (for the metrics etcd exports).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub granted: u64,
    pub revoked: u64,
    pub renewed: u64,
    /// Revocations because the deadline passed (a subset of `revoked`).
    pub expired: u64,
}

/// How many ended leases [`LeaseTable::recent_ends`] remembers: enough for an operator's "what
/// just went", small enough that it costs nothing to keep on every member.
pub const RECENT_ENDS_LEN_MAX: usize = 32;

/// Why a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseEnd {
    /// Revoked by a client (`LeaseRevoke`).
    Revoked,
    /// Its deadline passed (an expiry, or a renewal that came too late).
    Expired,
}

/// A lease that ended, as [`LeaseTable::recent_ends`] remembers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndedLease {
    pub id: LeaseId,
    pub end: LeaseEnd,
    pub ttl_secs: i64,
    /// The lease time of the apply that ended it (the replicated clock then).
    pub at_ms: u64,
    /// How many keys it held (and so were deleted with it).
    pub keys: usize,
}

/// A lease with its keys, borrowed from the table: for readers that copy a bounded part of it.
#[derive(Clone, Copy, Debug)]
pub struct LeaseView<'t> {
    pub id: LeaseId,
    pub record: LeaseRecord,
    keys: &'t KeySet,
}

impl<'t> LeaseView<'t> {
    /// The attached keys, in key order.
    pub fn keys(&self) -> impl Iterator<Item = &'t [u8]> + 't {
        self.keys.iter().map(|k| &**k)
    }

    pub fn keys_len(&self) -> usize {
        self.keys.len()
    }
}

#[derive(Debug)]
struct Lease {
    record: LeaseRecord,
    keys: KeySet,
    /// The told deadline (see the module's doc): atomic, so that the leader's renewals from
    /// memory move it under the state's read lock (its caller serialises them with the expiry
    /// driver's decisions, `leasehold_raft::steps::LeaderRenewals`).
    told_ms: AtomicU64,
}

impl Clone for Lease {
    fn clone(&self) -> Lease {
        Lease {
            record: self.record,
            keys: self.keys.clone(),
            told_ms: AtomicU64::new(self.told()),
        }
    }
}

impl Lease {
    fn new(record: LeaseRecord) -> Lease {
        Lease {
            record,
            keys: KeySet::None,
            told_ms: AtomicU64::new(record.deadline_ms),
        }
    }

    fn told(&self) -> u64 {
        self.told_ms.load(Ordering::Relaxed)
    }

    fn set_told(&mut self, told_ms: u64) {
        *self.told_ms.get_mut() = told_ms.min(self.record.deadline_ms);
    }
}

/// A lease's attached keys. Most leases hold none or one (a lock, an election candidate, a
/// registration), so those take no allocation of their own: the one key is the KV store's shared
/// [`Key`].
#[derive(Clone, Debug, Default)]
enum KeySet {
    #[default]
    None,
    One(Key),
    /// Boxed, so that a lease with none or one key is no bigger for it (24 bytes, not 32).
    #[expect(
        clippy::box_collection,
        reason = "keeps the common one-key lease small"
    )]
    Many(Box<BTreeSet<Key>>),
}

// The sizes ARCHITECTURE.md states per lease (on 64-bit targets).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<KeySet>() == 24);
    assert!(size_of::<Lease>() == 56);
    assert!(size_of::<(LeaseId, Box<Lease>)>() == 16);
};

impl KeySet {
    fn insert(&mut self, key: Key) {
        match self {
            KeySet::None => *self = KeySet::One(key),
            KeySet::One(one) if *one == key => {}
            KeySet::One(_) => {
                let KeySet::One(one) = std::mem::take(self) else {
                    unreachable!("matched above")
                };
                *self = KeySet::Many(Box::new(BTreeSet::from([one, key])));
            }
            KeySet::Many(keys) => {
                keys.insert(key);
            }
        }
    }

    fn remove(&mut self, key: &[u8]) {
        match self {
            KeySet::None => {}
            KeySet::One(one) => {
                if **one == *key {
                    *self = KeySet::None;
                }
            }
            KeySet::Many(keys) => {
                keys.remove(key);
                if keys.len() == 1 {
                    let one = keys.pop_first().expect("one left");
                    *self = KeySet::One(one);
                }
            }
        }
    }

    fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeySet::None => false,
            KeySet::One(one) => **one == *key,
            KeySet::Many(keys) => keys.contains(key),
        }
    }

    fn len(&self) -> usize {
        match self {
            KeySet::None => 0,
            KeySet::One(_) => 1,
            KeySet::Many(keys) => keys.len(),
        }
    }

    /// In key order.
    fn iter(&self) -> impl Iterator<Item = &Key> {
        let (one, many) = match self {
            KeySet::None => (None, None),
            KeySet::One(one) => (Some(one), None),
            KeySet::Many(keys) => (None, Some(keys.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    fn into_vec(self) -> Vec<Key> {
        match self {
            KeySet::None => Vec::new(),
            KeySet::One(one) => vec![one],
            KeySet::Many(keys) => keys.into_iter().collect(),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct LeaseTable {
    /// Boxed: ids mostly arrive in increasing order, which leaves B-tree nodes about half full,
    /// so a node holds 16-byte entries rather than the 56-byte leases themselves.
    leases: BTreeMap<LeaseId, Box<Lease>>,
    /// The expiry queue: (deadline, grant order) of every lease. Renewing moves one entry,
    /// O(log n).
    queue: BTreeMap<(u64, u64), LeaseId>,
    /// The replicated lease clock: the latest lease time a leader proposed.
    clock_ms: u64,
    next_grant_seq: u64,
    counters: Counters,
    /// The latest ended leases, oldest first, at most [`RECENT_ENDS_LEN_MAX`]. Derived from the
    /// applied commands like `counters` (so the same on every member), not persisted: a restart
    /// starts it empty.
    recent_ends: VecDeque<EndedLease>,
    /// The largest cover margin an applied renewal used: no lease's told deadline is further
    /// than this before its cover, which bounds the expiry scan ([`LeaseTable::told_expired`]).
    cover_margin_max_ms: u64,
}

fn deadline(now_ms: u64, ttl_secs: i64) -> u64 {
    let ttl_ms = u64::try_from(ttl_secs).unwrap_or(0).saturating_mul(1000);
    now_ms.saturating_add(ttl_ms)
}

impl LeaseTable {
    pub fn new() -> LeaseTable {
        LeaseTable::default()
    }

    /// Rebuilds the table from persisted records. Keys are attached afterwards with
    /// [`LeaseTable::attach`], from the KV store. Both maps are built from sorted entries (full
    /// B-tree nodes), not one insert at a time.
    pub fn restore(
        clock_ms: u64,
        records: impl IntoIterator<Item = (LeaseId, LeaseRecord)>,
    ) -> LeaseTable {
        let records: Vec<(LeaseId, LeaseRecord)> = records.into_iter().collect();
        let next_grant_seq = records
            .iter()
            .map(|(_, r)| r.grant_seq + 1)
            .max()
            .unwrap_or(0);
        let queue = records
            .iter()
            .map(|(id, r)| ((r.deadline_ms, r.grant_seq), *id))
            .collect();
        let leases = records
            .into_iter()
            .map(|(id, record)| (id, Box::new(Lease::new(record))))
            .collect();
        LeaseTable {
            leases,
            queue,
            clock_ms,
            next_grant_seq,
            ..LeaseTable::default()
        }
    }

    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    pub fn contains(&self, id: LeaseId) -> bool {
        self.leases.contains_key(&id)
    }

    /// A log entry at `index` is about to be applied: grant order continues from `index << 12`
    /// (an entry holds at most 4,096 commands), so that it is the same on every member, whatever
    /// each one restored from (a restart counts on from its surviving leases only, and a
    /// member that restarted after the latest grant's lease had ended would otherwise number
    /// the next grant lower than the others do).
    pub fn begin_entry(&mut self, index: u64) {
        self.next_grant_seq = self.next_grant_seq.max(index << 12);
    }

    /// Moves the replicated clock forward to `now_ms` (never back).
    pub fn advance(&mut self, now_ms: u64) {
        self.clock_ms = self.clock_ms.max(now_ms);
    }

    /// Adds a lease expiring `ttl_secs` after `now_ms`. The TTL is already validated and clamped.
    pub fn grant(
        &mut self,
        id: LeaseId,
        ttl_secs: i64,
        now_ms: u64,
    ) -> Result<LeaseRecord, LeaseError> {
        self.advance(now_ms);
        if self.leases.contains_key(&id) {
            return Err(LeaseError::Exists);
        }
        let record = LeaseRecord {
            ttl_secs,
            deadline_ms: deadline(now_ms, ttl_secs),
            grant_seq: self.next_grant_seq,
        };
        self.next_grant_seq += 1;
        self.queue
            .insert((record.deadline_ms, record.grant_seq), id);
        self.leases.insert(id, Box::new(Lease::new(record)));
        self.counters.granted += 1;
        Ok(record)
    }

    /// Pushes the deadline to `now_ms + ttl`, unless the lease is unknown or already expired.
    /// `now_ms` is the rounded-up lease time (see `LeaseClock::now_ms_ceil`).
    pub fn renew(&mut self, id: LeaseId, now_ms: u64) -> Renewal {
        self.advance(now_ms);
        let Some(lease) = self.leases.get_mut(&id) else {
            return Renewal::NotFound;
        };
        // `now_ms` counts deadlines (rounded up, `LeaseClock::now_ms_ceil`), so only a deadline
        // strictly before it has certainly passed; expiry itself is decided by `expired`.
        if lease.record.deadline_ms < now_ms {
            return Renewal::Expired;
        }
        let old = (lease.record.deadline_ms, lease.record.grant_seq);
        lease.record.deadline_ms =
            deadline(now_ms, lease.record.ttl_secs).max(lease.record.deadline_ms);
        let new = (lease.record.deadline_ms, lease.record.grant_seq);
        let ttl_secs = lease.record.ttl_secs;
        lease.set_told(lease.record.deadline_ms);
        self.queue.remove(&old);
        self.queue.insert(new, id);
        self.counters.renewed += 1;
        Renewal::Renewed { ttl_secs }
    }

    /// A renewal through the log with a cover (`LeaseCover`): the told deadline becomes
    /// `now_ms + ttl` and the deadline (the cover) at least `margin_ms` beyond it, unless the
    /// lease is unknown or its cover has passed. `now_ms` is rounded up, as for [`Self::renew`].
    pub fn renew_covered(&mut self, id: LeaseId, now_ms: u64, margin_ms: u64) -> Renewal {
        self.advance(now_ms);
        self.cover_margin_max_ms = self.cover_margin_max_ms.max(margin_ms);
        let Some(lease) = self.leases.get_mut(&id) else {
            return Renewal::NotFound;
        };
        if lease.record.deadline_ms < now_ms {
            return Renewal::Expired;
        }
        let told = deadline(now_ms, lease.record.ttl_secs);
        let old = (lease.record.deadline_ms, lease.record.grant_seq);
        lease.record.deadline_ms = told.saturating_add(margin_ms).max(lease.record.deadline_ms);
        let new = (lease.record.deadline_ms, lease.record.grant_seq);
        let ttl_secs = lease.record.ttl_secs;
        let told = told.max(lease.told());
        lease.set_told(told);
        if new != old {
            self.queue.remove(&old);
            self.queue.insert(new, id);
        }
        self.counters.renewed += 1;
        Renewal::Renewed { ttl_secs }
    }

    /// The leader's renewal without a log write: if the lease's cover already reaches
    /// `now_ms + ttl`, that becomes its told deadline (never earlier than before). Takes `&self`:
    /// it runs under the state's read lock, and only ever moves a told deadline later within the
    /// cover, which no apply depends on. The caller keeps it apart from the expiry driver's
    /// decisions (`leasehold_raft::steps::LeaderRenewals`).
    pub fn renew_in_memory(&self, id: LeaseId, now_ms: u64) -> MemoryRenewal {
        let Some(lease) = self.leases.get(&id) else {
            return MemoryRenewal::NotFound;
        };
        let cover_ms = lease.record.deadline_ms;
        if lease.told() < now_ms {
            return MemoryRenewal::Expired { cover_ms };
        }
        let told = deadline(now_ms, lease.record.ttl_secs);
        if told > cover_ms {
            return MemoryRenewal::Uncovered;
        }
        lease.told_ms.fetch_max(told, Ordering::Relaxed);
        MemoryRenewal::Renewed {
            ttl_secs: lease.record.ttl_secs,
            slack_ms: cover_ms - told,
        }
    }

    /// The deadline the lease's holder was last told, as this member knows it (on the leader
    /// exact; elsewhere the one the last applied renewal gave, which is never later).
    pub fn told_ms(&self, id: LeaseId) -> Option<u64> {
        self.leases.get(&id).map(|l| l.told())
    }

    /// A lease's deadline as a member that does not lead can bound it at lease time `now_ms`:
    /// the leader may have renewed it from memory since the last renewal this member applied,
    /// to any deadline up to the cover, and never more than a TTL past `now_ms`. So the cover,
    /// but at most a TTL from now: never short for a lease that is being renewed, and at most
    /// one margin long for one that is not.
    pub fn follower_deadline_ms(&self, id: LeaseId, now_ms: u64) -> Option<u64> {
        let lease = self.leases.get(&id)?;
        let at_most = deadline(now_ms, lease.record.ttl_secs);
        Some(lease.record.deadline_ms.min(at_most).max(lease.told()))
    }

    /// The largest cover margin an applied renewal used.
    pub fn cover_margin_max_ms(&self) -> u64 {
        self.cover_margin_max_ms
    }

    /// Up to `max` leases whose told deadline is at or before `now_ms`, with their covers,
    /// earliest cover first: what a leader ends. Only leases whose cover is within
    /// [`Self::cover_margin_max_ms`] of `now_ms` can be due, so the walk stops there.
    pub fn told_expired(&self, now_ms: u64, max: usize) -> Vec<(LeaseId, u64)> {
        let until = now_ms.saturating_add(self.cover_margin_max_ms);
        self.queue
            .range(..=(until, u64::MAX))
            .filter(|(_, id)| self.leases[*id].told() <= now_ms)
            .take(max)
            .map(|(&(cover, _), id)| (*id, cover))
            .collect()
    }

    /// The earliest told deadline, if any lease exists.
    pub fn next_told_ms(&self) -> Option<u64> {
        let first = self.next_deadline_ms()?;
        let until = first.saturating_add(self.cover_margin_max_ms);
        self.queue
            .range(..=(until, u64::MAX))
            .map(|(_, id)| self.leases[id].told())
            .min()
    }

    /// Revokes `id` because the leader saw its told deadline pass at `now_ms`, unless a renewal
    /// through the log moved its cover since the leader saw it at `cover_ms` (that renewal was
    /// answered, and wins). Deterministic: it reads only the replicated cover.
    pub fn expire_told(&mut self, id: LeaseId, now_ms: u64, cover_ms: u64) -> Option<Vec<Key>> {
        self.advance(now_ms);
        let deadline = self.leases.get(&id)?.record.deadline_ms;
        if deadline != cover_ms && deadline > now_ms {
            return None;
        }
        self.end_expired(id)
    }

    /// Revokes `id` as expired: counted and remembered as an expiry, not a client's revoke.
    fn end_expired(&mut self, id: LeaseId) -> Option<Vec<Key>> {
        let keys = self.revoke(id).ok()?;
        self.counters.expired += 1;
        let ended = self.recent_ends.back_mut().expect("revoke just noted it");
        debug_assert_eq!(ended.id, id);
        ended.end = LeaseEnd::Expired;
        Some(keys)
    }

    /// Removes a lease; returns its keys in key order (the caller deletes them at one revision).
    pub fn revoke(&mut self, id: LeaseId) -> Result<Vec<Key>, LeaseError> {
        let lease = self.leases.remove(&id).ok_or(LeaseError::NotFound)?;
        self.queue
            .remove(&(lease.record.deadline_ms, lease.record.grant_seq));
        self.counters.revoked += 1;
        if self.recent_ends.len() == RECENT_ENDS_LEN_MAX {
            self.recent_ends.pop_front();
        }
        self.recent_ends.push_back(EndedLease {
            id,
            end: LeaseEnd::Revoked,
            ttl_secs: lease.record.ttl_secs,
            at_ms: self.clock_ms,
            keys: lease.keys.len(),
        });
        debug_assert!(self.recent_ends.len() <= RECENT_ENDS_LEN_MAX);
        Ok(lease.keys.into_vec())
    }

    /// What a new leader does to the leases it inherits: each has at least `extend_ms` left at
    /// `now_ms` (the new leader's lease time), so holders cut off by the leader change have time
    /// to reach the new leader. A lease with more left keeps its deadline: the extension does
    /// not add up over repeated leader changes, so a dead client's lease still expires within
    /// one extension of its TTL however often the leader changes.
    ///
    /// Then the pile-up is spread: no second of lease time keeps more than
    /// [`PROMOTION_EXPIRIES_PER_SEC_MAX`] deadlines; the excess moves to the next seconds, in
    /// deadline and grant order (later, never earlier). An election that cut off many clients at
    /// once would otherwise expire all of them in the same instant after the new leader's
    /// grace, and their reconnecting would arrive as one herd.
    ///
    /// Returns the leases whose deadline moved (what must be persisted again): with long TTLs,
    /// few or none.
    pub fn extend_all(&mut self, now_ms: u64, extend_ms: u64) -> Vec<LeaseId> {
        self.advance(now_ms);
        let floor = self.clock_ms.saturating_add(extend_ms);
        // The leases with less than the extension left all move to the floor (in grant order);
        // merged with the rest of the queue, that is every lease in its new order. One read-only
        // walk decides each deadline; only the leases that move are touched, so a promotion over
        // a million long-lived leases costs one pass over the queue, not a rebuild of it.
        let mut raised: Vec<(u64, LeaseId)> = self
            .queue
            .range(..(floor, 0))
            .map(|(&(_, seq), &id)| (seq, id))
            .collect();
        raised.sort_unstable();
        let mut raised = raised
            .into_iter()
            .map(|(seq, id)| ((floor, seq), id))
            .peekable();
        let mut kept = self
            .queue
            .range((floor, 0)..)
            .map(|(k, id)| (*k, *id))
            .peekable();
        let mut moves: Vec<((u64, u64), u64, LeaseId)> = Vec::new();
        // The second being filled, and how many deadlines it holds so far.
        let (mut second, mut in_second) = (0u64, 0u64);
        loop {
            let take_raised = match (raised.peek(), kept.peek()) {
                (Some(r), Some(k)) => r.0 < k.0,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            let (key, id) = if take_raised {
                raised.next()
            } else {
                kept.next()
            }
            .expect("peeked");
            let mut deadline = key.0;
            if deadline / 1000 < second {
                // Spilled over from a full second: the start of the one being filled.
                deadline = second * 1000;
            } else if deadline / 1000 > second {
                second = deadline / 1000;
                in_second = 0;
            }
            if in_second >= PROMOTION_EXPIRIES_PER_SEC_MAX {
                second += 1;
                in_second = 0;
                deadline = deadline.max(second * 1000);
            }
            in_second += 1;
            // A raised lease always moves: its deadline was below the floor.
            let old = self.leases[&id].record.deadline_ms;
            if deadline != old {
                moves.push(((old, key.1), deadline, id));
            }
        }
        let mut moved = Vec::with_capacity(moves.len());
        for ((old, seq), deadline, id) in moves {
            self.queue.remove(&(old, seq));
            self.queue.insert((deadline, seq), id);
            self.leases
                .get_mut(&id)
                .expect("queued leases exist")
                .record
                .deadline_ms = deadline;
            moved.push(id);
        }
        // The new leader knows no better than the covers: it honours each in full.
        for lease in self.leases.values_mut() {
            lease.set_told(lease.record.deadline_ms);
        }
        moved
    }

    /// Revokes `id` because it expired at `now_ms`; `None` if it is gone or was renewed since.
    pub fn expire(&mut self, id: LeaseId, now_ms: u64) -> Option<Vec<Key>> {
        self.advance(now_ms);
        let due = self.leases.get(&id)?.record.deadline_ms <= now_ms;
        if !due {
            return None;
        }
        self.end_expired(id)
    }

    /// Up to `max` leases whose deadline is at or before `now_ms`, earliest first.
    pub fn expired(&self, now_ms: u64, max: usize) -> Vec<LeaseId> {
        self.queue
            .range(..=(now_ms, u64::MAX))
            .take(max)
            .map(|(_, id)| *id)
            .collect()
    }

    /// The earliest deadline, if any lease exists.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.queue.keys().next().map(|(d, _)| *d)
    }

    /// Binds `key` to `id`. A no-op for an unknown lease (a restored key whose lease is gone
    /// stays unattached, as in etcd). The caller detaches the key from the lease it named before
    /// (the KV store knows which): a key is in at most one lease's set.
    pub fn attach(&mut self, key: Key, id: LeaseId) -> bool {
        match self.leases.get_mut(&id) {
            Some(lease) => {
                lease.keys.insert(key);
                true
            }
            None => false,
        }
    }

    /// Unbinds `key` from lease `id`, if both are there.
    pub fn detach(&mut self, key: &[u8], id: LeaseId) {
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.keys.remove(key);
        }
    }

    /// Whether `key` is attached to `id`.
    pub fn is_attached(&self, key: &[u8], id: LeaseId) -> bool {
        self.leases.get(&id).is_some_and(|l| l.keys.contains(key))
    }

    pub fn record(&self, id: LeaseId) -> Option<LeaseRecord> {
        self.leases.get(&id).map(|l| l.record)
    }

    /// Counted from the deadline `deadline_of` gives the lease: on the leader its told
    /// deadline ([`LeaseTable::told_ms`]), elsewhere [`LeaseTable::follower_deadline_ms`].
    pub fn time_to_live(&self, id: LeaseId, now_ms: u64, with_keys: bool) -> Option<TimeToLive> {
        self.time_to_live_by(id, now_ms, with_keys, true)
    }

    /// [`LeaseTable::time_to_live`] as a member that does not lead answers it
    /// (`told_known: false`): from [`LeaseTable::follower_deadline_ms`].
    pub fn time_to_live_by(
        &self,
        id: LeaseId,
        now_ms: u64,
        with_keys: bool,
        told_known: bool,
    ) -> Option<TimeToLive> {
        let lease = self.leases.get(&id)?;
        let deadline_ms = if told_known {
            lease.told()
        } else {
            self.follower_deadline_ms(id, now_ms)?
        };
        let left_ms = deadline_ms.saturating_sub(now_ms);
        // Strictly less than what is left on the millisecond clock: `now_ms` is rounded down
        // and deadlines up, and real time has passed since the grant or renewal, however
        // little. etcd, counting in nanoseconds, answers 29 right after a grant of 30; so must
        // a read in the same millisecond as the grant (it answered 30, a differential test
        // flaked on it).
        let left_ms = left_ms.saturating_sub(1);
        Some(TimeToLive {
            remaining_secs: i64::try_from(left_ms / 1000).unwrap_or(i64::MAX),
            granted_ttl_secs: lease.record.ttl_secs,
            keys: if with_keys {
                lease.keys.iter().cloned().collect()
            } else {
                Vec::new()
            },
        })
    }

    /// Every lease, soonest deadline first (grant order among equal deadlines).
    pub fn by_deadline(&self) -> Vec<LeaseId> {
        self.queue.values().copied().collect()
    }

    /// Every lease with its keys, soonest deadline first (grant order among equal deadlines),
    /// lazily: a reader takes as many as it needs.
    pub fn iter_by_deadline(&self) -> impl Iterator<Item = LeaseView<'_>> {
        self.queue.values().map(|id| self.view_of(*id))
    }

    /// Every lease with its keys in id order, starting after `after` (from the first if `None`).
    pub fn iter_by_id(&self, after: Option<LeaseId>) -> impl Iterator<Item = LeaseView<'_>> {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.leases
            .range((from, Bound::Unbounded))
            .map(|(id, lease)| LeaseView {
                id: *id,
                record: lease.record,
                keys: &lease.keys,
            })
    }

    /// One lease with its keys.
    pub fn view(&self, id: LeaseId) -> Option<LeaseView<'_>> {
        self.leases.contains_key(&id).then(|| self.view_of(id))
    }

    fn view_of(&self, id: LeaseId) -> LeaseView<'_> {
        let lease = &self.leases[&id];
        LeaseView {
            id,
            record: lease.record,
            keys: &lease.keys,
        }
    }

    /// The deadlines at or before `until_ms`, earliest first.
    pub fn deadlines_until(&self, until_ms: u64) -> impl Iterator<Item = u64> + '_ {
        self.queue.range(..=(until_ms, u64::MAX)).map(|(k, _)| k.0)
    }

    /// The latest ended leases (at most [`RECENT_ENDS_LEN_MAX`]), newest first.
    pub fn recent_ends(&self) -> impl Iterator<Item = &EndedLease> {
        self.recent_ends.iter().rev()
    }

    /// Every lease with its record, for persistence and snapshots.
    pub fn records(&self) -> Vec<(LeaseId, LeaseRecord)> {
        self.leases.iter().map(|(id, l)| (*id, l.record)).collect()
    }

    /// Checks every invariant; panics with the broken one.
    pub fn validate(&self) {
        assert_eq!(
            self.queue.len(),
            self.leases.len(),
            "one queue entry per lease"
        );
        for (&(deadline_ms, seq), id) in &self.queue {
            let lease = &self.leases[id];
            assert_eq!(
                (lease.record.deadline_ms, lease.record.grant_seq),
                (deadline_ms, seq)
            );
            assert!(
                seq < self.next_grant_seq,
                "grant order is behind the counter"
            );
            let told = lease.told();
            assert!(told <= deadline_ms, "a told deadline is beyond its cover");
            assert!(
                told + self.cover_margin_max_ms >= deadline_ms,
                "a told deadline is more than the largest margin before its cover"
            );
        }
        let mut attached = std::collections::HashSet::new();
        for lease in self.leases.values() {
            if let KeySet::Many(keys) = &lease.keys {
                assert!(keys.len() > 1, "a set of one key is held as one");
            }
            for key in lease.keys.iter() {
                assert!(attached.insert(key), "{key:?} is in two leases' sets");
            }
        }
        assert!(self.recent_ends.len() <= RECENT_ENDS_LEN_MAX);
    }
}
