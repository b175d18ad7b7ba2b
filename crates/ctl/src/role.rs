//! `role grant-permission`, with etcdctl 3.4's arguments, range rules, messages and exit codes,
//! plus leasehold's `--lease`: the grant lives with that lease and goes when it ends
//! (docs/lease.md, "Permissions bound to a lease"). With `--user name:password` it logs in first,
//! as etcdctl does, and sends the token with the call.

use clap::{Args, Subcommand};
use leasehold_api::authpb;
use leasehold_api::etcdserverpb::{
    AuthRoleGrantPermissionRequest, AuthenticateRequest, auth_client::AuthClient,
};
use tonic::metadata::MetadataValue;

use super::lease::lease_from_arg;
use super::{
    CtlError, CtlResult, EXIT_BAD_CONNECTION, EXIT_ERROR, GlobalArgs, bool_flag, call, emit,
};

#[derive(Args, Debug)]
pub struct RoleArgs {
    #[command(subcommand)]
    pub command: RoleCommand,
    #[command(flatten)]
    pub global: GlobalArgs,
    /// `name:password` to log in with (auth enabled).
    #[arg(long, global = true, env = "ETCDCTL_USER")]
    pub user: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum RoleCommand {
    /// Grants a key to a role: `role grant-permission [--prefix|--from-key] [--lease ID] <role>
    /// <read|write|readwrite> <key> [endkey]`.
    #[command(args_override_self = true)]
    GrantPermission {
        #[arg(value_name = "ROLE TYPE KEY [END]")]
        args: Vec<String>,
        /// Grant a prefix.
        #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
              default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
        prefix: bool,
        /// Grant from the key on.
        #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
              default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
        from_key: bool,
        /// leasehold's extension: bind the grant to this lease (hexadecimal ID).
        #[arg(long)]
        lease: Option<String>,
    },
}

/// The key range a grant covers, by etcdctl's rules.
pub fn grant_range(
    key: &str,
    end: Option<&str>,
    prefix: bool,
    from_key: bool,
) -> Result<(Vec<u8>, Vec<u8>), CtlError> {
    if prefix && from_key {
        return Err(CtlError::bad_args(
            "--from-key and --prefix flags are mutually exclusive",
        ));
    }
    if key.is_empty() {
        let end = if prefix || from_key {
            vec![0]
        } else {
            Vec::new()
        };
        return Ok((vec![0], end));
    }
    let key = key.as_bytes().to_vec();
    let end = match (end, prefix, from_key) {
        (Some(_), true, _) => {
            return Err(CtlError::bad_args(
                "unexpected endkey argument with --prefix flag",
            ));
        }
        (Some(_), _, true) => {
            return Err(CtlError::bad_args(
                "unexpected endkey argument with --from-key flag",
            ));
        }
        (Some(end), false, false) => end.as_bytes().to_vec(),
        (None, true, _) => leasehold_types::prefix_range_end(&key),
        (None, _, true) => vec![0],
        (None, false, false) => Vec::new(),
    };
    Ok((key, end))
}

fn perm_type(arg: &str) -> Result<authpb::permission::Type, CtlError> {
    match arg.to_ascii_uppercase().as_str() {
        "READ" => Ok(authpb::permission::Type::Read),
        "WRITE" => Ok(authpb::permission::Type::Write),
        "READWRITE" => Ok(authpb::permission::Type::Readwrite),
        _ => Err(CtlError::bad_args(format!(
            "invalid permission type: {arg}"
        ))),
    }
}

pub async fn run(a: RoleArgs) -> CtlResult {
    let g = &a.global;
    match a.command {
        RoleCommand::GrantPermission {
            args,
            prefix,
            from_key,
            lease,
        } => {
            let (role, kind, key, end) = match args.as_slice() {
                [role, kind, key] => (role, kind, key, None),
                [role, kind, key, end] => (role, kind, key, Some(end.as_str())),
                _ => {
                    return Err(CtlError::bad_args(
                        "role grant command requires role name, permission type, and key \
                         [endkey] as its argument",
                    ));
                }
            };
            let kind = perm_type(kind)?;
            let (key, range_end) = grant_range(key, end, prefix, from_key)?;
            let lease = lease
                .as_deref()
                .map(lease_from_arg)
                .transpose()?
                .unwrap_or(0);
            let deadline = g.command_deadline();
            let channel = g
                .connect(deadline)
                .await
                .map_err(|m| CtlError::new(EXIT_BAD_CONNECTION, m))?;
            let mut client = AuthClient::new(channel);
            let token = log_in(&mut client, a.user.as_deref(), deadline).await?;
            let mut request = tonic::Request::new(AuthRoleGrantPermissionRequest {
                name: role.clone(),
                perm: Some(authpb::Permission {
                    perm_type: kind as i32,
                    key,
                    range_end,
                    lease,
                }),
                lease,
            });
            if let Some(token) = token {
                let value = MetadataValue::try_from(token)
                    .map_err(|e| CtlError::new(EXIT_ERROR, e.to_string()))?;
                request.metadata_mut().insert("token", value);
            }
            call(deadline, client.role_grant_permission(request))
                .await
                .map_err(|m| CtlError::new(EXIT_ERROR, m))?;
            emit(format!("Role {role} updated\n").as_bytes())
        }
    }
}

/// etcdctl's login: only with a non-empty password; "not enabled" means no token is needed; any
/// other failure ends the command before it runs (exit 2).
async fn log_in(
    client: &mut AuthClient<tonic::transport::Channel>,
    user: Option<&str>,
    deadline: tokio::time::Instant,
) -> Result<Option<String>, CtlError> {
    let Some((name, password)) = user.and_then(|u| u.split_once(':')) else {
        return Ok(None);
    };
    if password.is_empty() {
        return Ok(None);
    }
    let request = AuthenticateRequest {
        name: name.to_owned(),
        password: password.to_owned(),
    };
    match call(deadline, client.authenticate(request)).await {
        Ok(response) => Ok(Some(response.token)),
        Err(m) if m == "etcdserver: authentication is not enabled" => Ok(None),
        Err(m) => Err(CtlError::new(EXIT_BAD_CONNECTION, m)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_etcdctl() {
        let r = |k, e, p, f| grant_range(k, e, p, f).map_err(|e| e.message);
        assert_eq!(r("a", None, false, false), Ok((b"a".to_vec(), vec![])));
        assert_eq!(
            r("a", Some("c"), false, false),
            Ok((b"a".to_vec(), b"c".to_vec()))
        );
        assert_eq!(
            r("foo", None, true, false),
            Ok((b"foo".to_vec(), b"fop".to_vec()))
        );
        assert_eq!(r("m", None, false, true), Ok((b"m".to_vec(), vec![0])));
        assert_eq!(r("", None, true, false), Ok((vec![0], vec![0])));
        assert_eq!(r("", None, false, false), Ok((vec![0], vec![])));
        assert!(r("a", None, true, true).is_err());
        assert_eq!(
            r("a", Some("b"), true, false),
            Err("unexpected endkey argument with --prefix flag".to_owned())
        );
    }
}
