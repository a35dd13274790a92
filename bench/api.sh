#!/usr/bin/env bash
# Benchmarks of the daemon's HTTP API (server + Go client over loopback TCP)
# beside the same work in-process through the kit, in the same run, with
# medians, p50s and the issue's targets in one table.
#
#   bash bench/api.sh                  # from the repo root
#   BENCH_COUNT=10 bash bench/api.sh   # more rounds (default 5)
#
# Env: BENCH_COUNT (rounds, default 5), BENCH_TIME (-benchtime of the exec
# benchmark, default 2s), BENCH_FILE_TIME (of put/get, default 20x),
# BENCH_STREAM_TIME (of the 1 GiB stream, default 3x), BENCH_RAW (keep the
# raw `go test -bench` output at this path).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

benchtime=${BENCH_TIME:-2s}
filetime=${BENCH_FILE_TIME:-20x}
streamtime=${BENCH_STREAM_TIME:-3x}
. bench/lib.sh
bench_init 5 bench/api

# Rounds of -count 1, alternating which side goes first (see bench/run.sh).
for i in $(seq 1 "$count"); do
	first=$([ $((i % 2)) -eq 0 ] && echo BENCH_REMOTE_FIRST=1 || true)
	echo "round $i/$count${first:+ (api first)}" >&2
	bench_run '^BenchmarkExecTrue$' "$benchtime" "$first"
	bench_run '^(BenchmarkPutFile64MiB|BenchmarkGetFile64MiB)$' "$filetime" "$first"
	bench_run '^BenchmarkStream1GiB$' "$streamtime" "$first"
done
bench_finish "API benchmarks: $count rounds, -benchtime $benchtime (files $filetime, stream $streamtime), $(nproc) CPUs"
PYTHONPATH=bench python3 - "$raw" <<'PY'
import statistics, sys
from benchstats import parse, median, table

runs = parse(sys.argv[1])
def med(name, unit):
    return median(runs, name, unit)

# name, peer, target kind, target value, note
rows = [
    ("ExecTrue/api",            "ExecTrue/inprocess",     "p50add", 1e6, "exec /bin/true over HTTP, round trip"),
    ("ExecTrue/inprocess",      None,                     None, None,  "the same through the kit in-process"),
    ("Stream1GiB/api",          "Stream1GiB/inprocess",   "mbs", 300,  "exec_start 1 GiB of stdout over the WebSocket"),
    ("Stream1GiB/inprocess",    None,                     None, None,  "the same in-process"),
    ("PutFile64MiB/api",        "PutFile64MiB/inprocess", "mbs", 300,  "put_file 64 MiB ([]byte) over HTTP"),
    ("PutFile64MiB/api-stream", "PutFile64MiB/inprocess", "mbs", 300,  "the same streamed from a reader"),
    ("PutFile64MiB/inprocess",  None,                     None, None,  "put_file in-process"),
    ("GetFile64MiB/api",        "GetFile64MiB/inprocess", "mbs", 300,  "get_file 64 MiB ([]byte) over HTTP"),
    ("GetFile64MiB/api-stream", "GetFile64MiB/inprocess", "mbs", 300,  "the same streamed to io.Discard"),
    ("GetFile64MiB/inprocess",  None,                     None, None,  "get_file in-process"),
]

def fmt(v, scale=1, digits=0):
    return "-" if v is None else f"{v/scale:,.{digits}f}"

hdr = ("benchmark", "n", "median µs/op", "p50 µs", "p99 µs", "spread", "MB/s", "vs peer", "target", "met", "what")
out, verdicts = [], []
for name, peer, kind, tv, note in rows:
    vals = runs.get(name, {}).get("ns/op")
    if not vals:
        out.append((name, "0", "-", "-", "-", "-", "-", "-", "-", "MISSING", note))
        verdicts.append(False)
        continue
    ns = statistics.median(vals)
    spread = f"±{(max(vals) - min(vals)) / 2 / ns * 100:.0f}%"
    p50, p99, mbs = med(name, "p50-ns"), med(name, "p99-ns"), med(name, "MB/s")
    vs = target = met = "-"
    if peer:
        if kind == "p50add":
            pp = med(peer, "p50-ns")
            add = p50 - pp if p50 is not None and pp is not None else None
            vs = "-" if add is None else f"+{add/1000:,.0f} µs p50"
            target, ok = f"≤ peer + {tv/1e6:g} ms p50", add is not None and add <= tv
        else:
            pm = med(peer, "MB/s")
            vs = "-" if not pm or mbs is None else f"{mbs/pm:.2f}×"
            target, ok = f"≥ {tv:g} MB/s", mbs is not None and mbs >= tv
        met = "yes" if ok else "NO"
        verdicts.append(ok)
    out.append((name, str(len(vals)), fmt(ns, 1000), fmt(p50, 1000), fmt(p99, 1000), spread,
                fmt(mbs), vs, target, met, note))

table(hdr, out, {1, 2, 3, 4, 5, 6, 7})
print(f"\ntargets met: {sum(verdicts)}/{len(verdicts)}")
print("p50/p99: medians over the rounds of each round's per-op percentiles.  vs peer: the API's added p50")
print("latency, or its throughput against in-process.  MB/s: 10^6 bytes/s.")
PY
if [ -n "${BENCH_RAW:-}" ]; then echo "raw output: $raw"; fi
