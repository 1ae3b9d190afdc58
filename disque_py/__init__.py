"""disque-py: a distributed, in-memory job broker compatible with Disque 1.0-rc1."""

__version__ = "0.1.0"
DISQUE_COMPAT_VERSION = "1.0-rc1"

__all__ = ["__version__", "DISQUE_COMPAT_VERSION"]
