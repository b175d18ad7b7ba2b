//! etcd's server flags (3.5's, and 3.6's and 3.7's new names) that leasehold accepts but that
//! do nothing here: one table, from
//! which the command-line arguments (and so their `ETCD_*` variables and config file keys, see
//! `sources.rs`) are made. A flag given from this table gets one warning line at start-up.
//!
//! A few of these would change what the member *is* if etcd honoured them (join through
//! discovery, run as a proxy, rewrite the membership): for those the table names the only value
//! that can be ignored safely, and any other value is refused rather than ignored.

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};

use crate::values::{parse_duration, parse_go_bool};

/// The `--help` heading of these flags; `sources.rs` also recognises them by it.
pub(crate) const HEADING: &str = "etcd flags accepted without effect";

/// How a flag's value is written, so that a malformed value is refused as etcd refuses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Go's bool flag: `--x`, `--x=true`, `--x=false` (never `--x false`).
    Bool,
    Uint,
    Int,
    /// Go's `time.ParseDuration`.
    Duration,
    Str,
    /// Flags etcd itself has ignored since v2 (`pkg/flags.IgnoredFlag`): no value needed, any
    /// value taken.
    Legacy,
    /// `--v2-deprecation`: one of etcd 3.7's stages, or etcd's refusal.
    V2Stage,
}

#[derive(Clone, Copy)]
struct Inert {
    name: &'static str,
    kind: Kind,
    /// Why it has no effect here (shown in `--help` and docs/compat.md).
    why: &'static str,
    /// The only value that may be ignored; any other is refused (see the module header).
    only: Option<&'static str>,
}

const fn inert(name: &'static str, kind: Kind, why: &'static str) -> Inert {
    Inert {
        name,
        kind,
        why,
        only: None,
    }
}

const fn only(name: &'static str, kind: Kind, value: &'static str, why: &'static str) -> Inert {
    Inert {
        name,
        kind,
        why,
        only: Some(value),
    }
}

const STORAGE: &str = "the state is one redb file, committed on leasehold's own schedule";
const NO_V2: &str = "leasehold serves only the v3 API";
const NO_PROXY: &str = "leasehold has no v2 proxy mode";
const NO_DISCOVERY: &str = "discovery is not supported: bootstrap with --initial-cluster";
const NO_TRACING: &str = "OpenTelemetry tracing is not implemented";
const LEGACY: &str = "ignored by etcd too since v3";

use Kind::{Bool, Duration, Int, Legacy, Str, Uint, V2Stage};

/// Every etcd 3.5 server flag that leasehold does not implement (from etcd's
/// `server/etcdmain/config.go`), in etcd's order.
const TABLE: &[Inert] = &[
    inert("wal-dir", Str, "the Raft log is in the data dir's wal/"),
    inert(
        "max-snapshots",
        Uint,
        "no snapshot files are kept: a follower's is written from the database file when it needs one, and replaced by the next",
    ),
    inert(
        "max-wals",
        Uint,
        "write-ahead log segments go once a checkpoint covers them",
    ),
    inert(
        "initial-election-tick-advance",
        Bool,
        "the first election waits a whole randomized election timeout",
    ),
    inert("backend-bbolt-freelist-type", Str, STORAGE),
    inert("backend-batch-interval", Duration, STORAGE),
    inert("backend-batch-limit", Int, STORAGE),
    inert(
        "grpc-keepalive-min-time",
        Duration,
        "hyper's HTTP/2 server has no policy on how often clients may ping",
    ),
    inert(
        "socket-reuse-port",
        Bool,
        "listeners are bound without SO_REUSEPORT",
    ),
    inert(
        "socket-reuse-address",
        Bool,
        "listeners are bound with the platform's default",
    ),
    inert(
        "max-concurrent-streams",
        Uint,
        "not implemented yet: hyper's default applies",
    ),
    inert(
        "raft-read-timeout",
        Duration,
        "the peer transport is gRPC, timed by --election-timeout",
    ),
    inert(
        "raft-write-timeout",
        Duration,
        "the peer transport is gRPC, timed by --election-timeout",
    ),
    only("discovery", Str, "", NO_DISCOVERY),
    inert("discovery-fallback", Str, NO_DISCOVERY),
    inert("discovery-proxy", Str, NO_DISCOVERY),
    only("discovery-srv", Str, "", NO_DISCOVERY),
    inert("discovery-srv-name", Str, NO_DISCOVERY),
    inert("pre-vote", Bool, "PreVote is always on"),
    inert("enable-v2", Bool, NO_V2),
    inert("experimental-enable-v2v3", Str, NO_V2),
    inert("v2-deprecation", V2Stage, NO_V2),
    only("proxy", Str, "off", NO_PROXY),
    inert("proxy-failure-wait", Uint, NO_PROXY),
    inert("proxy-refresh-interval", Uint, NO_PROXY),
    inert("proxy-dial-timeout", Uint, NO_PROXY),
    inert("proxy-write-timeout", Uint, NO_PROXY),
    inert("proxy-read-timeout", Uint, NO_PROXY),
    inert("cors", Str, "there is no HTTP JSON gateway"),
    inert("host-whitelist", Str, "there is no HTTP JSON gateway"),
    inert(
        "enable-log-rotation",
        Bool,
        "logs are not rotated: use logrotate or the journal",
    ),
    inert(
        "log-rotation-config-json",
        Str,
        "logs are not rotated: use logrotate or the journal",
    ),
    inert("enable-pprof", Bool, "there are no Go profiles"),
    inert("experimental-enable-distributed-tracing", Bool, NO_TRACING),
    inert("experimental-distributed-tracing-address", Str, NO_TRACING),
    inert(
        "experimental-distributed-tracing-service-name",
        Str,
        NO_TRACING,
    ),
    inert(
        "experimental-distributed-tracing-instance-id",
        Str,
        NO_TRACING,
    ),
    inert(
        "experimental-distributed-tracing-sampling-rate",
        Int,
        NO_TRACING,
    ),
    inert(
        "experimental-enable-lease-checkpoint",
        Bool,
        "leases always keep their remaining TTL across leader changes",
    ),
    inert(
        "experimental-enable-lease-checkpoint-persist",
        Bool,
        "leases always keep their remaining TTL across restarts",
    ),
    inert(
        "experimental-downgrade-check-time",
        Duration,
        "there are no downgrades",
    ),
    inert(
        "experimental-warning-apply-duration",
        Duration,
        "slow applies are not reported",
    ),
    inert("experimental-memory-mlock", Bool, STORAGE),
    inert(
        "experimental-txn-mode-write-with-shared-buffer",
        Bool,
        STORAGE,
    ),
    inert(
        "experimental-stop-grpc-service-on-defrag",
        Bool,
        "gRPC serves on through a defragment (writes wait for it)",
    ),
    inert(
        "experimental-snapshot-catchup-entries",
        Uint,
        "a follower further behind than min(--snapshot-count, 5000) entries, or 4 MiB of entries every follower held (with --snapshot-count at most 10,000), gets a snapshot; of the entries kept only the newest 1 MiB of data is held in memory, the rest read from the write-ahead log when a follower needs it",
    ),
    inert("unsafe-no-fsync", Bool, "leasehold always fsyncs"),
    // etcd's `ignored` list.
    inert("cluster-active-size", Legacy, LEGACY),
    inert("cluster-remove-delay", Legacy, LEGACY),
    inert("cluster-sync-interval", Legacy, LEGACY),
    inert("config", Legacy, LEGACY),
    inert("force", Legacy, LEGACY),
    inert("max-result-buffer", Legacy, LEGACY),
    inert("max-retry-attempts", Legacy, LEGACY),
    inert("peer-heartbeat-interval", Legacy, LEGACY),
    inert("peer-election-timeout", Legacy, LEGACY),
    inert("retry-interval", Legacy, LEGACY),
    inert("snapshot", Legacy, LEGACY),
    inert("v", Legacy, LEGACY),
    inert("vv", Legacy, LEGACY),
    // etcd 3.6's and 3.7's new flags (`server/embed/config.go`); its new names for the
    // `experimental-` flags above are in RENAMED. `--watch-progress-notify-interval`,
    // `--corrupt-check-time` and `--feature-gates` are implemented (`config.rs`).
    inert(
        "peer-skip-client-san-verification",
        Bool,
        "peer client certificates' SANs are always checked",
    ),
    inert("max-learners", Int, "learners are not limited in number"),
    only("discovery-endpoints", Str, "", NO_DISCOVERY),
    inert("discovery-token", Str, NO_DISCOVERY),
    inert("discovery-dial-timeout", Duration, NO_DISCOVERY),
    inert("discovery-request-timeout", Duration, NO_DISCOVERY),
    inert("discovery-keepalive-time", Duration, NO_DISCOVERY),
    inert("discovery-keepalive-timeout", Duration, NO_DISCOVERY),
    inert("discovery-insecure-transport", Bool, NO_DISCOVERY),
    inert("discovery-insecure-skip-tls-verify", Bool, NO_DISCOVERY),
    inert("discovery-cert", Str, NO_DISCOVERY),
    inert("discovery-key", Str, NO_DISCOVERY),
    inert("discovery-cacert", Str, NO_DISCOVERY),
    inert("discovery-user", Str, NO_DISCOVERY),
    inert("discovery-password", Str, NO_DISCOVERY),
];

/// etcd 3.6's names for `experimental-` flags of [`TABLE`] (etcd 3.7 takes only these): new,
/// old. Each is the old one's entry under its new name.
const RENAMED: &[(&str, &str)] = &[
    (
        "enable-distributed-tracing",
        "experimental-enable-distributed-tracing",
    ),
    (
        "distributed-tracing-address",
        "experimental-distributed-tracing-address",
    ),
    (
        "distributed-tracing-service-name",
        "experimental-distributed-tracing-service-name",
    ),
    (
        "distributed-tracing-instance-id",
        "experimental-distributed-tracing-instance-id",
    ),
    (
        "distributed-tracing-sampling-rate",
        "experimental-distributed-tracing-sampling-rate",
    ),
    ("downgrade-check-time", "experimental-downgrade-check-time"),
    (
        "warning-apply-duration",
        "experimental-warning-apply-duration",
    ),
    ("memory-mlock", "experimental-memory-mlock"),
    (
        "snapshot-catchup-entries",
        "experimental-snapshot-catchup-entries",
    ),
];

/// Every flag without effect: [`TABLE`], then [`RENAMED`]'s new names.
fn entries() -> impl Iterator<Item = Inert> {
    let renamed = RENAMED.iter().map(|&(new, old)| Inert {
        name: new,
        ..*TABLE
            .iter()
            .find(|e| e.name == old)
            .expect("RENAMED names an entry of TABLE")
    });
    TABLE.iter().copied().chain(renamed)
}

/// The flags of [`TABLE`] that were given, with their values (clap `Args`, flattened into
/// `NodeConfig`).
#[derive(Debug, Clone, Default)]
pub struct InertFlags {
    given: Vec<(&'static str, String)>,
}

impl InertFlags {
    /// The value `--name` was given, as given.
    pub(crate) fn given(&self, name: &str) -> Option<&str> {
        self.given
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Refuses a value that cannot be ignored safely (see the module header).
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        for (name, value) in &self.given {
            let entry = entries().find(|e| e.name == *name).expect("from entries()");
            let Some(allowed) = entry.only else { continue };
            let same = match entry.kind {
                Bool => parse_go_bool(value) == parse_go_bool(allowed),
                _ => value == allowed,
            };
            if !same {
                anyhow::bail!(
                    "--{name}={value} is not supported by leasehold: {}",
                    entry.why
                );
            }
        }
        Ok(())
    }
}

fn arg(entry: &Inert) -> Arg {
    let arg = Arg::new(entry.name)
        .long(entry.name)
        .help(format!("No effect: {}.", entry.why))
        .help_heading(HEADING)
        .action(ArgAction::Set);
    match entry.kind {
        Bool => arg
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value("true")
            .value_parser(parse_go_bool),
        Legacy => arg
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value(""),
        Uint => arg.value_parser(clap::value_parser!(u64)),
        Int => arg.value_parser(clap::value_parser!(i64)),
        Duration => arg.value_parser(parse_duration),
        Str => arg,
        V2Stage => arg.value_parser(parse_v2_stage),
    }
}

/// etcd 3.7's v2 deprecation stages; another is refused in the words of Go's flag package, as
/// etcd refuses it (`not-yet`, 3.5's default, among them).
fn parse_v2_stage(value: &str) -> Result<String, String> {
    match value {
        "write-only" | "write-only-drop-data" | "gone" => Ok(value.to_owned()),
        _ => Err(format!(
            "invalid value {value:?} for flag -v2-deprecation: invalid value {value:?}"
        )),
    }
}

impl Args for InertFlags {
    fn augment_args(cmd: Command) -> Command {
        entries().fold(cmd, |cmd, entry| cmd.arg(arg(&entry)))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for InertFlags {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = InertFlags::default();
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        for entry in entries() {
            // The typed value is only checked (by the value parser); what is kept is the text
            // as given, for the warning and the refusal.
            let Some(mut raw) = matches.get_raw(entry.name) else {
                continue;
            };
            let value = raw
                .next_back()
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_default();
            self.given.retain(|(name, _)| *name != entry.name);
            self.given.push((entry.name, value));
        }
        Ok(())
    }
}

/// The table as Markdown rows (`| --flag | why |`), for docs/compat.md; a test keeps the doc in
/// step with the table.
#[cfg(test)]
pub(crate) fn markdown_rows() -> Vec<String> {
    entries()
        .map(|e| match e.only {
            Some("") => format!("| `--{}` | {} (refused unless empty) |", e.name, e.why),
            Some(v) => format!("| `--{}` | {} (refused unless `{v}`) |", e.name, e.why),
            None => format!("| `--{}` | {} |", e.name, e.why),
        })
        .collect()
}
