//! `leasehold-sim`: runs seeds of the deterministic simulator (docs/testing.md).
//!
//! ```text
//! leasehold-sim --seeds 1..500          every seed in the range; "N passed, M failed"
//! leasehold-sim --seed 42 [--trace]     one seed, its trace hash (and its whole trace)
//! leasehold-sim --hours 2               new seeds until the time is up; failures kept
//! leasehold-sim --variant fresh-ttl     a known-bad build, to see the checkers catch it
//! leasehold-sim --kill-churn-timeouts 2 kill churn faster than docs/lease.md bounds leases under
//! ```

use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use leasehold_sim::{Options, Variant, rng::Rng, run};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut options = Options::default();
    let mut seeds: Vec<u64> = Vec::new();
    let mut hours: Option<f64> = None;
    let mut failed_file = String::from("target/sim-failures.txt");
    let mut i = 0;
    let value = |i: usize| args.get(i + 1).cloned().unwrap_or_default();
    while i < args.len() {
        match args[i].as_str() {
            "--seed" => seeds.push(value(i).parse().expect("--seed N")),
            "--seeds" => {
                let v = value(i);
                let (a, b) = v.split_once("..").expect("--seeds A..B");
                let (a, b): (u64, u64) = (a.parse().expect("A"), b.parse().expect("B"));
                seeds.extend(a..=b);
            }
            "--hours" => hours = Some(value(i).parse().expect("--hours H")),
            "--variant" => options.variant = value(i).parse::<Variant>().expect("--variant"),
            "--chaos-secs" => options.chaos_secs = value(i).parse().expect("--chaos-secs S"),
            "--kill-churn-timeouts" => {
                options.kill_churn_timeouts = value(i).parse().expect("--kill-churn-timeouts N")
            }
            "--failures-file" => failed_file = value(i),
            "--trace" => {
                options.full_trace = true;
                i += 1;
                continue;
            }
            other => {
                eprintln!("unknown argument {other:?}");
                return ExitCode::from(2);
            }
        }
        i += 2;
    }
    let started = Instant::now();
    let (mut passed, mut failed, mut simulated) = (0u64, 0u64, 0f64);
    let mut run_one = |seed: u64| {
        let outcome = run(seed, options);
        simulated += outcome.simulated_secs;
        if outcome.failures.is_empty() {
            passed += 1;
            if options.full_trace {
                for line in &outcome.trace {
                    println!("{line}");
                }
            }
            println!(
                "seed {seed}: ok, trace {:016x} ({})",
                outcome.trace_hash, outcome.stats
            );
        } else {
            failed += 1;
            println!("seed {seed}: FAILED, trace {:016x}", outcome.trace_hash);
            println!("  faults: {}", outcome.faults);
            for f in &outcome.failures {
                println!("  {f}");
            }
            println!("  the trace's last lines:");
            for line in &outcome.trace {
                println!("    {line}");
            }
            let churn = if options.kill_churn_timeouts == Options::default().kill_churn_timeouts {
                String::new()
            } else {
                format!(" --kill-churn-timeouts {}", options.kill_churn_timeouts)
            };
            println!(
                "  replay: cargo run --release -p leasehold-sim -- --seed {seed} --trace{churn}"
            );
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&failed_file)
            {
                let _ = writeln!(f, "{seed} {:?}", options.variant);
            }
        }
    };
    if let Some(hours) = hours {
        let until = started + Duration::from_secs_f64(hours * 3600.0);
        // New seeds each run, from the wall clock: only the choice of seeds, since each run is
        // a function of its seed, which a failure prints.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut seeder = Rng::new(u64::from(std::process::id()) ^ now);
        while Instant::now() < until {
            run_one(seeder.next_u64() >> 1);
        }
    } else {
        for seed in seeds {
            run_one(seed);
        }
    }
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{passed} passed, {failed} failed ({simulated:.0} simulated s in {wall:.1} s wall: {:.0}x real time)",
        simulated / wall.max(1e-9)
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
