#!/usr/bin/env bash
# Benchmarks of the host runner against bare os/exec and os file I/O, with
# medians, kit/bare ratios and the issue's targets in one table.
#
#   bash bench/run.sh                  # from the repo root
#   BENCH_COUNT=10 bash bench/run.sh   # more rounds (default 6)
#
# Env: BENCH_COUNT (rounds, default 6), BENCH_TIME (-benchtime of the exec
# and create benchmarks, default 1s), BENCH_FILE_TIME (of put/get, default
# 30x), BENCH_STREAM_TIME (of the 1 GiB stream, default 3x), BENCH_RAW (keep
# the raw `go test -bench` output, benchstat input, at this path).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

benchtime=${BENCH_TIME:-1s}
filetime=${BENCH_FILE_TIME:-30x}
streamtime=${BENCH_STREAM_TIME:-3x}
. bench/lib.sh
bench_init 6 provider/host

short='^(BenchmarkExecTrue|BenchmarkExecTrueParallel|BenchmarkCreateDestroy)$'
# A fixed count for the file and stream benchmarks: their per-op time swings
# with the kernel's writeback, and a time-based -benchtime would then run
# kit and bare for different numbers of ops, catching different swings.
files='^(BenchmarkPutFile64MiB|BenchmarkGetFile64MiB)$'
stream='^BenchmarkStream1GiB$'

# Rounds of -count 1 instead of one -count N: every round runs kit and bare
# side by side, so load from other work on the machine hits both alike, and
# every other round runs the bare peers first, so neither side always pays
# for going first.
for i in $(seq 1 "$count"); do
	first=$([ $((i % 2)) -eq 0 ] && echo BENCH_BARE_FIRST=1 || true)
	echo "round $i/$count${first:+ (bare first)}" >&2
	bench_run "$short" "$benchtime" "$first"
	bench_run "$files" "$filetime" "$first"
	bench_run "$stream" "$streamtime" "$first"
done
bench_finish "host runner benchmarks: $count rounds, -benchtime $benchtime (files $filetime, stream $streamtime), $(nproc) CPUs, GOMAXPROCS ${GOMAXPROCS:-$(nproc)}"
PYTHONPATH=bench python3 - "$raw" <<'PY'
import statistics, sys
from benchstats import parse, median, table

runs = parse(sys.argv[1])
def med(name, unit):
    return median(runs, name, unit)

# name, peer (for kit/bare), target kind, target value, note
rows = [
    ("ExecTrue/kit",             "ExecTrue/bare",         "ratio", 1.3, "exec /bin/true, host network"),
    ("ExecTrue/kit-netns-none",  "ExecTrue/bare",         None,  None,   "same, in a network namespace"),
    ("ExecTrue/bare",            None,                    None,  None,   "os/exec, output discarded"),
    ("ExecTrue/bare-captured",   None,                    None,  None,   "os/exec, output captured (pipes)"),
    ("ExecTrueParallel/kit",     "ExecTrueParallel/bare", "ratio", 1.3, "32 concurrent, one session"),
    ("ExecTrueParallel/bare",    None,                    None,  None,   "32 concurrent os/exec"),
    ("CreateDestroy/egress",     "CreateDestroy/bare-mkdir", "ns", 1e6, "create + destroy"),
    ("CreateDestroy/none",       "CreateDestroy/bare-mkdir", "ns", 1e6, "same, with a network namespace"),
    ("CreateDestroy/bare-mkdir", None,                    None,  None,   "its mkdir/rmdir alone"),
    ("Stream1GiB/kit",           "Stream1GiB/bare",       "mbs", 1000,  "exec_start, 1 GiB of stdout"),
    ("Stream1GiB/bare",          None,                    None,  None,   "os/exec pipe into io.Discard"),
    ("PutFile64MiB/kit",         "PutFile64MiB/bare",     "mbs", 1000,  "put_file 64 MiB"),
    ("PutFile64MiB/bare",        None,                    None,  None,   "os.WriteFile"),
    ("GetFile64MiB/kit",         "GetFile64MiB/bare",     "mbs", 1000,  "get_file 64 MiB"),
    ("GetFile64MiB/bare",        None,                    None,  None,   "os.ReadFile"),
]

def fmt_ns(v):
    return "-" if v is None else f"{v:,.0f}"

hdr = ("benchmark", "n", "median ns/op", "spread", "MB/s", "kit/bare", "target", "met", "what")
out = []
verdicts = []
for name, peer, kind, tv, note in rows:
    vals = runs.get(name, {}).get("ns/op")
    if not vals:
        out.append((name, "0", "-", "-", "-", "-", "-", "MISSING", note))
        verdicts.append(False)
        continue
    ns = statistics.median(vals)
    spread = f"±{(max(vals) - min(vals)) / 2 / ns * 100:.0f}%"
    mbs = med(name, "MB/s")
    pns = med(peer, "ns/op") if peer else None
    ratio = ns / pns if pns else None
    target = met = "-"
    if kind == "ratio":
        target, ok = f"≤ {tv}× bare", ratio is not None and ratio <= tv
    elif kind == "ns":
        target, ok = f"≤ {tv/1e6:g} ms", ns <= tv
    elif kind == "mbs":
        target, ok = f"≥ {tv/1000:g} GB/s", mbs is not None and mbs >= tv
    if kind:
        met = "yes" if ok else "NO"
        verdicts.append(ok)
    out.append((name, str(len(vals)), fmt_ns(ns), spread,
                "-" if mbs is None else f"{mbs:,.0f}",
                "-" if ratio is None else f"{ratio:.3f}×",
                target, met, note))

table(hdr, out, {1, 2, 3, 4, 5})
print(f"\ntargets met: {sum(verdicts)}/{len(verdicts)}")
print("kit/bare: median kit ns/op / median ns/op of its bare peer (time, so > 1 is slower).")
print("spread: half the min-max range over the rounds, against the median; a wide one means load from")
print("elsewhere on the machine: rerun when it is quiet.  MB/s: 10^6 bytes/s, so 1 GB/s = 1000 MB/s.")
PY
if [ -n "${BENCH_RAW:-}" ]; then echo "raw output: $raw"; fi
