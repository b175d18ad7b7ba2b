//! Applying committed entries: each command to the store and the lease table, the changes
//! staged for the next checkpoint, and the signals published once the state lock is released.

use leasehold_lease::{LeaseId, LeaseRecord, LeaseTable, Renewal};
use leasehold_mvcc::{Change, Record, ResponseOp, Store};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use super::SmState;
use super::check::check_command;
use super::shared::Shared;
use crate::command::{
    AlarmChange, AlarmMember, Applied, AuthWrite, Authenticate, Command, Proposal,
};
use crate::position::{LogPosition, Members};
use crate::storage::{Db, Scheduled, StorageError, VALUES_HELD_BYTES};
use leasehold_auth::{AuthChange, AuthError};

pub(super) fn state_membership_has(membership: &Members, id: u64) -> bool {
    membership.contains_key(&id)
}

/// Raises or clears an alarm; what etcd's alarm store answers (the alarm raised, or already
/// raised; the one cleared, `None` if it was not raised).
pub(super) fn apply_alarm(
    alarms: &mut BTreeSet<AlarmMember>,
    change: AlarmChange,
) -> Option<AlarmMember> {
    if change.activate {
        alarms.insert(change.alarm);
        Some(change.alarm)
    } else {
        alarms.remove(&change.alarm).then_some(change.alarm)
    }
}

/// What one apply batch changed, to stage for persistence.
#[derive(Default)]
pub(super) struct Effects {
    changes: Vec<Change>,
    leases_touched: BTreeSet<LeaseId>,
    /// The KV operations applied, counted as etcd's `etcd_mvcc_*_total` count them.
    ops: KvOps,
    /// Each command's kind, outcome and apply time, for the member's telemetry.
    timed: Vec<(&'static str, bool, std::time::Duration)>,
    /// Bytes of keys and values put.
    put_bytes: u64,
    /// Compactions applied: versions removed, and how long each held the apply back.
    compactions: Vec<(u64, std::time::Duration)>,
    /// The rows each compaction applied hides, to remove from the file once its checkpoint is
    /// there (`storage/removals.rs`).
    removals: Vec<Scheduled>,
    /// The hashes those compactions took, to compute away from the apply once it is done.
    hashes: Vec<std::sync::Arc<leasehold_mvcc::CompactionHash>>,
    /// A released value could not be read back ([`leasehold_mvcc::Error::Unreadable`]): the
    /// store may be part-way through a write, so nothing of this apply may be answered.
    unreadable: Option<String>,
}

impl Effects {
    /// Passes `result` on, noting an unreadable value in it.
    fn checked<T>(
        &mut self,
        result: Result<T, leasehold_mvcc::Error>,
    ) -> Result<T, leasehold_mvcc::Error> {
        if let Err(leasehold_mvcc::Error::Unreadable(why)) = &result {
            self.unreadable.get_or_insert_with(|| why.clone());
        }
        result
    }
}

/// KV operations applied, as etcd counts them per write transaction: each put and each
/// delete-range (not each key it deletes), each range read inside a txn, and a txn when it ran
/// more than one operation (nested txns' operations included; only the branch taken counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvOps {
    pub puts: u64,
    pub deletes: u64,
    pub ranges: u64,
    pub txns: u64,
}

impl KvOps {
    /// Counts what a txn's taken branch ran.
    fn count_txn(&mut self, resp: &leasehold_mvcc::TxnResponse) {
        let mut ops = 0;
        self.count_branch(&resp.responses, &mut ops);
        if ops > 1 {
            self.txns += 1;
        }
    }

    fn count_branch(&mut self, responses: &[ResponseOp], ops: &mut u64) {
        for op in responses {
            match op {
                ResponseOp::Range(_) => {
                    self.ranges += 1;
                    *ops += 1;
                }
                ResponseOp::Put(_) => {
                    self.puts += 1;
                    *ops += 1;
                }
                ResponseOp::DeleteRange(_) => {
                    self.deletes += 1;
                    *ops += 1;
                }
                ResponseOp::Txn(inner) => self.count_branch(&inner.responses, ops),
            }
        }
    }
}

impl Effects {
    /// Records KV changes and keeps key bindings in step with them.
    pub(super) fn kv(&mut self, store: &Store, leases: &mut LeaseTable, changes: Vec<Change>) {
        rebind(store, leases, &changes);
        for change in &changes {
            if let Change::Write {
                record: Record::Put(kv),
                ..
            } = change
            {
                self.put_bytes += (kv.key.len() + kv.value.len()) as u64;
            }
        }
        self.changes.extend(changes);
    }

    /// Deletes a revoked lease's keys, all at one new revision; returns the header revision.
    pub(super) fn revoked(
        &mut self,
        state: &mut SmState,
        id: LeaseId,
        keys: &[leasehold_mvcc::Key],
    ) -> i64 {
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
pub(super) fn apply_command(state: &mut SmState, cmd: &Command, fx: &mut Effects) -> Applied {
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
        Command::Put(req) => {
            let put = fx.checked(store.put(req, &lease_exists));
            Applied::Put(put.map(|(resp, c)| {
                fx.ops.puts += 1;
                fx.kv(store, leases, c);
                resp
            }))
        }
        Command::DeleteRange(req) => match fx.checked(store.delete_range(req)) {
            Ok((resp, c)) => {
                fx.ops.deletes += 1;
                fx.kv(store, leases, c);
                Applied::DeleteRange(resp)
            }
            // Noted in `fx`: nothing of this apply is answered.
            Err(_) => Applied::DeleteRange(Default::default()),
        },
        Command::Txn(req) => {
            let txn = fx.checked(store.txn(req, &lease_exists));
            Applied::Txn(txn.map(|(resp, c)| {
                fx.ops.count_txn(&resp);
                fx.kv(store, leases, c);
                resp
            }))
        }
        Command::Compact { revision } => {
            let started = std::time::Instant::now();
            let compacted = fx.checked(store.compact(*revision));
            Applied::Compact(compacted.map(|(rev, c)| {
                fx.compactions.push((c.len() as u64, started.elapsed()));
                let rows = c
                    .into_iter()
                    .filter_map(|change| match change {
                        Change::Remove { rev } => Some(rev),
                        Change::Write { .. } => None,
                    })
                    .collect();
                fx.removals.push(Scheduled::new(*revision, rows));
                fx.hashes.extend(store.newest_compaction_hash());
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
        Command::LeaseRenew { id, now_ms } => {
            let renewal = leases.renew(*id, *now_ms);
            renewed(state, fx, *id, *now_ms, renewal)
        }
        Command::LeaseCover {
            id,
            now_ms,
            margin_ms,
        } => {
            let renewal = leases.renew_covered(*id, *now_ms, *margin_ms);
            renewed(state, fx, *id, *now_ms, renewal)
        }
        Command::LeaseExpireTold {
            leases: due,
            now_ms,
        } => {
            let mut revoked = 0;
            for (id, cover_ms) in due {
                if let Some(keys) = state.leases.expire_told(*id, *now_ms, *cover_ms) {
                    fx.revoked(state, *id, &keys);
                    revoked += 1;
                }
            }
            Applied::LeaseExpire(revoked)
        }
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

/// A renewal's reply, from what the lease table made of it at `now_ms`: one that came too late
/// revokes the lease now, so that its answer (TTL 0) follows the revoke.
fn renewed(
    state: &mut SmState,
    fx: &mut Effects,
    id: LeaseId,
    now_ms: u64,
    renewal: Renewal,
) -> Applied {
    match renewal {
        Renewal::Renewed { ttl_secs } => {
            fx.leases_touched.insert(id);
            Applied::LeaseRenew(Some(ttl_secs))
        }
        Renewal::NotFound => Applied::LeaseRenew(None),
        Renewal::Expired => {
            if let Some(keys) = state.leases.expire(id, now_ms) {
                fx.revoked(state, id, &keys);
            }
            Applied::LeaseRenew(None)
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

/// Applies one committed entry to the state: one reply per command. The one function both the
/// replica ([`apply_entries`]) and the simulator's [`super::Machine`] apply with.
pub(super) fn apply_entry(
    state: &mut SmState,
    position: LogPosition,
    payload: Applying,
    fx: &mut Effects,
) -> Vec<Applied> {
    state.last_applied = Some(position);
    match payload {
        Applying::Blank => Vec::new(),
        Applying::Membership(m) => {
            // A removed member's attributes go with it.
            state.member_attrs.retain(|id, _| m.contains_key(id));
            state.membership = m;
            Vec::new()
        }
        Applying::Normal(Proposal { commands }) => {
            state.leases.begin_entry(position.index);
            commands
                .iter()
                .map(|cmd| {
                    let started = std::time::Instant::now();
                    let applied = apply_command(state, cmd, fx);
                    fx.timed
                        .push((cmd.op_name(), applied.succeeded(), started.elapsed()));
                    applied
                })
                .collect()
        }
    }
}

/// Applies committed entries, in order, to the state machine: one reply per entry (one
/// `Applied` per command). The changes are staged (`Db::stage_sm`), not written: the log holds
/// the entries durably, and the staged rows reach the file with the next checkpoint. `dated`
/// tells when the entry at an index reached this member, which dates the replicated lease time
/// it carries; given no index (no entry moved the lease time) or one it does not know, now.
///
/// Values whose rows the file durably holds are released from memory here, down to
/// [`VALUES_HELD_BYTES`]. An error when a released value could not be read back: the state
/// may be part-way through a write, so nothing is staged or answered, and the member stops.
pub(crate) fn apply_entries(
    shared: &Shared,
    db: &Db,
    entries: impl IntoIterator<Item = (LogPosition, Applying)>,
    mut dated: impl FnMut(Option<u64>) -> std::time::Instant,
) -> Result<Vec<Vec<Applied>>, StorageError> {
    let mut replies = Vec::new();
    let mut fx = Effects::default();
    let (meta, lease_rows, lease_clock_ms, clock_moved_at) = {
        let mut guard = shared.state.write().expect("state lock poisoned");
        let state = &mut *guard;
        // The last entry that moved the lease clock.
        let mut clock_moved_at = None;
        for (position, payload) in entries {
            let clock_before = state.leases.clock_ms();
            replies.push(apply_entry(state, position, payload, &mut fx));
            if let Some(why) = fx.unreadable.take() {
                return Err(StorageError::ValueUnreadable { why });
            }
            if state.leases.clock_ms() > clock_before {
                clock_moved_at = Some(position.index);
            }
        }
        state
            .store
            .release_values(db.durable_revision(), VALUES_HELD_BYTES);
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
    shared.note_lease_time(lease_clock_ms, dated(clock_moved_at));
    if !lease_rows.is_empty() {
        shared.leases_moved();
    }
    shared.publish_revision(meta.current_revision);
    shared.count_kv_ops(fx.ops);
    let telemetry = db.telemetry();
    telemetry.apply.observe(fx.timed.drain(..));
    telemetry
        .put_bytes
        .fetch_add(fx.put_bytes, Ordering::Relaxed);
    for (removed, took) in fx.compactions.drain(..) {
        telemetry.compacted(removed, took);
    }
    shared
        .key_deletes
        .deleted(fx.changes.iter().filter_map(|change| match change {
            Change::Write {
                record: Record::Tombstone { key },
                ..
            } => Some(key.as_slice()),
            Change::Write { .. } | Change::Remove { .. } => None,
        }));
    db.stage_sm(fx.changes, lease_rows, meta, fx.removals);
    for hash in fx.hashes {
        leasehold_mvcc::hash_in_background(hash);
    }
    Ok(replies)
}

#[cfg(test)]
mod kv_ops_tests {
    use leasehold_mvcc::{DeleteRangeResponse, PutResponse, RangeResponse, TxnResponse};

    use super::*;

    #[test]
    fn a_txn_counts_the_operations_of_its_taken_branch_and_itself_when_more_than_one() {
        let nested = TxnResponse {
            responses: vec![ResponseOp::DeleteRange(DeleteRangeResponse::default())],
            ..Default::default()
        };
        let txn = TxnResponse {
            responses: vec![
                ResponseOp::Range(RangeResponse::default()),
                ResponseOp::Put(PutResponse::default()),
                ResponseOp::Txn(nested.clone()),
            ],
            ..Default::default()
        };
        let mut ops = KvOps::default();
        ops.count_txn(&txn);
        assert_eq!(
            ops,
            KvOps {
                puts: 1,
                deletes: 1,
                ranges: 1,
                txns: 1
            }
        );
        // One operation is not a txn to etcd's counter; none neither.
        ops.count_txn(&nested);
        ops.count_txn(&TxnResponse::default());
        assert_eq!((ops.deletes, ops.txns), (2, 1));
    }
}
