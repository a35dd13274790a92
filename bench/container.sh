#!/usr/bin/env bash
# Benchmarks of the container provider (runc and crun) beside docker and
# the bare OCI runtimes, in the same run: session create to first exec
# (cold and from a warm pool), a burst of concurrent creates (cold and from
# a pool), what a pool's refill costs an exec load, the exec round trip, create + destroy, the memory of an idle session, and
# 500 live idle sessions, with medians, p99s and the issue's targets in one
# table; and where a create's time goes, step by step.
#
#   bash bench/container.sh                       # as root, from the repo root; about 10 minutes
#   BENCH_COUNT=3 bash bench/container.sh         # fewer rounds (default 5)
#
# It installs what it needs (apt-get install -y docker.io runc crun
# busybox-static; BENCH_NO_INSTALL=1 skips that), starts a dockerd of its
# own that leaves the host's network alone (no iptables, no bridge, no IP
# forwarding; its data, sockets and pid files in a temp dir; containers on
# network none only; no image is ever pulled: the busybox test image is
# `docker import`ed from a tar of its rootfs), and always stops that
# dockerd, its containerd and their shims, by PID, and removes its temp
# data. When dockerd cannot start, the table still has every other row and
# says why docker's were not measured.
#
# Env: BENCH_COUNT (rounds, default 5), BENCH_CREATE_TIME (-benchtime of the
# create benchmarks, default 20x), BENCH_TIME (of the exec benchmark,
# default 2s), BENCH_BURST (concurrent creates of the burst, default 50),
# BENCH_BURST_TIME (its -benchtime, default 2x), BENCH_REFILL_TIME (the
# refill-cost benchmark's, default 4x), BENCH_REFILL_WINDOW (default 1s),
# BENCH_REFILL_LOAD (default 4), BENCH_IDLE_SESSIONS (sessions/containers per idle-memory
# sample, default 5), BENCH_IDLE_SETTLE (their idle time before measuring,
# default 2s), BENCH_SCALE_SESSIONS (default 500), BENCH_SCALE_CONCURRENCY
# (default 8), BENCH_NO_INSTALL, BENCH_RAW (keep the raw `go test -bench`
# output at this path).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

if [ "$(id -u)" != 0 ]; then
	echo "bench/container.sh must run as root: containers, mounts, cgroups and dockerd need it" >&2
	exit 2
fi
createtime=${BENCH_CREATE_TIME:-20x}
exectime=${BENCH_TIME:-2s}

if [ -z "${BENCH_NO_INSTALL:-}" ]; then
	echo "installing docker.io runc crun busybox-static..." >&2
	# Debian starts a packaged daemon on install unless policy-rc.d says
	# no: the packaged dockerd would set up its bridge and iptables rules.
	policy=""
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy=/usr/sbin/policy-rc.d
		trap 'rm -f "$policy"' EXIT
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
	fi
	if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io runc crun busybox-static; } >&2; then
		echo "warning: apt-get could not install every package; going on with what is installed" >&2
	fi
	if [ -n "$policy" ]; then
		rm -f "$policy"
		trap - EXIT
	fi
fi
for bin in runc busybox python3 go; do
	command -v "$bin" >/dev/null || { echo "$bin is not installed" >&2; exit 1; }
done

. bench/lib.sh
bench_init 5 bench/container

# Everything dockerd makes lives under $dk; cleanup stops it and removes
# all of it (lib.sh's trap only removed $work, which holds $dk).
dk=$work/docker
dockerd_pid=""
containerd_pid=""
cgparent=tai42-bench-docker-$$
docker_cli=""
# Directories dockerd and containerd make outside --exec-root (shim
# sockets, plugins) whatever their flags: removed after, if new and empty.
rundirs=""
for d in /run/containerd /run/docker; do
	if [ ! -e "$d" ]; then rundirs="$rundirs $d"; fi
done
cleanup() {
	set +e
	if [ -n "$dockerd_pid" ] && kill -0 "$dockerd_pid" 2>/dev/null; then
		ids=$(timeout 30 "$docker_cli" -H "unix://$dk/docker.sock" ps -aq 2>/dev/null)
		if [ -n "$ids" ]; then timeout 60 "$docker_cli" -H "unix://$dk/docker.sock" rm -f $ids >/dev/null 2>&1; fi
		kill -TERM "$dockerd_pid"
		for _ in $(seq 1 100); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.2; done
		if kill -0 "$dockerd_pid" 2>/dev/null; then kill -KILL "$dockerd_pid"; fi
		wait "$dockerd_pid" 2>/dev/null
	fi
	# Its containerd and shims, known by our temp dir in their command
	# lines (the pid files may be gone).
	if [ -d "$dk" ]; then
		for p in $containerd_pid $(grep -l -s -F "$dk" /proc/[0-9]*/cmdline | cut -d/ -f3); do
			if [ "$p" != "$$" ] && { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -q -F "$dk"; then
				kill -TERM "$p" 2>/dev/null
				for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
				kill -KILL "$p" 2>/dev/null
			fi
		done
		# Mounts it left (deepest first), before the files go.
		awk -v d="$dk" 'index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
			while read -r m; do umount -l "$m"; done
	fi
	for c in /sys/fs/cgroup/*/"$cgparent" /sys/fs/cgroup/"$cgparent"; do
		if [ -d "$c" ]; then rmdir "$c"; fi
	done
	for d in $rundirs; do
		if [ -d "$d" ]; then find "$d" -depth -type d -empty -delete; fi
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "writing the busybox rootfs..." >&2
go run ./internal/imagestore/imagestoretest/cmd/mkbusybox -format rootfs -o "$work/rootfs" >/dev/null
export BENCH_ROOTFS=$work/rootfs

# dockerd: started here, checked at once; any failure leaves a reason.
docker_reason=""
start_docker() {
	local dockerd
	dockerd=$(command -v dockerd) || { docker_reason="dockerd is not installed (apt-get install -y docker.io)"; return; }
	# The CLI of the docker.io package, which matches its dockerd.
	if [ -x /usr/bin/docker ]; then docker_cli=/usr/bin/docker; else docker_cli=$(command -v docker) || { docker_reason="the docker CLI is not installed"; return; }; fi
	mkdir -p "$dk"
	echo "starting a private dockerd (no iptables, no bridge, no ip forwarding)..." >&2
	"$dockerd" --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
		--cgroup-parent="/$cgparent" --data-root "$dk/data" --exec-root "$dk/exec" \
		-H "unix://$dk/docker.sock" --pidfile "$dk/docker.pid" >"$dk/log" 2>&1 &
	dockerd_pid=$!
	for _ in $(seq 1 150); do
		if ! kill -0 "$dockerd_pid" 2>/dev/null; then
			docker_reason="dockerd exited at start: $(tail -n 2 "$dk/log" | tr '\n' ' ' | cut -c1-300)"
			dockerd_pid=""
			return
		fi
		if "$docker_cli" -H "unix://$dk/docker.sock" version >/dev/null 2>&1; then break; fi
		sleep 0.2
	done
	if ! "$docker_cli" -H "unix://$dk/docker.sock" version >/dev/null 2>&1; then
		docker_reason="dockerd did not answer within 30s: $(tail -n 2 "$dk/log" | tr '\n' ' ' | cut -c1-300)"
		return
	fi
	containerd_pid=$(cat "$dk/exec/containerd/containerd.pid" 2>/dev/null || true)
	if ! tar -C "$work/rootfs" -c . | "$docker_cli" -H "unix://$dk/docker.sock" import - busybox:bench >/dev/null; then
		docker_reason="docker import of the busybox rootfs failed"
		return
	fi
	export BENCH_DOCKER_HOST=unix://$dk/docker.sock BENCH_DOCKER_BIN=$docker_cli BENCH_DOCKER_IMAGE=busybox:bench
}
start_docker
if [ -n "$docker_reason" ]; then
	echo "docker will not be measured: $docker_reason" >&2
fi
export BENCH_DOCKER_REASON=$docker_reason

# Rounds of -count 1: every round runs all peers of a row side by side, so
# that load from elsewhere hits them alike; every other round runs them in
# reverse order.
for i in $(seq 1 "$count"); do
	rev=$([ $((i % 2)) -eq 0 ] && echo BENCH_REVERSE=1 || true)
	echo "round $i/$count${rev:+ (reversed)}" >&2
	bench_run '^BenchmarkCreateFirstExec$' "$createtime" "$rev"
	bench_run '^BenchmarkExecTrue$' "$exectime" "$rev"
	bench_run '^BenchmarkCreateDestroy$' "$createtime" "$rev"
	bench_run '^BenchmarkIdleMemory$' 1x "$rev"
	bench_run '^BenchmarkCreateSteps$' "$createtime" "$rev"
	bench_run '^BenchmarkBurst$' "${BENCH_BURST_TIME:-2x}" "$rev"
	bench_run '^BenchmarkPoolRefillCost$' "${BENCH_REFILL_TIME:-4x}" "$rev"
done
echo "${BENCH_SCALE_SESSIONS:-500} live idle sessions..." >&2
bench_run '^BenchmarkIdleSessions$' 1x
# Not lib.sh's bench_finish: a benchmark that failed (a create the
# provider refused, 500 sessions it could not hold) is a result too, so the
# table is printed with it marked, and the script fails after it.
failed=0
if grep -q -E '^(--- FAIL|FAIL|panic:)' "$raw"; then failed=1; fi
echo
versions="$(runc --version | head -1), $(crun --version 2>/dev/null | head -1)"
if [ -z "$docker_reason" ]; then
	versions="$versions, docker $("$docker_cli" -H "unix://$dk/docker.sock" version --format '{{.Server.Version}}' 2>/dev/null)"
else
	versions="$versions, docker not measured"
fi
echo "container provider benchmarks: $count rounds, -benchtime $createtime (create), $exectime (exec), $(nproc) CPUs, $versions"
echo "load average before: $load0, after: $(cut -d' ' -f1-3 /proc/loadavg); took $(($(date +%s) - start))s"
PYTHONPATH=bench python3 - "$raw" <<'PY'
import os, statistics, sys
from benchstats import parse, median, table

runs = parse(sys.argv[1])
docker_reason = os.environ.get("BENCH_DOCKER_REASON", "")

# Failed benchmarks ("--- FAIL: BenchmarkX/y" and the indented lines after
# it), and the logs of passed ones ("--- BENCH: BenchmarkX-N").
fails, failcount, logs, cur = {}, {}, {}, None
for line in open(sys.argv[1]):
    line = line.rstrip("\n")
    if line.startswith("--- FAIL: Benchmark"):
        name = line.split()[2][len("Benchmark"):]
        failcount[name] = failcount.get(name, 0) + 1
        cur = fails.setdefault(name, [])
    elif line.startswith("--- BENCH: Benchmark"):
        cur = logs.setdefault(line.split()[2][len("Benchmark"):].rsplit("-", 1)[0], [])
    elif line.startswith("    ") and cur is not None:
        cur.append(line.strip())
    else:
        cur = None
def failnote(name):
    return f" [FAILED in {failcount[name]} round(s)]" if name in fails else ""

def med(name, unit):
    return median(runs, name, unit)

def vals(name, unit):
    return runs.get(name, {}).get(unit) or []

def missing(name):
    # The reason is printed under the tables.
    if "docker" in name and docker_reason:
        return "not measured"
    return "MISSING"

def ms(v):
    return "-" if v is None else f"{v/1e6:,.2f}"

def mb(v):
    return "-" if v is None else f"{v/1e6:,.2f}"

def ratio(a, b):
    return "-" if a is None or not b else f"{a/b:.2f}×"

verdicts = []  # (what, met)

# Latency: name, docker peer, bare peer, target p50 (ns) or (p50, p99), note
C, E, D = "CreateFirstExec/", "ExecTrue/", "CreateDestroy/"
lat = [
    (C+"runc-busybox-pool", C+"docker-run", C+"bare-runc", (3e6, 10e6), "the same taken from a warm pool at rest"),
    (C+"runc-host-pool", C+"docker-run", C+"bare-runc", (3e6, 10e6), "the same, host image"),
    (C+"crun-busybox-pool", C+"docker-run", C+"bare-crun", (3e6, 10e6), "the same on crun"),
    (C+"crun-host-pool", C+"docker-run", C+"bare-crun", (3e6, 10e6), "the same, host image"),
    (C+"runc-busybox", C+"docker-create-start-exec", C+"bare-runc", 30e6, "create + first exec, busybox image"),
    (C+"runc-host", C+"docker-create-start-exec", C+"bare-runc", 30e6, "the same, host image"),
    (C+"crun-busybox", C+"docker-create-start-exec", C+"bare-crun", 15e6, "create + first exec on crun, busybox"),
    (C+"crun-host", C+"docker-create-start-exec", C+"bare-crun", 15e6, "the same, host image"),
    (C+"bare-runc", None, None, None, "runc run /bin/true: create+start+exit+delete"),
    (C+"bare-crun", None, None, None, "crun run /bin/true, the same"),
    (C+"docker-run", None, None, None, "docker run --rm --network none IMG true"),
    (C+"docker-create-start-exec", None, None, None, "docker create + start + exec true (the peer)"),
    (E+"runc-busybox", E+"docker-exec", E+"bare-runc-exec", 2e6, "exec /bin/true in a live session"),
    (E+"runc-host", E+"docker-exec", E+"bare-runc-exec", 2e6, "the same, host image"),
    (E+"crun-busybox", E+"docker-exec", E+"bare-crun-exec", 2e6, "the same on crun"),
    (E+"crun-host", E+"docker-exec", E+"bare-crun-exec", 2e6, "the same, host image"),
    (E+"bare-runc-exec", None, None, None, "runc exec ID /bin/true"),
    (E+"bare-crun-exec", None, None, None, "crun exec ID /bin/true"),
    (E+"docker-exec", None, None, None, "docker exec ID true"),
    (D+"runc-busybox", D+"docker-run-rm", D+"bare-runc", None, "create + destroy a session"),
    (D+"runc-host", D+"docker-run-rm", D+"bare-runc", None, "the same, host image"),
    (D+"crun-busybox", D+"docker-run-rm", D+"bare-crun", None, "the same on crun"),
    (D+"crun-host", D+"docker-run-rm", D+"bare-crun", None, "the same, host image"),
    (D+"bare-runc", None, None, None, "runc run -d + runc delete -f"),
    (D+"bare-crun", None, None, None, "crun run -d + crun delete -f"),
    (D+"docker-run-rm", None, None, None, "docker run -d + docker rm -f"),
]
rows = []
for name, dpeer, bpeer, target, note in lat:
    p50s = vals(name, "p50-ns")
    note += failnote(name)
    if not p50s:
        rows.append((name, "0", "FAILED" if name in fails else missing(name), "", "", "", "", "", "", note))
        if target:
            verdicts.append((name, False))
        continue
    p50, p99 = statistics.median(p50s), med(name, "p99-ns")
    spread = f"±{(max(p50s) - min(p50s)) / 2 / p50 * 100:.0f}%"
    vd = ratio(p50, med(dpeer, "p50-ns")) if dpeer else "-"
    if dpeer and vd == "-" and docker_reason:
        vd = "n/m"
    vb = ratio(p50, med(bpeer, "p50-ns")) if bpeer else "-"
    t = met = "-"
    if target:
        t50, t99 = target if isinstance(target, tuple) else (target, None)
        t = f"≤ {t50/1e6:g} ms p50" + (f", ≤ {t99/1e6:g} ms p99" if t99 else "")
        ok = p50 <= t50 and (t99 is None or (p99 is not None and p99 <= t99))
        met = "yes" if ok else "NO"
        verdicts.append((name, ok))
    rows.append((name, str(len(p50s)), ms(p50), ms(p99), spread, vd, vb, t, met, note))
print("Latency (ms; p50 and p99 of each round's ops, median over rounds; spread: of the p50s)")
table(("benchmark", "n", "p50 ms", "p99 ms", "spread", "vs docker", "vs bare", "target", "met", "what"), rows, {1, 2, 3, 4, 5, 6})

# A burst of concurrent creates, cold and from a pool as large.
B = "Burst/"
rows = []
for name, target, note in [
    (B+"crun", None, "cold, crun"), (B+"crun-pool", 200e6, "from a full pool of as many, crun"),
    (B+"runc", None, "cold, runc"), (B+"runc-pool", 200e6, "from a full pool of as many, runc"),
]:
    a = vals(name, "all-ns")
    note += failnote(name)
    if not a:
        rows.append((name, "0", "FAILED" if name in fails else missing(name), "", "", "", "", note))
        if target:
            verdicts.append((name, False))
        continue
    all_ms = statistics.median(a)
    t = met = "-"
    if target:
        ok = all_ms <= target
        t, met = f"≤ {target/1e6:g} ms", ("yes" if ok else "NO")
        verdicts.append((name, ok))
    rows.append((name, str(len(a)), ms(all_ms), ms(med(name, "p50-ns")), ms(med(name, "p99-ns")), t, met, note))
print()
print(f"{os.environ.get('BENCH_BURST', '50')} concurrent creates, each to its first exec (ms; all: until the last is done, median over rounds)")
table(("benchmark", "n", "all ms", "each p50", "each p99", "target", "met", "what"), rows, {1, 2, 3, 4})

# What a pool's refill costs an exec load.
R = "PoolRefillCost"
print()
if not vals(R, "ratio-pct"):
    print(f"{R}: FAILED" if R in fails else f"{R}: MISSING (it did not run)")
    verdicts.append((R, False))
else:
    ratio_pct = med(R, "ratio-pct")
    ok = ratio_pct >= 95
    verdicts.append((R, ok))
    print(f"A pool of 8 refilling beside an exec load (crun, busybox; {os.environ.get('BENCH_REFILL_LOAD', '4')} sessions running /bin/true back to back, "
          f"windows of {os.environ.get('BENCH_REFILL_WINDOW', '1s')}): {med(R, 'refill-execs/s'):,.0f} execs/s while refilling vs {med(R, 'idle-execs/s'):,.0f} at rest "
          f"= {ratio_pct:.1f}% (target ≥ 95%: {'yes' if ok else 'NO'}); sessions the refill made within the window: {med(R, 'refilled'):.0f} of 8 "
          "(it waits for a quiet moment, at most a second after its last session)")

# Memory of an idle session.
M = "IdleMemory/"
mem = [
    (M+"runc-busybox", "session: its cgroup + the agent's PSS"),
    (M+"runc-host", "the same, host image"),
    (M+"crun-busybox", "the same on crun"),
    (M+"crun-host", "the same, host image"),
    (M+"runc-busybox-pool", "taken from a warm pool (ran its warm-up too)"),
    (M+"crun-busybox-pool", "the same on crun"),
    (M+"docker", "idle container: its cgroup + its shim's PSS"),
]
rows = []
dock = med(M+"docker", "total-B")
for name, note in mem:
    tot = vals(name, "total-B")
    note += failnote(name)
    if not tot:
        rows.append((name, "0", "FAILED" if name in fails else missing(name), "", "", "", "", "", "", "", "", "", "", note))
        if "docker" not in name:
            verdicts.append((name, False))
        continue
    total = statistics.median(tot)
    t = met = "-"
    if "docker" not in name:
        t, ok = "≤ 4 MB", total <= 4e6
        met = "yes" if ok else "NO"
        verdicts.append((name, ok))
    vd = "-" if "docker" in name else (ratio(total, dock) if dock else ("n/m" if docker_reason else "-"))
    rows.append((name, str(len(tot)), mb(med(name, "cgroup-B")), mb(med(name, "cgroup-anon-B")), mb(med(name, "cgroup-file-B")),
                 mb(med(name, "pss-B")), mb(med(name, "pss-anon-B")), mb(med(name, "pss-file-B")), mb(total), vd, t, met,
                 mb(med(name, "unique-B")), note))
print()
print("Memory per idle session (MB = 10^6 bytes; each round's median over its sessions, median over rounds)")
table(("benchmark", "n", "cgroup", "anon", "cache", "PSS", "anon", "file", "total", "vs docker", "target", "met", "once", "what"),
      rows, set(range(1, 10)) | {12})

# 500 live idle sessions.
S = "IdleSessions"
print()
n = med(S, "sessions")
if n is None:
    print(f"{S}: FAILED" if S in fails else f"{S}: MISSING (it did not run)")
    for l in fails.get(S, [])[:6]:
        print("  " + l[:400])
    verdicts.append(("IdleSessions", False))
else:
    wanted = med(S, "wanted")
    left = sum(med(S, u) or 0 for u in ("left-sessions", "left-cgroups", "left-mounts"))
    cf, ef = med(S, "create-failed"), med(S, "exec-failed")
    ok = left == 0 and cf == 0 and ef == 0 and wanted >= 500 and S not in fails
    verdicts.append((f"IdleSessions ({n:.0f} of {wanted:.0f} live)", ok))
    print(f"{wanted:.0f} live idle sessions at once (runc, busybox, network none, {os.environ.get('BENCH_SCALE_CONCURRENCY', '8')} creates in flight): "
          + ("met" if ok else "NOT met") + f": {n:.0f} live and answering; {cf:.0f} creates failed, {ef:.0f} exec checks failed")
    for l in logs.get(S, [])[:6] + fails.get(S, [])[:6]:
        print("  ! " + l[:400])
    print(f"  create: {med(S, 'create-total-ns')/1e9:.1f} s in all (each: p50 {ms(med(S, 'create-p50-ns'))} ms, p99 {ms(med(S, 'create-p99-ns'))} ms); "
          f"exec check of all: {med(S, 'exec-total-ns')/1e9:.2f} s")
    if med(S, "total-B") is not None:
        print(f"  memory per session (median): cgroup {mb(med(S, 'cgroup-B'))} MB + agent PSS {mb(med(S, 'pss-B'))} MB = {mb(med(S, 'total-B'))} MB "
              f"(mean {mb(med(S, 'mean-B'))} MB; target ≤ 4 MB: {'yes' if med(S, 'total-B') <= 4e6 else 'NO'}); counted once: {mb(med(S, 'unique-B'))} MB")
    b, l, a = med(S, "memavail-before-B"), med(S, "memavail-live-B"), med(S, "memavail-after-B")
    per = med(S, "memavail-per-session-B")
    print(f"  MemAvailable: {b/1e9:.2f} GB before, {l/1e9:.2f} GB with all live ({(b-l)/1e9:.2f} GB less"
          + (f": {mb(per)} MB a session, kernel included" if per is not None else "") + f"), {a/1e9:.2f} GB after destroying them")
    print(f"  destroy all: {med(S, 'destroy-total-ns')/1e9:.1f} s; left: {med(S, 'left-sessions'):.0f} session dirs, "
          f"{med(S, 'left-cgroups'):.0f} cgroups, {med(S, 'left-mounts'):.0f} mounts: {'nothing left' if left == 0 else 'LEFTOVERS'}")

# Where a create goes.
steps = ["bundle", "run", "ping", "exec"]
rows = []
userns = None
for v in ["runc", "runc-no-seccomp", "runc-no-hardening", "crun", "crun-no-seccomp", "crun-no-hardening", "agent-alone"]:
    name = "CreateSteps/" + v
    if not vals(name, "total-p50-ns"):
        rows.append((name,) + ("-",) * (len(steps) + 4))
        continue
    if med(name, "userns") is not None:
        userns = med(name, "userns")
    create = med(name, "create-p50-ns")
    own = None
    if create is not None:
        own = create - sum(med(name, s + "-p50-ns") or 0 for s in ("run", "ping", "exec"))
    rows.append((name,) + tuple(ms(med(name, s + "-p50-ns")) for s in steps) +
                (ms(med(name, "total-p50-ns")), ms(med(name, "total-p99-ns")), ms(create), ms(own)))
print()
print("Where create + first exec goes (p50 ms): one more container started from a live session's own bundle, step by step;")
print("create: a real create + first exec in the same loop; own: create less run, ping and exec (the provider's own work)")
table(("steps",) + tuple(steps) + ("total", "p99", "create", "own"), rows, set(range(1, len(steps) + 5)))
if userns is not None:
    print(f"sessions ran in a user namespace: {'yes' if userns >= 0.5 else 'no'} (the provider's default mode)")

print()
print(f"targets met: {sum(ok for _, ok in verdicts)}/{len(verdicts)}" +
      ("" if all(ok for _, ok in verdicts) else "; missed: " + ", ".join(w for w, ok in verdicts if not ok)))
print("vs docker / vs bare: our p50 over the peer's p50 (below 1 is faster).  n/m: docker not measured.")
print("Memory: total = cgroup charge + PSS (the issue's measure; our agent's anonymous memory is in both);")
print("once = the same counting nothing twice.  agent-alone: `tai42-agent agent` started outside any container, to its first answer.")
print("-no-seccomp / -no-hardening: the session's config without its seccomp filter / also without masked and read-only paths.")
print("Docker's create peer is docker create + start + exec (a live container to its first exec, like ours);")
print("docker run --rm also waits for the exit and removes the container.  Docker is driven through its CLI.")
if docker_reason:
    print("docker not measured: " + docker_reason)
if fails:
    print()
    print("FAILED (first message of each):")
    for name, lines in fails.items():
        if "/" in name or not any(f.startswith(name + "/") for f in fails):
            # The first line, and the runtime's error where a warning came first.
            msg = lines[:1] + [l for l in lines[1:] if "level=error" in l][:1]
            print(f"  {name}: " + (" / ".join(m[:500] for m in msg) if msg else "(no message)"))
PY
if [ -n "${BENCH_RAW:-}" ]; then echo "raw output: $raw"; fi
exit "$failed"
