//! `lease-memory`: what leases and their keys cost a server in resident memory. It grants
//! `--total` leases, reads the server's RSS, attaches one key to each, and reads it again. The
//! server must run on this machine: its RSS is read from `/proc/<--server-pid>/status`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{
    LeaseGrantRequest, PutRequest, kv_client::KvClient, lease_client::LeaseClient,
};
use tonic::transport::Channel;

use crate::{OP_TIMEOUT, Report, Run, Workload};

/// Leases and keys as a service registry holds them: `--total` leases of `--ttl-secs`, each with
/// one key of about 47 bytes (`--prefix` and a 10-digit number) and a 16-byte value.
#[derive(Args, Debug, Clone)]
pub struct LeaseMemory {
    /// The server process whose resident memory is read (it must run on this machine).
    #[arg(long)]
    server_pid: u32,
    #[arg(long, default_value_t = 3600)]
    ttl_secs: i64,
    #[arg(long, default_value = "registry/services/endpoints/instance-")]
    prefix: String,
    /// How long to wait after each phase before reading RSS (lets a garbage-collected server
    /// settle).
    #[arg(long, default_value_t = 3)]
    settle_secs: u64,
}

/// The number of concurrent requests per phase, at least: `--clients` may ask for more.
const CONCURRENCY_MIN: usize = 64;

impl Workload for LeaseMemory {
    const NAME: &'static str = "lease-memory";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        let started = Instant::now();
        let deadline = started + run.timeout;
        let n = run.total;
        let concurrency = run.clients.max(CONCURRENCY_MIN);
        let settle = Duration::from_secs(self.settle_secs);
        let mut latency = Histogram::new(3)?;
        tokio::time::sleep(settle).await;
        let rss_start = rss_bytes(self.server_pid)?;

        let ids = Arc::new(
            fan_out(&run.channels, n, concurrency, deadline, &mut latency, {
                let ttl = self.ttl_secs;
                move |channel, _| async move {
                    let granted = LeaseClient::new(channel)
                        .lease_grant(LeaseGrantRequest { ttl, id: 0 })
                        .await?;
                    Ok(granted.into_inner().id)
                }
            })
            .await?,
        );
        tokio::time::sleep(settle).await;
        let rss_leases = rss_bytes(self.server_pid)?;

        let prefix = self.prefix.clone();
        fan_out(&run.channels, n, concurrency, deadline, &mut latency, {
            let ids = ids.clone();
            move |channel, i| {
                let (key, lease) = (format!("{prefix}{i:010}").into_bytes(), ids[i as usize]);
                async move {
                    KvClient::new(channel)
                        .put(PutRequest {
                            key,
                            value: vec![b'v'; 16],
                            lease,
                            ..Default::default()
                        })
                        .await?;
                    Ok(lease)
                }
            }
        })
        .await?;
        let elapsed = started.elapsed();
        tokio::time::sleep(settle).await;
        let rss_keys = rss_bytes(self.server_pid)?;

        let per = |bytes: i64| bytes as f64 / n.max(1) as f64;
        let mut extra = serde_json::Map::new();
        for (name, value) in [
            ("rss_start_bytes", rss_start),
            ("rss_leases_bytes", rss_leases),
            ("rss_leases_and_keys_bytes", rss_keys),
        ] {
            extra.insert(name.into(), value.into());
        }
        extra.insert(
            "bytes_per_lease".into(),
            per(rss_leases as i64 - rss_start as i64).into(),
        );
        extra.insert(
            "bytes_per_key".into(),
            per(rss_keys as i64 - rss_leases as i64).into(),
        );
        // A few leases for the caller to look at again (after a restart, say): the first, the
        // middle and the last granted.
        let samples: Vec<i64> = [0, ids.len() / 2, ids.len().saturating_sub(1)]
            .iter()
            .filter_map(|&i| ids.get(i).copied())
            .collect();
        extra.insert("sample_leases".into(), samples.into());
        Ok(Report {
            workload: Self::NAME,
            requests: 2 * n,
            errors: 0,
            elapsed,
            latency_us: latency,
            extra,
        })
    }
}

/// Runs `request(channel, i)` for every `i` in `0..n`, `concurrency` at a time over `channels`,
/// and returns the results in `i` order. Any failed request fails the run: the figures are only
/// meaningful for the full count.
async fn fan_out<F, Fut>(
    channels: &[Channel],
    n: u64,
    concurrency: usize,
    deadline: Instant,
    latency: &mut Histogram<u64>,
    request: F,
) -> anyhow::Result<Vec<i64>>
where
    F: Fn(Channel, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<i64, tonic::Status>> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..concurrency.min(n as usize) {
        let channel = channels[w % channels.len()].clone();
        let (next, request) = (next.clone(), request.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut latency = Histogram::<u64>::new(3).expect("3 significant figures is valid");
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                anyhow::ensure!(Instant::now() < deadline, "--timeout-secs reached");
                let sent = Instant::now();
                let value = tokio::time::timeout(OP_TIMEOUT, request(channel.clone(), i))
                    .await
                    .context("a request timed out")??;
                latency.record(sent.elapsed().as_micros() as u64)?;
                done.push((i, value));
            }
            anyhow::Ok((done, latency))
        }));
    }
    let mut out = vec![0; n as usize];
    for task in tasks {
        let (done, part) = task.await??;
        latency.add(part)?;
        for (i, value) in done {
            out[i as usize] = value;
        }
    }
    Ok(out)
}

/// The resident set size of process `pid`, from `/proc/<pid>/status` (`VmRSS`, in kB).
fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    parse_vm_rss(&status).with_context(|| format!("no VmRSS line in {path}"))
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::parse_vm_rss;

    #[test]
    fn vm_rss_is_read_in_bytes() {
        let status = "Name:\tleasehold\nVmHWM:\t  99 kB\nVmRSS:\t   51200 kB\nRssAnon:\t 1 kB\n";
        assert_eq!(parse_vm_rss(status), Some(51_200 * 1024));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\t12 MB\n"), None);
    }
}
