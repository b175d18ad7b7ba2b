//! `expiry-lag`: how late sparse leases expire.

use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{RangeRequest, kv_client::KvClient, lease_client::LeaseClient};

use crate::{Report, Run, Workload, grant_with_key};

/// Expiry lag of sparse leases: `--total` leases granted one after another, `--gap-ms` apart,
/// one key each; each key is polled from its lease's deadline until it is gone. The latency
/// histogram is the lag from deadline to delete. Runs with one client.
#[derive(Args, Debug, Clone)]
pub struct ExpiryLag {
    #[arg(long, default_value_t = 2)]
    ttl_secs: i64,
    #[arg(long, default_value_t = 100)]
    gap_ms: u64,
    #[arg(long, default_value = "lag/")]
    prefix: String,
}

/// Grants leases one by one, `gap_ms` apart, each with one key, and measures for each the time
/// from its deadline (taken at the client: grant sent + TTL, an upper bound on the server's
/// deadline... so the lag is an upper bound too) to the first poll that finds its key gone. A key
/// gone before that deadline is an early expiry and counts as an error.
impl Workload for ExpiryLag {
    const NAME: &'static str = "expiry-lag";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        let (ttl_secs, gap_ms, prefix) = (self.ttl_secs, self.gap_ms, self.prefix.as_str());
        let channel = &run.channels[0];
        let mut lease = LeaseClient::new(channel.clone());
        let mut kv = KvClient::new(channel.clone());
        let ttl = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(0));
        let poll = Duration::from_millis(1);
        let started = Instant::now();
        // Keys with their deadlines, in deadline order.
        let mut pending: std::collections::VecDeque<(Vec<u8>, Instant)> = Default::default();
        let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
        let mut errors = 0;
        let mut next_grant = Instant::now();
        let mut granted = 0;
        let give_up = Instant::now() + run.timeout;
        while (granted < run.total || !pending.is_empty()) && Instant::now() < give_up {
            let now = Instant::now();
            if granted < run.total && now >= next_grant {
                let sent = Instant::now();
                let key = format!("{prefix}{granted:08}").into_bytes();
                grant_with_key(&mut lease, &mut kv, ttl_secs, key.clone()).await?;
                pending.push_back((key, sent + ttl));
                granted += 1;
                next_grant = sent + Duration::from_millis(gap_ms);
                continue;
            }
            if let Some((key, deadline)) = pending.front().cloned() {
                let resp = kv
                    .range(RangeRequest {
                        key,
                        count_only: true,
                        ..Default::default()
                    })
                    .await?;
                let gone = resp.into_inner().count == 0;
                let now = Instant::now();
                if gone {
                    if now < deadline {
                        errors += 1;
                    } else {
                        let _ = latency_us.record((now - deadline).as_micros() as u64);
                    }
                    pending.pop_front();
                    continue;
                }
            }
            tokio::time::sleep(poll).await;
        }
        errors += pending.len() as u64;
        Ok(Report {
            workload: Self::NAME,
            requests: latency_us.len(),
            errors,
            elapsed: started.elapsed(),
            latency_us,
            extra: serde_json::Map::new(),
        })
    }
}
