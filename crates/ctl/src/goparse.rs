//! The few pieces of Go's standard library whose exact behaviour and error text etcdctl shows its
//! users: `strconv.ParseInt`/`ParseBool`, `time.ParseDuration`, `strconv.Quote` (`%q`) and `%x`
//! of an `int64`. etcdctl prints their errors verbatim (`bad lease ID (strconv.ParseInt: parsing
//! "zz": invalid syntax), expecting ID in Hex`), so ours must read the same.

use std::fmt::Write as _;
use std::time::Duration;

/// `strconv.ParseInt(s, base, 64)`: base 0 (prefix decides: `0x`, `0o`, `0b`, leading `0`) or an
/// explicit base 2..=36 (no prefix). The error is Go's `NumError` text.
pub fn parse_int(s: &str, base: u32) -> Result<i64, String> {
    let syntax = || format!("strconv.ParseInt: parsing {}: invalid syntax", quote(s));
    let range = || format!("strconv.ParseInt: parsing {}: value out of range", quote(s));
    let (negative, unsigned) = match s.as_bytes().first() {
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    let (base, digits, underscores_ok) = if base == 0 {
        let lower = unsigned.to_ascii_lowercase();
        if lower.starts_with("0x") {
            (16, &unsigned[2..], true)
        } else if lower.starts_with("0o") {
            (8, &unsigned[2..], true)
        } else if lower.starts_with("0b") {
            (2, &unsigned[2..], true)
        } else if unsigned.len() > 1 && unsigned.starts_with('0') {
            (8, &unsigned[1..], true)
        } else {
            (10, unsigned, true)
        }
    } else {
        (base, unsigned, false)
    };
    if digits.is_empty() {
        return Err(syntax());
    }
    let mut magnitude: u64 = 0;
    let mut previous_underscore = false;
    for (i, c) in digits.chars().enumerate() {
        if c == '_' && underscores_ok {
            // Go: underscores only between digits (or right after a base prefix).
            if previous_underscore || i + 1 == digits.len() {
                return Err(syntax());
            }
            previous_underscore = true;
            continue;
        }
        previous_underscore = false;
        let Some(d) = c.to_digit(base) else {
            return Err(syntax());
        };
        magnitude = match magnitude
            .checked_mul(u64::from(base))
            .and_then(|m| m.checked_add(u64::from(d)))
        {
            Some(m) => m,
            None => return Err(range()),
        };
    }
    let limit = if negative {
        1u64 << 63
    } else {
        i64::MAX as u64
    };
    if magnitude > limit {
        return Err(range());
    }
    Ok(if negative {
        (magnitude as i64).wrapping_neg()
    } else {
        magnitude as i64
    })
}

/// `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "strconv.ParseBool: parsing {}: invalid syntax",
            quote(s)
        )),
    }
}

/// `time.ParseDuration`. Negative durations are valid in Go (a deadline already passed); they
/// come back as zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let invalid = || format!("time: invalid duration {}", quote(s));
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, after) = rest.split_at(int_len);
        let (frac_part, after) = match after.strip_prefix('.') {
            Some(after) => {
                let frac_len = after.bytes().take_while(u8::is_ascii_digit).count();
                after.split_at(frac_len)
            }
            None => ("", after),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(format!("time: missing unit in duration {}", quote(s)));
        }
        let unit_nanos: f64 = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => {
                return Err(format!(
                    "time: unknown unit {} in duration {}",
                    quote(unit),
                    quote(s)
                ));
            }
        };
        let number: f64 = format!(
            "{}.{}",
            if int_part.is_empty() { "0" } else { int_part },
            if frac_part.is_empty() { "0" } else { frac_part }
        )
        .parse()
        .map_err(|_| invalid())?;
        total_nanos += number * unit_nanos;
        if total_nanos > i64::MAX as f64 {
            return Err(invalid());
        }
        rest = after;
    }
    if negative {
        return Ok(Duration::ZERO);
    }
    Ok(Duration::from_nanos(total_nanos as u64))
}

/// `strconv.Quote` (what `%q` prints for a string).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            ' ' => out.push(' '),
            c if c.is_ascii() => {
                if c.is_ascii_graphic() {
                    out.push(c);
                } else {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
            }
            c if c.is_control() || c.is_whitespace() => {
                if (c as u32) < 0x10000 {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                } else {
                    let _ = write!(out, "\\U{:08x}", c as u32);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `%q` of a byte string (invalid UTF-8 bytes as `\x..`).
pub fn quote_bytes(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => quote(s),
        Err(_) => {
            let mut out = String::from("\"");
            for chunk in bytes.utf8_chunks() {
                let inner = quote(chunk.valid());
                out.push_str(&inner[1..inner.len() - 1]);
                for b in chunk.invalid() {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
            out.push('"');
            out
        }
    }
}

/// Go's `%016x` of an `int64` (a lease ID): a negative value keeps its sign inside the width.
pub fn hex16(id: i64) -> String {
    if id < 0 {
        format!("-{:015x}", id.unsigned_abs())
    } else {
        format!("{id:016x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_int_hex_like_go() {
        assert_eq!(parse_int("1234abcd", 16), Ok(0x1234_abcd));
        assert_eq!(parse_int("7fffffffffffffff", 16), Ok(i64::MAX));
        assert_eq!(parse_int("-1", 16), Ok(-1));
        assert_eq!(parse_int("+A", 16), Ok(10));
        assert_eq!(
            parse_int("zz", 16),
            Err(r#"strconv.ParseInt: parsing "zz": invalid syntax"#.to_string())
        );
        assert_eq!(
            parse_int("0x10", 16),
            Err(r#"strconv.ParseInt: parsing "0x10": invalid syntax"#.to_string())
        );
        assert_eq!(
            parse_int("", 16),
            Err(r#"strconv.ParseInt: parsing "": invalid syntax"#.to_string())
        );
        assert_eq!(
            parse_int("ffffffffffffffff", 16),
            Err(r#"strconv.ParseInt: parsing "ffffffffffffffff": value out of range"#.to_string())
        );
        assert_eq!(
            parse_int("-", 16),
            Err(r#"strconv.ParseInt: parsing "-": invalid syntax"#.to_string())
        );
        assert_eq!(
            parse_int("1_0", 16),
            Err(r#"strconv.ParseInt: parsing "1_0": invalid syntax"#.to_string())
        );
    }

    #[test]
    fn parse_int_base_zero_and_ten() {
        assert_eq!(parse_int("0x10", 0), Ok(16));
        assert_eq!(parse_int("010", 0), Ok(8));
        assert_eq!(parse_int("0b11", 0), Ok(3));
        assert_eq!(parse_int("1_000", 0), Ok(1000));
        assert_eq!(parse_int("-9223372036854775808", 10), Ok(i64::MIN));
        assert!(parse_int("9223372036854775808", 10).is_err());
        assert!(parse_int("1__0", 0).is_err());
        assert_eq!(
            parse_int("abc", 10),
            Err(r#"strconv.ParseInt: parsing "abc": invalid syntax"#.to_string())
        );
    }

    #[test]
    fn parse_bool_like_go() {
        assert_eq!(parse_bool("T"), Ok(true));
        assert_eq!(parse_bool("0"), Ok(false));
        assert_eq!(
            parse_bool("maybe"),
            Err(r#"strconv.ParseBool: parsing "maybe": invalid syntax"#.to_string())
        );
    }

    #[test]
    fn parse_duration_like_go() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("-3s"), Ok(Duration::ZERO));
        assert_eq!(
            parse_duration("x"),
            Err(r#"time: invalid duration "x""#.to_string())
        );
        assert_eq!(
            parse_duration("1"),
            Err(r#"time: missing unit in duration "1""#.to_string())
        );
        assert_eq!(
            parse_duration("1q"),
            Err(r#"time: unknown unit "q" in duration "1q""#.to_string())
        );
        assert_eq!(
            parse_duration(""),
            Err(r#"time: invalid duration """#.to_string())
        );
    }

    #[test]
    fn quote_like_go() {
        assert_eq!(quote("a\"b\\c\n\u{1}é"), r#""a\"b\\c\n\x01é""#);
        assert_eq!(quote_bytes(b"a\xffb"), r#""a\xffb""#);
    }

    #[test]
    fn hex16_like_go() {
        assert_eq!(hex16(0x1234), "0000000000001234");
        assert_eq!(hex16(-1), "-000000000000001");
        assert_eq!(hex16(i64::MIN), "-8000000000000000");
    }
}
