//! A snapshot's file, written from a leader's rows and received by a follower, installs the
//! leader's state exactly; one that arrives damaged is refused before Raft would see it.

use std::collections::BTreeMap;

use leasehold_lease::LeaseId;
use leasehold_mvcc::{DeleteRangeRequest, PutRequest};

use super::{
    Applying, SnapshotPayload, StateMachine, apply_entries, install_file, receive, write_outgoing,
};
use crate::position::{self, LogPosition};
use crate::storage::{self, encode};
use crate::{Alarm, AlarmChange, AlarmMember, Command, Proposal};

fn at(index: u64) -> LogPosition {
    LogPosition { term: 1, index }
}

fn lease(id: i64) -> LeaseId {
    LeaseId::from_wire(id).expect("non-zero")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshots_file_installs_the_leaders_state_and_a_damaged_one_is_refused() {
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

    let (meta, reference) = write_outgoing(&db).unwrap();
    let payload = SnapshotPayload::read(&db).unwrap();
    // a@2 (still seen at the compaction point), a@5, b@3, c@4, c's tombstone at 6, d@7.
    assert_eq!(payload.records.len(), 6);
    assert_eq!(payload.leases.len(), 2);
    assert_eq!(meta.last_applied, payload.last_applied);
    assert_eq!(payload.last_applied, Some(at(2)));
    assert_eq!((reference.index, reference.term), (2, 1));
    let file = std::fs::read(super::outgoing_file(&db, &reference.to_data()).unwrap()).unwrap();
    assert_eq!(file.len() as u64, reference.bytes);

    // A follower with a state of its own, which the snapshot replaces.
    let follower_dir = tempfile::tempdir().unwrap();
    let follower_db = storage::open(follower_dir.path()).unwrap();
    let follower = StateMachine::open(follower_db.clone()).unwrap();
    apply_entries(
        &follower.shared(),
        &follower_db,
        vec![(
            at(1),
            Applying::Normal(Proposal {
                commands: vec![put("stale", None)],
            }),
        )],
        |_| std::time::Instant::now(),
    )
    .unwrap();

    // Damaged on the way: one byte flipped, or cut short. Refused, and nothing installed.
    let mut flipped = file.clone();
    flipped[file.len() / 2] ^= 1;
    for damaged in [flipped, file[..file.len() - 1].to_vec()] {
        let received = receive(&follower_db, reference, |into| {
            into.write_all(&damaged).map_err(|e| e.to_string())
        });
        assert!(received.is_err(), "a damaged file is refused");
        assert!(install_file(&follower.shared(), &follower_db, reference).is_err());
    }
    // A transfer that failed part way is refused too.
    let failed = receive(&follower_db, reference, |into| {
        into.write_all(&file[..10]).unwrap();
        Err("the leader went away".to_owned())
    });
    assert_eq!(failed, Err("the leader went away".to_owned()));

    receive(&follower_db, reference, |into| {
        into.write_all(&file).map_err(|e| e.to_string())
    })
    .unwrap();
    install_file(&follower.shared(), &follower_db, reference).unwrap();
    let installed = SnapshotPayload::read(&follower_db).unwrap();
    assert_eq!(
        encode(&installed),
        encode(&payload),
        "the file holds the leader's rows"
    );
    let raised = vec![AlarmMember {
        member: 7,
        alarm: Alarm::NoSpace,
    }];
    {
        let state = follower.shared.state.read().unwrap();
        assert_eq!(state.last_applied, Some(at(2)));
        assert_eq!(state.store.current_revision(), 7);
        assert_eq!(state.leases.len(), 2);
        assert_eq!(state.alarms.iter().copied().collect::<Vec<_>>(), raised);
        let keys = state.store.range(&leasehold_mvcc::RangeRequest {
            key: b"a".to_vec(),
            range_end: vec![0],
            ..Default::default()
        });
        let keys: Vec<Vec<u8>> = keys.unwrap().kvs.into_iter().map(|kv| kv.key).collect();
        assert!(
            !keys.contains(&b"stale".to_vec()),
            "the follower's own keys are gone"
        );
    }
    // And survive a restart: the file holds them.
    drop(follower);
    drop(sm);
    let reopened = StateMachine::open(follower_db).unwrap();
    let state = reopened.shared.state.read().unwrap();
    assert_eq!(state.alarms.iter().copied().collect::<Vec<_>>(), raised);
}
