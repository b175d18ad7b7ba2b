//! Network partitions, with network namespaces the test creates (iproute2, as root): each of
//! three leasehold members runs in its own namespace with its own address on a bridge in the
//! root namespace, where the test's clients live. Partitioning a member takes its link down, so
//! it can reach nobody and nobody can reach it; healing brings it back.
//!
//! What must hold while the leader is cut off with a lease expiring on its side:
//! - the old leader revokes nothing (its expiry proposals can never commit);
//! - no lease expires early (a lease kept alive through the majority survives; an abandoned one
//!   expires only after its TTL);
//! - the majority elects a leader and keeps serving;
//! - after healing, every member converges to the same state.
//!
//! Every namespace, link and process is removed on drop; every wait is bounded.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, PutOptions};

const MEMBERS: usize = 3;
const CLIENT_PORT: u16 = 2379;
const PEER_PORT: u16 = 2380;
const READY_MAX: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A bridge with one namespace per member, and the members' processes.
struct NetCluster {
    tag: u32,
    processes: Vec<Option<Child>>,
    dirs: tempfile::TempDir,
}

impl NetCluster {
    fn bridge(&self) -> String {
        format!("lhbr{}", self.tag)
    }

    fn ns(&self, i: usize) -> String {
        format!("lh{}m{i}", self.tag)
    }

    /// The member's link inside its namespace.
    fn link(&self, i: usize) -> String {
        format!("lh{}m{i}", self.tag)
    }

    fn addr(&self, i: usize) -> String {
        format!("10.213.{}.{}", self.tag, i + 1)
    }

    fn endpoint(&self, i: usize) -> String {
        format!("http://{}:{CLIENT_PORT}", self.addr(i))
    }

    fn create() -> Result<NetCluster, String> {
        let tag = std::process::id() % 200 + 20;
        let cluster = NetCluster {
            tag,
            processes: Vec::new(),
            dirs: tempfile::tempdir().map_err(|e| e.to_string())?,
        };
        let bridge = cluster.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("10.213.{tag}.254/24"),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..MEMBERS {
            let (ns, link) = (cluster.ns(i), cluster.link(i));
            let outside = format!("{link}b");
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &link, "type", "veth", "peer", "name", &outside,
            ])?;
            ip(&["link", "set", &link, "netns", &ns])?;
            ip(&["link", "set", &outside, "master", &bridge])?;
            ip(&["link", "set", &outside, "up"])?;
            let addr = format!("{}/24", cluster.addr(i));
            ip(&[
                "netns", "exec", &ns, "ip", "addr", "add", &addr, "dev", &link,
            ])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", &link, "up"])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) {
        let initial_cluster = (0..MEMBERS)
            .map(|j| format!("m{j}=http://{}:{PEER_PORT}", self.addr(j)))
            .collect::<Vec<_>>()
            .join(",");
        let client = self.endpoint(i);
        let peer = format!("http://{}:{PEER_PORT}", self.addr(i));
        let log = std::fs::File::create(self.dirs.path().join(format!("m{i}.log"))).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(i)])
            .arg(env!("CARGO_BIN_EXE_leasehold"))
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(self.dirs.path().join(format!("m{i}")))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial_cluster])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn a member in its namespace");
        if self.processes.len() <= i {
            self.processes.resize_with(i + 1, || None);
        }
        self.processes[i] = Some(child);
    }

    fn set_link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&[
            "netns",
            "exec",
            &self.ns(i),
            "ip",
            "link",
            "set",
            &self.link(i),
            state,
        ])
        .expect("set link state");
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dirs.path().join(format!("m{i}.log"))).unwrap_or_default()
    }
}

impl Drop for NetCluster {
    fn drop(&mut self) {
        for child in self.processes.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            for i in 0..MEMBERS {
                eprintln!("----- m{i} log -----\n{}", self.log(i));
            }
        }
        for i in 0..MEMBERS {
            let _ = ip(&["netns", "del", &self.ns(i)]);
            let _ = ip(&["link", "del", &format!("{}b", self.link(i))]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}

async fn client(endpoint: &str) -> Option<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_timeout(Duration::from_secs(2));
    Client::connect([endpoint], Some(options)).await.ok()
}

/// (leader id, member id) as member `i` reports them.
async fn status(endpoint: &str) -> Option<(u64, u64)> {
    let mut c = client(endpoint).await?;
    let s = c.status().await.ok()?;
    Some((s.leader(), s.header()?.member_id()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_revokes_nothing_and_the_cluster_converges() {
    const TTL: i64 = 4;
    let mut net = NetCluster::create().expect("network namespaces (needs root and iproute2)");
    for i in 0..MEMBERS {
        net.spawn(i);
    }
    // Wait for one leader that everyone agrees on.
    let started = Instant::now();
    let leader = loop {
        let mut seen = Vec::new();
        for i in 0..MEMBERS {
            seen.push(status(&net.endpoint(i)).await);
        }
        if let Some(Some((leader, _))) = seen.first()
            && *leader != 0
            && seen.iter().all(|s| s.is_some_and(|(l, _)| l == *leader))
            && let Some(at) = seen
                .iter()
                .position(|s| s.is_some_and(|(_, me)| me == *leader))
        {
            break at;
        }
        assert!(started.elapsed() < READY_MAX, "no agreed leader: {seen:?}");
        tokio::time::sleep(POLL).await;
    };
    let majority: Vec<usize> = (0..MEMBERS).filter(|i| *i != leader).collect();
    let mut c = client(&net.endpoint(majority[0])).await.expect("client");
    let kept = c.lease_grant(TTL, None).await.expect("grant").id();
    c.put("kept", "v", Some(PutOptions::new().with_lease(kept)))
        .await
        .expect("put");
    let abandoned = c.lease_grant(TTL, None).await.expect("grant").id();
    let abandoned_granted = Instant::now();
    c.put(
        "abandoned",
        "v",
        Some(PutOptions::new().with_lease(abandoned)),
    )
    .await
    .expect("put");

    // Cut the leader off. It still believes it leads for a while and its lease clock runs on:
    // `kept` passes its deadline on that side, but nothing it proposes can commit.
    net.set_link(leader, false);
    let partitioned_at = Instant::now();
    // The client keeps `kept` alive as clientv3 does, in a task of its own: every 500 ms, and on
    // a failed stream (renewals fail with "no leader" during the election) a new stream.
    let renewals = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let keep_alive = {
        let mut c = c.clone();
        let renewals = renewals.clone();
        tokio::spawn(async move {
            let mut stream = None;
            loop {
                if stream.is_none() {
                    stream = c.lease_keep_alive(kept).await.ok();
                }
                if let Some((keeper, answers)) = &mut stream {
                    let renewed = keeper.keep_alive().await.is_ok()
                        && matches!(answers.message().await, Ok(Some(a)) if a.ttl() > 0);
                    if renewed {
                        renewals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    } else {
                        stream = None;
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let mut abandoned_gone_after = None;
    let mut majority_writes = 0;
    while partitioned_at.elapsed() < Duration::from_secs(TTL as u64 * 3) {
        if c.put("majority", majority_writes.to_string(), None)
            .await
            .is_ok()
        {
            majority_writes += 1;
        }
        if abandoned_gone_after.is_none()
            && let Ok(r) = c.get("abandoned", None).await
            && r.count() == 0
        {
            abandoned_gone_after = Some(abandoned_granted.elapsed());
        }
        let r = c.get("kept", None).await;
        if let Ok(r) = r {
            assert_eq!(
                r.count(),
                1,
                "a lease kept alive through the majority expired"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(majority_writes > 0, "the majority did not serve writes");
    keep_alive.abort();
    assert!(
        renewals.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no renewal went through the majority"
    );
    let gone = abandoned_gone_after.expect("the abandoned lease never expired on the majority");
    assert!(
        gone >= Duration::from_secs(TTL as u64),
        "the abandoned lease expired early: {gone:?}"
    );

    // Heal; the old leader rejoins as a follower and converges.
    net.set_link(leader, true);
    let mut old = None;
    let started = Instant::now();
    while old.is_none() {
        old = client(&net.endpoint(leader)).await;
        assert!(
            started.elapsed() < READY_MAX,
            "the old leader is unreachable after healing"
        );
    }
    let mut old = old.expect("client");
    let started = Instant::now();
    let all = || Some(GetOptions::new().with_all_keys().with_serializable());
    let reference = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .expect("get");
    loop {
        if let Ok(r) = old.get("", all()).await
            && common::kvs_json(r.kvs()) == common::kvs_json(reference.kvs())
        {
            break;
        }
        assert!(
            started.elapsed() < READY_MAX,
            "the old leader did not converge to the majority's state"
        );
        tokio::time::sleep(POLL).await;
    }
    let r = old
        .get("kept", None)
        .await
        .expect("linearizable get on the old leader");
    assert_eq!(r.count(), 1, "the old leader's side revoked `kept`");
    let log = net.log(leader);
    assert!(!log.contains("panicked"), "the old leader panicked:\n{log}");
    // It did try: its expiry proposal for `kept` waited while it was cut off and failed when it
    // learnt of the new leader.
    assert!(
        log.contains("lease expiry:"),
        "the old leader never proposed an expiry, so the test proved nothing:\n{log}"
    );
}
