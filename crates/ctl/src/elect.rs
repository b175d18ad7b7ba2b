//! `elect <name> <proposal>` campaigns through the server's v3election service and, once
//! leader, prints the leader key and value (etcdctl prints a get of the key) and holds
//! leadership until SIGINT/SIGTERM, then resigns and revokes its session lease (`--ttl`,
//! default 60 s as etcdctl's session). `elect -l <name>` observes: it prints every new leader's
//! key and value until interrupted.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;

use clap::Args;
use leasehold_api::etcdserverpb::{RangeRequest, kv_client::KvClient};
use leasehold_api::v3electionpb::{
    CampaignRequest, LeaderRequest, ResignRequest, election_client::ElectionClient,
};

use super::session::Session;
use super::{
    CONTEXT_CANCELED, CtlError, CtlResult, EXIT_ERROR, GlobalArgs, Signals, bool_flag, call, emit,
    int_flag, is_transient, status_message,
};

/// Pause before observing again after the stream broke.
const REOBSERVE_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

#[derive(Args, Debug)]
pub struct ElectArgs {
    /// <election-name> [proposal]
    #[arg(value_name = "ARGS")]
    pub args: Vec<OsString>,
    /// Observation mode.
    #[arg(short = 'l', long, action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", default_value = "false",
          value_parser = bool_flag)]
    pub listen: bool,
    /// Timeout for the campaign's session (seconds; etcdctl 3.4 always uses 60).
    #[arg(long, default_value = "60", value_parser = int_flag, allow_hyphen_values = true)]
    pub ttl: i64,
    #[command(flatten)]
    pub global: GlobalArgs,
}

/// What `elect` was asked to do, after etcdctl's checks.
#[derive(Debug, PartialEq, Eq)]
pub enum Mode {
    Observe { name: Vec<u8> },
    Campaign { name: Vec<u8>, proposal: Vec<u8> },
}

pub fn mode(a: &ElectArgs) -> Result<Mode, CtlError> {
    match (a.args.as_slice(), a.listen) {
        ([name], true) => Ok(Mode::Observe {
            name: name.as_bytes().to_vec(),
        }),
        ([_], false) => Err(CtlError::bad_args("no proposal argument but -l not set")),
        ([_, _], true) => Err(CtlError::bad_args("proposal given but -l is set")),
        ([name, proposal], false) => Ok(Mode::Campaign {
            name: name.as_bytes().to_vec(),
            proposal: proposal.as_bytes().to_vec(),
        }),
        _ => Err(CtlError::bad_args(
            "elect takes one election name argument and an optional proposal argument",
        )),
    }
}

pub async fn run(a: ElectArgs) -> CtlResult {
    let mode = mode(&a)?;
    let g = &a.global;
    let printer = g.printer()?;
    let fail = |m: String| CtlError::new(EXIT_ERROR, m);
    let mut signals = Signals::new()?;
    let channel = g.connect(g.dial_deadline()).await.map_err(fail)?;
    let mut elections = ElectionClient::new(channel.clone());
    match mode {
        Mode::Observe { name } => {
            // A broken stream is reopened (the server will be back, as clientv3 assumes); the
            // leader it announces first is skipped when it is the one already printed.
            let mut last_printed: Option<(Vec<u8>, i64)> = None;
            loop {
                let observed = tokio::select! {
                    observed = elections.observe(LeaderRequest { name: name.clone() }) => observed,
                    () = signals.recv() => return Ok(()),
                };
                let mut leaders = match observed {
                    Ok(leaders) => leaders.into_inner(),
                    Err(status) if is_transient(&status) => {
                        tokio::select! {
                            () = tokio::time::sleep(REOBSERVE_PAUSE) => continue,
                            () = signals.recv() => return Ok(()),
                        }
                    }
                    Err(status) => return Err(fail(status_message(&status))),
                };
                loop {
                    let next = tokio::select! {
                        next = leaders.message() => next,
                        () = signals.recv() => return Ok(()),
                    };
                    match next {
                        Ok(Some(leader)) => {
                            let id = leader
                                .kv
                                .as_ref()
                                .map(|kv| (kv.key.clone(), kv.mod_revision));
                            if id.is_some() && id == last_printed {
                                continue;
                            }
                            emit(&printer.leader(&leader)?)?;
                            last_printed = id;
                        }
                        Err(status) if is_transient(&status) => break,
                        Ok(None) | Err(_) => {
                            return Err(fail("elect: observer lost".to_string()));
                        }
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(REOBSERVE_PAUSE) => {}
                    () = signals.recv() => return Ok(()),
                }
            }
        }
        Mode::Campaign { name, proposal } => {
            let mut session = Session::start(&channel, a.ttl, g.command_deadline())
                .await
                .map_err(fail)?;
            let request = CampaignRequest {
                name,
                lease: session.id,
                value: proposal,
            };
            let campaigned = tokio::select! {
                won = elections.campaign(request) => won
                    .map(|r| r.into_inner().leader)
                    .map_err(|status| status_message(&status)),
                () = signals.recv() => Err(CONTEXT_CANCELED.to_string()),
                () = session.lost() => Err("elect: session expired".to_string()),
            };
            let leader = match campaigned {
                Ok(Some(leader)) => Ok(leader),
                Ok(None) => Err("elect: no leader key in the campaign response".to_string()),
                Err(message) => Err(message),
            };
            let leader = match leader {
                Ok(leader) => leader,
                Err(message) => {
                    session.close(g.command_deadline()).await;
                    return Err(fail(message));
                }
            };
            let got = call(
                g.command_deadline(),
                KvClient::new(channel.clone()).range(RangeRequest {
                    key: leader.key.clone(),
                    ..Default::default()
                }),
            )
            .await;
            let printed = got
                .map_err(fail)
                .and_then(|got| printer.get(&got))
                .and_then(|out| emit(&out));
            let held = match printed {
                Ok(()) => tokio::select! {
                    () = signals.recv() => Ok(()),
                    () = session.lost() => Err(fail("elect: session expired".to_string())),
                },
                Err(e) => Err(e),
            };
            let resigned = call(
                g.command_deadline(),
                elections.resign(ResignRequest {
                    leader: Some(leader),
                }),
            )
            .await;
            session.close(g.command_deadline()).await;
            held?;
            resigned.map(|_| ()).map_err(fail)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct T {
        #[command(flatten)]
        e: ElectArgs,
    }

    fn parse(argv: &[&str]) -> ElectArgs {
        T::try_parse_from(std::iter::once("elect").chain(argv.iter().copied()))
            .expect("parse")
            .e
    }

    #[test]
    fn elect_arguments_like_etcdctl() {
        assert_eq!(
            mode(&parse(&["e", "p"])),
            Ok(Mode::Campaign {
                name: b"e".to_vec(),
                proposal: b"p".to_vec()
            })
        );
        assert_eq!(
            mode(&parse(&["-l", "e"])),
            Ok(Mode::Observe {
                name: b"e".to_vec()
            })
        );
        let cases: [(&[&str], &str); 4] = [
            (
                &[],
                "elect takes one election name argument and an optional proposal argument",
            ),
            (&["e"], "no proposal argument but -l not set"),
            (&["-l", "e", "p"], "proposal given but -l is set"),
            (
                &["a", "b", "c"],
                "elect takes one election name argument and an optional proposal argument",
            ),
        ];
        for (argv, message) in cases {
            let err = mode(&parse(argv)).unwrap_err();
            assert_eq!((err.code, err.message.as_str()), (128, message), "{argv:?}");
        }
    }
}
