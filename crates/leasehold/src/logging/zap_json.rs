//! `--log-format=json`: log lines as etcd writes them, so that what reads etcd's log (log
//! shippers, etcd's own end-to-end tests, an operator's `jq`) reads leasehold's.
//!
//! etcd logs through zap's JSON encoder with its own settings (`client/pkg/logutil`): one object
//! a line, `level` (lower case), `ts` (UTC, microseconds: `2026-12-03T18:41:08.468197Z`),
//! `caller` (`dir/file:line`), `msg`, then the event's fields under their own names. The same
//! here, from a `tracing` event: numbers and booleans stay JSON numbers and booleans, anything
//! else is its text.

use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The event formatter for `--log-format=json`.
pub struct ZapJson;

impl<S, N> FormatEvent<S, N> for ZapJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let line = line(
            *meta.level(),
            SystemTime::now(),
            &caller(meta.file(), meta.line(), meta.target()),
            &fields,
        );
        writer.write_str(&line)
    }
}

/// An event's message and other fields, in the order they were recorded.
#[derive(Default)]
struct Fields {
    message: String,
    /// Each field's name and its value, already JSON.
    rest: Vec<(&'static str, String)>,
}

impl Fields {
    fn push(&mut self, field: &Field, json: String) {
        if field.name() == "message" {
            // A message given as a value rather than a format string.
            self.message = serde_json::from_str::<String>(&json).unwrap_or(json);
        } else {
            self.rest.push((field.name(), json));
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.push(field, quoted(&format!("{value:?}")));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, quoted(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, value.to_string());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, value.to_string());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, value.to_string());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinities: those go as text, as zap writes them.
        if value.is_finite() {
            self.push(field, value.to_string());
        } else {
            self.push(field, quoted(&value.to_string()));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.push(field, quoted(&value.to_string()));
    }
}

fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("a string always serializes")
}

/// One line, newline included.
fn line(level: Level, at: SystemTime, caller: &str, fields: &Fields) -> String {
    let mut out = String::with_capacity(128 + fields.message.len());
    let level = match level {
        Level::TRACE | Level::DEBUG => "debug",
        Level::INFO => "info",
        Level::WARN => "warn",
        Level::ERROR => "error",
    };
    let _ = write!(
        out,
        r#"{{"level":"{level}","ts":"{}","caller":{},"msg":{}"#,
        timestamp(at),
        quoted(caller),
        quoted(&fields.message)
    );
    for (name, value) in &fields.rest {
        let _ = write!(out, ",{}:{value}", quoted(name));
    }
    out.push_str("}\n");
    out
}

/// zap's short caller: the file's directory and name, and the line. For a file of this
/// workspace (`crates/node/src/node.rs`) that is the crate and the file (`node/node.rs`); for
/// one of a dependency, its last two path components. Without a file, the event's target.
fn caller(file: Option<&str>, line: Option<u32>, target: &str) -> String {
    let Some(file) = file else {
        return target.to_owned();
    };
    let parts: Vec<&str> = file
        .split(['/', '\\'])
        .filter(|p| !p.is_empty() && *p != "src")
        .collect();
    let short = match parts.as_slice() {
        [.., dir, name] => format!("{dir}/{name}"),
        [name] => (*name).to_owned(),
        [] => target.to_owned(),
    };
    match line {
        Some(line) => format!("{short}:{line}"),
        None => short,
    }
}

/// `at` in UTC as etcd writes it: `2006-01-02T15:04:05.000000Z`.
fn timestamp(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil_date(i64::try_from(secs / 86_400).unwrap_or(i64::MAX));
    let of_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
        since.subsec_micros()
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01: (year, month 1-12, day 1-31).
///
/// Counted in 400-year eras that start on 1 March, so that the leap day is the last day of its
/// year: an era is 146,097 days, and within it a year of March-to-February is 365 days plus the
/// leap day every 4th year, except every 100th, except every 400th.
fn civil_date(days: i64) -> (i64, u32, u32) {
    // Days since 0000-03-01.
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Months from March, each run of five (Mar-Jul, Aug-Dec) being 153 days.
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (
        year,
        u32::try_from(month).expect("1-12"),
        u32::try_from(day).expect("1-31"),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn dates_are_the_calendars() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(-1), (1969, 12, 31));
        // 2000 is a leap year (every 400th), 1900 and 2100 are not (every 100th).
        assert_eq!(civil_date(11_016), (2000, 2, 29));
        assert_eq!(civil_date(11_017), (2000, 3, 1));
        assert_eq!(civil_date(-25_508), (1900, 3, 1));
        assert_eq!(civil_date(-25_509), (1900, 2, 28));
        assert_eq!(civil_date(47_541), (2100, 3, 1));
        assert_eq!(civil_date(47_540), (2100, 2, 28));
        // Every day of 1970-2400 follows the one before it.
        let mut previous = civil_date(-1);
        for days in 0..157_000 {
            let today = civil_date(days);
            let next_day = (previous.0, previous.1, previous.2 + 1);
            let next_month = (previous.0, previous.1 + 1, 1);
            let next_year = (previous.0 + 1, 1, 1);
            assert!(
                today == next_day || today == next_month || today == next_year,
                "{previous:?} then {today:?}"
            );
            assert!(today.2 <= 31 && (today.1 != 2 || today.2 <= 29));
            previous = today;
        }
    }

    #[test]
    fn timestamps_have_etcds_layout() {
        // 2026-12-03T18:41:08.468197Z
        let at = UNIX_EPOCH + Duration::new(1_796_323_268, 468_197_123);
        assert_eq!(timestamp(at), "2026-12-03T18:41:08.468197Z");
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
    }

    #[test]
    fn callers_are_short() {
        assert_eq!(
            caller(Some("crates/node/src/node.rs"), Some(310), "x"),
            "node/node.rs:310"
        );
        assert_eq!(
            caller(
                Some("/root/.cargo/registry/src/h2-0.4.12/src/proto/streams/recv.rs"),
                Some(9),
                "h2"
            ),
            "streams/recv.rs:9"
        );
        assert_eq!(caller(None, None, "leasehold"), "leasehold");
    }

    #[test]
    fn a_line_is_one_json_object_with_zaps_keys_first() {
        let fields = Fields {
            message: "sending a snapshot \"now\"".into(),
            rest: vec![
                ("revision", "42".into()),
                ("ok", "true".into()),
                ("name", quoted("m1\n")),
            ],
        };
        let at = UNIX_EPOCH + Duration::from_micros(1);
        let text = line(Level::WARN, at, "node/node.rs:1", &fields);
        assert_eq!(
            text,
            "{\"level\":\"warn\",\"ts\":\"1970-01-01T00:00:00.000001Z\",\"caller\":\"node/node.rs:1\",\
             \"msg\":\"sending a snapshot \\\"now\\\"\",\"revision\":42,\"ok\":true,\"name\":\"m1\\n\"}\n"
        );
        let parsed: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(parsed["msg"], "sending a snapshot \"now\"");
        assert_eq!(parsed["revision"], 42);
    }
}
