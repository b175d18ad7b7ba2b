//! etcdctl 3.4 with `--endpoints=http://host:port`, the form etcd's own documentation uses.
//! Some commands (`endpoint status`, `endpoint hashkv`, `defrag`, `move-leader`) dial that string
//! as it is and send the whole URL as the HTTP/2 `:authority`, which h2 refuses as malformed
//! unless the client port repairs it (crates/server/src/authority.rs). Each command must get
//! leasehold's real answer (its result, or the service's refusal), never a protocol error.

use leasehold_testkit as common;

use common::{Leasehold, describe_output, etcdctl, etcdctl_ok, stdout_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_with_a_url_endpoint() {
    let server = Leasehold::start().await;
    let endpoint = server.endpoint();
    assert!(endpoint.starts_with("http://"), "{endpoint}");

    let put = etcdctl_ok(&endpoint, &["put", "k", "v"]).await;
    assert_eq!(stdout_of(&put), "OK\n");
    let get = etcdctl_ok(&endpoint, &["get", "k"]).await;
    assert_eq!(stdout_of(&get), "k\nv\n");

    // `endpoint status` and `endpoint health` with this form: etcdctl.rs.
    let hashkv = etcdctl_ok(&endpoint, &["endpoint", "hashkv"]).await;
    assert!(
        stdout_of(&hashkv).starts_with(&format!("{endpoint}, ")),
        "{}",
        describe_output(&hashkv)
    );

    let defrag = etcdctl_ok(&endpoint, &["defrag"]).await;
    assert_eq!(
        stdout_of(&defrag),
        format!("Finished defragmenting etcd member[{endpoint}]\n")
    );

    // The service's own refusal (an unknown member), never a protocol error.
    let output = etcdctl(&endpoint, &["move-leader", "1234"]).await;
    let text = describe_output(&output);
    assert!(!output.status.success(), "etcdctl move-leader: {text}");
    assert!(
        text.contains("Error: etcdserver: bad leader transferee"),
        "etcdctl move-leader should be told the transferee is bad: {text}"
    );
}
