"""The lifecycle against real daemons: the labels a sample's session has,
and that no way out of a sample, a task or a run leaves a session behind
(an interrupted sample, a create whose answer was lost, a task cleanup
after samples that never cleaned up, the CLI's cleanup)."""

from __future__ import annotations

import anyio
import pytest

from tai42_contract.sandbox import SandboxSessionSpec, SandboxSpecRejectedError
from tai42_contract.sandbox.errors import SandboxError
from tai42_sandbox import Tai42Sandbox, Tai42Session
from tai42_sandbox.inspect import Tai42SandboxConfig, Tai42SandboxEnvironment
from tai42_sandbox.inspect._environment import (
    LABEL_ENVIRONMENT,
    LABEL_RUN,
    LABEL_SAMPLE,
    LABEL_TASK,
    _create,
    _labels,
)

from .conftest import InspectDaemon


async def _sessions(d: InspectDaemon) -> dict[str, dict[str, str]]:
    async with Tai42Sandbox(d.daemon.url, d.daemon.token) as sb:
        return {s.id: s.labels for s in await sb.list_sessions()}


async def test_labels_name_the_run_task_and_sample(
    inspect_daemon: InspectDaemon, inspect_config: Tai42SandboxConfig
) -> None:
    envs = [
        await Tai42SandboxEnvironment.sample_init("my_task", inspect_config, {"__sample_id__": 7})  # type: ignore[dict-item]  # Inspect passes the id as it is
        for _ in range(2)
    ]
    try:
        ids = [e["default"].as_type(Tai42SandboxEnvironment).session_id for e in envs]
        live = await _sessions(inspect_daemon)
        a, b = live[ids[0]], live[ids[1]]
        assert (a[LABEL_TASK], a[LABEL_SAMPLE]) == ("my_task", "7")
        assert a[LABEL_RUN] == b[LABEL_RUN]
        assert a[LABEL_ENVIRONMENT] != b[LABEL_ENVIRONMENT]
    finally:
        for e in envs:
            await Tai42SandboxEnvironment.sample_cleanup("my_task", inspect_config, e, True)
    left = await _sessions(inspect_daemon)
    assert not set(ids) & set(left), "an interrupted sample's cleanup left its session"


async def test_config_labels_are_added(
    inspect_daemon: InspectDaemon, inspect_config: Tai42SandboxConfig
) -> None:
    cfg = inspect_config.model_copy(update={"labels": {"team": "evals"}})
    envs = await Tai42SandboxEnvironment.sample_init("t", cfg, {})
    try:
        sid = envs["default"].as_type(Tai42SandboxEnvironment).session_id
        assert (await _sessions(inspect_daemon))[sid]["team"] == "evals"
    finally:
        await Tai42SandboxEnvironment.sample_cleanup("t", cfg, envs, False)


async def test_cleanup_twice_and_after_the_session_is_gone(
    inspect_daemon: InspectDaemon, inspect_config: Tai42SandboxConfig
) -> None:
    envs = await Tai42SandboxEnvironment.sample_init("t", inspect_config, {})
    env = envs["default"].as_type(Tai42SandboxEnvironment)
    async with Tai42Sandbox(inspect_daemon.daemon.url, inspect_daemon.daemon.token) as sb:
        await sb.destroy_session(env.session_id)
    await Tai42SandboxEnvironment.sample_cleanup("t", inspect_config, envs, False)
    await env.close()


async def test_cleanup_runs_when_cancelled(
    inspect_daemon: InspectDaemon, inspect_config: Tai42SandboxConfig
) -> None:
    envs = await Tai42SandboxEnvironment.sample_init("t", inspect_config, {})
    sid = envs["default"].as_type(Tai42SandboxEnvironment).session_id
    with anyio.CancelScope() as scope:
        scope.cancel()  # the sample's own scope is cancelled as its cleanup starts
        await Tai42SandboxEnvironment.sample_cleanup("t", inspect_config, envs, True)
    assert sid not in await _sessions(inspect_daemon)


class _AnswerLost(Tai42Sandbox):
    """A client whose create reaches the daemon but whose caller is
    cancelled before the answer: the session exists, its id unknown."""

    async def create_session(self, spec: SandboxSessionSpec) -> Tai42Session:
        await super().create_session(spec)
        raise anyio.get_cancelled_exc_class()()


async def test_create_cut_short_leaves_no_session(
    inspect_daemon: InspectDaemon, inspect_config: Tai42SandboxConfig
) -> None:
    labels = _labels("t", None, None, "env-cut-short")
    async with _AnswerLost(inspect_daemon.daemon.url, inspect_daemon.daemon.token) as sb:
        with pytest.raises(anyio.get_cancelled_exc_class()):
            await _create(sb, inspect_config, labels)
    left = await _sessions(inspect_daemon)
    assert [s for s, lb in left.items() if lb.get(LABEL_ENVIRONMENT) == "env-cut-short"] == []


async def test_task_cleanup_destroys_what_samples_left(
    inspect_daemon: InspectDaemon,
    inspect_config: Tai42SandboxConfig,
    capsys: pytest.CaptureFixture[str],
) -> None:
    envs = await Tai42SandboxEnvironment.sample_init("t", inspect_config, {})
    env = envs["default"].as_type(Tai42SandboxEnvironment)
    try:
        # --no-sandbox-cleanup: kept, and said how to reach and remove it
        await Tai42SandboxEnvironment.task_cleanup("shutdown", inspect_config, False)
        assert env.session_id in await _sessions(inspect_daemon)
        out = capsys.readouterr().out
        assert f"tai42 shell {env.session_id}" in out
        assert "inspect sandbox cleanup tai42" in out
        await Tai42SandboxEnvironment.task_cleanup("shutdown", inspect_config, True)
        assert env.session_id not in await _sessions(inspect_daemon)
    finally:
        await env.close()  # the client; the session is already gone


async def test_cli_cleanup(inspect_daemon: InspectDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    d = inspect_daemon.daemon
    monkeypatch.setenv("TAI42_URL", d.url)
    monkeypatch.setenv("TAI42_TOKEN", d.token)
    cfg = Tai42SandboxConfig(image=inspect_daemon.image, ttl_seconds=600)
    envs = [await Tai42SandboxEnvironment.sample_init("t", cfg, {}) for _ in range(3)]
    ours = [e["default"].as_type(Tai42SandboxEnvironment) for e in envs]
    async with Tai42Sandbox(d.url, d.token) as sb:
        other = await sb.create_session(SandboxSessionSpec(image="host", ttl_seconds=600))
        try:
            with pytest.raises(ValueError, match="not made by Inspect"):
                await Tai42SandboxEnvironment.cli_cleanup(other.id)
            await Tai42SandboxEnvironment.cli_cleanup(ours[0].session_id)
            left = await _sessions(inspect_daemon)
            assert ours[0].session_id not in left
            assert ours[1].session_id in left
            await Tai42SandboxEnvironment.cli_cleanup(None)
            left = await _sessions(inspect_daemon)
            assert not {e.session_id for e in ours} & set(left)
            assert other.id in left, "the CLI cleanup destroyed a session not made by Inspect"
        finally:
            await other.destroy()
            for e in ours:
                await e.close()


async def test_task_init_refuses_an_unknown_image(inspect_daemon: InspectDaemon) -> None:
    d = inspect_daemon.daemon
    cfg = Tai42SandboxConfig(image="no-such-image-tai42", url=d.url, token=d.token)
    before = await _sessions(inspect_daemon)
    with pytest.raises(SandboxSpecRejectedError) as e:
        await Tai42SandboxEnvironment.task_init("startup", cfg)
    assert e.value.field == "image"
    assert await _sessions(inspect_daemon) == before


async def test_task_init_checks_the_spec_and_leaves_nothing(
    inspect_daemon: InspectDaemon, inspect_config: Tai42SandboxConfig
) -> None:
    before = await _sessions(inspect_daemon)
    await Tai42SandboxEnvironment.task_init("startup", inspect_config)
    assert await _sessions(inspect_daemon) == before


async def test_no_daemon(tmp_path_factory: pytest.TempPathFactory) -> None:
    sock = tmp_path_factory.mktemp("none") / "no.sock"
    cfg = Tai42SandboxConfig(url=f"unix:{sock}", token="t")
    with pytest.raises(SandboxError, match="cannot reach the daemon"):
        await Tai42SandboxEnvironment.sample_init("t", cfg, {})
    with pytest.raises(SandboxError, match="cannot reach the daemon"):
        await Tai42SandboxEnvironment.task_init("startup", cfg)
