"""DuckDB's memory limit is raised for a statement it refuses for memory (storage/duck_memory.py):
on a real DuckDB file, whatever the class DuckDB words the refusal in."""
import os
from types import SimpleNamespace

import duckdb
import pytest

from storage.duck_memory import RETRY_EXTRA_MB, MemoryLimit, refused_for_memory
from storage.store import Store

BASE_MB = 16


@pytest.fixture
def con(tmp_path):
    con = duckdb.connect(str(tmp_path / "t.db"), config={"memory_limit": f"{BASE_MB}MB", "threads": 1})
    con.execute("CREATE TABLE t (k VARCHAR, b BLOB)")
    yield con
    con.close()


def limit_mb(con) -> float:
    text = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]   # e.g. "15.2 MiB"
    number, unit = text.split()
    return float(number) * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[unit]


def append(con, rows):
    """The loader's own batch (storage/store.py `_append`: one transaction, an appender, COMMIT)
    into this one file."""
    Store._append(SimpleNamespace(conns={"t.db": con}), "t.db", {"t": rows})


def test_a_batch_refused_at_its_commit_loads_once_on_the_raised_retry(con):
    # 625 rows of 22 KB: appended within 16 MB, refused at COMMIT ("Failed to commit: could not
    # allocate block…", a TransactionException) by DuckDB 2.0 — the checkpoint test saw it
    rows = [(f"k{i}", os.urandom(22 << 10)) for i in range(625)]
    memory = MemoryLimit(BASE_MB)
    memory.run(con, lambda: append(con, rows))
    assert con.execute("SELECT count(*), count(DISTINCT k) FROM t").fetchone() == (625, 625)
    assert limit_mb(con) < BASE_MB + 1     # and back down after


def test_the_retry_runs_raised_and_other_errors_are_not_retried(con):
    memory = MemoryLimit(BASE_MB)
    seen = []

    def refused_once():
        seen.append(limit_mb(con))
        if len(seen) == 1:
            raise duckdb.TransactionException("TransactionContext Error: Failed to commit: failed to pin block of "
                                              "size 256.0 KiB (15.2 MiB/15.2 MiB used)")
        return "done"

    assert memory.run(con, refused_once) == "done"
    assert seen[0] < BASE_MB and seen[1] > RETRY_EXTRA_MB / 2 and memory.retries == 1   # (DuckDB says MiB)
    calls = []

    def conflict():
        calls.append(1)
        raise duckdb.TransactionException("TransactionContext Error: Conflict on update")

    with pytest.raises(duckdb.TransactionException, match="Conflict"):
        memory.run(con, conflict)
    assert calls == [1] and memory.retries == 1


def test_what_counts_as_refused_for_memory():
    assert refused_for_memory(duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block"))
    assert refused_for_memory(duckdb.TransactionException("Failed to commit: could not allocate block of size 1 MiB"))
    assert not refused_for_memory(duckdb.TransactionException("cannot rollback - no transaction is active"))
    assert not refused_for_memory(duckdb.FatalException("Failed to commit: could not allocate block"))   # reopened, not retried
    assert not refused_for_memory(duckdb.IOException("could not allocate block"))


def test_a_limit_that_cannot_go_back_down_yet_fails_nothing_and_goes_down_later(con):
    """A deletion's row versions stay in memory until the next checkpoint, and DuckDB refuses a
    lower limit while they are more than it: the statement that succeeded raised once failed then."""
    memory = MemoryLimit(BASE_MB)
    with memory.raised(con):
        con.execute("CREATE TABLE n AS SELECT range AS a FROM range(4000000)")
        con.execute("CHECKPOINT")
    assert limit_mb(con) < BASE_MB

    with memory.raised(con):
        con.execute("DELETE FROM n WHERE a % 7 = 0")   # a row in every vector of every row group
    assert memory.stuck_high and limit_mb(con) > RETRY_EXTRA_MB / 2   # up, and no error
    con.execute("CHECKPOINT")   # the row versions leave memory
    assert memory.run(con, lambda: con.execute("SELECT count(*) FROM n").fetchone()[0]) == 4000000 - 571429
    assert not memory.stuck_high and limit_mb(con) < BASE_MB + 1
