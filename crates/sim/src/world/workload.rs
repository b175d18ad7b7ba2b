//! The clients: KV readers and writers, lease holders and keepers, lock holders writing with
//! fencing, the auth admin, and watchers; what each sends next and what it makes of the answer.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use leasehold_auth::{AuthChange, AuthError, PermKind, Permission, ROOT};
use leasehold_history::{self as history, Event as HEvent, Op as HOp};
use leasehold_lease::LeaseId;
use leasehold_mvcc::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp,
    ResponseOp, TxnRequest,
};
use leasehold_raft::{Applied, AuthWrite, LeaseGrant, LeaseRenew, LeaseRevoke, Write};

use super::{Ev, MS, SEC, World};
use crate::check::LogPos;
use crate::member::{Answer, Request};
use crate::rng::Rng;

/// A client gives up on an answer after this long (the outcome of a write is then unknown).
pub(super) const CLIENT_TIMEOUT: u64 = 1_500 * MS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Kv,
    Lease,
    /// A lease holder that takes the one lock (`LOCK_KEY`) and writes behind it with fencing.
    Lock,
    /// In auth seeds: sets up users and roles, turns auth on, then grants and revokes the KV
    /// clients' permission, as root.
    Admin,
}

/// The KV clients' user and role in auth seeds, and the keys the role's permission covers.
pub(super) const KV_USER: &str = "app";

pub(super) const KV_ROLE: &str = "kv";

pub(super) const KV_PERM: (&[u8], &[u8]) = (b"k", b"l");

/// The auth store's setup, in order: root with the root role, the KV clients' role and user,
/// then auth on. The permission itself comes and goes afterwards.
pub(super) fn auth_setup() -> VecDeque<AuthChange> {
    let user = |name: &str| AuthChange::UserAdd {
        name: name.into(),
        password_hash: None,
    };
    VecDeque::from([
        user(ROOT),
        AuthChange::UserGrantRole {
            user: ROOT.into(),
            role: ROOT.into(),
        },
        AuthChange::RoleAdd {
            name: KV_ROLE.into(),
        },
        user(KV_USER),
        AuthChange::UserGrantRole {
            user: KV_USER.into(),
            role: KV_ROLE.into(),
        },
        kv_permission(true, None),
        AuthChange::Enable,
    ])
}

/// The change that grants (or revokes) the KV role's read-write permission on the KV keys.
/// `bound`: the grant lives with this lease (leasehold's grants bound to leases).
pub(super) fn kv_permission(grant: bool, bound: Option<LeaseId>) -> AuthChange {
    let (key, range_end) = (KV_PERM.0.to_vec(), KV_PERM.1.to_vec());
    if grant {
        AuthChange::RoleGrantPermission {
            role: KV_ROLE.into(),
            perm: Permission {
                kind: PermKind::ReadWrite,
                key,
                range_end,
                lease: bound.map(LeaseId::get),
            },
        }
    } else {
        AuthChange::RoleRevokePermission {
            role: KV_ROLE.into(),
            key,
            range_end,
        }
    }
}

/// An auth seed's state: the admin's script, and what the auth checker needs.
pub(super) struct AuthRun {
    /// The admin's own draws, so that seeds without auth draw exactly as before.
    pub(super) rng: Rng,
    pub(super) setup: VecDeque<AuthChange>,
    /// Whether the KV permission is granted, as far as the admin knows.
    pub(super) granted: bool,
    /// The lease the next or current grant is bound to, if it is bound to one.
    pub(super) bound: Option<BoundGrant>,
    /// Every auth change applied, by log position (from whichever member applied it).
    pub(super) applied: BTreeMap<LogPos, AuthChange>,
    /// Every lease that ended, by the log position that ended it (a grant bound to it ends
    /// there).
    pub(super) lease_ends: BTreeSet<(LogPos, i64)>,
    /// Every KV write answered: its log position and whether auth let it through.
    pub(super) writes: Vec<(LogPos, Result<(), AuthError>)>,
}

/// A grant bound to the admin's lease: the lease is granted first, the permission bound to it,
/// then the admin renews it a few times and lets it expire, which takes the grant with it.
#[derive(Clone, Copy, Debug)]
pub(super) struct BoundGrant {
    pub(super) id: LeaseId,
    pub(super) leased: bool,
    pub(super) renewals_left: u32,
}

/// The admin's lease's TTL.
pub(super) const ADMIN_LEASE_TTL: i64 = 2;

/// Keys a KV client writes in each 2 s window.
pub(super) const KV_KEYS: u64 = 4;

/// The lock the lock clients share, and the key its holder writes, fenced by the lock key's
/// create revision (docs/locks.md's recipe).
pub(super) const LOCK_KEY: &[u8] = b"lock/a";

pub(super) const FENCED_KEY: &[u8] = b"fenced/a";

/// A lease client's one lease.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub(super) id: LeaseId,
    pub(super) ttl_secs: i64,
    pub(super) granted: bool,
}

pub(super) struct Client {
    pub(super) kind: Kind,
    pub(super) member: usize,
    /// The op in flight: its number, what it is, when it was sent.
    pub(super) pending: Option<(u64, ClientOp, u64)>,
    pub(super) next_op: u64,
    pub(super) held: Option<Held>,
    pub(super) dead: bool,
    pub(super) written: u64,
    /// A lock client's fencing token: the create revision of its lock key.
    pub(super) token: Option<i64>,
    /// When its lease was last renewed (or granted).
    pub(super) renewed_at: u64,
    /// It paused past its TTL while holding the lock and now writes with its old token.
    pub(super) zombie: bool,
    /// A lease client that lives on after the faults stop, renewing through the leader changes
    /// (its lease must never be lost, `check::Leases::check`).
    pub(super) keeper: bool,
}

#[derive(Clone, Debug)]
pub(super) enum ClientOp {
    Put {
        key: String,
        value: String,
        history: usize,
    },
    /// Sets `new` if the key's value is `expected` (a txn).
    Cas {
        key: String,
        expected: String,
        new: String,
        history: usize,
    },
    /// A read of one key or of a window's keys: each key it covers, with its history event.
    Read {
        span: (Vec<u8>, Vec<u8>),
        keys: Vec<(String, usize)>,
        linearizable: bool,
    },
    Grant(Held),
    /// An admin's auth change.
    Admin(AuthChange),
    /// The admin's lease for a bound grant, granted ...
    AdminLease(LeaseId),
    /// ... and kept alive a while.
    AdminRenew(LeaseId),
    AttachKey(LeaseId),
    Renew(LeaseId),
    Revoke(LeaseId),
    /// Creates the lock key on the lease if nobody holds it; else reads who does.
    Acquire(LeaseId),
    /// Writes the fenced key if the lock key still has this create revision.
    Fenced(i64),
    /// Deletes the lock key if it still has this create revision.
    Release(i64),
}

/// A watch on every key from a revision, served by one member from its applied store (as the
/// server's watch streams pull `Store::events`), moving to another member when its member
/// goes down and resuming after the last revision it saw.
pub(super) struct Watcher {
    pub(super) member: usize,
    pub(super) start: i64,
    pub(super) next: i64,
    pub(super) seen: Vec<WatchedEvent>,
}

/// The lock key's create revision is `revision` (0: the key does not exist).
pub(super) fn created_at(revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal,
        target: CompareTarget::Create(revision),
        key: LOCK_KEY.to_vec(),
        range_end: Vec::new(),
    }
}

/// What a watcher is shown of one event: revision, key, and the value (`None`: a delete).
pub(super) type WatchedEvent = (i64, Vec<u8>, Option<Vec<u8>>);

pub(super) fn watched(event: &leasehold_mvcc::Event) -> WatchedEvent {
    let value = match event.kind {
        leasehold_mvcc::EventKind::Put => Some(event.kv.value.to_vec()),
        leasehold_mvcc::EventKind::Delete => None,
    };
    (event.kv.mod_revision, event.kv.key.clone(), value)
}

impl World {
    pub(super) fn client_next(&mut self, c: usize) {
        let client = &self.clients[c];
        if client.dead || client.pending.is_some() {
            return;
        }
        if self.now + 4 * SEC > self.end {
            return;
        }
        if !matches!(client.kind, Kind::Kv | Kind::Admin)
            && !client.keeper
            && let Some(healed) = self.healed_at
            && self.now > healed + SEC
        {
            self.client_dies(c);
            return;
        }
        if client.kind == Kind::Lease
            && !self.healed()
            && client.held.is_some_and(|h| h.granted)
            && self.rng.chance(0.02)
        {
            // The holder dies mid-run; another client takes its place.
            self.client_dies(c);
            self.new_client(Kind::Lease, SEC);
            return;
        }
        let client = &self.clients[c];
        let op = match client.kind {
            Kind::Kv => self.kv_op(c),
            Kind::Lease => self.lease_op(c),
            Kind::Lock => self.lock_op(c),
            Kind::Admin => self.admin_op(),
        };
        let request = match &op {
            ClientOp::Put { key, value, .. } => Request::Write(Write::Put(PutRequest {
                key: key.clone().into_bytes(),
                value: value.clone().into_bytes(),
                ..PutRequest::default()
            })),
            ClientOp::Cas {
                key, expected, new, ..
            } => Request::Write(Write::Txn(TxnRequest {
                compare: vec![Compare {
                    result: CompareResult::Equal,
                    target: CompareTarget::Value(expected.clone().into_bytes()),
                    key: key.clone().into_bytes(),
                    range_end: Vec::new(),
                }],
                success: vec![RequestOp::Put(PutRequest {
                    key: key.clone().into_bytes(),
                    value: new.clone().into_bytes(),
                    ..PutRequest::default()
                })],
                failure: Vec::new(),
            })),
            ClientOp::Read {
                span: (key, range_end),
                linearizable,
                ..
            } => Request::Range {
                key: key.clone(),
                range_end: range_end.clone(),
                linearizable: *linearizable,
            },
            ClientOp::Admin(change) => Request::Write(Write::Auth(AuthWrite {
                caller: None,
                change: change.clone(),
            })),
            ClientOp::AdminLease(id) => Request::Write(Write::LeaseGrant(LeaseGrant {
                id: *id,
                ttl_secs: ADMIN_LEASE_TTL,
            })),
            ClientOp::AdminRenew(id) => Request::Write(Write::LeaseRenew(LeaseRenew { id: *id })),
            ClientOp::Grant(held) => Request::Write(Write::LeaseGrant(LeaseGrant {
                id: held.id,
                ttl_secs: held.ttl_secs,
            })),
            ClientOp::AttachKey(id) => Request::Write(Write::Put(PutRequest {
                key: format!("lease/{}", id.get()).into_bytes(),
                value: b"held".to_vec(),
                lease: Some(*id),
                ..PutRequest::default()
            })),
            ClientOp::Renew(id) => Request::Write(Write::LeaseRenew(LeaseRenew { id: *id })),
            ClientOp::Revoke(id) => Request::Write(Write::LeaseRevoke(LeaseRevoke { id: *id })),
            ClientOp::Acquire(id) => Request::Write(Write::Txn(TxnRequest {
                compare: vec![created_at(0)],
                success: vec![RequestOp::Put(PutRequest {
                    key: LOCK_KEY.to_vec(),
                    value: format!("client {c}").into_bytes(),
                    lease: Some(*id),
                    ..PutRequest::default()
                })],
                failure: vec![RequestOp::Range(RangeRequest {
                    key: LOCK_KEY.to_vec(),
                    ..RangeRequest::default()
                })],
            })),
            ClientOp::Fenced(token) => {
                self.clients[c].written += 1;
                Request::Write(Write::Txn(TxnRequest {
                    compare: vec![created_at(*token)],
                    success: vec![RequestOp::Put(PutRequest {
                        key: FENCED_KEY.to_vec(),
                        value: format!("c{c}-{}", self.clients[c].written).into_bytes(),
                        ..PutRequest::default()
                    })],
                    failure: Vec::new(),
                }))
            }
            ClientOp::Release(token) => Request::Write(Write::Txn(TxnRequest {
                compare: vec![created_at(*token)],
                success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
                    key: LOCK_KEY.to_vec(),
                    ..DeleteRangeRequest::default()
                })],
                failure: Vec::new(),
            })),
        };
        // In auth seeds, KV clients write as their user, the others as root.
        let request = match (request, &self.auth) {
            (Request::Write(write), Some(_)) => {
                let user = if self.clients[c].kind == Kind::Kv {
                    KV_USER
                } else {
                    ROOT
                };
                Request::WriteAs(user, write)
            }
            (request, _) => request,
        };
        let client = &mut self.clients[c];
        client.next_op += 1;
        let n = client.next_op;
        let to = client.member;
        client.pending = Some((n, op.clone(), self.now));
        let delay = self.latency();
        self.after(
            delay,
            Ev::Request {
                to,
                client: c,
                op: n,
                request,
            },
        );
        self.after(CLIENT_TIMEOUT, Ev::ClientTimeout { client: c, op: n });
    }

    /// A watcher from `start` (0: from the member's next revision), on a random member.
    pub(super) fn new_watcher(&mut self, start: i64) {
        let member = self.rng.below(self.members.len() as u64) as usize;
        let start = if start > 0 {
            start
        } else {
            self.members[member].machine.store().current_revision() + 1
        };
        self.watchers.push(Watcher {
            member,
            start,
            next: start,
            seen: Vec::new(),
        });
        let w = self.watchers.len() - 1;
        self.after(SEC, Ev::WatchPoll(w));
    }

    pub(super) fn watch_poll(&mut self, w: usize) {
        let m = self.watchers[w].member;
        if !self.members[m].is_up() {
            // Its stream broke: it watches again on another member, from where it was.
            let n = self.members.len() as u64;
            self.watchers[w].member = self.rng.below(n) as usize;
            self.note(format!(
                "watcher {w} moves to m{}",
                self.watchers[w].member + 1
            ));
        } else if self.members[m].paused_until <= self.now {
            let store = self.members[m].machine.store();
            let current = store.current_revision();
            let next = self.watchers[w].next;
            if current >= next {
                let events: Vec<WatchedEvent> = store
                    .events(next, current, usize::MAX)
                    .expect("the simulator's stores release no value")
                    .iter()
                    .map(watched)
                    .collect();
                self.watchers[w].seen.extend(events);
                self.watchers[w].next = current + 1;
            }
        }
        let again = self.rng.range(10 * MS, 100 * MS);
        self.after(again, Ev::WatchPoll(w));
    }

    pub(super) fn client_dies(&mut self, c: usize) {
        self.clients[c].dead = true;
        if let Some(held) = self.clients[c].held {
            self.leases.holder_died(held.id.get(), self.now);
            self.note(format!("client {c} dies holding lease {}", held.id.get()));
        }
    }

    pub(super) fn new_client(&mut self, kind: Kind, after: u64) {
        let member = self.rng.below(self.members.len() as u64) as usize;
        self.clients.push(Client {
            kind,
            member,
            pending: None,
            next_op: 0,
            held: None,
            dead: false,
            written: 0,
            token: None,
            renewed_at: 0,
            zombie: false,
            keeper: false,
        });
        let c = self.clients.len() - 1;
        self.after(after, Ev::ClientWakes(c));
    }

    /// The admin's next change: the setup's next step, then the KV permission turned over.
    /// Then, in turn: a plain grant that is later revoked, or a grant bound to a lease that the
    /// admin renews a few times and then lets expire.
    pub(super) fn admin_op(&mut self) -> ClientOp {
        let auth = self.auth.as_mut().expect("an auth seed");
        if let Some(change) = auth.setup.front() {
            return ClientOp::Admin(change.clone());
        }
        match (auth.granted, auth.bound) {
            (true, Some(b)) if b.renewals_left > 0 => ClientOp::AdminRenew(b.id),
            (true, Some(_)) => {
                // Let go long enough ago for the lease, and the grant with it, to be gone (a
                // leader change extends a lease by its election timeout): grant again.
                auth.granted = false;
                auth.bound = None;
                self.admin_op()
            }
            (true, None) => ClientOp::Admin(kv_permission(false, None)),
            (false, Some(b)) if b.leased => ClientOp::Admin(kv_permission(true, Some(b.id))),
            (false, Some(b)) => ClientOp::AdminLease(b.id),
            (false, None) => {
                if auth.rng.chance(0.5) {
                    let id = LeaseId::from_wire(auth.rng.range(1, i64::MAX as u64) as i64)
                        .expect("not zero");
                    auth.bound = Some(BoundGrant {
                        id,
                        leased: false,
                        renewals_left: auth.rng.range(0, 4) as u32,
                    });
                    ClientOp::AdminLease(id)
                } else {
                    ClientOp::Admin(kv_permission(true, None))
                }
            }
        }
    }

    /// A KV write's outcome at apply, for the auth checker.
    pub(super) fn auth_checked(&mut self, at: LogPos, result: Result<(), AuthError>) {
        if let Some(auth) = self.auth.as_mut() {
            auth.writes.push((at, result));
        }
    }

    pub(super) fn kv_op(&mut self, c: usize) -> ClientOp {
        // Keys live for a window of 2 s each, so that no key's history outgrows the checker.
        let window = self.now / (2 * SEC);
        let key = format!("k{window}-{}", self.rng.below(KV_KEYS));
        let roll = self.rng.below(20);
        if roll < 11 {
            self.clients[c].written += 1;
            let value = format!("c{c}-{}", self.clients[c].written);
            if roll < 9 {
                let history = self.record(
                    &key,
                    HOp::Put {
                        value: value.clone(),
                        lease: 0,
                    },
                    false,
                );
                self.last_put.insert(key.clone(), value.clone());
                return ClientOp::Put {
                    key,
                    value,
                    history,
                };
            }
            // A compare-and-set on the value last put there (which may since have changed).
            let expected = self.last_put.get(&key).cloned().unwrap_or_default();
            let history = self.record(
                &key,
                HOp::Cas {
                    expected: expected.clone(),
                    new: value.clone(),
                },
                false,
            );
            self.last_put.insert(key.clone(), value.clone());
            return ClientOp::Cas {
                key,
                expected,
                new: value,
                history,
            };
        }
        // Reads: linearizable (11..17) or serializable (17..20); of one key, or of the whole
        // window (16 and 19).
        let linearizable = roll < 17;
        let (span, covered) = if roll == 16 || roll == 19 {
            let prefix = format!("k{window}-").into_bytes();
            let mut end = prefix.clone();
            *end.last_mut().expect("not empty") += 1;
            let keys = (0..KV_KEYS).map(|k| format!("k{window}-{k}")).collect();
            ((prefix, end), keys)
        } else {
            ((key.clone().into_bytes(), Vec::new()), vec![key])
        };
        let keys = covered
            .into_iter()
            .map(|k| {
                let h = self.record(&k, HOp::Get, !linearizable);
                (k, h)
            })
            .collect();
        ClientOp::Read {
            span,
            keys,
            linearizable,
        }
    }

    /// Records an operation on `key` invoked now; a serializable read as invoked at the start
    /// of the run instead, since it may return any state the key had before it completed (a
    /// member's applied state is a prefix of the log), never one it did not have.
    pub(super) fn record(&mut self, key: &str, op: HOp, stale_ok: bool) -> usize {
        let invoked = self.instant(if stale_ok { 0 } else { self.now });
        let events = self.histories.entry(key.to_string()).or_default();
        events.push(HEvent {
            client: 0,
            op,
            invoked,
            completed: None,
        });
        events.len() - 1
    }

    /// A lock client: keeps its lease alive, takes the lock, writes behind it with its token,
    /// and lets it go; sometimes it pauses past its TTL holding the lock and then writes with
    /// the token it had (which the fence must refuse once the lock key is gone).
    pub(super) fn lock_op(&mut self, c: usize) -> ClientOp {
        let client = &self.clients[c];
        let Some(held) = client.held.filter(|h| h.granted) else {
            return self.lease_op(c);
        };
        let (zombie, token, renewed_at) = (client.zombie, client.token, client.renewed_at);
        if zombie {
            self.clients[c].zombie = false;
            if let Some(token) = token {
                self.note(format!(
                    "client {c} wakes from a pause and writes with token {token}"
                ));
                return ClientOp::Fenced(token);
            }
        }
        if self.now.saturating_sub(renewed_at) > held.ttl_secs as u64 * SEC / 3 {
            return ClientOp::Renew(held.id);
        }
        match token {
            None => ClientOp::Acquire(held.id),
            Some(token) if self.rng.chance(0.2) => ClientOp::Release(token),
            Some(token) => ClientOp::Fenced(token),
        }
    }

    pub(super) fn lease_op(&mut self, c: usize) -> ClientOp {
        match self.clients[c].held {
            None => {
                let id = LeaseId::from_wire(self.rng.range(1, i64::MAX as u64) as i64)
                    .expect("non-zero");
                let ttl_secs = self.rng.range(3, 9) as i64;
                let held = Held {
                    id,
                    ttl_secs,
                    granted: false,
                };
                self.leases.granting(id.get(), ttl_secs as u64);
                if self.clients[c].keeper {
                    self.leases.kept(id.get());
                }
                self.clients[c].held = Some(held);
                ClientOp::Grant(held)
            }
            Some(held) if !held.granted => ClientOp::Grant(held),
            Some(held) => {
                // Due a renewal a third of the TTL after the last one, as clientv3 renews
                // (`keepalive_wait` draws when it wakes); whatever else it does waits.
                let renewed_at = self.clients[c].renewed_at;
                let due =
                    self.now.saturating_sub(renewed_at) >= held.ttl_secs as u64 * SEC * 8 / 30;
                if due {
                    ClientOp::Renew(held.id)
                } else if self.rng.chance(0.03) && !self.healed() {
                    ClientOp::Revoke(held.id)
                } else if self.rng.chance(0.2) {
                    ClientOp::AttachKey(held.id)
                } else {
                    ClientOp::Renew(held.id)
                }
            }
        }
    }

    pub(super) fn client_answer(&mut self, c: usize, op: u64, answer: Option<Answer>) {
        let Some((n, what, sent)) = self.clients[c].pending.clone() else {
            return;
        };
        if n != op {
            return;
        }
        self.clients[c].pending = None;
        let completed = self.instant(self.now);
        let failed = !matches!(answer, Some(Answer::Applied { .. } | Answer::Kvs(_)));
        let mut wait = self.rng.range(5 * MS, 60 * MS);
        match (what, answer) {
            (
                ClientOp::Put { key, history, .. },
                Some(Answer::Applied {
                    applied: Applied::Put(Ok(_)),
                    index,
                    pos,
                    ..
                }),
            ) => {
                self.auth_checked((index, pos), Ok(()));
                self.acked_writes += 1;
                self.histories.get_mut(&key).expect("recorded")[history].completed =
                    Some((completed, history::Answer::Done));
            }
            (
                ClientOp::Cas { key, history, .. },
                Some(Answer::Applied {
                    applied: Applied::Txn(Ok(txn)),
                    index,
                    pos,
                    ..
                }),
            ) => {
                self.auth_checked((index, pos), Ok(()));
                self.acked_writes += 1;
                self.histories.get_mut(&key).expect("recorded")[history].completed =
                    Some((completed, history::Answer::Swapped(txn.succeeded)));
            }
            (
                ClientOp::Put { key, history, .. } | ClientOp::Cas { key, history, .. },
                Some(Answer::Applied {
                    applied: Applied::Denied(e),
                    index,
                    pos,
                    ..
                }),
            ) => {
                // Refused at apply: it never took effect.
                self.auth_checked((index, pos), Err(e));
                let event = &mut self.histories.get_mut(&key).expect("recorded")[history];
                event.op = HOp::Get;
                event.completed = None;
            }
            (
                ClientOp::Admin(change),
                Some(Answer::Applied {
                    applied: Applied::Auth(result),
                    ..
                }),
            ) => {
                let auth = self.auth.as_mut().expect("an auth seed");
                let done = match result {
                    // Done, or done by an earlier try whose answer was lost.
                    Ok(())
                    | Err(
                        AuthError::UserAlreadyExist
                        | AuthError::RoleAlreadyExist
                        | AuthError::PermissionNotGranted,
                    ) => true,
                    // A stale token (the revision moved): again.
                    Err(_) => false,
                };
                if done {
                    if auth.setup.front() == Some(&change) {
                        auth.setup.pop_front();
                        wait = auth.rng.range(10 * MS, 100 * MS);
                    } else if let Some(b) = auth.bound {
                        // Renewals next; with none left, the grant lapses with its lease, or
                        // (half the time) is replaced by a plain grant before it does.
                        wait = if b.renewals_left > 0 || auth.rng.chance(0.5) {
                            auth.rng.range(400 * MS, 700 * MS)
                        } else {
                            (ADMIN_LEASE_TTL as u64 + 4) * SEC
                        };
                    } else {
                        wait = auth.rng.range(SEC, 4 * SEC);
                    }
                    match change {
                        AuthChange::RoleGrantPermission { .. } => auth.granted = true,
                        AuthChange::RoleRevokePermission { .. } => auth.granted = false,
                        _ => {}
                    }
                    self.note(format!("admin: {change:?} done"));
                } else if result == Err(AuthError::LeaseNotFound) {
                    // The lease ran out first: another one.
                    auth.bound = None;
                }
            }
            (
                ClientOp::AdminLease(id),
                Some(Answer::Applied {
                    applied: Applied::LeaseGrant(result),
                    ..
                }),
            ) => {
                let auth = self.auth.as_mut().expect("an auth seed");
                match (result, auth.bound.as_mut()) {
                    (Ok(()), Some(b)) if b.id == id => b.leased = true,
                    _ => auth.bound = None,
                }
            }
            (
                ClientOp::AdminRenew(id),
                Some(Answer::Applied {
                    applied: Applied::LeaseRenew(ttl),
                    ..
                }),
            ) => {
                let auth = self.auth.as_mut().expect("an auth seed");
                match (ttl, auth.bound.as_mut()) {
                    (Some(_), Some(b)) if b.id == id => {
                        b.renewals_left -= 1;
                        wait = if b.renewals_left == 0 {
                            (ADMIN_LEASE_TTL as u64 + 4) * SEC
                        } else {
                            auth.rng.range(400 * MS, 700 * MS)
                        };
                    }
                    _ => {
                        // The lease is gone, and the grant with it.
                        auth.granted = false;
                        auth.bound = None;
                    }
                }
            }
            (ClientOp::Read { keys, .. }, Some(Answer::Kvs(kvs))) => {
                for (key, h) in keys {
                    let value = kvs
                        .iter()
                        .find(|(k, _)| *k == key.as_bytes())
                        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
                    self.histories.get_mut(&key).expect("recorded")[h].completed =
                        Some((completed, history::Answer::Value(value)));
                }
            }
            (
                ClientOp::Grant(held),
                Some(Answer::Applied {
                    applied: Applied::LeaseGrant(result),
                    stamped_at,
                    ..
                }),
            ) => {
                if result.is_ok() || self.leases.known(held.id.get()) {
                    self.clients[c].held = Some(Held {
                        granted: true,
                        ..held
                    });
                    self.clients[c].renewed_at = sent;
                    if let (Ok(()), Some(at)) = (result, stamped_at) {
                        self.leases
                            .promised(held.id.get(), at, held.ttl_secs as u64);
                        self.note(format!(
                            "client {c}: lease {} granted for {} s, stamped at {} µs",
                            held.id.get(),
                            held.ttl_secs,
                            at.true_us
                        ));
                    }
                    wait = self.keepalive_wait(held.ttl_secs);
                } else {
                    // Granted by an earlier try whose answer was lost: the id exists.
                    self.clients[c].held = Some(Held {
                        granted: true,
                        ..held
                    });
                }
            }
            (
                ClientOp::Renew(id),
                Some(Answer::Applied {
                    applied: Applied::LeaseRenew(ttl),
                    stamped_at,
                    ..
                }),
            ) => match ttl {
                Some(ttl) if ttl > 0 => {
                    if let Some(at) = stamped_at {
                        self.leases.promised(id.get(), at, ttl as u64);
                        self.note(format!(
                            "client {c}: lease {} renewed for {ttl} s, stamped at {} µs (lease time {})",
                            id.get(),
                            at.true_us,
                            at.lease_ms
                        ));
                    }
                    wait = self.keepalive_wait(ttl);
                    self.clients[c].renewed_at = sent;
                }
                _ => {
                    self.note(format!("client {c}: lease {} is gone", id.get()));
                    self.clients[c].held = None;
                    self.clients[c].token = None;
                }
            },
            (
                ClientOp::Acquire(id),
                Some(Answer::Applied {
                    applied: Applied::Txn(Ok(response)),
                    ..
                }),
            ) => {
                let token = if response.succeeded {
                    Some(response.revision)
                } else {
                    // Held already: by this lease (an earlier try whose answer was lost), or
                    // by another.
                    response.responses.iter().find_map(|r| match r {
                        ResponseOp::Range(r) => r
                            .kvs
                            .first()
                            .filter(|kv| kv.lease == Some(id))
                            .map(|kv| kv.create_revision),
                        _ => None,
                    })
                };
                if let Some(token) = token {
                    self.clients[c].token = Some(token);
                    self.note(format!("client {c} holds the lock, token {token}"));
                    if !self.healed() && self.rng.chance(0.15) {
                        // A pause (GC, SIGSTOP) longer than its TTL, holding the lock.
                        let ttl = self.clients[c].held.map_or(3, |h| h.ttl_secs) as u64;
                        self.clients[c].zombie = true;
                        wait = ttl * SEC + self.rng.range(SEC, 2 * SEC);
                    }
                } else {
                    wait = self.rng.range(100 * MS, 400 * MS);
                }
            }
            (
                ClientOp::Fenced(token),
                Some(Answer::Applied {
                    applied: Applied::Txn(Ok(response)),
                    ..
                }),
            ) => {
                if response.succeeded {
                    self.fenced.push((response.revision, token));
                    self.note(format!(
                        "client {c}: fenced write with token {token} at revision {}",
                        response.revision
                    ));
                } else {
                    self.note(format!("client {c}: the fence refused token {token}"));
                    self.clients[c].token = None;
                }
            }
            (ClientOp::Release(_), Some(Answer::Applied { .. })) => {
                self.clients[c].token = None;
                wait = self.rng.range(50 * MS, 500 * MS);
            }
            (
                ClientOp::Revoke(id),
                Some(Answer::Applied {
                    applied: Applied::LeaseRevoke(_),
                    ..
                }),
            ) => {
                self.clients[c].held = None;
                let _ = id;
            }
            (ClientOp::AttachKey(_), Some(Answer::Applied { .. })) => {
                let ttl = self.clients[c].held.map_or(3, |h| h.ttl_secs);
                wait = self.keepalive_wait(ttl);
            }
            _ => {}
        }
        if self.clients[c].kind == Kind::Lock && !self.clients[c].zombie {
            // A lock client renews when it must (`lock_op`), and otherwise goes on working.
            wait = wait.min(self.rng.range(20 * MS, 200 * MS));
        }
        if failed {
            if std::env::var_os("SIM_DEBUG").is_some() {
                self.note(format!(
                    "DEBUG client {c} op failed at m{}",
                    self.clients[c].member + 1
                ));
            }
            // Another member next time, after a pause.
            let n = self.members.len() as u64;
            self.clients[c].member = self.rng.below(n) as usize;
            wait = self.rng.range(50 * MS, 300 * MS);
        }
        self.after(wait, Ev::ClientWakes(c));
    }

    /// Keepalives at a third of the TTL, with jitter (etcd's clients renew at TTL/3).
    pub(super) fn keepalive_wait(&mut self, ttl_secs: i64) -> u64 {
        let third = ttl_secs as u64 * SEC / 3;
        self.rng.range(third * 8 / 10, third * 11 / 10)
    }

    // ---- the end ----
}
