//! Where a member's configuration comes from, as etcd takes it: the command line, then `ETCD_*`
//! environment variables, or else a `--config-file` alone.
//!
//! Both other sources are turned into command-line arguments of the one clap definition in
//! `config.rs` (so every flag is declared, parsed and checked once):
//!
//! ```text
//!  ETCD_INITIAL_CLUSTER_TOKEN=t          ─► --initial-cluster-token=t
//!  client-transport-security:            ─► --cert-file=/c.pem
//!    cert-file: /c.pem
//!  log-outputs: [stderr, /var/log/x]     ─► --log-outputs=stderr,/var/log/x
//!  grpc-keepalive-timeout: 20000000000   ─► --grpc-keepalive-timeout=20000000000ns
//! ```
//!
//! etcd's rules, kept here:
//! - an environment variable is `ETCD_` and the flag's name in upper case with `_` for `-`;
//! - a flag given both on the command line and in the environment is refused (etcd exits with
//!   "conflicting environment variable ... is shadowed by corresponding command-line flag");
//! - an `ETCD_*` variable that names no flag is warned about and ignored;
//! - with `--config-file` (or `ETCD_CONFIG_FILE`), every other flag and variable is ignored;
//! - a config file's keys are the flags' names, except for the TLS settings, which sit in the
//!   `client-transport-security` and `peer-transport-security` maps, the socket options in
//!   `socket-options`, and one renamed key; durations are integers of nanoseconds (Go's
//!   `time.Duration` in JSON), lists are YAML sequences, and an unknown key is ignored (etcd
//!   ignores it silently; leasehold warns).

use std::any::TypeId;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::error::{ContextKind, ContextValue};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use yaml_rust2::{Yaml, YamlLoader};

use crate::config::NodeConfig;

/// Flags etcd 3.7 warns are deprecated, with its warning.
const ETCD_DEPRECATED: [(&str, &str); 2] = [
    (
        "max-snapshots",
        "--max-snapshots is deprecated in 3.6 and will be decommissioned in 3.8.",
    ),
    (
        "v2-deprecation",
        "--v2-deprecation is deprecated and scheduled for removal in v3.8. The default value is \
         enforced, ignoring user input.",
    ),
];

/// A member's configuration, and what start-up should log about how it was read (logging is
/// set up from the configuration, so these wait until it is).
#[derive(Debug)]
pub struct Resolved {
    pub config: NodeConfig,
    pub notices: Vec<Notice>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub level: NoticeLevel,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeLevel {
    Info,
    Warn,
}

impl Notice {
    fn info(message: String) -> Notice {
        Notice {
            level: NoticeLevel::Info,
            message,
        }
    }

    fn warn(message: String) -> Notice {
        Notice {
            level: NoticeLevel::Warn,
            message,
        }
    }
}

/// The server's command line alone (as `leasehold` with no subcommand takes it).
#[derive(Parser, Debug)]
#[command(name = "leasehold", args_override_self = true)]
struct Serve {
    #[command(flatten)]
    config: NodeConfig,
}

const ENV_PREFIX: &str = "ETCD_";
const CONFIG_FILE_FLAG: &str = "config-file";
/// clap's own flags, which are no etcd settings.
const CLAP_FLAGS: &[&str] = &["help", "version"];

/// The config file's TLS maps, etcd's `securityConfig`, client side and peer side.
const CLIENT_SECURITY: &str = "client-transport-security";
const PEER_SECURITY: &str = "peer-transport-security";
/// A TLS map's keys, and the flags they set on the client side and on the peer side.
const SECURITY_KEYS: &[(&str, &str, &str)] = &[
    ("cert-file", "cert-file", "peer-cert-file"),
    ("key-file", "key-file", "peer-key-file"),
    (
        "client-cert-file",
        "client-cert-file",
        "peer-client-cert-file",
    ),
    ("client-key-file", "client-key-file", "peer-client-key-file"),
    (
        "client-cert-auth",
        "client-cert-auth",
        "peer-client-cert-auth",
    ),
    ("trusted-ca-file", "trusted-ca-file", "peer-trusted-ca-file"),
    ("auto-tls", "auto-tls", "peer-auto-tls"),
    (
        "allowed-cn",
        "client-cert-allowed-cn",
        "peer-cert-allowed-cn",
    ),
    (
        "allowed-hostname",
        "client-cert-allowed-hostname",
        "peer-cert-allowed-hostname",
    ),
];
const SOCKET_OPTIONS: (&str, &[(&str, &str)]) = (
    "socket-options",
    &[
        ("reuse-port", "socket-reuse-port"),
        ("reuse-address", "socket-reuse-address"),
    ],
);
/// Top-level keys whose flag has another name.
const RENAMED_KEYS: &[(&str, &str)] = &[(
    "experimental-snapshot-catch-up-entries",
    "experimental-snapshot-catchup-entries",
)];

impl NodeConfig {
    /// The configuration from the server's command line (`args`, without the program name) and
    /// the process environment (`env`), by etcd's rules (see the module header).
    pub fn from_sources(args: &[String], env: &[(String, String)]) -> anyhow::Result<Resolved> {
        let given = parse(args, &HashMap::new())?;
        let mut notices = Vec::new();
        let config_file = given
            .get_one::<std::path::PathBuf>("config_file")
            .cloned()
            .or_else(|| env_value(env, &env_name(CONFIG_FILE_FLAG)).map(std::path::PathBuf::from));
        let matches = match config_file {
            Some(path) => {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("read config file {}", path.display()))?;
                let (file_args, sources) = file_args(&text, &path, &mut notices)?;
                let ignored: Vec<String> = given_flags(&given, |_| true)
                    .into_iter()
                    .filter(|f| f != "--config-file")
                    .collect();
                let mut message = format!(
                    "loaded server configuration from {}; other command-line flags and \
                     environment variables are ignored",
                    path.display()
                );
                if !ignored.is_empty() {
                    message.push_str(&format!(" (ignored: {})", ignored.join(", ")));
                }
                notices.push(Notice::info(message));
                parse(&file_args, &sources)?
            }
            None => {
                let (env_args, sources) = env_args(&given, env, &mut notices)?;
                parse(&[args, &env_args].concat(), &sources)?
            }
        };
        let config = NodeConfig::from_arg_matches(&matches).map_err(|e| anyhow!("{e}"))?;
        config.inert.check()?;
        let inert = given_flags(&matches, |heading| heading == Some(crate::inert::HEADING));
        if !inert.is_empty() {
            notices.push(Notice::warn(format!(
                "accepted for etcd compatibility, no effect in leasehold: {}",
                inert.join(", ")
            )));
        }
        // etcd 3.7 warns of these in its own words, which tools look for.
        for (flag, warning) in ETCD_DEPRECATED {
            if config.inert.given(flag).is_some() {
                notices.push(Notice::warn(warning.to_owned()));
            }
        }
        if let Some(gates) = &config.feature_gates {
            let idle = gates.without_effect();
            if !idle.is_empty() {
                notices.push(Notice::warn(format!(
                    "feature gates accepted for etcd compatibility, no effect in leasehold: {}",
                    idle.join(", ")
                )));
            }
        }
        let tls = config.tls.not_applied();
        if !tls.is_empty() {
            notices.push(Notice::warn(format!(
                "TLS settings not applied yet; ignoring {}",
                tls.join(", ")
            )));
        }
        notices.extend(config.tls_without_https().into_iter().map(Notice::warn));
        if config.log_outputs.iter().any(|o| o == "systemd/journal") {
            notices.push(Notice::info(
                "--log-outputs=systemd/journal: logging to stderr, which systemd passes to the \
                 journal"
                    .to_owned(),
            ));
        }
        Ok(Resolved { config, notices })
    }
}

/// Go's flag package takes `-name` as well as `--name`: rewrites a single-dash flag that names
/// one of the server's flags to the double-dash form clap takes. Everything after `--`, and
/// anything that names no flag (a value, a short flag such as `-h`), is left alone.
pub fn normalize_args(args: Vec<String>) -> Vec<String> {
    let cmd = Serve::command();
    let known = |name: &str| {
        CLAP_FLAGS.contains(&name) || cmd.get_arguments().any(|a| a.get_long() == Some(name))
    };
    let mut out = Vec::with_capacity(args.len());
    let mut rest = false;
    for arg in args {
        rest |= arg == "--";
        let single = !rest && arg.starts_with('-') && !arg.starts_with("--");
        let name = || arg[1..].split('=').next().unwrap_or_default();
        if single && !name().is_empty() && known(name()) {
            out.push(format!("-{arg}"));
        } else {
            out.push(arg);
        }
    }
    out
}

/// `ETCD_` and the flag's name in upper case, `-` as `_` (etcd's `flags.FlagToEnv`).
fn env_name(flag: &str) -> String {
    format!("{ENV_PREFIX}{}", flag.to_uppercase().replace('-', "_"))
}

fn env_value(env: &[(String, String)], name: &str) -> Option<String> {
    env.iter()
        .rev()
        .find(|(k, v)| k == name && !v.is_empty())
        .map(|(_, v)| v.clone())
}

/// Where each argument made from another source came from, by flag name, for error messages.
type Sources = HashMap<String, String>;

/// Parses the server's arguments; an error in an argument that came from the environment or a
/// config file names that source.
fn parse(args: &[String], sources: &Sources) -> anyhow::Result<ArgMatches> {
    let argv = std::iter::once("leasehold".to_owned()).chain(args.iter().cloned());
    Serve::command().try_get_matches_from(argv).map_err(|e| {
        let flag = match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(arg)) => arg
                .trim_start_matches('-')
                .split([' ', '='])
                .next()
                .unwrap_or_default()
                .to_owned(),
            _ => String::new(),
        };
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default();
        let first = first.strip_prefix("error: ").unwrap_or(first);
        match sources.get(&flag) {
            Some(source) => anyhow!("{source}: {first}"),
            None => anyhow!("{}", text.trim_end()),
        }
    })
}

/// The `--flags` given (not defaulted) whose `--help` heading passes `heading`.
fn given_flags(matches: &ArgMatches, heading: impl Fn(Option<&str>) -> bool) -> Vec<String> {
    Serve::command()
        .get_arguments()
        .filter(|a| heading(a.get_help_heading()))
        .filter(|a| {
            matches!(
                matches.value_source(a.get_id().as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect()
}

/// The arguments the `ETCD_*` variables give, by etcd's rules (see the module header).
fn env_args(
    given: &ArgMatches,
    env: &[(String, String)],
    notices: &mut Vec<Notice>,
) -> anyhow::Result<(Vec<String>, Sources)> {
    let cmd = Serve::command();
    let mut args = Vec::new();
    let mut sources = Sources::new();
    for (key, value) in env {
        if !key.starts_with(ENV_PREFIX) || *key == env_name(CONFIG_FILE_FLAG) {
            continue;
        }
        if *key == env_name("version") {
            notices.push(Notice::warn(format!(
                "cannot set special environment variable {key}={value}"
            )));
            continue;
        }
        // Hidden flags are config-file keys only, as in etcd.
        let flag = cmd
            .get_arguments()
            .find(|a| !a.is_hide_set() && a.get_long().is_some_and(|l| env_name(l) == *key));
        let Some(flag) = flag else {
            notices.push(Notice::warn(format!(
                "unrecognized environment variable {key}={value}"
            )));
            continue;
        };
        let long = flag.get_long().expect("found by its long name");
        if given.value_source(flag.get_id().as_str()) == Some(ValueSource::CommandLine) {
            bail!(
                "conflicting environment variable {key} is shadowed by corresponding \
                 command-line flag --{long} (either unset environment variable or disable flag)"
            );
        }
        if value.is_empty() {
            notices.push(Notice::warn(format!(
                "ignoring empty environment variable {key}"
            )));
            continue;
        }
        notices.push(Notice::info(format!(
            "recognized and used environment variable {key}={value}"
        )));
        args.push(format!("--{long}={value}"));
        sources.insert(long.to_owned(), format!("environment variable {key}"));
    }
    Ok((args, sources))
}

/// The arguments a config file gives (see the module header).
fn file_args(
    text: &str,
    path: &Path,
    notices: &mut Vec<Notice>,
) -> anyhow::Result<(Vec<String>, Sources)> {
    let what = format!("config file {}", path.display());
    let docs = YamlLoader::load_from_str(text).map_err(|e| anyhow!("{what}: {e}"))?;
    let mut out = FileArgs {
        cmd: Serve::command(),
        what,
        args: Vec::new(),
        sources: Sources::new(),
        unknown: Vec::new(),
    };
    match docs.first() {
        None | Some(Yaml::Null) => {}
        Some(Yaml::Hash(top)) => {
            for (key, value) in top {
                let key = scalar_key(key);
                out.top_level(&key, value)?;
            }
        }
        Some(_) => bail!("{}: expected a map of settings", out.what),
    }
    if !out.unknown.is_empty() {
        notices.push(Notice::warn(format!(
            "{}: ignoring unknown keys (as etcd does): {}",
            out.what,
            out.unknown.join(", ")
        )));
    }
    Ok((out.args, out.sources))
}

struct FileArgs {
    cmd: clap::Command,
    what: String,
    args: Vec<String>,
    sources: Sources,
    unknown: Vec<String>,
}

impl FileArgs {
    fn top_level(&mut self, key: &str, value: &Yaml) -> anyhow::Result<()> {
        if key == CLIENT_SECURITY || key == PEER_SECURITY {
            let peer = key == PEER_SECURITY;
            return self.nested(key, value, |k| {
                SECURITY_KEYS
                    .iter()
                    .find(|(yaml, _, _)| *yaml == k)
                    .map(|(_, client, peer_flag)| if peer { *peer_flag } else { *client })
            });
        }
        if key == SOCKET_OPTIONS.0 {
            return self.nested(key, value, |k| {
                SOCKET_OPTIONS
                    .1
                    .iter()
                    .find(|(yaml, _)| *yaml == k)
                    .map(|(_, flag)| *flag)
            });
        }
        let flag = RENAMED_KEYS
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, flag)| *flag)
            .or_else(|| (!nested_only(key)).then_some(key));
        match flag {
            Some(flag) => self.setting(key, flag, value),
            None => {
                self.unknown.push(key.to_owned());
                Ok(())
            }
        }
    }

    fn nested(
        &mut self,
        key: &str,
        value: &Yaml,
        flag_of: impl Fn(&str) -> Option<&'static str>,
    ) -> anyhow::Result<()> {
        let map = match value {
            Yaml::Hash(map) => map,
            Yaml::Null => return Ok(()),
            _ => bail!("{}: {key}: expected a map", self.what),
        };
        for (inner, value) in map {
            let inner = scalar_key(inner);
            let path = format!("{key}.{inner}");
            match flag_of(&inner) {
                Some(flag) => self.setting(&path, flag, value)?,
                None => self.unknown.push(path),
            }
        }
        Ok(())
    }

    /// One setting: the flag `flag` (if the server has it) from the YAML value at `key`.
    fn setting(&mut self, key: &str, flag: &str, value: &Yaml) -> anyhow::Result<()> {
        let Some(arg) = self
            .cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(flag) && !CLAP_FLAGS.contains(&flag))
        else {
            self.unknown.push(key.to_owned());
            return Ok(());
        };
        let kind = arg.get_value_parser().type_id();
        let text = match value {
            // Go's JSON leaves the default for a null.
            Yaml::Null => return Ok(()),
            Yaml::Integer(n) if kind == TypeId::of::<Duration>() => format!("{n}ns"),
            // YAML 1.1 (Go's yaml) also writes booleans as yes/no and on/off.
            Yaml::String(s) if kind == TypeId::of::<bool>() => yaml11_bool(s).to_owned(),
            Yaml::Array(items) => items
                .iter()
                .map(|item| {
                    scalar(item).ok_or_else(|| anyhow!("{}: {key}: a list of lists", self.what))
                })
                .collect::<anyhow::Result<Vec<_>>>()?
                .join(","),
            other => scalar(other)
                .ok_or_else(|| anyhow!("{}: {key}: expected a value, not a map", self.what))?,
        };
        self.args.push(format!("--{flag}={text}"));
        self.sources
            .insert(flag.to_owned(), format!("{}: key {key}", self.what));
        Ok(())
    }
}

/// Flags that a config file sets only through a nested map or another key.
fn nested_only(flag: &str) -> bool {
    flag == CONFIG_FILE_FLAG
        || CLAP_FLAGS.contains(&flag)
        || SECURITY_KEYS
            .iter()
            .any(|(_, client, peer)| *client == flag || *peer == flag)
        || SOCKET_OPTIONS.1.iter().any(|(_, f)| *f == flag)
        || RENAMED_KEYS.iter().any(|(_, f)| *f == flag)
}

fn scalar(value: &Yaml) -> Option<String> {
    match value {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(n) => Some(n.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        Yaml::Null => Some(String::new()),
        Yaml::Array(_) | Yaml::Hash(_) | Yaml::Alias(_) | Yaml::BadValue => None,
    }
}

fn scalar_key(key: &Yaml) -> String {
    scalar(key).unwrap_or_else(|| format!("{key:?}"))
}

fn yaml11_bool(s: &str) -> &str {
    match s {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => "true",
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => "false",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LogLevel, LogTarget};

    /// Every flag of etcd 3.5's server (`server/etcdmain/config.go`), with a value of its kind:
    /// `-` for a Go bool flag (given bare, `=true` and `=false`).
    const ETCD_FLAGS: &[(&str, &str)] = &[
        ("config-file", "/dev/null"),
        ("data-dir", "/tmp/d"),
        ("wal-dir", "/tmp/w"),
        ("listen-peer-urls", "http://127.0.0.1:3"),
        ("listen-client-urls", "http://127.0.0.1:1"),
        ("listen-client-http-urls", ""),
        ("listen-metrics-urls", "http://127.0.0.1:4"),
        ("max-snapshots", "5"),
        ("max-wals", "5"),
        ("name", "n1"),
        ("snapshot-count", "100"),
        ("heartbeat-interval", "50"),
        ("election-timeout", "500"),
        ("initial-election-tick-advance", "-"),
        ("quota-backend-bytes", "8589934592"),
        ("backend-bbolt-freelist-type", "map"),
        ("backend-batch-interval", "10ms"),
        ("backend-batch-limit", "100"),
        ("max-txn-ops", "64"),
        ("max-request-bytes", "1000"),
        ("grpc-keepalive-min-time", "5s"),
        ("grpc-keepalive-interval", "2h"),
        ("grpc-keepalive-timeout", "20s"),
        ("socket-reuse-port", "-"),
        ("socket-reuse-address", "-"),
        ("max-concurrent-streams", "100"),
        ("raft-read-timeout", "5s"),
        ("raft-write-timeout", "5s"),
        ("initial-advertise-peer-urls", "http://127.0.0.1:3"),
        ("advertise-client-urls", "http://127.0.0.1:1"),
        ("discovery", ""),
        ("discovery-fallback", "exit"),
        ("discovery-proxy", "http://proxy:1"),
        ("discovery-srv", ""),
        ("discovery-srv-name", "x"),
        ("initial-cluster", "n1=http://127.0.0.1:3"),
        ("initial-cluster-token", "t"),
        ("initial-cluster-state", "existing"),
        ("strict-reconfig-check", "-"),
        ("pre-vote", "-"),
        ("enable-v2", "-"),
        ("experimental-enable-v2v3", "/v2"),
        ("v2-deprecation", "write-only"),
        ("proxy", "off"),
        ("proxy-failure-wait", "5000"),
        ("proxy-refresh-interval", "30000"),
        ("proxy-dial-timeout", "1000"),
        ("proxy-write-timeout", "5000"),
        ("proxy-read-timeout", "0"),
        ("cert-file", "/c.pem"),
        ("key-file", "/k.pem"),
        ("client-cert-file", "/cc.pem"),
        ("client-key-file", "/ck.pem"),
        ("client-cert-auth", "-"),
        ("client-crl-file", "/crl"),
        ("client-cert-allowed-hostname", "a,b"),
        ("trusted-ca-file", "/ca.pem"),
        ("auto-tls", "-"),
        ("peer-cert-file", "/pc.pem"),
        ("peer-key-file", "/pk.pem"),
        ("peer-client-cert-file", "/pcc.pem"),
        ("peer-client-key-file", "/pck.pem"),
        ("peer-client-cert-auth", "-"),
        ("peer-trusted-ca-file", "/pca.pem"),
        ("peer-auto-tls", "-"),
        ("self-signed-cert-validity", "2"),
        ("peer-crl-file", "/pcrl"),
        ("peer-cert-allowed-cn", "a,b"),
        ("peer-cert-allowed-hostname", "a,b"),
        ("cipher-suites", "TLS_AES_128_GCM_SHA256"),
        ("experimental-peer-skip-client-san-verification", "-"),
        ("tls-min-version", "TLS1.3"),
        ("tls-max-version", "TLS1.3"),
        ("cors", "*"),
        ("host-whitelist", "*"),
        ("logger", "zap"),
        ("log-outputs", "stderr"),
        ("log-level", "debug"),
        ("enable-log-rotation", "-"),
        ("log-rotation-config-json", "{}"),
        ("auto-compaction-retention", "1h"),
        ("auto-compaction-mode", "periodic"),
        ("enable-pprof", "-"),
        ("metrics", "extensive"),
        ("experimental-enable-distributed-tracing", "-"),
        ("experimental-distributed-tracing-address", "localhost:4317"),
        ("experimental-distributed-tracing-service-name", "etcd"),
        ("experimental-distributed-tracing-instance-id", "i"),
        ("experimental-distributed-tracing-sampling-rate", "10"),
        ("auth-token", "simple"),
        ("bcrypt-cost", "10"),
        ("auth-token-ttl", "300"),
        ("enable-grpc-gateway", "-"),
        ("experimental-initial-corrupt-check", "-"),
        ("experimental-corrupt-check-time", "1m"),
        ("experimental-compact-hash-check-enabled", "-"),
        ("experimental-compact-hash-check-time", "1m"),
        ("experimental-enable-lease-checkpoint", "-"),
        ("experimental-enable-lease-checkpoint-persist", "-"),
        ("experimental-compaction-batch-limit", "1000"),
        ("experimental-compaction-sleep-interval", "10ms"),
        ("experimental-watch-progress-notify-interval", "5s"),
        ("experimental-downgrade-check-time", "5s"),
        ("experimental-warning-apply-duration", "100ms"),
        ("experimental-memory-mlock", "-"),
        ("experimental-txn-mode-write-with-shared-buffer", "-"),
        ("experimental-stop-grpc-service-on-defrag", "-"),
        ("experimental-bootstrap-defrag-threshold-megabytes", "10"),
        ("experimental-snapshot-catchup-entries", "5000"),
        ("unsafe-no-fsync", "-"),
        ("force-new-cluster", "-"),
        // etcd's ignored flags.
        ("cluster-active-size", "-"),
        ("cluster-remove-delay", "-"),
        ("cluster-sync-interval", "-"),
        ("config", "-"),
        ("force", "-"),
        ("max-result-buffer", "-"),
        ("max-retry-attempts", "-"),
        ("peer-heartbeat-interval", "-"),
        ("peer-election-timeout", "-"),
        ("retry-interval", "-"),
        ("snapshot", "-"),
        ("v", "-"),
        ("vv", "-"),
        // etcd 3.6's and 3.7's names.
        ("watch-progress-notify-interval", "5s"),
        ("corrupt-check-time", "1m"),
        ("feature-gates", "InitialCorruptCheck=true"),
        ("enable-distributed-tracing", "-"),
        ("distributed-tracing-address", "localhost:4317"),
        ("distributed-tracing-service-name", "etcd"),
        ("distributed-tracing-instance-id", "i"),
        ("distributed-tracing-sampling-rate", "10"),
        ("compact-hash-check-time", "1m"),
        ("compaction-batch-limit", "1000"),
        ("compaction-sleep-interval", "10ms"),
        ("downgrade-check-time", "5s"),
        ("warning-apply-duration", "100ms"),
        ("warning-unary-request-duration", "300ms"),
        ("memory-mlock", "-"),
        ("bootstrap-defrag-threshold-megabytes", "10"),
        ("snapshot-catchup-entries", "5000"),
        ("peer-skip-client-san-verification", "-"),
        ("max-learners", "1"),
        ("log-format", "json"),
        ("discovery-endpoints", ""),
        ("discovery-token", "t"),
        ("discovery-dial-timeout", "2s"),
        ("discovery-request-timeout", "1s"),
        ("discovery-keepalive-time", "2s"),
        ("discovery-keepalive-timeout", "6s"),
        ("discovery-insecure-transport", "-"),
        ("discovery-insecure-skip-tls-verify", "-"),
        ("discovery-cert", "/d.pem"),
        ("discovery-key", "/dk.pem"),
        ("discovery-cacert", "/dca.pem"),
        ("discovery-user", "u"),
        ("discovery-password", "p"),
    ];

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn resolve(args: &[&str], vars: &[(&str, &str)]) -> anyhow::Result<Resolved> {
        NodeConfig::from_sources(&strings(args), &env(vars))
    }

    fn warnings(resolved: &Resolved) -> Vec<&str> {
        resolved
            .notices
            .iter()
            .filter(|n| n.level == NoticeLevel::Warn)
            .map(|n| n.message.as_str())
            .collect()
    }

    /// A config file in a temporary directory (kept alive by the returned guard).
    fn config_file(yaml: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etcd.conf.yml");
        std::fs::write(&path, yaml).unwrap();
        (dir, path.display().to_string())
    }

    #[test]
    fn every_etcd_flag_parses_and_no_other() {
        for (flag, value) in ETCD_FLAGS {
            let forms = match *value {
                "-" => vec![
                    format!("--{flag}"),
                    format!("--{flag}=true"),
                    format!("--{flag}=false"),
                ],
                _ => vec![format!("--{flag}={value}")],
            };
            for form in forms {
                // --config-file makes the file the only source; an empty file is a valid one.
                if let Err(e) = resolve(&[&form], &[]) {
                    panic!("{form}: {e:#}");
                }
            }
        }
        // etcd 3.7 takes no other v2 stage, and says so in Go's flag package's words.
        let err = resolve(&["--v2-deprecation=not-yet"], &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                r#"invalid value "not-yet" for flag -v2-deprecation: invalid value "not-yet""#
            ),
            "{err}"
        );
        // The server has no flag etcd lacks, but for the one config-file-only TLS setting and
        // the lease cover margin (docs/lease.md).
        let cmd = Serve::command();
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let etcd = ETCD_FLAGS.iter().any(|(f, _)| *f == long);
            let ours = ["client-cert-allowed-cn", "lease-cover-margin"];
            assert!(
                etcd || CLAP_FLAGS.contains(&long) || ours.contains(&long),
                "--{long} is not an etcd 3.5 or 3.7 flag"
            );
        }
    }

    #[test]
    fn kubeadm_1_37s_etcd_flags_take_effect() {
        // kubeadm v1.37 (cmd/kubeadm/app/phases/etcd/local.go) starts etcd with 3.6's names.
        let r = resolve(
            &[
                "--feature-gates=InitialCorruptCheck=true",
                "--watch-progress-notify-interval=5s",
                "--corrupt-check-time=2m",
            ],
            &[],
        )
        .unwrap();
        assert!(r.config.initial_corrupt_check());
        assert_eq!(r.config.watch_progress_interval(), Duration::from_secs(5));
        assert_eq!(r.config.corrupt_check_period(), Duration::from_secs(120));
        assert!(warnings(&r).is_empty(), "{:?}", r.notices);
        // 3.6's names win over 3.5's, whatever the order; each alone keeps its meaning.
        let r = resolve(
            &[
                "--watch-progress-notify-interval=5s",
                "--experimental-watch-progress-notify-interval=7s",
                "--experimental-initial-corrupt-check=true",
                "--feature-gates=InitialCorruptCheck=false",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(r.config.watch_progress_interval(), Duration::from_secs(5));
        assert!(!r.config.initial_corrupt_check());
        let r = resolve(&["--experimental-initial-corrupt-check"], &[]).unwrap();
        assert!(r.config.initial_corrupt_check());
        // The same through etcd's environment variables.
        let r = resolve(
            &[],
            &[
                ("ETCD_FEATURE_GATES", "InitialCorruptCheck=true"),
                ("ETCD_WATCH_PROGRESS_NOTIFY_INTERVAL", "5s"),
            ],
        )
        .unwrap();
        assert!(r.config.initial_corrupt_check());
        assert_eq!(r.config.watch_progress_interval(), Duration::from_secs(5));
    }

    #[test]
    fn feature_gates_are_read_as_kubernetes_reads_them() {
        let r = resolve(
            &["--feature-gates=LeaseCheckpoint=true, CompactHashCheck=false"],
            &[],
        )
        .unwrap();
        assert!(!r.config.initial_corrupt_check());
        assert_eq!(r.config.compact_hash_check_period(), None);
        assert_eq!(
            warnings(&r),
            [
                "feature gates accepted for etcd compatibility, no effect in leasehold: \
              LeaseCheckpoint"
            ]
        );
        for (given, error) in [
            (
                "--feature-gates=Nope=true",
                "unrecognized feature gate: Nope",
            ),
            (
                "--feature-gates=InitialCorruptCheck",
                "missing bool value for InitialCorruptCheck",
            ),
            (
                "--feature-gates=InitialCorruptCheck=yes",
                "invalid value of InitialCorruptCheck=yes",
            ),
        ] {
            let e = resolve(&[given], &[]).expect_err(given);
            assert!(format!("{e:#}").contains(error), "{given}: {e:#}");
        }
    }

    #[test]
    fn implemented_flags_take_effect() {
        let r = resolve(
            &[
                "--max-request-bytes=1000",
                "--max-txn-ops",
                "3",
                "--grpc-keepalive-interval=30s",
                "--grpc-keepalive-timeout=5s",
                "--log-level=WARN",
                "--log-outputs=stdout,/tmp/l.log",
                "--experimental-watch-progress-notify-interval=5s",
                "--snapshot-count=10",
            ],
            &[],
        )
        .unwrap();
        let c = &r.config;
        assert_eq!(
            c.limits(),
            leasehold_server::Limits {
                request_bytes_max: 1000,
                txn_ops_max: 3
            }
        );
        assert_eq!(
            c.keepalive(),
            leasehold_server::GrpcKeepalive {
                interval: Duration::from_secs(30),
                timeout: Duration::from_secs(5)
            }
        );
        assert_eq!(c.log_level, LogLevel::Warn);
        assert_eq!(
            c.log_targets().unwrap(),
            vec![LogTarget::Stdout, LogTarget::File("/tmp/l.log".into())]
        );
        assert_eq!(
            c.experimental_watch_progress_notify_interval,
            Duration::from_secs(5)
        );
        assert_eq!(c.snapshot_count, 10);
        assert!(warnings(&r).is_empty(), "{:?}", r.notices);

        let defaults = resolve(&[], &[]).unwrap().config;
        assert_eq!(defaults.limits(), leasehold_server::Limits::default());
        assert_eq!(
            defaults.keepalive(),
            leasehold_server::GrpcKeepalive::default()
        );
        assert_eq!(defaults.log_level, LogLevel::Info);
        assert_eq!(defaults.log_targets().unwrap(), vec![LogTarget::Stderr]);
        assert_eq!(
            defaults.tls,
            crate::TlsFlags {
                self_signed_cert_validity: 1,
                tls_min_version: "TLS1.2".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn a_flag_given_twice_takes_the_last_value_as_in_go() {
        let r = resolve(
            &[
                "--max-txn-ops=3",
                "--max-txn-ops=4",
                "--log-outputs=stdout",
                "--log-outputs=stderr",
                "--enable-v2",
                "--enable-v2=false",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(r.config.max_txn_ops, 4);
        assert_eq!(r.config.log_outputs, vec!["stderr"]);
    }

    #[test]
    fn log_flags_are_checked_as_etcd_checks_them() {
        let targets = |outputs: &str| {
            resolve(&[&format!("--log-outputs={outputs}")], &[])
                .unwrap()
                .config
                .log_targets()
        };
        assert_eq!(targets("default").unwrap(), vec![LogTarget::Stderr]);
        assert_eq!(targets("systemd/journal").unwrap(), vec![LogTarget::Stderr]);
        assert!(targets("default,stdout").is_err());
        assert!(targets("systemd/journal,stderr").is_err());
        for bad in ["--log-level=verbose", "--logger=capnslog", "--logger=x"] {
            assert!(resolve(&[bad], &[]).is_err(), "{bad}");
        }
        let err = resolve(&["--logger=capnslog"], &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--logger=capnslog is removed in v3.5"),
            "{err}"
        );
    }

    #[test]
    fn unknown_flags_and_malformed_values_are_errors() {
        for bad in [
            &["--no-such-flag"][..],
            &["--no-such-flag=1"],
            &["--max-txn-ops=many"],
            &["--grpc-keepalive-timeout=5"],
            &["--enable-v2=maybe"],
            // A Go bool flag takes no separate value: `false` is then a stray argument.
            &["--client-cert-auth", "false"],
        ] {
            assert!(resolve(bad, &[]).is_err(), "{bad:?}");
        }
        let err = resolve(&["--no-such-flag"], &[]).unwrap_err().to_string();
        assert!(err.contains("--no-such-flag"), "{err}");
    }

    #[test]
    fn inert_and_unapplied_tls_flags_get_one_warning_line_each() {
        let r = resolve(
            &[
                "--experimental-compact-hash-check-enabled=true",
                "--enable-v2",
                "--quota-backend-bytes=100",
                "--max-snapshots=3",
                "--cert-file=/c.pem",
                "--peer-client-cert-auth=true",
                "--cipher-suites=TLS_AES_128_GCM_SHA256",
                "--name=n1",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            warnings(&r),
            vec![
                "accepted for etcd compatibility, no effect in leasehold: --max-snapshots, \
                 --enable-v2",
                // etcd 3.7's own warning.
                "--max-snapshots is deprecated in 3.6 and will be decommissioned in 3.8.",
                "TLS settings not applied yet; ignoring --cipher-suites",
                "--cert-file, --key-file, --trusted-ca-file, --client-cert-auth or --auto-tls given, but \
                 no --listen-client-urls is https://: serving plain HTTP there",
                "--peer-cert-file, --peer-key-file, --peer-trusted-ca-file, --peer-client-cert-auth or \
                 --peer-auto-tls given, but no --listen-peer-urls is https://: serving plain HTTP \
                 there",
            ]
        );
        assert_eq!(r.config.tls.client.cert_file, Some("/c.pem".into()));
        assert!(r.config.tls.peer.client_cert_auth);
        assert_eq!(r.config.quota_bytes(), Some(100), "the quota is applied");
    }

    #[test]
    fn inert_flags_that_would_change_the_member_are_refused() {
        for bad in [
            "--proxy=on",
            "--discovery=https://discovery.etcd.io/x",
            "--discovery-srv=example.com",
        ] {
            let err = resolve(&[bad], &[]).unwrap_err().to_string();
            assert!(
                err.contains("is not supported by leasehold"),
                "{bad}: {err}"
            );
        }
        for fine in ["--proxy=off", "--discovery="] {
            resolve(&[fine], &[]).unwrap_or_else(|e| panic!("{fine}: {e}"));
        }
    }

    #[test]
    fn environment_variables_map_to_flags() {
        let r = resolve(
            &["--name=n1"],
            &[
                ("ETCD_INITIAL_CLUSTER_TOKEN", "tok"),
                ("ETCD_DATA_DIR", "/tmp/env"),
                ("ETCD_MAX_TXN_OPS", "7"),
                ("ETCD_CLIENT_CERT_AUTH", "true"),
                ("ETCD_LOG_OUTPUTS", "stdout"),
                ("ETCD_EXPERIMENTAL_COMPACT_HASH_CHECK_ENABLED", "true"),
                ("ETCDCTL_API", "3"),
                ("PATH", "/bin"),
            ],
        )
        .unwrap();
        let c = &r.config;
        assert_eq!(c.name, "n1");
        assert_eq!(c.initial_cluster_token, "tok");
        assert_eq!(c.data_dir().to_str(), Some("/tmp/env"));
        assert_eq!(c.max_txn_ops, 7);
        assert!(c.tls.client.client_cert_auth);
        assert_eq!(c.log_targets().unwrap(), vec![LogTarget::Stdout]);
        assert_eq!(
            warnings(&r),
            vec![
                "--cert-file, --key-file, --trusted-ca-file, --client-cert-auth or --auto-tls given, but \
                 no --listen-client-urls is https://: serving plain HTTP there",
            ]
        );
        // An implemented flag, from its variable.
        assert_eq!(c.compact_hash_check_period(), Some(Duration::from_secs(60)));
        assert!(r.notices.iter().any(|n| n.message
            == "recognized and used environment variable ETCD_INITIAL_CLUSTER_TOKEN=tok"));
    }

    #[test]
    fn a_flag_and_its_environment_variable_together_are_refused_as_etcd_does() {
        let err = resolve(&["--name=flag"], &[("ETCD_NAME", "env")])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "conflicting environment variable ETCD_NAME is shadowed by corresponding \
             command-line flag --name (either unset environment variable or disable flag)"
        );
        // The other flags and variables are fine together.
        let r = resolve(&["--name=flag"], &[("ETCD_DATA_DIR", "/tmp/x")]).unwrap();
        assert_eq!(r.config.name, "flag");
    }

    #[test]
    fn unknown_etcd_variables_are_warned_about_and_ignored() {
        let r = resolve(
            &[],
            &[
                ("ETCD_NO_SUCH_FLAG", "1"),
                ("ETCD_VERSION", "1"),
                ("ETCD_CLIENT_CERT_ALLOWED_CN", "x"),
            ],
        )
        .unwrap();
        assert_eq!(
            warnings(&r),
            vec![
                "unrecognized environment variable ETCD_NO_SUCH_FLAG=1",
                "cannot set special environment variable ETCD_VERSION=1",
                "unrecognized environment variable ETCD_CLIENT_CERT_ALLOWED_CN=x",
            ]
        );
    }

    #[test]
    fn a_bad_environment_value_names_its_variable() {
        let err = resolve(&[], &[("ETCD_MAX_TXN_OPS", "lots")])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("environment variable ETCD_MAX_TXN_OPS: invalid value 'lots'"),
            "{err}"
        );
    }

    const ETCD_YAML: &str = r#"
# As etcd's etcd.conf.yml.sample writes it.
name: 'n1'
data-dir: /var/lib/etcd
wal-dir:
snapshot-count: 10000
heartbeat-interval: 50
election-timeout: 500
quota-backend-bytes: 0
listen-peer-urls: http://127.0.0.1:3
listen-client-urls: http://127.0.0.1:1,http://127.0.0.1:2
max-snapshots: 5
max-wals: 5
cors:
initial-advertise-peer-urls: http://127.0.0.1:3
advertise-client-urls: http://127.0.0.1:1
discovery:
discovery-fallback: 'proxy'
discovery-proxy:
discovery-srv:
initial-cluster: n1=http://127.0.0.1:3
initial-cluster-token: 'file-token'
initial-cluster-state: 'new'
strict-reconfig-check: false
enable-v2: true
enable-pprof: true
proxy: 'off'
proxy-failure-wait: 5000
client-transport-security:
  cert-file: /c.pem
  key-file: /k.pem
  client-cert-auth: true
  trusted-ca-file: /ca.pem
  auto-tls: false
  allowed-cn: [a, b]
peer-transport-security:
  cert-file: /pc.pem
  key-file: /pk.pem
  client-cert-auth: yes
  trusted-ca-file: /pca.pem
  auto-tls: false
  allowed-hostname:
    - h1
    - h2
socket-options:
  reuse-port: false
self-signed-cert-validity: 1
log-level: debug
logger: zap
log-outputs: [stderr, /tmp/leasehold.log]
force-new-cluster: false
auto-compaction-mode: periodic
auto-compaction-retention: "1"
max-txn-ops: 5
max-request-bytes: 2048
grpc-keepalive-interval: 30000000000
grpc-keepalive-timeout: 5000000000
experimental-snapshot-catch-up-entries: 100
cipher-suites: [TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384]
no-such-key: 1
"#;

    #[test]
    fn a_config_file_maps_etcds_keys() {
        let (_dir, path) = config_file(ETCD_YAML);
        let r = resolve(&[&format!("--config-file={path}")], &[]).unwrap();
        let c = &r.config;
        assert_eq!(c.name, "n1");
        assert_eq!(c.data_dir().to_str(), Some("/var/lib/etcd"));
        assert_eq!((c.heartbeat_interval, c.election_timeout), (50, 500));
        assert_eq!(c.client_addrs().unwrap().len(), 2);
        assert_eq!(c.initial_cluster.as_deref(), Some("n1=http://127.0.0.1:3"));
        assert_eq!(c.initial_cluster_token, "file-token");
        assert_eq!(c.log_level, LogLevel::Debug);
        assert_eq!(
            c.log_targets().unwrap(),
            vec![
                LogTarget::Stderr,
                LogTarget::File("/tmp/leasehold.log".into())
            ]
        );
        assert_eq!(
            c.limits(),
            leasehold_server::Limits {
                request_bytes_max: 2048,
                txn_ops_max: 5
            }
        );
        assert_eq!(
            c.keepalive(),
            leasehold_server::GrpcKeepalive {
                interval: Duration::from_secs(30),
                timeout: Duration::from_secs(5)
            }
        );
        let tls = &c.tls;
        assert_eq!(tls.client.cert_file, Some("/c.pem".into()));
        assert_eq!(tls.client.key_file, Some("/k.pem".into()));
        assert_eq!(tls.client.trusted_ca_file, Some("/ca.pem".into()));
        assert!(tls.client.client_cert_auth && !tls.client.auto_tls);
        assert_eq!(tls.client.allowed_cn, vec!["a", "b"]);
        assert_eq!(tls.peer.cert_file, Some("/pc.pem".into()));
        assert_eq!(tls.peer.key_file, Some("/pk.pem".into()));
        assert_eq!(tls.peer.trusted_ca_file, Some("/pca.pem".into()));
        assert!(tls.peer.client_cert_auth, "YAML 1.1's yes");
        assert_eq!(tls.peer.allowed_hostname, vec!["h1", "h2"]);
        assert_eq!(
            tls.cipher_suites,
            vec!["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384"]
        );
        let warned = warnings(&r);
        assert_eq!(warned.len(), 6, "{warned:#?}");
        assert!(warned[2].contains("--max-snapshots is deprecated"));
        assert!(
            warned[4].ends_with("no --listen-client-urls is https://: serving plain HTTP there")
        );
        assert!(warned[5].ends_with("no --listen-peer-urls is https://: serving plain HTTP there"));
        assert!(warned[0].ends_with("ignoring unknown keys (as etcd does): no-such-key"));
        assert!(warned[1].starts_with("accepted for etcd compatibility"));
        for inert in [
            "--max-snapshots",
            "--enable-v2",
            "--socket-reuse-port",
            "--experimental-snapshot-catchup-entries",
        ] {
            assert!(warned[1].contains(inert), "{inert}: {}", warned[1]);
        }
        assert!(
            warned[3].starts_with("TLS settings not applied yet; ignoring --cipher-suites"),
            "{}",
            warned[3]
        );
    }

    #[test]
    fn with_a_config_file_other_flags_and_variables_are_ignored() {
        let (_dir, path) = config_file("name: from-file\n");
        let r = resolve(
            &[
                "--config-file",
                &path,
                "--name=from-flag",
                "--max-txn-ops=1",
            ],
            &[("ETCD_NAME", "from-env"), ("ETCD_NO_SUCH_FLAG", "1")],
        )
        .unwrap();
        assert_eq!(r.config.name, "from-file");
        assert_eq!(r.config.max_txn_ops, leasehold_server::TXN_OPS_MAX_DEFAULT);
        assert!(warnings(&r).is_empty(), "{:?}", r.notices);
        let loaded = &r.notices[0];
        assert_eq!(loaded.level, NoticeLevel::Info);
        assert!(
            loaded
                .message
                .contains("are ignored (ignored: --name, --max-txn-ops)"),
            "{}",
            loaded.message
        );
        // ETCD_CONFIG_FILE works like the flag.
        let r = resolve(&[], &[("ETCD_CONFIG_FILE", &path), ("ETCD_NAME", "x")]).unwrap();
        assert_eq!(r.config.name, "from-file");
        // Unknown flags are refused even so (etcd parses the command line first).
        assert!(resolve(&["--config-file", &path, "--no-such-flag"], &[]).is_err());
    }

    #[test]
    fn config_file_errors_name_the_file_and_key() {
        let (_dir, path) = config_file("heartbeat-interval: often\n");
        let err = resolve(&[&format!("--config-file={path}")], &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!(
                "config file {path}: key heartbeat-interval: invalid value 'often'"
            )),
            "{err}"
        );
        for bad in [
            "name: [a: {b: c}]\n",
            "client-transport-security: /c.pem\n",
            "- a\n- b\n",
            "name: 'unterminated\n",
        ] {
            let (_dir, path) = config_file(bad);
            assert!(
                resolve(&[&format!("--config-file={path}")], &[]).is_err(),
                "{bad}"
            );
        }
        assert!(resolve(&["--config-file=/no/such/file"], &[]).is_err());
        // An empty file is etcd's defaults.
        let (_dir, path) = config_file("");
        assert_eq!(
            resolve(&[&format!("--config-file={path}")], &[])
                .unwrap()
                .config
                .name,
            "default"
        );
    }

    #[test]
    fn go_style_single_dash_flags_are_taken() {
        assert_eq!(
            normalize_args(strings(&[
                "-name",
                "n1",
                "-data-dir=/d",
                "-h",
                "-x",
                "--name",
                "-v",
                "--",
                "-name"
            ])),
            strings(&[
                "--name",
                "n1",
                "--data-dir=/d",
                "-h",
                "-x",
                "--name",
                "--v",
                "--",
                "-name"
            ])
        );
        let r = NodeConfig::from_sources(
            &normalize_args(strings(&["-name", "n1", "-client-cert-auth"])),
            &[],
        )
        .unwrap();
        assert_eq!(r.config.name, "n1");
        assert!(r.config.tls.client.client_cert_auth);
    }

    #[test]
    fn help_groups_the_flags() {
        let cmd = Serve::command();
        let heading = |long: &str| {
            cmd.get_arguments()
                .find(|a| a.get_long() == Some(long))
                .unwrap_or_else(|| panic!("--{long}"))
                .get_help_heading()
                .map(str::to_owned)
        };
        assert_eq!(heading("name"), None);
        assert_eq!(heading("max-txn-ops"), None);
        assert_eq!(heading("cert-file").as_deref(), Some(crate::tls::HEADING));
        assert_eq!(
            heading("peer-crl-file").as_deref(),
            Some(crate::tls::HEADING)
        );
        assert_eq!(
            heading("tls-max-version").as_deref(),
            Some(crate::tls::HEADING)
        );
        assert_eq!(heading("enable-v2").as_deref(), Some(crate::inert::HEADING));
        cmd.debug_assert();
    }

    #[test]
    fn compat_doc_lists_every_inert_flag() {
        let doc = include_str!("../../../docs/compat.md");
        for row in crate::inert::markdown_rows() {
            assert!(doc.contains(&row), "docs/compat.md lacks the row\n{row}");
        }
    }
}
