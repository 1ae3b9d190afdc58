"""Properties of the AOF reader and loader (``fuzz_aof``) on hypothesis' inputs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from disque_py.core.job import STATE_NAMES, Extra
from disque_py.persistence.records import Acked, Active, DedupGone, DelJob, JobExtra, LoadJob, Queued, RecordReader, encode

from .fuzz_aof import WALL, T0, check_aof, fix_crcs

FAST = settings(max_examples=120, deadline=None)

NOW_WALL = T0 + WALL
job_id = st.sampled_from([b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1", b"D-01234567-BBBBBBBBBBBBBBBBBBBBBBBB-0000",
                          b"D-89abcdef-CCCCCCCCCCCCCCCCCCCCCCCC-ffff"])  # fmt: skip
wall = st.one_of(st.integers(0, 2**63 - 1), st.integers(NOW_WALL - 10_000, NOW_WALL + 86_400_000))
small = st.integers(0, 2**31)
loadjob = st.builds(
    LoadJob, job_id, st.integers(0, len(STATE_NAMES) - 1), st.integers(1, 65535), st.integers(0, 255),
    st.integers(0, 2**63 - 1), wall, small, st.one_of(st.just(0), small), st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1), st.one_of(st.just(0), wall), st.binary(max_size=8),
    st.lists(st.sampled_from(["0123456789abcdef0123456789abcdef01234567", "f" * 40]), max_size=3, unique=True).map(tuple),
    st.binary(max_size=16),
)  # fmt: skip


def _extra(key: bytes, maxdeliver: int) -> Extra:
    e = Extra()
    e.dedup = key  # JOBEXTRA's 'k' (a DEDUP key, core/dedup.py)
    e.maxdeliver = maxdeliver
    return e


jobextra = st.builds(JobExtra, job_id, st.builds(_extra, st.binary(min_size=1, max_size=512), st.integers(0, 5)))
dedupgone = st.builds(DedupGone, job_id, wall)
record = st.one_of(loadjob, jobextra, dedupgone, *(st.builds(k, job_id) for k in (Queued, Active, Acked, DelJob)))


@FAST
@given(st.binary(max_size=400), st.integers(0, 2**32))
def test_any_bytes(data, seed):
    check_aof(data, seed)


@FAST
@given(st.lists(record, min_size=1, max_size=8), st.integers(0, 2**32))
def test_valid_records_load(records, seed):
    data = b"".join(map(encode, records))
    assert [r for _, r in RecordReader().feed(data)] == records
    check_aof(data, seed)


@FAST
@given(st.lists(record, min_size=1, max_size=4), st.data())
def test_damaged_records(records, data):
    raw = bytearray(b"".join(map(encode, records)))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    check_aof(bytes(raw), data.draw(st.integers(0, 2**32)))


def test_placeholders_get_the_checksum():
    data = encode(Queued(b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"))
    masked = data[:-10] + b"????????\r\n"
    assert fix_crcs(masked) == data
    assert fix_crcs(masked + masked) == data + data
