"""Real daemons for the tests: a ``tai42 serve`` per test session and per
provider available (host always; container as root with runc or crun), on a
unix socket in a temp dir with its own state dir and token.

The binary is $TAI42_BIN, else a ``go build`` of the worktree's ./cmd/tai42.
Fixtures: ``daemon`` (the running daemon of a provider), ``daemon_url``,
``daemon_token``, ``sandbox`` (a connected Tai42Sandbox whose sessions are
destroyed after the test), ``spec`` (a session spec for the provider), and
``daemon_factory`` (a daemon of the test's own, with extra flags, stopped at
its end). Every daemon is stopped by PID. An autouse check fails a test that
leaves an asyncio task pending or a socket open.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tai42_contract.sandbox import SandboxSessionSpec
from tai42_sandbox import Tai42Sandbox

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


def _providers() -> list[str]:
    found = ["host"]
    if os.geteuid() == 0 and (shutil.which("runc") or shutil.which("crun")):
        found.append("container")
    wanted = os.environ.get("TAI42_TEST_PROVIDERS")
    return [p for p in found if not wanted or p in wanted.split(",")]


@pytest.fixture(scope="session")
def tai42_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    given = os.environ.get("TAI42_BIN")
    if given:
        return given
    out = tmp_path_factory.mktemp("bin") / "tai42"
    go = shutil.which("go") or "/usr/local/go/bin/go"
    subprocess.run([go, "build", "-o", str(out), "./cmd/tai42"], cwd=REPO, check=True)
    return str(out)


class Daemon:
    """One ``tai42 serve`` on a unix socket, stopped by PID."""

    def __init__(
        self, binary: str, provider: str, extra: tuple[str, ...] = (), tcp: bool = False
    ) -> None:
        self.provider = provider
        # A short directory: a unix socket's path is at most 107 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="t42py-"))
        self.socket = self.dir / "d.sock"
        self.state = self.dir / "state"
        self.token = secrets.token_hex(32)
        self.url = "127.0.0.1:0" if tcp else f"unix:{self.socket}"
        self.log = self.dir / "daemon.log"
        self.args = [
            binary,
            "serve",
            "--listen",
            self.url,
            "--state-dir",
            str(self.state),
            "--provider",
            provider,
            "--log-level",
            "warn",
            "--net-prefix",
            "y" + secrets.token_hex(2),  # unique: daemons may run side by side
            # A test reaches no registry it did not start: an image the
            # store lacks is rejected, never looked up on Docker Hub.
            *(("--pull", "never") if provider == "container" else ()),
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.crashed = False

    def start(self) -> Daemon:
        env = {**os.environ, "TAI42_TOKEN": self.token}
        env.pop("TAI42_CONFIG", None)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        deadline = time.monotonic() + START_TIMEOUT
        while (m := re.search(rb"listening on (\S+)", self.log.read_bytes())) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                said = self.log.read_text()  # before stop removes the directory
                self.stop()
                raise RuntimeError(f"tai42 serve did not start: {said}")
            time.sleep(0.02)
        addr = m.group(1).decode()
        self.url = addr if addr.startswith("unix:") else "http://" + addr
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: the daemon dies as in a crash, leaving its sessions'
        resources (mounts, loop devices, network namespaces) behind."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.crashed = True

    def stop(self) -> None:
        if self.crashed:
            # Started again on its state dir, a daemon brings back what a
            # crash left, and a graceful stop then destroys it all.
            self.crashed = False
            self.log.write_bytes(b"")
            self.start()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session", params=_providers())
def daemon(request: pytest.FixtureRequest, tai42_bin: str) -> Iterator[Daemon]:
    d = Daemon(tai42_bin, request.param).start()
    yield d
    d.stop()


@pytest.fixture
def daemon_url(daemon: Daemon) -> str:
    return daemon.url


@pytest.fixture
def daemon_token(daemon: Daemon) -> str:
    return daemon.token


@pytest.fixture
def spec() -> SandboxSessionSpec:
    # Both providers honour the image "host".
    return SandboxSessionSpec(image="host", ttl_seconds=600)


@pytest.fixture
def daemon_factory(tai42_bin: str, daemon: Daemon) -> Iterator[Callable[..., Daemon]]:
    """Starts daemons of the test's own (same provider, extra flags)."""
    made: list[Daemon] = []

    def make(*extra: str, tcp: bool = False) -> Daemon:
        d = Daemon(tai42_bin, daemon.provider, extra, tcp).start()
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


async def _destroy_all(sb: Tai42Sandbox) -> None:
    for info in await sb.list_sessions():
        await sb.destroy_session(info.id)


@pytest.fixture
async def sandbox(daemon: Daemon) -> AsyncIterator[Tai42Sandbox]:
    async with Tai42Sandbox(daemon.url, daemon.token) as sb:
        try:
            yield sb
        finally:
            await _destroy_all(sb)


def _sockets() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(f"{fd}:{target}")
    return out


@pytest.fixture(autouse=True)
async def no_leaks() -> AsyncIterator[None]:
    """Fails a test that leaves a task pending or a socket open (the loop's
    own self-pipe sockets exist before and after)."""
    before = _sockets()
    yield
    me = asyncio.current_task()
    deadline = time.monotonic() + 2.0
    pending: list[Any] = []
    while time.monotonic() < deadline:
        pending = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if not pending and _sockets() <= before:
            break
        await asyncio.sleep(0.01)
    assert not pending, f"tasks left pending: {pending}"
    left = _sockets() - before
    assert not left, f"sockets left open: {sorted(left)}"
