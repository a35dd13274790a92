#!/usr/bin/env bash
# Benchmarks of the Python client (python/src/tai42_sandbox) against one
# host daemon on a unix socket, with the Go client's exec p50 measured in
# the same run against the same daemon (bench/python/gobench).
#
#   bash bench/python.sh                    # from the repo root
#   BENCH_COUNT=9 bash bench/python.sh      # more rounds (default 5)
#   BENCH_CALLGRIND=1 bash bench/python.sh  # also the instructions per exec
#
# Env: BENCH_COUNT (rounds, default 5), BENCH_EXECS (timed execs per side
# per round, default 1000), PYTHON (default python/.venv/bin/python, which
# python/test.sh makes, if it exists, else python3; it needs pydantic and
# aiohttp), BENCH_CALLGRIND=1 (after the table, the Python client's
# user-space instructions per exec under valgrind's callgrind: (count with
# 1000 execs - count with none) / 1000, with PYTHONHASHSEED=0; steady to
# about 1% whatever the load, where the latencies and CPU times move by
# tens of percent; needs valgrind).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${PYTHON:-$( [ -x python/.venv/bin/python ] && echo python/.venv/bin/python || echo python3 )}
work=$(mktemp -d /tmp/t42pybench.XXXXXX)
pid=
cleanup() {
	if [ -n "$pid" ]; then kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

echo "building tai42 and gobench..." >&2
go build -o "$work/tai42" ./cmd/tai42
go build -o "$work/gobench" ./bench/python/gobench

token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
sock="$work/d.sock"
TAI42_TOKEN=$token "$work/tai42" serve --provider host --listen "unix:$sock" \
	--state-dir "$work/state" --log-level warn 2>"$work/daemon.log" &
pid=$!
for _ in $(seq 1 300); do
	grep -q "listening on" "$work/daemon.log" 2>/dev/null && break
	kill -0 "$pid" 2>/dev/null || { cat "$work/daemon.log" >&2; exit 1; }
	sleep 0.05
done
load0=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date +%s)
PYTHONPATH=python/src "$py" bench/python/client_bench.py --url "unix:$sock" --token "$token" \
	--gobench "$work/gobench"
if [ "${BENCH_CALLGRIND:-}" = 1 ]; then
	ir() {
		PYTHONHASHSEED=0 PYTHONPATH=python/src valgrind --tool=callgrind --callgrind-out-file=/dev/null \
			"$py" bench/python/exec_loop.py --url "unix:$sock" --token "$token" -n "$1" 2>&1 |
			sed -n 's/.*Collected : \([0-9,]*\).*/\1/p' | tr -d ,
	}
	ir0=$(ir 0)
	ir1=$(ir 1000)
	echo "exec /bin/true, Python client: $(((ir1 - ir0) / 1000)) instructions per exec (callgrind)"
fi
echo "Python $("$py" -c 'import sys, aiohttp; print(sys.version.split()[0], "aiohttp", aiohttp.__version__)'), $(nproc) CPUs"
echo "load average before: $load0, after: $(cut -d' ' -f1-3 /proc/loadavg); took $(($(date +%s) - start))s"
