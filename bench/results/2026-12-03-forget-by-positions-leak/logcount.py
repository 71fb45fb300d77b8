"""After a server stopped: BLOB records left in its logs against the checkpoint rows in DuckDB."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import duckdb
from storage import segments
from storage.records import RecordKind
data = Path(sys.argv[1])
total = 0
for wal in sorted((data / "wal").iterdir()):
    r = segments.SegmentReader(wal, 0); n = 0
    while True:
        recs = r.read(64 << 20)
        if not recs:
            break
        n += sum(1 for _, kind, _, _, _ in recs if kind == RecordKind.BLOB)
        r.position = recs[-1][4]
    print(f"log {wal.name}: {n} BLOB records"); total += n
con = duckdb.connect(str(data / "db" / "messages.db"), read_only=True)
rows, sessions = con.execute("SELECT count(*), count(DISTINCT session) FROM checkpoints WHERE kind = 'blob'").fetchone()
print(f"log BLOB records {total}, DuckDB blob rows {rows}, sessions {sessions}")
