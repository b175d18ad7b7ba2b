//! A member's configuration: etcd's server flags with etcd's names and defaults, and the
//! identity etcd derives from them (member and cluster IDs from peer URLs and the cluster token).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use leasehold_server::identity;

#[derive(Args, Debug, Clone)]
pub struct NodeConfig {
    /// Human-readable name for this member.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// Path to the data directory.
    #[arg(long, default_value = "./leasehold.data")]
    pub data_dir: PathBuf,
    /// Comma-separated URLs to listen on for client traffic.
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    pub listen_client_urls: String,
    /// Comma-separated client URLs to advertise (defaults to the listen URLs).
    #[arg(long)]
    pub advertise_client_urls: Option<String>,
    /// Comma-separated URLs to listen on for peer traffic (Raft and forwarding between members).
    #[arg(long, default_value = "http://127.0.0.1:2380")]
    pub listen_peer_urls: String,
    /// Comma-separated URLs to listen on for etcd's HTTP endpoints only (`/health`, `/livez`,
    /// `/readyz`, `/version`), as etcd's `--listen-metrics-urls`; none by default.
    #[arg(long, default_value = "")]
    pub listen_metrics_urls: String,
    /// This member's peer URLs to advertise to the rest of the cluster.
    #[arg(long, default_value = "http://127.0.0.1:2380")]
    pub initial_advertise_peer_urls: String,
    /// Initial cluster configuration for bootstrapping, `name=peerURL,...`.
    #[arg(long)]
    pub initial_cluster: Option<String>,
    /// `new` or `existing`.
    #[arg(long, default_value = "new")]
    pub initial_cluster_state: String,
    /// Initial cluster token, mixed into the member and cluster IDs.
    #[arg(long, default_value = "etcd-cluster")]
    pub initial_cluster_token: String,
    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Time (in milliseconds) for an election to timeout.
    #[arg(long, default_value_t = 1000)]
    pub election_timeout: u64,
    /// How often idle watchers that asked for progress notifications get one, e.g. `10m`, `5s`,
    /// `500ms`.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub experimental_watch_progress_notify_interval: std::time::Duration,
    /// Raft entries between snapshots of the state machine (etcd's --snapshot-count).
    #[arg(long, default_value_t = 10_000)]
    pub snapshot_count: u64,
}

/// The member's identity, derived as etcd derives it: from its peer URLs and the cluster token.
#[derive(Debug, PartialEq, Eq)]
pub struct Identity {
    pub member_id: u64,
    pub cluster_id: u64,
    pub peer_urls: Vec<String>,
    /// The other members of the initial cluster: id → first peer URL.
    pub peers: std::collections::BTreeMap<u64, String>,
    /// Every member of the initial cluster: id → name.
    pub names: std::collections::BTreeMap<u64, String>,
}

pub(crate) fn split_urls(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

impl NodeConfig {
    pub fn identity(&self) -> anyhow::Result<Identity> {
        let advertised = split_urls(&self.initial_advertise_peer_urls);
        let initial = self.initial_cluster.clone().unwrap_or_else(|| {
            format!(
                "{}={}",
                self.name,
                advertised.join(&format!(",{}=", self.name))
            )
        });
        let mut members: Vec<(String, String)> = Vec::new();
        for entry in split_urls(&initial) {
            let Some((name, url)) = entry.split_once('=') else {
                bail!("--initial-cluster: expected name=url, got {entry:?}");
            };
            members.push((name.to_owned(), url.to_owned()));
        }
        let mut by_name: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
        for (name, url) in &members {
            by_name.entry(name.as_str()).or_default().push(url.clone());
        }
        let Some(mine) = by_name.get(self.name.as_str()).cloned() else {
            bail!(
                "couldn't find local name {:?} in the initial cluster configuration",
                self.name
            );
        };
        let token = &self.initial_cluster_token;
        let mut mine = mine;
        mine.sort();
        let member_id = identity::member_id(&mine, token);
        let mut peers = std::collections::BTreeMap::new();
        let mut names = std::collections::BTreeMap::new();
        for (name, urls) in &by_name {
            let id = identity::member_id(urls, token);
            names.insert(id, (*name).to_owned());
            if *name != self.name {
                let mut urls = urls.clone();
                urls.sort();
                peers.insert(id, urls[0].clone());
            }
        }
        if peers.contains_key(&member_id) {
            bail!("--initial-cluster: two members share the peer URLs {mine:?}");
        }
        Ok(Identity {
            member_id,
            cluster_id: identity::cluster_id(token),
            peer_urls: mine,
            peers,
            names,
        })
    }

    /// Checks the flags that a member needs to start, without touching the network or disk.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.identity()?;
        self.client_addrs()?;
        for url in split_urls(&self.listen_peer_urls) {
            parse_http_url(&url).with_context(|| format!("--listen-peer-urls {url:?}"))?;
        }
        self.metrics_addrs()?;
        if self.initial_cluster_state != "new" && self.initial_cluster_state != "existing" {
            bail!("--initial-cluster-state must be 'new' or 'existing'");
        }
        Ok(())
    }

    /// `--listen-metrics-urls` as socket addresses (none when the flag is empty).
    pub fn metrics_addrs(&self) -> anyhow::Result<Vec<SocketAddr>> {
        split_urls(&self.listen_metrics_urls)
            .iter()
            .map(|u| parse_http_url(u).with_context(|| format!("--listen-metrics-urls {u:?}")))
            .collect()
    }

    pub fn client_addrs(&self) -> anyhow::Result<Vec<SocketAddr>> {
        split_urls(&self.listen_client_urls)
            .iter()
            .map(|u| parse_http_url(u).with_context(|| format!("--listen-client-urls {u:?}")))
            .collect()
    }
}

/// `http://host:port` to a socket address. TLS (`https`) and unix sockets are not supported yet.
pub(crate) fn parse_http_url(url: &str) -> anyhow::Result<SocketAddr> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("only http:// URLs are supported (TLS is not implemented yet)");
    };
    let hostport = rest.trim_end_matches('/');
    let hostport = hostport.replace("localhost:", "127.0.0.1:");
    hostport
        .parse()
        .with_context(|| format!("not host:port: {hostport:?}"))
}

/// Durations as etcd writes them: a number and a unit (`ms`, `s`, `m`, `h`).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("not a duration: {s:?}"))?;
    let ms = match unit {
        "ms" => n,
        "s" => n * 1000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        _ => return Err(format!("unknown unit in {s:?} (use ms, s, m or h)")),
    };
    if ms == 0 {
        return Err("a duration must be positive".into());
    }
    Ok(std::time::Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        a: NodeConfig,
    }

    fn parse(args: &[&str]) -> NodeConfig {
        P::try_parse_from(std::iter::once("leasehold").chain(args.iter().copied()))
            .unwrap()
            .a
    }

    #[test]
    fn etcd_flags_parse_with_etcd_names() {
        let a = parse(&[
            "--name",
            "n1",
            "--data-dir",
            "/tmp/x",
            "--listen-client-urls",
            "http://127.0.0.1:1,http://127.0.0.1:2",
            "--advertise-client-urls",
            "http://127.0.0.1:1",
            "--listen-peer-urls",
            "http://127.0.0.1:3",
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:3",
            "--initial-cluster",
            "n1=http://127.0.0.1:3",
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            "t",
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
        ]);
        assert_eq!(a.client_addrs().unwrap().len(), 2);
        assert_eq!((a.heartbeat_interval, a.election_timeout), (50, 500));
        assert_eq!(
            a.identity().unwrap().peer_urls,
            vec!["http://127.0.0.1:3".to_string()]
        );
    }

    #[test]
    fn identity_is_stable_and_depends_on_urls_and_token() {
        let a = parse(&["--initial-cluster-token", "a"]).identity().unwrap();
        assert_eq!(
            a,
            parse(&["--initial-cluster-token", "a"]).identity().unwrap()
        );
        assert_ne!(
            a.member_id,
            parse(&["--initial-cluster-token", "b"])
                .identity()
                .unwrap()
                .member_id
        );
        assert_ne!(a.member_id, 0);
    }

    #[test]
    fn durations_parse_like_etcds() {
        assert_eq!(
            parse_duration("10m"),
            Ok(std::time::Duration::from_secs(600))
        );
        assert_eq!(
            parse_duration("500ms"),
            Ok(std::time::Duration::from_millis(500))
        );
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("0s").is_err());
    }

    #[test]
    fn every_member_derives_the_same_ids() {
        let cluster = "a=http://127.0.0.1:1,b=http://127.0.0.1:2,c=http://127.0.0.1:3";
        let ids: Vec<Identity> = ["a", "b", "c"]
            .iter()
            .map(|n| {
                parse(&["--name", n, "--initial-cluster", cluster])
                    .identity()
                    .unwrap()
            })
            .collect();
        for id in &ids {
            assert_eq!(id.cluster_id, ids[0].cluster_id);
            assert_eq!(id.peers.len(), 2);
            assert!(!id.peers.contains_key(&id.member_id));
        }
        // a's view of b is b's own id.
        assert_eq!(ids[0].peers[&ids[1].member_id], "http://127.0.0.1:2");
        assert_ne!(ids[0].member_id, ids[1].member_id);
    }

    #[test]
    fn bad_cluster_configs_are_refused() {
        assert!(
            parse(&["--name", "x", "--initial-cluster", "y=http://127.0.0.1:1"])
                .identity()
                .is_err()
        );
        assert!(
            parse(&[
                "--initial-cluster",
                "default=http://127.0.0.1:1,b=http://127.0.0.1:1"
            ])
            .identity()
            .is_err(),
            "two members with the same peer URL"
        );
        assert!(
            parse(&["--listen-client-urls", "https://127.0.0.1:1"])
                .client_addrs()
                .is_err()
        );
    }
}
