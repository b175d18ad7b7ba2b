//! The `leasehold` binary: with no subcommand it serves (etcd's flags, etcd's meaning); `bench`
//! drives any etcd-compatible endpoint; `cluster` starts a local multi-member cluster. Wiring only: the behaviour lives in the library crates.

mod bench;
mod cluster;
mod serve;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "leasehold",
    version,
    about = "An etcd-v3-compatible, lease-centred coordination store"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: serve::ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Benchmark an etcd-compatible endpoint (leasehold or etcd) through the public API.
    Bench(bench::BenchArgs),
    /// Start a local multi-member cluster on loopback (members on ports 2379, 12379, 22379, …).
    Cluster(cluster::ClusterArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn")),
        )
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        None => runtime.block_on(serve::run(cli.serve)),
        Some(Command::Bench(args)) => runtime.block_on(bench::run(args)),
        Some(Command::Cluster(args)) => runtime.block_on(cluster::run(args)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_arguments_means_serve_with_defaults() {
        let cli = Cli::try_parse_from(["leasehold"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.listen_client_urls, "http://127.0.0.1:2379");
        assert_eq!(cli.serve.data_dir.to_str(), Some("./leasehold.data"));
    }

    #[test]
    fn bench_is_a_subcommand() {
        let cli = Cli::try_parse_from(["leasehold", "bench", "put", "--clients", "4"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Bench(_))));
    }
}
