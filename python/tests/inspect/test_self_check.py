"""Inspect's own conformance checks (inspect_ai.util._sandbox.self_check)
against the tai42 sandbox: the container provider with the Debian image,
and the host runner.

Each check gets a fresh sample environment (its own session, made by
sample_init and destroyed by sample_cleanup), so the checks cannot see each
other's leftovers and every one of them also exercises the lifecycle. A
check this sandbox cannot pass is listed with the reason, and marked xfail
strict: it must fail, so a list that grows stale fails too. A check that
would change the machine outside the session when run by the host runner is
skipped there, saying so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from inspect_ai.util import SandboxEnvironment

# Every check of Inspect's suite, collected as tests of this module.
from inspect_ai.util._sandbox.self_check import *  # noqa: F403

from tai42_sandbox import Tai42Sandbox
from tai42_sandbox.inspect import Tai42SandboxConfig, Tai42SandboxEnvironment

from .conftest import InspectDaemon, container_available, wanted

# Root may read a file whatever its mode, and the daemon replaces a file
# by a rename in its directory, which the file's own mode does not govern.
ROOT = {
    "test_read_file_not_allowed": "root reads a file after chmod -r",
    "test_write_text_file_without_permissions": (
        "root (and the daemon's atomic replace) writes a file after chmod -w"
    ),
    "test_write_binary_file_without_permissions": (
        "root (and the daemon's atomic replace) writes a file after chmod -w"
    ),
}

# The host runner shares the host's filesystem: the daemon refuses a file
# path or a cwd outside the session's workspace (docs/contract.md, "Paths").
OUTSIDE = (
    "the host runner refuses a path outside the workspace "
    "(the session shares the host's filesystem)"
)
HOST = {
    **ROOT,
    "test_read_and_write_file_including_directory_absolute": OUTSIDE,
    "test_write_text_file_is_directory": OUTSIDE,
    "test_write_binary_file_is_directory": OUTSIDE,
    "test_cwd_custom": OUTSIDE,
}
HOST_SKIP = {
    "test_exec_as_user": "would add a user to the host machine's /etc/passwd",
    "test_cwd_absolute": (
        "would leave a directory in the host's /tmp: its mkdir runs, the file it "
        "then writes there is refused"
    ),
}


@dataclass
class Target:
    id: str
    fixture: str
    xfail: dict[str, str]
    skip: dict[str, str] = field(default_factory=dict)


TARGETS = [
    Target("container-debian", "container_daemon", ROOT),
    Target("host", "host_daemon", HOST, HOST_SKIP),
]


def _params() -> list[object]:
    out: list[object] = []
    for t in TARGETS:
        provider = "container" if t.fixture == "container_daemon" else "host"
        marks = []
        if not wanted(provider):
            marks.append(pytest.mark.skip(reason=f"TAI42_TEST_PROVIDERS leaves out {provider}"))
        elif provider == "container" and not container_available():
            marks.append(pytest.mark.skip(reason="the container provider needs root and runc/crun"))
        out.append(pytest.param(t, id=t.id, marks=marks))
    return out


@pytest.fixture(params=_params())
def target(request: pytest.FixtureRequest) -> Target:
    t: Target = request.param
    return t


@pytest.fixture
def target_daemon(request: pytest.FixtureRequest, target: Target) -> InspectDaemon:
    """The target's daemon; the check's known failure marked first."""
    name = request.node.originalname
    if name in target.skip:
        pytest.skip(target.skip[name])
    if name in target.xfail:
        request.node.add_marker(pytest.mark.xfail(reason=target.xfail[name], strict=True))
    d: InspectDaemon = request.getfixturevalue(target.fixture)
    return d


@pytest.fixture
async def sandbox_env(target_daemon: InspectDaemon) -> AsyncIterator[SandboxEnvironment]:
    d = target_daemon
    config = Tai42SandboxConfig(
        image=d.image, url=d.daemon.url, token=d.daemon.token, ttl_seconds=600
    )
    envs = await Tai42SandboxEnvironment.sample_init("self_check", config, {})
    env = envs["default"]
    session_id = env.as_type(Tai42SandboxEnvironment).session_id
    try:
        yield env
    finally:
        await Tai42SandboxEnvironment.sample_cleanup("self_check", config, envs, False)
        async with Tai42Sandbox(d.daemon.url, d.daemon.token) as sb:
            left = [s.id for s in await sb.list_sessions()]
        assert session_id not in left, "sample_cleanup left the session"
