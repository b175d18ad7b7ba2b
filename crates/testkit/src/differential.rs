//! Differential runs: one scenario against a fresh etcd and a fresh leasehold, recordings
//! compared.

use std::fmt::Write as _;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use etcd_client::Client;
use serde_json::{Value, json};

use crate::*;

// ---------------------------------------------------------------------------------------------
// Differential runs
// ---------------------------------------------------------------------------------------------

/// A scenario's future; it borrows the client and the recorder.
pub type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Runs `scenario` against a fresh etcd and a fresh leasehold and asserts that both recorded
/// the same steps. Write a scenario as
/// `|c, r| Box::pin(async move { r.record("put a", c.put("a", "1", None).await); })`.
pub async fn differential<F>(name: &str, scenario: F)
where
    F: for<'a> Fn(&'a mut Client, &'a mut Recorder) -> ScenarioFuture<'a>,
{
    let (etcd, leasehold) = tokio::join!(Etcd::start(), Leasehold::start());
    let expected = run_scenario(&etcd, &scenario).await;
    let actual = run_scenario(&leasehold, &scenario).await;
    assert_same_recordings(name, &etcd, &expected, &leasehold, &actual);
}

/// Runs `scenario` once against `server` and returns what it recorded.
pub async fn run_scenario<F>(server: &Server, scenario: &F) -> Recorder
where
    F: for<'a> Fn(&'a mut Client, &'a mut Recorder) -> ScenarioFuture<'a>,
{
    let mut client = server.client().await;
    let mut recorder = Recorder::default();
    if tokio::time::timeout(SCENARIO_TIMEOUT, scenario(&mut client, &mut recorder))
        .await
        .is_err()
    {
        server.fail(&format!(
            "scenario ran longer than {SCENARIO_TIMEOUT:?} (after {} steps)",
            recorder.steps.len()
        ));
    }
    recorder
}

/// Panics with a step-by-step diff unless both recordings are equal.
///
/// With `LEASEHOLD_DIFF_DUMP=<dir>`, both recordings are also written to
/// `<dir>/<name>.<label>.json`, to read what a scenario actually exercises.
pub fn assert_same_recordings(
    name: &str,
    expected_server: &Server,
    expected: &Recorder,
    actual_server: &Server,
    actual: &Recorder,
) {
    if let Some(dir) = std::env::var_os(DUMP_VAR) {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("create dump dir");
        for (server, recorder) in [(expected_server, expected), (actual_server, actual)] {
            let steps: Vec<Value> = recorder
                .steps
                .iter()
                .map(|(label, value)| json!({ "step": label, "result": value }))
                .collect();
            let path = dir.join(format!("{name}.{}.json", server.label()));
            let text = serde_json::to_string_pretty(&steps).expect("serialize");
            std::fs::write(&path, text).expect("write dump");
        }
    }
    let diff = diff_recordings(
        expected_server.label(),
        expected,
        actual_server.label(),
        actual,
    );
    if let Some(diff) = diff {
        panic!("differential `{name}` failed\n{diff}");
    }
}

/// `None` when equal; otherwise a readable report of every differing step.
pub fn diff_recordings(
    expected_name: &str,
    expected: &Recorder,
    actual_name: &str,
    actual: &Recorder,
) -> Option<String> {
    let steps_len = expected.steps.len().max(actual.steps.len());
    let mut report = String::new();
    let mut differing = 0usize;
    for index in 0..steps_len {
        let left = expected.steps.get(index);
        let right = actual.steps.get(index);
        if left == right {
            continue;
        }
        differing += 1;
        let label = left.or(right).map_or("", |(label, _)| label.as_str());
        let _ = writeln!(report, "\n=== step {index} `{label}` ===");
        if let (Some((l, _)), Some((r, _))) = (left, right)
            && l != r
        {
            let _ = writeln!(
                report,
                "labels differ: `{l}` vs `{r}` (scenario not deterministic?)"
            );
        }
        let render = |step: Option<&(String, Value)>| match step {
            Some((_, value)) => serde_json::to_string_pretty(value).expect("serialize"),
            None => String::from("<no such step>"),
        };
        report.push_str(&line_diff(&render(left), &render(right)));
    }
    if differing == 0 {
        return None;
    }
    Some(format!(
        "{differing} of {steps_len} steps differ ({} steps from {expected_name}, {} from \
         {actual_name}); lines: `-` {expected_name} only, `+` {actual_name} only, ` ` both{report}",
        expected.steps.len(),
        actual.steps.len()
    ))
}

/// A line diff by longest common subsequence; inputs are a few hundred lines at most.
pub(crate) fn line_diff(left: &str, right: &str) -> String {
    let a: Vec<&str> = left.lines().collect();
    let b: Vec<&str> = right.lines().collect();
    // lcs[i][j] = length of the LCS of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut out = String::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(out, "  {}", a[i]);
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            let _ = writeln!(out, "- {}", a[i]);
            i += 1;
        } else {
            let _ = writeln!(out, "+ {}", b[j]);
            j += 1;
        }
    }
    out
}
