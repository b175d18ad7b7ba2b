//! A cluster of members started in-process with `leasehold_node::Node::start`, for tests that do
//! not need a real process (nothing is killed or restarted). Every listener is bound to port 0
//! and kept by the member that serves it, so no port is ever released and taken by someone else.
//! Members stop when the cluster is shut down or dropped.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser as _;
use etcd_client::{Client, ConnectOptions};
use leasehold_node::{Listeners, Node, NodeConfig};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::{READY_TIMEOUT, REQUEST_TIMEOUT, STOP_TIMEOUT};

/// Heartbeat and election timeout of in-process members: etcd's defaults.
const HEARTBEAT_INTERVAL_MS: u64 = 100;
const ELECTION_TIMEOUT_MS: u64 = 1000;
/// How often [`InProcessCluster::leader`] looks again while members disagree.
const LEADER_POLL: Duration = Duration::from_millis(20);

/// One in-process member.
pub struct InProcessMember {
    name: String,
    endpoint: String,
    node: Option<Node>,
    stop: Option<oneshot::Sender<()>>,
}

impl InProcessMember {
    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn label(&self) -> &str {
        &self.name
    }

    /// A client of this member alone.
    pub async fn client(&self) -> Client {
        connect(std::slice::from_ref(&self.endpoint)).await
    }

    fn node(&self) -> &Node {
        self.node.as_ref().expect("member is running")
    }

    /// Stops the member (as SIGTERM would) and waits, bounded, until it has drained.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(node) = self.node.take() {
            match tokio::time::timeout(STOP_TIMEOUT, node.wait()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("{}: stopped with an error: {e:#}", self.name),
                Err(_) => panic!("{}: still running {STOP_TIMEOUT:?} after stop", self.name),
            }
        }
    }
}

/// `size` members of one cluster in this process, each with its own data dir.
pub struct InProcessCluster {
    pub members: Vec<InProcessMember>,
    _dir: TempDir,
}

impl InProcessCluster {
    /// Starts `size` members and returns once every member knows the leader.
    pub async fn start(size: usize) -> InProcessCluster {
        assert!(size > 0, "a cluster has members");
        let dir = tempfile::Builder::new()
            .prefix("leasehold-inprocess-")
            .tempdir()
            .expect("temp dir");
        let data_dirs = (1..=size)
            .map(|i| dir.path().join(format!("m{i}")))
            .collect();
        InProcessCluster::start_on(data_dirs, dir).await
    }

    /// [`InProcessCluster::start`] with member `i` on `data_dirs[i]` (on a file system of the
    /// test's own, say); `dir` lives as long as the cluster.
    pub async fn start_on(data_dirs: Vec<PathBuf>, dir: TempDir) -> InProcessCluster {
        let size = data_dirs.len();
        assert!(size > 0, "a cluster has members");
        let mut bound = Vec::new();
        for _ in 0..size {
            let client = bind_any().await;
            let peer = bind_any().await;
            bound.push((client, peer));
        }
        let peer_url = |i: usize| {
            let port = bound[i].1.local_addr().expect("bound").port();
            format!("http://127.0.0.1:{port}")
        };
        let initial_cluster = (0..size)
            .map(|i| format!("m{}={}", i + 1, peer_url(i)))
            .collect::<Vec<_>>()
            .join(",");
        let configs: Vec<(String, NodeConfig)> = (0..size)
            .map(|i| {
                let name = format!("m{}", i + 1);
                let client_port = bound[i].0.local_addr().expect("bound").port();
                let data_dir = &data_dirs[i];
                let args = vec![
                    "leasehold".to_owned(),
                    format!("--name={name}"),
                    format!("--data-dir={}", data_dir.display()),
                    format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
                    format!("--listen-peer-urls={}", peer_url(i)),
                    format!("--initial-advertise-peer-urls={}", peer_url(i)),
                    format!("--initial-cluster={initial_cluster}"),
                    "--initial-cluster-token=inprocess".to_owned(),
                    format!("--heartbeat-interval={HEARTBEAT_INTERVAL_MS}"),
                    format!("--election-timeout={ELECTION_TIMEOUT_MS}"),
                ];
                let config = Flags::try_parse_from(args).expect("valid flags").config;
                (name, config)
            })
            .collect();
        let mut members = Vec::new();
        for ((name, config), (client, peer)) in configs.into_iter().zip(bound) {
            let endpoint = format!("http://{}", client.local_addr().expect("bound"));
            let listeners = Listeners {
                client: vec![client.into()],
                peer: vec![peer.into()],
                metrics: Vec::new(),
                client_http: Vec::new(),
            };
            let (stop, stopped) = oneshot::channel::<()>();
            let node = Node::start(config, listeners, async move {
                let _ = stopped.await;
            })
            .await
            .unwrap_or_else(|e| panic!("{name}: start: {e:#}"));
            members.push(InProcessMember {
                name,
                endpoint,
                node: Some(node),
                stop: Some(stop),
            });
        }
        let cluster = InProcessCluster { members, _dir: dir };
        for m in &cluster.members {
            assert!(
                m.node().replica().wait_for_leader(READY_TIMEOUT).await,
                "{}: no leader within {READY_TIMEOUT:?}",
                m.name
            );
        }
        cluster
    }

    /// The index of the member that leads, once every running member names the same leader
    /// and that member knows it leads (bounded by [`READY_TIMEOUT`]: an election may be under
    /// way).
    pub async fn leader(&self) -> usize {
        let started = Instant::now();
        loop {
            let named: Vec<(usize, Option<u64>, u64)> = self
                .members
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let n = m.node.as_ref()?;
                    Some((i, n.replica().status().leader, n.member_id()))
                })
                .collect();
            let agreed = named
                .first()
                .and_then(|(_, leader, _)| *leader)
                .filter(|leader| named.iter().all(|(_, l, _)| *l == Some(*leader)));
            let leading = agreed.and_then(|leader| {
                named
                    .iter()
                    .find(|(_, l, id)| *id == leader && *l == Some(leader))
                    .map(|(i, _, _)| *i)
            });
            if let Some(i) = leading {
                return i;
            }
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "no leader all members agree on within {READY_TIMEOUT:?}: {named:?}"
            );
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.endpoint.clone()).collect()
    }

    /// A client of every member.
    pub async fn client(&self) -> Client {
        connect(&self.endpoints()).await
    }

    /// Stops every member, bounded.
    pub async fn shutdown(mut self) {
        for m in &mut self.members {
            m.stop().await;
        }
    }
}

impl Drop for InProcessCluster {
    fn drop(&mut self) {
        // A test that did not call `shutdown` (or panicked): signal every member to stop; their
        // tasks end with the test's runtime.
        for m in &mut self.members {
            if let Some(stop) = m.stop.take() {
                let _ = stop.send(());
            }
        }
    }
}

/// The server flags, parsed as the binary parses them.
#[derive(clap::Parser)]
struct Flags {
    #[command(flatten)]
    config: NodeConfig,
}

async fn bind_any() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port")
}

async fn connect(endpoints: &[String]) -> Client {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(REQUEST_TIMEOUT);
    Client::connect(endpoints, Some(options))
        .await
        .expect("connect")
}
