"""Persistent workspaces through the client: list, remove, and their
errors (a key in use, a key with no workspace, an invalid key)."""

from __future__ import annotations

import pytest

from tai42_contract.sandbox import (
    SandboxError,
    SandboxSessionSpec,
    SandboxSpecRejectedError,
    SandboxWorkspaceNotFoundError,
)
from tai42_sandbox import Tai42Sandbox


async def test_workspaces(sandbox: Tai42Sandbox) -> None:
    key = "py-client-ws"
    spec = SandboxSessionSpec(
        image="host", ttl_seconds=60, durability="persistent", workspace_key=key
    )
    s = await sandbox.create_session(spec)
    await s.put_file("kept.txt", b"survives")
    ws = {w.key: w for w in await sandbox.list_workspaces()}
    assert ws[key].in_use_by == s.id
    with pytest.raises(SandboxSpecRejectedError) as e:
        await sandbox.remove_workspace(key)
    assert (e.value.field, e.value.reason) == ("workspace_key", "conflict")
    assert s.id in str(e.value)
    await s.destroy()
    again = await sandbox.create_session(spec)
    assert await again.get_file("kept.txt") == b"survives"
    await again.destroy()
    assert {w.key: w for w in await sandbox.list_workspaces()}[key].in_use_by == ""
    await sandbox.remove_workspace(key)
    assert key not in [w.key for w in await sandbox.list_workspaces()]
    with pytest.raises(SandboxWorkspaceNotFoundError) as e2:
        await sandbox.remove_workspace(key)
    assert e2.value.workspace_key == key


async def test_invalid_key_refused_without_a_request(sandbox: Tai42Sandbox) -> None:
    with pytest.raises(SandboxError, match="no workspace can have it") as e:
        await sandbox.remove_workspace("a/b")
    assert e.value.op == "remove_workspace"
