//! A restart on the same data dir recovers everything: values, every key's create/mod
//! revision and version, the history above the compaction point, the compaction point itself
//! and the store's revision. Checked after a graceful stop (SIGTERM) and after SIGKILL.

use leasehold_testkit as common;

use common::{Leasehold, Recorder, diff_recordings};
use etcd_client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};

/// Writes a history with overwrites, deletes, a txn and a compaction. Returns
/// (compaction revision, current revision).
async fn write_history(c: &mut Client) -> (i64, i64) {
    for i in 0..20 {
        c.put(format!("key/{i:02}"), format!("first {i}"), None)
            .await
            .expect("put");
    }
    for i in (0..20).step_by(3) {
        c.put(format!("key/{i:02}"), format!("second {i}"), None)
            .await
            .expect("overwrite");
    }
    c.delete("key/05", None).await.expect("delete");
    c.delete("key/1", Some(DeleteOptions::new().with_prefix()))
        .await
        .expect("delete prefix");
    c.put("key/05", "recreated", None).await.expect("recreate");
    let txn = Txn::new()
        .when([Compare::version("key/00", CompareOp::Equal, 2)])
        .and_then([
            TxnOp::put("txn/a", "a", None),
            TxnOp::put("txn/b", "b", None),
            TxnOp::delete("key/02", None),
        ]);
    assert!(c.txn(txn).await.expect("txn").succeeded());
    let compacted = c
        .get("key/00", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    for i in 0..5 {
        c.put("after-compaction", format!("{i}"), None)
            .await
            .expect("put");
    }
    c.compact(compacted, None).await.expect("compact");
    c.delete("key/03", None)
        .await
        .expect("delete after compaction");
    let current = c
        .put("last", "last", None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision();
    (compacted, current)
}

/// Everything a client can observe of the store, as a recording.
async fn observe(c: &mut Client, compacted: i64, current: i64) -> Recorder {
    let mut r = Recorder::default();
    r.record(
        "all keys",
        c.get("", Some(GetOptions::new().with_all_keys())).await,
    );
    for revision in compacted..=current {
        r.record(
            format!("all keys at revision {revision}"),
            c.get(
                "",
                Some(GetOptions::new().with_all_keys().with_revision(revision)),
            )
            .await,
        );
    }
    r.record(
        "below the compaction point",
        c.get(
            "",
            Some(
                GetOptions::new()
                    .with_all_keys()
                    .with_revision(compacted - 1),
            ),
        )
        .await,
    );
    r.record(
        "above the current revision",
        c.get(
            "",
            Some(GetOptions::new().with_all_keys().with_revision(current + 1)),
        )
        .await,
    );
    r
}

#[derive(Clone, Copy, Debug)]
enum Stop {
    Sigterm,
    Sigkill,
}

async fn check_restart_recovers_everything(stop: Stop) {
    let mut server = Leasehold::start().await;
    let mut client = server.client().await;
    let (compacted, current) = write_history(&mut client).await;
    let before = observe(&mut client, compacted, current).await;
    drop(client);

    match stop {
        Stop::Sigterm => {
            let status = server.terminate().await;
            eprintln!("exited after SIGTERM with {status}");
        }
        Stop::Sigkill => server.kill9(),
    }
    server.restart().await;

    let mut client = server.client().await;
    let after = observe(&mut client, compacted, current).await;
    if let Some(diff) = diff_recordings("before restart", &before, "after restart", &after) {
        server.fail(&format!("the store changed across a restart\n{diff}"));
    }

    // The compaction point survived: compacting at or below it is refused, above it works.
    let error = client
        .compact(compacted, None)
        .await
        .expect_err("compacting at the recovered compaction point");
    assert!(
        error
            .to_string()
            .contains("required revision has been compacted"),
        "{error}"
    );
    client
        .compact(compacted + 1, None)
        .await
        .expect("compact above the recovered compaction point");
    // The revision survived: the next write takes the next revision.
    let next = client
        .put("new", "new", None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision();
    assert_eq!(next, current + 1, "first write after restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_sigterm_recovers_values_revisions_and_compaction() {
    check_restart_recovers_everything(Stop::Sigterm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_sigkill_recovers_values_revisions_and_compaction() {
    check_restart_recovers_everything(Stop::Sigkill).await;
}
