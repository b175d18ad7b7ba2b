//! The few pieces of Go's standard library whose exact behaviour and error text etcd and etcdctl
//! show their users: `strconv.ParseInt`/`ParseBool`, `time.ParseDuration`, `strconv.Quote`
//! (`%q`) and `%x` of an `int64`. etcdctl prints their errors verbatim (`bad lease ID
//! (strconv.ParseInt: parsing "zz": invalid syntax), expecting ID in Hex`), and etcd's flags
//! take what they take, so ours must read and answer the same. The one copy for the server's
//! flags and the client commands; `testdata/go-answers` holds Go's own answers, checked below.

use std::fmt::Write as _;

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

/// Go's `time.ParseDuration`: the signed nanoseconds, or Go's error text. Negative durations
/// are valid; what a negative one means is the caller's to decide.
///
/// Each part is `[digits][.digits]unit`; the whole part must fit in 2^63 nanoseconds, while
/// fraction digits past what fits are read and ignored, and the fraction is scaled in
/// floating point, as Go does, so that `1.000000000999s` is exactly one second here too.
pub fn parse_duration(s: &str) -> Result<i64, String> {
    const LIMIT: u64 = 1 << 63;
    let invalid = || format!("time: invalid duration {}", time_quote(s));
    let bytes = s.as_bytes();
    let (negative, mut at) = match bytes.first() {
        Some(b'-') => (true, 1),
        Some(b'+') => (false, 1),
        _ => (false, 0),
    };
    if &s[at..] == "0" {
        return Ok(0);
    }
    if at == bytes.len() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    while at < bytes.len() {
        if !(bytes[at] == b'.' || bytes[at].is_ascii_digit()) {
            return Err(invalid());
        }
        // The whole part: any overflow past 2^63 is an invalid duration.
        let whole_from = at;
        let mut whole: u64 = 0;
        while at < bytes.len() && bytes[at].is_ascii_digit() {
            if whole > LIMIT / 10 {
                return Err(invalid());
            }
            whole = whole * 10 + u64::from(bytes[at] - b'0');
            if whole > LIMIT {
                return Err(invalid());
            }
            at += 1;
        }
        let had_whole = at > whole_from;
        // The fraction: digits kept while they fit, the rest skipped.
        let mut fraction: u64 = 0;
        let mut scale: f64 = 1.0;
        let mut had_fraction = false;
        if at < bytes.len() && bytes[at] == b'.' {
            at += 1;
            let fraction_from = at;
            let mut full = false;
            while at < bytes.len() && bytes[at].is_ascii_digit() {
                if !full {
                    let next = if fraction > (LIMIT - 1) / 10 {
                        None
                    } else {
                        Some(fraction * 10 + u64::from(bytes[at] - b'0'))
                    };
                    match next {
                        Some(next) if next <= LIMIT => {
                            fraction = next;
                            scale *= 10.0;
                        }
                        _ => full = true,
                    }
                }
                at += 1;
            }
            had_fraction = at > fraction_from;
        }
        if !had_whole && !had_fraction {
            return Err(invalid());
        }
        let unit_from = at;
        while at < bytes.len() && !(bytes[at] == b'.' || bytes[at].is_ascii_digit()) {
            at += 1;
        }
        let unit = &s[unit_from..at];
        let unit_nanos: u64 = match unit {
            "" => return Err(format!("time: missing unit in duration {}", time_quote(s))),
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => {
                return Err(format!(
                    "time: unknown unit {} in duration {}",
                    time_quote(unit),
                    time_quote(s)
                ));
            }
        };
        if whole > LIMIT / unit_nanos {
            return Err(invalid());
        }
        let mut part = whole * unit_nanos;
        if fraction > 0 {
            // Truncated toward zero, as Go converts a float to an integer.
            part += (fraction as f64 * (unit_nanos as f64 / scale)) as u64;
            if part > LIMIT {
                return Err(invalid());
            }
        }
        total += part;
        if total > LIMIT {
            return Err(invalid());
        }
    }
    if negative {
        return Ok((total as i64).wrapping_neg());
    }
    i64::try_from(total).map_err(|_| invalid())
}

/// How Go's `time` package quotes text in its errors (not `strconv.Quote`): every byte of a
/// non-ASCII or control character as `\xNN`, `"` and `\\` escaped, the rest as it is.
fn time_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if !c.is_ascii() || c < ' ' {
            let mut utf8 = [0u8; 4];
            for b in c.encode_utf8(&mut utf8).bytes() {
                let _ = write!(out, "\\x{b:02x}");
            }
        } else {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out.push('"');
    out
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

    /// Go's own answers (`testdata/go-answers/answers.txt`, printed by `main.go` there from
    /// `inputs.txt` with Go's `time.ParseDuration` and `strconv.ParseBool`).
    #[test]
    fn durations_and_bools_are_read_as_go_reads_them() {
        let answers = include_str!("../testdata/go-answers/answers.txt");
        let mut checked = 0;
        for line in answers.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            let [what, input, outcome, value] = fields[..] else {
                panic!("a line of four fields: {line:?}");
            };
            let input = go_unquote(input);
            match (what, outcome) {
                ("duration", "ok") => {
                    let want: i64 = value.parse().expect("nanoseconds");
                    assert_eq!(parse_duration(&input), Ok(want), "{input:?}");
                }
                ("duration", "err") => {
                    assert_eq!(parse_duration(&input), Err(go_unquote(value)), "{input:?}");
                }
                ("bool", "ok") => {
                    let want: bool = value.parse().expect("true or false");
                    assert_eq!(parse_bool(&input), Ok(want), "{input:?}");
                }
                ("bool", "err") => {
                    assert_eq!(parse_bool(&input), Err(go_unquote(value)), "{input:?}");
                }
                _ => panic!("unknown line {line:?}"),
            }
            checked += 1;
        }
        assert!(checked >= 150, "only {checked} answers");
    }

    /// Reads back what Go's `strconv.Quote` printed (the escapes it uses).
    fn go_unquote(quoted: &str) -> String {
        let inner = quoted
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .expect("a quoted string");
        let mut bytes = Vec::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                let mut utf8 = [0u8; 4];
                bytes.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
                continue;
            }
            match chars.next().expect("an escape") {
                '"' => bytes.push(b'"'),
                '\\' => bytes.push(b'\\'),
                'n' => bytes.push(b'\n'),
                't' => bytes.push(b'\t'),
                'x' => {
                    let hex: String = chars.by_ref().take(2).collect();
                    bytes.push(u8::from_str_radix(&hex, 16).expect("two hex digits"));
                }
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    let c = char::from_u32(u32::from_str_radix(&hex, 16).expect("hex"))
                        .expect("a char");
                    let mut utf8 = [0u8; 4];
                    bytes.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
                }
                other => panic!("an escape this table does not use: \\{other}"),
            }
        }
        String::from_utf8(bytes).expect("UTF-8")
    }

    #[test]
    fn the_time_packages_quoting_escapes_bytes_not_characters() {
        assert_eq!(time_quote("1\u{b5}"), r#""1\xc2\xb5""#);
        assert_eq!(time_quote("a\"b\\"), r#""a\"b\\""#);
        assert_eq!(time_quote("\u{0}\u{7f}"), "\"\\x00\u{7f}\"");
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
