"""``python -m disque_py.cli ...``: the same as the ``disque-py`` console script."""

from . import main

main()
