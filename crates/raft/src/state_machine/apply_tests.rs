//! `apply_command` driven directly by tables of commands and the outcome each must have, plus
//! the keys and leases left afterwards. The renew/expire/revoke races live here: in the log,
//! whichever of a renewal and an expiry is applied first decides, and a renewal never answers a
//! positive TTL for a lease whose keys are deleted (etcd#20547).

use leasehold_lease::LeaseId;
use leasehold_mvcc::{PutRequest, PutResponse, RangeRequest};

use super::{Effects, SmState, apply_command};
use crate::{Applied, Command};

const LEASE: i64 = 7;
const TTL_SECS: i64 = 10;

fn id(raw: i64) -> LeaseId {
    LeaseId::from_wire(raw).expect("non-zero")
}

fn grant(now_ms: u64) -> Command {
    Command::LeaseGrant {
        id: id(LEASE),
        ttl_secs: TTL_SECS,
        now_ms,
    }
}

fn put_leased(key: &str) -> Command {
    Command::Put(PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        lease: Some(id(LEASE)),
        ..Default::default()
    })
}

fn renew(now_ms: u64) -> Command {
    Command::LeaseRenew {
        id: id(LEASE),
        now_ms,
    }
}

fn expire(now_ms: u64) -> Command {
    Command::LeaseExpire {
        ids: vec![id(LEASE)],
        now_ms,
    }
}

fn put_ok(revision: i64) -> Applied {
    Applied::Put(Ok(PutResponse {
        revision,
        prev_kv: None,
    }))
}

/// Applies `steps` in order to a fresh state, checking each outcome, then checks which keys and
/// leases are left. Validates the lease table after every step.
fn check(steps: &[(Command, Applied)], keys_left: &[&str], leases_left: &[i64]) {
    let mut state = SmState::default();
    let mut fx = Effects::default();
    for (i, (command, expected)) in steps.iter().enumerate() {
        let applied = apply_command(&mut state, command, &mut fx);
        assert_eq!(&applied, expected, "step {i}: {command:?}");
        state.leases.validate();
    }
    let everything = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    let keys: Vec<String> = state
        .store
        .range(&everything)
        .expect("range")
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect();
    assert_eq!(keys, keys_left, "keys left");
    let leases: Vec<i64> = state.leases.iter_by_id(None).map(|l| l.id.get()).collect();
    assert_eq!(leases, leases_left, "leases left");
}

#[test]
fn renewal_after_an_applied_expiry_answers_ttl_zero() {
    check(
        &[
            (grant(0), Applied::LeaseGrant(Ok(()))),
            (put_leased("k"), put_ok(2)),
            (expire(10_000), Applied::LeaseExpire(1)),
            (renew(10_001), Applied::LeaseRenew(None)),
        ],
        &[],
        &[],
    );
}

#[test]
fn expiry_after_an_applied_renewal_revokes_nothing() {
    // The leader saw the lease due at 10,000, but a renewal was committed before its expiry:
    // applying the expiry re-checks the deadline (now 15,000) and leaves lease and key alone.
    check(
        &[
            (grant(0), Applied::LeaseGrant(Ok(()))),
            (put_leased("k"), put_ok(2)),
            (renew(5_000), Applied::LeaseRenew(Some(TTL_SECS))),
            (expire(10_000), Applied::LeaseExpire(0)),
        ],
        &["k"],
        &[LEASE],
    );
}

#[test]
fn renewal_that_arrives_after_the_deadline_revokes_and_answers_ttl_zero() {
    // No expiry was proposed yet: the renewal itself finds the lease past its deadline, deletes
    // its keys in the same apply and answers TTL 0, never a positive TTL.
    check(
        &[
            (grant(0), Applied::LeaseGrant(Ok(()))),
            (put_leased("k"), put_ok(2)),
            (renew(10_001), Applied::LeaseRenew(None)),
        ],
        &[],
        &[],
    );
}

#[test]
fn renewal_at_the_deadline_itself_still_renews() {
    check(
        &[
            (grant(0), Applied::LeaseGrant(Ok(()))),
            (put_leased("k"), put_ok(2)),
            (renew(10_000), Applied::LeaseRenew(Some(TTL_SECS))),
            (expire(19_999), Applied::LeaseExpire(0)),
            (expire(20_000), Applied::LeaseExpire(1)),
        ],
        &[],
        &[],
    );
}

#[test]
fn renewal_after_a_revoke_answers_ttl_zero() {
    check(
        &[
            (grant(0), Applied::LeaseGrant(Ok(()))),
            (put_leased("k"), put_ok(2)),
            (
                Command::LeaseRevoke { id: id(LEASE) },
                Applied::LeaseRevoke(Ok(3)),
            ),
            (renew(1), Applied::LeaseRenew(None)),
        ],
        &[],
        &[],
    );
}

#[test]
fn renewal_never_shortens_a_deadline() {
    // A renewal stamped with an earlier lease time than the deadline it would set keeps the
    // later deadline (a promotion may have extended it).
    check(
        &[
            (grant(0), Applied::LeaseGrant(Ok(()))),
            (
                Command::LeasePromote {
                    now_ms: 9_000,
                    extend_ms: 30_000,
                },
                Applied::LeasePromote,
            ),
            (renew(9_500), Applied::LeaseRenew(Some(TTL_SECS))),
            (expire(20_000), Applied::LeaseExpire(0)),
            (expire(39_000), Applied::LeaseExpire(1)),
        ],
        &[],
        &[],
    );
}

/// An auth change as the log carries it, made while auth is off (no caller needed).
fn auth_change(change: leasehold_auth::AuthChange) -> Command {
    Command::Auth(crate::AuthWrite {
        caller: None,
        change,
    })
}

/// Role `r` gets read-write over `[key, range_end)`, bound to `lease` if given.
fn grant_to_r(key: &str, range_end: &str, lease: Option<i64>) -> leasehold_auth::AuthChange {
    leasehold_auth::AuthChange::RoleGrantPermission {
        role: "r".into(),
        perm: leasehold_auth::Permission {
            kind: leasehold_auth::PermKind::ReadWrite,
            key: key.as_bytes().to_vec(),
            range_end: range_end.as_bytes().to_vec(),
            lease,
        },
    }
}

/// With auth on, a write is applied only for a caller whose grants, as of the auth revision the
/// edge looked them up at, still allow it: a revoke applied between the check and the write
/// stops it (etcd's "revision of auth store is old"); a write without a caller is refused; a
/// lease revoke needs write permission on the lease's keys.
#[test]
fn auth_is_checked_when_a_write_is_applied() {
    use crate::AuthWrite;
    use leasehold_auth::{AuthChange, AuthError};

    let mut state = SmState::default();
    let mut fx = Effects::default();
    let mut apply = |state: &mut SmState, cmd: Command| apply_command(state, &cmd, &mut fx);
    for change in [
        AuthChange::UserAdd {
            name: "root".into(),
            password_hash: None,
        },
        AuthChange::UserGrantRole {
            user: "root".into(),
            role: "root".into(),
        },
        AuthChange::UserAdd {
            name: "alice".into(),
            password_hash: None,
        },
        AuthChange::RoleAdd { name: "r".into() },
        grant_to_r("app/", "app0", None),
        AuthChange::UserGrantRole {
            user: "alice".into(),
            role: "r".into(),
        },
        AuthChange::Enable,
    ] {
        assert_eq!(
            apply(&mut state, auth_change(change)),
            Applied::Auth(Ok(()))
        );
    }
    let put = |key: &str| PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        ..Default::default()
    };
    let alice = state.auth.caller("alice");
    let root = state.auth.caller("root");
    let as_ = |caller: &leasehold_auth::Caller, cmd: Command| Command::As {
        caller: caller.clone(),
        command: Box::new(cmd),
    };
    assert_eq!(
        apply(&mut state, as_(&alice, Command::Put(put("app/a")))),
        put_ok(2)
    );
    assert_eq!(
        apply(&mut state, as_(&alice, Command::Put(put("other")))),
        Applied::Denied(AuthError::PermissionDenied)
    );
    assert_eq!(
        apply(&mut state, Command::Put(put("app/b"))),
        Applied::Denied(AuthError::UserEmpty)
    );
    // The grant goes (applied by root) after alice's permissions were looked up.
    let revoke = AuthChange::RoleRevokePermission {
        role: "r".into(),
        key: b"app/".to_vec(),
        range_end: b"app0".to_vec(),
    };
    let revoked = Command::Auth(AuthWrite {
        caller: Some(root.clone()),
        change: revoke,
    });
    assert_eq!(apply(&mut state, revoked), Applied::Auth(Ok(())));
    assert_eq!(
        apply(&mut state, as_(&alice, Command::Put(put("app/c")))),
        Applied::Denied(AuthError::AuthOldRevision)
    );
    let alice = state.auth.caller("alice");
    assert_eq!(
        apply(&mut state, as_(&alice, Command::Put(put("app/c")))),
        Applied::Denied(AuthError::PermissionDenied)
    );
    // A lease with a key alice may not write: she may not revoke it; root may.
    assert!(matches!(
        apply(&mut state, grant(0)),
        Applied::LeaseGrant(Ok(()))
    ));
    let root = state.auth.caller("root");
    assert_eq!(apply(&mut state, as_(&root, put_leased("k"))), put_ok(3));
    let revoke_lease = || Command::LeaseRevoke { id: id(LEASE) };
    assert_eq!(
        apply(&mut state, as_(&alice, revoke_lease())),
        Applied::Denied(AuthError::PermissionDenied)
    );
    assert!(matches!(
        apply(&mut state, as_(&root, revoke_lease())),
        Applied::LeaseRevoke(Ok(_))
    ));
    let k = RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    };
    assert!(
        state.store.range(&k).unwrap().kvs.is_empty(),
        "root's revoke deleted k"
    );
}

/// leasehold's extension: a grant bound to a lease lives while the lease does. Renewing keeps
/// it; the expiry that deletes the lease's keys removes it in the same command (lease time is
/// given, not read from a clock). A grant bound to a lease that does not exist is refused.
#[test]
fn a_grant_bound_to_a_lease_ends_with_it() {
    use leasehold_auth::{AuthChange, AuthError};

    let mut state = SmState::default();
    let mut fx = Effects::default();
    let mut apply = |state: &mut SmState, cmd: Command| apply_command(state, &cmd, &mut fx);
    let auth = auth_change;
    let bound = |lease| grant_to_r("svc/", "svc0", Some(lease));
    apply(&mut state, auth(AuthChange::RoleAdd { name: "r".into() }));
    assert_eq!(
        apply(&mut state, auth(bound(LEASE))),
        Applied::Auth(Err(AuthError::LeaseNotFound))
    );
    assert!(matches!(
        apply(&mut state, grant(0)),
        Applied::LeaseGrant(Ok(()))
    ));
    assert_eq!(apply(&mut state, auth(bound(LEASE))), Applied::Auth(Ok(())));
    assert_eq!(apply(&mut state, put_leased("svc/me")), put_ok(2));
    // Renewed at 9 s: the deadline moves to 19 s; an expiry pass at 15 s finds nothing due.
    assert_eq!(
        apply(&mut state, renew(9_000)),
        Applied::LeaseRenew(Some(TTL_SECS))
    );
    assert_eq!(apply(&mut state, expire(15_000)), Applied::LeaseExpire(0));
    assert_eq!(
        state.auth.roles["r"].perms.len(),
        1,
        "renewing keeps the grant"
    );
    let revision = state.auth.revision;
    assert_eq!(apply(&mut state, expire(19_000)), Applied::LeaseExpire(1));
    assert!(
        state.auth.roles["r"].perms.is_empty(),
        "the grant went with the lease"
    );
    assert_eq!(state.auth.revision, revision + 1);
}
