//! `watch [--prefix] [--rev N] [--prev-kv] <key> [range_end] [-- command args...]`: prints
//! events like etcdctl until the process is interrupted (SIGINT/SIGTERM end it, as they end
//! etcdctl, which installs no handler either). A broken stream is reopened from the revision
//! after the last one seen, like clientv3 does.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;
use std::process::Stdio;
use std::time::Duration;

use clap::Args;
use leasehold_api::etcdserverpb::{
    WatchCreateRequest, WatchRequest, WatchResponse, watch_client::WatchClient, watch_request,
};
use leasehold_api::mvccpb::event::EventType;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::goparse::{quote, quote_bytes};
use super::output::Printer;
use super::{
    CtlError, CtlResult, EXIT_BAD_CONNECTION, EXIT_BAD_FEATURE, EXIT_ERROR, EXIT_INTERRUPTED,
    GlobalArgs, bool_flag, emit, int_flag, is_transient, prefix_range_end, status_message,
};

/// Pause before reopening a watch whose stream broke.
const REOPEN_PAUSE: Duration = Duration::from_millis(500);

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// [key or prefix] [range_end]
    #[arg(value_name = "ARGS")]
    pub args: Vec<OsString>,
    /// After `--`: a command to run for every event (ETCD_WATCH_* in its environment).
    #[arg(last = true, value_name = "EXEC")]
    pub exec: Vec<OsString>,
    /// Interactive mode (not supported).
    #[arg(short = 'i', long, action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", default_value = "false",
          value_parser = bool_flag)]
    pub interactive: bool,
    /// Watch on a prefix if prefix is set.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub prefix: bool,
    /// Revision to start watching.
    #[arg(long, default_value = "0", value_parser = int_flag, allow_hyphen_values = true)]
    pub rev: i64,
    /// Get the previous key-value pair before the event happens.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub prev_kv: bool,
    #[command(flatten)]
    pub global: GlobalArgs,
}

/// What to watch, after etcdctl's checks. `separator_given`: the command line had `--`.
pub fn create_request(
    a: &WatchArgs,
    separator_given: bool,
    env_key: Option<OsString>,
    env_range_end: Option<OsString>,
) -> Result<WatchCreateRequest, CtlError> {
    let env_key = env_key.filter(|k| !k.is_empty());
    let env_range_end = env_range_end.filter(|k| !k.is_empty());
    if env_key.is_none()
        && let Some(end) = &env_range_end
    {
        return Err(CtlError::bad_args(format!(
            "ETCDCTL_WATCH_KEY is empty but got ETCDCTL_WATCH_RANGE_END={}",
            quote_bytes(end.as_bytes())
        )));
    }
    if a.interactive {
        return Err(CtlError::new(
            EXIT_BAD_FEATURE,
            "interactive watch is not supported by leasehold",
        ));
    }
    if separator_given && a.exec.is_empty() {
        return Err(CtlError::bad_args(
            "bad number of arguments (found separator --, but no commands)",
        ));
    }
    if !separator_given && a.args.is_empty() && env_key.is_none() {
        return Err(CtlError::bad_args("bad number of arguments"));
    }
    if env_key.is_some() && !a.args.is_empty() {
        return Err(CtlError::bad_args(
            "bad number of arguments (found conflicting environment key)",
        ));
    }
    let mut args: Vec<Vec<u8>> = Vec::new();
    if let Some(key) = env_key {
        args.push(key.as_bytes().to_vec());
        if let Some(end) = env_range_end {
            args.push(end.as_bytes().to_vec());
        }
    }
    args.extend(a.args.iter().map(|a| a.as_bytes().to_vec()));
    let Some(key) = args.first().cloned() else {
        return Err(CtlError::bad_args("bad number of arguments"));
    };
    let mut key = key;
    let mut range_end = Vec::new();
    // etcdctl takes a range end only from exactly two arguments (a third is ignored).
    if args.len() == 2 {
        if a.prefix {
            return Err(CtlError::bad_args(
                "`range_end` and `--prefix` are mutually exclusive",
            ));
        }
        range_end = args[1].clone();
    }
    if a.prefix {
        if key.is_empty() {
            key = vec![0];
            range_end = vec![0];
        } else {
            range_end = prefix_range_end(&key);
        }
    }
    Ok(WatchCreateRequest {
        key,
        range_end,
        start_revision: a.rev,
        prev_kv: a.prev_kv,
        ..Default::default()
    })
}

pub async fn run(a: WatchArgs) -> CtlResult {
    let separator_given = std::env::args_os()
        .skip_while(|arg| arg != "watch")
        .any(|arg| arg == "--");
    let mut request = create_request(
        &a,
        separator_given,
        std::env::var_os("ETCDCTL_WATCH_KEY"),
        std::env::var_os("ETCDCTL_WATCH_RANGE_END"),
    )?;
    let printer = a.global.printer()?;
    let channel = a
        .global
        .connect(a.global.dial_deadline())
        .await
        .map_err(|m| CtlError::new(EXIT_BAD_CONNECTION, m))?;
    let mut client = WatchClient::new(channel);
    loop {
        let (requests, rx) = mpsc::channel(1);
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(request.clone())),
        };
        let _ = requests.send(create).await;
        let mut call = tonic::Request::new(ReceiverStream::new(rx));
        // clientv3.WithRequireLeader, as etcdctl asks for it.
        call.metadata_mut().insert(
            "hasleader",
            tonic::metadata::MetadataValue::from_static("true"),
        );
        let mut responses = match client.watch(call).await {
            Ok(r) => r.into_inner(),
            Err(status) if is_transient(&status) => {
                tokio::time::sleep(REOPEN_PAUSE).await;
                continue;
            }
            Err(status) => return Err(CtlError::new(EXIT_INTERRUPTED, status_message(&status))),
        };
        loop {
            match responses.message().await {
                Ok(Some(response)) => {
                    // Resume after the revision the watch started at, once it is known.
                    if response.created
                        && request.start_revision == 0
                        && let Some(header) = &response.header
                        && header.revision > 0
                    {
                        request.start_revision = header.revision + 1;
                    }
                    if let Some(next) = handle(&printer, &response, &a.exec).await? {
                        request.start_revision = next;
                    }
                    if response.canceled {
                        return Err(CtlError::new(
                            EXIT_INTERRUPTED,
                            "watch is canceled by the server",
                        ));
                    }
                }
                Ok(None) => break,
                Err(status) if is_transient(&status) => break,
                Err(status) => {
                    return Err(CtlError::new(EXIT_INTERRUPTED, status_message(&status)));
                }
            }
        }
        drop(requests);
        tokio::time::sleep(REOPEN_PAUSE).await;
    }
}

/// Prints one response (etcdctl's `printWatchCh`) and runs the exec command per event. Returns
/// the revision to resume from if the stream breaks later.
async fn handle(
    printer: &Printer,
    r: &WatchResponse,
    exec: &[OsString],
) -> Result<Option<i64>, CtlError> {
    // clientv3 does not hand the "created" confirmation to the caller.
    if r.created && r.events.is_empty() && !r.canceled {
        return Ok(None);
    }
    let revision = r.header.as_ref().map_or(0, |h| h.revision);
    if r.canceled {
        let reason = if r.compact_revision != 0 {
            "etcdserver: mvcc: required revision has been compacted".to_string()
        } else if !r.cancel_reason.is_empty() {
            r.cancel_reason.clone()
        } else {
            "etcdserver: mvcc: required revision is a future revision".to_string()
        };
        let _ = std::io::Write::flush(&mut std::io::stdout());
        eprintln!("watch was canceled ({reason})");
    }
    if r.events.is_empty() && !r.canceled && !r.created && r.compact_revision == 0 && revision != 0
    {
        emit(format!("progress notify: {revision}\n").as_bytes())?;
    }
    emit(&printer.watch(r)?)?;
    for event in &r.events {
        if exec.is_empty() {
            break;
        }
        run_exec(exec, revision, event).await?;
    }
    Ok((revision > 0 && !r.events.is_empty()).then_some(revision + 1))
}

/// etcdctl's `watch ... -- command`: runs `command` with the event in its environment; a
/// failure ends the watch with `command ["..."] error (...)` and exit code 1.
async fn run_exec(
    exec: &[OsString],
    revision: i64,
    event: &leasehold_api::mvccpb::Event,
) -> CtlResult {
    let (key, value) = event
        .kv
        .as_ref()
        .map_or((&[][..], &[][..]), |kv| (&kv.key[..], &kv.value[..]));
    let kind = match EventType::try_from(event.r#type) {
        Ok(EventType::Delete) => "DELETE",
        _ => "PUT",
    };
    let mut command = super::lock::command(exec).map_err(|e| exec_failed(exec, &e))?;
    command
        .env("ETCD_WATCH_REVISION", revision.to_string())
        .env("ETCD_WATCH_EVENT_TYPE", quote(kind))
        .env("ETCD_WATCH_KEY", quote_bytes(key))
        .env("ETCD_WATCH_VALUE", quote_bytes(value))
        .stdin(Stdio::null());
    let status = command
        .status()
        .await
        .map_err(|e| exec_failed(exec, &super::lock::spawn_error_text(exec, &e)))?;
    if !status.success() {
        return Err(exec_failed(exec, &super::lock::exit_text(status)));
    }
    Ok(())
}

fn exec_failed(exec: &[OsString], error: &str) -> CtlError {
    let quoted: Vec<String> = exec.iter().map(|a| quote_bytes(a.as_bytes())).collect();
    let _ = std::io::Write::flush(&mut std::io::stdout());
    eprintln!("command [{}] error ({error})", quoted.join(" "));
    // Already reported: etcdctl exits 1 without an `Error:` line here.
    CtlError::new(EXIT_ERROR, String::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct T {
        #[command(flatten)]
        w: WatchArgs,
    }

    fn parse(argv: &[&str]) -> WatchArgs {
        T::try_parse_from(std::iter::once("watch").chain(argv.iter().copied()))
            .expect("parse")
            .w
    }

    #[test]
    fn watch_arguments_like_etcdctl() {
        let r = create_request(&parse(&["foo"]), false, None, None).unwrap();
        assert_eq!(
            (r.key.as_slice(), r.range_end.as_slice()),
            (&b"foo"[..], &b""[..])
        );
        let r = create_request(
            &parse(&["--prefix", "foo", "--rev=0x10"]),
            false,
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            (r.range_end.as_slice(), r.start_revision),
            (&b"fop"[..], 16)
        );
        let r = create_request(&parse(&["a", "c"]), false, None, None).unwrap();
        assert_eq!(r.range_end, b"c");
        let r = create_request(&parse(&["", "--prefix"]), false, None, None).unwrap();
        assert_eq!((r.key, r.range_end), (vec![0], vec![0]));
        let e = create_request(&parse(&[]), false, None, None).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (128, "bad number of arguments")
        );
        let e = create_request(&parse(&["a", "b", "--prefix"]), false, None, None).unwrap_err();
        assert_eq!(
            e.message,
            "`range_end` and `--prefix` are mutually exclusive"
        );
        let e = create_request(&parse(&["a", "--"]), true, None, None).unwrap_err();
        assert_eq!(
            e.message,
            "bad number of arguments (found separator --, but no commands)"
        );
        let w = parse(&["a", "--", "echo", "-n", "x"]);
        assert_eq!(w.exec, vec!["echo", "-n", "x"]);
        assert!(create_request(&w, true, None, None).is_ok());
    }

    #[test]
    fn watch_key_from_the_environment() {
        let r = create_request(&parse(&[]), false, Some("k".into()), Some("m".into())).unwrap();
        assert_eq!((r.key, r.range_end), (b"k".to_vec(), b"m".to_vec()));
        let e = create_request(&parse(&["x"]), false, Some("k".into()), None).unwrap_err();
        assert_eq!(
            e.message,
            "bad number of arguments (found conflicting environment key)"
        );
        let e = create_request(&parse(&["x"]), false, None, Some("m".into())).unwrap_err();
        assert_eq!(
            e.message,
            "ETCDCTL_WATCH_KEY is empty but got ETCDCTL_WATCH_RANGE_END=\"m\""
        );
    }
}
