"""Prints the comparison tables of scripts/bench-compare*.sh from their results file.

    python3 scripts/lib/bench_table.py RESULTS.jsonl TITLE

Each line of RESULTS is {"round", "target", "args", "result"}, result being one
`leasehold bench -w json` line. Targets: etcd (3.4), etcd37, leasehold_before and leasehold; a ratio
leasehold/X is printed for every other target present.
"""
import json
import statistics
import sys

NAMES = {"etcd": "etcd 3.4", "etcd37": "etcd 3.7", "leasehold_before": "leasehold before",
         "leasehold": "leasehold"}


def main(path, title):
    rows = [json.loads(line) for line in open(path)]
    present = [t for t in NAMES if any(r["target"] == t for r in rows)]
    others = [t for t in present if t != "leasehold"] if "leasehold" in present else []

    def med(args, target, key):
        return statistics.median(
            r["result"][key] for r in rows if r["args"] == args and r["target"] == target)

    def lost(args, target):
        return sum(r["result"].get("leases_lost", 0)
                   for r in rows if r["args"] == args and r["target"] == target)

    head = [title] + [f"{NAMES[t]} req/s (median)" for t in present]
    head += [f"leasehold/{NAMES[t]}" for t in others]
    head += [f"{NAMES[t]} p99 ms" for t in present] + [f"{NAMES[t]} leases lost" for t in present]
    print("\n| " + " | ".join(head) + " |")
    print("|---" + "|---:" * (len(head) - 1) + "|")
    for args in dict.fromkeys(r["args"] for r in rows):
        cells = [args] + [f"{med(args, t, 'throughput_per_s'):.0f}" for t in present]
        cells += [f"{med(args, 'leasehold', 'throughput_per_s') / med(args, t, 'throughput_per_s'):.2f}"
                  for t in others]
        cells += [f"{med(args, t, 'p99_ms'):.2f}" for t in present]
        cells += [str(lost(args, t)) for t in present]
        print("| " + " | ".join(cells) + " |")

    storms = [r for r in rows if r["result"]["workload"] == "expiry-storm"]
    if storms:
        print("\n| expiry-storm | target | lag p50 ms | lag p99 ms | last delete after the last "
              "deadline (ms) | first delete after the first deadline (ms) | deletes/s | early deletes "
              "| all deleted |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---|")
        nan = float("nan")
        for r in storms:
            x = r["result"]
            print(f"| round {r['round']} | {NAMES[r['target']]} | {x.get('p50_ms', nan):.1f} "
                  f"| {x.get('p99_ms', nan):.1f} "
                  f"| {x.get('last_delete_after_latest_deadline_ms') or nan:.0f} "
                  f"| {x.get('first_delete_after_earliest_deadline_ms') or nan:.0f} "
                  f"| {x.get('deletes_per_s', 0):.0f} | {x['early_deletes']} | {x['all_deleted']} |")

    stalls = [r for r in rows if r["result"]["workload"] == "put-during-list"]
    if stalls:
        print("\n| put-during-list (medians over rounds) | puts in the run | put p99 ms "
              "| put p99.9 ms | slowest put ms (worst round) | full reads | full read p50 ms |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for t in present:
            mine = [r["result"] for r in stalls if r["target"] == t]
            if not mine:
                continue

            def m(key):
                return statistics.median(x[key] for x in mine)
            print(f"| {NAMES[t]} | {m('requests'):.0f} | {m('p99_ms'):.1f} | {m('p999_ms'):.1f} "
                  f"| {max(x['max_ms'] for x in mine):.0f} | {m('full_reads'):.0f} "
                  f"| {m('full_read_p50_ms'):.0f} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
