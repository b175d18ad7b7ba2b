//! leasehold started the way etcd deployments start etcd: a kubeadm static pod's command line
//! and a Debian-style systemd unit's flags (etcd flags leasehold implements, TLS flags that go
//! unused with the harness's `http://` URLs, as in etcd, and flags that have no effect here), then `ETCD_*` variables alone (a unit's
//! `EnvironmentFile`), then a `--config-file` alone. Each start is used with etcdctl, and
//! `--max-txn-ops` and `--max-request-bytes` are checked to take effect with etcd's errors.
//!
//! leasehold only: etcd would load the TLS files these starts name, which do not exist. TLS
//! itself is tested in `tls.rs`.

use leasehold_testkit as common;

use common::{ConfigStyle, Leasehold, Server, Setup, describe_output, etcdctl, etcdctl_with_stdin};

/// The limits every start below sets, each in its own way.
const TXN_OPS_MAX: usize = 3;
const REQUEST_BYTES_MAX: usize = 4096;

/// kubeadm's etcd command line (`--advertise-client-urls`, `--data-dir`, `--initial-*`,
/// `--listen-*-urls` and `--name` come from the harness), with Debian's usual additions and
/// the limits. The TLS files need not exist: the harness's URLs are `http://`, so, as etcd
/// does, the member serves plain HTTP and warns that the certificate flags go unused.
fn kubeadm_and_systemd_flags(metrics_port: u16) -> Vec<String> {
    [
        "--cert-file=/etc/kubernetes/pki/etcd/server.crt",
        "--client-cert-auth=true",
        "--experimental-initial-corrupt-check=true",
        "--experimental-watch-progress-notify-interval=5s",
        "--key-file=/etc/kubernetes/pki/etcd/server.key",
        &format!("--listen-metrics-urls=http://127.0.0.1:{metrics_port}"),
        "--peer-cert-file=/etc/kubernetes/pki/etcd/peer.crt",
        "--peer-client-cert-auth=true",
        "--peer-key-file=/etc/kubernetes/pki/etcd/peer.key",
        "--peer-trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt",
        "--snapshot-count=10000",
        "--trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt",
        // Debian's and operators' usual ones.
        "--quota-backend-bytes=8589934592",
        "--auto-compaction-retention=8",
        "--enable-v2=false",
        "--logger=zap",
        "--log-level=info",
        "--log-outputs=stderr",
        "--grpc-keepalive-min-time=5s",
        "--grpc-keepalive-interval=2h",
        "--grpc-keepalive-timeout=20s",
        &format!("--max-txn-ops={TXN_OPS_MAX}"),
        &format!("--max-request-bytes={REQUEST_BYTES_MAX}"),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

/// put and get through etcdctl, then the limits: a txn of `TXN_OPS_MAX` puts passes and one
/// more is refused; a put a little under `REQUEST_BYTES_MAX` passes and one over is refused.
async fn serves_with_limits(server: &Server) {
    let endpoint = server.endpoint();
    let ok = |out: &std::process::Output| {
        if !out.status.success() {
            server.fail(&format!("etcdctl failed:\n{}", describe_output(out)));
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(ok(&etcdctl(&endpoint, &["put", "k", "v"]).await), "OK\n");
    assert_eq!(ok(&etcdctl(&endpoint, &["get", "k"]).await), "k\nv\n");

    let puts = |n: usize| -> String {
        let ops: String = (0..n).map(|i| format!("put t{i} x\n")).collect();
        format!("\n{ops}\n\n")
    };
    let out = etcdctl_with_stdin(&endpoint, &["txn"], &puts(TXN_OPS_MAX)).await;
    assert!(ok(&out).starts_with("SUCCESS"), "{}", describe_output(&out));
    let out = etcdctl_with_stdin(&endpoint, &["txn"], &puts(TXN_OPS_MAX + 1)).await;
    assert!(!out.status.success(), "{}", describe_output(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("etcdserver: too many operations in txn request"),
        "{}",
        describe_output(&out)
    );

    let small = "v".repeat(REQUEST_BYTES_MAX - 100);
    ok(&etcdctl(&endpoint, &["put", "small", &small]).await);
    let big = "v".repeat(REQUEST_BYTES_MAX + 1);
    let out = etcdctl(&endpoint, &["put", "big", &big]).await;
    assert!(!out.status.success(), "{}", describe_output(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("etcdserver: request is too large"),
        "{}",
        describe_output(&out)
    );

    // Locks and elections: etcd checks the transaction each makes of the request.
    let mut client = server.client().await;
    let too_large = |what: &str, result: Result<(), etcd_client::Error>| match result {
        Err(etcd_client::Error::GRpcStatus(status)) => assert_eq!(
            (status.code(), status.message()),
            (
                tonic::Code::InvalidArgument,
                "etcdserver: request is too large"
            ),
            "{what}"
        ),
        other => server.fail(&format!("{what}: {other:?}")),
    };
    let lock = client.lock(big.clone(), None).await.map(drop);
    too_large("a lock name above the limit", lock);
    let lease = client.lease_grant(60, None).await.expect("grant").id();
    let campaign = client
        .campaign("limits-election", big.clone(), lease)
        .await
        .map(drop);
    too_large("a campaign value above the limit", campaign);
}

/// Stops the server and checks it exits cleanly.
async fn stop(mut server: Server) {
    let status = server.terminate().await;
    if !status.success() {
        server.fail(&format!("exit after SIGTERM: {status}"));
    }
}

fn assert_logged(server: &Server, line: &str) {
    if !server.log().contains(line) {
        server.fail(&format!("the log lacks {line:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadm_and_systemd_style_flags_start_leasehold() {
    let metrics_port = common::free_port();
    let server = Leasehold::start_with(Setup {
        style: ConfigStyle::Flags,
        args: kubeadm_and_systemd_flags(metrics_port),
        ..Setup::default()
    })
    .await;
    serves_with_limits(&server).await;
    // kubeadm's probe, on the metrics port.
    let probe = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .arg(format!("http://127.0.0.1:{metrics_port}/health"))
        .output()
        .expect("run curl");
    let body = String::from_utf8_lossy(&probe.stdout);
    if !body.contains(r#""health":"true""#) {
        server.fail(&format!("/health on the metrics port: {probe:?}"));
    }
    assert_logged(
        &server,
        "accepted for etcd compatibility, no effect in leasehold: --grpc-keepalive-min-time, \
         --enable-v2",
    );
    // kubeadm asks for the initial corruption check; one member has no peer to disagree with.
    assert_logged(&server, "initial corruption checking passed");
    assert_logged(
        &server,
        "no --listen-client-urls is https://: serving plain HTTP there",
    );
    assert_logged(
        &server,
        "no --listen-peer-urls is https://: serving plain HTTP there",
    );
    stop(server).await;
}

/// kubeadm v1.37's etcd command line: the same, but with etcd 3.6's names for the two
/// `--experimental-` flags (`cmd/kubeadm/app/phases/etcd/local.go`), which etcd 3.7 requires.
fn kubeadm_1_37_flags(metrics_port: u16) -> Vec<String> {
    kubeadm_and_systemd_flags(metrics_port)
        .into_iter()
        .map(|flag| match flag.as_str() {
            "--experimental-initial-corrupt-check=true" => {
                "--feature-gates=InitialCorruptCheck=true".to_owned()
            }
            "--experimental-watch-progress-notify-interval=5s" => {
                "--watch-progress-notify-interval=5s".to_owned()
            }
            _ => flag,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeadm_1_37_flags_start_leasehold() {
    let server = Leasehold::start_with(Setup {
        style: ConfigStyle::Flags,
        args: kubeadm_1_37_flags(common::free_port()),
        ..Setup::default()
    })
    .await;
    serves_with_limits(&server).await;
    // The feature gate asks for the initial corruption check, as the old flag did.
    assert_logged(&server, "initial corruption checking passed");
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_environment_variables_alone_start_leasehold() {
    let server = Leasehold::start_with(Setup {
        style: ConfigStyle::EnvVars,
        env: [
            ("ETCD_MAX_TXN_OPS", TXN_OPS_MAX.to_string()),
            ("ETCD_MAX_REQUEST_BYTES", REQUEST_BYTES_MAX.to_string()),
            ("ETCD_ENABLE_V2", "false".to_owned()),
            ("ETCD_CLIENT_CERT_AUTH", "true".to_owned()),
            ("ETCD_NOT_A_FLAG", "1".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        ..Setup::default()
    })
    .await;
    serves_with_limits(&server).await;
    assert_logged(
        &server,
        "unrecognized environment variable ETCD_NOT_A_FLAG=1",
    );
    assert_logged(
        &server,
        "accepted for etcd compatibility, no effect in leasehold: --enable-v2",
    );
    assert_logged(
        &server,
        "no --listen-client-urls is https://: serving plain HTTP there",
    );
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_alone_starts_leasehold() {
    let log_file = tempfile::tempdir().expect("temp dir");
    let log_path = log_file.path().join("leasehold.log");
    let yaml = format!(
        "max-txn-ops: {TXN_OPS_MAX}\n\
         max-request-bytes: {REQUEST_BYTES_MAX}\n\
         grpc-keepalive-timeout: 20000000000\n\
         log-outputs: [stderr, {}]\n\
         enable-v2: false\n\
         client-transport-security:\n  cert-file: /etc/etcd/server.crt\n  client-cert-auth: true\n\
         peer-transport-security:\n  trusted-ca-file: /etc/etcd/ca.crt\n",
        log_path.display()
    );
    let server = Leasehold::start_with(Setup {
        style: ConfigStyle::ConfigFile,
        yaml,
        // Ignored: the config file is the only source, as in etcd.
        args: vec!["--max-txn-ops=1000".to_owned()],
        env: vec![("ETCD_MAX_REQUEST_BYTES".to_owned(), "100000000".to_owned())],
        ..Setup::default()
    })
    .await;
    serves_with_limits(&server).await;
    assert_logged(&server, "(ignored: --max-txn-ops)");
    assert_logged(
        &server,
        "no --listen-peer-urls is https://: serving plain HTTP there",
    );
    let written = std::fs::read_to_string(&log_path).unwrap_or_default();
    if !written.contains("ready to serve client requests") {
        server.fail(&format!("--log-outputs file has:\n{written}"));
    }
    stop(server).await;
}

/// `--version` (or Go's `-version`) prints etcd's version block, whose first line tools parse
/// (etcd's e2e framework picks flag spellings from it), then leasehold's own version; Debian's
/// etcd prints the same first-line shape.
#[test]
fn version_prints_etcds_first_line_then_leaseholds() {
    for flag in ["--version", "-version"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg(flag)
            .output()
            .expect("run leasehold");
        assert!(out.status.success(), "{flag}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let first = text.lines().next().unwrap_or_default();
        let version = first
            .strip_prefix("etcd Version: ")
            .unwrap_or_else(|| panic!("{flag}: first line {first:?}"));
        assert_eq!(version.split('.').count(), 3, "{version}");
        assert!(
            text.contains(&format!("leasehold Version: {}", env!("CARGO_PKG_VERSION"))),
            "{text}"
        );
    }
    let etcd = std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .expect("run Debian's etcd");
    let etcd = String::from_utf8_lossy(&etcd.stdout);
    assert!(etcd.starts_with("etcd Version: "), "{etcd}");
}
