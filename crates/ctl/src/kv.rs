//! `put`, `get`, `del`: etcdctl 3.4's argument checks (same order, same messages and exit
//! codes), the same requests, the same output.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;

use clap::Args;
use leasehold_api::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, kv_client::KvClient, range_request,
};

use super::goparse::{parse_int, quote};
use super::{
    CtlError, CtlResult, EXIT_BAD_FEATURE, EXIT_ERROR, GlobalArgs, bool_flag, call, emit, int_flag,
    prefix_range_end,
};

#[derive(Args, Debug)]
pub struct PutArgs {
    /// <key> <value>; without <value> (and without --ignore-value) the value is read from stdin.
    #[arg(value_name = "ARGS")]
    pub args: Vec<OsString>,
    /// Lease ID (in hexadecimal) to attach to the key.
    #[arg(long, default_value = "0", allow_hyphen_values = true)]
    pub lease: String,
    /// Return the previous key-value pair before modification.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub prev_kv: bool,
    /// Update the key using its current value.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub ignore_value: bool,
    /// Update the key using its current lease.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub ignore_lease: bool,
    #[command(flatten)]
    pub global: GlobalArgs,
}

#[derive(Args, Debug)]
pub struct GetArgs {
    /// <key> [range_end]
    #[arg(value_name = "ARGS")]
    pub args: Vec<OsString>,
    /// Linearizable (l) or Serializable (s).
    #[arg(long, default_value = "l", allow_hyphen_values = true)]
    pub consistency: String,
    /// Order of results: ASCEND or DESCEND (ASCEND by default).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub order: String,
    /// Sort target: CREATE, KEY, MODIFY, VALUE, or VERSION.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub sort_by: String,
    /// Maximum number of results.
    #[arg(long, default_value = "0", value_parser = int_flag, allow_hyphen_values = true)]
    pub limit: i64,
    /// Get keys with matching prefix.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub prefix: bool,
    /// Get keys that are greater than or equal to the given key using byte compare.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub from_key: bool,
    /// Specify the kv revision.
    #[arg(long, default_value = "0", value_parser = int_flag, allow_hyphen_values = true)]
    pub rev: i64,
    /// Get only the keys.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub keys_only: bool,
    /// Only write values when using the "simple" output format.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub print_value_only: bool,
    /// Print only the number of matching keys (not in etcdctl 3.4; 3.5 has it for `-w fields`).
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub count_only: bool,
    #[command(flatten)]
    pub global: GlobalArgs,
}

#[derive(Args, Debug)]
pub struct DelArgs {
    /// <key> [range_end]
    #[arg(value_name = "ARGS")]
    pub args: Vec<OsString>,
    /// Delete keys with matching prefix.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub prefix: bool,
    /// Return deleted key-value pairs.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub prev_kv: bool,
    /// Delete keys that are greater than or equal to the given key using byte compare.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = bool_flag)]
    pub from_key: bool,
    #[command(flatten)]
    pub global: GlobalArgs,
}

const PUT_USAGE: &str = "put command needs 1 argument and input from stdin or 2 arguments";
const PREFIX_AND_FROM_KEY: &str =
    "`--prefix` and `--from-key` cannot be set at the same time, choose one";
const TOO_MANY_WITH_PREFIX: &str =
    "too many arguments, only accept one argument when `--prefix` or `--from-key` is set";

fn bytes(arg: &OsString) -> Vec<u8> {
    arg.as_bytes().to_vec()
}

/// The Put request `put` sends, after etcdctl's checks (in its order); the value comes from
/// `stdin` when only the key is given.
pub fn put_request(a: &PutArgs, stdin: impl std::io::Read) -> Result<PutRequest, CtlError> {
    let Some(key) = a.args.first() else {
        return Err(CtlError::bad_args(PUT_USAGE));
    };
    if a.ignore_value && a.args.len() > 1 {
        return Err(CtlError::bad_args(
            "put command needs only 1 argument when 'ignore-value' is set",
        ));
    }
    let mut value = Vec::new();
    if !a.ignore_value {
        match a.args.get(1) {
            Some(v) => value = bytes(v),
            None => {
                let mut stdin = stdin;
                if stdin.read_to_end(&mut value).is_err() || value.is_empty() {
                    return Err(CtlError::bad_args(PUT_USAGE));
                }
            }
        }
    }
    let lease = parse_int(&a.lease, 16)
        .map_err(|e| CtlError::bad_args(format!("bad lease ID ({e}), expecting ID in Hex")))?;
    Ok(PutRequest {
        key: bytes(key),
        value,
        lease,
        prev_kv: a.prev_kv,
        ignore_value: a.ignore_value,
        ignore_lease: a.ignore_lease,
    })
}

pub async fn put(a: PutArgs) -> CtlResult {
    let request = put_request(&a, std::io::stdin())?;
    let printer = a.global.printer()?;
    let deadline = a.global.command_deadline();
    let err = |m: String| CtlError::new(EXIT_ERROR, m);
    let channel = a.global.connect(deadline).await.map_err(err)?;
    let response = call(deadline, KvClient::new(channel).put(request))
        .await
        .map_err(err)?;
    emit(&printer.put(&response)?)
}

/// The Range request `get` sends, after etcdctl's checks.
pub fn get_request(a: &GetArgs) -> Result<RangeRequest, CtlError> {
    let Some(first) = a.args.first() else {
        return Err(CtlError::bad_args(
            "get command needs one argument as key and an optional argument as range_end",
        ));
    };
    if a.prefix && a.from_key {
        return Err(CtlError::bad_args(PREFIX_AND_FROM_KEY));
    }
    let serializable = match a.consistency.as_str() {
        "s" => true,
        "l" => false,
        other => {
            return Err(CtlError::new(
                EXIT_BAD_FEATURE,
                format!("unknown consistency flag {}", quote(other)),
            ));
        }
    };
    let mut key = bytes(first);
    let mut range_end = Vec::new();
    if let Some(end) = a.args.get(1) {
        if a.prefix || a.from_key {
            return Err(CtlError::bad_args(TOO_MANY_WITH_PREFIX));
        }
        range_end = bytes(end);
    }
    let sort_order = match a.order.to_uppercase().as_str() {
        "ASCEND" => range_request::SortOrder::Ascend,
        "DESCEND" => range_request::SortOrder::Descend,
        "" => range_request::SortOrder::None,
        _ => {
            return Err(CtlError::new(
                EXIT_BAD_FEATURE,
                format!("bad sort order {}", a.order),
            ));
        }
    };
    let sort_target = match a.sort_by.to_uppercase().as_str() {
        "CREATE" => range_request::SortTarget::Create,
        "KEY" | "" => range_request::SortTarget::Key,
        "MODIFY" => range_request::SortTarget::Mod,
        "VALUE" => range_request::SortTarget::Value,
        "VERSION" => range_request::SortTarget::Version,
        _ => {
            return Err(CtlError::new(
                EXIT_BAD_FEATURE,
                format!("bad sort target {}", a.sort_by),
            ));
        }
    };
    // clientv3: the server already returns keys in ascending order, so ascending by key is
    // sent as no order at all.
    let sort_order = if sort_target == range_request::SortTarget::Key
        && sort_order == range_request::SortOrder::Ascend
    {
        range_request::SortOrder::None
    } else {
        sort_order
    };
    if a.prefix {
        if key.is_empty() {
            key = vec![0];
            range_end = vec![0];
        } else {
            range_end = prefix_range_end(&key);
        }
    }
    if a.from_key {
        if key.is_empty() {
            key = vec![0];
        }
        range_end = vec![0];
    }
    Ok(RangeRequest {
        key,
        range_end,
        limit: a.limit,
        revision: a.rev.max(0),
        sort_order: sort_order as i32,
        sort_target: sort_target as i32,
        serializable,
        keys_only: a.keys_only,
        count_only: a.count_only,
        ..Default::default()
    })
}

pub async fn get(a: GetArgs) -> CtlResult {
    let request = get_request(&a)?;
    let mut printer = a.global.printer()?;
    let deadline = a.global.command_deadline();
    let err = |m: String| CtlError::new(EXIT_ERROR, m);
    let channel = a.global.connect(deadline).await.map_err(err)?;
    let response = call(deadline, KvClient::new(channel).range(request))
        .await
        .map_err(err)?;
    if a.print_value_only {
        if !printer.is_simple() {
            return Err(CtlError::bad_args(
                "print-value-only is only for `--write-out=simple`",
            ));
        }
        printer.value_only = true;
    }
    if a.count_only && printer.is_simple() {
        return emit(format!("{}\n", response.count).as_bytes());
    }
    emit(&printer.get(&response)?)
}

/// The DeleteRange request `del` sends, after etcdctl's checks.
pub fn del_request(a: &DelArgs) -> Result<DeleteRangeRequest, CtlError> {
    if a.args.is_empty() || a.args.len() > 2 {
        return Err(CtlError::bad_args(
            "del command needs one argument as key and an optional argument as range_end",
        ));
    }
    if a.prefix && a.from_key {
        return Err(CtlError::bad_args(PREFIX_AND_FROM_KEY));
    }
    let mut key = bytes(&a.args[0]);
    let mut range_end = Vec::new();
    if let Some(end) = a.args.get(1) {
        if a.prefix || a.from_key {
            return Err(CtlError::bad_args(TOO_MANY_WITH_PREFIX));
        }
        range_end = bytes(end);
    }
    if a.prefix {
        if key.is_empty() {
            key = vec![0];
            range_end = vec![0];
        } else {
            range_end = prefix_range_end(&key);
        }
    }
    if a.from_key {
        if key.is_empty() {
            key = vec![0];
        }
        range_end = vec![0];
    }
    Ok(DeleteRangeRequest {
        key,
        range_end,
        prev_kv: a.prev_kv,
    })
}

pub async fn del(a: DelArgs) -> CtlResult {
    let request = del_request(&a)?;
    let printer = a.global.printer()?;
    let deadline = a.global.command_deadline();
    let err = |m: String| CtlError::new(EXIT_ERROR, m);
    let channel = a.global.connect(deadline).await.map_err(err)?;
    let response = call(deadline, KvClient::new(channel).delete_range(request))
        .await
        .map_err(err)?;
    emit(&printer.del(&response)?)
}
