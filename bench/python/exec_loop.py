"""N execs of /bin/true through the Python client after a fixed warm-up,
nothing else: run under valgrind's callgrind with N=0 and N=n, the
difference of the instruction counts over n is the client's instructions
per exec, a figure the machine's load does not move (bench/python.sh with
BENCH_CALLGRIND=1 does this).

    python exec_loop.py --url unix:/path.sock --token T -n 1000
"""

from __future__ import annotations

import argparse
import asyncio

from tai42_contract.sandbox import SandboxSessionSpec
from tai42_sandbox import Tai42Sandbox

WARM = 200


async def main(url: str, token: str, n: int) -> None:
    async with Tai42Sandbox(url, token) as sb:
        s = await sb.create_session(SandboxSessionSpec(image="host", ttl_seconds=600))
        try:
            for _ in range(WARM + n):
                await s.exec(["/bin/true"], timeout_seconds=10)
        finally:
            await s.destroy()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("-n", type=int, required=True)
    a = ap.parse_args()
    asyncio.run(main(a.url, a.token, a.n))
