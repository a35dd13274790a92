"""The TAI42 sandbox contract in its own language: see :mod:`tai42_contract.sandbox`."""

__version__ = "0.1.0"
