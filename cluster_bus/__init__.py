"""cluster_bus: the cluster bus, a library of its own (it never imports disque_py).

Importing the package decides, before its compiled modules can be imported, whether they
run compiled or from their source (cluster_bus/_build.py): a stale build is never used.
"""

from ._build import select as _select_build

_select_build()
