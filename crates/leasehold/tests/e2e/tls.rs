//! TLS for clients and peers, side by side with a real etcd 3.4.23 given the same certificates
//! and flags: etcdctl and the etcd-client crate over mutual TLS, certificates refused at the
//! handshake (none, another CA's, expired), bad certificate files refused at start, curl over
//! HTTPS, and a three-member cluster with client and peer mutual TLS.

use leasehold_testkit as common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::certs::Certs;
use common::{Cluster, Kind, Setup, TlsSetup, ctl, ctl_stdin, describe_output, etcdctl};

/// How long a refused client may take to give up: etcdctl's dial timeout (3 s) and margin. A
/// handshake that hung would take the 5 s command timeout or longer.
const REFUSAL_WITHIN: Duration = Duration::from_secs(8);
/// How long a member with a bad certificate file may take to exit.
const BAD_START_EXIT_WITHIN: Duration = Duration::from_secs(20);

fn tls_setup(certs: &Certs, peers: bool) -> Setup {
    Setup {
        tls: Some(TlsSetup::from(certs, peers)),
        ..Setup::default()
    }
}

/// The KV, txn, lease and lock commands of the plain-HTTP differential tests, over mutual TLS:
/// etcd and leasehold answer alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_over_mutual_tls_answers_as_etcd_does() {
    let certs = Certs::make();
    let etcd = Cluster::start_with_setup(Kind::Etcd, 1, tls_setup(&certs, false)).await;
    let leasehold = Cluster::start_with_setup(Kind::Leasehold, 1, tls_setup(&certs, false)).await;
    assert!(leasehold.members[0].endpoint().starts_with("https://"));
    common::etcdctl_differential_between(
        "etcdctl_over_mutual_tls_answers_as_etcd_does",
        &etcd.members[0],
        &leasehold.members[0],
        &[
            ctl(&["put", "k", "v1"]),
            ctl(&["put", "--prev-kv", "k", "v2"]),
            ctl(&["get", "k", "-w", "json"]),
            ctl(&["get", "--prefix", "k"]),
            ctl_stdin(
                &["txn"],
                "value(\"k\") = \"v2\"\n\nput k v3\n\nput k lost\n\n",
            ),
            ctl(&["get", "k"]),
            ctl(&["del", "k"]),
            ctl(&["lease", "grant", "100"]),
            ctl(&["lease", "list"]),
            ctl(&[
                "lock",
                "mylock",
                "--",
                "sh",
                "-c",
                "echo ${ETCD_LOCK_KEY%/*}",
            ]),
            ctl(&["member", "list"]),
        ],
    )
    .await;
}

/// `etcdctl watch` over mutual TLS replays history and streams new events, on etcd and on
/// leasehold alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_watch_over_mutual_tls_streams_as_etcd_does() {
    use tokio::io::{AsyncBufReadExt as _, BufReader};
    let certs = Certs::make();
    let mut seen = Vec::new();
    for kind in [Kind::Etcd, Kind::Leasehold] {
        let cluster = Cluster::start_with_setup(kind, 1, tls_setup(&certs, false)).await;
        let server = &cluster.members[0];
        let put = |value: &'static str| {
            let mut args = server.etcdctl_flags();
            args.extend(["put", "w", value].map(String::from));
            async move {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let out = etcdctl(&server.endpoint(), &args).await;
                assert!(out.status.success(), "{}", describe_output(&out));
            }
        };
        put("first").await;
        let mut child = tokio::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", server.endpoint()))
            .args(server.etcdctl_flags())
            .args(["watch", "--rev=1", "--prev-kv", "w"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn etcdctl watch");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(10), lines.next_line())
                .await
                .expect("a watch line within 10 s")
                .expect("read etcdctl")
                .expect("etcdctl still watching")
        };
        let mut got = Vec::new();
        for _ in 0..2 {
            got.push(next().await);
        }
        put("second").await;
        for _ in 0..6 {
            got.push(next().await);
        }
        let _ = child.kill().await;
        seen.push(got);
    }
    assert_eq!(
        seen[0],
        ["PUT", "w", "first", "PUT", "w", "first", "w", "second"],
        "etcd"
    );
    assert_eq!(seen[1], seen[0], "leasehold's watch differs from etcd's");
}

/// The etcd-client crate over mutual TLS: a put, a lease with a key, a renewal and a watch
/// that sees the key's delete when the lease is revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_library_over_mutual_tls_uses_kv_leases_and_watch() {
    let certs = Certs::make();
    let cluster = Cluster::start_with_setup(Kind::Leasehold, 1, tls_setup(&certs, false)).await;
    let mut client = cluster.members[0].client().await;
    client.put("plain", "v", None).await.expect("put");
    let got = client.get("plain", None).await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"v");
    let lease = client.lease_grant(60, None).await.expect("grant").id();
    let put = etcd_client::PutOptions::new().with_lease(lease);
    let put_revision = client
        .put("session", "alive", Some(put))
        .await
        .expect("put")
        .header()
        .expect("a header")
        .revision();
    let (mut keeper, mut answers) = client.lease_keep_alive(lease).await.expect("keepalive");
    keeper.keep_alive().await.expect("renew");
    let renewed = answers.message().await.expect("renewal answer");
    assert!(renewed.is_some_and(|r| r.ttl() > 0));
    // From the revision after the put: the stream's answer may come before the server has
    // registered the watch, and a revoke applied in between must still be seen.
    let from = etcd_client::WatchOptions::new().with_start_revision(put_revision + 1);
    let mut events = client.watch("session", Some(from)).await.expect("watch");
    client.lease_revoke(lease).await.expect("revoke");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let next = tokio::time::timeout_at(deadline.into(), events.message()).await;
        let response = next
            .expect("a watch event within 10 s")
            .expect("watch stream")
            .expect("watch stream open");
        if response
            .events()
            .iter()
            .any(|e| e.event_type() == etcd_client::EventType::Delete)
        {
            break;
        }
    }
}

/// etcdctl 3.4 sends the whole `https://host:port` URL as the HTTP/2 `:authority` for the
/// `endpoint status` family; over TLS too, leasehold answers it (as etcd does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_endpoint_status_works_with_an_https_url() {
    let certs = Certs::make();
    for kind in [Kind::Etcd, Kind::Leasehold] {
        let cluster = Cluster::start_with_setup(kind, 1, tls_setup(&certs, false)).await;
        let server = &cluster.members[0];
        let mut args = server.etcdctl_flags();
        args.extend(["endpoint", "status", "-w", "json"].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = etcdctl(&server.endpoint(), &args).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&server.endpoint()),
            "{}: {}",
            server.label(),
            describe_output(&out)
        );
    }
}

/// `--auto-tls`: the member makes a self-signed certificate at start and serves TLS with it;
/// etcdctl reaches it with `--insecure-skip-tls-verify`, and refuses it when it verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_tls_serves_with_a_self_signed_certificate() {
    let [client, peer] = common::free_ports::<2>();
    let dir = tempfile::tempdir().expect("temp dir");
    let endpoint = format!("https://127.0.0.1:{client}");
    let mut child = tokio::process::Command::new(common::leasehold_binary())
        .arg(format!("--data-dir={}", dir.path().join("data").display()))
        .arg(format!("--listen-client-urls={endpoint}"))
        .arg(format!("--advertise-client-urls={endpoint}"))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
        ))
        .arg("--auto-tls")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn leasehold");
    let deadline = Instant::now() + common::READY_TIMEOUT;
    loop {
        // etcdctl 3.4 goes plaintext without a certificate flag unless told not to.
        let args = [
            "--insecure-transport=false",
            "--insecure-skip-tls-verify",
            "put",
            "k",
            "v",
        ];
        let out = etcdctl(&endpoint, &args).await;
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not serving over auto TLS: {}",
            describe_output(&out)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let verified = etcdctl(&endpoint, &["--insecure-transport=false", "get", "k"]).await;
    assert!(
        !verified.status.success(),
        "a self-signed certificate passed verification: {}",
        describe_output(&verified)
    );
    // Refused for its certificate, not for want of a server: without verification it answers.
    let skipped = [
        "--insecure-transport=false",
        "--insecure-skip-tls-verify",
        "get",
        "k",
    ];
    let out = etcdctl(&endpoint, &skipped).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "k\nv\n",
        "{}",
        describe_output(&out)
    );
    let _ = child.kill().await;
}

/// `http://` and `https://` client URLs on one port (etcd 3.5+ serves both on one socket; etcd
/// 3.7's own TestConnectionMultiplexing checks leasehold against it in `scripts/test.sh`;
/// Debian's etcd 3.4 starts with them but refuses connections on that port): etcdctl writes
/// over plain HTTP/2 and reads over TLS on the same port, and curl reaches `/version` both
/// ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_tls_clients_share_one_port() {
    let certs = Certs::make();
    for kind in [Kind::Leasehold] {
        let [client, peer] = common::free_ports::<2>();
        let dir = tempfile::tempdir().expect("temp dir");
        let plain = format!("http://127.0.0.1:{client}");
        let tls = format!("https://127.0.0.1:{client}");
        let mut child = tokio::process::Command::new(kind.binary())
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={plain},{tls}"))
            .arg(format!("--advertise-client-urls={plain}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}"))
            .arg(format!("--cert-file={}", certs.server.cert.display()))
            .arg(format!("--key-file={}", certs.server.key.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the server");
        let deadline = Instant::now() + common::READY_TIMEOUT;
        loop {
            let out = etcdctl(&plain, &["put", "k", "v"]).await;
            if out.status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{kind:?}: not serving plain HTTP/2: {}",
                describe_output(&out)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let ca = format!("--cacert={}", certs.ca.display());
        let out = etcdctl(&tls, &[&ca, "--insecure-transport=false", "get", "k"]).await;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "k\nv\n",
            "{kind:?} over TLS on the same port: {}",
            describe_output(&out)
        );
        for (url, extra) in [(&plain, None), (&tls, Some(&certs.ca))] {
            let mut curl = Command::new("curl");
            curl.args(["-sS", "--max-time", "10"]);
            if let Some(ca) = extra {
                curl.arg("--cacert").arg(ca);
            }
            let out = curl
                .arg(format!("{url}/version"))
                .output()
                .expect("run curl");
            assert!(
                out.status.success() && String::from_utf8_lossy(&out.stdout).contains("etcdserver"),
                "{kind:?}: curl {url}/version: {out:?}"
            );
        }
        let _ = child.kill().await;
    }
}

/// `--peer-auto-tls` with `https://` peer URLs: every member makes its own certificate and the
/// members talk TLS without checking them, as etcd's do; three members elect a leader, and a
/// write through one is read through another, on etcd and on leasehold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_auto_tls_joins_three_members_over_tls() {
    for kind in [Kind::Etcd, Kind::Leasehold] {
        let setup = Setup {
            peer_auto_tls: true,
            ..Setup::default()
        };
        let cluster = Cluster::start_with_setup(kind, 3, setup).await;
        assert!(cluster.members[1].peer_url().starts_with("https://"));
        let mut first = cluster.members[0].client().await;
        first.put("auto", "tls", None).await.expect("put");
        let mut third = cluster.members[2].client().await;
        let got = third.get("auto", None).await.expect("get");
        assert_eq!(got.kvs()[0].value(), b"tls", "{kind:?}");
        if kind == Kind::Leasehold {
            // The peer port speaks TLS only: a plain HTTP/2 client is not served.
            let plain = Command::new("curl")
                .args(["-sS", "--http2-prior-knowledge", "--max-time", "5"])
                .arg(
                    cluster.members[0]
                        .peer_url()
                        .replacen("https://", "http://", 1),
                )
                .output()
                .expect("run curl");
            assert!(
                !plain.status.success(),
                "plain HTTP on a TLS peer port: {plain:?}"
            );
        }
    }
}

/// Whether `etcdctl` with `flags` is refused by `server` quickly (non-zero exit, not a hang).
async fn refused(server: &common::Server, flags: &[String], what: &str) {
    let started = Instant::now();
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend(["put", "refused", "x"]);
    // Refused by TLS, not later: the server logs a failed handshake for it, in etcd's words.
    let marker = "rejected connection";
    let handshakes_failed = || server.log().matches(marker).count();
    let before = handshakes_failed();
    let out = etcdctl(&server.endpoint(), &args).await;
    let took = started.elapsed();
    assert!(
        handshakes_failed() > before,
        "{}: {what} was not refused at the TLS handshake:\n{}\n{}",
        server.label(),
        describe_output(&out),
        server.log_tail()
    );
    assert!(
        !out.status.success(),
        "{}: {what} was accepted:\n{}",
        server.label(),
        describe_output(&out)
    );
    assert!(
        took < REFUSAL_WITHIN,
        "{}: {what} took {took:?} to be refused:\n{}",
        server.label(),
        describe_output(&out)
    );
}

/// Under `--client-cert-auth`, or with `--trusted-ca-file` alone (etcd's rule: a trusted CA
/// requires client certificates too), a client without a certificate, with one from another
/// CA, or with an expired one is refused at the handshake, by etcd and by leasehold, within
/// etcdctl's dial timeout (never a hang); so is a client that does not trust the server's CA.
/// The good certificate works, for gRPC and for curl over HTTPS (HTTP/1.1), and nothing
/// refused wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_client_certificates_are_refused_at_the_handshake() {
    let certs = Certs::make();
    let path = |p: &std::path::Path| p.display().to_string();
    let cases = [
        (Kind::Etcd, true),
        (Kind::Leasehold, true),
        (Kind::Etcd, false),
        (Kind::Leasehold, false),
    ];
    for (kind, client_cert_auth) in cases {
        let mut setup = tls_setup(&certs, false);
        if let Some(tls) = &mut setup.tls {
            tls.client_cert_auth = client_cert_auth;
        }
        let cluster = Cluster::start_with_setup(kind, 1, setup).await;
        let server = &cluster.members[0];
        let ca = format!("--cacert={}", path(&certs.ca));
        refused(server, std::slice::from_ref(&ca), "no client certificate").await;
        let stranger = [
            ca.clone(),
            format!("--cert={}", path(&certs.stranger.cert)),
            format!("--key={}", path(&certs.stranger.key)),
        ];
        refused(server, &stranger, "a certificate from another CA").await;
        let expired = [
            ca.clone(),
            format!("--cert={}", path(&certs.expired.cert)),
            format!("--key={}", path(&certs.expired.key)),
        ];
        refused(server, &expired, "an expired certificate").await;
        let distrustful = [
            format!("--cacert={}", path(&certs.other_ca)),
            format!("--cert={}", path(&certs.client.cert)),
            format!("--key={}", path(&certs.client.key)),
        ];
        refused(server, &distrustful, "a client that does not trust the CA").await;

        let mut good = server.etcdctl_flags();
        good.extend(["get".to_owned(), "refused".to_owned()]);
        let args: Vec<&str> = good.iter().map(String::as_str).collect();
        let out = etcdctl(&server.endpoint(), &args).await;
        assert!(out.status.success(), "{}", describe_output(&out));
        assert!(
            out.stdout.is_empty(),
            "{}: a refused put wrote: {}",
            server.label(),
            describe_output(&out)
        );

        let curl = |with_cert: bool| {
            let mut command = Command::new("curl");
            command.args(["-sS", "--http1.1", "--max-time", "10", "--cacert"]);
            command.arg(&certs.ca);
            if with_cert {
                command.arg("--cert").arg(&certs.client.cert);
                command.arg("--key").arg(&certs.client.key);
            }
            command
                .arg(format!("{}/health", server.endpoint()))
                .output()
                .expect("run curl")
        };
        let out = curl(true);
        let body = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && body.contains(r#""health":"true""#),
            "{}: curl /health over HTTPS: {out:?}",
            server.label()
        );
        assert!(
            !curl(false).status.success(),
            "{}: curl without a certificate was served",
            server.label()
        );
    }
}

/// A member given a certificate file it cannot use exits at start with a message that names
/// the flag, instead of serving without TLS or hanging: a missing file, a key that does not
/// belong to the certificate, an `https://` URL without a certificate.
#[test]
fn a_bad_certificate_file_stops_the_member_at_start() {
    let certs = Certs::make();
    let path = |p: &std::path::Path| p.display().to_string();
    let cases: [(&str, Vec<String>); 4] = [
        (
            "--cert-file /nonexistent/cert.pem",
            vec![
                "--cert-file=/nonexistent/cert.pem".to_owned(),
                format!("--key-file={}", path(&certs.server.key)),
            ],
        ),
        (
            "--cert-file and --key-file do not make a pair",
            vec![
                format!("--cert-file={}", path(&certs.server.cert)),
                format!("--key-file={}", path(&certs.client.key)),
            ],
        ),
        ("an https:// URL needs --cert-file and --key-file", vec![]),
        (
            "--client-cert-auth needs --trusted-ca-file",
            vec![
                format!("--cert-file={}", path(&certs.server.cert)),
                format!("--key-file={}", path(&certs.server.key)),
                "--client-cert-auth=true".to_owned(),
            ],
        ),
    ];
    for (expected, flags) in cases {
        let dir = tempfile::tempdir().expect("temp dir");
        let [client, peer] = common::free_ports::<2>();
        let mut child = Command::new(common::leasehold_binary())
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls=https://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .args(&flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn leasehold");
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if started.elapsed() > BAD_START_EXIT_WITHIN {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{flags:?}: still running {BAD_START_EXIT_WITHIN:?} after start");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        use std::io::Read as _;
        child
            .stderr
            .take()
            .expect("piped")
            .read_to_string(&mut stderr)
            .expect("read stderr");
        assert!(!status.success(), "{flags:?}: exited {status}");
        assert!(
            stderr.contains(expected),
            "{flags:?}: expected {expected:?} in:\n{stderr}"
        );
    }
}

/// Three members with client and peer mutual TLS (`https://` peer URLs, peer client
/// certificates required): a write through one member is read through another, and after the
/// leader is killed the survivors elect a new one over TLS and take writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_cluster_runs_with_client_and_peer_mutual_tls() {
    let certs = Certs::make();
    for kind in [Kind::Etcd, Kind::Leasehold] {
        let mut cluster = Cluster::start_with_setup(kind, 3, tls_setup(&certs, true)).await;
        assert!(cluster.members[0].peer_url().starts_with("https://"));
        // The peer port requires a client certificate from the CA, as the client port does.
        let peer_tls = |with_cert: bool| {
            let mut command = Command::new("curl");
            command.args([
                "-sS",
                "--http2-prior-knowledge",
                "--max-time",
                "10",
                "--cacert",
            ]);
            command.arg(&certs.ca);
            if with_cert {
                command.arg("--cert").arg(&certs.server.cert);
                command.arg("--key").arg(&certs.server.key);
            }
            command
                .arg(format!("{}/", cluster.members[0].peer_url()))
                .output()
                .expect("run curl")
                .status
                .success()
        };
        if kind == Kind::Leasehold {
            // (etcd's peer port speaks HTTP/1.1 to curl; leasehold's is gRPC over HTTP/2.)
            assert!(
                peer_tls(true),
                "the peer port refused a member's certificate"
            );
        }
        assert!(
            !peer_tls(false),
            "{kind:?}: the peer port took a client without a certificate"
        );
        let mut first = cluster.members[0].client().await;
        first.put("over-tls", "1", None).await.expect("put");
        let mut third = cluster.members[2].client().await;
        let got = third.get("over-tls", None).await.expect("get");
        assert_eq!(got.kvs()[0].value(), b"1", "{kind:?}");
        let leader = cluster.leader().await;
        cluster.members[leader].kill9();
        let new_leader = cluster.leader().await;
        assert_ne!(new_leader, leader);
        let survivor = (leader + 1) % 3;
        let mut client = cluster.members[survivor].client().await;
        client
            .put("over-tls", "2", None)
            .await
            .expect("put after failover");
        let got = client.get("over-tls", None).await.expect("get");
        assert_eq!(got.kvs()[0].value(), b"2", "{kind:?}");
    }
}
