//! `leasehold snapshot restore`: a new member's data dir made from a snapshot file, leasehold's
//! or etcd's (`etcdctl snapshot save` of either), with `etcdctl snapshot restore`'s flags and
//! defaults. Every member of the new cluster is restored from the same file with the same
//! `--initial-cluster` and token, then started with those flags.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use leasehold_node::Identity;

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
    /// The new cluster: `name=peer-url,...`.
    #[arg(long, default_value = "default=http://localhost:2380")]
    initial_cluster: String,
    /// The new cluster's token (with the peer URLs, it makes the member IDs).
    #[arg(long, default_value = "etcd-cluster")]
    initial_cluster_token: String,
    /// This member's peer URLs.
    #[arg(long, default_value = "http://localhost:2380")]
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

fn restore(args: &RestoreArgs) -> anyhow::Result<()> {
    let identity = Identity::derive(
        &args.name,
        Some(&args.initial_cluster),
        &args.initial_advertise_peer_urls,
        &args.initial_cluster_token,
    )?;
    let mut members = identity.peers.clone();
    members.insert(identity.member_id, identity.peer_urls[0].clone());
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.etcd", args.name)));
    let restored =
        leasehold_snapshot::restore(&args.file, &data_dir, &members, args.skip_hash_check)?;
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
