"""``disque-py check-aof`` (disque_py/persistence/check.py), driven through the real command line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from disque_py.cli.app import main
from disque_py.core.ids import JobIdGenerator
from disque_py.core.job import ACTIVE, QUEUED
from disque_py.persistence import records as R

ROOT = Path(__file__).resolve().parents[2]
NODE = "a" * 40
WALL = 1_732_560_000_000


def _records(n: int, body: bytes = b"hello") -> list[bytes]:
    """n jobs: a LOADJOB each, then for every job in turn QUEUED, ACTIVE, ACKED or DELJOB."""
    gen = JobIdGenerator(NODE, b"check-aof")
    out = []
    for i in range(n):
        job_id = gen.new_id(3600, 300)
        out.append(R.encode_loadjob(R.LoadJob(job_id, QUEUED if i % 2 else ACTIVE, 1, 0, WALL * 1_000_000 + i,
                                              WALL + 3_600_000, 0, 300, 0, 0, 0, b"q%d" % (i % 7), (NODE,),
                                              body + b"%d" % i)))  # fmt: skip
        out.append((R.encode_queued, R.encode_active, R.encode_acked, R.encode_deljob)[i % 4](job_id))
    return out


def _write(path: Path, recs: list[bytes]) -> Path:
    path.write_bytes(b"".join(recs))
    return path


def check_aof(*args: str, input: str | None = None):
    return CliRunner().invoke(main, ["check-aof", *args], input=input, catch_exceptions=False)


def _counts(output: str) -> dict[str, int]:
    m = re.search(r"(\d[\d,]*) records? \(([^)]*)\)", output)
    assert m, output
    return {k: int(v.replace(",", "")) for k, v in (part.split() for part in m[2].split(", "))}


def test_a_valid_file_is_reported_with_its_records_by_kind(tmp_path):
    aof = _write(tmp_path / "disque.aof", _records(10))
    before = aof.read_bytes()
    r = check_aof(str(aof))
    assert r.exit_code == 0, r.output
    assert "AOF is valid: 20 records" in r.output
    assert _counts(r.output) == {"LOADJOB": 10, "QUEUED": 3, "ACTIVE": 3, "ACKED": 2, "DELJOB": 2}
    assert "%s bytes" % format(len(before), ",") in r.output
    assert aof.read_bytes() == before and os.listdir(tmp_path) == ["disque.aof"]  # nothing written


def test_an_empty_file_is_a_valid_aof_without_records(tmp_path):
    aof = tmp_path / "disque.aof"
    aof.write_bytes(b"")
    r = check_aof(str(aof))
    assert r.exit_code == 0, r.output
    assert "AOF is valid: 0 records, empty file" in r.output
    r = check_aof("--fix", "--yes", str(aof))
    assert r.exit_code == 0 and "Nothing to fix" in r.output
    assert os.listdir(tmp_path) == ["disque.aof"]


def test_a_missing_file_or_no_argument_is_a_usage_error(tmp_path):
    r = CliRunner().invoke(main, ["check-aof", str(tmp_path / "nope.aof")])
    assert r.exit_code == 2
    assert "does not exist" in r.output and "Traceback" not in r.output
    assert CliRunner().invoke(main, ["check-aof"]).exit_code == 2
    assert CliRunner().invoke(main, ["check-aof", str(tmp_path)]).exit_code == 2  # a directory


def test_an_unreadable_file_is_a_clean_error(tmp_path, monkeypatch):
    aof = _write(tmp_path / "disque.aof", _records(2))
    real_open = open

    def refuse(path, *args, **kwargs):
        if str(path) == str(aof):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refuse)  # root may read a chmod 0 file
    r = check_aof(str(aof))
    assert r.exit_code == 2 and "Error: cannot read %s: Permission denied" % aof in r.output
    assert "Traceback" not in r.output


def test_a_truncated_tail_is_reported_and_left_alone_without_fix(tmp_path):
    recs = _records(6)
    whole = b"".join(recs)
    good = len(whole) - len(recs[-1])
    aof = tmp_path / "disque.aof"
    aof.write_bytes(whole[:-7])  # the last record loses its last 7 bytes
    r = check_aof(str(aof))
    assert r.exit_code == 1, r.output
    assert "Truncated tail at byte offset %d " % good in r.output
    assert "the last %d bytes are an incomplete record" % (len(recs[-1]) - 7) in r.output
    assert "Valid up to byte offset %d: 11 records" % good in r.output
    assert "AOF is not valid" in r.output and "--fix" in r.output
    assert aof.read_bytes() == whole[:-7] and os.listdir(tmp_path) == ["disque.aof"]


def test_fix_cuts_a_truncated_tail_keeps_a_copy_and_the_file_is_then_valid(tmp_path):
    recs = _records(6)
    whole = b"".join(recs)
    good = len(whole) - len(recs[-1])
    aof = tmp_path / "disque.aof"
    aof.write_bytes(whole[:-7])
    r = check_aof("--fix", "--yes", str(aof))
    assert r.exit_code == 0, r.output
    assert aof.read_bytes() == whole[:good]
    saved = tmp_path / ("disque.aof.bad-%d" % good)
    assert saved.read_bytes() == whole[good:-7]
    assert "AOF is valid now: 11 records" in r.output and "%d bytes dropped" % (len(recs[-1]) - 7) in r.output
    again = check_aof(str(aof))
    assert again.exit_code == 0 and "AOF is valid: 11 records" in again.output


@pytest.mark.parametrize("where", ["body", "checksum", "framing", "kind"])
def test_a_corrupt_byte_in_the_middle_is_reported_at_its_record(tmp_path, where):
    recs = _records(50, body=b"payload-")
    bad = 36  # a LOADJOB (even index): records 0..35 are valid
    start = sum(map(len, recs[:bad]))
    rec = bytearray(recs[bad])
    pos = {"body": rec.index(b"payload-") + 3, "checksum": len(rec) - 5, "framing": rec.index(b"\r\n"),
           "kind": rec.index(b"LOADJOB") + 2}[where]  # fmt: skip
    rec[pos] ^= 0x01 if where != "framing" else 0x20
    data = b"".join(recs[:bad]) + bytes(rec) + b"".join(recs[bad + 1 :])
    aof = tmp_path / "disque.aof"
    aof.write_bytes(data)
    r = check_aof(str(aof))
    assert r.exit_code == 1, r.output
    m = re.search(r"Corrupt record at byte offset (\d+) \(0x([0-9a-f]+)\): (.+)", r.output)
    assert m, r.output
    assert int(m[1]) == start and int(m[2], 16) == start
    assert m[3].strip()  # the reason
    assert "%s bytes from there to the end cannot be loaded" % format(len(data) - start, ",") in r.output
    assert sum(_counts(r.output).values()) == bad
    assert aof.read_bytes() == data


def test_fix_cuts_at_a_corrupt_record_after_confirmation_only(tmp_path):
    recs = _records(20)
    bad = 11
    start = sum(map(len, recs[:bad]))
    rec = bytearray(recs[bad])
    rec[-5] ^= 0x01  # inside the checksum
    data = b"".join(recs[:bad]) + bytes(rec) + b"".join(recs[bad + 1 :])
    aof = tmp_path / "disque.aof"
    aof.write_bytes(data)
    declined = check_aof("--fix", str(aof), input="n\n")
    assert declined.exit_code == 1 and "Continue?" in declined.output and "unchanged" in declined.output
    assert aof.read_bytes() == data and os.listdir(tmp_path) == ["disque.aof"]
    r = check_aof("--fix", str(aof), input="y\n")
    assert r.exit_code == 0, r.output
    assert aof.read_bytes() == data[:start]
    assert (tmp_path / ("disque.aof.bad-%d" % start)).read_bytes() == data[start:]
    assert "AOF is valid now: %d records" % bad in r.output
    assert check_aof(str(aof)).exit_code == 0


def test_fix_never_overwrites_an_earlier_copy(tmp_path):
    recs = _records(3)
    aof = tmp_path / "disque.aof"
    cut_at = sum(map(len, recs[:5]))
    earlier = tmp_path / ("disque.aof.bad-%d" % cut_at)
    earlier.write_bytes(b"keep me")
    aof.write_bytes(b"".join(recs)[:-1])
    r = check_aof("--fix", "--yes", str(aof))
    assert r.exit_code == 0, r.output
    assert earlier.read_bytes() == b"keep me"
    assert (tmp_path / ("disque.aof.bad-%d.1" % cut_at)).read_bytes() == recs[-1][:-1]


def test_garbage_is_corrupt_at_offset_zero(tmp_path):
    aof = tmp_path / "disque.aof"
    aof.write_bytes(b"hello world\n")
    r = check_aof(str(aof))
    assert r.exit_code == 1 and "Corrupt record at byte offset 0 (0x0)" in r.output
    r = check_aof("--fix", "-y", str(aof))
    assert r.exit_code == 0 and aof.read_bytes() == b"" and "AOF is valid now: 0 records" in r.output


def test_a_big_file_is_checked_in_chunks_with_no_progress_bar_in_a_pipe(tmp_path):
    """A few hundred thousand records, through a real process whose output is a pipe."""
    block = b"".join(_records(500))
    copies = 300  # 300,000 records, ~40 MB: over the progress bar's threshold
    bad_at = 200 * len(block)
    aof = tmp_path / "big.aof"
    with open(aof, "wb") as f:
        for _ in range(copies):
            f.write(block)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "check-aof", str(aof)], capture_output=True,
                         text=True, env=env, cwd=str(ROOT), timeout=50)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "AOF is valid: 300,000 records (LOADJOB 150,000, QUEUED 37,500, ACTIVE 37,500, ACKED 37,500, " \
           "DELJOB 37,500)" in out.stdout  # fmt: skip
    assert out.stderr == ""  # no progress bar when stderr is not a terminal
    # one damaged byte far into the file: offset exact across chunk boundaries
    with open(aof, "r+b") as f:
        f.seek(bad_at + 20)
        byte = f.read(1)
        f.seek(bad_at + 20)
        f.write(bytes([byte[0] ^ 0x04]))
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "check-aof", str(aof)], capture_output=True,
                         text=True, env=env, cwd=str(ROOT), timeout=50)  # fmt: skip
    assert out.returncode == 1
    assert "Corrupt record at byte offset %d " % bad_at in out.stdout
    assert "Valid up to byte offset %d: 200,000 records" % bad_at in out.stdout


def test_the_progress_bar_goes_to_stderr_when_asked(tmp_path):
    aof = _write(tmp_path / "disque.aof", _records(100))
    r = CliRunner().invoke(main, ["check-aof", "--progress", str(aof)])
    assert r.exit_code == 0 and "AOF is valid: 200 records" in r.stdout
    assert "Checking" in r.stderr and "Checking" not in r.stdout


def test_the_help_says_what_fix_does_and_to_stop_the_node():
    r = CliRunner().invoke(main, ["check-aof", "--help"])
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "truncated tail" in text and "corrupt record" in text
    assert "Stop the node using the file first" in text and "FILE.bad-OFFSET" in text
    assert "Exit status: 0" in text


def test_the_cut_refuses_a_file_that_changed_since_it_was_checked(tmp_path):
    """A node still appending between the check and the fix: nothing is cut, nothing copied."""
    from disque_py.persistence.check import check, cut

    recs = _records(4)
    aof = tmp_path / "disque.aof"
    aof.write_bytes(b"".join(recs)[:-3])
    report = check(aof)
    assert report.problem is not None and report.problem.kind == "truncated"
    with open(aof, "ab") as f:
        f.write(b"*3\r\n")  # appended after the check
    with pytest.raises(ValueError, match="is a node still writing it"):
        cut(aof, report.problem.offset, expected_size=report.size)
    assert aof.read_bytes() == b"".join(recs)[:-3] + b"*3\r\n" and os.listdir(tmp_path) == ["disque.aof"]
