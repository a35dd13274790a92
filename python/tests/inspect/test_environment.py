"""The environment's exec and files against real daemons, beyond what
Inspect's self_check asks: which failures become which of Inspect's errors
(and which stay results), the output limits on both exec paths, partial
output on a timeout, cancellation, keep-alive, and a session that is gone."""

from __future__ import annotations

import os
import subprocess
import time
from functools import partial

import anyio
import pytest
from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxUnavailableError,
    override_sandbox_output_limit,
)

from tai42_contract.sandbox.errors import SandboxError
from tai42_sandbox import Tai42Sandbox
from tai42_sandbox.inspect import Tai42SandboxConfig, Tai42SandboxEnvironment, _environment

from .conftest import InspectDaemon

# 16 arguments of 64 KiB: over the exec stream's 1 MiB start frame, so the
# exec goes as a one-shot exec.
LARGE_ARGV = ["x" * (64 * 1024)] * 16


async def test_permission_error_only_for_the_command_itself(
    tai42_env: Tai42SandboxEnvironment,
) -> None:
    with pytest.raises(PermissionError) as e:
        await tai42_env.exec(["/etc/passwd"])
    assert e.value.filename == "/etc/passwd"
    # A script of the caller's that cannot run is the caller's result.
    r = await tai42_env.exec(["sh", "-c", "/etc/passwd"])
    assert r.returncode == 126
    assert not r.success


async def test_missing_command_is_a_result(tai42_env: Tai42SandboxEnvironment) -> None:
    r = await tai42_env.exec(["no-such-command-tai42"])
    assert r.returncode == 127
    assert "no-such-command-tai42" in r.stderr


async def test_timeout_keeps_partial_output(tai42_env: Tai42SandboxEnvironment) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        await tai42_env.exec(["sh", "-c", "echo partial; exec sleep 30"], timeout=1)
    assert time.monotonic() - started < 15
    assert "timed out after 1 seconds" in str(e.value)
    assert getattr(e.value, "truncated_output", None) == "partial\n"


async def test_output_limit_stops_the_exec(tai42_env: Tai42SandboxEnvironment) -> None:
    started = time.monotonic()
    with override_sandbox_output_limit(1024, "exec"), pytest.raises(OutputLimitExceededError) as e:
        # Endless output: only the limit ends it, long before the timeout.
        await tai42_env.exec(["sh", "-c", "echo start; exec yes"], timeout=120)
    assert time.monotonic() - started < 30
    assert "limit of 1 KiB was exceeded" in str(e.value)
    assert e.value.truncated_output is not None
    assert e.value.truncated_output.startswith("start\ny\n")
    assert len(e.value.truncated_output) == 1024


async def test_output_limit_counts_each_stream(tai42_env: Tai42SandboxEnvironment) -> None:
    with override_sandbox_output_limit(1024, "exec"):
        r = await tai42_env.exec(["sh", "-c", "head -c 1024 /dev/zero; head -c 1024 /dev/zero >&2"])
        assert (len(r.stdout), len(r.stderr)) == (1024, 1024)
        with pytest.raises(OutputLimitExceededError):
            await tai42_env.exec(["sh", "-c", "head -c 1025 /dev/zero >&2"])


async def test_large_argv_goes_one_shot_with_the_limit(tai42_env: Tai42SandboxEnvironment) -> None:
    r = await tai42_env.exec(["sh", "-c", 'printf %s "$@" | wc -c', "sh", *LARGE_ARGV])
    assert r.stdout.strip() == str(16 * 64 * 1024)
    with override_sandbox_output_limit(1024, "exec"), pytest.raises(OutputLimitExceededError) as e:
        await tai42_env.exec(["sh", "-c", "head -c 5000 /dev/zero", "sh", *LARGE_ARGV])
    assert e.value.truncated_output == "\0" * 1024


async def test_large_stdin_to_a_command_that_does_not_read_it(
    tai42_env: Tai42SandboxEnvironment,
) -> None:
    r = await tai42_env.exec(["true"], input=b"x" * (8 << 20), timeout=60)
    assert r.success


async def test_output_that_is_not_utf8(tai42_env: Tai42SandboxEnvironment) -> None:
    r = await tai42_env.exec(["printf", "\\303\\050"])
    assert r.stdout == "\ufffd("
    await tai42_env.write_file("bad.txt", b"\xc3\x28")
    with pytest.raises(UnicodeDecodeError):
        await tai42_env.read_file("bad.txt", text=True)
    assert await tai42_env.read_file("bad.txt", text=False) == b"\xc3\x28"


async def test_text_keeps_crlf(tai42_env: Tai42SandboxEnvironment) -> None:
    await tai42_env.write_file("crlf.txt", "a\r\nb\r\n")
    assert await tai42_env.read_file("crlf.txt") == "a\r\nb\r\n"


async def test_env_overlays_the_config(inspect_config: Tai42SandboxConfig) -> None:
    cfg = inspect_config.model_copy(update={"env": {"A": "base", "B": "base"}})
    envs = await Tai42SandboxEnvironment.sample_init("test", cfg, {})
    try:
        r = await envs["default"].exec(["sh", "-c", 'echo "$A $B"'], env={"B": "exec"})
        assert r.stdout == "base exec\n"
    finally:
        await Tai42SandboxEnvironment.sample_cleanup("test", cfg, envs, False)


async def test_concurrent_execs(tai42_env: Tai42SandboxEnvironment) -> None:
    results: dict[int, str] = {}

    async def one(i: int) -> None:
        results[i] = (await tai42_env.exec(["sh", "-c", f"sleep 0.2; echo {i}"])).stdout

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)
    assert results == {i: f"{i}\n" for i in range(6)}


async def test_cancelled_exec_is_killed(tai42_env: Tai42SandboxEnvironment) -> None:
    marker = f"tai42-cancel-{time.monotonic_ns()}"
    with anyio.move_on_after(1):
        await tai42_env.exec(["sh", "-c", f"sleep 30 # {marker}"], timeout=60)
    # The kill ended the process group: nothing of the exec is left.
    deadline = time.monotonic() + 10
    while True:
        r = await tai42_env.exec(["sh", "-c", f"ps -eo args | grep -v grep | grep -c {marker}"])
        if r.stdout.strip() == "0" or time.monotonic() > deadline:
            break
        await anyio.sleep(0.2)
    assert r.stdout.strip() == "0", "the cancelled exec still runs"


async def test_write_to_a_read_only_path(inspect_daemon: InspectDaemon) -> None:
    d = inspect_daemon.daemon
    # The image "host": on the container provider the host's /usr, read-only.
    cfg = Tai42SandboxConfig(image="host", url=d.url, token=d.token, ttl_seconds=600)
    envs = await Tai42SandboxEnvironment.sample_init("test", cfg, {})
    try:
        if inspect_daemon.provider == "container":
            with pytest.raises(PermissionError) as e:
                await envs["default"].write_file("/usr/tai42-test-file", "x")
            assert e.value.filename == "/usr/tai42-test-file"
        else:
            # The host runner refuses the path itself: the daemon's error, as
            # it is (/usr is no directory to write, nor the reason).
            with pytest.raises(SandboxError, match="outside the workspace"):
                await envs["default"].write_file("/usr/tai42-test-file", "x")
    finally:
        await Tai42SandboxEnvironment.sample_cleanup("test", cfg, envs, False)


async def test_session_gone_is_unavailable(
    tai42_env: Tai42SandboxEnvironment, inspect_daemon: InspectDaemon
) -> None:
    d = inspect_daemon.daemon
    async with Tai42Sandbox(d.url, d.token) as sb:
        await sb.destroy_session(tai42_env.session_id)
    with pytest.raises(SandboxUnavailableError, match="is gone"):
        await tai42_env.exec(["true"])
    with pytest.raises(SandboxUnavailableError):
        await tai42_env.read_file("x")
    with pytest.raises(SandboxUnavailableError):
        await tai42_env.write_file("x", "y")


async def test_use_keeps_the_session_alive(
    tai42_env: Tai42SandboxEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = (await tai42_env.session.info()).expires_at
    monkeypatch.setattr(_environment, "TOUCH_EVERY", 0.0)
    await anyio.sleep(1.1)
    await tai42_env.exec(["true"])
    after = (await tai42_env.session.info()).expires_at
    assert after > before


async def test_an_exec_as_long_as_the_ttl_is_kept_alive_through(
    tai42_env: Tai42SandboxEnvironment,
) -> None:
    before = (await tai42_env.session.info()).expires_at
    await anyio.sleep(1.1)
    await tai42_env.exec(["true"], timeout=10)  # well within the life left: no touch
    assert (await tai42_env.session.info()).expires_at == before
    await tai42_env.exec(["true"], timeout=600)  # the ttl: the life left is shorter
    assert (await tai42_env.session.info()).expires_at > before


async def test_connection_opens_a_shell_in_the_session(
    tai42_env: Tai42SandboxEnvironment, inspect_daemon: InspectDaemon, tai42_bin: str
) -> None:
    c = await tai42_env.connection()
    assert c.type == "tai42"
    assert c.command.endswith(f"tai42 shell {tai42_env.session_id}")
    assert "TAI42_URL=" in c.command  # the config's url: not the default daemon
    as_nobody = await tai42_env.connection(user="nobody")
    assert as_nobody.command.endswith(f"tai42 shell --user nobody {tai42_env.session_id}")
    # The command as a user runs it, its commands on stdin (no terminal).
    env = {
        "PATH": f"{os.path.dirname(tai42_bin)}:{os.environ['PATH']}",
        "TAI42_TOKEN": inspect_daemon.daemon.token,
    }
    shell = partial(
        subprocess.run,
        ["sh", "-c", as_nobody.command],  # verbatim: tai42 found on PATH
        input="id -un; pwd\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    done = await anyio.to_thread.run_sync(shell)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["nobody", tai42_env.session.workspace_path]
