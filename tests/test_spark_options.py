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
        # the stream sink takes the write options, and sinkId only it
        ({"nodes": "h:1", "queue": "q", "sinkId": "s"}, "write", "option 'sinkid' does not apply to a write"),
        ({"nodes": "h:1", "queue": "q", "sinkId": " "}, "sink", "option 'sinkid' must be a non-empty name"),
        ({"nodes": "h:1", "queue": "q", "sinkId": "x" * 201}, "sink", "of at most 200 bytes"),
        ({"nodes": "h:1", "queue": "q", "mode": "consume"}, "sink", "option 'mode' does not apply to a sink"),
        ({"nodes": "h:1", "queue": "q", "retry": "-1"}, "sink", "option 'retry' must be >= 0"),
        # admission knobs
        ({"nodes": "h:1", "queue": "q", "maxBytesPerTrigger": "0"}, "stream", "option 'maxbytespertrigger' must be >= 1"),
        ({"nodes": "h:1", "queue": "q", "maxBytesPerTrigger": "1MB"}, "stream",
         "option 'maxbytespertrigger' must be an integer"),
        ({"nodes": "h:1", "queue": "q", "minJobsPerTrigger": "0"}, "stream", "option 'minjobspertrigger' must be >= 1"),
        ({"nodes": "h:1", "queue": "q", "minJobsPerTrigger": "500", "maxJobsPerTrigger": "100"}, "stream",
         "option 'minjobspertrigger' (500) must not exceed maxJobsPerTrigger (100)"),
        ({"nodes": "h:1", "queue": "q", "maxTriggerDelay": "5s"}, "stream",
         "option 'maxtriggerdelay' needs 'minJobsPerTrigger'"),
        ({"nodes": "h:1", "queue": "q", "minJobsPerTrigger": "5", "maxTriggerDelay": "soon"}, "stream",
         "option 'maxtriggerdelay' must be a duration such as 500ms, 30s, 15m or 1h, got 'soon'"),
        ({"nodes": "h:1", "queue": "q", "minJobsPerTrigger": "5", "maxTriggerDelay": "5 days"}, "stream",
         "option 'maxtriggerdelay' must be a duration"),
        ({"nodes": "h:1", "queue": "q", "minJobsPerTrigger": "5", "maxTriggerDelay": "0s"}, "stream",
         "option 'maxtriggerdelay' must be longer than 0"),
        ({"nodes": "h:1", "queue": "q", "minJobsPerTrigger": "5"}, "read", "option 'minjobspertrigger' does not apply"),
        ({"nodes": "h:1", "queue": "q", "eventTime": "often"}, "stream", "option 'eventtime' must be true or false"),
        # the name on the nodes: what CLIENT SETNAME takes, and a ':' would cut the queues off
        ({"nodes": "h:1", "queue": "q", "consumerName": "etl images"}, "stream", "option 'consumername' must be 1 to 128"),
        ({"nodes": "h:1", "queue": "q", "consumerName": "a:b"}, "stream", "option 'consumername' must be 1 to 128"),
        ({"nodes": "h:1", "queue": "q", "consumerName": ""}, "stream", "option 'consumername' must be 1 to 128"),
        ({"nodes": "h:1", "queue": "q", "consumerName": "x" * 129}, "stream", "option 'consumername' must be 1 to 128"),
        ({"nodes": "h:1", "queue": "q", "consumerName": "x"}, "write", "option 'consumername' does not apply"),
    ],
)  # fmt: skip
def test_bad_options_name_the_option(raw, use, message):
    with pytest.raises(ValueError, match="^disque: .*" + re.escape(message)):
        opts.parse(raw, use)


def test_sink_and_admission_options():
    sink = opts.parse({"nodes": "h:1", "queue": "q", "replicate": "2", "sinkId": " orders ",
                       "checkpointLocation": "/ck"}, "sink")  # fmt: skip
    assert sink.sink_id == "orders" and sink.replicate == 2 and sink.batch_size == 500 and sink.queue == "q"
    s = opts.parse({"nodes": "h:1", "queue": "q", "minJobsPerTrigger": "100", "maxTriggerDelay": "500ms",
                    "maxBytesPerTrigger": "1048576", "eventTime": "false"}, "stream")  # fmt: skip
    assert (s.min_jobs_per_trigger, s.max_trigger_delay, s.max_bytes_per_trigger, s.event_time) == (100, 0.5, 1 << 20, False)
    d = opts.parse({"nodes": "h:1", "queue": "q", "minJobsPerTrigger": "1"}, "stream")
    assert d.max_trigger_delay == 900.0 and d.event_time is True  # Kafka's 15m
    for text, seconds in (("30s", 30.0), ("15m", 900.0), ("1h", 3600.0), ("2.5", 2.5), ("2 min", 120.0)):
        assert opts.parse({"nodes": "h:1", "queue": "q", "minJobsPerTrigger": "1", "maxTriggerDelay": text},
                          "stream").max_trigger_delay == seconds  # fmt: skip


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
