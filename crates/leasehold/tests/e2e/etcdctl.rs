//! etcdctl (v3 API, Debian's 3.4) against leasehold. Where the output is deterministic the
//! same invocations run against real etcd and exit codes and outputs must agree (after masking
//! endpoints and cluster/member IDs); `endpoint` and `member` commands, whose output carries
//! sizes, versions and IDs, are checked for what they must say.

use leasehold_testkit as common;
use leasehold_testkit::stdout_of;

use common::{
    Leasehold, MEMBER_NAME, Server, ctl, ctl_stdin, describe_output, etcdctl_differential,
};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_del_same_as_etcd() {
    etcdctl_differential(
        "put_get_del_same_as_etcd",
        &[
            ctl(&["get", "k"]),
            ctl(&["put", "k", "v1"]),
            ctl(&["put", "--prev-kv", "k", "v2"]),
            ctl(&["put", "--prev-kv", "k2", "first"]),
            ctl(&["put", "k3", "v3"]),
            ctl(&["put", "other", "o"]),
            ctl(&["get", "k"]),
            ctl(&["get", "missing"]),
            ctl(&["get", "--prefix", "k"]),
            ctl(&["get", "--prefix", "--limit=2", "k"]),
            ctl(&["get", "--prefix", "--keys-only", "k"]),
            ctl(&["get", "--prefix", "--print-value-only", "k"]),
            ctl(&["get", "--prefix", "--count-only", "-w", "json", "k"]),
            ctl(&["get", "--from-key", "k2"]),
            ctl(&["get", "k", "kz"]),
            ctl(&[
                "get",
                "--prefix",
                "--sort-by=MODIFY",
                "--order=DESCEND",
                "k",
            ]),
            ctl(&["get", "--prefix", "--sort-by=VALUE", "--order=ASCEND", ""]),
            // etcdctl sends KEY/ASCEND as such (etcd-client rewrites it to NONE).
            ctl(&["get", "--prefix", "--sort-by=KEY", "--order=ASCEND", "k"]),
            ctl(&[
                "get",
                "--prefix",
                "--sort-by=KEY",
                "--order=DESCEND",
                "--limit=2",
                "k",
            ]),
            ctl(&[
                "get",
                "--prefix",
                "--sort-by=CREATE",
                "--order=DESCEND",
                "k",
            ]),
            ctl(&[
                "get",
                "--prefix",
                "--sort-by=VERSION",
                "--order=ASCEND",
                "k",
            ]),
            ctl(&["get", "--prefix", "--sort-by=VALUE", "k"]),
            ctl(&["get", "-w", "json", "k"]),
            ctl(&["get", "-w", "json", "--prefix", "k"]),
            ctl(&["get", "-w", "json", "missing"]),
            ctl(&["get", "--rev=2", "k"]),
            ctl(&["get", "--rev=3", "-w", "json", "k"]),
            ctl(&["get", "--rev=100", "k"]),
            ctl(&["put", "", "v"]),
            ctl(&["del", "k3"]),
            ctl(&["del", "missing"]),
            ctl(&["put", "k3", "again"]),
            ctl(&["del", "--prefix", "--prev-kv", "k"]),
            ctl(&["get", "--prefix", ""]),
            ctl(&["del", "--prefix", "--prev-kv", "-w", "json", "other"]),
            ctl(&["get", "-w", "json", "--prefix", ""]),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_from_stdin_same_as_etcd() {
    etcdctl_differential(
        "txn_from_stdin_same_as_etcd",
        &[
            // t does not exist: its mod revision is 0.
            ctl_stdin(
                &["txn"],
                "mod(\"t\") = \"0\"\n\nput t 1\nget t\n\nget t\n\n",
            ),
            ctl_stdin(
                &["txn"],
                "mod(\"t\") > \"0\"\nvalue(\"t\") = \"1\"\n\nput t 2\nput u 1\n\nget t\n\n",
            ),
            ctl_stdin(
                &["txn"],
                "version(\"t\") = \"5\"\n\nput t never\n\ndel u\nget --prefix t\n\n",
            ),
            ctl_stdin(
                &["txn"],
                "create(\"t\") < \"3\"\n\nget t\n\nput t never\n\n",
            ),
            ctl_stdin(
                &["txn", "-w", "json"],
                "value(\"t\") != \"2\"\n\nput t 3\n\nput t 4\nget t\n\n",
            ),
            // No compares: the success branch runs.
            ctl_stdin(&["txn"], "\nput x 1\nget x\n\n\n"),
            // A txn refused by the server: duplicate key.
            ctl_stdin(&["txn"], "\nput x 1\nput x 2\n\n\n"),
            ctl(&["get", "--prefix", ""]),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_same_as_etcd() {
    etcdctl_differential(
        "compaction_same_as_etcd",
        &[
            ctl(&["put", "c", "1"]),
            ctl(&["put", "c", "2"]),
            ctl(&["put", "c", "3"]),
            ctl(&["put", "c", "4"]),
            ctl(&["compaction", "3"]),
            ctl(&["get", "--rev=2", "c"]),
            ctl(&["get", "--rev=3", "c"]),
            ctl(&["compaction", "3"]),
            ctl(&["compaction", "100"]),
            ctl(&["compaction", "--physical", "5"]),
            ctl(&["get", "--rev=4", "c"]),
            ctl(&["get", "-w", "json", "c"]),
        ],
    )
    .await;
}

/// Runs etcdctl and asserts it exited 0.
async fn etcdctl_ok(server: &Server, args: &[&str]) -> std::process::Output {
    common::etcdctl_ok(&server.endpoint(), args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_status_reports_the_endpoint() {
    let server = Leasehold::start().await;
    etcdctl_ok(&server, &["put", "k", "v"]).await;
    // Both endpoint forms: scheme-less, and `http://host:port`, with which etcdctl 3.4 sends the
    // whole URL as the HTTP/2 `:authority` (repaired by the client port, authority.rs).
    let url = server.endpoint();
    for endpoint in [url.trim_start_matches("http://").to_string(), url.clone()] {
        check_endpoint_status(&endpoint).await;
    }
}

async fn check_endpoint_status(endpoint: &str) {
    let endpoint = endpoint.to_string();

    let table = common::etcdctl_ok(&endpoint, &["endpoint", "status"]).await;
    let table = stdout_of(&table);
    assert!(
        table.contains(&endpoint),
        "endpoint status does not show the endpoint:\n{table}"
    );

    let json = common::etcdctl_ok(&endpoint, &["endpoint", "status", "-w", "json"]).await;
    let statuses: Value = serde_json::from_slice(&json.stdout).unwrap_or_else(|e| {
        panic!(
            "endpoint status -w json is not JSON ({e}):\n{}",
            describe_output(&json)
        )
    });
    let statuses = statuses
        .as_array()
        .expect("endpoint status -w json is an array");
    assert_eq!(
        statuses.len(),
        1,
        "one endpoint asked, one status: {statuses:?}"
    );
    let status = &statuses[0];
    assert_eq!(
        status["Endpoint"],
        Value::String(endpoint.clone()),
        "{status}"
    );
    let header = &status["Status"]["header"];
    assert!(
        header["revision"].as_i64().is_some_and(|r| r >= 2),
        "revision after one put: {status}"
    );
    // A single-member cluster's member is its leader.
    assert!(
        header["member_id"].as_u64().is_some_and(|id| id != 0),
        "member_id: {status}"
    );
    assert_eq!(
        status["Status"]["leader"], header["member_id"],
        "the only member leads: {status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_health_reports_healthy() {
    let server = Leasehold::start().await;
    let output = etcdctl_ok(&server, &["endpoint", "health"]).await;
    // etcdctl 3.4 prints the health line on stderr.
    let text = format!(
        "{}{}",
        stdout_of(&output),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains(&format!("{} is healthy", server.endpoint())),
        "endpoint health does not report healthy\n{}",
        describe_output(&output)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_list_shows_one_started_member() {
    let server = Leasehold::start().await;
    let output = etcdctl_ok(&server, &["member", "list"]).await;
    let text = stdout_of(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one member expected:\n{text}");
    // ID, status, name, peer URLs, client URLs, is learner.
    let fields: Vec<&str> = lines[0].split(", ").collect();
    assert_eq!(fields.len(), 6, "member list line: {}", lines[0]);
    assert!(
        u64::from_str_radix(fields[0], 16).is_ok_and(|id| id != 0),
        "member ID: {}",
        lines[0]
    );
    assert_eq!(fields[1], "started", "{}", lines[0]);
    assert_eq!(fields[2], MEMBER_NAME, "{}", lines[0]);
    assert_eq!(fields[3], server.peer_url(), "{}", lines[0]);
    assert_eq!(fields[4], server.endpoint(), "{}", lines[0]);
    assert_eq!(fields[5], "false", "not a learner: {}", lines[0]);

    let json = etcdctl_ok(&server, &["member", "list", "-w", "json"]).await;
    let list: Value = serde_json::from_slice(&json.stdout).unwrap_or_else(|e| {
        panic!(
            "member list -w json is not JSON ({e}):\n{}",
            describe_output(&json)
        )
    });
    let members = list["members"].as_array().expect("members array");
    assert_eq!(members.len(), 1, "{list}");
    assert_eq!(members[0]["name"], MEMBER_NAME, "{list}");
    assert_eq!(
        members[0]["peerURLs"],
        serde_json::json!([server.peer_url()]),
        "{list}"
    );
    assert_eq!(
        members[0]["clientURLs"],
        serde_json::json!([server.endpoint()]),
        "{list}"
    );
    assert_eq!(
        format!("{:x}", members[0]["ID"].as_u64().expect("numeric ID")),
        fields[0],
        "the same ID in both formats: {list}"
    );
}
