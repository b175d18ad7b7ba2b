//! Which member a data dir belongs to, and of which cluster. As etcd keeps its IDs in its WAL's
//! metadata, a member keeps them in `member-ids` in its data dir, written once, at the data
//! dir's first start, before anything else is. From then on they are read, never derived again,
//! so changed flags cannot change who the member is.
//!
//! At the first start the IDs come from:
//! - `--initial-cluster-state new`: the flags, derived as etcd derives them;
//! - `--initial-cluster-state existing`: the cluster, asked over the peer URLs of
//!   `--initial-cluster`'s other members (etcd's `GET /members`), and checked against the
//!   flags as etcd checks them;
//! - a data dir of an earlier build (a database and no `member-ids`): that build's derivation.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::config::{Identity, Ids, NodeConfig};

const FILE: &str = "member-ids";

/// How long a joining member keeps asking the cluster's members before it gives up.
const JOIN_ASKING: Duration = Duration::from_secs(10);
const JOIN_ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// The IDs a data dir was made with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberIds {
    pub member_id: u64,
    pub cluster_id: u64,
    /// The members the data dir started with, this one included: (ID, peer URL).
    pub members: Vec<(u64, String)>,
}

impl MemberIds {
    fn of(identity: &Identity) -> MemberIds {
        let mut members: Vec<(u64, String)> = identity
            .peers
            .iter()
            .map(|(id, url)| (*id, url.clone()))
            .collect();
        members.push((identity.member_id, identity.peer_urls[0].clone()));
        members.sort();
        MemberIds {
            member_id: identity.member_id,
            cluster_id: identity.cluster_id,
            members,
        }
    }

    fn encode(&self) -> String {
        let mut text = format!(
            "# leasehold: this data dir's member and cluster, written at its first start\n\
             member-id={:x}\ncluster-id={:x}\n",
            self.member_id, self.cluster_id
        );
        for (id, url) in &self.members {
            text.push_str(&format!("member={id:x} {url}\n"));
        }
        text
    }

    fn decode(text: &str) -> anyhow::Result<MemberIds> {
        let hex = |v: &str| u64::from_str_radix(v, 16).with_context(|| format!("bad ID {v:?}"));
        let (mut member_id, mut cluster_id, mut members) = (None, None, Vec::new());
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            match line.split_once('=') {
                Some(("member-id", v)) => member_id = Some(hex(v)?),
                Some(("cluster-id", v)) => cluster_id = Some(hex(v)?),
                Some(("member", v)) => {
                    let (id, url) = v.split_once(' ').context("bad member line")?;
                    members.push((hex(id)?, url.to_owned()));
                }
                _ => bail!("unknown line {line:?}"),
            }
        }
        Ok(MemberIds {
            member_id: member_id.context("no member-id")?,
            cluster_id: cluster_id.context("no cluster-id")?,
            members,
        })
    }
}

/// The IDs `data_dir` holds, if it holds any.
pub fn read(data_dir: &Path) -> anyhow::Result<Option<MemberIds>> {
    let path = data_dir.join(FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => MemberIds::decode(&text)
            .map(Some)
            .with_context(|| format!("{} is damaged", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// Writes the IDs into `data_dir` (made if missing), durably: a temporary file, synced, renamed
/// over, and the directory synced.
pub fn write(data_dir: &Path, ids: &MemberIds) -> anyhow::Result<()> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("create data dir {}", data_dir.display()))?;
    let path = data_dir.join(FILE);
    let tmp = data_dir.join(format!("{FILE}.tmp"));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(ids.encode().as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(data_dir)?.sync_all()
    })();
    written.with_context(|| format!("write {}", path.display()))
}

/// Writes the IDs of a member made from the flags (`snapshot restore`).
pub fn write_for(data_dir: &Path, identity: &Identity) -> anyhow::Result<()> {
    write(data_dir, &MemberIds::of(identity))
}

/// This member's identity: the IDs its data dir holds, or, at its first start, the IDs it gets
/// (module docs), written into the data dir before anything else is.
pub async fn resolve(
    config: &NodeConfig,
    data_dir: &Path,
    has_database: bool,
    network: &leasehold_peer::PeerNetwork,
) -> anyhow::Result<Identity> {
    let flags = config.identity()?;
    if let Some(held) = read(data_dir)? {
        return Ok(flags.with_ids(held.member_id, held.cluster_id, &held.members));
    }
    let identity = if has_database {
        config.identity_with(Ids::Legacy)?
    } else if config.initial_cluster_state == "new" {
        flags
    } else {
        join(flags, network).await?
    };
    write(data_dir, &MemberIds::of(&identity))?;
    Ok(identity)
}

/// A member joining a running cluster: the cluster's ID and members from the first of
/// `--initial-cluster`'s other members that answers, checked against the flags as etcd checks
/// them.
async fn join(flags: Identity, network: &leasehold_peer::PeerNetwork) -> anyhow::Result<Identity> {
    let urls: Vec<String> = flags
        .initial
        .iter()
        .filter(|(_, urls)| *urls != flags.peer_urls)
        .flat_map(|(_, urls)| urls.iter().cloned())
        .collect();
    if urls.is_empty() {
        bail!(
            "cannot fetch cluster info from peer urls: --initial-cluster names no other member \
             to join (--initial-cluster-state existing)"
        );
    }
    let started = Instant::now();
    let mut failures = Vec::new();
    let cluster = 'asking: loop {
        for url in &urls {
            match network.cluster_members(url, JOIN_ASK_TIMEOUT).await {
                Ok(cluster) => break 'asking cluster,
                Err(e) => {
                    tracing::warn!(remote = %url, "could not get cluster response: {e}");
                    failures.push(e);
                }
            }
        }
        if started.elapsed() >= JOIN_ASKING {
            bail!(
                "cannot fetch cluster info from peer urls: could not retrieve cluster \
                 information from the given URLs ({})",
                failures.last().map_or("", String::as_str)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    matched(flags, &cluster)
}

/// etcd's check of a joining member's `--initial-cluster` against the cluster's members: as
/// many members, and each one's peer URLs those of a member of the cluster. The IDs are the
/// cluster's.
fn matched(flags: Identity, cluster: &leasehold_peer::ClusterMembers) -> anyhow::Result<Identity> {
    let listed = || {
        cluster
            .members
            .iter()
            .map(|(id, url)| format!("{id:x}={url}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    if flags.initial.len() != cluster.members.len() {
        bail!(
            "error validating peerURLs {}: member count is unequal",
            listed()
        );
    }
    for (_, urls) in &flags.initial {
        if !cluster.members.iter().any(|(_, url)| urls.contains(url)) {
            bail!(
                "error validating peerURLs {}: unmatched member while checking PeerURLs \
                 ({urls:?} is not a member)",
                listed()
            );
        }
    }
    let Some((member_id, _)) = cluster
        .members
        .iter()
        .find(|(_, url)| flags.peer_urls.contains(url))
    else {
        bail!(
            "error validating peerURLs {}: this member is not one",
            listed()
        );
    };
    Ok(flags.with_ids(*member_id, cluster.cluster_id, &cluster.members))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(name: &str, cluster: &str) -> Identity {
        Identity::derive(name, Some(cluster), "http://127.0.0.1:2380", "tok").unwrap()
    }

    #[test]
    fn the_file_reads_back_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let ids = MemberIds::of(&flags("a", "a=http://h:1,b=http://h:2"));
        write(&dir.path().join("new"), &ids).unwrap();
        assert_eq!(read(&dir.path().join("new")).unwrap(), Some(ids));
        std::fs::write(dir.path().join(FILE), "member-id=zz\n").unwrap();
        assert!(read(dir.path()).is_err(), "a damaged file is an error");
    }

    #[test]
    fn a_joiner_takes_the_clusters_ids_when_its_flags_match() {
        let joiner = flags("c", "a=http://h:1,b=http://h:2,c=http://h:3");
        let cluster = leasehold_peer::ClusterMembers {
            cluster_id: 0xc1,
            members: vec![
                (0xa, "http://h:1".into()),
                (0xb, "http://h:2".into()),
                (0xc0ffee, "http://h:3".into()),
            ],
        };
        let joined = matched(joiner, &cluster).unwrap();
        assert_eq!((joined.member_id, joined.cluster_id), (0xc0ffee, 0xc1));
        assert_eq!(joined.peers.len(), 2);
        assert_eq!(joined.names[&0xb], "b");
        assert_eq!(joined.names[&0xc0ffee], "c");

        let too_few = flags("c", "a=http://h:1,c=http://h:3");
        let why = matched(too_few, &cluster).unwrap_err().to_string();
        assert!(why.contains("member count is unequal"), "{why}");
        let elsewhere = flags("c", "a=http://h:1,b=http://h:2,c=http://h:9");
        let why = matched(elsewhere, &cluster).unwrap_err().to_string();
        assert!(why.contains("unmatched member"), "{why}");
    }

    #[tokio::test]
    async fn a_data_dir_keeps_the_ids_it_was_made_with() {
        let parse = crate::config::tests::parse;
        let network = leasehold_peer::PeerNetwork::new();
        let config = parse(&["--initial-cluster-token", "t"]);
        let other_flags = parse(&["--initial-cluster-token", "u"]);

        // A new data dir: etcd's IDs, kept whatever the flags say later.
        let dir = tempfile::tempdir().unwrap();
        let made = resolve(&config, dir.path(), false, &network).await.unwrap();
        assert_eq!(made, config.identity().unwrap());
        let again = resolve(&other_flags, dir.path(), true, &network)
            .await
            .unwrap();
        assert_eq!(
            (again.member_id, again.cluster_id),
            (made.member_id, made.cluster_id)
        );
        assert_eq!(again.names[&made.member_id], "default");

        // An earlier build's data dir (a database, no member-ids): that build's IDs.
        let old = tempfile::tempdir().unwrap();
        let legacy = resolve(&config, old.path(), true, &network).await.unwrap();
        let want = config.identity_with(Ids::Legacy).unwrap();
        assert_eq!(
            (legacy.member_id, legacy.cluster_id),
            (want.member_id, want.cluster_id)
        );
        assert_ne!(legacy.member_id, made.member_id);
        assert_eq!(
            read(old.path()).unwrap().map(|ids| ids.member_id),
            Some(want.member_id)
        );
    }
}
