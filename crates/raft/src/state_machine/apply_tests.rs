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
