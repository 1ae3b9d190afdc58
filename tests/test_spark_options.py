"""The Spark source's options, checked without Spark (disque_py.spark.options is pure Python)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from disque_py.spark import options as opts


def test_defaults_and_case_insensitive_keys():
    o = opts.parse({"NODES": "127.0.0.1:7711, h2:7712", "Queue": "q", "maxJobsPerTrigger": "500"}, "stream")
    assert o.nodes == (("127.0.0.1", 7711), ("h2", 7712))
    assert o.queues == ("q",) and o.max_jobs_per_trigger == 500 and o.batch_size == 1000
    w = opts.parse({"nodes": "h", "queue": "q", "replicate": "2", "async": "true", "timeout": "0"}, "write")
    assert w.nodes == (("h", 7711),)
    assert w.addjob_options() == {
        "timeout_ms": 0, "replicate": 2, "delay": None, "retry": None, "ttl": None, "maxlen": None, "async_": True,
    }  # fmt: skip
    assert w.connections == 4 and w.body_format == "raw"
    r = opts.parse({"nodes": "h:1", "queues": "a,b", "path": "ignored"}, "read")
    assert r.queues == ("a", "b") and r.mode == "snapshot" and r.queue == "a"


@pytest.mark.parametrize(
    "raw, use, message",
    [
        ({}, "read", "option 'nodes' is required"),
        ({"nodes": " "}, "read", "option 'nodes' is required"),
        ({"nodes": "h:99999"}, "read", "option 'nodes' must be host:port entries"),
        ({"nodes": "h:1,,h:2"}, "read", "option 'nodes' must be host:port entries"),
        ({"nodes": "h:1", "bogus": "1"}, "read", "unknown option 'bogus'"),
        ({"nodes": "h:1", "mode": "consume"}, "write", "option 'mode' does not apply to a write"),
        ({"nodes": "h:1", "queue": "q", "maxJobsPerTrigger": "0"}, "stream", "option 'maxjobspertrigger' must be >= 1"),
        ({"nodes": "h:1", "queue": "q", "async": "maybe"}, "write", "option 'async' must be true or false"),
        ({"nodes": "h:1", "queue": "q", "ttl": "1.5"}, "write", "option 'ttl' must be an integer"),
        ({"nodes": "h:1", "queue": "a,b"}, "write", "option 'queue' names one queue"),
        ({"nodes": "h:1", "queue": "a", "queues": "b"}, "read", "'queue' are exclusive"),
        ({"nodes": "h:1", "queues": "a,,b"}, "read", "option 'queues' must name one or more queues"),
        ({"nodes": "h:1"}, "stream", "option 'queue' (or 'queues') is required for a stream"),
        ({"nodes": "h:1", "bodyFormat": "xml", "queue": "q"}, "write", "option 'bodyformat' must be one of raw, json"),
        ({"nodes": "h:1", "connections": "0", "queue": "q"}, "write", "option 'connections' must be between 1 and 256"),
        ({"nodes": "h:1", "queue": "q", "workingInterval": "-1"}, "stream", "option 'workinginterval' must be >= 0.01"),
        ({"nodes": "h:1", "queue": "q", "dedupColumn": " "}, "write", "option 'dedupcolumn' must name a column"),
        ({"nodes": "h:1", "queue": "q", "dedupColumn": "k"}, "read", "option 'dedupcolumn' does not apply to a read"),
        ({"nodes": "h:1", "queue": "q", "dedupColumn": "k"}, "stream", "option 'dedupcolumn' does not apply to a stream"),
    ],
)  # fmt: skip
def test_bad_options_name_the_option(raw, use, message):
    with pytest.raises(ValueError, match="^disque: .*" + re.escape(message)):
        opts.parse(raw, use)


def test_dedup_column_is_kept_as_given():
    o = opts.parse({"nodes": "h:1", "queue": "q", "dedupColumn": " orderId "}, "write")
    assert o.dedup_column == "orderId"
    assert opts.parse({"nodes": "h:1", "queue": "q"}, "write").dedup_column is None


def test_every_option_is_documented():
    from pathlib import Path

    guide = (Path(__file__).parents[1] / "docs" / "SPARK.md").read_text().lower()
    for name in opts.OPTIONS:
        assert "`%s`" % name in guide, name


def test_discovery_module_never_breaks_spark_discovery_without_pyspark():
    # Spark imports every pyspark_* module it finds; ours must import even when the source cannot.
    code = (
        "import sys; sys.modules['pyspark'] = None; sys.modules['pyspark.sql'] = None\n"
        "import pyspark_disque as m\n"
        "assert not hasattr(m, 'DefaultSource') and m.IMPORT_ERROR is not None, m.__dict__.keys()\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
