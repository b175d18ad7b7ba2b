//! `lock <name> [command args...]`: holds a named lock through the server's v3lock service.
//!
//! A session lease (`--ttl`, default 10 s, like etcdctl) is granted and kept alive in the
//! background; `Lock` is called with it. Without a command the lock key is printed (as etcdctl
//! prints it: a get of the key) and held until SIGINT/SIGTERM, then unlocked and the lease
//! revoked. With a command, the command runs with `ETCD_LOCK_KEY` (the key) and `ETCD_LOCK_REV`
//! (the key's create revision: the fencing token) in its environment, the lock is released when
//! it ends, and its exit code becomes ours. A lease lost while holding ends the command with
//! `Error: session expired`, exit 1.
//!
//! etcdctl does the same client-side with KV, Watch and Lease; the visible output is the same.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};

use clap::Args;
use leasehold_api::etcdserverpb::{RangeRequest, kv_client::KvClient};
use leasehold_api::v3lockpb::{LockRequest, UnlockRequest, lock_client::LockClient};
use tonic::transport::Channel;

use super::goparse::quote_bytes;
use super::session::Session;
use super::{
    CONTEXT_CANCELED, CtlError, CtlResult, EXIT_ERROR, GlobalArgs, Signals, call, emit, int_flag,
    status_message,
};

#[derive(Args, Debug)]
pub struct LockArgs {
    /// <lockname> [exec-command arg1 arg2 ...] (put `--` before a command with flags).
    #[arg(value_name = "ARGS")]
    pub args: Vec<OsString>,
    /// Timeout for session (seconds).
    #[arg(long, default_value = "10", value_parser = int_flag, allow_hyphen_values = true)]
    pub ttl: i64,
    #[command(flatten)]
    pub global: GlobalArgs,
}

pub async fn run(a: LockArgs) -> CtlResult {
    let Some(name) = a.args.first() else {
        return Err(CtlError::bad_args(
            "lock takes a lock name argument and an optional command to execute",
        ));
    };
    let g = &a.global;
    // etcdctl refuses an unknown output format before it takes the lock.
    g.printer()?;
    let fail = |m: String| CtlError::new(EXIT_ERROR, m);
    let mut signals = Signals::new()?;
    let channel = g.connect(g.dial_deadline()).await.map_err(fail)?;
    let mut session = Session::start(&channel, a.ttl, g.command_deadline())
        .await
        .map_err(fail)?;

    let request = LockRequest {
        name: name.as_bytes().to_vec(),
        lease: session.id,
    };
    let mut locks = LockClient::new(channel.clone());
    let locked = tokio::select! {
        locked = locks.lock(request) => locked
            .map(|r| r.into_inner().key)
            .map_err(|status| status_message(&status)),
        () = signals.recv() => Err(CONTEXT_CANCELED.to_string()),
        () = session.lost() => Err("session expired".to_string()),
    };
    let key = match locked {
        Ok(key) => key,
        Err(message) => {
            // Revoking the lease also deletes a key the server may have created meanwhile.
            session.close(g.command_deadline()).await;
            return Err(fail(message));
        }
    };

    let outcome = hold(&a, &channel, &key, &mut session, &mut signals).await;
    let unlocked = match &outcome {
        // The lease is gone, and with it the key.
        Held::Lost => Ok(()),
        _ => call(
            g.command_deadline(),
            LockClient::new(channel.clone()).unlock(UnlockRequest { key: key.clone() }),
        )
        .await
        .map(|_| ()),
    };
    session.close(g.command_deadline()).await;
    match outcome {
        Held::Released => unlocked.map_err(fail),
        Held::Lost => Err(fail("session expired".to_string())),
        Held::Failed(err) => Err(err),
        Held::Ran(status) => {
            if status.success() {
                unlocked.map_err(fail)
            } else {
                Err(CtlError::new(exit_code(status), exit_text(status)))
            }
        }
    }
}

/// How holding the lock ended.
enum Held {
    /// Interrupted (no command): release and exit 0.
    Released,
    /// The session lease expired or was revoked.
    Lost,
    /// The command ran; its status decides ours.
    Ran(ExitStatus),
    /// Anything else (the error to report once the lock is released).
    Failed(CtlError),
}

async fn hold(
    a: &LockArgs,
    channel: &Channel,
    key: &[u8],
    session: &mut Session,
    signals: &mut Signals,
) -> Held {
    let g = &a.global;
    let fail = |m: String| Held::Failed(CtlError::new(EXIT_ERROR, m));
    let got = match call(
        g.command_deadline(),
        KvClient::new(channel.clone()).range(RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        }),
    )
    .await
    {
        Ok(got) => got,
        Err(message) => return fail(message),
    };
    let Some(kv) = got.kvs.first() else {
        return fail("lock lost on init".to_string());
    };
    if a.args.len() > 1 {
        let mut command = match command(&a.args[1..]) {
            Ok(command) => command,
            Err(message) => return fail(message),
        };
        command
            .env("ETCD_LOCK_KEY", std::ffi::OsStr::from_bytes(key))
            .env("ETCD_LOCK_REV", kv.create_revision.to_string())
            // Go's exec.Command: stdin is /dev/null unless set; stdout and stderr are ours.
            .stdin(Stdio::null());
        let _ = std::io::Write::flush(&mut std::io::stdout());
        // Signals stay caught meanwhile: like etcdctl we wait for the command to end.
        return match command.status().await {
            Ok(status) => Held::Ran(status),
            Err(e) => fail(spawn_error_text(&a.args[1..], &e)),
        };
    }
    let printer = match g.printer() {
        Ok(p) => p,
        Err(e) => return Held::Failed(e),
    };
    if let Err(e) = printer.get(&got).and_then(|out| emit(&out)) {
        return Held::Failed(e);
    }
    tokio::select! {
        () = signals.recv() => Held::Released,
        () = session.lost() => Held::Lost,
    }
}

/// A command as Go's `exec.Command` finds it: a name without `/` is looked up in `$PATH`.
pub fn command(exec: &[OsString]) -> Result<tokio::process::Command, String> {
    let Some(name) = exec.first() else {
        return Err("no command".to_string());
    };
    let program = if name.as_bytes().contains(&b'/') {
        PathBuf::from(name)
    } else {
        look_path(name).ok_or_else(|| {
            format!(
                "exec: {}: executable file not found in $PATH",
                quote_bytes(name.as_bytes())
            )
        })?
    };
    let mut command = tokio::process::Command::new(program);
    command.arg0(name).args(&exec[1..]);
    Ok(command)
}

fn look_path(name: &OsString) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find_map(|dir| {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let candidate = dir.join(name);
        let executable = std::fs::metadata(&candidate)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        executable.then_some(candidate)
    })
}

/// Go's text for a failed start: `fork/exec <path>: <errno text>`.
pub fn spawn_error_text(exec: &[OsString], e: &std::io::Error) -> String {
    let program = exec
        .first()
        .map(|p| {
            if p.as_bytes().contains(&b'/') {
                PathBuf::from(p)
            } else {
                look_path(p).unwrap_or_else(|| PathBuf::from(p))
            }
        })
        .unwrap_or_default();
    let text = e.to_string();
    let text = text
        .split(" (os error")
        .next()
        .unwrap_or(&text)
        .to_lowercase();
    format!("fork/exec {}: {text}", program.display())
}

/// Go's text for a command that failed: `exit status 3`, `signal: killed`.
pub fn exit_text(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit status {code}");
    }
    let signal = status.signal().unwrap_or(0);
    let name = match signal {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        5 => "trace/breakpoint trap",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        10 => "user defined signal 1",
        11 => "segmentation fault",
        12 => "user defined signal 2",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        _ => return format!("signal: signal {signal}"),
    };
    format!("signal: {name}")
}

/// The command's exit code, or 128 + the signal that killed it (as shells report it).
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(EXIT_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_texts_like_go() {
        assert_eq!(exit_text(ExitStatus::from_raw(3 << 8)), "exit status 3");
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_text(ExitStatus::from_raw(9)), "signal: killed");
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
    }

    #[test]
    fn commands_are_looked_up_like_go() {
        let missing: Vec<OsString> = vec!["leasehold-no-such-command".into()];
        assert_eq!(
            command(&missing).unwrap_err(),
            "exec: \"leasehold-no-such-command\": executable file not found in $PATH"
        );
        assert!(command(&["sh".into(), "-c".into(), "true".into()]).is_ok());
        let e = std::io::Error::from_raw_os_error(2);
        assert_eq!(
            spawn_error_text(&["/nonexistent".into()], &e),
            "fork/exec /nonexistent: no such file or directory"
        );
    }
}
