"""TAI42 Sandbox for Inspect AI: the ``tai42`` sandbox environment.

Install with ``pip install 'tai42-sandbox[inspect]'``; Inspect finds it by
the package's ``inspect_ai`` entry point, so with a daemon running
(``tai42 serve``)::

    inspect eval task.py --sandbox tai42
    inspect eval task.py --sandbox tai42:tai42.yaml

A task may name it in code with a config object::

    from inspect_ai.util import SandboxEnvironmentSpec
    from tai42_sandbox.inspect import Tai42SandboxConfig

    Task(..., sandbox=SandboxEnvironmentSpec("tai42", Tai42SandboxConfig(image="debian-tools")))
"""

from ._config import Tai42SandboxConfig, Tai42SandboxConfigError, load_config
from ._environment import Tai42SandboxEnvironment

__all__ = [
    "Tai42SandboxConfig",
    "Tai42SandboxConfigError",
    "Tai42SandboxEnvironment",
    "load_config",
]
