//! `leasehold snapshot restore`: a new member's data dir made from a snapshot file, leasehold's
//! or etcd's (`etcdctl snapshot save` of either), with `etcdctl snapshot restore`'s flags and
//! defaults. Every member of the new cluster is restored from the same file with the same
//! `--initial-cluster` and token, then started with those flags.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use leasehold_node::{
    INITIAL_ADVERTISE_PEER_URLS_DEFAULT, INITIAL_CLUSTER_TOKEN_DEFAULT, Identity,
};

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    command: SnapshotCommand,
}

#[derive(Subcommand, Debug)]
enum SnapshotCommand {
    /// Restores a member's data dir from a snapshot file (leasehold's or etcd's).
    Restore(RestoreArgs),
}

#[derive(Args, Debug)]
struct RestoreArgs {
    /// The snapshot file (`etcdctl snapshot save` from leasehold or etcd).
    file: PathBuf,
    /// The data dir to create (etcd's default: `<name>.etcd`). It must not exist, or be empty.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// This member's name in `--initial-cluster`.
    #[arg(long, default_value = "default")]
    name: String,
    /// The new cluster: `name=peer-url,...` (default: this member alone, at
    /// `--initial-advertise-peer-urls`, as the server takes it).
    #[arg(long)]
    initial_cluster: Option<String>,
    /// The new cluster's token (with the peer URLs, it makes the member IDs).
    #[arg(long, default_value = INITIAL_CLUSTER_TOKEN_DEFAULT)]
    initial_cluster_token: String,
    /// This member's peer URLs (the server's default: a member restored and started without
    /// these flags is the same member).
    #[arg(long, default_value = INITIAL_ADVERTISE_PEER_URLS_DEFAULT)]
    initial_advertise_peer_urls: String,
    /// Restore a file without the SHA-256 etcd appends (a copy of a data dir's `db`), or
    /// whose hash does not match.
    #[arg(long)]
    skip_hash_check: bool,
}

/// Runs the command; the process's exit code (1 with etcdctl's `Error: ...` on failure).
pub fn run(args: SnapshotArgs) -> i32 {
    let SnapshotCommand::Restore(args) = args.command;
    match restore(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {e:#}");
            1
        }
    }
}

impl RestoreArgs {
    /// The member the data dir is made for, derived as the server derives its own.
    fn identity(&self) -> anyhow::Result<Identity> {
        Identity::derive(
            &self.name,
            self.initial_cluster.as_deref(),
            &self.initial_advertise_peer_urls,
            &self.initial_cluster_token,
        )
    }
}

fn restore(args: &RestoreArgs) -> anyhow::Result<()> {
    let identity = args.identity()?;
    let mut members = identity.peers.clone();
    members.insert(identity.member_id, identity.peer_urls[0].clone());
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.etcd", args.name)));
    let restored =
        leasehold_snapshot::restore(&args.file, &data_dir, &members, args.skip_hash_check)?;
    leasehold_node::write_member_ids(&data_dir, &identity)?;
    eprintln!(
        "restored snapshot {} into {}: revision {}, {} versions, {} leases, member {:x} of {}",
        args.file.display(),
        data_dir.display(),
        restored.current_revision,
        restored.records,
        restored.leases,
        identity.member_id,
        members.len(),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use leasehold_node::NodeConfig;

    use super::*;

    #[derive(Parser)]
    struct Restore {
        #[command(flatten)]
        args: RestoreArgs,
    }

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        config: NodeConfig,
    }

    /// `leasehold snapshot restore FILE --data-dir D`, then `leasehold --data-dir D`: the data
    /// dir must be made for the member that starts, or it never leads.
    #[test]
    fn a_member_restored_and_started_with_defaults_is_the_same_member() {
        let restored = Restore::parse_from(["restore", "f"])
            .args
            .identity()
            .expect("identity");
        let served = Serve::parse_from(["leasehold"])
            .config
            .identity()
            .expect("identity");
        assert_eq!(restored, served);
        let named = Restore::parse_from(["restore", "f", "--name", "n1"])
            .args
            .identity();
        let served_named = Serve::parse_from(["leasehold", "--name", "n1"])
            .config
            .identity();
        assert_eq!(named.expect("identity"), served_named.expect("identity"));
    }
}
