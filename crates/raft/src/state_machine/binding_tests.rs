//! The key bindings under random commands: the lease table shares the store's key bytes, and its
//! key sets must stay exactly what the store's live keys name, through puts that move a key
//! between leases (or off any), `ignore_lease` puts, deletes, txns, revokes, expiries and
//! compactions, and after a rebuild from persisted parts (a restart).

use leasehold_lease::LeaseId;
use leasehold_mvcc::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest,
};
use proptest::prelude::*;

use super::{Effects, SmState, apply_command};
use crate::Command;

const KEYS: u8 = 6;
const LEASES: i64 = 3;

fn key(k: u8) -> Vec<u8> {
    vec![b'k', b'0' + k]
}

fn lease(l: i64) -> Option<LeaseId> {
    LeaseId::from_wire(l)
}

fn put(k: u8, l: i64, ignore_lease: bool) -> PutRequest {
    PutRequest {
        key: key(k),
        value: vec![k],
        lease: if ignore_lease { None } else { lease(l) },
        ignore_lease,
        ..Default::default()
    }
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (1..=LEASES).prop_map(|l| Command::LeaseGrant {
            id: lease(l).expect("non-zero"),
            ttl_secs: 10,
            now_ms: 0,
        }),
        // Lease 0 means none.
        (0..KEYS, 0..=LEASES, any::<bool>())
            .prop_map(|(k, l, ignore)| Command::Put(put(k, l, ignore))),
        (0..KEYS, 0..KEYS).prop_map(|(a, b)| Command::DeleteRange(DeleteRangeRequest {
            key: key(a.min(b)),
            range_end: if a == b { Vec::new() } else { key(a.max(b)) },
            prev_kv: false,
        })),
        // A txn that moves one key and deletes another at one revision.
        (0..KEYS, 0..KEYS, 0..=LEASES).prop_map(|(a, b, l)| Command::Txn(TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Greater,
                target: CompareTarget::Version(-1),
                key: key(a),
                range_end: Vec::new(),
            }],
            success: vec![
                RequestOp::Put(put(a, l, false)),
                RequestOp::DeleteRange(DeleteRangeRequest {
                    key: key(b),
                    range_end: Vec::new(),
                    prev_kv: false,
                }),
            ]
            .into_iter()
            .filter(|op| a != b || matches!(op, RequestOp::Put(_)))
            .collect(),
            failure: Vec::new(),
        })),
        (1..=LEASES).prop_map(|l| Command::LeaseRevoke {
            id: lease(l).expect("non-zero"),
        }),
        (1..=LEASES).prop_map(|l| Command::LeaseExpire {
            ids: vec![lease(l).expect("non-zero")],
            now_ms: 1_000_000,
        }),
        // A revision below the current one compacts; others are refused, which is fine.
        (2..40i64).prop_map(|revision| Command::Compact { revision }),
    ]
}

proptest! {
    #[test]
    fn bindings_follow_the_store(commands in proptest::collection::vec(command(), 1..80)) {
        let mut state = SmState::default();
        let mut fx = Effects::default();
        for command in &commands {
            apply_command(&mut state, command, &mut fx);
            state.store.validate();
            state.leases.validate();
            state.validate_bindings();
        }
        // A restart rebuilds the bindings from the persisted records alone.
        let rebuilt = SmState::assemble(
            leasehold_mvcc::Store::restore(
                state.store.current_revision(),
                state.store.compact_revision(),
                state.store.records().unwrap(),
            ),
            leasehold_lease::LeaseTable::restore(state.leases.clock_ms(), state.leases.records()),
            None,
            Default::default(),
        );
        rebuilt.store.validate();
        rebuilt.leases.validate();
        rebuilt.validate_bindings();
        let sets = |s: &SmState| -> Vec<(i64, Vec<Vec<u8>>)> {
            s.leases
                .iter_by_id(None)
                .map(|l| (l.id.get(), l.keys().map(<[u8]>::to_vec).collect()))
                .collect()
        };
        prop_assert_eq!(sets(&rebuilt), sets(&state));
    }
}
