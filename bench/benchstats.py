"""Shared by the table printers of bench/run.sh and bench/api.sh: the raw
`go test -bench` output parsed into {name: {unit: [value per round]}}, and
the median of one."""
import re
import statistics


def parse(path):
    runs = {}
    for line in open(path):
        m = re.match(r'^Benchmark(\S+?)(?:-\d+)?\s+\d+\s+(.*)$', line)
        if not m:
            continue
        f = m.group(2).split()
        d = runs.setdefault(m.group(1), {})
        for v, unit in zip(f[0::2], f[1::2]):
            d.setdefault(unit, []).append(float(v))
    return runs


def median(runs, name, unit):
    v = runs.get(name, {}).get(unit)
    return statistics.median(v) if v else None
