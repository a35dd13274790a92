"""The whole conformance suite against the real daemon through Tai42Sandbox,
on every provider available (host; container as root with runc or crun),
through the pytest plugin: one test per clause and provider."""

from __future__ import annotations

import pytest

from tai42_contract.sandbox.testing import Factory, Options
from tai42_contract.sandbox.testing.pytest_plugin import (
    test_sandbox_contract as test_sandbox_contract,
)

pytest_plugins = ["tai42_contract.sandbox.testing.pytest_plugin"]


@pytest.fixture
def sandbox_factory(suite_factory: Factory) -> Factory:
    return suite_factory


@pytest.fixture
def sandbox_options(suite_options: Options) -> Options:
    return suite_options
