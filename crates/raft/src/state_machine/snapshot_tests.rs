//! A snapshot streamed from the file's rows is byte for byte the encoding of the payload read
//! and decoded from the same file, so `install_snapshot` (which decodes that payload) takes it.

use std::collections::BTreeMap;

use leasehold_lease::LeaseId;
use leasehold_mvcc::{DeleteRangeRequest, PutRequest};

use super::{Applying, SnapshotPayload, StateMachine, apply_entries, snapshot_bytes_from_file};
use crate::position::{self, LogPosition};
use crate::storage::{self, decode, encode};
use crate::{Alarm, AlarmChange, AlarmMember, Command, Proposal};

fn at(index: u64) -> LogPosition {
    LogPosition { term: 1, index }
}

fn lease(id: i64) -> LeaseId {
    LeaseId::from_wire(id).expect("non-zero")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_snapshot_is_the_payloads_encoding() {
    let dir = tempfile::tempdir().unwrap();
    let db = storage::open(dir.path()).unwrap();
    let sm = StateMachine::open(db.clone()).unwrap();
    let put = |key: &str, lease: Option<LeaseId>| {
        Command::Put(PutRequest {
            key: key.into(),
            value: format!("value of {key}").into_bytes(),
            lease,
            ..Default::default()
        })
    };
    let commands = vec![
        Command::LeaseGrant {
            id: lease(5),
            ttl_secs: 30,
            now_ms: 1_000,
        },
        // A negative id sorts after the positive ones in the file.
        Command::LeaseGrant {
            id: lease(-3),
            ttl_secs: 60,
            now_ms: 1_000,
        },
        put("a", Some(lease(5))),
        put("b", Some(lease(-3))),
        put("c", None),
        put("a", None),
        Command::DeleteRange(DeleteRangeRequest {
            key: b"c".to_vec(),
            range_end: Vec::new(),
            prev_kv: false,
        }),
        put("d", None),
        Command::Compact { revision: 4 },
        Command::Alarm(AlarmChange {
            activate: true,
            alarm: AlarmMember {
                member: 7,
                alarm: Alarm::NoSpace,
            },
        }),
    ];
    let members = position::voters(&BTreeMap::from([(7, "http://127.0.0.1:1".to_owned())]));
    apply_entries(
        &sm.shared(),
        &db,
        vec![
            (at(1), Applying::Membership(members)),
            (at(2), Applying::Normal(Proposal { commands })),
        ],
        |_| std::time::Instant::now(),
    )
    .unwrap();

    let (meta, streamed) = snapshot_bytes_from_file(&db).unwrap();
    let payload = SnapshotPayload::read(&db).unwrap();
    assert_eq!(streamed, encode(&payload));
    // a@2 (still seen at the compaction point), a@5, b@3, c@4, c's tombstone at 6, d@7.
    assert_eq!(payload.records.len(), 6);
    assert_eq!(payload.leases.len(), 2);
    assert_eq!(meta.last_applied, payload.last_applied);
    assert_eq!(payload.last_applied, Some(at(2)));
    let decoded: SnapshotPayload = decode("a snapshot", &streamed).unwrap();
    assert_eq!(decoded.leases, payload.leases);
    assert_eq!(decoded.current_revision, 7);
    let raised = vec![AlarmMember {
        member: 7,
        alarm: Alarm::NoSpace,
    }];
    assert_eq!(decoded.alarms, raised, "alarms travel in the snapshot");
    // And survive a restart: the file holds them.
    drop(sm);
    let reopened = StateMachine::open(db).unwrap();
    let state = reopened.shared.state.read().unwrap();
    assert_eq!(state.alarms.iter().copied().collect::<Vec<_>>(), raised);
}
