"""The options of the ``disque`` Spark data source: parsed and checked once, on the driver.

Spark hands a data source its options as strings (keys case-insensitive).
:func:`parse` turns them into an :class:`Options` for one use (``write``,
``read``, ``stream``, or ``sink``: a stream's ``writeStream.format("disque")``, which takes
every write option), and fails fast with a ``ValueError`` that names the
option: a missing or malformed ``nodes``, a missing ``queue``, an option
unknown to that use (a typo must not be ignored), a number out of range,
TLS files given with ``tls`` false.

Pure Python: no pyspark, no I/O, so it is tested without a Spark session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..client.cluster import TLS_SCHEMES, URL_SCHEMES, parse_address
from ..client.consumers import NAME_RE

__all__ = ["Options", "parse", "OPTIONS", "USES"]

USES = ("write", "read", "stream", "sink")

# option (lower case) -> (uses, help). The order is the order of the docs.
OPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "nodes": (
        USES,
        "comma-separated host:port of one or more nodes (the others are found with HELLO); "
        "rediss://host:port entries mean tls=true",
    ),
    "password": (USES, "the nodes' requirepass, or the password of 'username'"),
    "username": (USES, "a user of the nodes (AUTH username password; default: the default user)"),
    "tls": (USES, "connect to the nodes' tls-port with TLS (true/false, default false)"),
    "tls.cacert": (USES, "the CA file that signed the nodes' certificates (default: the system's CAs); implies tls"),
    "tls.cert": (USES, "this client's certificate file, for nodes with tls-auth-clients; implies tls"),
    "tls.key": (USES, "the private key of tls.cert (default: read from tls.cert)"),
    "connecttimeout": (USES, "seconds to wait for a node to accept a connection (default 2)"),
    "queue": (USES, "the queue to write to, or to read from"),
    "queues": (("read", "stream"), "comma-separated queues to read from (instead of queue)"),
    # write
    "bodyformat": (("write",), "raw (a 'body' column, string or binary; default) or json (the whole row)"),
    "replicate": (("write",), "ADDJOB REPLICATE: copies of each job"),
    "retry": (("write",), "ADDJOB RETRY: seconds before an unacknowledged job is queued again"),
    "ttl": (("write",), "ADDJOB TTL: seconds a job lives"),
    "delay": (("write",), "ADDJOB DELAY: seconds before a job is queued"),
    "maxlen": (("write",), "ADDJOB MAXLEN: refuse jobs when the queue is this long"),
    "async": (("write",), "ADDJOB ASYNC: do not wait for the copies (true/false, default false)"),
    "timeout": (("write",), "ADDJOB ms-timeout: milliseconds to wait for the copies (default 5000)"),
    "batchsize": (("write", "read", "stream"), "jobs per pipelined round trip (ADDJOB, SHOW, GETJOB COUNT)"),
    "connections": (("write",), "connections per write task, spread over the nodes (default 4)"),
    "dedupcolumn": (
        ("write",),
        "a column (string, binary or integer) whose value is each job's ADDJOB DEDUP key: a retried "
        "task or a write run again adds nothing twice within the nodes' dedup-window",
    ),
    # stream sink
    "sinkid": (
        ("sink",),
        "a stable name of this sink, the first part of each row's DEDUP key (default: the "
        "streaming query's id, which its checkpoint keeps); ignored with dedupColumn",
    ),
    # read
    "mode": (("read",), "snapshot (default: read without taking) or consume (take and acknowledge)"),
    "jobsperpartition": (("read",), "jobs per Spark partition of a snapshot (default 20000)"),
    # stream
    "maxjobspertrigger": (("stream",), "at most this many jobs per micro-batch (default: all available)"),
    "maxbytespertrigger": (
        ("stream",),
        "at most about this many body bytes per micro-batch (a soft cap: at least one job; "
        "default: no cap)",
    ),
    "minjobspertrigger": (
        ("stream",),
        "wait for at least this many queued jobs before starting a micro-batch, or maxTriggerDelay",
    ),
    "maxtriggerdelay": (
        ("stream",),
        "with minJobsPerTrigger: the longest wait for them, e.g. 30s, 500ms, 15m (default 15m)",
    ),
    "eventtime": (
        ("stream",),
        "fill the ctime column (the job's creation time) with a SHOW per job as it is taken "
        "(default true; false saves that call and leaves ctime null)",
    ),
    "numpartitions": (("stream",), "Spark partitions per micro-batch (default 2)"),
    "consumername": (
        ("stream",),
        "the query's name on the nodes (its connections' CLIENT SETNAME, shown with its lag on the "
        "admin page): letters, digits, '.', '_', '-' (default: spark-<host>-<pid>)",
    ),
    "workinginterval": (
        ("stream",),
        "seconds between WORKING calls for jobs of a running batch (default: half each job's RETRY)",
    ),
    "workingontake": (
        ("stream",),
        "send WORKING for each job as it is taken (default true; false saves node CPU and risks "
        "a duplicate with a chance of about time-in-hand / RETRY)",
    ),
    "drainwait": (
        ("read", "stream"),
        "seconds an empty queue is watched for jobs still moving between nodes before a consume read "
        "or an availableNow stream ends (default 1)",
    ),
}

# Options Spark or common tooling may add on its own, accepted and ignored (a stream sink is
# handed its query's checkpointLocation).
_IGNORED = {"path", "checkpointlocation"}

_DEFAULT_BATCH = {"write": 500, "read": 500, "stream": 1000, "sink": 500}
DEFAULT_MAX_TRIGGER_DELAY = 900.0  # seconds: Kafka's 15m


def uses_of(key: str) -> tuple[str, ...]:
    """The uses an option applies to: a stream sink takes every write option."""
    uses = OPTIONS[key][0]
    return (*uses, "sink") if "write" in uses and "sink" not in uses else uses


@dataclasses.dataclass(frozen=True)
class Options:
    """One use's options, checked. Times in seconds unless the name says otherwise."""

    use: str
    nodes: tuple[tuple[str, int], ...]
    password: str | None = None
    username: str | None = None
    tls: bool = False
    tls_cacert: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    connect_timeout: float = 2.0
    queues: tuple[str, ...] = ()
    body_format: str = "raw"
    replicate: int | None = None
    retry: int | None = None
    ttl: int | None = None
    delay: int | None = None
    maxlen: int | None = None
    async_: bool = False
    timeout_ms: int = 5000
    batch_size: int = 500
    connections: int = 4
    dedup_column: str | None = None
    mode: str = "snapshot"
    jobs_per_partition: int = 20000
    max_jobs_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    min_jobs_per_trigger: int | None = None
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY
    event_time: bool = True
    sink_id: str | None = None
    consumer_name: str | None = None
    num_partitions: int = 2
    working_interval: float | None = None
    working_on_take: bool = True
    drain_wait: float = 1.0

    @property
    def queue(self) -> str | None:
        """The single queue of a write (None: a per-row ``queue`` column decides)."""
        return self.queues[0] if self.queues else None

    def connection_options(self) -> dict:
        """Keyword arguments of :class:`disque_py.client.Client` and of the source's links: the
        credentials and TLS (redis-py's ssl_* names)."""
        return {
            "password": self.password, "username": self.username, "tls": self.tls,
            "ssl_ca_certs": self.tls_cacert, "ssl_certfile": self.tls_cert, "ssl_keyfile": self.tls_key,
        }  # fmt: skip

    def addjob_options(self) -> dict:
        """Keyword arguments for :func:`disque_py.client.commands.addjob_argv`."""
        return {
            "timeout_ms": self.timeout_ms, "replicate": self.replicate, "delay": self.delay,
            "retry": self.retry, "ttl": self.ttl, "maxlen": self.maxlen, "async_": self.async_,
        }  # fmt: skip


def _fail(name: str, message: str) -> ValueError:
    return ValueError("disque: option '%s' %s" % (name, message))


def _int(raw: Mapping[str, str], name: str, low: int, high: int | None = None) -> int | None:
    if name not in raw:
        return None
    text = str(raw[name]).strip()
    try:
        value = int(text)
    except ValueError:
        raise _fail(name, "must be an integer, got %r" % text) from None
    if value < low or (high is not None and value > high):
        bounds = ">= %d" % low if high is None else "between %d and %d" % (low, high)
        raise _fail(name, "must be %s, got %d" % (bounds, value))
    return value


def _float(raw: Mapping[str, str], name: str, low: float) -> float | None:
    if name not in raw:
        return None
    text = str(raw[name]).strip()
    try:
        value = float(text)
    except ValueError:
        raise _fail(name, "must be a number, got %r" % text) from None
    if not value >= low:
        raise _fail(name, "must be >= %g, got %s" % (low, text))
    return value


def _bool(raw: Mapping[str, str], name: str) -> bool | None:
    if name not in raw:
        return None
    text = str(raw[name]).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    raise _fail(name, "must be true or false, got %r" % raw[name])


def _choice(raw: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    if name not in raw:
        return None
    text = str(raw[name]).strip().lower()
    if text not in choices:
        raise _fail(name, "must be one of %s, got %r" % (", ".join(choices), raw[name]))
    return text


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _duration(raw: Mapping[str, str], name: str) -> float | None:
    """Seconds from ``500ms``, ``30s``, ``15m``, ``1h`` or a bare number of seconds (> 0)."""
    if name not in raw:
        return None
    text = str(raw[name]).strip().lower().replace(" ", "")
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number) :] or "s"
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise _fail(name, "must be a duration such as 500ms, 30s, 15m or 1h, got %r" % raw[name]) from None
    if not value > 0:
        raise _fail(name, "must be longer than 0, got %r" % raw[name])
    return value


def _names(name: str, text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in str(text).split(","))
    if not names or any(not n for n in names):
        raise _fail(name, "must name one or more queues separated by commas, got %r" % text)
    return names


def nodes_tls(text: str | None) -> bool:
    """Whether the ``nodes`` entries are ``rediss://`` URLs (all of them; a mix is an error)."""
    parts = [p.strip().lower() for p in str(text or "").split(",") if p.strip()]
    tls = [any(p.startswith(s) for s in TLS_SCHEMES) for p in parts]
    if any(tls) and not all(tls):
        raise _fail("nodes", "mixes rediss:// (TLS) and plain entries; the nodes are reached one way")
    for p in parts:
        if "@" in p.split("://", 1)[-1].split("/", 1)[0] and any(p.startswith(s) for s in URL_SCHEMES):
            raise _fail("nodes", "must not carry credentials; use the 'username' and 'password' options")
    return bool(tls) and all(tls)


def parse_nodes(text: str | None) -> tuple[tuple[str, int], ...]:
    """``"h:p,h:p"`` (or ``rediss://h:p`` entries) -> addresses; a clear error for a missing or
    malformed list."""
    if text is None or not str(text).strip():
        raise ValueError(
            "disque: option 'nodes' is required: the host:port of one or more nodes, "
            "e.g. .option(\"nodes\", \"127.0.0.1:7711,127.0.0.1:7712\")"
        )
    out = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            if not part:
                raise ValueError("empty entry")
            out.append(parse_address(part))
        except ValueError as exc:
            raise _fail("nodes", "must be host:port entries separated by commas; %r is not (%s)" % (part, exc)) from None
    return tuple(dict.fromkeys(out))


def parse(options: Mapping[str, str], use: str) -> Options:
    """Check ``options`` (Spark's, any key case) for ``use`` (write, read, stream)."""
    if use not in USES:
        raise ValueError("use must be one of %s" % ", ".join(USES))
    raw = {str(k).lower(): v for k, v in dict(options).items()}
    for key in raw:
        if key in _IGNORED:
            continue
        known = OPTIONS.get(key)
        if known is None:
            raise ValueError(
                "disque: unknown option '%s' (the %s options are: %s)"
                % (key, use, ", ".join(k for k in OPTIONS if use in uses_of(k)))
            )
        if use not in uses_of(key):
            raise _fail(key, "does not apply to a %s (it is for: %s)" % (use, ", ".join(uses_of(key))))
    if "queue" in raw and "queues" in raw:
        raise _fail("queues", "and 'queue' are exclusive: give one of them")
    queues: tuple[str, ...] = ()
    if "queue" in raw:
        queues = _names("queue", raw["queue"])
        if len(queues) > 1:
            raise _fail("queue", "names one queue; use 'queues' for several")
    elif "queues" in raw:
        queues = _names("queues", raw["queues"])
    if use == "stream" and not queues:
        raise ValueError("disque: option 'queue' (or 'queues') is required for a stream")
    nodes = parse_nodes(raw.get("nodes"))
    url_tls = nodes_tls(raw.get("nodes"))
    files = {name: str(raw[name]).strip() or None for name in ("tls.cacert", "tls.cert", "tls.key") if name in raw}
    tls = _bool(raw, "tls")
    if tls is False:
        if url_tls:
            raise _fail("tls", "is false but 'nodes' are rediss:// URLs")
        given = [name for name, value in files.items() if value]
        if given:
            raise _fail(given[0], "is given but 'tls' is false")
    if files.get("tls.key") and not files.get("tls.cert"):
        raise _fail("tls.key", "needs 'tls.cert' (the certificate of that key)")
    if "username" in raw and not raw.get("password"):
        raise _fail("username", "needs 'password'")
    values: dict = {
        "use": use,
        "nodes": nodes,
        "password": raw.get("password") or None,
        "username": str(raw.get("username") or "").strip() or None,
        "tls": bool(tls or url_tls or files.get("tls.cacert") or files.get("tls.cert")),
        "tls_cacert": files.get("tls.cacert"),
        "tls_cert": files.get("tls.cert"),
        "tls_key": files.get("tls.key"),
        "queues": queues,
        "batch_size": _int(raw, "batchsize", 1, 100_000) or _DEFAULT_BATCH[use],
    }
    optional = {
        "connect_timeout": _float(raw, "connecttimeout", 0.01),
        "body_format": _choice(raw, "bodyformat", ("raw", "json")),
        "replicate": _int(raw, "replicate", 1),
        "retry": _int(raw, "retry", 0),
        "ttl": _int(raw, "ttl", 1),
        "delay": _int(raw, "delay", 0),
        "maxlen": _int(raw, "maxlen", 1),
        "async_": _bool(raw, "async"),
        "timeout_ms": _int(raw, "timeout", 0),
        "connections": _int(raw, "connections", 1, 256),
        "mode": _choice(raw, "mode", ("snapshot", "consume")),
        "jobs_per_partition": _int(raw, "jobsperpartition", 1),
        "max_jobs_per_trigger": _int(raw, "maxjobspertrigger", 1),
        "max_bytes_per_trigger": _int(raw, "maxbytespertrigger", 1),
        "min_jobs_per_trigger": _int(raw, "minjobspertrigger", 1),
        "max_trigger_delay": _duration(raw, "maxtriggerdelay"),
        "event_time": _bool(raw, "eventtime"),
        "num_partitions": _int(raw, "numpartitions", 1, 10_000),
        "working_interval": _float(raw, "workinginterval", 0.01),
        "working_on_take": _bool(raw, "workingontake"),
        "drain_wait": _float(raw, "drainwait", 0.0),
    }
    values.update({k: v for k, v in optional.items() if v is not None})
    low, high = values.get("min_jobs_per_trigger"), values.get("max_jobs_per_trigger")
    if low is not None and high is not None and low > high:
        raise _fail("minjobspertrigger", "(%d) must not exceed maxJobsPerTrigger (%d)" % (low, high))
    if "maxtriggerdelay" in raw and low is None:
        raise _fail("maxtriggerdelay", "needs 'minJobsPerTrigger' (it bounds the wait for that many jobs)")
    if "sinkid" in raw:
        sink_id = str(raw["sinkid"] or "").strip()
        if not sink_id or len(sink_id.encode("utf-8")) > 200:
            raise _fail("sinkid", "must be a non-empty name of at most 200 bytes, got %r" % raw["sinkid"])
        values["sink_id"] = sink_id
    if "consumername" in raw:
        name = str(raw["consumername"] or "").strip()
        if not NAME_RE.fullmatch(name):
            raise _fail("consumername", "must be 1 to 128 letters, digits, '.', '_' or '-', got %r" % name)
        values["consumer_name"] = name
    if "dedupcolumn" in raw:
        column = str(raw["dedupcolumn"] or "").strip()
        if not column:
            raise _fail("dedupcolumn", "must name a column of the DataFrame (its values are the DEDUP keys)")
        values["dedup_column"] = column
    return Options(**values)
