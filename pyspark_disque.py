"""Spark finds the ``disque`` data source here: ``spark.read.format("disque")``, no registration.

Spark imports every top-level module whose name starts with ``pyspark_`` and
registers its ``DefaultSource`` under ``DefaultSource.name()``. A module that
fails to import breaks that discovery for every source, so this one never
raises: without pyspark (or with a broken install) it only exports nothing.
The source itself is :mod:`disque_py.spark.source` (``pip install
disque-py[spark]``); docs/SPARK.md is the guide.
"""

try:
    from disque_py.spark.source import DisqueDataSource as DefaultSource
except Exception as _exc:  # noqa: BLE001 - see above: never break Spark's discovery
    IMPORT_ERROR: Exception | None = _exc
    __all__: list[str] = []
else:
    IMPORT_ERROR = None
    __all__ = ["DefaultSource"]
