"""Where the chaos cluster's nodes live on the network, and how it is cut.

:class:`NetnsNetwork` puts each node in a network namespace of its own, with
its own address on a private subnet, joined to the host by a bridge: the
harness (in the host's namespace) reaches every node, and the nodes reach
each other through the bridge. A partition adds blackhole routes inside the
namespaces (a node of one side drops every packet to the other side), so the
bus links stall as on a real network: no reset, no error, just silence until
the PING timeout. Healing deletes the routes. Needs root and iproute2.

:class:`LoopbackNetwork` is the fallback: every node on 127.0.0.1, no
partitions (:attr:`can_partition` is False and :attr:`why_not` says why).

Each run takes a free slot ``k`` (1-200): bridge ``dqc<k>br``, namespaces
``dqc<k>n<i>``, subnet 10.213.<k>.0/24, with the host at .254. A slot whose
owner (a pid written under :data:`STATE_DIR`) is dead is cleaned up and
reused, so a harness killed in the middle leaves nothing that lasts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterable, Sequence

STATE_DIR = Path("/tmp/disque-chaos-net")
SUBNET = "10.213.%d"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=check)


def netns_unavailable() -> str | None:
    """None when namespaces can be made here, else the reason (shown when partitions are skipped)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (the ip command) is not installed"
    probe = "dqcprobe%d" % os.getpid()
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return "ip netns add failed: %s" % r.stderr.strip()
    _ip("netns", "del", probe, check=False)
    r = _ip("link", "add", probe[:15], "type", "bridge", check=False)
    if r.returncode != 0:
        return "no bridge support: %s" % r.stderr.strip()
    _ip("link", "del", probe[:15], check=False)
    return None


class LoopbackNetwork:
    """Every node on 127.0.0.1 (no partitions)."""

    can_partition = False

    def __init__(self, size: int, why_not: str = "") -> None:
        self.size = size
        self.why_not = why_not or "nodes share the loopback interface"
        self.hosts = ["127.0.0.1"] * size

    def wrap(self, i: int, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` as node ``i``."""
        return list(argv)

    def partition(self, groups: Sequence[Iterable[int]]) -> None:
        raise RuntimeError("partitions need network namespaces: %s" % self.why_not)

    def heal(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "LoopbackNetwork":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NetnsNetwork:
    """One network namespace per node, on a bridge; partitions by blackhole routes."""

    can_partition = True
    why_not = ""

    def __init__(self, size: int) -> None:
        self.size = size
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        _cleanup_stale()
        self.slot = self._claim()
        self.bridge = "dqc%dbr" % self.slot
        self.namespaces = ["dqc%dn%d" % (self.slot, i) for i in range(size)]
        self.hosts = ["%s.%d" % (SUBNET % self.slot, i + 1) for i in range(size)]
        self.cuts: set[tuple[int, int]] = set()
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _claim(self) -> int:
        for k in range(1, 201):
            owner = STATE_DIR / str(k)
            try:
                fd = os.open(owner, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return k
        raise RuntimeError("no free chaos network slot under %s" % STATE_DIR)

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", "%s.254/24" % (SUBNET % self.slot), "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.namespaces):
            outside, inside = "dqc%dv%d" % (self.slot, i), "dqc%dp%d" % (self.slot, i)
            _ip("netns", "add", ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", ns, "addr", "add", "%s/24" % self.hosts[i], "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def wrap(self, i: int, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside node ``i``'s namespace (``ip netns exec`` execs it,
        so the pid is the program's own)."""
        return ["ip", "netns", "exec", self.namespaces[i], *argv]

    def _route(self, op: str, a: int, b: int) -> None:
        _ip("-n", self.namespaces[a], "route", op, "blackhole", "%s/32" % self.hosts[b], check=op == "add")

    def partition(self, groups: Sequence[Iterable[int]]) -> None:
        """Cut every pair of nodes in different groups, both ways (nodes in no group keep every link)."""
        groups = [set(g) for g in groups]
        for gi, ga in enumerate(groups):
            for gb in groups[gi + 1 :]:
                for a in ga:
                    for b in gb:
                        for x, y in ((a, b), (b, a)):
                            if (x, y) not in self.cuts:
                                self._route("add", x, y)
                                self.cuts.add((x, y))

    def heal(self) -> None:
        """Remove every cut."""
        for x, y in sorted(self.cuts):
            self._route("del", x, y)
        self.cuts.clear()

    def close(self) -> None:
        _remove_slot(self.slot, self.size)

    def __enter__(self) -> "NetnsNetwork":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remove_slot(k: int, size: int | None = None) -> None:
    listed = _ip("netns", "list", check=False).stdout.split()
    prefix = "dqc%dn" % k
    for name in listed:
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            _ip("netns", "del", name, check=False)  # its veth ends go with it
    _ip("link", "del", "dqc%dbr" % k, check=False)
    links = _ip("-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith("dqc%dv" % k):
            _ip("link", "del", name, check=False)
    try:
        (STATE_DIR / str(k)).unlink()
    except FileNotFoundError:
        pass


def _cleanup_stale() -> None:
    for owner in STATE_DIR.glob("*"):
        if not owner.name.isdigit():
            continue
        try:
            pid = int(owner.read_text() or "0")
        except (OSError, ValueError):
            pid = 0
        alive = False
        if pid:
            try:
                os.kill(pid, 0)
                alive = True
            except ProcessLookupError:
                alive = False
            except PermissionError:
                alive = True
        if not alive:
            _remove_slot(int(owner.name))


def network(size: int, want_netns: bool = True) -> NetnsNetwork | LoopbackNetwork:
    """Namespaces when they can be made (and are wanted), else loopback with the reason why not."""
    if want_netns:
        why = netns_unavailable()
        if why is None:
            return NetnsNetwork(size)
        return LoopbackNetwork(size, why)
    return LoopbackNetwork(size, "network namespaces not asked for")
