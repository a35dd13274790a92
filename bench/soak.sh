#!/usr/bin/env bash
# Soak test of the daemon (not in CI): mixed load from many concurrent
# sessions for a long time; the daemon's RSS, goroutines and open fds
# sampled at an interval, printed as a table and plotted; the run fails if
# any of them keeps growing, or if a call fails unexpectedly.
#
#   bash bench/soak.sh [-d 30m] [-n 100] [-p container|host] [-i 10s] [-o OUTDIR] [-- SOAK FLAGS]
#
#   -d  how long the load runs (a Go duration; default 30m)
#   -n  concurrent sessions (default 100)
#   -p  the daemon's provider (default: container as root with runc
#       installed, else host)
#   -i  sampling interval (default 10s; 1s suits short runs)
#   -o  output directory: report.txt (the table and verdict), samples.csv,
#       soak.png, daemon.log (default: $TMPDIR/tai42-soak-DATE-TIME)
#   after --: more flags of the driver (go run ./bench/soak -h)
#
# It builds the static binary, starts "tai42 serve" on 127.0.0.1:0 with a
# state directory of its own, runs bench/soak against it and stops the
# daemon with SIGTERM at the end, whatever happened (SIGKILL if it is not
# gone 60 s later), then removes the state directory. Exit status: the
# driver's (0 pass, 1 fail, 2 the run could not start).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

usage() {
	sed -n '7,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

duration=30m
sessions=100
interval=10s
provider=
out=
while getopts ':d:n:p:i:o:h' opt; do
	case $opt in
	d) duration=$OPTARG ;;
	n) sessions=$OPTARG ;;
	p) provider=$OPTARG ;;
	i) interval=$OPTARG ;;
	o) out=$OPTARG ;;
	h) usage ;;
	:) echo "soak.sh: -$OPTARG needs a value" >&2; usage ;;
	*) echo "soak.sh: unknown option -$OPTARG" >&2; usage ;;
	esac
done
shift $((OPTIND - 1))
if [ "${1:-}" = -- ]; then shift; fi
case $sessions in '' | *[!0-9]* | 0) echo "soak.sh: -n must be a positive integer" >&2; exit 2 ;; esac
if [ -z "$provider" ]; then
	if [ "$(id -u)" = 0 ] && command -v runc >/dev/null; then provider=container; else provider=host; fi
fi
case $provider in host | container) ;; *) echo "soak.sh: -p must be host or container" >&2; exit 2 ;; esac
out=${out:-${TMPDIR:-/tmp}/tai42-soak-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"

work=$(mktemp -d "${TMPDIR:-/tmp}/tai42-soak.XXXXXX")
state=$work/state
dpid=
spid=

# alive PID: the process exists and is not a zombie (our child stays one
# until waited for, so its PID cannot be reused meanwhile).
alive() {
	local st
	st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
	[ -n "$st" ] && [ "$st" != Z ]
}

cleanup() {
	local rc=$? i
	trap - EXIT INT TERM
	if [ -n "$spid" ] && alive "$spid"; then
		kill -TERM "$spid" 2>/dev/null || true
		wait "$spid" 2>/dev/null || true
	fi
	if [ -n "$dpid" ]; then
		if alive "$dpid"; then
			kill -TERM "$dpid" 2>/dev/null || true
			for i in $(seq 1 600); do
				alive "$dpid" || break
				sleep 0.1
			done
			if alive "$dpid"; then
				echo "soak.sh: the daemon (pid $dpid) did not stop within 60 s of SIGTERM; sending SIGKILL" >&2
				kill -KILL "$dpid" 2>/dev/null || true
			fi
		fi
		local drc=0
		wait "$dpid" 2>/dev/null || drc=$?
		if [ "$drc" != 0 ]; then
			echo "soak.sh: WARNING: the daemon exited with status $drc (0 expected after SIGTERM); see $out/daemon.log" >&2
		fi
	fi
	# Never rm -rf across a mount: a daemon that did not stop cleanly may
	# have left one under its state directory.
	if grep -q " $work/" /proc/self/mountinfo 2>/dev/null; then
		echo "soak.sh: mounts are left under $work; not removing it:" >&2
		grep " $work/" /proc/self/mountinfo | cut -d' ' -f5 >&2
	else
		rm -rf --one-file-system "$work"
	fi
	exit "$rc"
}
# A signal while the driver runs is passed on to it (it ends the load,
# destroys its sessions and prints its report), then the daemon is stopped.
on_signal() {
	if [ -n "$spid" ] && alive "$spid"; then
		kill -TERM "$spid" 2>/dev/null || true
		wait "$spid" 2>/dev/null || true
	fi
	exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

echo "soak.sh: building tai42 (static) and the driver..." >&2
CGO_ENABLED=0 go build -o "$work/tai42" ./cmd/tai42
go build -o "$work/soak" ./bench/soak

mkdir -m 0700 "$state"
# Warnings and errors only: the info log has a line per request.
"$work/tai42" serve --provider "$provider" --state-dir "$state" --listen 127.0.0.1:0 \
	--net-prefix tsoak --log-level warn 2>"$out/daemon.log" &
dpid=$!

addr=
for i in $(seq 1 1200); do
	addr=$(sed -n 's/^tai42: listening on \([^ ]*\) (provider .*/\1/p' "$out/daemon.log")
	if [ -n "$addr" ]; then break; fi
	if ! alive "$dpid"; then
		echo "soak.sh: tai42 serve exited before listening:" >&2
		cat "$out/daemon.log" >&2
		exit 2
	fi
	sleep 0.1
done
if [ -z "$addr" ]; then
	echo "soak.sh: tai42 serve did not start listening within 120 s:" >&2
	cat "$out/daemon.log" >&2
	exit 2
fi
echo "soak.sh: tai42 serve (pid $dpid, provider $provider) on $addr; results in $out" >&2

# In the background, so that a signal to this script reaches on_signal at
# once (bash runs traps only between commands; wait is interruptible).
"$work/soak" -url "http://$addr" -token-file "$state/token" -pid "$dpid" -provider "$provider" \
	-d "$duration" -n "$sessions" -interval "$interval" -out "$out" "$@" &
spid=$!
rc=0
wait "$spid" || rc=$?
spid=
exit "$rc"
