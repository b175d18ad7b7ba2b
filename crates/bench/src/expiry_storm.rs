//! `expiry-storm`: many leases expiring at once, and how fast the server revokes them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{
    WatchCreateRequest, kv_client::KvClient, lease_client::LeaseClient, watch_create_request,
};

use crate::{Report, Run, Workload, grant_with_key, open_watch};

/// Mass expiry: `--total` leases with one key each and the same TTL, granted by `--clients` at
/// once, while a watch on the prefix time-stamps every delete; the latency histogram is the lag
/// from each key's deadline to its delete.
#[derive(Args, Debug, Clone)]
pub struct ExpiryStorm {
    #[arg(long, default_value_t = 3)]
    ttl_secs: i64,
    /// The keys' common prefix (not empty: the storm watches exactly this prefix).
    #[arg(long, default_value = "storm/", value_parser = crate::non_empty)]
    prefix: String,
    /// Give each lease `--ttl-secs` minus the whole seconds the grants have taken so far, so
    /// that every deadline falls in the same second however long granting takes: the
    /// deletes/s figure is then the server's revoke rate, not the grant rate.
    #[arg(long)]
    aligned: bool,
}

/// Grants `--total` leases of `ttl_secs` with one key each while a watch on the prefix
/// time-stamps every DELETE. A key's deadline is taken at the client: its grant was sent, plus the
/// TTL (the server's deadline is no earlier), so a delete before it is an early expiry (a
/// correctness failure) and the lag is an upper bound.
impl Workload for ExpiryStorm {
    const NAME: &'static str = "expiry-storm";

    async fn run(&self, run: &Run) -> anyhow::Result<Report> {
        let (ttl_secs, prefix, aligned) = (self.ttl_secs, self.prefix.as_str(), self.aligned);
        let channels = &run.channels;
        let total = run.total;
        let end = leasehold_types::prefix_range_end(prefix.as_bytes());
        // The watch first, so that no delete can be missed.
        let create = WatchCreateRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: end,
            filters: vec![watch_create_request::FilterType::Noput as i32],
            ..Default::default()
        };
        let (watch_tx, mut events) = open_watch(channels[0].clone(), create).await?;
        let give_up = run.timeout.min(Duration::from_secs(300));
        let deletes = tokio::spawn(async move {
            let _keep_open = watch_tx;
            let mut seen: Vec<(Vec<u8>, Instant)> = Vec::new();
            let stop = Instant::now() + give_up;
            while (seen.len() as u64) < total {
                let left = stop.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, events.message()).await {
                    Ok(Ok(Some(resp))) => {
                        let now = Instant::now();
                        seen.extend(
                            resp.events
                                .into_iter()
                                .filter_map(|e| e.kv)
                                .map(|kv| (kv.key, now)),
                        );
                    }
                    _ => break,
                }
            }
            seen
        });
        // Each key's deadline as the client sees it: its grant sent + its TTL (the server's is no
        // earlier).
        let deadlines = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let issued = Arc::new(AtomicU64::new(0));
        let first_sent = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..run.clients {
            let channel = channels[c % channels.len()].clone();
            let issued = issued.clone();
            let deadlines = deadlines.clone();
            let prefix = prefix.to_owned();
            tasks.push(tokio::spawn(async move {
                let mut lease = LeaseClient::new(channel.clone());
                let mut kv = KvClient::new(channel);
                loop {
                    let n = issued.fetch_add(1, Ordering::Relaxed);
                    if n >= total {
                        return Ok::<_, tonic::Status>(());
                    }
                    let key = format!("{prefix}{n:08}").into_bytes();
                    let sent = Instant::now();
                    let ttl_secs = if aligned {
                        let taken = i64::try_from(sent.duration_since(first_sent).as_secs())
                            .unwrap_or(i64::MAX);
                        ttl_secs.saturating_sub(taken)
                    } else {
                        ttl_secs
                    };
                    if ttl_secs < 2 {
                        return Err(tonic::Status::deadline_exceeded(
                            "--aligned: granting took longer than --ttl-secs allows",
                        ));
                    }
                    let ttl = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(0));
                    deadlines
                        .lock()
                        .expect("not poisoned")
                        .insert(key.clone(), sent + ttl);
                    grant_with_key(&mut lease, &mut kv, ttl_secs, key).await?;
                }
            }));
        }
        let grants = async {
            for t in tasks {
                t.await??;
            }
            Ok::<(), anyhow::Error>(())
        };
        tokio::time::timeout(run.timeout, grants).await??;
        let last_granted = Instant::now();
        let seen = deletes.await?;
        let deadlines = deadlines.lock().expect("not poisoned");
        let earliest_deadline = deadlines.values().min().copied().unwrap_or(first_sent);
        let latest_deadline = deadlines.values().max().copied().unwrap_or(last_granted);
        let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
        let mut early = 0u64;
        let mut early_by_max = Duration::ZERO;
        for (key, at) in &seen {
            let deadline = deadlines.get(key).copied().unwrap_or(first_sent);
            match at.checked_duration_since(deadline) {
                Some(lag) => {
                    let _ = latency_us.record(lag.as_micros() as u64);
                }
                None => {
                    early += 1;
                    early_by_max = early_by_max.max(deadline - *at);
                }
            }
        }
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let signed_ms =
            |a: Option<Instant>, b: Instant| a.map(|a| if a >= b { ms(a - b) } else { -ms(b - a) });
        let first_delete = seen.iter().map(|(_, t)| *t).min();
        let last_delete = seen.iter().map(|(_, t)| *t).max();
        let all_deleted = seen.len() as u64 == total;
        let mut extra = serde_json::Map::new();
        extra.insert("leases".into(), total.into());
        extra.insert("ttl_s".into(), ttl_secs.into());
        extra.insert("aligned".into(), aligned.into());
        extra.insert(
            "deadline_span_ms".into(),
            ms(latest_deadline.saturating_duration_since(earliest_deadline)).into(),
        );
        extra.insert(
            "grant_phase_s".into(),
            (last_granted - first_sent).as_secs_f64().into(),
        );
        extra.insert(
            "first_delete_after_earliest_deadline_ms".into(),
            signed_ms(first_delete, earliest_deadline).into(),
        );
        extra.insert(
            "last_delete_after_latest_deadline_ms".into(),
            signed_ms(last_delete, latest_deadline).into(),
        );
        extra.insert("all_deleted".into(), all_deleted.into());
        extra.insert("early_deletes".into(), early.into());
        extra.insert("early_by_ms_max".into(), ms(early_by_max).into());
        if let (Some(a), Some(b)) = (first_delete, last_delete) {
            let span = (b - a).as_secs_f64().max(1e-3);
            extra.insert("deletes_per_s".into(), (seen.len() as f64 / span).into());
        }
        Ok(Report {
            workload: Self::NAME,
            requests: latency_us.len(),
            errors: total - seen.len() as u64 + early,
            elapsed: last_granted - first_sent,
            latency_us,
            extra,
        })
    }
}
