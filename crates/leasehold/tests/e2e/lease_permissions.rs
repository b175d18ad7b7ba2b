//! leasehold's extension to auth: a grant bound to a lease (`leasehold role grant-permission
//! --lease`) gives access only while the lease lives. A client holds it while its lease is kept
//! alive; when the lease is revoked, the grant goes with the lease's keys, and the next request
//! is refused. (Expiry, with its lease time given rather than slept, is tested in
//! `leasehold_raft`'s apply tests.) etcdctl still reads the role, ignoring the extension.

use std::process::Command;

use etcd_client::{Client, ConnectOptions, LeaseGrantOptions};
use leasehold_testkit as common;

use common::{Leasehold, etcdctl_ok, leasehold_binary, stdout_of};

const LEASE: i64 = 0x5eed;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_bound_to_a_lease_ends_with_it() {
    let server = Leasehold::start().await;
    let e = server.endpoint();
    common::enable_auth_with_alice(&e, "svc", None).await;
    let root = ConnectOptions::new().with_user("root", "rootpw");
    let mut root = Client::connect([e.as_str()], Some(root))
        .await
        .expect("root");
    root.lease_grant(60, Some(LeaseGrantOptions::new().with_id(LEASE)))
        .await
        .expect("lease");
    root.put(
        "svc/owner",
        "alice",
        Some(etcd_client::PutOptions::new().with_lease(LEASE)),
    )
    .await
    .expect("a key on the lease");

    let grant = |lease: &str| {
        Command::new(leasehold_binary())
            .args([
                "role",
                "grant-permission",
                &format!("--endpoints={e}"),
                "--user=root:rootpw",
                "--prefix",
                &format!("--lease={lease}"),
                "svc",
                "readwrite",
                "svc/",
            ])
            .output()
            .expect("run leasehold role")
    };
    let missing = grant("77");
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr).trim(),
        "Error: etcdserver: requested lease not found"
    );
    let granted = grant(&format!("{LEASE:x}"));
    assert!(granted.status.success(), "{granted:?}");
    assert_eq!(stdout_of(&granted), "Role svc updated\n");
    let role = etcdctl_ok(&e, &["--user=root:rootpw", "role", "get", "svc"]).await;
    assert_eq!(
        stdout_of(&role),
        "Role svc\nKV Read:\n\t[svc/, svc0) (prefix svc/)\nKV Write:\n\t[svc/, svc0) (prefix svc/)\n"
    );

    let alice = ConnectOptions::new().with_user("alice", "alicepw");
    let mut alice = Client::connect([e.as_str()], Some(alice))
        .await
        .expect("alice");
    alice
        .put("svc/a", "1", None)
        .await
        .expect("alice may write while the lease lives");
    let (mut keeper, mut renewals) = root.lease_keep_alive(LEASE).await.expect("keepalive");
    keeper.keep_alive().await.expect("renew");
    let renewed = renewals.message().await.expect("answer").expect("renewed");
    assert!(renewed.ttl() > 0);
    alice
        .put("svc/b", "1", None)
        .await
        .expect("a renewal keeps the grant");

    root.lease_revoke(LEASE).await.expect("revoke");
    let refused = alice.put("svc/c", "1", None).await;
    match refused {
        Err(etcd_client::Error::GRpcStatus(s)) => {
            assert_eq!(s.message(), "etcdserver: permission denied", "{s:?}");
        }
        other => panic!("the grant outlived its lease: {other:?}"),
    }
    let role = etcdctl_ok(&e, &["--user=root:rootpw", "role", "get", "svc"]).await;
    assert_eq!(stdout_of(&role), "Role svc\nKV Read:\nKV Write:\n");
    let owner = root.get("svc/owner", None).await.expect("get");
    assert_eq!(owner.count(), 0, "the lease's key went with it");
}
