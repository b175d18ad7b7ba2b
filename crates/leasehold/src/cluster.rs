//! `leasehold cluster`: a local cluster in one command. Starts N members of this same binary on
//! loopback (member i: client port `base + 10000·(i−1)`, peer port one above), each with its own
//! data dir and log under `--data-dir`, prints the endpoints, and on SIGINT/SIGTERM stops them
//! all (SIGTERM, bounded wait, then SIGKILL). A member that exits on its own is reported, and
//! the others keep running — which is how to try a failover by hand (`kill` one member).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use tokio::process::{Child, Command};

/// Largest cluster this command starts (etcd recommends at most 7 voters).
const NODES_MAX: u16 = 7;
/// How long members get to stop after SIGTERM before they are killed.
const STOP_WAIT_MAX: Duration = Duration::from_secs(10);

#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Number of members (1 to 7).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=NODES_MAX as i64))]
    pub nodes: u16,
    /// Directory for the members' data dirs (`m1`, `m2`, …) and logs (`m1.log`, …).
    #[arg(long, default_value = "./leasehold-cluster.data")]
    pub data_dir: PathBuf,
    /// Client port of the first member; member i listens on `base + 10000·(i−1)` for clients and
    /// one above that for peers.
    #[arg(long, default_value_t = 2379)]
    pub base_port: u16,
    /// Heartbeat interval in milliseconds, passed to every member.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Election timeout in milliseconds, passed to every member.
    #[arg(long, default_value_t = 1000)]
    pub election_timeout: u64,
}

/// One member's name and ports.
#[derive(Debug, PartialEq, Eq)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
}

impl ClusterArgs {
    fn members(&self) -> anyhow::Result<Vec<Member>> {
        (0..self.nodes)
            .map(|i| {
                let client_port = u32::from(self.base_port) + 10_000 * u32::from(i);
                let client_port = u16::try_from(client_port)
                    .ok()
                    .filter(|p| *p < u16::MAX)
                    .with_context(|| {
                        format!(
                            "--base-port {}: member {} has no port",
                            self.base_port,
                            i + 1
                        )
                    })?;
                Ok(Member {
                    name: format!("m{}", i + 1),
                    client_port,
                    peer_port: client_port + 1,
                })
            })
            .collect()
    }
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

pub async fn run(args: ClusterArgs) -> anyhow::Result<()> {
    let members = args.members()?;
    let initial_cluster = members
        .iter()
        .map(|m| format!("{}={}", m.name, url(m.peer_port)))
        .collect::<Vec<_>>()
        .join(",");
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("create {}", args.data_dir.display()))?;
    let exe = std::env::current_exe().context("find the leasehold binary")?;
    let mut children: Vec<(String, Child)> = Vec::new();
    for m in &members {
        let log_path = args.data_dir.join(format!("{}.log", m.name));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let child = Command::new(&exe)
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(args.data_dir.join(&m.name))
            .args(["--listen-client-urls", &url(m.client_port)])
            .args(["--advertise-client-urls", &url(m.client_port)])
            .args(["--listen-peer-urls", &url(m.peer_port)])
            .args(["--initial-advertise-peer-urls", &url(m.peer_port)])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-token", "leasehold-local-cluster"])
            .args(["--heartbeat-interval", &args.heartbeat_interval.to_string()])
            .args(["--election-timeout", &args.election_timeout.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start member {}", m.name))?;
        println!(
            "{}: client {} peer {} log {} (pid {})",
            m.name,
            url(m.client_port),
            url(m.peer_port),
            log_path.display(),
            child.id().unwrap_or(0)
        );
        children.push((m.name.clone(), child));
    }
    let endpoints: Vec<String> = members
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.client_port))
        .collect();
    println!("endpoints: {}", endpoints.join(","));
    println!("stop with Ctrl-C");
    wait_until_stopped(&mut children).await?;
    stop_all(&mut children).await;
    Ok(())
}

/// Returns on SIGINT/SIGTERM, or once every member has exited; reports each member as it
/// exits (woken by the exit itself, not by looking every so often).
async fn wait_until_stopped(children: &mut [(String, Child)]) -> anyhow::Result<()> {
    use futures::StreamExt as _;
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut exits: futures::stream::FuturesUnordered<_> = children
        .iter_mut()
        .map(|(name, child)| async move { (name.as_str(), child.wait().await) })
        .collect();
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
            exited = exits.next() => match exited {
                Some((name, Ok(status))) => eprintln!("member {name} exited: {status}"),
                Some((name, Err(e))) => eprintln!("member {name}: waiting for it failed: {e}"),
                None => bail!("every member has exited"),
            },
        }
    }
}

/// SIGTERM to every member, then SIGKILL to any still running after [`STOP_WAIT_MAX`].
async fn stop_all(children: &mut [(String, Child)]) {
    for (_, child) in children.iter() {
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }
    for (name, child) in children.iter_mut() {
        match tokio::time::timeout(STOP_WAIT_MAX, child.wait()).await {
            Ok(Ok(status)) => println!("member {name} stopped: {status}"),
            _ => {
                let _ = child.kill().await;
                eprintln!("member {name} did not stop within {STOP_WAIT_MAX:?}: killed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: ClusterArgs,
    }

    fn parse(args: &[&str]) -> Result<ClusterArgs, clap::Error> {
        let mut argv = vec!["cluster"];
        argv.extend_from_slice(args);
        Wrapper::try_parse_from(argv).map(|w| w.args)
    }

    #[test]
    fn members_get_etcd_style_ports() {
        let members = parse(&[]).unwrap().members().unwrap();
        let ports: Vec<(u16, u16)> = members
            .iter()
            .map(|m| (m.client_port, m.peer_port))
            .collect();
        assert_eq!(ports, vec![(2379, 2380), (12379, 12380), (22379, 22380)]);
        assert_eq!(members[2].name, "m3");
    }

    #[test]
    fn bad_sizes_and_ports_are_refused() {
        assert!(parse(&["--nodes", "0"]).is_err());
        assert!(parse(&["--nodes", "8"]).is_err());
        let too_high = parse(&["--nodes", "3", "--base-port", "60000"]).unwrap();
        assert!(too_high.members().is_err());
    }
}
