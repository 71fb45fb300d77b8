"""Pages of a session's transcript and events, read from writer/store's files: forward after a
cursor, backward (newest first) before one, both bounds at once, and a tenant's own rows only."""
import pytest

from storage.records import RecordKind
from test_session_close import event, logs, opened, write
from test_session_summary import grow


def pages(store, what, position, **params):
    """Every row, a page of 3 at a time, following each page's cursor."""
    seen, cursor = [], None
    for _ in range(20):
        bound = {} if cursor is None else {"before" if params.get("desc") else "after": cursor}
        rows, cursor = store.query(what, "a", "t", limit=3, **{**params, **bound})
        seen.append([row[position] for row in rows])
        if cursor is None:
            return seen
    raise AssertionError("the pages never ended")


def test_a_transcript_and_its_events_page_both_ways(tmp_path):
    actors, gateway = logs(tmp_path)
    grow(actors, "a", 3, 100.0)                                       # messages 0-5, loaded
    write(gateway, [(RecordKind.EVENT, event("a", seq)) for seq in range(4)])
    store = opened(tmp_path)
    grow(actors, "a", 2, 200.0, first_seq=4)                          # 6-9: in the next batch
    store.load_all()
    assert pages(store, "messages", "index") == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert pages(store, "messages", "index", desc=True) == [[9, 8, 7], [6, 5, 4], [3, 2, 1], [0]]
    assert [m["index"] for m in store.query("messages", "a", "t", after=2, before=6)[0]] == [3, 4, 5]
    assert [m["index"] for m in store.query("messages", "a", "t", before=6, desc=True, limit=2)[0]] == [5, 4]
    assert store.query("messages", "a", "u", desc=True)[0] == []      # another tenant's session reads as empty
    forward = [e["cursor"] for e in store.query("events", "a", "t")[0]]
    assert len(forward) == 4 and forward == sorted(forward)
    assert sum(pages(store, "events", "cursor", desc=True), []) == forward[::-1]
    with pytest.raises(ValueError, match="forward only"):
        store.query("checkpoint_chain", "a", "t", desc=True)
    store.close()
    for log in (actors, gateway):
        log.close()
