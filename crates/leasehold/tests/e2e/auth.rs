//! Auth against a real etcd: etcdctl's `user`, `role` and `auth` commands give the same output,
//! errors and exit codes on both, and once auth is enabled the same requests are allowed and
//! refused (no token, a wrong password, a key outside the user's grants, non-root
//! administration, a revoked permission). The etcd-client crate logs in with a user and
//! password, and sees a watch outside its grants refused.

use etcd_client::{Client, ConnectOptions, GetOptions, WatchOptions};
use leasehold_testkit as common;

use common::{Etcd, Leasehold, Server, ctl, ctl_stdin, etcdctl_differential};

const ROOT: &str = "--user=root:rootpw";
const ALICE: &str = "--user=alice:alicepw";

/// Users, roles and grants, their listings and every error etcdctl can meet, auth off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_role_commands_match_etcd() {
    etcdctl_differential(
        "user and role commands",
        &[
            ctl(&["user", "add", "root:rootpw"]),
            ctl(&["user", "add", "alice:alicepw"]),
            ctl(&["user", "add", "alice:again"]),
            ctl_stdin(&["user", "add", "bob", "--interactive=false"], "bobpw\n"),
            ctl(&["user", "add", "nopw", "--no-password"]),
            ctl(&["user", "list"]),
            ctl(&["role", "add", "reader"]),
            ctl(&["role", "add", "reader"]),
            ctl(&["role", "add", "writer"]),
            ctl(&["role", "list"]),
            ctl(&["role", "grant-permission", "reader", "read", "k1"]),
            ctl(&["role", "grant-permission", "reader", "read", "a", "c"]),
            ctl(&[
                "role",
                "grant-permission",
                "--prefix",
                "reader",
                "readwrite",
                "foo/",
            ]),
            ctl(&[
                "role",
                "grant-permission",
                "--from-key",
                "writer",
                "write",
                "m",
            ]),
            ctl(&["role", "grant-permission", "reader", "write", "k1"]),
            ctl(&["role", "grant-permission", "nosuch", "read", "k"]),
            ctl(&["role", "grant-permission", "reader", "bogus", "k"]),
            ctl(&["role", "get", "reader"]),
            ctl(&["role", "get", "writer"]),
            ctl(&["role", "get", "nosuch"]),
            ctl(&["user", "grant-role", "alice", "reader"]),
            ctl(&["user", "grant-role", "alice", "writer"]),
            ctl(&["user", "grant-role", "alice", "reader"]),
            ctl(&["user", "grant-role", "alice", "nosuch"]),
            ctl(&["user", "grant-role", "nosuch", "reader"]),
            ctl(&["user", "get", "alice"]),
            ctl(&["user", "get", "alice", "--detail"]),
            ctl(&["user", "get", "bob"]),
            ctl(&["user", "get", "nosuch"]),
            ctl(&["user", "revoke-role", "alice", "writer"]),
            ctl(&["user", "revoke-role", "alice", "writer"]),
            ctl(&["role", "revoke-permission", "reader", "a", "c"]),
            ctl(&["role", "revoke-permission", "reader", "a", "c"]),
            ctl(&["role", "revoke-permission", "--prefix", "reader", "foo/"]),
            ctl(&["role", "get", "reader"]),
            ctl(&["role", "delete", "writer"]),
            ctl(&["role", "delete", "writer"]),
            ctl(&["user", "delete", "bob"]),
            ctl(&["user", "delete", "bob"]),
            ctl(&["user", "list"]),
            ctl(&["role", "list"]),
        ],
    )
    .await;
}

/// Enabling auth and what it then allows and refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enabled_auth_matches_etcd() {
    etcdctl_differential(
        "enabled auth",
        &[
            ctl(&["auth", "enable"]),
            ctl(&["user", "add", "root:rootpw"]),
            // etcdctl grants root the root role itself when the server asks for it.
            ctl(&["auth", "enable"]),
            ctl(&["auth", "enable"]),
            ctl(&[ROOT, "user", "add", "alice:alicepw"]),
            ctl(&[ROOT, "role", "add", "r"]),
            ctl(&[
                ROOT,
                "role",
                "grant-permission",
                "--prefix",
                "r",
                "readwrite",
                "app/",
            ]),
            ctl(&[ROOT, "role", "grant-permission", "r", "read", "ro"]),
            ctl(&[ROOT, "user", "grant-role", "alice", "r"]),
            // No user at all.
            ctl(&["put", "app/x", "1"]),
            ctl(&["get", "app/x"]),
            ctl(&["user", "list"]),
            // A wrong password (client creation fails, exit 2).
            ctl(&["--user=alice:nope", "get", "app/x"]),
            ctl(&["--user=nosuch:pw", "get", "app/x"]),
            // Alice inside and outside her grants.
            ctl(&[ALICE, "put", "app/x", "1"]),
            ctl(&[ALICE, "get", "app/x"]),
            ctl(&[ALICE, "get", "app/", "--prefix"]),
            ctl(&[ALICE, "get", "ro"]),
            ctl(&[ALICE, "put", "ro", "1"]),
            ctl(&[ALICE, "put", "other", "1"]),
            ctl(&[ALICE, "get", "", "--prefix"]),
            ctl(&[ALICE, "del", "app/x"]),
            ctl(&[ALICE, "del", "app/", "--prefix"]),
            ctl_stdin(
                &[ALICE, "txn"],
                "value(\"app/a\") = \"1\"\n\nput app/b 2\n\nput other 3\n\n",
            ),
            ctl_stdin(&[ALICE, "txn"], "\nput app/b 2\n\n\n"),
            // Administration is root's.
            ctl(&[ALICE, "user", "list"]),
            ctl(&[ALICE, "user", "get", "alice"]),
            ctl(&[ALICE, "user", "get", "root"]),
            ctl(&[ALICE, "role", "get", "r"]),
            ctl(&[ALICE, "role", "add", "mine"]),
            ctl(&[ALICE, "auth", "disable"]),
            ctl(&[ROOT, "user", "list"]),
            ctl(&[ROOT, "get", "other"]),
            ctl(&[ROOT, "put", "other", "root-may"]),
            // Root cannot be taken apart while auth is on.
            ctl(&[ROOT, "user", "delete", "root"]),
            ctl(&[ROOT, "user", "revoke-role", "root", "root"]),
            ctl(&[ROOT, "role", "delete", "root"]),
            // A revoked grant stops the next request.
            ctl(&[ROOT, "role", "revoke-permission", "--prefix", "r", "app/"]),
            ctl(&[ALICE, "put", "app/x", "2"]),
            ctl(&[ALICE, "get", "app/x"]),
            // A changed password ends the old one.
            ctl_stdin(
                &[ROOT, "user", "passwd", "alice", "--interactive=false"],
                "newpw\n",
            ),
            ctl(&[ALICE, "get", "ro"]),
            ctl(&["--user=alice:newpw", "get", "ro"]),
            ctl(&[ROOT, "auth", "disable"]),
            ctl(&["put", "app/x", "3"]),
            ctl(&["get", "app/x"]),
        ],
    )
    .await;
}

/// The etcd-client crate: a client that logs in with a user and password; a watch outside the
/// user's grants is refused with etcd's reason, one inside delivers.
async fn client_scenario(server: &Server) -> Vec<String> {
    let e = server.endpoint();
    let perm = etcd_client::Permission::read_write("app/").with_prefix();
    common::enable_auth_with_alice(&e, "r", Some(perm)).await;
    let options = ConnectOptions::new().with_user("alice", "alicepw");
    let mut alice = Client::connect([e.as_str()], Some(options))
        .await
        .expect("alice logs in");
    let mut log = Vec::new();
    let outcome = |r: Result<(), etcd_client::Error>| match r {
        Ok(()) => "ok".to_owned(),
        Err(etcd_client::Error::GRpcStatus(s)) => format!("{:?} {}", s.code(), s.message()),
        Err(other) => other.to_string(),
    };
    log.push(outcome(alice.put("app/a", "1", None).await.map(|_| ())));
    log.push(outcome(alice.put("b", "1", None).await.map(|_| ())));
    let got = alice
        .get("app/", Some(GetOptions::new().with_prefix()))
        .await
        .map(|r| r.count());
    log.push(format!("{got:?}"));
    let mut refused = alice.watch("b", None).await.expect("watch stream opens");
    let first = refused.message().await.expect("a response").expect("open");
    log.push(format!(
        "outside: canceled {} reason {:?}",
        first.canceled(),
        first.cancel_reason()
    ));
    let mut allowed = alice
        .watch("app/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch stream opens");
    let created = allowed.message().await.expect("a response").expect("open");
    log.push(format!(
        "inside: created {} canceled {}",
        created.created(),
        created.canceled()
    ));
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_library_logs_in_as_with_etcd() {
    let (etcd, leasehold) = tokio::join!(Etcd::start(), Leasehold::start());
    let want = client_scenario(&etcd).await;
    let got = client_scenario(&leasehold).await;
    eprintln!("etcd: {want:#?}");
    assert_eq!(got, want);
}

/// `--auth-token jwt,...` (ES256 keys made here): the same flows give the same answers, with
/// tokens any member verifies by their signature.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_tokens_match_etcd() {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = rcgen::KeyPair::generate().expect("an ES256 key");
    let private = dir.path().join("jwt.key");
    let public = dir.path().join("jwt.pub");
    std::fs::write(&private, key.serialize_pem()).expect("write key");
    std::fs::write(&public, key.public_key_pem()).expect("write public key");
    let flag = format!(
        "--auth-token=jwt,pub-key={},priv-key={},sign-method=ES256,ttl=5m",
        public.display(),
        private.display()
    );
    let setup = common::Setup {
        args: vec![flag],
        ..common::Setup::default()
    };
    let (etcd, leasehold) = tokio::join!(
        Etcd::start_with(setup.clone()),
        Leasehold::start_with(setup)
    );
    common::etcdctl_differential_between(
        "jwt tokens",
        &etcd,
        &leasehold,
        &[
            ctl(&["user", "add", "root:rootpw"]),
            ctl(&["auth", "enable"]),
            ctl(&[ROOT, "user", "add", "alice:alicepw"]),
            ctl(&[ROOT, "role", "add", "r"]),
            ctl(&[
                ROOT,
                "role",
                "grant-permission",
                "--prefix",
                "r",
                "readwrite",
                "app/",
            ]),
            ctl(&[ROOT, "user", "grant-role", "alice", "r"]),
            ctl(&["put", "app/x", "1"]),
            ctl(&["--user=alice:nope", "get", "app/x"]),
            ctl(&[ALICE, "put", "app/x", "1"]),
            ctl(&[ALICE, "get", "app/x"]),
            ctl(&[ALICE, "put", "other", "1"]),
            ctl(&[ALICE, "user", "list"]),
            ctl(&[ROOT, "role", "revoke-permission", "--prefix", "r", "app/"]),
            ctl(&[ALICE, "get", "app/x"]),
            ctl(&[ROOT, "auth", "disable"]),
            ctl(&["get", "app/x"]),
        ],
    )
    .await;
}
