"""The client's basic path against a real daemon: connect, create, exec,
destroy."""

from __future__ import annotations

import pytest

from tai42_contract.sandbox import SandboxSessionNotFoundError, SandboxSessionSpec
from tai42_sandbox import Tai42Sandbox


async def test_connect_reads_defaults(sandbox: Tai42Sandbox) -> None:
    assert sandbox.exec_default_timeout_seconds == 60
    assert sandbox.reap_interval_seconds == 30
    assert sandbox.max_body_bytes > 0


async def test_create_exec_destroy(sandbox: Tai42Sandbox, spec: SandboxSessionSpec) -> None:
    s = await sandbox.create_session(spec)
    assert s.workspace_path.startswith("/")
    r = await s.exec(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_seconds=10)
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    await s.destroy()
    assert s.id not in [i.id for i in await sandbox.list_sessions()]
    with pytest.raises(SandboxSessionNotFoundError) as e:
        await sandbox.get_session(s.id)
    assert e.value.session_id == s.id
