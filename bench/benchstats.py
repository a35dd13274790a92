"""Shared by the table printers of the bench/*.sh scripts: the raw
`go test -bench` output parsed into {name: {unit: [value per round]}}, the
median of one, and the table they print."""
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


def table(hdr, rows, right):
    """Prints rows under hdr in aligned columns, those in right to the right."""
    w = [max(len(r[i]) for r in [hdr] + rows) for i in range(len(hdr))]

    def line(r):
        return "  ".join(c.rjust(w[i]) if i in right else c.ljust(w[i]) for i, c in enumerate(r)).rstrip()
    print(line(hdr))
    print(line(tuple("-" * x for x in w)))
    for r in rows:
        print(line(r))
