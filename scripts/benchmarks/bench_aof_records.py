"""Decode speed of the AOF record format (disque_py/persistence/records.py), no I/O.

    PYTHONPATH=scripts .venv/bin/python -m benchmarks.bench_aof_records [--n 100000] [--body 100]

Encodes N LOADJOB records (three holders, a body of --body bytes) and N QUEUED
records, then decodes each file in 64 KiB pieces with RecordReader. Prints
records per second of process CPU time, best of --runs (CPU time, not wall
time: the machines these run on are shared).
"""

from __future__ import annotations

import argparse
import time

from disque_py.core.ids import JobIdGenerator
from disque_py.core.job import QUEUED
from disque_py.persistence.records import LoadJob, Queued, RecordReader, encode_many

CHUNK = 64 * 1024
WALL = 1_732_560_000_000


def decode_rate(data: bytes, n: int, runs: int) -> float:
    best = 0.0
    for _ in range(runs):
        reader = RecordReader()
        got = 0
        t = time.process_time()
        for i in range(0, len(data), CHUNK):
            got += len(reader.feed(data[i : i + CHUNK]))
        assert reader.finish() is None and got == n
        best = max(best, n / (time.process_time() - t))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--body", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    gen = JobIdGenerator("a" * 40, b"bench")
    nodes = ("a" * 40, "b" * 40, "c" * 40)
    jobs = [
        LoadJob(gen.new_id(86_400, 300), QUEUED, 3, 0, WALL * 1_000_000 + i, WALL + 86_400_000, 0, 300, 0, 0,
                WALL + 300_000, b"myqueue", nodes, b"x" * args.body)
        for i in range(args.n)
    ]  # fmt: skip
    t = time.process_time()
    loadjobs = encode_many(jobs)
    enc = args.n / (time.process_time() - t)
    queued = encode_many([Queued(j.id) for j in jobs])
    print(f"LOADJOB: {len(loadjobs) / args.n:.0f} bytes/record, encode {enc:,.0f} records/s, "
          f"decode {decode_rate(loadjobs, args.n, args.runs):,.0f} records/s")  # fmt: skip
    print(f"QUEUED:  {len(queued) / args.n:.0f} bytes/record, decode {decode_rate(queued, args.n, args.runs):,.0f} records/s")


if __name__ == "__main__":
    main()
