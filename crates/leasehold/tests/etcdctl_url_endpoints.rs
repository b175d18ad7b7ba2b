//! etcdctl 3.4 with `--endpoints=http://host:port`, the form etcd's own documentation uses.
//! Some commands (`endpoint status`, `endpoint hashkv`, `defrag`) dial that string as it is and
//! send the whole URL as the HTTP/2 `:authority`, which h2 refuses as malformed unless the
//! client port repairs it (crates/server/src/authority.rs). Each command must get leasehold's
//! real answer: its result, or for an RPC leasehold does not implement, `Unimplemented`, never
//! a protocol error.

use leasehold_testkit as common;

use common::{Leasehold, describe_output, etcdctl, stdout_of};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_with_a_url_endpoint() {
    let server = Leasehold::start().await;
    let endpoint = server.endpoint();
    assert!(endpoint.starts_with("http://"), "{endpoint}");

    let put = ok(&endpoint, &["put", "k", "v"]).await;
    assert_eq!(stdout_of(&put), "OK\n");
    let get = ok(&endpoint, &["get", "k"]).await;
    assert_eq!(stdout_of(&get), "k\nv\n");

    let health = ok(&endpoint, &["endpoint", "health"]).await;
    let text = format!(
        "{}{}",
        stdout_of(&health),
        String::from_utf8_lossy(&health.stderr)
    );
    assert!(
        text.contains(&format!("{endpoint} is healthy")),
        "{}",
        describe_output(&health)
    );

    let status = ok(&endpoint, &["endpoint", "status", "-w", "json"]).await;
    let statuses: Value = serde_json::from_slice(&status.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", describe_output(&status)));
    let status = &statuses[0];
    assert_eq!(
        status["Endpoint"],
        Value::String(endpoint.clone()),
        "{statuses}"
    );
    let header = &status["Status"]["header"];
    assert!(
        header["revision"].as_i64().is_some_and(|r| r >= 2),
        "revision after one put: {statuses}"
    );
    assert_eq!(
        status["Status"]["leader"], header["member_id"],
        "the only member leads: {statuses}"
    );
    let table = ok(&endpoint, &["endpoint", "status"]).await;
    assert!(
        stdout_of(&table).starts_with(&format!("{endpoint}, ")),
        "{}",
        describe_output(&table)
    );

    // Not implemented by leasehold (docs/compat.md): the answer must be that, from the service.
    for args in [
        &["endpoint", "hashkv"][..],
        &["defrag"],
        &["move-leader", "1234"],
    ] {
        let output = etcdctl(&endpoint, args).await;
        let text = describe_output(&output);
        assert!(!output.status.success(), "etcdctl {args:?}: {text}");
        assert!(
            text.contains("code = Unimplemented"),
            "etcdctl {args:?} should be told Unimplemented: {text}"
        );
    }
}

async fn ok(endpoint: &str, args: &[&str]) -> std::process::Output {
    let output = etcdctl(endpoint, args).await;
    assert!(
        output.status.success(),
        "etcdctl {args:?} failed\n{}",
        describe_output(&output)
    );
    output
}
