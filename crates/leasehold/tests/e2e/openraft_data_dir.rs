//! A data dir the openraft engine (the one before raft-rs) wrote is refused at start, naming the
//! way across (`etcdctl snapshot save` with a build that still runs openraft, then `leasehold
//! snapshot restore` into a new data dir), and left as it was: never opened as an empty member.

use std::time::Duration;

use leasehold_testkit::{free_ports, leasehold_binary};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openraft_data_dir_is_refused_naming_the_way_across() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().join("data");
    std::fs::create_dir_all(&data_dir).expect("data dir");
    let file = data_dir.join("leasehold.redb");
    // What openraft left: its log in the database file, and no write-ahead log beside it.
    {
        let db = redb::Database::create(&file).expect("create the file");
        let txn = db.begin_write().expect("write");
        {
            let log: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("raft_log");
            let mut log = txn.open_table(log).expect("raft_log");
            log.insert(1, &b"an openraft entry"[..]).expect("insert");
        }
        txn.commit().expect("commit");
    }

    let [client, peer] = free_ports::<2>();
    let child = tokio::process::Command::new(leasehold_binary())
        .arg("--data-dir")
        .arg(&data_dir)
        .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
        ))
        .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}"))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), child)
        .await
        .expect("a refused data dir ends the process")
        .expect("run leasehold");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "started on openraft's data dir:\n{said}"
    );
    for way in [
        "written by the openraft engine",
        "etcdctl snapshot save",
        "leasehold snapshot restore",
    ] {
        assert!(said.contains(way), "no {way:?} in:\n{said}");
    }
    assert!(
        !data_dir.join("wal").exists(),
        "a write-ahead log was made in the refused data dir"
    );
}
