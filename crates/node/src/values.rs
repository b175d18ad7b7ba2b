//! Flag values as etcd's flags parse them: Go's booleans and durations, with the error text
//! the flag parser shows.

use std::time::Duration;

pub(crate) fn parse_go_bool(s: &str) -> Result<bool, String> {
    leasehold_types::go::parse_bool(s).map_err(|_| format!("parse error: {s:?} is not a boolean"))
}

/// Durations as etcd's flags take them (Go's `time.ParseDuration`, with Go's error text): `0`,
/// or a sequence of decimal numbers, each with a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`),
/// such as `1m30s`, `1.5h` or `500ms`. Negative durations, which Go takes, are refused: no
/// flag of etcd's means anything by one.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let nanos = leasehold_types::go::parse_duration(s)?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| format!("a negative duration is not allowed here: {s:?}"))
}

/// [`parse_duration`], refusing zero.
pub(crate) fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("a duration must be positive".into()),
        d => Ok(d),
    }
}
