use std::collections::BTreeMap;

use leasehold_mvcc::{PutRequest, RangeRequest};

use crate::position::{self, LogPosition};
use crate::state_machine::{Applying, StateMachine, apply_entries};
use crate::{Applied, Command, Proposal, Replica, ReplicaConfig, storage};

fn put(key: &str) -> Applying {
    Applying::Normal(Proposal {
        commands: vec![Command::Put(PutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            ..Default::default()
        })],
    })
}

fn at(index: u64) -> LogPosition {
    LogPosition { term: 1, index }
}

/// What was applied and checkpointed is what the file gives back: the applied position, the
/// membership and every record (a restart replays the log from there, so neither may be lost
/// or moved).
#[test]
fn state_machine_reopens_at_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let members = position::voters(&BTreeMap::from([(7, "http://127.0.0.1:1".to_owned())]));
    let records = {
        let db = storage::open(dir.path()).unwrap();
        let sm = StateMachine::open(db.clone()).unwrap();
        let replies = apply_entries(
            &sm.shared(),
            &db,
            vec![
                (at(1), Applying::Membership(members.clone())),
                (at(2), put("a")),
                (at(3), put("b")),
            ],
            |_| std::time::Instant::now(),
        )
        .unwrap();
        assert!(replies[0].is_empty(), "a membership entry answers nothing");
        assert!(matches!(replies[1][..], [Applied::Put(Ok(ref r))] if r.revision == 2));
        assert_eq!(db.checkpoint().unwrap(), Some(at(3)));
        crate::state_machine::read(&sm.shared(), |s| s.records()).unwrap()
    };
    let db = storage::open(dir.path()).unwrap();
    let reopened = StateMachine::open(db).unwrap();
    let shared = reopened.shared();
    let state = shared.state.read().unwrap();
    assert_eq!(state.last_applied, Some(at(3)));
    assert_eq!(state.membership, members);
    assert_eq!(state.store.records().unwrap(), records);
}

/// A value leaves memory once the file durably holds its row, and is read back from the file by
/// a read at its revision, before and after a restart.
#[test]
fn released_values_are_read_back_from_the_file() {
    const VALUE_BYTES: usize = 100_000;
    const PUTS: u64 = 60;
    let dir = tempfile::tempdir().unwrap();
    let members = position::voters(&BTreeMap::from([(7, "http://127.0.0.1:1".to_owned())]));
    let put_big = |n: u64| {
        Applying::Normal(Proposal {
            commands: vec![Command::Put(PutRequest {
                key: b"k".to_vec(),
                value: vec![n as u8; VALUE_BYTES],
                ..Default::default()
            })],
        })
    };
    let value_at = |sm: &StateMachine, revision: i64| {
        crate::state_machine::read(&sm.shared(), |s| {
            s.range(&RangeRequest {
                key: b"k".to_vec(),
                revision,
                ..Default::default()
            })
        })
        .unwrap()
        .kvs[0]
            .value
            .clone()
    };
    let held =
        |sm: &StateMachine| crate::state_machine::read(&sm.shared(), |s| s.releasable_bytes());
    {
        let db = storage::open(dir.path()).unwrap();
        let sm = StateMachine::open(db.clone()).unwrap();
        let mut entries = vec![(at(1), Applying::Membership(members.clone()))];
        entries.extend((2..=PUTS + 1).map(|i| (at(i), put_big(i))));
        apply_entries(&sm.shared(), &db, entries, |_| std::time::Instant::now()).unwrap();
        assert_eq!(
            held(&sm),
            PUTS as usize * VALUE_BYTES,
            "nothing is released before its checkpoint"
        );
        assert!(db.checkpoint().unwrap().is_some());
        apply_entries(
            &sm.shared(),
            &db,
            vec![(at(PUTS + 2), put("other"))],
            |_| std::time::Instant::now(),
        )
        .unwrap();
        assert!(
            held(&sm) <= storage::VALUES_HELD_BYTES,
            "released down to the bound"
        );
        // Revision 2 holds the first put (index 2), released and read back from the file.
        assert_eq!(value_at(&sm, 2), vec![2u8; VALUE_BYTES]);
        assert_eq!(value_at(&sm, 0), vec![(PUTS + 1) as u8; VALUE_BYTES]);
        assert!(db.checkpoint().unwrap().is_some());
    }
    // The member holds the file open while it runs; the state machine only reads through it.
    let db = storage::open(dir.path()).unwrap();
    let reopened = StateMachine::open(db.clone()).unwrap();
    assert!(
        held(&reopened) <= storage::VALUES_HELD_BYTES,
        "released at load"
    );
    assert_eq!(value_at(&reopened, 3), vec![3u8; VALUE_BYTES]);
    let events =
        crate::state_machine::read(&reopened.shared(), |s| s.events(3, 4, usize::MAX)).unwrap();
    assert_eq!(
        events[1].prev_kv.as_ref().unwrap().value,
        vec![3u8; VALUE_BYTES]
    );
}

/// The file's reader of released values gives each revision its own row's value in any order:
/// walking on through rows in revision order, looking one up afresh when it is far ahead or
/// behind, and saying so when a revision has no row (also one that lies between two rows).
#[test]
fn the_file_reader_reads_any_order_and_misses_no_gap() {
    use leasehold_mvcc::{Revision, ValueSource};
    const PUTS: i64 = 100;
    let dir = tempfile::tempdir().unwrap();
    let members = position::voters(&BTreeMap::from([(7, "http://127.0.0.1:1".to_owned())]));
    let db = storage::open(dir.path()).unwrap();
    let sm = StateMachine::open(db.clone()).unwrap();
    let mut entries = vec![(at(1), Applying::Membership(members))];
    // Revision 2 + i holds key i's value "v{i}".
    entries.extend((0..PUTS).map(|i| {
        let put = Command::Put(PutRequest {
            key: format!("k{i:03}").into_bytes(),
            value: format!("v{i}").into_bytes(),
            ..Default::default()
        });
        (
            at(2 + i as u64),
            Applying::Normal(Proposal {
                commands: vec![put],
            }),
        )
    }));
    apply_entries(&sm.shared(), &db, entries, |_| std::time::Instant::now()).unwrap();
    assert!(db.checkpoint().unwrap().is_some());
    let source = storage::FileValues::new(std::sync::Arc::downgrade(&db));
    let mut reader = source.reader().unwrap();
    let mut read = |main: i64| reader.read(Revision { main, sub: 0 });
    let value = |main: i64| Ok(bytes::Bytes::from(format!("v{}", main - 2)));
    let dense: Vec<i64> = (2..2 + PUTS).collect();
    let sparse: Vec<i64> = (2..2 + PUTS).step_by(23).collect();
    let backwards: Vec<i64> = (2..2 + PUTS).rev().step_by(3).collect();
    let mixed = [50, 51, 40, 41, 90, 3, 4, 5, 101, 2];
    for order in [&dense[..], &sparse, &backwards, &mixed, &dense] {
        for &main in order {
            assert_eq!(read(main), value(main), "revision {main}");
        }
    }
    // No row: past the end, before the first, and between two rows on a walk.
    assert!(read(2 + PUTS).is_err());
    assert!(read(1).is_err());
    assert_eq!(read(10), value(10));
    let mut reader = source.reader().unwrap();
    assert_eq!(reader.read(Revision { main: 10, sub: 0 }), value(10));
    assert!(
        reader.read(Revision { main: 10, sub: 1 }).is_err(),
        "between two rows"
    );
    assert_eq!(
        reader.read(Revision { main: 11, sub: 0 }),
        value(11),
        "and on after it"
    );
}

/// A one-member cluster in `data_dir`, with quick timing and the default lease margin.
fn one_member(data_dir: &std::path::Path) -> ReplicaConfig {
    ReplicaConfig {
        quota_bytes: None,
        auth_token_ttl: std::time::Duration::from_secs(300),
        lease_cover_margin_ms: crate::LEASE_COVER_MARGIN_DEFAULT_MS,
        strict_reconfig_check: true,
        force_new_cluster: false,
        member_id: 7,
        peer_url: "http://127.0.0.1:1".into(),
        initial_peers: BTreeMap::new(),
        bootstrap: true,
        data_dir: data_dir.to_path_buf(),
        heartbeat_interval_ms: 50,
        election_timeout_ms: 200,
        snapshot_log_entries_max: 100_000,
        compaction_pace: crate::CompactionPace::default(),
        clock: crate::system_clock(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_restart_recovers_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ReplicaConfig {
        // Small, so that the log is compacted during the test.
        snapshot_log_entries_max: 20,
        ..one_member(dir.path())
    };
    let mut written = BTreeMap::new();
    {
        let replica = Replica::start(cfg.clone()).await.unwrap();
        for i in 0..60 {
            let key = format!("k{i:03}");
            let resp = replica
                .propose(PutRequest {
                    key: key.clone().into(),
                    value: vec![i],
                    ..Default::default()
                })
                .await
                .unwrap()
                .unwrap();
            written.insert(key, resp.revision);
        }
        replica.shutdown().await;
    }
    let replica = Replica::start(cfg).await.unwrap();
    let all = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    let resp = replica
        .read(true, |s| s.range(&all))
        .await
        .unwrap()
        .unwrap();
    let got: BTreeMap<String, i64> = resp
        .kvs
        .into_iter()
        .map(|kv| (String::from_utf8(kv.key).unwrap(), kv.mod_revision))
        .collect();
    assert_eq!(got, written);
    assert_eq!(resp.revision, 61);
    replica.shutdown().await;
}

/// A leader's fatal failure reaches a follower as "stopped" (the follower has not stopped); the
/// caller's errors cross the wire as they are.
#[test]
fn replica_errors_cross_the_wire() {
    use crate::{Fatal, MembershipError, ReplicaError};
    let round_trip = |e: ReplicaError| {
        let bytes = postcard::to_stdvec(&e).unwrap();
        postcard::from_bytes::<ReplicaError>(&bytes).unwrap()
    };
    assert!(matches!(
        round_trip(ReplicaError::Fatal(Fatal::Panicked)),
        ReplicaError::Stopped
    ));
    assert!(matches!(
        round_trip(ReplicaError::NoLeader),
        ReplicaError::NoLeader
    ));
    assert!(matches!(
        round_trip(ReplicaError::LeaderChanged),
        ReplicaError::LeaderChanged
    ));
    assert!(matches!(
        round_trip(MembershipError::NotLearner.into()),
        ReplicaError::Membership(MembershipError::NotLearner)
    ));
    let refused = "a membership change is already in progress".to_owned();
    assert!(matches!(
        round_trip(ReplicaError::MembershipChange(refused.clone())),
        ReplicaError::MembershipChange(text) if text == refused
    ));
}

/// A data dir of another format is refused with a typed error, not a message.
#[test]
fn an_unknown_storage_format_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(storage::open(dir.path()).unwrap());
    let newer = storage::FORMAT_VERSION + 1;
    {
        let db = redb::Database::create(dir.path().join("leasehold.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(storage::SM_META).unwrap();
            storage::FORMAT.put(&mut meta, &newer).unwrap();
        }
        txn.commit().unwrap();
    }
    let Err(e) = storage::open(dir.path()) else {
        panic!("format {newer} opened")
    };
    assert!(
        matches!(
            e,
            storage::StorageError::Format { found, supported }
                if found == newer && supported == storage::FORMAT_VERSION
        ),
        "{e:?}"
    );
}

/// A follower's forwarded batch of renewals that must go through the log (here every renewal
/// does: margin 0) is committed in a few shared entries, not one entry per renewal in turn: in
/// turn, a batch of hundreds held the follower's other writes past its forwarding time-out, and
/// they failed with "no leader" under a live leader (go/clientv3's failover test caught it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_batch_of_renewals_through_the_log_shares_entries() {
    use crate::{LeaseGrant, LeaseId, LeaseRenew, Write};
    const LEASES: i64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let cfg = ReplicaConfig {
        lease_cover_margin_ms: 0,
        ..one_member(dir.path())
    };
    let replica = Replica::start(cfg).await.unwrap();
    let ids: Vec<LeaseId> = (1..=LEASES)
        .map(|id| LeaseId::from_wire(id).unwrap())
        .collect();
    let grants = ids
        .iter()
        .map(|&id| Write::LeaseGrant(LeaseGrant { id, ttl_secs: 60 }))
        .collect();
    let granted = replica.leader_commit(grants).await.unwrap();
    assert!(
        replica.lease_clock().is_some(),
        "promoted by its first grant"
    );
    // Lease time moves on, so that no renewal's new deadline is within its cover (margin 0):
    // each one must go through the log.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let renewals = ids
        .iter()
        .map(|&id| Write::LeaseRenew(LeaseRenew { id }))
        .collect();
    let renewed = replica.leader_commit(renewals).await.unwrap();
    assert!(
        renewed
            .applied
            .iter()
            .all(|a| matches!(a, Applied::LeaseRenew(Some(60)))),
        "every renewal renewed: {:?}",
        &renewed.applied[..3]
    );
    let entries = renewed.log_index - granted.log_index;
    // Shared: usually 2 entries, up to about 25 when the batcher cuts entries while the renewals
    // are still being queued; one each in turn would be 200.
    assert!(
        (1..=LEASES as u64 / 4).contains(&entries),
        "{LEASES} renewals through the log took {entries} entries: want 1 to {} (0: they were \
         answered from memory, not the path under test; one each in turn: {LEASES})",
        LEASES / 4
    );
    replica.shutdown().await;
}

/// The revisions of the rows the file in `dir` holds (the member must be stopped).
fn kv_rows_in_file(dir: &std::path::Path) -> Vec<i64> {
    use redb::ReadableTable as _;
    let db = storage::open(dir).unwrap();
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(storage::KV).unwrap();
    let mut revs = Vec::new();
    for row in table.iter().unwrap() {
        revs.push(leasehold_mvcc::Revision::from_bytes(row.unwrap().0.value()).main);
    }
    revs
}

/// A compaction's rows leave the file a batch at a time after it is applied; a stop in the
/// middle leaves the rest, which the next start removes (etcd's "resume scheduled compaction"),
/// and a `physical` wait ends only then. Reads below the compaction are refused throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_a_stop_interrupts_resumes_at_the_next_start() {
    use crate::{CompactionPace, command::Compact};
    let dir = tempfile::tempdir().unwrap();
    let get_at = |revision: i64| RangeRequest {
        key: b"key".to_vec(),
        revision,
        ..Default::default()
    };
    {
        // One row per batch, an hour apart: the stop comes before the second batch.
        let slow = ReplicaConfig {
            compaction_pace: CompactionPace {
                batch_limit: 1,
                pause: std::time::Duration::from_secs(3600),
            },
            ..one_member(dir.path())
        };
        let replica = Replica::start(slow).await.unwrap();
        for i in 0..10 {
            replica
                .propose(PutRequest {
                    key: b"key".to_vec(),
                    value: format!("{i}").into_bytes(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(
            replica.propose(Compact { revision: 5 }).await.unwrap(),
            Ok(11)
        );
        let below = replica.read(true, |s| s.range(&get_at(4))).await.unwrap();
        assert_eq!(below, Err(leasehold_mvcc::Error::Compacted));
        // The stop does not wait out the pause.
        tokio::time::timeout(std::time::Duration::from_secs(20), replica.shutdown())
            .await
            .expect("a stop in the compactor's pause is prompt");
    }
    // Revisions 2..=11 were put; the compaction at 5 hides 2, 3 and 4, and at most the first
    // batch (one row) left.
    let left = kv_rows_in_file(dir.path());
    assert!(
        left == (2..=11).collect::<Vec<_>>() || left == (3..=11).collect::<Vec<_>>(),
        "one batch at most: {left:?}"
    );
    {
        let replica = Replica::start(one_member(dir.path())).await.unwrap();
        let below = replica.read(true, |s| s.range(&get_at(4))).await.unwrap();
        assert_eq!(below, Err(leasehold_mvcc::Error::Compacted));
        let at = replica
            .read(true, |s| s.range(&get_at(5)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(at.kvs[0].value, &b"3"[..]);
        tokio::time::timeout(
            std::time::Duration::from_secs(20),
            replica.compacted_physically(5),
        )
        .await
        .expect("the resumed compaction finishes")
        .unwrap();
        replica.shutdown().await;
    }
    assert_eq!(kv_rows_in_file(dir.path()), (5..=11).collect::<Vec<_>>());
}
