"""Persistence: the append-only file.

``records`` is the AOF's record format (encode, decode), sans-I/O like the core.
The shell's writer and the loader that rebuilds a node's jobs from it are to come.
"""
