#!/usr/bin/env bash
# An MCP tool call that runs /bin/true beside the daemon's own exec round
# trip, in the same run: the official Go SDK's client calling the tool
# "run" over Streamable HTTP (the daemon's /mcp) and over stdio ("tai42 mcp"
# on the daemon), and the daemon's Go client's exec (the peer), on the host
# provider, with the issue's targets in one table.
#
#   bash bench/mcp.sh                  # from the repo root
#   BENCH_COUNT=10 bash bench/mcp.sh   # more rounds (default 5)
#
# Env: BENCH_COUNT (rounds, default 5), BENCH_TIME (-benchtime, default
# 3000x), BENCH_RAW (keep the raw `go test -bench` output at this path).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

benchtime=${BENCH_TIME:-3000x}
. bench/lib.sh
bench_init 5 bench/mcp

# Rounds of -count 1, rotating which side goes first.
for i in $(seq 1 "$count"); do
	echo "round $i/$count" >&2
	bench_run '^BenchmarkToolCallTrue$' "$benchtime" "BENCH_ROTATE=$((i % 3))"
done
bench_finish "MCP benchmarks: $count rounds, -benchtime $benchtime, $(nproc) CPUs"
PYTHONPATH=bench python3 - "$raw" <<'PY'
import statistics, sys
from benchstats import parse, median, table

runs = parse(sys.argv[1])
peer = "ToolCallTrue/exec-api"
# name, the target's added p50 over the peer in ns, what
rows = [
    (peer, None, "the daemon's exec of /bin/true, round trip (Go client over HTTP): the peer"),
    ("ToolCallTrue/mcp-http", 1e6, "the tool run of /bin/true over Streamable HTTP (/mcp)"),
    ("ToolCallTrue/mcp-stdio", 0.5e6, "the same over stdio (tai42 mcp, on the daemon)"),
]
hdr = ("benchmark", "n", "p50 µs", "p99 µs", "spread", "vs peer", "target", "met", "what")
out, verdicts = [], []
pp = median(runs, peer, "p50-ns")
for name, tv, note in rows:
    vals = runs.get(name, {}).get("p50-ns")
    if not vals:
        out.append((name, "0", "-", "-", "-", "-", "-", "MISSING", note))
        verdicts.append(False)
        continue
    p50, p99 = median(runs, name, "p50-ns"), median(runs, name, "p99-ns")
    spread = f"±{(max(vals) - min(vals)) / 2 / p50 * 100:.0f}%"
    vs = target = met = "-"
    if tv is not None:
        add = p50 - pp
        vs = f"+{add/1000:,.0f} µs"
        ok = add <= tv
        target, met = f"≤ peer + {tv/1e6:g} ms", "yes" if ok else "NO"
        verdicts.append(ok)
    out.append((name, str(len(vals)), f"{p50/1000:,.0f}", f"{p99/1000:,.0f}", spread, vs, target, met, note))
table(hdr, out, {1, 2, 3, 4, 5})
print(f"\ntargets met: {sum(verdicts)}/{len(verdicts)}")
print("p50/p99: medians over the rounds of each round's per-call percentiles; vs peer: the added p50.")
PY
if [ -n "${BENCH_RAW:-}" ]; then echo "raw output: $raw"; fi
