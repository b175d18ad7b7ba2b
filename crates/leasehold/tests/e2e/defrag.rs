//! `etcdctl defrag` (Maintenance.Defragment) against real etcd: after 8 MiB of values are
//! written, deleted and compacted away, defragmenting shrinks the file that Status reports, on
//! etcd and on leasehold, and etcdctl prints the same line for both. What remains is still
//! there and writes go on.

use etcd_client::{Client, CompactionOptions, DeleteOptions, Txn, TxnOp};
use leasehold_testkit as common;

use common::{Etcd, Leasehold, Server, Setup, etcdctl_ok, stdout_of};

/// 80 transactions of 25 puts of 4 KiB: 8 MiB under `big/`.
async fn fill(client: &mut Client) {
    let value = vec![b'x'; 4096];
    for t in 0..80 {
        let ops: Vec<TxnOp> = (0..25)
            .map(|i| TxnOp::put(format!("big/{t:03}/{i:02}"), value.clone(), None))
            .collect();
        client.txn(Txn::new().and_then(ops)).await.expect("txn");
    }
}

/// (file size, bytes in use) from Status.
async fn sizes(client: &mut Client) -> (i64, i64) {
    let status = client.status().await.expect("status");
    (status.db_size(), status.raft_used_db_size())
}

/// Fills, deletes, compacts, then defragments with etcdctl; returns etcdctl's output with the
/// endpoint masked, and the file size before and after.
async fn defragment(server: &Server) -> (String, i64, i64) {
    let mut client = server.client().await;
    client.put("kept", "1", None).await.expect("put");
    fill(&mut client).await;
    let deleted = client
        .delete("big/", Some(DeleteOptions::new().with_prefix()))
        .await
        .expect("delete");
    let rev = deleted.header().expect("header").revision();
    client
        .compact(rev, Some(CompactionOptions::new().with_physical()))
        .await
        .expect("compact");
    // A few more writes, so that a leasehold member with a small --snapshot-count snapshots
    // and drops the log entries that held the values.
    for i in 0..20 {
        client
            .put(format!("after/{i}"), "1", None)
            .await
            .expect("put");
    }
    let (before, in_use) = sizes(&mut client).await;
    assert!(
        in_use <= before,
        "{}: in use {in_use} > size {before}",
        server.label()
    );
    let out = etcdctl_ok(&server.endpoint(), &["defrag"]).await;
    let text = stdout_of(&out).replace(&server.endpoint(), "ENDPOINT");
    let (after, in_use_after) = sizes(&mut client).await;
    assert!(
        in_use_after <= after,
        "{}: in use {in_use_after} > size {after}",
        server.label()
    );
    let kept = client.get("kept", None).await.expect("get");
    assert_eq!(kept.kvs()[0].value(), b"1", "{}", server.label());
    client
        .put("kept", "2", None)
        .await
        .expect("a write after the defragment");
    (text, before, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_shrinks_the_file_as_etcd_does() {
    let etcd = Etcd::start().await;
    let leasehold = Leasehold::start_with(Setup {
        args: vec!["--snapshot-count=10".into()],
        ..Setup::default()
    })
    .await;
    let (want, etcd_before, etcd_after) = defragment(&etcd).await;
    let (got, before, after) = defragment(&leasehold).await;
    eprintln!("file size: etcd {etcd_before} -> {etcd_after}, leasehold {before} -> {after}");
    assert_eq!(got, want);
    assert_eq!(want, "Finished defragmenting etcd member[ENDPOINT]\n");
    assert!(
        etcd_after < etcd_before / 2,
        "etcd: {etcd_before} -> {etcd_after}"
    );
    assert!(after < before / 2, "leasehold: {before} -> {after}");
}

/// Defragments while another client writes: neither hangs nor fails, and every write is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_while_writing() {
    let server = Leasehold::start().await;
    let mut writer = server.client().await;
    let mut maintainer = server.client().await;
    let writes = tokio::spawn(async move {
        for i in 0..300 {
            writer
                .put(format!("w/{i:03}"), "v", None)
                .await
                .expect("a write during defragments");
        }
        writer
    });
    for _ in 0..5 {
        maintainer.defragment().await.expect("defragment");
    }
    let mut writer = tokio::time::timeout(std::time::Duration::from_secs(60), writes)
        .await
        .expect("writes finish")
        .expect("writer task");
    let all = writer
        .get(
            "w/",
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only(),
            ),
        )
        .await
        .expect("count");
    assert_eq!(all.count(), 300);
}
