//! The process's log: what is logged (`LEASEHOLD_LOG`, a `tracing` filter, when set; else
//! `--log-level`), how it is written (`--log-format`: etcd's JSON lines, `zap_json.rs`, or lines
//! for people) and where it goes (`--log-outputs`: stderr, stdout, files appended to; every line
//! to each).

mod zap_json;

use std::fs::File;
use std::io::{IsTerminal as _, Write};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use leasehold_node::{LogFormat, LogLevel, LogTarget};
use tracing_subscriber::fmt::MakeWriter;

/// The environment variable whose `tracing` filter wins over `--log-level`.
pub const FILTER_VAR: &str = "LEASEHOLD_LOG";

/// Sets up the process's logging. `level` is `--log-level` (`None` for the commands without
/// server flags: `bench`, `cluster`).
pub fn init(
    level: Option<LogLevel>,
    format: LogFormat,
    targets: &[LogTarget],
) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env(FILTER_VAR)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter(level)));
    let outputs = Outputs::open(targets)?;
    let builder = tracing_subscriber::fmt()
        .with_writer(outputs.clone())
        .with_env_filter(filter);
    match format {
        LogFormat::Json => builder.event_format(zap_json::ZapJson).init(),
        LogFormat::Console => builder.with_ansi(outputs.all_terminals()).init(),
    }
    Ok(())
}

/// The filter for `--log-level`.
fn default_filter(level: Option<LogLevel>) -> String {
    level.unwrap_or(LogLevel::Info).tracing_level().to_owned()
}

enum Output {
    Stderr,
    Stdout,
    File(Mutex<File>),
}

/// Every `--log-outputs` target; each log line is written to all of them.
#[derive(Clone)]
struct Outputs(Arc<Vec<Output>>);

impl Outputs {
    fn open(targets: &[LogTarget]) -> anyhow::Result<Outputs> {
        let mut outputs = Vec::new();
        for target in targets {
            outputs.push(match target {
                LogTarget::Stderr => Output::Stderr,
                LogTarget::Stdout => Output::Stdout,
                LogTarget::File(path) => {
                    let file = File::options()
                        .create(true)
                        .append(true)
                        .open(path)
                        .with_context(|| format!("--log-outputs: open {}", path.display()))?;
                    Output::File(Mutex::new(file))
                }
            });
        }
        Ok(Outputs(Arc::new(outputs)))
    }

    /// Colours only when every target is a terminal (never in files or the journal).
    fn all_terminals(&self) -> bool {
        self.0.iter().all(|o| match o {
            Output::Stderr => std::io::stderr().is_terminal(),
            Output::Stdout => std::io::stdout().is_terminal(),
            Output::File(_) => false,
        })
    }
}

impl<'a> MakeWriter<'a> for Outputs {
    type Writer = Outputs;

    fn make_writer(&'a self) -> Outputs {
        self.clone()
    }
}

impl Write for Outputs {
    /// tracing's formatter writes each line with one call; a target that fails does not keep
    /// the line from the others.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut result = Ok(());
        for output in self.0.iter() {
            let written = match output {
                Output::Stderr => std::io::stderr().write_all(buf),
                Output::Stdout => std::io::stdout().write_all(buf),
                Output::File(file) => match file.lock() {
                    Ok(mut file) => file.write_all(buf),
                    Err(_) => Ok(()),
                },
            };
            result = result.and(written);
        }
        result.map(|()| buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_level_picks_the_filter() {
        assert_eq!(default_filter(None), "info");
        assert_eq!(default_filter(Some(LogLevel::Debug)), "debug");
        assert_eq!(default_filter(Some(LogLevel::Warn)), "warn");
        assert_eq!(default_filter(Some(LogLevel::Fatal)), "error");
    }

    #[test]
    fn every_line_goes_to_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.log"), dir.path().join("b.log"));
        std::fs::write(&a, "before\n").unwrap();
        let mut outputs =
            Outputs::open(&[LogTarget::File(a.clone()), LogTarget::File(b.clone())]).unwrap();
        assert!(!outputs.all_terminals());
        outputs.write_all(b"line\n").unwrap();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "before\nline\n");
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "line\n");
        assert!(Outputs::open(&[LogTarget::File(dir.path().join("no/such/dir"))]).is_err());
    }
}
