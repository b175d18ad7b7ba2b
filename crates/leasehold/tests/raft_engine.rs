//! The Raft engine switch (`--experimental-raft-engine`): a data dir keeps the engine it was
//! made with, the other engine refuses it naming the way across (`etcdctl snapshot save` on the
//! old build, `leasehold snapshot restore` for the new one), and that way works: what the
//! openraft member held is served by a raft-rs member started on the restored data dir.

use std::time::Duration;

use leasehold_testkit as common;

use common::{Kind, Leasehold, Setup, etcdctl_ok, free_ports, leasehold_binary};

fn engine(name: &str) -> Setup {
    Setup {
        args: vec!["--experimental-raft-engine".into(), name.into()],
        ..Setup::default()
    }
}

/// Starts `leasehold` on `data_dir` with `engine` and expects it to refuse the dir: its exit
/// status and what it printed.
async fn refused(data_dir: &std::path::Path, engine: &str) -> (std::process::ExitStatus, String) {
    let [client, peer] = free_ports::<2>();
    let child = tokio::process::Command::new(leasehold_binary())
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--experimental-raft-engine", engine])
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
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openraft_data_dir_is_refused_by_raft_rs_and_crosses_by_snapshot() {
    let mut old = Leasehold::start_with(engine("openraft")).await;
    let mut client = old.client().await;
    for i in 0..20 {
        client
            .put(format!("key/{i:02}"), format!("value {i}"), None)
            .await
            .expect("put");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("old.db");
    etcdctl_ok(
        &old.endpoint(),
        &["snapshot", "save", file.to_str().expect("utf-8 path")],
    )
    .await;
    assert!(old.terminate().await.success(), "{}", old.log_tail());

    let (status, said) = refused(old.data_dir(), "raft-rs").await;
    assert!(
        !status.success(),
        "raft-rs started on openraft's data dir:\n{said}"
    );
    for way in [
        "was written by the openraft engine",
        "etcdctl snapshot save",
        "leasehold snapshot restore",
    ] {
        assert!(said.contains(way), "no {way:?} in:\n{said}");
    }
    // Refusing touched nothing: the old engine still starts on it and serves every key.
    old.spawn();
    old.wait_ready().await;
    let mut client = old.client().await;
    let kept = client
        .get("key/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(kept.kvs().len(), 20);
    drop(old);

    let mut restored =
        common::spawn_restored_members(Kind::Leasehold, &[&file], &[engine("raft-rs").args]);
    let mut new = restored.pop().expect("one member");
    new.wait_ready().await;
    let mut client = new.client().await;
    let got = client
        .get("key/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(got.kvs().len(), 20, "{}", new.log_tail());
    assert_eq!(got.kvs()[7].value(), b"value 7");
    client.put("key/new", "after", None).await.expect("put");
    assert!(
        new.data_dir().join("wal").is_dir(),
        "the restored member does not run raft-rs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft_rs_data_dir_is_refused_by_openraft() {
    let mut new = Leasehold::start_with(engine("raft-rs")).await;
    let mut client = new.client().await;
    client.put("k", "v", None).await.expect("put");
    assert!(new.terminate().await.success(), "{}", new.log_tail());
    let (status, said) = refused(new.data_dir(), "openraft").await;
    assert!(
        !status.success(),
        "openraft started on raft-rs's data dir:\n{said}"
    );
    assert!(
        said.contains("--experimental-raft-engine raft-rs"),
        "no way back named in:\n{said}"
    );
    new.spawn();
    new.wait_ready().await;
    let mut client = new.client().await;
    let got = client.get("k", None).await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"v");
}

/// Without the flag a data dir keeps the engine that made it: one openraft made is served by
/// openraft again (with a warning naming the way to raft-rs), not refused, so an upgrade that
/// changed the default engine starts every existing member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_a_data_dir_keeps_the_engine_that_made_it() {
    let mut old = Leasehold::start_with(engine("openraft")).await;
    let mut client = old.client().await;
    for i in 0..3 {
        client
            .put(format!("key/{i}"), "v", None)
            .await
            .expect("put");
    }
    assert!(old.terminate().await.success(), "{}", old.log_tail());

    old.let_the_data_dir_choose_the_engine();
    old.spawn();
    old.wait_ready().await;
    let mut client = old.client().await;
    let kept = client
        .get("key/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(kept.kvs().len(), 3, "{}", old.log_tail());
    assert!(
        !old.data_dir().join("wal").exists(),
        "raft-rs ran on openraft's data dir:\n{}",
        old.log_tail()
    );
    let said = old.log_tail();
    assert!(
        said.contains("made by the openraft engine"),
        "no warning about the old engine in:\n{said}"
    );
}
