"""`agent-os bench queue-places`: the scheduler's logic for a queue per key timed at a few
sizes, written as a results folder."""
import json

from bench import queue_places


def test_it_times_tick_sync_and_stats_at_each_size_and_writes_its_folder(tmp_path):
    assert queue_places.main(["--keys", "10,100", "--actors", "2", "--repeat", "2", "--name", "t",
                              "--results-root", str(tmp_path)]) == 0
    (folder,) = tmp_path.iterdir()
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    assert [(r["queue"], r["keys"]) for r in rows] == [("limit", 10), ("limit", 100), ("limit and rate", 10),
                                                      ("limit and rate", 100)]
    assert all(r["tick_ms"] >= 0 and r["sync_ms"] > 0 and r["stats_ms"] > 0 for r in rows)
    assert rows[1]["places_in_report"] == 50   # actor/0's half of the keys
    assert (folder / "summary.md").exists() and (folder / "queue_places.png").exists()
