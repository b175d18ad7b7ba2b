//! The `leasehold` binary: with no subcommand it serves (etcd's flags, etcd's meaning); `bench`
//! drives any etcd-compatible endpoint; `cluster` starts a local multi-member cluster; `put`,
//! `get`, `del`, `watch`, `lease`, `lock` and
//! `elect` are an etcd v3 client that behaves like etcdctl 3.4 (see `ctl` and docs/cli.md);
//! `snapshot restore` makes a data dir from a snapshot file.
//! Wiring only: the member is `leasehold-node`, the client commands `leasehold-ctl`, the
//! workloads `leasehold-bench`, snapshots `leasehold-snapshot`; `cluster` (a few processes of
//! this binary) and the flags of `snapshot restore` live here.

mod cluster;
mod logging;
mod snapshot;

use clap::{CommandFactory as _, Parser, Subcommand};
use leasehold_bench as bench;
use leasehold_ctl as ctl;
use leasehold_node::{Listeners, Node, NodeConfig, NoticeLevel};

/// mimalloc instead of glibc's malloc: allocation was about a sixth of the server's CPU under
/// many small requests (docs/bench.md, "Allocator"). Runtime workers give freed memory back to
/// the OS when they park after a compaction (`leasehold_alloc::on_park`).
#[global_allocator]
static ALLOCATOR: leasehold_alloc::Allocator = leasehold_alloc::Allocator;

/// Serving takes etcd's server flags, which may also come from `ETCD_*` variables or
/// `--config-file` (see `leasehold_node::NodeConfig::from_sources`); as in Go, a flag given
/// twice takes its last value.
#[derive(Parser, Debug)]
#[command(
    name = "leasehold",
    about = "An etcd-v3-compatible, lease-centred coordination store",
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: NodeConfig,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Benchmark an etcd-compatible endpoint (leasehold or etcd) through the public API.
    Bench(bench::BenchArgs),
    /// Start a local multi-member cluster on loopback (members on ports 2379, 12379, 22379, …).
    Cluster(cluster::ClusterArgs),
    /// Puts the given key into the store (like `etcdctl put`).
    #[command(args_override_self = true)]
    Put(ctl::kv::PutArgs),
    /// Gets the key or a range of keys (like `etcdctl get`).
    #[command(args_override_self = true)]
    Get(ctl::kv::GetArgs),
    /// Removes the specified key or range of keys [key, range_end) (like `etcdctl del`).
    #[command(args_override_self = true)]
    Del(ctl::kv::DelArgs),
    /// Watches events stream on keys or prefixes (like `etcdctl watch`).
    #[command(args_override_self = true)]
    Watch(ctl::watch::WatchArgs),
    /// Lease related commands (like `etcdctl lease`).
    #[command(args_override_self = true)]
    Lease(ctl::lease::LeaseArgs),
    /// Acquires a named lock (like `etcdctl lock`, through the v3lock service).
    #[command(args_override_self = true)]
    Lock(ctl::lock::LockArgs),
    /// Observes and participates in leader election (like `etcdctl elect`, through the
    /// v3election service).
    #[command(args_override_self = true)]
    Elect(ctl::elect::ElectArgs),
    /// Role commands: `role grant-permission`, with leasehold's `--lease` (grants that live
    /// with a lease).
    #[command(args_override_self = true)]
    Role(ctl::role::RoleArgs),
    /// Snapshot commands: `snapshot restore` makes a member's data dir from a snapshot file,
    /// leasehold's or etcd's (like `etcdctl snapshot restore`).
    Snapshot(snapshot::SnapshotArgs),
}

fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let argv = ctl::hoist_global_flags(argv);
    let is_client = argv
        .get(1)
        .is_some_and(|first| ctl::COMMANDS.contains(&first.as_str()));
    let argv = go_style_serve_flags(argv);
    if !is_client
        && argv[1..]
            .iter()
            .any(|a| a == "--version" || a == "--version=true")
    {
        print_version();
        return Ok(());
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) if is_client => std::process::exit(client_parse_error(&e, &argv)),
        Err(e) => e.exit(),
    };
    let server_side = match cli.command {
        None => None,
        Some(Command::Bench(args)) => Some(Command::Bench(args)),
        Some(Command::Cluster(args)) => Some(Command::Cluster(args)),
        Some(Command::Snapshot(args)) => std::process::exit(snapshot::run(args)),
        Some(client) => std::process::exit(run_client(client)),
    };
    let config = match server_side {
        None => {
            // The command line again, now with the environment, or the config file instead.
            let env: Vec<(String, String)> = std::env::vars_os()
                .map(|(k, v)| {
                    (
                        k.to_string_lossy().into_owned(),
                        v.to_string_lossy().into_owned(),
                    )
                })
                .collect();
            let resolved = match NodeConfig::from_sources(&argv[1..], &env) {
                Ok(resolved) => resolved,
                Err(e) => {
                    eprintln!("leasehold: {e:#}");
                    std::process::exit(1);
                }
            };
            let targets = resolved.config.log_targets()?;
            logging::init(
                Some(resolved.config.log_level),
                resolved.config.log_format,
                &targets,
            )?;
            for notice in &resolved.notices {
                match notice.level {
                    NoticeLevel::Info => tracing::info!("{}", notice.message),
                    NoticeLevel::Warn => tracing::warn!("{}", notice.message),
                }
            }
            Some(resolved.config)
        }
        Some(_) => {
            // The commands without server flags (`bench`, `cluster`, the client commands)
            // write for people.
            logging::init(
                None,
                leasehold_node::LogFormat::Console,
                &[leasehold_node::LogTarget::Stderr],
            )?;
            None
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(|| {
            leasehold_alloc::on_park();
        })
        .build()?;
    match server_side {
        None => runtime.block_on(serve(config.expect("resolved above"))),
        Some(Command::Bench(args)) => runtime.block_on(bench::run(args)),
        Some(Command::Cluster(args)) => runtime.block_on(cluster::run(args)),
        Some(_) => unreachable!("client commands ran above"),
    }
}

/// `leasehold` with no subcommand: one member until SIGINT or SIGTERM, or until storage fails
/// (then a non-zero exit, so that a supervisor restarts it).
async fn serve(config: NodeConfig) -> anyhow::Result<()> {
    // Signal handlers first, so a signal at any point (start-up included: log replay, waiting
    // to lead) stops the member; a member that could not be stopped cleanly must not start.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let (signalled, mut stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            r = tokio::signal::ctrl_c() => {
                if let Err(e) = r {
                    tracing::error!("waiting for SIGINT: {e}; stopping");
                }
            }
            _ = term.recv() => {}
        }
        signalled.send_replace(true);
    });
    let listeners = Listeners::bind(&config).await?;
    let mut on_signal = stop.clone();
    let shutdown = async move {
        let _ = on_signal.wait_for(|s| *s).await;
    };
    let node = tokio::select! {
        node = Node::start(config, listeners, shutdown) => node?,
        _ = stop.wait_for(|s| *s) => {
            tracing::info!("stopped while starting");
            return Ok(());
        }
    };
    // Once the member has stopped cleanly and its file is closed (every write in it), the
    // process exits holding the state, so the kernel takes the memory back at once rather than
    // it being freed one allocation at a time. A file still open (a storage task that outlived
    // the bounded wait) is left to the ordinary return, which waits for such tasks.
    let replica = node.replica().clone();
    node.wait().await?;
    if replica.storage_closed() {
        std::process::exit(0);
    }
    Ok(())
}

/// Runs a client command and returns the process's exit code. Client commands log nothing
/// unless `LEASEHOLD_LOG` asks for it, so their output is exactly etcdctl's.
fn run_client(command: Command) -> i32 {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env(logging::FILTER_VAR) {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(filter)
            .init();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return ctl::report(&ctl::CtlError::new(ctl::EXIT_ERROR, e.to_string())),
    };
    let result = runtime.block_on(async move {
        match command {
            Command::Put(a) => ctl::kv::put(a).await,
            Command::Get(a) => ctl::kv::get(a).await,
            Command::Del(a) => ctl::kv::del(a).await,
            Command::Watch(a) => ctl::watch::run(a).await,
            Command::Lease(a) => ctl::lease::run(a).await,
            Command::Lock(a) => ctl::lock::run(a).await,
            Command::Elect(a) => ctl::elect::run(a).await,
            Command::Role(a) => ctl::role::run(a).await,
            Command::Bench(_) | Command::Cluster(_) | Command::Snapshot(_) => {
                unreachable!("bench, cluster and snapshot are not client commands")
            }
        }
    });
    // Leave background tasks (keep-alives) behind without waiting for them.
    runtime.shutdown_background();
    match result {
        Ok(()) => ctl::EXIT_SUCCESS,
        // An empty message means the command already reported (etcdctl's `watch -- cmd`).
        Err(e) if e.message.is_empty() => e.code,
        Err(e) => ctl::report(&e),
    }
}

/// etcd's server flags may be written Go's way, `-name`: when serving (no subcommand), such
/// flags become `--name`.
/// `--version` as etcd prints it (tools and etcd's e2e framework parse the first line for the
/// etcd release the server follows), then leasehold's own version.
fn print_version() {
    println!("etcd Version: {}", leasehold_node::ETCD_API_VERSION);
    println!("Git SHA: Not provided (leasehold)");
    println!("Go Version: none (leasehold is written in Rust)");
    println!(
        "Go OS/Arch: {}/{}",
        std::env::consts::OS,
        go_arch(std::env::consts::ARCH)
    );
    println!("leasehold Version: {}", env!("CARGO_PKG_VERSION"));
}

/// Go's name for a CPU architecture (GOARCH), as etcd prints it.
fn go_arch(rust: &str) -> &str {
    match rust {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

fn go_style_serve_flags(argv: Vec<String>) -> Vec<String> {
    let subcommand = argv.get(1).is_some_and(|first| {
        Cli::command()
            .get_subcommands()
            .any(|sub| sub.get_name() == first)
    });
    match (subcommand, argv.split_first()) {
        (false, Some((program, args))) => std::iter::once(program.clone())
            .chain(leasehold_node::normalize_args(args.to_vec()))
            .collect(),
        _ => argv,
    }
}

/// A client command's bad flags, reported like etcdctl (cobra/pflag wording, exit 1).
fn client_parse_error(e: &clap::Error, argv: &[String]) -> i32 {
    match ctl::classify_parse_error(e, argv) {
        ctl::ParseFailure::Clap => e.exit(),
        ctl::ParseFailure::Help => {
            // etcdctl prints a command group's help, and exits 0, when no (known) subcommand
            // follows: `etcdctl lease`, `etcdctl lease bogus`.
            let mut cli = Cli::command();
            cli.build();
            let group = argv.get(1).map(String::as_str).unwrap_or_default();
            if let Some(sub) = cli.find_subcommand_mut(group) {
                let _ = sub.print_help();
            }
            ctl::EXIT_SUCCESS
        }
        ctl::ParseFailure::Flag(message) => ctl::report_flag_error(&message),
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
        assert_eq!(cli.serve.data_dir().to_str(), Some("default.etcd"));
    }

    #[test]
    fn bench_is_a_subcommand() {
        let cli = Cli::try_parse_from(["leasehold", "bench", "put", "--clients", "4"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Bench(_))));
    }

    #[test]
    fn global_flags_before_the_command_word_are_taken_like_etcdctl() {
        let hoisted = ctl::hoist_global_flags(argv(&[
            "--endpoints",
            "127.0.0.1:1",
            "-w=json",
            "--hex",
            "get",
            "k",
        ]));
        assert_eq!(
            hoisted,
            argv(&["get", "--endpoints", "127.0.0.1:1", "-w=json", "--hex", "k"])
        );
        let cli = Cli::try_parse_from(&hoisted).unwrap();
        assert!(matches!(cli.command, Some(Command::Get(_))));
        // Server flags are left alone, even with a value that is a command word.
        let serve = argv(&["--name", "get"]);
        assert_eq!(ctl::hoist_global_flags(serve.clone()), serve);
        let cli = Cli::try_parse_from(&serve).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.name, "get");
    }

    #[test]
    fn serving_takes_go_style_flags_and_the_last_of_a_repeated_flag() {
        let serve = go_style_serve_flags(argv(&["-name", "a", "--name", "b", "-data-dir=/d"]));
        let cli = Cli::try_parse_from(&serve).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.name, "b");
        assert_eq!(cli.serve.data_dir().to_str(), Some("/d"));
        // Subcommands keep their own flags as they are.
        let get = argv(&["get", "k", "-w", "json"]);
        assert_eq!(go_style_serve_flags(get.clone()), get);
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    fn argv(args: &[&str]) -> Vec<String> {
        std::iter::once("leasehold")
            .chain(args.iter().copied())
            .map(String::from)
            .collect()
    }

    /// The etcdctl-style message for a command line clap refuses.
    fn flag_error(args: &[&str]) -> ctl::ParseFailure {
        let argv = argv(args);
        let err = Cli::try_parse_from(&argv).expect_err("should be refused");
        ctl::classify_parse_error(&err, &argv)
    }

    #[test]
    fn client_commands_take_etcdctl_flags_anywhere() {
        let cli = Cli::try_parse_from(argv(&[
            "get",
            "foo",
            "--prefix",
            "-w",
            "json",
            "--endpoints=http://a:1,b:2",
            "--rev=0x10",
            "--keys-only=false",
        ]))
        .unwrap();
        let Some(Command::Get(get)) = cli.command else {
            panic!("not get: {:?}", cli.command);
        };
        assert_eq!(get.args, vec!["foo"]);
        assert!(get.prefix && !get.keys_only);
        assert_eq!(get.rev, 16);
        assert_eq!(get.global.write_out, "json");
        assert_eq!(
            get.global.endpoint_urls().unwrap(),
            vec!["http://a:1", "http://b:2"]
        );
        assert_eq!(
            get.global.command_timeout,
            std::time::Duration::from_secs(5)
        );
        assert_eq!(get.global.dial_timeout, std::time::Duration::from_secs(2));

        // Global flags before or after the lease subcommand; the last one wins, as in pflag.
        for args in [
            &["lease", "-w", "json", "grant", "10"][..],
            &["lease", "grant", "10", "-w", "simple", "-w", "json"][..],
        ] {
            let cli = Cli::try_parse_from(argv(args)).unwrap();
            let Some(Command::Lease(lease)) = cli.command else {
                panic!("not lease: {args:?}");
            };
            assert_eq!(lease.global.write_out, "json", "{args:?}");
        }
    }

    #[test]
    fn put_value_after_double_dash_may_start_with_a_dash() {
        let cli = Cli::try_parse_from(argv(&["put", "k", "--lease=abc", "--", "-v"])).unwrap();
        let Some(Command::Put(put)) = cli.command else {
            panic!("not put");
        };
        let request = ctl::kv::put_request(&put, std::io::empty()).unwrap();
        assert_eq!(
            (request.key, request.value),
            (b"k".to_vec(), b"-v".to_vec())
        );
        assert_eq!(request.lease, 0xabc);
    }

    #[test]
    fn bad_client_flags_are_etcdctl_errors_not_panics() {
        use ctl::ParseFailure::{Flag, Help};
        let cases: &[(&[&str], ctl::ParseFailure)] = &[
            (&["get", "a", "--bogus"], Flag("unknown flag: --bogus".into())),
            (&["get", "a", "--bogus=1"], Flag("unknown flag: --bogus".into())),
            (
                &["get", "a", "-xy"],
                Flag("unknown shorthand flag: 'x' in -xy".into()),
            ),
            (
                &["lease", "grant", "-5"],
                Flag("unknown shorthand flag: '5' in -5".into()),
            ),
            (&["get", "a", "--rev"], Flag("flag needs an argument: --rev".into())),
            (
                &["get", "a", "-w"],
                Flag("flag needs an argument: 'w' in -w".into()),
            ),
            (
                &["get", "a", "--rev=x"],
                Flag(
                    "invalid argument \"x\" for \"--rev\" flag: strconv.ParseInt: parsing \"x\": invalid syntax"
                        .into(),
                ),
            ),
            (
                &["del", "a", "--prefix=maybe"],
                Flag(
                    "invalid argument \"maybe\" for \"--prefix\" flag: strconv.ParseBool: parsing \"maybe\": invalid syntax"
                        .into(),
                ),
            ),
            (
                &["watch", "a", "--command-timeout=1"],
                Flag(
                    "invalid argument \"1\" for \"--command-timeout\" flag: time: missing unit in duration \"1\""
                        .into(),
                ),
            ),
            (
                &["lock", "l", "--ttl=ten"],
                Flag(
                    "invalid argument \"ten\" for \"--ttl\" flag: strconv.ParseInt: parsing \"ten\": invalid syntax"
                        .into(),
                ),
            ),
            (&["lease"], Help),
            (&["lease", "bogus"], Help),
        ];
        for (args, expected) in cases {
            assert_eq!(&flag_error(args), expected, "{args:?}");
        }
    }

    #[test]
    fn bad_client_arguments_are_refused_with_etcdctl_codes() {
        let parse = |args: &[&str]| Cli::try_parse_from(argv(args)).unwrap().command.unwrap();
        let Command::Put(put) = parse(&["put", "k", "v", "--lease=0x10"]) else {
            panic!()
        };
        let err = ctl::kv::put_request(&put, std::io::empty()).unwrap_err();
        assert_eq!(
            (err.code, err.message.as_str()),
            (
                128,
                "bad lease ID (strconv.ParseInt: parsing \"0x10\": invalid syntax), expecting ID in Hex"
            )
        );
        let Command::Put(put) = parse(&["put", "k"]) else {
            panic!()
        };
        assert_eq!(
            ctl::kv::put_request(&put, std::io::empty())
                .unwrap_err()
                .code,
            128
        );
        let request = ctl::kv::put_request(&put, &b"from stdin"[..]).unwrap();
        assert_eq!(request.value, b"from stdin");

        let Command::Get(get) = parse(&["get", "a", "--sort-by=value", "--order=descend"]) else {
            panic!()
        };
        let request = ctl::kv::get_request(&get).unwrap();
        // etcd enums: SortTarget VALUE = 4, SortOrder DESCEND = 2.
        assert_eq!((request.sort_target, request.sort_order), (4, 2));
        let Command::Get(get) = parse(&["get", "a", "--sort-by=key", "--order=ascend"]) else {
            panic!()
        };
        // clientv3 sends ascending-by-key as no sort at all.
        assert_eq!(ctl::kv::get_request(&get).unwrap().sort_order, 0);
        let Command::Get(get) = parse(&["get", "", "--prefix"]) else {
            panic!()
        };
        let request = ctl::kv::get_request(&get).unwrap();
        assert_eq!((request.key, request.range_end), (vec![0], vec![0]));
        let Command::Get(get) = parse(&["get", "ab", "--from-key", "--consistency=s"]) else {
            panic!()
        };
        let request = ctl::kv::get_request(&get).unwrap();
        assert_eq!((request.range_end, request.serializable), (vec![0], true));
        let Command::Get(get) = parse(&["get", "a", "--order=up"]) else {
            panic!()
        };
        let err = ctl::kv::get_request(&get).unwrap_err();
        assert_eq!((err.code, err.message.as_str()), (4, "bad sort order up"));

        let Command::Del(del) = parse(&["del", "ab", "--prefix", "--prev-kv"]) else {
            panic!()
        };
        let request = ctl::kv::del_request(&del).unwrap();
        assert_eq!((request.range_end, request.prev_kv), (b"ac".to_vec(), true));
        let Command::Del(del) = parse(&["del", "a", "b", "c"]) else {
            panic!()
        };
        assert_eq!(ctl::kv::del_request(&del).unwrap_err().code, 128);

        let Command::Get(get) = parse(&["get", "a", "--endpoints=https://x:1"]) else {
            panic!()
        };
        assert_eq!(get.global.printer().unwrap_err().code, 2);
        let Command::Get(get) = parse(&["get", "a", "--endpoints="]) else {
            panic!()
        };
        let err = get.global.printer().unwrap_err();
        assert_eq!(
            (err.code, err.message.as_str()),
            (2, "etcdclient: no available endpoints")
        );
        let Command::Get(get) = parse(&["get", "a", "-w", "yaml"]) else {
            panic!()
        };
        assert_eq!(get.global.printer().unwrap_err().code, 4);
    }
}
