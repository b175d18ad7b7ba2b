//! `leasehold bench`: load an etcd-compatible endpoint through the public v3 API and report
//! throughput and latency percentiles. It speaks only the wire protocol (our own generated
//! stubs), so the same run works against etcd and leasehold for side-by-side ratios.
//!
//! Every run is bounded: `--total` requests, and at most `--timeout-secs` of wall time.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use leasehold_api::etcdserverpb::{PutRequest, RangeRequest, kv_client::KvClient};
use tonic::transport::{Channel, Endpoint};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    workload: Workload,
    /// Comma-separated gRPC endpoints; connections are spread over them.
    #[arg(long, global = true, default_value = "http://127.0.0.1:2379")]
    endpoints: String,
    /// Number of gRPC connections.
    #[arg(long, global = true, default_value_t = 1)]
    conns: usize,
    /// Number of concurrent clients (each waits for its reply before sending again).
    #[arg(long, global = true, default_value_t = 1)]
    clients: usize,
    /// Total number of requests.
    #[arg(long, global = true, default_value_t = 10_000)]
    total: u64,
    /// Stop after this many seconds even if `--total` is not reached.
    #[arg(long, global = true, default_value_t = 300)]
    timeout_secs: u64,
    /// Output format.
    #[arg(short = 'w', long = "write-out", global = true, value_enum, default_value_t = Output::Simple)]
    write_out: Output,
    /// Allow endpoints that are not on loopback.
    #[arg(long, global = true)]
    allow_remote: bool,
}

#[derive(Subcommand, Debug, Clone)]
enum Workload {
    /// Puts of fixed-size values.
    Put {
        #[arg(long, default_value_t = 8)]
        key_size: usize,
        #[arg(long, default_value_t = 256)]
        val_size: usize,
        /// Number of distinct keys (random keys are drawn from this space).
        #[arg(long, default_value_t = 10_000)]
        key_space_size: u64,
        /// Use keys in sequence instead of spread over the key space.
        #[arg(long)]
        sequential_keys: bool,
    },
    /// Reads of one key.
    Range {
        #[arg(long, default_value = "bench-key")]
        key: String,
        /// `l` for linearizable, `s` for serializable.
        #[arg(long, default_value = "l")]
        consistency: String,
    },
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Simple,
    Json,
}

/// What one run measured.
#[derive(Debug)]
pub struct Report {
    pub workload: &'static str,
    pub requests: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub latency_us: Histogram<u64>,
}

impl Report {
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn ms(&self, quantile: f64) -> f64 {
        self.latency_us.value_at_quantile(quantile) as f64 / 1000.0
    }

    fn json(&self, args: &BenchArgs) -> serde_json::Value {
        serde_json::json!({
            "workload": self.workload,
            "clients": args.clients,
            "conns": args.conns,
            "requests": self.requests,
            "errors": self.errors,
            "duration_s": self.elapsed.as_secs_f64(),
            "throughput_per_s": self.throughput(),
            "p50_ms": self.ms(0.50),
            "p90_ms": self.ms(0.90),
            "p99_ms": self.ms(0.99),
            "p999_ms": self.ms(0.999),
            "max_ms": self.latency_us.max() as f64 / 1000.0,
        })
    }
}

/// Refuses non-loopback endpoints unless the user insists: a benchmark is a load test.
fn check_endpoints(endpoints: &[String], allow_remote: bool) -> anyhow::Result<()> {
    for e in endpoints {
        let host = e
            .trim_start_matches("http://")
            .rsplit_once(':')
            .map(|(h, _)| h.trim_matches(['[', ']']))
            .unwrap_or("");
        let loopback =
            host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback && !allow_remote {
            bail!("endpoint {e} is not on loopback; pass --allow-remote to load it anyway");
        }
    }
    Ok(())
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let report = execute(&args).await?;
    match args.write_out {
        Output::Json => println!("{}", report.json(&args)),
        Output::Simple => {
            println!("Summary ({}):", report.workload);
            println!(
                "  Requests:\t{} ({} errors)",
                report.requests, report.errors
            );
            println!("  Total:\t{:.4} secs.", report.elapsed.as_secs_f64());
            println!("  Requests/sec:\t{:.1}", report.throughput());
            for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)] {
                println!("  {name}:\t{:.3} ms", report.ms(q));
            }
            println!("  max:\t{:.3} ms", report.latency_us.max() as f64 / 1000.0);
        }
    }
    Ok(())
}

pub async fn execute(args: &BenchArgs) -> anyhow::Result<Report> {
    let endpoints: Vec<String> = args
        .endpoints
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    check_endpoints(&endpoints, args.allow_remote)?;
    if args.clients == 0 || args.conns == 0 {
        bail!("--clients and --conns must be at least 1");
    }
    let mut channels: Vec<Channel> = Vec::new();
    for i in 0..args.conns {
        let url = &endpoints[i % endpoints.len()];
        let ch = Endpoint::from_shared(url.clone())?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .with_context(|| format!("connect to {url}"))?;
        channels.push(ch);
    }
    let workload = args.workload.clone();
    if let Workload::Range { key, .. } = &workload {
        // Make sure there is something to read.
        KvClient::new(channels[0].clone())
            .put(PutRequest {
                key: key.clone().into_bytes(),
                value: vec![b'v'; 256],
                ..Default::default()
            })
            .await?;
    }
    let issued = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let mut kv = KvClient::new(channels[c % channels.len()].clone());
        let issued = issued.clone();
        let workload = workload.clone();
        let total = args.total;
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new(3).expect("valid sigfig");
            let mut errors = 0u64;
            let mut rng = (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            loop {
                let n = issued.fetch_add(1, Ordering::Relaxed);
                if n >= total || Instant::now() >= deadline {
                    break;
                }
                let t = Instant::now();
                let ok = match &workload {
                    Workload::Put {
                        key_size,
                        val_size,
                        key_space_size,
                        sequential_keys,
                    } => {
                        let k = if *sequential_keys {
                            n % key_space_size
                        } else {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            rng % key_space_size
                        };
                        let mut key = format!("{k:0width$}", width = *key_size).into_bytes();
                        key.truncate((*key_size).max(1));
                        kv.put(PutRequest {
                            key,
                            value: vec![b'x'; *val_size],
                            ..Default::default()
                        })
                        .await
                        .is_ok()
                    }
                    Workload::Range { key, consistency } => kv
                        .range(RangeRequest {
                            key: key.clone().into_bytes(),
                            serializable: consistency == "s",
                            ..Default::default()
                        })
                        .await
                        .is_ok(),
                };
                if ok {
                    let _ = hist.record(t.elapsed().as_micros() as u64);
                } else {
                    errors += 1;
                }
            }
            (hist, errors)
        }));
    }
    let mut latency_us = Histogram::<u64>::new(3).expect("valid sigfig");
    let mut errors = 0;
    for t in tasks {
        let (h, e) = t.await?;
        latency_us.add(h)?;
        errors += e;
    }
    let elapsed = start.elapsed();
    Ok(Report {
        workload: match workload {
            Workload::Put { .. } => "put",
            Workload::Range { .. } => "range",
        },
        requests: latency_us.len(),
        errors,
        elapsed,
        latency_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_without_the_flag() {
        let e = |s: &str| vec![s.to_string()];
        assert!(check_endpoints(&e("http://127.0.0.1:2379"), false).is_ok());
        assert!(check_endpoints(&e("http://localhost:2379"), false).is_ok());
        assert!(check_endpoints(&e("http://[::1]:2379"), false).is_ok());
        assert!(check_endpoints(&e("http://10.0.0.1:2379"), false).is_err());
        assert!(check_endpoints(&e("http://10.0.0.1:2379"), true).is_ok());
    }

    #[test]
    fn percentiles_come_from_the_samples() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let r = Report {
            workload: "put",
            requests: 1000,
            errors: 0,
            elapsed: Duration::from_secs(2),
            latency_us: h,
        };
        assert!((r.ms(0.5) - 500.0).abs() < 1.0);
        assert!((r.ms(0.99) - 990.0).abs() < 1.0);
        assert!((r.throughput() - 500.0).abs() < 1e-9);
    }
}
