"""The suite's machinery, without a daemon: the clause list and CLAUSES.md,
selection, options, how a clause's outcome is reported (pass, error, fatal,
skip, an exception, a deadline), that teardown always runs, and the pytest
plugin's mapping of outcomes to tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tai42_contract.sandbox import Sandbox
from tai42_contract.sandbox import testing as suite
from tai42_contract.sandbox.testing import (
    Clause,
    Config,
    ConfigRefused,
    Factory,
    Options,
    clauses,
    run,
    run_clause,
    select,
)
from tai42_contract.sandbox.testing._suite import GROUPS, MARKER_VAR, Check

from .stub import Stub

pytest_plugins = ["pytester"]

OPTS = Options(image="host", isolation="none", networks=("none",))


class Tracker:
    """A factory of Stubs that records what it was asked for and closed."""

    def __init__(self, refuse: bool = False) -> None:
        self.configs: list[Config] = []
        self.closed = 0
        self.made: list[Stub] = []
        self.refuse = refuse

    @contextlib.asynccontextmanager
    async def __call__(self, cfg: Config) -> AsyncIterator[Sandbox]:
        if self.refuse:
            raise ConfigRefused("this policy is not for me")
        self.configs.append(cfg)
        sb = Stub()
        self.made.append(sb)
        try:
            yield sb
        finally:
            self.closed += 1


async def one(func: Any, factory: Factory | None = None, timeout: float = 10) -> Any:
    return await run_clause(
        Clause("Exec/Probe", "probe", func), factory or Tracker(), OPTS, timeout=timeout
    )


def test_clauses_listed() -> None:
    every = clauses()
    names = [c.name for c in every]
    assert len(names) == len(set(names)) > 90
    assert all(c.doc for c in every)
    order = [GROUPS.index(c.group) for c in every]
    assert order == sorted(order), "clauses come grouped, in GROUPS order"


def test_clauses_md_up_to_date() -> None:
    path = Path(suite.__file__).parent / "CLAUSES.md"
    want = suite.clauses_markdown()
    assert path.read_text() == want, (
        f"{path} is out of date: python -m tai42_contract.sandbox.testing --clauses-md > {path}"
    )
    for c in clauses():
        assert f"| `{c.name}` |" in want


def test_no_pytest_needed() -> None:
    """The suite imports the contract and the standard library only."""
    code = (
        "import sys, tai42_contract.sandbox.testing as t; t.clauses(); "
        "print(sorted(m for m in ('pytest', 'aiohttp', 'tai42_sandbox') if m in sys.modules))"
    )
    src = Path(__file__).resolve().parents[2] / "src"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_select() -> None:
    assert [c.name for c in select("Exec/Timeout")] == ["Exec/Timeout"]
    assert {c.group for c in select(["Files/*", "Cancel/*"])} == {"Files", "Cancel"}
    assert len(select(None)) == len(clauses())
    with pytest.raises(ValueError, match="no clause matches"):
        select(["Exec/NoSuchClause"])


def test_options_validate() -> None:
    with pytest.raises(ValueError, match="image"):
        Options(image="", isolation="none", networks=("none",)).validate()
    with pytest.raises(ValueError, match="isolation"):
        Options(image="x", isolation="chroot", networks=("none",)).validate()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="networks"):
        Options(image="x", isolation="none", networks=()).validate()
    with pytest.raises(ValueError, match="wide"):
        Options(image="x", isolation="none", networks=("wide",)).validate()  # type: ignore[arg-type]


async def test_outcomes() -> None:
    async def passes(c: Check) -> None:
        c.log("a note")

    async def errors(c: Check) -> None:
        c.error("first")
        c.error("second")

    reached: list[str] = []

    async def fatal(c: Check) -> None:
        c.fatal("stop here")
        reached.append("after fatal")

    async def skips(c: Check) -> None:
        c.skip("not for this provider")

    async def raises(c: Check) -> None:
        raise KeyError("boom")

    r = await one(passes)
    assert (r.status, r.messages) == ("pass", ("note: a note",))
    r = await one(errors)
    assert (r.status, r.messages) == ("fail", ("first", "second"))
    r = await one(fatal)
    assert (r.status, r.messages, reached) == ("fail", ("stop here",), [])
    r = await one(skips)
    assert (r.status, r.reason) == ("skip", "not for this provider")
    r = await one(raises)
    assert r.status == "fail"
    assert "KeyError" in r.reason
    assert "raise KeyError" in r.reason


async def test_deadline_and_teardown() -> None:
    """A clause past its deadline fails, saying where it waited, and its
    teardown still runs: its sessions destroyed, its sandboxes closed."""
    tracker = Tracker()
    torn: list[str] = []

    async def hangs(c: Check) -> None:
        sb = await c.sandbox()
        await c.session(sb)

        async def tear() -> None:
            torn.append("deferred")

        c.defer(tear)
        await asyncio.sleep(30)

    begin = time.monotonic()
    r = await one(hangs, tracker, timeout=0.3)
    assert time.monotonic() - begin < 5
    assert r.status == "fail"
    assert "did not finish within 0.3s" in r.reason
    assert "asyncio.sleep(30)" in r.reason
    assert torn == ["deferred"]
    assert tracker.closed == 1
    assert tracker.made[0].destroyed == ["sb-stub"]


async def test_teardown_failures_fail() -> None:
    """A destroy_session that raises at the end fails the clause: it is
    idempotent and must not."""
    tracker = Tracker()

    async def undestroyable(c: Check) -> None:
        sb = await c.sandbox()
        c.destroy_at_end(sb, "sb-undestroyable")

    r = await one(undestroyable, tracker)
    assert r.status == "fail"
    assert "cannot destroy" in r.reason
    assert tracker.closed == 1


async def test_config_refused() -> None:
    async def asks(c: Check) -> None:
        await c.sandbox()

    r = await one(asks, Tracker(refuse=True))
    assert r.status == "fail"
    assert "refused a Config" in r.reason


async def test_marker_set_while_running() -> None:
    seen: list[str | None] = []

    async def looks(c: Check) -> None:
        seen.append(os.environ.get(MARKER_VAR))

    assert MARKER_VAR not in os.environ
    await one(looks)
    assert seen
    assert seen[0]
    assert MARKER_VAR not in os.environ


async def test_run_report() -> None:
    tracker = Tracker()
    report = await run(tracker, OPTS, clauses=["Contract/*", "Sandbox/Defaults"], concurrency=3)
    assert report.passed == [
        "Contract/Models",
        "Contract/Errors",
        "Contract/PolicyRanks",
        "Contract/SpecEnvMasked",
        "Contract/RegistryFacet",
    ]
    assert report.failed == ["Sandbox/Defaults"]
    assert not report.ok
    assert "exec_default_timeout_seconds = 0.0" in report.result("Sandbox/Defaults").reason
    assert "5 passed, 1 failed, 0 skipped" in str(report)
    assert tracker.closed == len(tracker.configs) == 2
    with pytest.raises(ValueError, match="concurrency"):
        await run(tracker, OPTS, concurrency=0)


async def test_run_cancelled_propagates() -> None:
    """Cancelling run() cancels it: the suite swallows only its own
    deadline's cancellation."""

    async def slow(c: Check) -> None:
        await asyncio.sleep(30)

    task = asyncio.ensure_future(one(slow))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


CONFTEST = """
import contextlib
import pytest
from tai42_contract.sandbox.testing import Options
from tests.suite.stub import Stub

pytest_plugins = ["tai42_contract.sandbox.testing.pytest_plugin"]

@pytest.fixture
def sandbox_factory():
    @contextlib.asynccontextmanager
    async def make(cfg):
        yield Stub()
    return make

@pytest.fixture
def sandbox_options():
    return Options(image="host", isolation="none", networks=("none",))
"""

TESTS = """
from tai42_contract.sandbox.testing.pytest_plugin import (
    test_sandbox_contract as test_sandbox_contract,
)
"""


def test_pytest_plugin(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """One test per clause, its id the clause's name; a clause's pass, fail
    and skip are the test's."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_contract=TESTS)
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", f"{root / 'src'}{os.pathsep}{root}")
    # No async test plugin: the plugin runs each clause with asyncio.run.
    plain = ("-p", "no:cacheprovider", "-p", "no:asyncio", "-W", "error")
    res = pytester.runpytest_subprocess(*plain, "--collect-only", "-q")
    collected = [ln for ln in res.outlines if "test_sandbox_contract[" in ln]
    assert len(collected) == len(clauses())
    assert any("test_sandbox_contract[Exec/Timeout]" in ln for ln in collected)
    res = pytester.runpytest_subprocess(
        *plain, "-k", "Contract/PolicyRanks or Sandbox/Defaults or Durability/EphemeralRemoved"
    )
    res.assert_outcomes(passed=1, failed=1, skipped=1)
    res.stdout.fnmatch_lines(["*exec_default_timeout_seconds = 0.0*"])
