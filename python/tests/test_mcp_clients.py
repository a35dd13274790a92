"""The official MCP Python SDK's client (``mcp`` from PyPI) driving tai42's
MCP server over both transports against a real daemon of each provider:
``tai42 mcp`` over stdio (on the daemon, through TAI42_URL) and the daemon's
``/mcp`` over Streamable HTTP. The daemon's policy caps the network at
internal, so that egress is a rejected spec."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx2
import jsonschema
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent

from tai42_sandbox import Tai42Sandbox

from .conftest import Daemon

TOOLS = sorted(
    [
        "close_process_stdin",
        "create_session",
        "destroy_session",
        "kill_process",
        "list_dir",
        "list_processes",
        "list_sessions",
        "read_file",
        "read_process_output",
        "run",
        "start_process",
        "touch",
        "write_file",
        "write_process_stdin",
    ]
)

TRANSPORTS = ["stdio", "http"]


@pytest.fixture
def mcp_daemon(daemon_factory: Callable[..., Daemon]) -> Daemon:
    return daemon_factory("--policy-egress", "internal", tcp=True)


@asynccontextmanager
async def connect(kind: str, d: Daemon, tai42_bin: str) -> AsyncIterator[Client]:
    """A connection as an agent makes it; leaving the block ends it (the
    stdio server's stdin closed, or the HTTP session deleted)."""
    async with AsyncExitStack() as stack:
        server: Any
        if kind == "stdio":
            server = StdioServerParameters(
                command=tai42_bin,
                args=["mcp"],
                # tai42 mcp refuses a daemon of the host runner (no
                # sandbox) unless opted into.
                env={
                    "PATH": os.environ["PATH"],
                    "TAI42_URL": d.url,
                    "TAI42_TOKEN": d.token,
                    **({"TAI42_ALLOW_UNSANDBOXED": "true"} if d.provider == "host" else {}),
                },
            )
        else:
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {d.token}"}, timeout=60)
            )
            server = streamable_http_client(f"{d.url}/mcp", http_client=http)
        yield await stack.enter_async_context(Client(server))


def text(res: CallToolResult) -> str:
    return "".join(c.text for c in res.content if isinstance(c, TextContent))


async def ok(client: Client, name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    res = await client.call_tool(name, args or {})
    assert not res.is_error, f"{name}: {text(res)}"
    assert isinstance(res.structured_content, dict), f"{name}: {res}"
    return res.structured_content


async def fails(client: Client, name: str, args: dict[str, Any], *want: str) -> str:
    res = await client.call_tool(name, args)
    msg = text(res)
    assert res.is_error, f"{name}: want a tool error, got {msg}"
    for w in want:
        assert w in msg, f"{name}: {msg!r} does not say {w!r}"
    return msg


async def read_until(client: Client, pid: str, cursor: int, want: str) -> tuple[str, int]:
    seen = ""
    deadline = time.monotonic() + 30
    while True:
        r = await ok(
            client, "read_process_output", {"process_id": pid, "cursor": cursor, "wait_seconds": 5}
        )
        seen += r["stdout"] + r["stderr"]
        cursor = r["next_cursor"]
        if want in seen:
            return seen, cursor
        assert r["running"], f"{pid} ended without {want!r}: {seen!r}"
        assert time.monotonic() < deadline, f"no {want!r} in {seen!r}"


async def session_ids(d: Daemon) -> set[str]:
    async with Tai42Sandbox(d.url, d.token) as sb:
        return {info.id for info in await sb.list_sessions()}


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_tools_and_schemas(kind: str, mcp_daemon: Daemon, tai42_bin: str) -> None:
    async with connect(kind, mcp_daemon, tai42_bin) as client:
        tools = (await client.list_tools()).tools
        assert sorted(t.name for t in tools) == TOOLS
        for t in tools:
            assert t.description, t.name
            assert len(t.description) > 40, t.name
            assert t.input_schema["type"] == "object", t.name
            jsonschema.Draft202012Validator.check_schema(t.input_schema)
            assert t.output_schema is not None, t.name
            jsonschema.Draft202012Validator.check_schema(t.output_schema)
        create = next(t for t in tools if t.name == "create_session").input_schema
        jsonschema.validate({"network": "none", "ttl_seconds": 60}, create)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"network": "lan"}, create)


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_sessions_files_and_a_background_server(
    kind: str, mcp_daemon: Daemon, tai42_bin: str
) -> None:
    async with connect(kind, mcp_daemon, tai42_bin) as client:
        s = await ok(client, "create_session", {"image": "host", "labels": {"via": kind}})
        sid = s["session_id"]
        # The agent is told what isolation it really has: none on the host runner.
        want = "none" if mcp_daemon.provider == "host" else "container"
        assert (s["isolation"], s["network"]) == (want, "none")
        r = await ok(
            client, "run", {"session_id": sid, "command": "echo out; echo err >&2; exit 3"}
        )
        assert (r["exit_code"], r["stdout"], r["stderr"]) == (3, "out\n", "err\n")

        await ok(
            client,
            "write_file",
            {"session_id": sid, "path": "www/hello.txt", "content": f"hello from {kind}"},
        )
        blob = bytes([0, 1, 2, 253, 254, 255])
        await ok(
            client,
            "write_file",
            {
                "session_id": sid,
                "path": "b.bin",
                "content": base64.b64encode(blob).decode(),
                "encoding": "base64",
            },
        )
        t = await ok(client, "read_file", {"session_id": sid, "path": "www/hello.txt"})
        assert (t["content"], t["encoding"], t["eof"]) == (f"hello from {kind}", "text", True)
        b = await ok(client, "read_file", {"session_id": sid, "path": "b.bin"})
        assert b["encoding"] == "base64"
        assert base64.b64decode(b["content"]) == blob

        p = await ok(
            client,
            "start_process",
            {
                "session_id": sid,
                "cwd": "www",
                "argv": ["python3", "-u", "-m", "http.server", "--bind", "127.0.0.1", "0"],
            },
        )
        seen, cursor = await read_until(client, p["process_id"], 0, "Serving HTTP")
        m = re.search(r"port (\d+)", seen)
        assert m, seen
        url = f"http://127.0.0.1:{m[1]}/hello.txt"
        fetch = f"import urllib.request; print(urllib.request.urlopen({url!r}).read().decode())"
        got = await ok(client, "run", {"session_id": sid, "argv": ["python3", "-c", fetch]})
        assert got["stdout"] == f"hello from {kind}\n"
        await read_until(client, p["process_id"], cursor, "GET /hello.txt")
        k = await ok(client, "kill_process", {"process_id": p["process_id"]})
        assert k["exit_code"] in (137, 143), k

        await ok(client, "destroy_session", {"session_id": sid})
        assert sid not in await session_ids(mcp_daemon)


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_errors_are_tool_errors(kind: str, mcp_daemon: Daemon, tai42_bin: str) -> None:
    async with connect(kind, mcp_daemon, tai42_bin) as client:
        sid = (await ok(client, "create_session", {"image": "host"}))["session_id"]
        await fails(
            client,
            "run",
            {"session_id": sid, "command": "printf abc; exec sleep 30", "timeout_seconds": 0.5},
            "timed out after 500ms",
            "3 bytes to stdout",
        )
        await fails(client, "create_session", {"network": "egress"}, "network", "policy")
        await fails(client, "read_file", {"session_id": sid, "path": "no/such.txt"}, "no/such.txt")
        await fails(client, "run", {"session_id": "sb-missing", "argv": ["true"]}, "sb-missing")
        r = await ok(client, "run", {"session_id": sid, "argv": ["true"]})
        assert r["exit_code"] == 0


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_disconnect_destroys_sessions(kind: str, mcp_daemon: Daemon, tai42_bin: str) -> None:
    async with connect(kind, mcp_daemon, tai42_bin) as client:
        a = (await ok(client, "create_session", {"image": "host"}))["session_id"]
        await ok(client, "start_process", {"session_id": a, "argv": ["sleep", "300"]})
        assert a in await session_ids(mcp_daemon)
    deadline = time.monotonic() + 20
    while a in await session_ids(mcp_daemon):
        assert time.monotonic() < deadline, f"{a} outlived its connection"
        await asyncio.sleep(0.05)
