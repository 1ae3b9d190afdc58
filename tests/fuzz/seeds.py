"""How the committed seeds of ``corpus/`` were made (``python -m tests.fuzz seeds`` writes
them again). Each is a small valid input, one feature each, for the fuzzer to start from;
the fuzzer's own corpus grows in ``work/`` and is not committed."""

from __future__ import annotations

import re
from pathlib import Path

from . import CORPUS


def aof_seeds() -> dict[str, bytes]:
    from disque_py.core.node import Node
    from disque_py.persistence import journal, records

    from .fuzz_aof import T0, WALL

    def readable(data: bytes) -> bytes:  # the checksums as placeholders (fuzz_aof.fix_crcs)
        return re.sub(rb"\$8\r\n[0-9a-f]{8}\r\n", b"$8\r\n????????\r\n", data)

    node = Node("0123456789abcdef0123456789abcdef01234567", seed=b"seed", now=T0, wall_offset=WALL)
    entries: list = []
    node.set_journal(entries)

    def run(*argv: str):
        return node.execute(1, [a if isinstance(a, bytes) else a.encode() for a in argv], T0)

    a = bytes(run("ADDJOB", "q", "first body", "0", "RETRY", "30", "TTL", "3600"))
    b = bytes(run("ADDJOB", "q", "at most once", "0", "RETRY", "0", "DELAY", "5"))
    c = bytes(run("ADDJOB", "other", "bin\x00ary\r\n", "0", "TTL", "60"))
    run("GETJOB", "NOHANG", "FROM", "q")
    run("ACKJOB", c)
    added = journal.encode_entries(entries, WALL)
    deljob = records.encode_deljob(a)
    seeds = {
        "jobs-and-states": readable(added),
        "loadjob-then-deljob": readable(added + deljob),
        "truncated-tail": readable(added)[:-7],
        "one-queued": readable(records.encode_queued(b)),
        "acked-unknown-id": readable(records.encode_acked(b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1")),
    }
    return seeds


def resp_seeds() -> dict[str, bytes]:
    return {
        "multibulk": b"*3\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$4\r\nbody\r\n*1\r\n$4\r\nPING\r\n",
        "inline": b'ADDJOB q "a \\x41\\n body" 0\r\nQLEN q\nPING\r\n',
        "inline-then-multibulk": b"PING\r\n*2\r\n$4\r\nQLEN\r\n$1\r\nq\r\n",
        "stray-newlines": b"*1\r\n$4\r\nPING\r\n\r\n*1\r\n$4\r\nPING\r\n",
        "quotes": b"SET 'it\\'s' \"tab\\there\" \"\\xff\"\n",
        "resp3-and-nulls": b"*-1\r\n*0\r\n*2\r\n$4\r\nECHO\r\n+simple\r\n",
        "bad-type": b"*1\r\n:5\r\n",
    }


def bus_seeds() -> dict[str, bytes]:
    from cluster_bus.codec import encode_message, frame
    from cluster_bus.messages import AuthChallenge, AuthHello, AuthProof, Data, DataBatch, Fail, Gossip, Meet, Ping, Pong

    from .fuzz_bus import MODE_INITIATOR, MODE_PLAIN, MODE_RESPONDER, MODE_SESSION, PEER_ID

    other = "b" * 40
    gossip = (Gossip(other, "127.0.0.1", 7712, 0, 0, 5), Gossip("c" * 40, "::1", 7713, 1, 3, 0))
    job = b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"

    def frames(*msgs) -> bytes:
        return b"".join(frame(encode_message(m)) for m in msgs)

    plain = [
        Meet(PEER_ID, 7711, 0, gossip),
        Ping(PEER_ID, 7711, 0, gossip),
        Pong(PEER_ID, 7711, 0x80, ()),
        Fail(PEER_ID, other),
        Data(PEER_ID, "SETACK", [job, 2]),
        DataBatch(PEER_ID, [["GOTACK", [job, True]], ["NEEDJOBS", [b"q", 3]]]),
    ]
    return {
        "plain-gossip": bytes([MODE_PLAIN]) + frames(*plain[:4]),
        "plain-data": bytes([MODE_PLAIN]) + frames(*plain[4:]),
        "responder-hello": bytes([MODE_RESPONDER]) + frames(AuthHello(b"h" * 16), AuthProof(b"p" * 32)),
        "initiator-challenge": bytes([MODE_INITIATOR]) + frames(AuthChallenge(b"c" * 16, b"p" * 32)),
        "session": bytes([MODE_SESSION]) + frames(*plain),
        "session-auth-after-handshake": bytes([MODE_SESSION]) + frames(AuthHello(b"h" * 16)),
    }


def commands_seeds() -> dict[str, bytes]:
    """The text seeds of ``corpus/commands`` are written by hand; one binary one here."""
    import msgpack

    from disque_py.protocol.resp import encode_request

    job = b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"
    reqs = [
        [b".peers", b"1"],
        [b"ADDJOB", b"q", b"x", b"0"],
        [b".recv", b"SETACK", msgpack.packb([job, 2])],
        [b".recv", b"GOTACK", msgpack.packb([job, True, True])],
        [b".recv", b"DELJOB", msgpack.packb([job, ["1" * 40]])],
        [b".recv", b"NEEDJOBS", msgpack.packb([b"q", 5])],
        [b".recv", b"PAUSE", msgpack.packb([b"q", 1])],
        [b".recv", b"ENQUEUE", msgpack.packb([job, 0])],
        [b".recv", b"YOURJOBS", msgpack.packb([[{"id": job}]])],
        [b".advance", b"5000"],
    ]
    return {"peer-messages": b"".join(encode_request(r) for r in reqs)}


MAKERS = {"aof": aof_seeds, "resp": resp_seeds, "bus": bus_seeds, "commands": commands_seeds}


def write(target: str) -> list[Path]:
    out = []
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in MAKERS[target]().items():
        path = folder / name
        path.write_bytes(data)
        out.append(path)
    return out
