//! `watch-latency`: how long a put takes to reach every watcher of its key.

use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{PutRequest, WatchCreateRequest, kv_client::KvClient};

use crate::{OP_TIMEOUT, Report, Run, Workload, open_watch};

/// Put-to-event latency: `--watchers` streams each watch one key; one writer puts it `--total`
/// times, `--interval-ms` apart; every event's delay from its put being sent is recorded.
#[derive(Args, Debug, Clone)]
pub struct WatchLatency {
    #[arg(long, default_value_t = 100)]
    watchers: usize,
    #[arg(long, default_value_t = 10)]
    interval_ms: u64,
    #[arg(long, default_value = "watch-bench")]
    key: String,
    /// Each watcher watches every key under `--key` (kube-apiserver watches a resource's
    /// prefix), not the key alone.
    #[arg(long)]
    prefix: bool,
}

/// Opens `watchers` watch streams on `key`, then puts it `--total` times; records for every
/// event the time from its put being sent to its arrival.
impl Workload for WatchLatency {
    const NAME: &'static str = "watch-latency";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        let (watchers, interval_ms, key) = (self.watchers, self.interval_ms, self.key.as_str());
        let channels = &run.channels;
        let total = run.total;
        let mut arrivals = Vec::new();
        for w in 0..watchers {
            let create = WatchCreateRequest {
                key: key.as_bytes().to_vec(),
                range_end: if self.prefix {
                    leasehold_types::prefix_range_end(key.as_bytes())
                } else {
                    Vec::new()
                },
                ..Default::default()
            };
            let (tx, mut stream) = open_watch(channels[w % channels.len()].clone(), create).await?;
            arrivals.push(tokio::spawn(async move {
                let _keep_open = tx;
                let mut seen: Vec<(i64, Instant)> = Vec::new();
                while (seen.len() as u64) < total {
                    match tokio::time::timeout(OP_TIMEOUT, stream.message()).await {
                        Ok(Ok(Some(resp))) => {
                            let now = Instant::now();
                            seen.extend(
                                resp.events
                                    .iter()
                                    .filter_map(|e| e.kv.as_ref())
                                    .map(|kv| (kv.mod_revision, now)),
                            );
                        }
                        _ => break,
                    }
                }
                seen
            }));
        }
        let mut kv = KvClient::new(channels[0].clone());
        let mut sent_at = std::collections::HashMap::new();
        let started = Instant::now();
        for n in 0..total {
            let t = Instant::now();
            let resp = kv
                .put(PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: n.to_string().into_bytes(),
                    ..Default::default()
                })
                .await?;
            let rev = resp.into_inner().header.map_or(0, |h| h.revision);
            sent_at.insert(rev, t);
            tokio::time::sleep(Duration::from_millis(interval_ms)).await;
        }
        let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
        let mut errors = 0u64;
        for a in arrivals {
            let seen = a.await?;
            errors += total.saturating_sub(seen.len() as u64);
            for (rev, at) in seen {
                match sent_at.get(&rev) {
                    Some(t) => {
                        let _ =
                            latency_us.record(at.saturating_duration_since(*t).as_micros() as u64);
                    }
                    None => errors += 1,
                }
            }
        }
        let mut extra = serde_json::Map::new();
        extra.insert("watchers".into(), watchers.into());
        extra.insert("events_expected".into(), (total * watchers as u64).into());
        Ok(Report {
            workload: Self::NAME,
            requests: latency_us.len(),
            errors,
            elapsed: started.elapsed(),
            latency_us,
            extra,
        })
    }
}
