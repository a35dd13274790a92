# Shared by bench/run.sh and bench/api.sh (source it; it is not run alone):
# one test binary built once, run in rounds of -count 1 with its output kept
# in $raw, failures caught before any table is printed.

# bench_init DEFAULT_COUNT PKG: checks BENCH_COUNT (default DEFAULT_COUNT)
# into $count, makes $work (removed at exit) and $raw (BENCH_RAW, else in
# $work), and builds PKG's test binary once, so that other edits to the
# tree during the run cannot change what is measured halfway.
bench_init() {
	count=${BENCH_COUNT:-$1}
	case $count in '' | *[!0-9]* | 0) echo "BENCH_COUNT must be a positive integer" >&2; exit 2 ;; esac
	pkg=$2
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	raw=${BENCH_RAW:-$work/raw.txt}
	: >"$raw"
	echo "building the benchmark binary..." >&2
	go test -c -o "$work/bench.test" "./$pkg/"
	load0=$(cut -d' ' -f1-3 /proc/loadavg)
	start=$(date +%s)
}

# bench_run REGEXP BENCHTIME [VAR=VALUE]: one -count 1 run of the matching
# benchmarks in PKG's directory, VAR=VALUE in its environment; the raw
# output goes to $raw, the result lines to stderr as they come.
bench_run() {
	(cd "$pkg" && env ${3:+"$3"} "$work/bench.test" -test.run '^$' -test.bench "$1" \
		-test.benchtime "$2" -test.count 1 -test.benchmem) | tee -a "$raw" |
		grep --line-buffered '^Benchmark' >&2 || true
}

# bench_finish TITLE: fails the script if any run failed, else prints the
# title and the load and time of the run.
bench_finish() {
	if grep -q -E '^(--- FAIL|FAIL|panic:)' "$raw"; then
		grep -E -A20 '^(--- FAIL|FAIL|panic:)' "$raw" >&2
		echo "benchmarks failed" >&2
		exit 1
	fi
	echo
	echo "$1"
	echo "load average before: $load0, after: $(cut -d' ' -f1-3 /proc/loadavg); took $(($(date +%s) - start))s"
}
