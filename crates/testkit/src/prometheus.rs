//! A strict reader of the Prometheus text format (0.0.4), as etcd serves `/metrics`: it refuses
//! a line it cannot read instead of skipping it, so a test that parses a scrape proves the scrape
//! is well formed.

use std::collections::BTreeMap;

/// One sample line: `name{labels} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed scrape: every family's `# TYPE` and every sample, in order.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    pub types: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

impl Scrape {
    /// The sum of the samples named `name` whose labels include every pair of `labels` (so
    /// `&[]` sums a family over all its label sets); `None` if no sample matches.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|have| have == v))
            })
            .map(|s| s.value)
            .collect();
        (!matching.is_empty()).then(|| matching.iter().sum())
    }

    /// Like [`Scrape::value`], with 0 where no sample matches (a counter not yet created).
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or(0.0)
    }
}

/// Parses `text`; the error names the first line that is not in the format.
pub fn parse(text: &str) -> Result<Scrape, String> {
    let mut scrape = Scrape::default();
    for (n, line) in text.lines().enumerate() {
        let fail = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    if !is_name(name) {
                        return Err(fail("bad metric name"));
                    }
                    let known = ["counter", "gauge", "histogram", "summary", "untyped"];
                    if !known.contains(&kind) {
                        return Err(fail("unknown type"));
                    }
                    if scrape.types.insert(name.into(), kind.into()).is_some() {
                        return Err(fail("a second TYPE for one family"));
                    }
                    if scrape.samples.iter().any(|s| family_of(&s.name) == name) {
                        return Err(fail("TYPE after the family's samples"));
                    }
                }
                (Some("HELP"), Some(name), _) if !is_name(name) => {
                    return Err(fail("bad metric name"));
                }
                _ => {}
            }
            continue;
        }
        let sample = parse_sample(line).map_err(|why| fail(&why))?;
        // A family named like a suffixed sample (a gauge `x_count`) is its own family.
        let family = if scrape.types.contains_key(&sample.name) {
            sample.name.as_str()
        } else {
            family_of(&sample.name)
        };
        if let Some(kind) = scrape.types.get(family) {
            let suffix = &sample.name[family.len()..];
            let fits = match kind.as_str() {
                "histogram" => {
                    matches!(suffix, "_sum" | "_count")
                        || (suffix == "_bucket" && sample.labels.contains_key("le"))
                }
                "summary" => matches!(suffix, "" | "_sum" | "_count"),
                _ => suffix.is_empty(),
            };
            if !fits {
                return Err(fail("sample does not fit its family's type"));
            }
        }
        scrape.samples.push(sample);
    }
    Ok(scrape)
}

/// The family a sample belongs to: its name less a histogram's or summary's suffix.
fn family_of(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if !is_name(name) {
        return Err("bad metric name".into());
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            rest = rest.trim_start_matches(',');
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find("=\"").ok_or("label without =\"")?;
            let key = &rest[..eq];
            if !is_name(key) || key.contains(':') {
                return Err(format!("bad label name {key:?}"));
            }
            let mut value = String::new();
            let mut chars = rest[eq + 2..].char_indices();
            let end = loop {
                match chars.next() {
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c @ ('\\' | '"'))) => value.push(c),
                        _ => return Err("bad escape in a label value".into()),
                    },
                    Some((_, c)) => value.push(c),
                    None => return Err("unterminated label value".into()),
                }
            };
            if labels.insert(key.to_owned(), value).is_some() {
                return Err(format!("label {key:?} twice"));
            }
            rest = &rest[eq + 2 + end + 1..];
            if !rest.starts_with(',') && !rest.starts_with('}') {
                return Err("labels not separated by ','".into());
            }
        }
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().map_err(|_| format!("bad value {v:?}"))?,
    };
    if let Some(timestamp) = fields.next() {
        timestamp
            .parse::<i64>()
            .map_err(|_| format!("bad timestamp {timestamp:?}"))?;
    }
    if fields.next().is_some() {
        return Err("trailing fields".into());
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_families_labels_and_values() {
        let text = "# HELP a_total A counter.\n# TYPE a_total counter\n\
                    a_total{m=\"x\",c=\"OK\"} 3\na_total{m=\"y\",c=\"OK\"} 4\n\
                    # TYPE h histogram\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\n\
                    h_sum 1.5\nh_count 2\nodd{v=\"q\\\"\\\\\\n\"} +Inf 1700000000\n";
        let s = parse(text).unwrap();
        assert_eq!(s.types["a_total"], "counter");
        assert_eq!(s.types["h"], "histogram");
        assert_eq!(s.value("a_total", &[]), Some(7.0));
        assert_eq!(s.value("a_total", &[("m", "y")]), Some(4.0));
        assert_eq!(s.value("a_total", &[("m", "z")]), None);
        assert_eq!(s.count("a_total", &[("m", "z")]), 0.0);
        assert_eq!(s.value("h_count", &[]), Some(2.0));
        assert_eq!(s.samples.last().unwrap().labels["v"], "q\"\\\n");
    }

    #[test]
    fn refuses_what_is_not_the_format() {
        for bad in [
            "a b c d\n",
            "a{x=1} 2\n",
            "a{x=\"1\" 2\n",
            "a{x=\"1\"}\n",
            "a{x=\"1\",x=\"2\"} 1\n",
            "1a 2\n",
            "a 1e\n",
            "# TYPE a counter\n# TYPE a gauge\n",
            "# TYPE h histogram\nh_bucket 1\n",
            "# TYPE a counter\na_sum 1\n",
            "# TYPE a wibble\n",
            "a 1\n# TYPE a counter\n",
        ] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
    }
}
