"""`agent-os bench broadcasts` against a real tree and workers, at a small size: each round wakes
every waiting run of its group, one way or the other, and the folder holds both ways' medians."""
import json

from bench import broadcasts


def test_both_ways_wake_every_run_of_their_round_and_the_folder_has_their_medians(tmp_path):
    assert broadcasts.main(["--runs", "12", "--rounds", "2", "--workers", "1", "--slots", "16", "--name", "t",
                            "--results-root", str(tmp_path)]) == 0
    (folder,) = tmp_path.iterdir()
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    # the order of the ways swapped each round, so the machine's drift falls on both alike
    assert [(r["round"], r["way"]) for r in rows] == [(1, "broadcast"), (1, "per_run"), (2, "per_run"),
                                                      (2, "broadcast")]
    assert all(r["runs"] == 12 and 0 < r["wake_p50_ms"] <= r["wake_p99_ms"] <= r["last_wake_ms"] for r in rows)
    medians = [json.loads(line) for line in (folder / "medians.jsonl").read_text().splitlines()]
    assert [(m["way"], m["rounds"]) for m in medians] == [("broadcast", 2), ("per_run", 2)]
    assert (folder / "summary.md").exists() and (folder / "broadcasts.png").exists()
