//! Members started on restored data dirs: a snapshot file made into a data dir with the restore
//! tool of the server's own kind (`etcdctl snapshot restore`, `leasehold snapshot restore`),
//! then the member started with exactly the name, cluster and token the restore was given.

use std::path::Path;
use std::process::Output;

use crate::{Kind, Server, Setup, describe_output, etcdctl_binary, free_ports, leasehold_binary};

/// Restores `file` into `data_dir` for member `name` of `cluster` (`name=peer-url,...`) with
/// `token`, with `kind`'s tool; the tool's output.
pub fn restore_snapshot(
    kind: Kind,
    file: &Path,
    data_dir: &Path,
    name: &str,
    cluster: &str,
    token: &str,
) -> Output {
    let peer = cluster
        .split(',')
        .find_map(|m| m.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} is not in {cluster}"));
    let program = match kind {
        Kind::Etcd => etcdctl_binary(),
        Kind::Leasehold => leasehold_binary(),
    };
    std::process::Command::new(program)
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "restore"])
        .arg(file)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--name", name, "--initial-cluster", cluster])
        .args(["--initial-cluster-token", token])
        .args(["--initial-advertise-peer-urls", peer])
        .output()
        .unwrap_or_else(|e| panic!("run the restore of {kind:?}: {e}"))
}

/// One member per file, named `m0`, `m1`, ..., on fresh ports: each on a data dir restored from
/// its file by `kind`'s tool (which must succeed), started with its `args`. Spawned, not waited
/// for (a member of several waits for a quorum).
pub fn spawn_restored_members(kind: Kind, files: &[&Path], args: &[Vec<String>]) -> Vec<Server> {
    assert_eq!(files.len(), args.len(), "one set of arguments per member");
    let ports: Vec<[u16; 2]> = files.iter().map(|_| free_ports::<2>()).collect();
    let cluster = ports
        .iter()
        .enumerate()
        .map(|(i, [_, peer])| format!("m{i}=http://127.0.0.1:{peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let token = format!("restored-{}", ports[0][1]);
    files
        .iter()
        .zip(args)
        .enumerate()
        .map(|(i, (file, args))| {
            let name = format!("m{i}");
            let setup = Setup {
                args: args.clone(),
                ..Setup::default()
            };
            Server::spawn_member_on(kind, &name, ports[i], &cluster, &token, setup, |dir| {
                let out = restore_snapshot(kind, file, dir, &name, &cluster, &token);
                assert!(
                    out.status.success(),
                    "restore failed\n{}",
                    describe_output(&out)
                );
            })
        })
        .collect()
}
