use std::collections::{BTreeMap, BTreeSet};

use leasehold_mvcc::{PutRequest, RangeRequest};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Membership, StorageError};

use crate::log_store::LogStore;
use crate::state_machine::StateMachine;
use crate::{Applied, Command, Proposal, Replica, ReplicaConfig, TypeConfig, storage};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = storage::open(dir.path()).expect("open");
        let sm = StateMachine::open(db.clone()).expect("state machine");
        let log = LogStore::new(db, sm.shared().append_times.clone());
        Ok((dir, log, sm))
    }
}

/// openraft's own conformance suite for log stores and state machines.
#[test]
fn passes_openraft_storage_suite() {
    Suite::test_all(Builder).expect("openraft storage suite");
}

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, 7), index)
}

fn put_entry(index: u64, key: &str) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Proposal {
            commands: vec![Command::Put(PutRequest {
                key: key.into(),
                value: b"v".to_vec(),
                ..Default::default()
            })],
        }),
    }
}

/// Regression: the applied log id was written as `Option<LogId>` and read back as `LogId`, so a
/// restart skipped re-applying committed entries and lost acknowledged writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_machine_reopens_at_the_same_applied_state() {
    let dir = tempfile::tempdir().unwrap();
    let (applied, membership, records) = {
        let db = storage::open(dir.path()).unwrap();
        let mut sm = StateMachine::open(db.clone()).unwrap();
        let mut log = LogStore::new(db, sm.shared().append_times.clone());
        let members = Membership::new(vec![BTreeSet::from([7u64])], None);
        let entries = vec![
            Entry {
                log_id: log_id(1),
                payload: EntryPayload::Membership(members),
            },
            put_entry(2, "a"),
            put_entry(3, "b"),
        ];
        let replies = sm.apply(entries).await.unwrap();
        assert!(replies[0].is_empty(), "a membership entry answers nothing");
        assert!(matches!(replies[1][..], [Applied::Put(Ok(ref r))] if r.revision == 2));
        // Applied changes reach the file with the next log commit, as they do in a running node.
        log.save_vote(&openraft::Vote::new_committed(1, 7))
            .await
            .unwrap();
        let (applied, membership) = sm.applied_state().await.unwrap();
        let records = crate::state_machine::read(&sm.shared(), |s| s.records());
        (applied, membership, records)
    };
    let db = storage::open(dir.path()).unwrap();
    let mut reopened = StateMachine::open(db).unwrap();
    let (applied2, membership2) = reopened.applied_state().await.unwrap();
    assert_eq!(applied2, applied);
    assert_eq!(applied2, Some(log_id(3)));
    assert_eq!(membership2, membership);
    let records2 = crate::state_machine::read(&reopened.shared(), |s| s.records());
    assert_eq!(records2, records);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_restart_recovers_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ReplicaConfig {
        quota_bytes: None,
        auth_token_ttl: std::time::Duration::from_secs(300),
        member_id: 7,
        peer_url: "http://127.0.0.1:1".into(),
        initial_peers: BTreeMap::new(),
        bootstrap: true,
        data_dir: dir.path().to_path_buf(),
        heartbeat_interval_ms: 50,
        election_timeout_ms: 200,
        // Small, so that snapshots and log purges happen during the test.
        snapshot_log_entries_max: 20,
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
        round_trip(MembershipError::NotLearner.into()),
        ReplicaError::Membership(MembershipError::NotLearner)
    ));
    let refused = openraft::error::ChangeMembershipError::EmptyMembership(
        openraft::error::EmptyMembership {},
    );
    assert!(matches!(
        round_trip(ReplicaError::MembershipChange(refused)),
        ReplicaError::MembershipChange(openraft::error::ChangeMembershipError::EmptyMembership(_))
    ));
}

/// A data dir of another format is refused with a typed error, not a message.
#[test]
fn an_unknown_storage_format_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(storage::open(dir.path()).unwrap());
    {
        let db = redb::Database::create(dir.path().join("leasehold.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(storage::SM_META).unwrap();
            storage::FORMAT.put(&mut meta, &2).unwrap();
        }
        txn.commit().unwrap();
    }
    let Err(e) = storage::open(dir.path()) else {
        panic!("format 2 opened")
    };
    assert!(
        matches!(
            e,
            storage::StorageError::Format {
                found: 2,
                supported: 1
            }
        ),
        "{e:?}"
    );
}

/// openraft stops on a storage failure and passes on only its text; the replica reports the
/// typed failure that was recorded first, and an orderly stop as no failure at all.
#[test]
fn a_fatal_stop_is_explained_by_the_first_storage_failure() {
    use crate::Fatal;
    use storage::{FirstFailure, StorageError};
    let failure = FirstFailure::default();
    let disk_full = || StorageError::Commit {
        what: "raft_log",
        error: redb::Error::Io(std::io::ErrorKind::StorageFull.into()),
    };
    let raft_error = failure.to_raft(disk_full(), |e| openraft::StorageIOError::write_logs(e));
    failure.record(StorageError::Corrupt {
        what: "leases",
        problem: "a later failure",
    });
    let fatal = openraft::error::Fatal::StorageError(raft_error.clone());
    let Some(Fatal::Storage(typed)) = failure.explain(&fatal) else {
        panic!("not typed")
    };
    let StorageError::Commit {
        what: "raft_log",
        error: redb::Error::Io(io),
    } = &*typed
    else {
        panic!("{typed:?}")
    };
    assert_eq!(io.kind(), std::io::ErrorKind::StorageFull);
    assert!(failure.explain(&openraft::error::Fatal::Stopped).is_none());
    assert!(matches!(
        FirstFailure::default().explain(&fatal),
        Some(Fatal::Raft(_))
    ));
    assert!(matches!(
        failure.replica_error(&openraft::error::Fatal::Stopped),
        crate::ReplicaError::Stopped
    ));
}
