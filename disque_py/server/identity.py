"""This node's identity on disk: the node ID in ``cluster-config-file``.

The file lives under ``dir`` and uses the ``CLUSTER NODES`` line shape that
Disque writes (``<id> <ip>:<port> myself ...``), so the cluster issue can
extend it with peers. A missing file means a first start: a new random
40-hex-character ID is generated and written atomically.
"""

from __future__ import annotations

import os
import secrets

from ..config import Config
from .logs import log


def config_path(config: Config) -> str:
    return config.resolve_path(config.cluster_config_file)


def load_or_create_identity(config: Config) -> str:
    path = config_path(config)
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and "myself" in fields[2].split(","):
                    node_id = fields[0]
                    if len(node_id) == 40 and all(c in "0123456789abcdef" for c in node_id):
                        return node_id
        log.warning("%s has no valid 'myself' line: generating a new node ID", path)
    except FileNotFoundError:
        pass
    node_id = secrets.token_hex(20)
    save_identity(config, node_id)
    log.info("No cluster configuration found, I'm %s", node_id)
    return node_id


def save_identity(config: Config, node_id: str) -> None:
    path = config_path(config)
    tmp = path + ".tmp-%d" % os.getpid()
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("%s 127.0.0.1:%d myself 0 0 connected\n" % (node_id, config.port))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
