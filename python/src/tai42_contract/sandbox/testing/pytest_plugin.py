"""The conformance suite as pytest tests: one test per clause.

Load the plugin and define two fixtures, in a conftest.py (or the test
module itself)::

    pytest_plugins = ["tai42_contract.sandbox.testing.pytest_plugin"]

    @pytest.fixture
    def sandbox_factory() -> Factory: ...      # Config -> async context manager of a Sandbox

    @pytest.fixture
    def sandbox_options() -> Options: ...

then collect the suite's test in a test module::

    from tai42_contract.sandbox.testing.pytest_plugin import (
        test_sandbox_contract as test_sandbox_contract,
    )

Its parameter ``sandbox_clause`` is parametrized by this plugin over every
clause, the id being the clause's name, so ``-k "Exec/Timeout"`` or ``-k
ExecStart`` select. A clause that does not apply is skipped with its
reason; a failing one fails with every failure it found. Each clause runs in
an event loop of its own (``asyncio.run``): the factory is entered there, so
it makes its sandboxes there, and no async test plugin is needed. Override
the fixture ``sandbox_clause_timeout`` (seconds) to change the deadline of
a clause.

(PYTEST_DONT_REWRITE: the plugin holds no assert to rewrite, and a test
module importing its test may import it before pytest loads it.)
"""

from __future__ import annotations

import asyncio

import pytest

from ._suite import CLAUSE_TIMEOUT, Factory, Options, clauses, run_clause


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sandbox_clause" in metafunc.fixturenames:
        names = [c.name for c in clauses()]
        metafunc.parametrize("sandbox_clause", names, ids=names)


@pytest.fixture
def sandbox_clause_timeout() -> float:
    """The deadline of one clause, in seconds."""
    return CLAUSE_TIMEOUT


def test_sandbox_contract(
    sandbox_clause: str,
    sandbox_factory: Factory,
    sandbox_options: Options,
    sandbox_clause_timeout: float,
) -> None:
    """One clause of the sandbox contract, on sandboxes from sandbox_factory."""
    (c,) = [c for c in clauses() if c.name == sandbox_clause]
    result = asyncio.run(
        run_clause(c, sandbox_factory, sandbox_options, timeout=sandbox_clause_timeout)
    )
    if result.status == "skip":
        pytest.skip(result.reason)
    if result.status == "fail":
        pytest.fail(f"{result.name}:\n{result.reason}", pytrace=False)
