"""Daemons for the Inspect tests: the container provider with the Debian
image (mkimage.sh) imported as ``debian-tools``, and the host runner.

``debian_image`` builds the image once per machine and inputs (mkimage.sh
caches it under $TAI42_IMAGE_CACHE, default <tmp>/tai42-image-cache);
``container_daemon`` and ``host_daemon`` start one daemon each for the
test session; ``inspect_daemon`` is either (a test runs on both),
``inspect_config`` a config for it, ``tai42_env`` a sample environment on
it (sample_init, and sample_cleanup after the test).

Where the container provider is available but the image cannot be built
(no mmdebstrap), its tests are skipped saying so, except under CI (CI
set), where that fails them: CI must run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tai42_sandbox.inspect import Tai42SandboxConfig, Tai42SandboxEnvironment
from tests.conftest import Daemon

HERE = Path(__file__).resolve().parent
IMAGE = "debian-tools"


def container_available() -> bool:
    return os.geteuid() == 0 and bool(shutil.which("runc") or shutil.which("crun"))


def wanted(provider: str) -> bool:
    only = os.environ.get("TAI42_TEST_PROVIDERS")
    return not only or provider in only.split(",")


@dataclass
class InspectDaemon:
    """A daemon and the image the Inspect sandbox uses on it."""

    daemon: Daemon
    image: str

    @property
    def provider(self) -> str:
        return self.daemon.provider


@pytest.fixture(scope="session")
def debian_image() -> str:
    """The docker save tarball of the Debian test image (built or cached)."""
    if not shutil.which("mmdebstrap"):
        reason = "mmdebstrap is missing (apt-get install -y mmdebstrap): no Debian test image"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    cache = os.environ.get("TAI42_IMAGE_CACHE") or os.path.join(
        tempfile.gettempdir(), "tai42-image-cache"
    )
    started = time.monotonic()
    out = subprocess.run(
        ["sh", str(HERE / "mkimage.sh"), cache], check=True, capture_output=True, text=True
    )
    path = out.stdout.strip().splitlines()[-1]
    print(f"debian image {path}: {time.monotonic() - started:.1f}s")
    return path


@pytest.fixture(scope="session")
def container_daemon(tai42_bin: str, debian_image: str) -> Iterator[InspectDaemon]:
    d = Daemon(tai42_bin, "container")
    started = time.monotonic()
    subprocess.run(
        [tai42_bin, "image", "import", debian_image, "--name", IMAGE, "--state-dir", str(d.state)],
        check=True,
        capture_output=True,
    )
    print(f"image import: {time.monotonic() - started:.1f}s")
    d.start()
    yield InspectDaemon(d, IMAGE)
    d.stop()


@pytest.fixture(scope="session")
def host_daemon(tai42_bin: str) -> Iterator[InspectDaemon]:
    d = Daemon(tai42_bin, "host").start()
    yield InspectDaemon(d, "host")
    d.stop()


@pytest.fixture(params=["container", "host"])
def inspect_daemon(request: pytest.FixtureRequest) -> InspectDaemon:
    provider: str = request.param
    if not wanted(provider):
        pytest.skip(f"TAI42_TEST_PROVIDERS leaves out {provider}")
    if provider == "container" and not container_available():
        pytest.skip("the container provider needs root and runc/crun")
    d: InspectDaemon = request.getfixturevalue(f"{provider}_daemon")
    return d


@pytest.fixture
def inspect_config(inspect_daemon: InspectDaemon) -> Tai42SandboxConfig:
    d = inspect_daemon.daemon
    return Tai42SandboxConfig(image=inspect_daemon.image, url=d.url, token=d.token, ttl_seconds=600)


@pytest.fixture
async def tai42_env(inspect_config: Tai42SandboxConfig) -> AsyncIterator[Tai42SandboxEnvironment]:
    envs = await Tai42SandboxEnvironment.sample_init("test", inspect_config, {})
    try:
        yield envs["default"].as_type(Tai42SandboxEnvironment)
    finally:
        await Tai42SandboxEnvironment.sample_cleanup("test", inspect_config, envs, False)
