//! The process's file descriptors, as etcd exports them (`os_fd_used`, `os_fd_limit`), read
//! from `/proc` at scrape time. Where `/proc` cannot be read, they are left out.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Debug)]
pub(super) struct ProcessCollector;

/// Open file descriptors: the entries of `/proc/self/fd`.
fn fds_used() -> Option<i64> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    i64::try_from(entries.count()).ok()
}

/// The soft limit on open files, from `/proc/self/limits`'s `Max open files` line.
fn fd_limit() -> Option<i64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_fd_limit(&limits)
}

fn parse_fd_limit(limits: &str) -> Option<i64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .strip_prefix("Max open files")?
        .split_whitespace()
        .next()?;
    match soft {
        "unlimited" => Some(i64::MAX),
        n => n.parse().ok(),
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let readings = [
            (
                "os_fd_used",
                "File descriptors this process has open",
                fds_used(),
            ),
            (
                "os_fd_limit",
                "The most file descriptors this process may open",
                fd_limit(),
            ),
        ];
        for (name, help, value) in readings {
            if let Some(value) = value {
                let gauge = ConstGauge::new(value);
                gauge.encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    gauge.metric_type(),
                )?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_read_from_the_limits_table() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_fd_limit(limits), Some(1024));
        assert_eq!(
            parse_fd_limit(
                "Max open files            unlimited            unlimited            files"
            ),
            Some(i64::MAX)
        );
        assert_eq!(parse_fd_limit("nothing here"), None);
        // This process's own, on Linux.
        if std::path::Path::new("/proc/self/fd").exists() {
            assert!(fds_used().is_some_and(|n| n > 0));
            assert!(fd_limit().is_some_and(|n| n > 0));
        }
    }
}
