//! The promises each run is checked against: linearizable keys, members that converge, and
//! leases that end neither before the deadline their holder was last told nor much after it.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_auth::{AuthChange, AuthError};
use leasehold_history::{self as history, Event};
use leasehold_mvcc::{RangeRequest, Store};

use crate::member::{Member, Stamp};

/// A command's place in the log: its entry's index, and its place among the entry's commands.
pub type LogPos = (u64, usize);

/// Every key's history must be linearizable (the test kit's checker, per key).
pub fn check_histories(histories: &BTreeMap<String, Vec<Event>>) -> Vec<String> {
    let mut failures = Vec::new();
    for (key, events) in histories {
        if events.len() > history::EVENTS_MAX {
            failures.push(format!(
                "key {key}: {} events, more than the checker takes",
                events.len()
            ));
            continue;
        }
        if let Err(e) = history::check(None, events) {
            failures.push(format!("key {key}: {e}"));
        }
    }
    failures
}

/// A fenced lock never accepts a stale write: at the revision of every fenced write the store
/// took, the lock key existed with the create revision (the token) the write carried.
pub fn check_fenced(store: &Store, lock_key: &[u8], fenced: &[(i64, i64)]) -> Vec<String> {
    let mut failures = Vec::new();
    for (revision, token) in fenced {
        let request = RangeRequest {
            key: lock_key.to_vec(),
            revision: *revision,
            ..RangeRequest::default()
        };
        let holder = store
            .range(&request)
            .ok()
            .and_then(|r| r.kvs.into_iter().next())
            .map(|kv| kv.create_revision);
        if holder != Some(*token) {
            failures.push(format!(
                "a fenced write with token {token} was taken at revision {revision}, when the lock key's create revision was {holder:?}"
            ));
        }
    }
    failures
}

/// Auth at apply: every KV write the store took was permitted when its entry applied, and
/// every one refused for want of permission was not. `applied`: every auth change applied, by
/// log position; `lease_ends`: every lease that ended, with the position that ended it (a grant
/// bound to it goes with that same command); `writes`: each KV write's position and outcome.
/// Only the KV role's permission on the KV keys and auth itself change in these runs.
pub fn check_auth(
    applied: &BTreeMap<LogPos, AuthChange>,
    lease_ends: &BTreeSet<(LogPos, i64)>,
    writes: &[(LogPos, Result<(), AuthError>)],
) -> Vec<String> {
    let mut failures = Vec::new();
    let mut writes = writes.to_vec();
    writes.sort_by_key(|(at, _)| *at);
    let mut changes = applied.iter().peekable();
    let mut ends = lease_ends.iter().peekable();
    // The KV permission: not granted, granted, or granted bound to a lease.
    let (mut enabled, mut granted): (bool, Option<Option<i64>>) = (false, None);
    for ((index, pos), result) in writes {
        let at = (index, pos);
        loop {
            let change_at = changes.peek().map(|(c, _)| **c).filter(|c| *c < at);
            let end_at = ends.peek().map(|(e, _)| *e).filter(|e| *e < at);
            // In log order; an auth change before a lease end at the same place.
            let change_first = match (change_at, end_at) {
                (None, None) => break,
                (Some(c), Some(e)) => c <= e,
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            if change_first {
                let (_, change) = changes.next().expect("peeked");
                match change {
                    AuthChange::Enable => enabled = true,
                    AuthChange::Disable => enabled = false,
                    AuthChange::RoleGrantPermission { perm, .. } => granted = Some(perm.lease),
                    AuthChange::RoleRevokePermission { .. } => granted = None,
                    _ => {}
                }
            } else {
                let (_, lease) = ends.next().expect("peeked");
                if granted == Some(Some(*lease)) {
                    granted = None;
                }
            }
        }
        let permitted = !enabled || granted.is_some();
        let fine = match result {
            Ok(()) => permitted,
            Err(AuthError::PermissionDenied) => !permitted,
            // A token of an older auth revision, or none yet where auth was not on yet.
            Err(AuthError::AuthOldRevision | AuthError::UserEmpty) => enabled,
            Err(_) => false,
        };
        if !fine {
            failures.push(format!(
                "auth at apply: a KV write at index {index} (command {pos}) got {result:?} with \
                 auth {} and the \
                 permission {}",
                if enabled { "on" } else { "off" },
                match granted {
                    None => "revoked".to_string(),
                    Some(None) => "granted".to_string(),
                    Some(Some(lease)) => format!("granted with lease {lease}"),
                }
            ));
        }
    }
    failures
}

/// Up members hold the same state: the same applied index, KV hash, revisions and leases.
pub fn converged(up: &[&Member]) -> Result<(), String> {
    let Some(first) = up.first() else {
        return Err("no member is up at the end".into());
    };
    let digest = |m: &Member| {
        let store = m.machine.store();
        let hash = store.hash_kv(0).map(|h| h.hash).unwrap_or(0);
        (
            m.machine.applied().0,
            hash,
            store.current_revision(),
            m.machine.leases().records(),
            m.machine.leases().clock_ms(),
            m.machine.auth().clone(),
        )
    };
    let want = digest(first);
    for m in &up[1..] {
        let got = digest(m);
        if got != want {
            return Err(format!(
                "members diverge: m{} at index {} hash {:08x} revision {}, m{} at index {} hash {:08x} revision {} (leases equal: {}, auth equal: {})",
                first.id,
                want.0,
                want.1,
                want.2,
                m.id,
                got.0,
                got.1,
                got.2,
                got.3 == want.3,
                got.5 == want.5
            ));
        }
    }
    for m in up {
        m.machine.validate();
    }
    Ok(())
}

/// A leader's time timing leases, once healed.
#[derive(Clone, Copy, Debug)]
pub struct Reign {
    /// True µs of its promotion, and the lease time it promoted at.
    pub from: u64,
    pub lease_ms: u64,
    /// The election timeout its promotion left each inherited lease at least.
    pub extend_ms: u64,
    /// When it stopped (demoted or killed); `None`: it still leads.
    pub until: Option<u64>,
}

#[derive(Debug, Default)]
struct LeaseFacts {
    /// The latest deadline a holder was told, in true microseconds: the true time its grant or
    /// renewal was stamped plus the TTL it was answered.
    promised: u64,
    /// The TTL its client asked for.
    ttl_secs: u64,
    /// The latest deadline any stamped grant or renewal may give it, in lease time (ms): the
    /// lease may live that long (and its cover one margin longer) whether or not its holder
    /// heard the answer.
    stamped_lease_ms: u64,
    /// When its client stopped renewing.
    died: Option<u64>,
    /// Its holder keeps renewing it once the faults stop, through every leader change.
    kept: bool,
    /// The true time of its latest answered grant or renewal.
    renewed_us: u64,
    /// When it first left the state on any member, whether a client's revoke ended it, and the
    /// log index of the entry that ended it.
    ended: Option<(u64, bool, u64)>,
}

/// What the run saw of every lease.
#[derive(Debug, Default)]
pub struct Leases {
    facts: BTreeMap<i64, LeaseFacts>,
}

impl Leases {
    /// A grant or renewal stamped at `stamp` was answered with `ttl_secs`.
    pub fn promised(&mut self, id: i64, stamp: Stamp, ttl_secs: u64) {
        let f = self.facts.entry(id).or_default();
        if f.ended.is_some_and(|(_, _, index)| stamp.index > index) {
            // A grant retried after the lease it created had ended (later in the log): a new
            // lease, the same id.
            // (Its stamps are kept: the new grant's is among them, and the old ones are older.)
            *f = LeaseFacts {
                ttl_secs: f.ttl_secs,
                stamped_lease_ms: f.stamped_lease_ms,
                kept: f.kept,
                ..LeaseFacts::default()
            };
        }
        f.promised = f.promised.max(stamp.true_us + ttl_secs * 1_000_000);
        f.renewed_us = f.renewed_us.max(stamp.true_us);
    }

    /// A client asks for a lease with this TTL.
    pub fn granting(&mut self, id: i64, ttl_secs: u64) {
        self.facts.entry(id).or_default().ttl_secs = ttl_secs;
    }

    /// A leader stamped a grant or renewal of the lease at `lease_ms`.
    pub fn stamped(&mut self, id: i64, lease_ms: u64) {
        let f = self.facts.entry(id).or_default();
        f.stamped_lease_ms = f.stamped_lease_ms.max(lease_ms + f.ttl_secs * 1000);
    }

    pub fn known(&self, id: i64) -> bool {
        self.facts.contains_key(&id)
    }

    pub fn holder_died(&mut self, id: i64, at: u64) {
        self.facts.entry(id).or_default().died = Some(at);
    }

    /// Its holder lives on once the faults stop and keeps renewing it.
    pub fn kept(&mut self, id: i64) {
        self.facts.entry(id).or_default().kept = true;
    }

    /// Records the first end; whether this was it.
    pub fn ended(&mut self, id: i64, at: u64, by_client: bool, index: u64) -> bool {
        let f = self.facts.entry(id).or_default();
        if f.ended.is_none() {
            f.ended = Some((at, by_client, index));
            true
        } else {
            false
        }
    }

    /// - Never early: no lease ends (but by its client's revoke) before the deadline its holder
    ///   was last told, less what the members' clock drift allows (`tolerance(ttl)`).
    /// - Never lost while kept: a lease whose holder keeps renewing it once the faults stop
    ///   (`healed`), and renewed it since, is not ended by the cluster, through any number of
    ///   leader changes, while the holder still renews (until 4 s before the run's `end`).
    /// - Gone in time (no fresh TTL from leader changes or restarts): a lease whose holder died
    ///   ends in the first leader's reign, once healed, that lasts until lease time reaches the
    ///   lease's latest possible deadline: the latest a stamped grant or renewal gave it plus
    ///   the cover `margin_ms`, raised to each promotion's lease time plus the election timeout
    ///   it leaves every inherited lease. It ends within `slack` (commit and apply) of that
    ///   point. `reigns`: every leader's reign once healed, in order; within a reign lease time
    ///   runs with true time, and no time between reigns counts.
    pub fn check(
        &self,
        reigns: &[Reign],
        healed: Option<u64>,
        end: u64,
        margin_ms: u64,
        slack: u64,
        tolerance: impl Fn(u64) -> u64,
    ) -> Vec<String> {
        let mut failures = Vec::new();
        // Holders renew until 4 s before the end (`World::client_next`).
        let renewing_until = end.saturating_sub(4_000_000);
        for (id, f) in &self.facts {
            if let Some((at, false, _)) = f.ended
                && f.promised > 0
                && at + tolerance(f.promised.saturating_sub(at)) < f.promised
            {
                failures.push(format!(
                    "lease {id} ended at {at} µs, {} µs before the deadline its holder was told ({})",
                    f.promised - at,
                    f.promised
                ));
            }
            if f.kept
                && f.died.is_none()
                && let (Some((at, false, _)), Some(healed)) = (f.ended, healed)
                && f.renewed_us > healed
                && at < renewing_until
                && f.promised > 0
            {
                failures.push(format!(
                    "lease {id} of a holder that kept renewing it was ended at {at} µs (its last \
                     told deadline {})",
                    f.promised
                ));
            }
            if f.died.is_some() && f.promised > 0 {
                let mut deadline_ms = f.stamped_lease_ms + margin_ms;
                for (i, reign) in reigns.iter().enumerate() {
                    let next = reigns.get(i + 1).map_or(end, |r| r.from);
                    let until = reign.until.map_or(next, |u| u.min(next));
                    deadline_ms = deadline_ms.max(reign.lease_ms + reign.extend_ms);
                    let left_us = deadline_ms.saturating_sub(reign.lease_ms) * 1000;
                    let due = reign.from + left_us + slack + tolerance(left_us);
                    if due > until {
                        // This leader did not last until it was due: the next one inherits it.
                        continue;
                    }
                    match f.ended {
                        Some((at, _, _)) if at > due => failures.push(format!(
                            "lease {id} of a dead holder ended at {at} µs, {} µs after its bound ({due})",
                            at - due
                        )),
                        None => failures.push(format!(
                            "lease {id} of a dead holder still lives at {end} µs, its bound was {due}"
                        )),
                        _ => {}
                    }
                    break;
                }
            }
        }
        failures
    }
}
