"""The cluster bus port (client port + 10000) in the kernel's ephemeral range: a warning at
start; taken: the node exits 1 with what is wrong and a hint, no traceback."""

from __future__ import annotations

import random
import socket

import pytest

import subprocess
import sys

from .conftest import NodeProcess, _bindable, wait_for

pytestmark = pytest.mark.integration


def _range() -> tuple[int, int]:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(x) for x in f.read().split()[:2])
    return low, high


def _port_with_bus_in_range() -> int:
    low, high = _range()
    # at random, not always the lowest: another test's block of ports (consecutive_free_ports:
    # up to 256 from a random base below) may reach it, and another test's node there once
    # answered the PING meant for this one (which exited: "Address already in use")
    ports = list(range(max(low - 10000, 1024), min(high - 10000, 65535 - 10000)))
    random.shuffle(ports)
    for port in ports:
        if _bindable(port) and _bindable(port + 10000):
            return port
    pytest.skip("no free port whose bus port is in the ephemeral range %d-%d" % (low, high))


def test_a_bus_port_in_the_ephemeral_range_is_warned_of_at_start(start_node):
    node = start_node(port=_port_with_bus_in_range())
    low, high = _range()
    line = wait_for(lambda: [l for l in node.log().splitlines() if "ephemeral port range" in l], what="the warning")[0]
    assert "%d (port %d + 10000)" % (node.port + 10000, node.port) in line
    assert "%d-%d" % (low, high) in line and "below %d" % (low - 10000) in line
    assert "ip_local_reserved_ports" in line


def test_a_node_whose_bus_port_is_taken_exits_with_the_reason(tmp_path):
    port = _port_with_bus_in_range()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port + 10000))
        holder.listen()
        node = NodeProcess(tmp_path, port=port)
        assert node.exit_code_at_start() == 1
    log = node.log()
    assert "Creating cluster bus listening socket 127.0.0.1:%d" % (port + 10000) in log
    assert "client port %d + 10000" % port in log and "ephemeral range" in log
    assert "Traceback" not in log


def test_scripts_cluster_start_warns_of_a_bus_port_in_the_ephemeral_range(tmp_path):
    port = _port_with_bus_in_range()
    low, _ = _range()
    cmd = [sys.executable, "-m", "disque_py.cli.devcluster"]
    out = subprocess.run(cmd + ["start", "--base-port", str(port)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    try:
        assert out.returncode == 0, out.stderr
        assert "warning: the cluster bus port (port + 10000) of %d is in the kernel's ephemeral port range" % port \
            in out.stderr and "use --base-port below %d" % (low - 10000) in out.stderr, out.stderr
    finally:
        subprocess.run(cmd + ["stop"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
