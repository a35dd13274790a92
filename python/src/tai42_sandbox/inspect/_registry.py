"""The module Inspect's ``inspect_ai`` entry point names: importing it
registers the ``tai42`` sandbox (``inspect eval task.py --sandbox tai42``)."""

from ._environment import Tai42SandboxEnvironment

__all__ = ["Tai42SandboxEnvironment"]
