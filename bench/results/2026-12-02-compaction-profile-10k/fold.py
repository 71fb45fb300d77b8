"""Shares of py-spy's samples (raw collapsed stacks: `frame;frame;... count`) that have a
function of interest anywhere on their stack, and the commonest leaf-first stack tails.
Run: python3 fold.py gateway.stacks.txt store.stacks.txt"""
import collections
import sys

KEYS = ["zero_file", "drop_records", "_blob_end", "SegmentLog.write", "superseded_blobs", "forget_superseded",
        "Store._load_once", "Store._append", "FrontConnection"]
for name in sys.argv[1:]:
    total, hits, tails = 0, collections.Counter(), collections.Counter()
    for line in open(name):
        stack, n = line.rstrip().rsplit(" ", 1)
        n = int(n)
        total += n
        frames = [f.split(" (")[0] for f in stack.split(";")[1:]]
        for key in KEYS:
            if any(key in f for f in frames):
                hits[key] += n
        tails[" < ".join(frames[-1:-4:-1])] += n
    print(f"{name}: {total} samples")
    for key, n in hits.most_common():
        print(f"  {key:22} {n:5d}  {100 * n / total:5.1f}%")
    for tail, n in tails.most_common(12):
        print(f"    {n:5d}  {tail[:150]}")
