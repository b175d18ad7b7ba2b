//! Test hosts in network namespaces (iproute2, as root): a bridge in the root namespace (where
//! the test's clients live) and one namespace per leasehold member, each with its own address.
//! Partitioning a member takes its link down, so it can reach nobody and nobody can reach it;
//! healing brings it back. Every namespace, link and process is removed on drop.

#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

pub const MEMBERS: usize = 3;
const CLIENT_PORT: u16 = 2379;
const PEER_PORT: u16 = 2380;
pub const READY_MAX: Duration = Duration::from_secs(30);
pub const POLL: Duration = Duration::from_millis(100);

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
pub struct NetCluster {
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

    pub fn endpoint(&self, i: usize) -> String {
        format!("http://{}:{CLIENT_PORT}", self.addr(i))
    }

    pub fn create() -> Result<NetCluster, String> {
        // Unique among this process's clusters too: the tests of one binary run in parallel
        // threads, and two clusters with one tag collide on their bridge's name.
        static CREATED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let nth = CREATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = (std::process::id() + nth) % 200 + 20;
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

    pub fn spawn(&mut self, i: usize) {
        let initial_cluster = (0..MEMBERS)
            .map(|j| format!("m{j}=http://{}:{PEER_PORT}", self.addr(j)))
            .collect::<Vec<_>>()
            .join(",");
        let client = self.endpoint(i);
        let peer = format!("http://{}:{PEER_PORT}", self.addr(i));
        let log = std::fs::File::create(self.dirs.path().join(format!("m{i}.log"))).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(i)])
            .arg(crate::ports::leasehold_binary())
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

    pub fn set_link(&self, i: usize, up: bool) {
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

    pub fn log(&self, i: usize) -> String {
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

/// A client of one member with short time-outs (a cut-off member must not stall a test).
pub async fn client(endpoint: &str) -> Option<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_timeout(Duration::from_secs(2));
    Client::connect([endpoint], Some(options)).await.ok()
}

/// (leader id, member id) as the member at `endpoint` reports them.
async fn status(endpoint: &str) -> Option<(u64, u64)> {
    let mut c = client(endpoint).await?;
    let s = c.status().await.ok()?;
    Some((s.leader(), s.header()?.member_id()))
}

impl NetCluster {
    /// The index of the member every member names as leader, polled (bounded) until they agree.
    pub async fn agreed_leader(&self) -> usize {
        let started = Instant::now();
        loop {
            let mut seen = Vec::new();
            for i in 0..MEMBERS {
                seen.push(status(&self.endpoint(i)).await);
            }
            if let Some(Some((leader, _))) = seen.first()
                && *leader != 0
                && seen.iter().all(|s| s.is_some_and(|(l, _)| l == *leader))
                && let Some(at) = seen
                    .iter()
                    .position(|s| s.is_some_and(|(_, me)| me == *leader))
            {
                return at;
            }
            assert!(started.elapsed() < READY_MAX, "no agreed leader: {seen:?}");
            tokio::time::sleep(POLL).await;
        }
    }
}
