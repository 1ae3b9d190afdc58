"""The AOF record format: round trips, any slicing, truncation, corruption, limits."""

from __future__ import annotations

import tracemalloc
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disque_py.core.ids import JobIdGenerator
from disque_py.core.job import ACKED, ACTIVE, QUEUED, WAIT_REPL, Extra, Job
from disque_py.core.limits import settings_from_wire
from disque_py.persistence import records
from disque_py.persistence.records import (
    GroupSet,
    DedupGone,
    JobExtra,
    KINDS,
    MAX_BULK_LEN,
    Acked,
    Active,
    AofError,
    CorruptRecord,
    DelJob,
    LoadJob,
    Queued,
    Version,
    RecordReader,
    Truncated,
    encode,
    encode_many,
    load_job_record,
)

HYPO = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NODES = ("0123456789abcdef0123456789abcdef01234567", "f" * 40)
_gen = JobIdGenerator(NODES[0], b"aof-test")
ID1, ID2, ID3 = (_gen.new_id(3600, 60) for _ in range(3))
WALL = 1_732_560_000_000


def loadjob(job_id: bytes = ID1, body: bytes = b"hello\r\nworld", **kw) -> LoadJob:
    fields = dict(
        id=job_id, state=QUEUED, repl=3, flags=5, ctime=WALL * 1_000_000 + 7, expire=WALL + 86_400_000,
        delay=0, retry=300, nacks=2, deliveries=4, requeue=WALL + 300_000, queue=b"q\r\n1",
        nodes=NODES, body=body,
    )  # fmt: skip
    fields.update(kw)
    return LoadJob(**fields)


def _extra() -> Extra:
    e = Extra()
    e.backoff_min, e.backoff_max, e.maxdeliver, e.deadletter, e.count, e.reason = 500, 30_000, 3, b"q.dl", 2, b"boom"
    e.origin = (ID3, b"q", 3, None, [b"MAXDELIVER", b"3"])
    return e


SAMPLE = [
    loadjob(),
    JobExtra(ID1, _extra()),
    DedupGone(ID2, 1_732_000_000_000),
    Queued(ID1),
    Active(ID1),
    loadjob(ID2, body=b"", queue=b"", nodes=(), state=WAIT_REPL, requeue=0, retry=0),
    Acked(ID1),
    DelJob(ID1),
    Version("0.2.0"),
    GroupSet(settings_from_wire([b"tenant", 3, 1_732_000_000_000, "n1", 5, 2500, 1_732_000_000_001, "n2"])),
]
SAMPLE_BYTES = [encode(r) for r in SAMPLE]
FILE = b"".join(SAMPLE_BYTES)
STARTS = [sum(map(len, SAMPLE_BYTES[:i])) for i in range(len(SAMPLE))]


def decode_all(data: bytes, step: int | None = None):
    """(records with offsets, Truncated or None, CorruptRecord or None) of ``data`` fed in steps."""
    reader = RecordReader()
    got = []
    step = step or max(1, len(data))
    try:
        for i in range(0, len(data), step):
            got += reader.feed(data[i : i + step])
        return got, reader.finish(), None
    except CorruptRecord as exc:
        return got + exc.records, None, exc


def record_at(offset: int) -> int:
    """The index in SAMPLE of the record holding byte ``offset`` of FILE."""
    return max(i for i, s in enumerate(STARTS) if s <= offset)


# --- round trips ----------------------------------------------------------------------


def test_a_version_record_holds_a_release_and_nothing_else():
    raw = records.encode_version("0.2.0")
    assert raw.startswith(b"*3\r\n$7\r\nVERSION\r\n$5\r\n0.2.0\r\n")
    assert decode_all(raw)[0] == [(0, Version("0.2.0"))]
    for bad in ("", "0.2.0 beta", "x" * 33, "0.2.0\r\n", "é"):
        with pytest.raises(ValueError, match="a release is 1-32 letters, digits and"):
            records.encode_version(bad)
    # a peer's file: a release with a space, or too long, is a corrupt record
    for bad in (b"0.2 0", b"x" * 33, b""):
        body = b"*3\r\n$7\r\nVERSION\r\n$%d\r\n%s\r\n" % (len(bad), bad)
        damaged = body + b"$8\r\n%08x\r\n" % zlib.crc32(body)
        got, _, err = decode_all(damaged)
        assert got == [] and err is not None and err.offset == 0, bad


def test_every_kind_round_trips_with_its_offset():
    assert {type(r).__name__.upper().encode() for r in SAMPLE} == set(KINDS)
    got, trunc, err = decode_all(FILE)
    assert err is None and trunc is None
    assert got == list(zip(STARTS, SAMPLE))
    assert [type(r) for _, r in got] == [type(r) for r in SAMPLE]


def test_the_batch_encoder_is_the_records_one_after_another():
    assert encode_many(SAMPLE) == FILE
    assert encode_many([]) == b""


def test_a_record_reads_as_a_resp_command():
    raw = encode(Queued(ID1))
    assert raw.startswith(b"*3\r\n$6\r\nQUEUED\r\n$40\r\n" + ID1 + b"\r\n$8\r\n")
    job = encode(SAMPLE[0])
    assert job.startswith(b"*8\r\n$7\r\nLOADJOB\r\n$40\r\n" + ID1 + b"\r\n$6\r\nqueued\r\n")
    assert b"\r\n3 5 %d %d 0 300 2 4 %d\r\n" % (WALL * 1_000_000 + 7, WALL + 86_400_000, WALL + 300_000) in job
    assert b"\r\n" + " ".join(NODES).encode() + b"\r\n$4\r\nq\r\n1\r\n$12\r\nhello\r\nworld\r\n$8\r\n" in job


def test_one_id_kinds_differ_by_kind():
    assert Queued(ID1) != Active(ID1) and Acked(ID1) != DelJob(ID1)


def test_a_reader_may_start_at_an_offset():
    reader = RecordReader(offset=1000)
    assert [o for o, _ in reader.feed(FILE)] == [1000 + s for s in STARTS]
    assert reader.offset == 1000 + len(FILE)


def test_load_job_record_takes_every_field_to_the_wall_clock():
    job = Job(ID1, ACTIVE, b"q", b"body", 2, WALL * 1_000_000, 5_000, 10, 60, 3_000, NODES)
    job.nacks, job.deliveries, job.flags = 1, 2, 4
    rec = load_job_record(job, wall_offset=WALL)
    assert rec == LoadJob(ID1, ACTIVE, 2, 4, WALL * 1_000_000, WALL + 5_000, 10, 60, 1, 2, WALL + 3_000,
                          b"q", NODES, b"body")  # fmt: skip
    job.state, job.next_at = ACKED, 0
    assert load_job_record(job, WALL).requeue == 0
    (_, back), = RecordReader().feed(encode(rec))  # fmt: skip
    assert back == rec


def test_the_fast_path_takes_plain_records_and_agrees_with_the_full_parser():
    odd_node = ("x" * 39 + "!",)  # outside the fast path's node alphabet
    plain = [loadjob(queue=b"q1"), loadjob(body=b"\x00\r\n" * 300, queue=b""), *SAMPLE[3:-2]]
    # a queue name with CR LF, a JOBEXTRA, a DEDUPGONE, a VERSION and a GROUPSET (rare: the full parser's), an odd node
    left = [SAMPLE[0], SAMPLE[1], SAMPLE[2], SAMPLE[-2], SAMPLE[-1], loadjob(nodes=odd_node, queue=b"q")]
    for rec in plain + left:
        raw = bytearray(encode(rec))
        full = RecordReader._parse(raw, 0, len(raw))
        assert full == (rec, len(raw))
        assert records._fast(raw, 0) == (None if rec in left else full)
        for cut in range(len(raw)):  # a partial record is left to the full parser
            assert records._fast(raw[:cut], 0) is None



def _written(state: bytes, numbers: bytes, nodes: bytes, queue: bytes, body: bytes, pad: int = 0) -> bytearray:
    """A LOADJOB as a foreign writer might frame it: every length with ``pad`` leading zeros."""
    parts = [b"LOADJOB", ID1, state, numbers, nodes, queue, body]
    out = bytearray(b"*8\r\n")
    for p in parts:
        out += b"$%0*d\r\n%s\r\n" % (len(b"%d" % len(p)) + pad, len(p), p)
    return out + b"$8\r\n%08x\r\n" % zlib.crc32(out)


def test_the_fast_path_steps_aside_for_what_it_does_not_read_and_the_full_parser_decides():
    numbers = b"3 5 %d %d 0 300 2 4 %d" % (WALL * 1_000_000 + 7, WALL + 86_400_000, WALL + 300_000)
    holders = " ".join(NODES).encode()
    want = loadjob(queue=b"q", body=b"b")
    plain = _written(b"queued", numbers, holders, b"q", b"b")
    assert records._fast(plain, 0) == (want, len(plain))
    # lengths written with a leading zero: valid, read by the full parser, the same record
    padded = _written(b"queued", numbers, holders, b"q", b"b", pad=1)
    assert records._fast(padded, 0) is None
    assert RecordReader().feed(padded) == [(0, want)]
    # an unknown state with a good checksum: the full parser's reason
    with pytest.raises(CorruptRecord, match="LOADJOB: unknown state"):
        RecordReader().feed(_written(b"gone", numbers, holders, b"q", b"b"))
    # a holders' element of 1000 bytes and more (25 nodes) is the fast path's too
    many = tuple("%040x" % (i + 1) for i in range(25))
    rec = _written(b"acked", numbers, " ".join(many).encode(), b"q" * 1200, b"b")
    got = records._fast(rec, 0)
    assert got is not None and got[0] == loadjob(state=ACKED, nodes=many, queue=b"q" * 1200, body=b"b")
    assert RecordReader._parse(rec, 0, len(rec)) == got


# --- any slicing ----------------------------------------------------------------------


def test_byte_at_a_time_gives_what_all_at_once_gives():
    assert decode_all(FILE, 1)[:2] == decode_all(FILE)[:2]
    reader = RecordReader()
    per_byte = [reader.feed(FILE[i : i + 1]) for i in range(len(FILE))]
    # a record comes out with its last byte, not before
    assert [i for i, got in enumerate(per_byte) if got] == [s + len(b) - 1 for s, b in zip(STARTS, SAMPLE_BYTES)]


@HYPO
@given(st.lists(st.integers(1, 64), min_size=1, max_size=40))
def test_any_slicing_gives_the_same_records(cuts):
    pos, chunks = 0, []
    for n in cuts:
        chunks.append(FILE[pos : pos + n])
        pos += n
    chunks.append(FILE[pos:])
    reader = RecordReader()
    got = [x for c in chunks for x in reader.feed(c)]
    assert got == list(zip(STARTS, SAMPLE)) and reader.finish() is None


# --- truncation -----------------------------------------------------------------------


def test_a_file_cut_at_any_byte_gives_the_records_before_and_the_partial_one():
    for cut in range(len(FILE) + 1):
        for step in (None, 1):
            got, trunc, err = decode_all(FILE[:cut], step)
            assert err is None
            complete = [i for i, s in enumerate(STARTS) if s + len(SAMPLE_BYTES[i]) <= cut]
            assert got == [(STARTS[i], SAMPLE[i]) for i in complete]
            if cut in STARTS or cut == len(FILE):
                assert trunc is None
            else:
                start = STARTS[record_at(cut)]
                assert trunc == Truncated(start, cut - start)


# --- corruption -----------------------------------------------------------------------


def test_a_damaged_byte_anywhere_is_never_decoded():
    """Every single-bit flip and every byte inverted, at every offset.

    The checksum (CRC-32 finds every burst of up to 32 bits) or the framing finds each
    one: CorruptRecord at the damaged record. The one other outcome is a length made to
    reach past the end of the file, a cut to any reader: Truncated at the damaged
    record. Either way the records before it, and only those, come out unchanged.
    """
    truncated = 0
    for offset in range(len(FILE)):
        i = record_at(offset)
        for mask in (1, 2, 4, 8, 16, 32, 64, 128, 255):
            data = bytearray(FILE)
            data[offset] ^= mask
            got, trunc, err = decode_all(bytes(data))
            assert got == list(zip(STARTS, SAMPLE))[:i], (offset, mask)
            if err is not None:
                assert err.offset == STARTS[i], (offset, mask, err)
                assert str(err).startswith(f"corrupt AOF record at byte offset {STARTS[i]}: ")
            else:
                assert trunc is not None and trunc.offset == STARTS[i], (offset, mask)
                assert trunc.dropped == len(FILE) - STARTS[i]
                truncated += 1
            if mask in (1, 255):  # the same, fed in pieces (the fuzz tests slice every way)
                g, t, e = decode_all(bytes(data), 7)
                assert (g, t, e and e.args) == (got, trunc, err and err.args)
    assert truncated < 60, truncated  # only lengths made larger than what follows


def test_a_length_damaged_past_the_end_of_the_file_reads_as_a_cut():
    data = FILE.replace(b"$12\r\nhello", b"$99912\r\nhello", 1)
    assert decode_all(data)[1:] == (Truncated(0, len(FILE) + 3), None)
    data = encode(DelJob(ID2)) + data
    assert decode_all(data) == ([(0, DelJob(ID2))], Truncated(len(encode(DelJob(ID2))), len(FILE) + 3), None)


def test_well_framed_records_with_bad_fields_are_corrupt():
    finish = records._finish
    bad = [
        (finish([b"QUEUED", b"x" * 40]), "QUEUED: malformed job ID"),
        (finish([b"NOSUCH", ID1]), "unknown kind of record"),
        (finish([b"QUEUED", ID1, b"extra", b"x", b"y", b"z", b"w"]), "QUEUED has 3 elements, not 8"),
        (finish([b"LOADJOB", ID1, b"queued", b"1 2 3", b"", b"q", b"b"]), "LOADJOB: expected 9 decimal numbers"),
        (finish([b"LOADJOB", ID1, b"queued", b"1 0 0 0 0 0 0 -1 0", b"", b"q", b"b"]), "LOADJOB: expected 9 decimal numbers"),
        (finish([b"LOADJOB", ID1, b"queued", b"1 0 0 0 0 0 0  0", b"", b"q", b"b"]), "LOADJOB: expected 9 decimal numbers"),
        (finish([b"LOADJOB", ID1, b"queued", b"0 0 0 0 0 0 0 0 0", b"", b"q", b"b"]), "LOADJOB: number out of range"),
        (finish([b"LOADJOB", ID1, b"queued", b"1 0 0 0 0 0 0 0 " + b"9" * 19, b"", b"q", b"b"]),
         "LOADJOB: number out of range"),
        (finish([b"LOADJOB", ID1, b"gone", b"1 0 0 0 0 0 0 0 0", b"", b"q", b"b"]), "LOADJOB: unknown state"),
        (finish([b"LOADJOB", ID1, b"queued", b"1 0 0 0 0 0 0 0 0", b"short", b"q", b"b"]),
         "LOADJOB: malformed node ID"),
        (finish([b"LOADJOB", ID1, b"queued", b"1 0 0 0 0 0 0 0 0", b"\xff" * 40, b"q", b"b"]),
         "LOADJOB: malformed node ID"),
        (encode(Queued(ID1))[:-10] + b"DEADBEEF\r\n", "checksum mismatch"),
        (b"+OK\r\n", "expected '*'"),
        (b"*9\r\n", "no kind of record has 9 elements"),
        (b"*3\r\n+QUEUED\r\n", "expected '$'"),
        (b"*3\r\n$-1\r\n", "malformed length"),
        (b"*3\r\n$6\r\nQUEUEDxx", "expected CRLF after a bulk string"),
        (b"*3\r\n$6\r\nQUEUED\r\n$41\r\n", "element too long"),
        (encode(Queued(ID1)).replace(b"$8\r\n", b"$9\r\n"), "malformed checksum"),
    ]  # fmt: skip
    for data, reason in bad:
        for step in (None, 1):
            got, trunc, err = decode_all(encode(DelJob(ID2)) + data, step)
            assert got == [(0, DelJob(ID2))]
            assert err is not None and err.reason == reason and err.offset == len(encode(DelJob(ID2))), data


def test_after_an_error_the_reader_only_repeats_it():
    reader = RecordReader()
    with pytest.raises(CorruptRecord, match=r"^corrupt AOF record at byte offset 0: expected '\*'") as first:
        reader.feed(b"-ERR\r\n")
    with pytest.raises(CorruptRecord, match=r"^corrupt AOF record at byte offset 0: expected '\*'") as again:
        reader.feed(encode(Queued(ID1)))
    assert again.value is first.value
    with pytest.raises(CorruptRecord, match=r"^corrupt AOF record at byte offset 0: expected '\*'"):
        reader.finish()
    done = RecordReader()
    assert done.finish() is None
    with pytest.raises(AofError, match="feed after finish"):
        done.feed(b"*")


# --- limits ---------------------------------------------------------------------------


def test_a_huge_declared_length_is_not_allocated():
    head = records._finish([b"LOADJOB", ID1, b"queued", b"1 0 0 0 0 0 0 0 0", b"", b"q"])
    head = b"*8" + head[2 : head.rindex(b"$8\r\n")] + b"$%d\r\n" % MAX_BULK_LEN + b"x" * 100
    tracemalloc.start()
    try:
        reader = RecordReader()
        assert reader.feed(head) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024
    assert reader.finish() == Truncated(0, len(head))


def test_lengths_and_counts_beyond_the_limits_fail_at_once():
    too_long = b"*8\r\n$7\r\nLOADJOB\r\n$40\r\n" + ID1 + b"\r\n$6\r\nqueued\r\n$18\r\n1 0 0 0 0 0 0 0 0\r\n"
    cases = [
        too_long + b"$%d\r\n" % (MAX_BULK_LEN + 1),
        too_long + b"$99999999999999999999999",  # no line end within the longest length
        b"*3\r\n$100\r\n",  # a kind name is short
        b"*123456",
        b"*3\r\n$6\r\nQUEUED\r\n$40\r\n" + ID1 + b"\r\n$80\r\n",
    ]
    for data in cases:
        for step in (None, 1):
            got, trunc, err = decode_all(data, step)
            assert got == [] and err is not None and err.offset == 0, data


# --- nothing but AofError -------------------------------------------------------------


def _only_aof_errors(data: bytes, step: int) -> None:
    reader = RecordReader()
    try:
        for i in range(0, len(data), step):
            reader.feed(data[i : i + step])
        reader.finish()
    except AofError:
        pass


@HYPO
@given(st.binary(max_size=300), st.integers(1, 50))
def test_arbitrary_bytes_raise_nothing_but_aof_errors(data, step):
    _only_aof_errors(data, step)
    _only_aof_errors(b"*3\r\n$6\r\nQUEUED\r\n" + data, step)
    _only_aof_errors(FILE[:100] + data, step)


@HYPO
@given(
    st.lists(st.tuples(st.integers(0, len(FILE)), st.sampled_from(["set", "insert", "delete"]), st.binary(max_size=4)),
             min_size=1, max_size=4),
    st.integers(1, 80),
)  # fmt: skip
def test_damaged_files_raise_nothing_but_aof_errors_and_slice_alike(edits, step):
    data = bytearray(FILE)
    for at, op, chunk in edits:
        at = min(at, len(data))
        if op == "set":
            data[at : at + len(chunk)] = chunk
        elif op == "insert":
            data[at:at] = chunk
        else:
            del data[at : at + len(chunk)]
    data = bytes(data)
    _only_aof_errors(data, step)
    whole, sliced = decode_all(data), decode_all(data, step)
    assert whole[:2] == sliced[:2]
    assert (whole[2] is None) == (sliced[2] is None)
    if whole[2] is not None:
        assert (whole[2].offset, whole[2].reason) == (sliced[2].offset, sliced[2].reason)
    # what does come out is what was written, where it was written
    for offset, rec in whole[0]:
        assert encode(rec) == data[offset : offset + len(encode(rec))]


@HYPO
@given(
    st.lists(
        st.one_of(
            st.builds(Queued, st.sampled_from([ID1, ID2, ID3])),
            st.builds(DelJob, st.sampled_from([ID1, ID2, ID3])),
            st.builds(
                loadjob,
                st.sampled_from([ID1, ID2, ID3]),
                st.binary(max_size=64),
                state=st.sampled_from([WAIT_REPL, ACTIVE, QUEUED, ACKED]),
                repl=st.integers(1, 65535),
                ctime=st.integers(0, (1 << 63) - 1),
                delay=st.integers(0, 1 << 31),
                queue=st.binary(max_size=20),
                nodes=st.lists(st.sampled_from(NODES), max_size=3).map(tuple),
            ),
        ),
        max_size=8,
    ),
    st.integers(1, 100),
)
def test_generated_records_round_trip_in_any_slicing(recs, step):
    data = encode_many(recs)
    got, trunc, err = decode_all(data, step)
    assert err is None and trunc is None
    assert [r for _, r in got] == recs
