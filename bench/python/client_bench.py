"""The Python client's benchmarks against a running daemon, beside the Go
client's exec p50 in the same run (bench/python.sh starts the daemon and
builds gobench). Each round runs every benchmark once; the table gives the
medians over the rounds and the issue's targets.

    python client_bench.py --url unix:/path.sock --token T --gobench ./gobench
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator

from tai42_contract.sandbox import SandboxSessionSpec, SandboxStreamChunk
from tai42_sandbox import Tai42Sandbox, Tai42Session

MiB = 1 << 20
GiB = 1 << 30
WARM = 20


def _p(lat: list[float], q: float) -> float:
    s = sorted(lat)
    return s[min(len(s) - 1, int(len(s) * q))]


async def exec_true(s: Tai42Session, n: int) -> dict[str, float]:
    """The execs' latencies, and the process's CPU time (user + system) over
    them per exec: less noisy than the latency on a shared machine."""
    for _ in range(WARM):
        await s.exec(["/bin/true"], timeout_seconds=10)
    lat = []
    cpu0 = time.process_time()
    for _ in range(n):
        t = time.perf_counter()
        await s.exec(["/bin/true"], timeout_seconds=10)
        lat.append(time.perf_counter() - t)
    cpu = time.process_time() - cpu0
    return {"p50_us": _p(lat, 0.5) * 1e6, "p99_us": _p(lat, 0.99) * 1e6, "cpu_us": cpu / n * 1e6}


def go_exec_true(gobench: str, url: str, token: str, n: int) -> dict[str, float]:
    out = subprocess.run(
        [gobench, "-url", url, "-token", token, "-n", str(n), "-files"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    d = json.loads(out)
    return {k: d[k] for k in ("p50_us", "p99_us", "cpu_us", "put_mbs", "get_mbs")}


async def stream_1gib(s: Tai42Session) -> float:
    h = await s.exec_start(["head", "-c", str(GiB), "/dev/zero"], timeout_seconds=300)
    n = 0
    t = time.perf_counter()
    async for item in h.output:
        if isinstance(item, SandboxStreamChunk):
            n += len(item.data)
    dt = time.perf_counter() - t
    await h.kill()
    assert n == GiB, n
    return n / dt / 1e6


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for i in range(0, len(data), size):
        yield bytes(view[i : i + size])


async def files_64mib(s: Tai42Session, data: bytes) -> dict[str, float]:
    r: dict[str, float] = {}
    t = time.perf_counter()
    await s.put_file("bench.bin", data)
    r["put"] = len(data) / (time.perf_counter() - t) / 1e6
    t = time.perf_counter()
    got = await s.get_file("bench.bin")
    r["get"] = len(data) / (time.perf_counter() - t) / 1e6
    assert len(got) == len(data)
    t = time.perf_counter()
    await s.put_file_from("bench2.bin", _chunks(data, MiB))
    r["put_stream"] = len(data) / (time.perf_counter() - t) / 1e6
    n = 0
    t = time.perf_counter()
    async with s.open_file("bench2.bin") as f:
        async for chunk in f:
            n += len(chunk)
    r["get_stream"] = n / (time.perf_counter() - t) / 1e6
    assert n == len(data)
    return r


async def concurrent_50(s: Tai42Session) -> dict[str, float]:
    """50 execs of /bin/true at once from one loop: the wall time, and the
    longest gap between two turns of the loop (a stall shows there)."""
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.ensure_future(ticker())
    t = time.perf_counter()
    lat: list[float] = []

    async def one() -> None:
        t0 = time.perf_counter()
        await s.exec(["/bin/true"], timeout_seconds=30)
        lat.append(time.perf_counter() - t0)

    await asyncio.gather(*(one() for _ in range(50)))
    wall = time.perf_counter() - t
    stop.set()
    await tick
    return {
        "wall_ms": wall * 1e3,
        "max_exec_ms": max(lat) * 1e3,
        "max_loop_gap_ms": max(gaps) * 1e3,
    }


async def round_(args: argparse.Namespace, data: bytes, go_first: bool) -> dict[str, float]:
    r: dict[str, float] = {}
    async with Tai42Sandbox(args.url, args.token) as sb:
        s = await sb.create_session(SandboxSessionSpec(image="host", ttl_seconds=3600))
        try:
            if go_first:
                g = go_exec_true(args.gobench, args.url, args.token, args.n)
            py = await exec_true(s, args.n)
            if not go_first:
                g = go_exec_true(args.gobench, args.url, args.token, args.n)
            r |= {"exec_py_p50": py["p50_us"], "exec_py_p99": py["p99_us"]}
            r |= {"exec_go_p50": g["p50_us"], "exec_go_p99": g["p99_us"]}
            r |= {"exec_py_cpu": py["cpu_us"], "exec_go_cpu": g["cpu_us"]}
            r |= {"go_put_mbs": g["put_mbs"], "go_get_mbs": g["get_mbs"]}
            r["stream_mbs"] = await stream_1gib(s)
            for k, v in (await files_64mib(s, data)).items():
                r[f"{k}_mbs"] = v
            for k, v in (await concurrent_50(s)).items():
                r[f"c50_{k}"] = v
        finally:
            await s.destroy()
    return r


def table(rounds: list[dict[str, float]]) -> bool:
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    add = med["exec_py_p50"] - med["exec_go_p50"]
    rows = [
        ("exec /bin/true p50, Python", f"{med['exec_py_p50']:,.0f} µs",
         f"≤ Go p50 + 500 µs (+{add:,.0f} µs, {med['exec_py_p50'] / med['exec_go_p50']:.2f}×)",
         add <= 500),
        ("exec /bin/true p50, Go client", f"{med['exec_go_p50']:,.0f} µs", "yardstick", None),
        ("exec /bin/true p99, Python / Go",
         f"{med['exec_py_p99']:,.0f} / {med['exec_go_p99']:,.0f} µs", "-", None),
        ("exec /bin/true CPU per exec, Python / Go",
         f"{med['exec_py_cpu']:,.0f} / {med['exec_go_cpu']:,.0f} µs", "-", None),
        ("exec_start 1 GiB stdout", f"{med['stream_mbs']:,.0f} MB/s", "≥ 300 MB/s",
         med["stream_mbs"] >= 300),
        ("put_file 64 MiB (bytes)", f"{med['put_mbs']:,.0f} MB/s", "≥ 300 MB/s",
         med["put_mbs"] >= 300),
        ("get_file 64 MiB (bytes)", f"{med['get_mbs']:,.0f} MB/s", "≥ 300 MB/s",
         med["get_mbs"] >= 300),
        ("PutFile / GetFile 64 MiB, Go client",
         f"{med['go_put_mbs']:,.0f} / {med['go_get_mbs']:,.0f} MB/s", "yardstick", None),
        ("put_file_from 64 MiB (1 MiB chunks)", f"{med['put_stream_mbs']:,.0f} MB/s",
         "≥ 300 MB/s", med["put_stream_mbs"] >= 300),
        ("open_file 64 MiB (iterated)", f"{med['get_stream_mbs']:,.0f} MB/s", "≥ 300 MB/s",
         med["get_stream_mbs"] >= 300),
        ("50 concurrent execs: wall", f"{med['c50_wall_ms']:,.0f} ms", "-", None),
        ("50 concurrent execs: slowest exec", f"{med['c50_max_exec_ms']:,.0f} ms", "-", None),
        ("50 concurrent execs: longest loop gap", f"{med['c50_max_loop_gap_ms']:,.1f} ms",
         "no stall (< 100 ms)", med["c50_max_loop_gap_ms"] < 100),
    ]  # fmt: skip
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(f"{'benchmark':<{w0}}  {'median':>{w1}}  target")
    ok = True
    for name, val, target, met in rows:
        verdict = "" if met is None else ("  met" if met else "  NOT MET")
        ok = ok and met is not False
        print(f"{name:<{w0}}  {val:>{w1}}  {target}{verdict}")
    print(f"\n{len(rounds)} rounds, medians over rounds; MB/s = 10^6 bytes/s")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--gobench", required=True)
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_COUNT", "5")))
    ap.add_argument("-n", type=int, default=int(os.environ.get("BENCH_EXECS", "1000")))
    args = ap.parse_args()
    data = os.urandom(64 * MiB)
    rounds = []
    for i in range(args.rounds):
        go_first = i % 2 == 1
        print(f"round {i + 1}/{args.rounds}{' (Go first)' if go_first else ''}", file=sys.stderr)
        r = asyncio.run(round_(args, data, go_first))
        print("  " + json.dumps({k: round(v, 1) for k, v in r.items()}), file=sys.stderr)
        rounds.append(r)
    table(rounds)


if __name__ == "__main__":
    main()
