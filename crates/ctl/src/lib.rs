//! `leasehold put|get|del|watch|lease|lock|elect`: an etcd v3 client whose output, errors and
//! exit codes are etcdctl 3.4's, built only on leasehold's own generated gRPC stubs.
//!
//! Every command is `parse flags (clap) -> check arguments like etcdctl -> connect -> call ->
//! print`. The printers are in [`output`]; Go's parsing rules and error texts, which etcdctl
//! shows verbatim, are in [`goparse`]. docs/cli.md lists the commands and where we differ.

pub mod elect;
pub use leasehold_types::go as goparse;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod output;
pub mod role;
pub mod session;
pub mod watch;

use std::future::Future;
use std::io::Write as _;
use std::time::Duration;

use clap::Args;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use output::{Format, Printer};

// etcdctl's exit codes (ctlv3/command/error.go).
pub const EXIT_SUCCESS: i32 = 0;
pub const EXIT_ERROR: i32 = 1;
pub const EXIT_BAD_CONNECTION: i32 = 2;
/// Not produced by the commands here (etcdctl uses it for txn and interactive watch input).
#[allow(dead_code)]
pub const EXIT_INVALID_INPUT: i32 = 3;
pub const EXIT_BAD_FEATURE: i32 = 4;
pub const EXIT_INTERRUPTED: i32 = 5;
pub const EXIT_IO: i32 = 6;
pub const EXIT_BAD_ARGS: i32 = 128;
/// Not etcdctl's: stdout was closed (128 + SIGPIPE, as a shell reports Go's death by SIGPIPE).
pub const EXIT_BROKEN_PIPE: i32 = 141;

/// What etcdctl says when a deadline passes (Go's `context.DeadlineExceeded`).
pub const DEADLINE_EXCEEDED: &str = "context deadline exceeded";
/// What etcdctl says when a blocking call is interrupted by SIGINT/SIGTERM.
pub const CONTEXT_CANCELED: &str = "context canceled";

/// gRPC HTTP/2 keepalive: grpc-go (etcdctl) never pings more often than every 10 s.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(6);
/// Pause between connection attempts while a deadline allows more.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

/// A failed command: `Error: <message>` on stderr, then exit with `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtlError {
    pub code: i32,
    pub message: String,
}

impl CtlError {
    pub fn new(code: i32, message: impl Into<String>) -> CtlError {
        CtlError {
            code,
            message: message.into(),
        }
    }

    pub fn bad_args(message: impl Into<String>) -> CtlError {
        CtlError::new(EXIT_BAD_ARGS, message)
    }
}

pub type CtlResult = Result<(), CtlError>;

/// The flags every client command takes (etcdctl's global flags that matter without TLS/auth).
/// Like etcdctl, each can also come from an `ETCDCTL_*` environment variable.
#[derive(Args, Debug, Clone)]
pub struct GlobalArgs {
    /// gRPC endpoints, comma-separated (`host:port`, with or without `http://`).
    #[arg(
        long,
        global = true,
        env = "ETCDCTL_ENDPOINTS",
        default_value = "127.0.0.1:2379",
        action = clap::ArgAction::Append,
        allow_hyphen_values = true
    )]
    pub endpoints: Vec<String>,
    /// Output format: simple or json.
    #[arg(
        short = 'w',
        long = "write-out",
        global = true,
        env = "ETCDCTL_WRITE_OUT",
        default_value = "simple",
        allow_hyphen_values = true
    )]
    pub write_out: String,
    /// Dial timeout for client connections (Go duration: 2s, 500ms, 1m).
    #[arg(
        long,
        global = true,
        env = "ETCDCTL_DIAL_TIMEOUT",
        default_value = "2s",
        value_parser = duration_flag,
        allow_hyphen_values = true
    )]
    pub dial_timeout: Duration,
    /// Timeout for short running commands (excluding dial timeout).
    #[arg(
        long,
        global = true,
        env = "ETCDCTL_COMMAND_TIMEOUT",
        default_value = "5s",
        value_parser = duration_flag,
        allow_hyphen_values = true
    )]
    pub command_timeout: Duration,
    /// Print byte strings as hex encoded strings (simple output).
    #[arg(
        long,
        global = true,
        env = "ETCDCTL_HEX",
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = bool_flag
    )]
    pub hex: bool,
}

impl GlobalArgs {
    /// The printer, after what etcdctl checks when it creates the client (after the
    /// arguments, before any request): the output format (`unsupported output format`, exit 4),
    /// then the endpoints (`etcdclient: no available endpoints`, exit 2).
    pub fn printer(&self) -> Result<Printer, CtlError> {
        let printer = Printer::new(Format::parse(&self.write_out)?, self.hex);
        self.endpoint_urls()?;
        Ok(printer)
    }

    /// The endpoints as URLs: `host:port` gets `http://`; TLS is not supported.
    pub fn endpoint_urls(&self) -> Result<Vec<String>, CtlError> {
        let mut urls = Vec::new();
        for e in self.endpoints.iter().flat_map(|list| list.split(',')) {
            let e = e.trim();
            if e.is_empty() {
                continue;
            }
            if e.starts_with("https://") || e.starts_with("unix://") || e.starts_with("unixs://") {
                return Err(CtlError::new(
                    EXIT_BAD_CONNECTION,
                    format!(
                        "endpoint {e}: only plain http endpoints are supported (no TLS, no unix sockets)"
                    ),
                ));
            }
            let url = if e.starts_with("http://") {
                e.to_string()
            } else {
                format!("http://{e}")
            };
            if Endpoint::from_shared(url.clone()).is_err() {
                return Err(CtlError::new(
                    EXIT_BAD_CONNECTION,
                    format!("invalid endpoint {e:?}"),
                ));
            }
            urls.push(url);
        }
        if urls.is_empty() {
            return Err(CtlError::new(
                EXIT_BAD_CONNECTION,
                "etcdclient: no available endpoints",
            ));
        }
        Ok(urls)
    }

    /// Connects to the first endpoint that answers, trying them in turn until `deadline`.
    /// etcdctl's client keeps retrying a dead endpoint until the command's own deadline, so an
    /// unreachable server ends in `context deadline exceeded`, not in a dial error.
    pub async fn connect(&self, deadline: Instant) -> Result<Channel, String> {
        let urls = self.endpoint_urls().map_err(|e| e.message)?;
        loop {
            for url in &urls {
                let now = Instant::now();
                if now >= deadline {
                    return Err(DEADLINE_EXCEEDED.to_string());
                }
                let remaining = deadline - now;
                let Ok(endpoint) = Endpoint::from_shared(url.clone()) else {
                    return Err(format!("invalid endpoint {url:?}"));
                };
                let endpoint = endpoint
                    .connect_timeout(self.dial_timeout.min(remaining))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                    .keep_alive_timeout(KEEPALIVE_TIMEOUT);
                if let Ok(Ok(channel)) = tokio::time::timeout(remaining, endpoint.connect()).await {
                    return Ok(channel);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DEADLINE_EXCEEDED.to_string());
            }
            tokio::time::sleep(RECONNECT_PAUSE.min(deadline - now)).await;
        }
    }

    /// The deadline of a short command started now.
    pub fn command_deadline(&self) -> Instant {
        Instant::now() + self.command_timeout
    }

    /// The deadline for connecting a long-running command (watch, lock, elect, keep-alive).
    pub fn dial_deadline(&self) -> Instant {
        Instant::now() + self.dial_timeout
    }
}

/// SIGINT or SIGTERM, for the commands that clean up when interrupted (lock, elect).
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers: from now on the signals no longer end the process.
    pub fn new() -> Result<Signals, CtlError> {
        use tokio::signal::unix::{SignalKind, signal};
        let install = |kind| {
            signal(kind).map_err(|e| CtlError::new(EXIT_ERROR, format!("signal handler: {e}")))
        };
        Ok(Signals {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
        })
    }

    /// Completes at the next SIGINT or SIGTERM.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// Awaits a unary call until `deadline`; the error is etcdctl's text for it.
pub async fn call<T>(
    deadline: Instant,
    rpc: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout_at(deadline, rpc).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(status_message(&status)),
        Err(_) => Err(DEADLINE_EXCEEDED.to_string()),
    }
}

/// How etcdctl shows a gRPC error: clientv3 turns etcd's own errors (all `etcdserver: ...`)
/// into plain errors whose text is the message; anything else keeps grpc-go's status text.
pub fn status_message(status: &tonic::Status) -> String {
    if status.message().starts_with("etcdserver: ") {
        status.message().to_string()
    } else {
        format!(
            "rpc error: code = {} desc = {}",
            leasehold_api::go_code_name(status.code()),
            status.message()
        )
    }
}

/// Whether a failed stream is worth reopening (clientv3: `Unavailable` and `Internal` mean the
/// server will be back). tonic reports a broken connection as a local status (with a source
/// error, often code `Unknown`); a status the server sent has none.
pub fn is_transient(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Internal
    ) || std::error::Error::source(status).is_some()
}

/// Writes to stdout (raw bytes: keys and values are printed as they are) and flushes.
pub fn emit(bytes: &[u8]) -> CtlResult {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                // Go dies of SIGPIPE here, silently; shells report that as 141.
                CtlError::new(EXIT_BROKEN_PIPE, String::new())
            } else {
                CtlError::new(EXIT_IO, format!("write /dev/stdout: {e}"))
            }
        })
}

pub use leasehold_types::prefix_range_end;

/// `--flag=value` parser for Go's boolean flags (`--prefix`, `--prefix=false`, `--prefix=1`).
pub fn bool_flag(s: &str) -> Result<bool, String> {
    goparse::parse_bool(s)
}

/// Go's `int`/`int64` flags (pflag parses them with base 0: `0x10` is 16).
pub fn int_flag(s: &str) -> Result<i64, String> {
    goparse::parse_int(s, 0)
}

/// Go's `time.Duration` flags. A negative duration is valid in Go; etcdctl's timeouts then run
/// out at once, so it is zero here.
pub fn duration_flag(s: &str) -> Result<Duration, String> {
    goparse::parse_duration(s).map(|ns| Duration::from_nanos(u64::try_from(ns).unwrap_or(0)))
}

/// Names of the client subcommands (the first argument that selects them).
pub const COMMANDS: &[&str] = &[
    "put", "get", "del", "watch", "lease", "lock", "elect", "role",
];

/// etcdctl's global flags that take a value as the next argument when written without `=`.
const GLOBAL_FLAGS_WITH_VALUE: &[&str] = &[
    "--endpoints",
    "--write-out",
    "-w",
    "--dial-timeout",
    "--command-timeout",
    "--user",
];

/// Moves client global flags written before the command word (`leasehold --endpoints=X get k`,
/// as etcdctl users write them) to after it, where the command's parser takes them. Anything
/// else is left alone, so `leasehold --name get` still names a server "get".
pub fn hoist_global_flags(argv: Vec<String>) -> Vec<String> {
    let mut i = 1;
    while i < argv.len() {
        let arg = argv[i].as_str();
        let name = arg.split_once('=').map_or(arg, |(n, _)| n);
        if GLOBAL_FLAGS_WITH_VALUE.contains(&name) {
            i += if arg.contains('=') { 1 } else { 2 };
        } else if name == "--hex" {
            i += 1;
        } else {
            break;
        }
    }
    let hoisted = i > 1 && i < argv.len() && COMMANDS.contains(&argv[i].as_str());
    if !hoisted {
        return argv;
    }
    let mut out = Vec::with_capacity(argv.len());
    out.push(argv[0].clone());
    out.push(argv[i].clone());
    out.extend_from_slice(&argv[1..i]);
    out.extend_from_slice(&argv[i + 1..]);
    out
}

/// What to do with a clap error of a client subcommand, the way etcdctl's cobra/pflag does.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseFailure {
    /// Help or version requested: clap prints it (stdout, exit 0).
    Clap,
    /// `lease` without (or with an unknown) subcommand: etcdctl prints help and exits 0.
    Help,
    /// A flag error: stderr gets `Error: <message>`, an empty line, `Error: <message>` again
    /// (cobra's report, then etcdctl's), exit 1. etcdctl also prints its usage page on stdout;
    /// we do not.
    Flag(String),
}

/// Maps a clap error to etcdctl's flag-error text (pflag's wording). `argv` is the raw command
/// line, used to tell `-w` from `--write-out` and to quote the offending token whole.
pub fn classify_parse_error(err: &clap::Error, argv: &[String]) -> ParseFailure {
    let context_str = |kind: ContextKind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::Strings(v)) => v.first().cloned(),
        _ => None,
    };
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ParseFailure::Clap,
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        | ErrorKind::MissingSubcommand
        | ErrorKind::InvalidSubcommand => ParseFailure::Help,
        ErrorKind::UnknownArgument => {
            let arg = context_str(ContextKind::InvalidArg).unwrap_or_default();
            ParseFailure::Flag(unknown_flag_message(&arg, argv))
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let arg = context_str(ContextKind::InvalidArg).unwrap_or_default();
            let long = flag_long_name(&arg);
            let value = context_str(ContextKind::InvalidValue).unwrap_or_default();
            if value.is_empty() && err.kind() == ErrorKind::InvalidValue {
                // A flag at the end of the line without its value.
                let short = short_of(&long);
                let used_short = short.is_some_and(|c| argv.iter().any(|a| *a == format!("-{c}")));
                return ParseFailure::Flag(match (used_short, short) {
                    (true, Some(c)) => format!("flag needs an argument: '{c}' in -{c}"),
                    _ => format!("flag needs an argument: --{long}"),
                });
            }
            let reason = std::error::Error::source(err)
                .map(ToString::to_string)
                .unwrap_or_else(|| format!("invalid value {}", goparse::quote(&value)));
            ParseFailure::Flag(format!(
                "invalid argument {} for \"--{long}\" flag: {reason}",
                goparse::quote(&value)
            ))
        }
        _ => {
            let rendered = err.to_string();
            let first = rendered
                .lines()
                .next()
                .unwrap_or("bad arguments")
                .trim_start_matches("error: ")
                .to_string();
            ParseFailure::Flag(first)
        }
    }
}

/// `--rev <REV>` -> `rev`; `-w, --write-out <..>` -> `write-out`.
fn flag_long_name(arg: &str) -> String {
    let token = arg
        .split([' ', ','])
        .find(|t| t.starts_with("--"))
        .or_else(|| arg.split(' ').next())
        .unwrap_or(arg);
    let name = token.trim_start_matches('-');
    let end = name.find(['[', '=', '<']).unwrap_or(name.len());
    name[..end].to_string()
}

fn short_of(long: &str) -> Option<char> {
    (long == "write-out").then_some('w')
}

/// pflag: `unknown flag: --name` (without any `=value`), or `unknown shorthand flag: 'x' in
/// -xyz` naming the first unknown letter and the whole token.
fn unknown_flag_message(arg: &str, argv: &[String]) -> String {
    if let Some(long) = arg.strip_prefix("--") {
        let name = long.split('=').next().unwrap_or(long);
        return format!("unknown flag: --{name}");
    }
    if let Some(short) = arg.strip_prefix('-') {
        let letter = short.chars().next().unwrap_or('-');
        let token = argv
            .iter()
            .find(|a| a.starts_with(arg) && !a.starts_with("--"))
            .cloned()
            .unwrap_or_else(|| arg.to_string());
        return format!("unknown shorthand flag: '{letter}' in {token}");
    }
    format!("unknown command {} for \"leasehold\"", goparse::quote(arg))
}

/// Prints a failure the way etcdctl does and returns the exit code.
pub fn report(err: &CtlError) -> i32 {
    let _ = std::io::stdout().flush();
    eprintln!("Error: {}", err.message);
    err.code
}

/// Prints a flag error the way cobra + etcdctl do and returns etcdctl's exit code (1).
pub fn report_flag_error(message: &str) -> i32 {
    eprint!("Error: {message}\n\nError: {message}\n");
    EXIT_ERROR
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_statuses() {
        assert!(is_transient(&tonic::Status::unavailable(
            "etcdserver: no leader"
        )));
        assert!(!is_transient(&tonic::Status::unknown("from the server")));
        assert!(!is_transient(&tonic::Status::not_found(
            "etcdserver: requested lease not found"
        )));
        let local = tonic::Status::from_error(Box::new(std::io::Error::other("broken")));
        assert!(is_transient(&local));
    }

    #[test]
    fn status_messages_like_clientv3() {
        let s = tonic::Status::not_found("etcdserver: requested lease not found");
        assert_eq!(status_message(&s), "etcdserver: requested lease not found");
        let s = tonic::Status::unimplemented("unknown service v3lockpb.Lock");
        assert_eq!(
            status_message(&s),
            "rpc error: code = Unimplemented desc = unknown service v3lockpb.Lock"
        );
    }

    #[test]
    fn unknown_flag_messages_like_pflag() {
        let argv: Vec<String> = ["leasehold", "get", "a", "-xyz"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            unknown_flag_message("--count-only=1", &argv),
            "unknown flag: --count-only"
        );
        assert_eq!(
            unknown_flag_message("-x", &argv),
            "unknown shorthand flag: 'x' in -xyz"
        );
    }

    #[test]
    fn flag_long_names() {
        assert_eq!(flag_long_name("--rev <REV>"), "rev");
        assert_eq!(flag_long_name("--write-out <WRITE_OUT>"), "write-out");
        assert_eq!(flag_long_name("-w, --write-out <WRITE_OUT>"), "write-out");
        assert_eq!(flag_long_name("--prefix[=<PREFIX>]"), "prefix");
    }
}

#[cfg(test)]
mod duration_flag_tests {
    use super::*;

    #[test]
    fn a_negative_duration_flag_is_zero_and_bad_ones_get_gos_text() {
        assert_eq!(duration_flag("-3s"), Ok(Duration::ZERO));
        assert_eq!(duration_flag("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(
            duration_flag("1q"),
            Err(r#"time: unknown unit "q" in duration "1q""#.to_string())
        );
    }
}
