"""Names of interpreted modules that compiled code reads on every command, held as ``Final``.

Compiled (mypyc), a module reads a name it imported from a module that is not compiled with it
(``replies.py``'s reply types, ``collections.deque``) from its own globals dict, at every use;
a ``Final`` name of a compiled module of its group is a C static, read directly. So the few
such names the per-job path reads are held here, once, and imported from here where they are
read per command or per job (the encoder's and the command stage's reply tests, ADDJOB's
reply, a queue's container): with them the batched cycle cost 3 % fewer instructions per job
(commit 1b6d1b6: 57,697 -> 56,089; unpipelined 174,492 -> 171,768). Their names say they are
constants, so that they are not taken for the classes they hold (which annotations name, from
where they are defined). A ``Final`` of a compiled module (``ids.NODE_IDS_SEEN``) and a builtin
type (``int``) need no alias: compiled code reads them directly already. Pure Python: the same
objects by another name.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from . import replies

__all__ = ["DEQUE", "ERROR", "NULL_ARRAY_TYPE", "STATUS"]

DEQUE: Final = deque  # a queue's container while it is small (queues.py)
STATUS: Final = replies.Status  # ADDJOB's reply (replication.py); the encoder's first test (protocol/resp.py)
ERROR: Final = replies.Error  # what the encoder and the command stage test every reply against
NULL_ARRAY_TYPE: Final = replies.NullArray  # GETJOB NOHANG's empty reply (the encoder)
