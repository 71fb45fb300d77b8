"""The multiprocess metrics directory: what a scrape reads, and what a dead process leaves in it.

prometheus-client's multiprocess mode keeps a file per process and type (`counter_<pid>.db`,
`histogram_<pid>.db`, `gauge_<mode>_<pid>.db`), and a scrape sums them. A dead process's counters
and histograms must stay in those sums (totals survive restarts), so without care every restart
left two files for good, and a child restarting in a loop made every scrape read more of them. So:

- the supervisor, which reaped the process, removes its live gauges (prometheus-client's
  `mark_process_dead`) and renames its counter and histogram files `<type>_dead-<pid>.db` — still
  read by a scrape, so nothing drops out of the sums, and a new process given the same pid starts
  a file of its own;
- then it folds every dead file into one `<type>_archive.db` per type, and a scrape (the gateway)
  does the same before it reads, so a server nobody scrapes does not grow the directory either.
  Folds, renames and scrapes hold one lock (`fold.lock`, flock), so a scrape never reads a fold
  half done, nor lists a file being renamed.
  A fold writes the new archive beside the old one, removes the dead files, then renames the new
  archive into place: a crash between the two loses those processes' counts (a counter reset,
  which Prometheus expects of a restart) and never counts them twice.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import logging
import os
import threading
from typing import Iterator

from prometheus_client import multiprocess
from prometheus_client.mmap_dict import MmapedDict

ARCHIVED_TYPES = ("counter", "histogram")
RENAME_RETRIES = 3
LOCK_FILE = "fold.lock"   # not *.db: no scrape reads it

log = logging.getLogger("agent-os.metrics")
_scrape_lock = threading.Lock()    # scrapes run on executor threads (flock is per open file)


def retire(pid: int, path: str, fold_now: bool = True) -> None:
    """The process `pid` is gone (reaped): its live gauges go, its counts into the archives
    (`fold_now=False`: left as dead files, for one fold of many: a tree that stops folded the
    whole archive again for each of its processes, most of the supervisor's CPU in a stop).

    The renames too are made holding the lock scrapes take: a scrape lists the directory, and a
    listing taken during a rename to a new name can miss the file under either name (ext4; by
    hand, 7,095 of 197,680 listings missed a file renamed to and fro, while files replaced in place
    or left alone were never missed). A scrape from another process read 16, then 14: the dead
    process's count seen in its own file, then neither (`make test` on a fresh clone, 2026-12-03)."""
    try:
        with _folding(path):
            _mark_dead(pid, path)
            if fold_now:
                fold(path)
    except OSError as exc:    # a full disk, say: the dead files stay, and the next fold takes them
        _mark_dead(pid, path)   # done already unless the lock itself failed
        log.warning("could not fold the metrics of pid %d: %s", pid, exc)


def fold_dead(path: str) -> None:
    """Fold the dead files left by `retire(…, fold_now=False)` (a scrape folds them too)."""
    try:
        with _folding(path):
            fold(path)
    except OSError as exc:    # the dead files stay, and the next fold takes them
        log.warning("could not fold the metrics of dead processes: %s", exc)


def _mark_dead(pid: int, path: str) -> None:
    multiprocess.mark_process_dead(pid, path)
    for typ in ARCHIVED_TYPES:
        try:
            os.rename(os.path.join(path, f"{typ}_{pid}.db"), os.path.join(path, f"{typ}_dead-{pid}.db"))
        except FileNotFoundError:
            pass


@contextlib.contextmanager
def _folding(path: str) -> Iterator[None]:
    """Alone among folds and scrapes, in this process (threads) and across processes (flock)."""
    with _scrape_lock:
        fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)      # and with it the flock


def fold(path: str) -> None:
    """Fold the dead files into the archives. Call it holding `_folding`."""
    for typ in ARCHIVED_TYPES:
        dead = sorted(glob.glob(os.path.join(path, f"{typ}_dead-*.db")))
        if not dead:
            continue
        archive = os.path.join(path, f"{typ}_archive.db")
        totals: dict[str, float] = {}
        parsed: set[str] = set()
        for name in [archive, *dead]:
            _add_values(name, totals, parsed)
        fresh = os.path.join(path, f"{typ}_archive.new")   # not *.db: no scrape reads it
        if os.path.exists(fresh):
            os.unlink(fresh)                                # a fold that died before its rename
        values = MmapedDict(fresh)
        try:
            for key, value in totals.items():
                values.write_value(key, value, 0.0)
        finally:
            values.close()
        for name in dead:
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass
        os.replace(fresh, archive)


def _add_values(name: str, totals: dict[str, float], parsed: set[str]) -> None:
    """Add the file's values to `totals`; `parsed`: keys known to parse (most recur in every
    process's file: parsing each once took a tree's stop from about 1,800 parses to 290)."""
    if not sized(name):
        return       # absent, or created and never written: nothing to keep
    try:
        values = [(key, value) for key, value, _, _ in MmapedDict.read_all_values_from_file(name)]
        for key, _ in values:
            if key not in parsed:
                json.loads(key)    # what a scrape parses: a key it cannot would fail every scrape
        parsed.update(key for key, _ in values)
    except FileNotFoundError:
        return
    except Exception as exc:   # a torn file: whole or not at all, and not for every scrape from now on
        log.warning("metrics file %s is unreadable (%s): its counts are dropped", name, exc)
        return
    for key, value in values:
        totals[key] = totals.get(key, 0.0) + value


def sized(path: str) -> bool:
    """A process that starts opens its file empty and sizes it a moment later: prometheus-client's
    reader fails on such a file (a scrape in that moment answered 500)."""
    try:
        return os.path.getsize(path) >= 8     # the header: how many bytes of the file hold values
    except OSError:
        return False                          # gone since the glob (a dead process's live gauge)


class TreeCollector(multiprocess.MultiProcessCollector):
    """The multiprocess sum over the directory, dead processes folded first, files still being
    created left out."""

    def collect(self):
        with _folding(self._path):
            try:
                fold(self._path)
            except OSError as exc:   # a full disk, say: the dead files are still read as they are
                log.warning("could not fold dead processes' metrics: %s", exc)
            for attempt in range(RENAME_RETRIES):
                files = [f for f in glob.glob(os.path.join(self._path, "*.db")) if sized(f)]
                try:
                    return self.merge(files, accumulate=True)
                except FileNotFoundError:
                    if attempt == RENAME_RETRIES - 1:   # renamed by the supervisor since the glob
                        raise
