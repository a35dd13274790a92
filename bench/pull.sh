#!/usr/bin/env bash
# The pull benchmark: pull + unpack of the realistic Debian python image
# (registrytest's: a bookworm minbase with python3 in 3 layers, ~60 MB
# compressed, ~170 MB unpacked) from a registry on loopback, by
#   tai42     `tai42 image pull` into an emptied store
#   skopeo    `skopeo copy docker://... oci:...` then `umoci raw unpack`
#   docker    `docker pull` by a dockerd of the bench's own, configured
#             with the loopback registry as an insecure registry
# beside the loopback copy speed (`curl` of the same blobs to /dev/null);
# medians of N rounds, each tool's store emptied between rounds, MB/s of
# the compressed bytes. Then create -> first exec on the same root
# filesystem as 5 layers and as one (BenchmarkCreateFirstExecLayers in
# bench/container).
#
#   bash bench/pull.sh                   # as root, from the repo root; about 5 minutes
#   BENCH_COUNT=3 bash bench/pull.sh     # rounds (default 5)
#
# The registry is Debian's docker-registry (/usr/bin/docker-registry) on
# 127.0.0.1, its storage in a temp dir; the dockerd leaves the host's
# network alone as bench/container.sh's does. Both are stopped by PID at
# exit, and their files removed. A peer that cannot run (no dockerd, no
# skopeo) is left out of the table with the reason. Env: BENCH_COUNT,
# TAI42_BIN (the tai42 to measure; default: built from this tree),
# BENCH_CREATE_TIME (-benchtime of the layers benchmark, default 10x),
# BENCH_NO_LAYERS (skip it), TAI42_TEST_CACHE (the Debian image's cache).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ "$(id -u)" != 0 ]; then
	echo "bench/pull.sh must run as root: mmdebstrap, unpacking as root, dockerd and the sessions need it" >&2
	exit 2
fi
count=${BENCH_COUNT:-5}
case $count in '' | *[!0-9]* | 0) echo "BENCH_COUNT must be a positive integer" >&2; exit 2 ;; esac
for bin in /usr/bin/docker-registry curl python3 go; do
	command -v "$bin" >/dev/null || { echo "$bin is not installed (apt-get install -y docker-registry curl python3)" >&2; exit 1; }
done

work=$(mktemp -d)
# The three stores (tai42's, skopeo+umoci's, dockerd's data) live on a tmpfs
# of the bench's own: on a disk that rounds of unpacking and removing have
# churned, ext4 spends up to half of an unpack finding an inode that was not
# recently deleted (ext4's recently_deleted, in a perf profile here), and
# where each store sits would pick the winner.
stores=$work/fs
mkdir "$stores"
reg_pid=""
dockerd_pid=""
dk=$stores/docker
cgparent=tai42-bench-pull-$$
docker_cli=""
rundirs=""
for d in /run/containerd /run/docker; do
	if [ ! -e "$d" ]; then rundirs="$rundirs $d"; fi
done
stop_pid() { # stop_pid PID: SIGTERM, then SIGKILL after 10s
	kill -TERM "$1" 2>/dev/null || return 0
	for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.2; done
	kill -KILL "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}
cleanup() {
	set +e
	if [ -n "$dockerd_pid" ]; then stop_pid "$dockerd_pid"; fi
	# dockerd's containerd, known by our temp dir in its command line.
	if [ -d "$dk" ]; then
		for p in $(grep -l -s -F "$dk" /proc/[0-9]*/cmdline | cut -d/ -f3); do
			if [ "$p" != "$$" ] && { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -q -F "$dk"; then stop_pid "$p"; fi
		done
		awk -v d="$dk" 'index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
			while read -r m; do umount -l "$m"; done
	fi
	if [ -n "$reg_pid" ]; then stop_pid "$reg_pid"; fi
	for c in /sys/fs/cgroup/*/"$cgparent" /sys/fs/cgroup/"$cgparent"; do
		if [ -d "$c" ]; then rmdir "$c"; fi
	done
	for d in $rundirs; do
		if [ -d "$d" ]; then find "$d" -depth -type d -empty -delete; fi
	done
	if mountpoint -q "$stores"; then umount "$stores"; fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mount -t tmpfs -o size=8g,mode=0700 tai42-bench-pull "$stores"

# The registry, on a free port.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
host=127.0.0.1:$port
cat >"$work/registry.yml" <<YML
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $work/registry}, maintenance: {uploadpurging: {enabled: false}}}
http: {addr: "$host", secret: bench}
YML
/usr/bin/docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
reg_pid=$!
for _ in $(seq 1 100); do
	curl -fs "http://$host/v2/" >/dev/null && break
	kill -0 "$reg_pid" 2>/dev/null || { cat "$work/registry.log" >&2; exit 1; }
	sleep 0.1
done

echo "building and pushing the Debian python image (a cache miss runs mmdebstrap, 1-2 minutes)..." >&2
go run ./internal/imagestore/registrytest/cmd/pushdebian -registry "$host" >"$work/pushed"
ref=$(head -n 1 "$work/pushed")
repo=${ref#"$host/"}
repo=${repo%:*}
bytes=$(tail -n +2 "$work/pushed" | awk '{s += $2} END {print s}')
nlayers=$(($(wc -l <"$work/pushed") - 1))

tai42=${TAI42_BIN:-}
if [ -z "$tai42" ]; then
	echo "building tai42..." >&2
	go build -o "$work/tai42" ./cmd/tai42
	tai42=$work/tai42
fi

# Peers: each a function that runs one pull, its store emptied before.
declare -A reason
peers=()
if "$tai42" image pull --help 2>/dev/null | grep -q -e --insecure-registry; then
	peers+=(tai42)
else
	reason[tai42]="this tai42 has no \`image pull --insecure-registry\`"
fi
if command -v skopeo >/dev/null && command -v umoci >/dev/null; then
	peers+=(skopeo+umoci)
else
	reason[skopeo+umoci]="skopeo or umoci is not installed (apt-get install -y skopeo umoci)"
fi

start_docker() {
	local dockerd
	dockerd=$(command -v dockerd) || { reason[docker]="dockerd is not installed (apt-get install -y docker.io)"; return; }
	if [ -x /usr/bin/docker ]; then docker_cli=/usr/bin/docker; else docker_cli=$(command -v docker) || { reason[docker]="the docker CLI is not installed"; return; }; fi
	mkdir -p "$dk"
	echo "starting a private dockerd (no iptables, no bridge; $host an insecure registry)..." >&2
	"$dockerd" --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false --bridge=none \
		--insecure-registry "$host" --cgroup-parent="/$cgparent" --data-root "$dk/data" --exec-root "$dk/exec" \
		-H "unix://$dk/docker.sock" --pidfile "$dk/docker.pid" >"$dk/log" 2>&1 &
	dockerd_pid=$!
	for _ in $(seq 1 150); do
		if ! kill -0 "$dockerd_pid" 2>/dev/null; then
			reason[docker]="dockerd exited at start: $(tail -n 2 "$dk/log" | tr '\n' ' ' | cut -c1-300)"
			dockerd_pid=""
			return
		fi
		if "$docker_cli" -H "unix://$dk/docker.sock" version >/dev/null 2>&1; then
			peers+=(docker)
			return
		fi
		sleep 0.2
	done
	reason[docker]="dockerd did not answer within 30s"
}
start_docker

dockerc() { "$docker_cli" -H "unix://$dk/docker.sock" "$@"; }

# pull_once PEER: one pull + unpack from an emptied store, quiet.
pull_once() {
	case $1 in
	tai42)
		rm -rf "$stores/tai42-state"
		"$tai42" image pull --state-dir "$stores/tai42-state" --insecure-registry "$host" -q "$ref" >/dev/null
		;;
	skopeo+umoci)
		rm -rf "$stores/oci" "$stores/unpacked"
		skopeo copy -q --src-tls-verify=false "docker://$ref" "oci:$stores/oci:v1" >/dev/null
		umoci --log error raw unpack --image "$stores/oci:v1" "$stores/unpacked" >/dev/null
		;;
	docker)
		dockerc rmi -f "$ref" >/dev/null 2>&1 || true
		dockerc pull -q "$ref" >/dev/null
		;;
	loopback-copy)
		tail -n +2 "$work/pushed" | while read -r digest _; do
			curl -fsS -o /dev/null "http://$host/v2/$repo/blobs/$digest"
		done
		;;
	esac
}

# Warm-up: a pull of each, untimed, so that a first pull's one-off costs
# (a failure too: it stops the bench here) are not in the rounds.
for p in loopback-copy "${peers[@]}"; do
	echo "warm-up: $p" >&2
	pull_once "$p"
done

: >"$work/times"
for i in $(seq 1 "$count"); do
	order=(loopback-copy "${peers[@]}")
	if [ $((i % 2)) = 0 ]; then # every other round in reverse: drift hits all alike
		order=($(printf '%s\n' "${order[@]}" | tac))
	fi
	for p in "${order[@]}"; do
		sync
		t0=$(date +%s.%N)
		pull_once "$p"
		t1=$(date +%s.%N)
		echo "$p $t0 $t1" >>"$work/times"
		echo "round $i: $p $(python3 -c "print(f'{$t1 - $t0:.2f}s')")" >&2
	done
done

echo
echo "Pull + unpack of $ref ($nlayers layers, $((bytes / 1000000)) MB compressed) from a registry on loopback, median of $count rounds"
python3 - "$work/times" "$bytes" <<'PY'
import statistics, sys
times, size = {}, int(sys.argv[2])
for line in open(sys.argv[1]):
    p, t0, t1 = line.split()
    times.setdefault(p, []).append(float(t1) - float(t0))
base = statistics.median(times["loopback-copy"])
print(f"| {'peer':<22} | {'median s':>9} | {'MB/s':>7} | {'x loopback copy':>15} |")
print(f"|{'-'*24}|{'-'*11}|{'-'*9}|{'-'*17}|")
for p, ts in times.items():
    m = statistics.median(ts)
    print(f"| {p:<22} | {m:9.2f} | {size / m / 1e6:7.1f} | {m / base:15.2f} |")
PY
for p in tai42 skopeo+umoci docker; do
	if [ -n "${reason[$p]:-}" ]; then echo "$p not measured: ${reason[$p]}"; fi
done
echo "versions: $(/usr/bin/docker-registry --version 2>/dev/null | head -n 1); $(skopeo --version 2>/dev/null); umoci $(umoci --version 2>/dev/null | awk '{print $NF}'); $( [ -n "$dockerd_pid" ] && echo "docker $(dockerc version --format '{{.Server.Version}}' 2>/dev/null)")"

if [ -z "${BENCH_NO_LAYERS:-}" ]; then
	echo
	echo "create -> first exec, the Debian root filesystem as 5 layers and as 1 (runc), $count rounds:"
	(cd bench/container && go test -run '^$' -bench '^BenchmarkCreateFirstExecLayers$' \
		-benchtime "${BENCH_CREATE_TIME:-10x}" -count "$count" -timeout 30m .) | tee "$work/layers.txt" | grep -E '^(Benchmark|--- FAIL|FAIL|ok)' >&2
	python3 - "$work/layers.txt" <<'PY'
import re, statistics, sys
p50 = {}
for line in open(sys.argv[1]):
    m = re.match(r"BenchmarkCreateFirstExecLayers/(\S+?)(-\d+)?\s.*?([\d.]+) p50-ns", line)
    if m:
        p50.setdefault(m.group(1), []).append(float(m.group(3)))
for k, v in p50.items():
    print(f"  {k:<10} p50 {statistics.median(v) / 1e6:7.1f} ms (median of {len(v)} runs)")
if "layers-5" in p50 and "layers-1" in p50:
    r = statistics.median(p50["layers-5"]) / statistics.median(p50["layers-1"])
    print(f"  5 layers / 1 layer: {r:.3f} (target <= 1.10)")
PY
fi
