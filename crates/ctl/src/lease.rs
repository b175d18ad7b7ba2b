//! `lease grant|revoke|timetolive|list|keep-alive`, with etcdctl 3.4's checks, messages and exit
//! codes (which differ per command: a failed grant/revoke exits 1, a failed
//! timetolive/list/keep-alive --once exits 2).

use std::time::Duration;

use clap::{Args, Subcommand};
use leasehold_api::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseLeasesRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest, lease_client::LeaseClient,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::goparse::{hex16, parse_int};
use super::session::keep_alive;
use super::{
    CtlError, CtlResult, DEADLINE_EXCEEDED, EXIT_BAD_CONNECTION, EXIT_ERROR, GlobalArgs, bool_flag,
    call, emit, status_message,
};

#[derive(Args, Debug)]
pub struct LeaseArgs {
    #[command(subcommand)]
    pub command: LeaseCommand,
    #[command(flatten)]
    pub global: GlobalArgs,
}

#[derive(Subcommand, Debug)]
pub enum LeaseCommand {
    /// Creates leases: `lease grant <ttl>`.
    #[command(args_override_self = true)]
    Grant {
        #[arg(value_name = "TTL")]
        args: Vec<String>,
    },
    /// Revokes leases: `lease revoke <leaseID>`.
    #[command(args_override_self = true)]
    Revoke {
        #[arg(value_name = "LEASE_ID")]
        args: Vec<String>,
    },
    /// Get lease information: `lease timetolive <leaseID> [--keys]`.
    #[command(args_override_self = true)]
    Timetolive {
        #[arg(value_name = "LEASE_ID")]
        args: Vec<String>,
        /// Get keys attached to this lease.
        #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
              default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
        keys: bool,
    },
    /// List all active leases.
    #[command(args_override_self = true)]
    List {
        /// Ignored, like etcdctl.
        #[arg(hide = true)]
        args: Vec<String>,
    },
    /// Keeps leases alive (renew): `lease keep-alive [--once] <leaseID>`.
    #[command(args_override_self = true)]
    KeepAlive {
        #[arg(value_name = "LEASE_ID")]
        args: Vec<String>,
        /// Resets the keep-alive time to its original value and exits immediately.
        #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
              default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
        once: bool,
    },
}

/// A lease ID argument: hexadecimal, as etcdctl prints IDs.
pub fn lease_from_arg(arg: &str) -> Result<i64, CtlError> {
    parse_int(arg, 16)
        .map_err(|e| CtlError::bad_args(format!("bad lease ID arg ({e}), expecting ID in Hex")))
}

/// `lease grant`'s TTL argument (decimal).
pub fn ttl_from_args(args: &[String]) -> Result<i64, CtlError> {
    let [ttl] = args else {
        return Err(CtlError::bad_args("lease grant command needs TTL argument"));
    };
    parse_int(ttl, 10).map_err(|e| CtlError::bad_args(format!("bad TTL ({e})")))
}

fn one_id(args: &[String], usage: &str) -> Result<i64, CtlError> {
    let [id] = args else {
        return Err(CtlError::bad_args(usage));
    };
    lease_from_arg(id)
}

pub async fn run(a: LeaseArgs) -> CtlResult {
    let g = &a.global;
    match a.command {
        LeaseCommand::Grant { args } => {
            let ttl = ttl_from_args(&args)?;
            let printer = g.printer()?;
            let deadline = g.command_deadline();
            let err = |m: String| CtlError::new(EXIT_ERROR, format!("failed to grant lease ({m})"));
            let channel = g.connect(deadline).await.map_err(err)?;
            let response = call(
                deadline,
                LeaseClient::new(channel).lease_grant(LeaseGrantRequest { ttl, id: 0 }),
            )
            .await
            .map_err(err)?;
            emit(&printer.grant(&response)?)
        }
        LeaseCommand::Revoke { args } => {
            let id = one_id(&args, "lease revoke command needs 1 argument")?;
            let printer = g.printer()?;
            let deadline = g.command_deadline();
            let err =
                |m: String| CtlError::new(EXIT_ERROR, format!("failed to revoke lease ({m})"));
            let channel = g.connect(deadline).await.map_err(err)?;
            let response = call(
                deadline,
                LeaseClient::new(channel).lease_revoke(LeaseRevokeRequest { id }),
            )
            .await
            .map_err(err)?;
            emit(&printer.revoke(id, &response)?)
        }
        LeaseCommand::Timetolive { args, keys } => {
            let id = one_id(&args, "lease timetolive command needs lease ID as argument")?;
            let printer = g.printer()?;
            // etcdctl sets no deadline here (it waits forever for an unreachable server); we
            // use the command timeout and etcdctl's exit code for this command's errors.
            let deadline = g.command_deadline();
            let err = |m: String| CtlError::new(EXIT_BAD_CONNECTION, m);
            let channel = g.connect(deadline).await.map_err(err)?;
            let response = call(
                deadline,
                LeaseClient::new(channel).lease_time_to_live(LeaseTimeToLiveRequest { id, keys }),
            )
            .await
            .map_err(err)?;
            emit(&printer.time_to_live(&response, keys)?)
        }
        LeaseCommand::List { args: _ } => {
            let printer = g.printer()?;
            let deadline = g.command_deadline();
            let err = |m: String| CtlError::new(EXIT_BAD_CONNECTION, m);
            let channel = g.connect(deadline).await.map_err(err)?;
            let response = call(
                deadline,
                LeaseClient::new(channel).lease_leases(LeaseLeasesRequest {}),
            )
            .await
            .map_err(err)?;
            emit(&printer.leases(&response)?)
        }
        LeaseCommand::KeepAlive { args, once } => {
            let id = one_id(&args, "lease keep-alive command needs lease ID as argument")?;
            let printer = g.printer()?;
            if once {
                let deadline = g.command_deadline();
                let response = keep_alive_once(g, id, deadline)
                    .await
                    .map_err(|m| CtlError::new(EXIT_BAD_CONNECTION, m))?;
                return emit(&printer.keep_alive(&response)?);
            }
            // clientv3 gives the first renewal the dial timeout plus one second; a lease that is
            // gone (or a server that never answers) ends the command with exit code 0.
            let first_deadline = Instant::now() + g.dial_timeout + Duration::from_secs(1);
            if let Ok(channel) = g.connect(first_deadline).await {
                keep_alive(channel, id, first_deadline, |response| {
                    emit(&printer.keep_alive(response)?)
                })
                .await?;
            }
            if printer.is_simple() {
                emit(format!("lease {} expired or revoked.\n", hex16(id)).as_bytes())?;
            }
            Ok(())
        }
    }
}

/// One renewal (clientv3's `KeepAliveOnce`): a lease that is gone is an error.
async fn keep_alive_once(
    g: &GlobalArgs,
    id: i64,
    deadline: Instant,
) -> Result<leasehold_api::etcdserverpb::LeaseKeepAliveResponse, String> {
    let channel = g.connect(deadline).await?;
    let (requests, rx) = mpsc::channel(1);
    requests
        .send(LeaseKeepAliveRequest { id })
        .await
        .map_err(|_| DEADLINE_EXCEEDED.to_string())?;
    let mut responses = call(
        deadline,
        LeaseClient::new(channel).lease_keep_alive(ReceiverStream::new(rx)),
    )
    .await?;
    match tokio::time::timeout_at(deadline, responses.message()).await {
        Err(_) => Err(DEADLINE_EXCEEDED.to_string()),
        Ok(Err(status)) => Err(status_message(&status)),
        Ok(Ok(None)) => Err("rpc error: code = Unavailable desc = stream ended".to_string()),
        Ok(Ok(Some(response))) if response.ttl <= 0 => {
            Err("etcdserver: requested lease not found".to_string())
        }
        Ok(Ok(Some(response))) => Ok(response),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_hex() {
        assert_eq!(lease_from_arg("1234abcd"), Ok(0x1234_abcd));
        assert_eq!(
            lease_from_arg("390da2017baea8aa"),
            Ok(0x390d_a201_7bae_a8aa)
        );
        let err = lease_from_arg("zz").unwrap_err();
        assert_eq!(err.code, 128);
        assert_eq!(
            err.message,
            r#"bad lease ID arg (strconv.ParseInt: parsing "zz": invalid syntax), expecting ID in Hex"#
        );
        let err = lease_from_arg("ffffffffffffffff").unwrap_err();
        assert!(err.message.contains("value out of range"), "{err:?}");
    }

    #[test]
    fn grant_ttl_is_decimal() {
        assert_eq!(ttl_from_args(&["30".to_string()]), Ok(30));
        let err = ttl_from_args(&["x".to_string()]).unwrap_err();
        assert_eq!(
            (err.code, err.message.as_str()),
            (
                128,
                r#"bad TTL (strconv.ParseInt: parsing "x": invalid syntax)"#
            )
        );
        let err = ttl_from_args(&[]).unwrap_err();
        assert_eq!(
            (err.code, err.message.as_str()),
            (128, "lease grant command needs TTL argument")
        );
        assert!(ttl_from_args(&["1".to_string(), "2".to_string()]).is_err());
    }
}
