"""What the client asks of whatever answers it: JSON, never a compressed
body (it reads bodies as sent, so a proxy that gzipped a file would corrupt
it), and the bearer token."""

from __future__ import annotations

import asyncio

from tai42_sandbox import Tai42Sandbox

_SANDBOX = (
    b'{"provider":"host","exec_default_timeout_seconds":1,"reap_interval_seconds":1,'
    b'"policy":{"egress":"none","isolation":"none","scrub_transcript":false,"durable":false},'
    b'"max_body_bytes":1,"version":"x"}'
)


async def test_asks_for_identity_encoding() -> None:
    seen: list[bytes] = []

    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        seen.append(await r.readuntil(b"\r\n\r\n"))
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(_SANDBOX) + _SANDBOX
        )
        await w.drain()
        w.close()
        await w.wait_closed()

    srv = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        async with Tai42Sandbox(f"http://127.0.0.1:{port}", "tok") as sb:
            assert sb.exec_default_timeout_seconds == 1
    finally:
        srv.close()
        await srv.wait_closed()
    headers = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(":") for line in seen[0].decode().split("\r\n")[1:] if line)
    }
    assert headers["accept-encoding"] == "identity"
    assert headers["accept"] == "application/json"
    assert headers["authorization"] == "Bearer tok"
