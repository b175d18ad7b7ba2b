//! Maintenance.Status and Cluster.MemberList over gRPC (etcd-client), and the response-header
//! identity every RPC carries. Not differential (IDs, sizes and versions differ by design); it
//! asserts what must hold for any single-member etcd: the member leads, IDs agree everywhere,
//! and the status revision is the store's revision.

use leasehold_testkit as common;

use common::{Leasehold, MEMBER_NAME};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_member_list_and_headers_agree() {
    let server = Leasehold::start().await;
    let mut client = server.client().await;
    client.put("a", "1", None).await.expect("put");
    let put = client.put("a", "2", None).await.expect("put");
    let put_header = put.header().expect("put header").clone();

    let status = client.status().await.expect("Maintenance.Status");
    let header = status.header().expect("status header");
    assert_eq!(
        header.revision(),
        put_header.revision(),
        "status revision is the store's revision"
    );
    assert_ne!(header.member_id(), 0, "member_id");
    assert_ne!(header.cluster_id(), 0, "cluster_id");
    assert!(header.raft_term() >= 1, "raft_term {}", header.raft_term());
    assert_eq!(status.leader(), header.member_id(), "a single member leads");
    assert_eq!(
        status.raft_term(),
        header.raft_term(),
        "raft term in header and body"
    );
    assert!(
        status.raft_index() >= 1,
        "raft_index {}",
        status.raft_index()
    );
    assert!(!status.version().is_empty(), "version");
    assert!(status.db_size() > 0, "db_size {}", status.db_size());
    assert!(!status.is_learner());

    // Every response names the same cluster and member.
    assert_eq!(
        (put_header.cluster_id(), put_header.member_id()),
        (header.cluster_id(), header.member_id()),
        "KV and Maintenance headers agree"
    );

    let list = client.member_list().await.expect("Cluster.MemberList");
    let list_header = list.header().expect("member list header");
    assert_eq!(
        (list_header.cluster_id(), list_header.member_id()),
        (header.cluster_id(), header.member_id())
    );
    let members = list.members();
    assert_eq!(members.len(), 1, "{members:?}");
    let member = &members[0];
    assert_eq!(
        member.id(),
        header.member_id(),
        "the member is the one answering"
    );
    assert_eq!(member.name(), MEMBER_NAME);
    assert_eq!(member.peer_urls(), [server.peer_url()]);
    assert_eq!(member.client_urls(), [server.endpoint()]);
    assert!(!member.is_learner());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_identity_survives_restart() {
    let mut server = Leasehold::start().await;
    let before = server.client().await.status().await.expect("status");
    let before = before.header().expect("header").clone();
    server.restart().await;
    let after = server
        .client()
        .await
        .status()
        .await
        .expect("status after restart");
    let after = after.header().expect("header");
    assert_eq!(
        (after.cluster_id(), after.member_id()),
        (before.cluster_id(), before.member_id()),
        "a restarted member keeps its cluster and member IDs"
    );
    assert!(
        after.raft_term() >= before.raft_term(),
        "raft term never goes back"
    );
}

/// MemberAdd with peer URLs that are not `scheme://host:port` is refused before anything
/// changes, with etcd's code and message (checked against a real etcd). (etcd also accepts an
/// empty host, `http://:2380`; leasehold refuses it, see docs/compat.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_add_with_bad_peer_urls_same_as_etcd() {
    common::differential("member_add_with_bad_peer_urls_same_as_etcd", |c, r| {
        Box::pin(async move {
            for urls in [vec!["notaurl"], vec!["http://127.0.0.1"]] {
                let label = format!("member add {urls:?}");
                match c.member_add(urls, None).await {
                    Ok(_) => r.note(label, serde_json::json!("added")),
                    Err(e) => r.note(label, common::error_json(&e)),
                }
            }
            let list = c.member_list().await.map(|l| l.members().len());
            r.note("members after", serde_json::json!(list.ok()));
        })
    })
    .await;
}
