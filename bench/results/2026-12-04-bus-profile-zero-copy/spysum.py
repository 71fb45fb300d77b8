import sys
from collections import Counter
for path in sys.argv[1:]:
    self_c = Counter(); incl = Counter(); tot = 0
    for line in open(path):
        stack, n = line.rsplit(' ', 1); n = int(n); tot += n
        frames = stack.split(';')
        self_c[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    print("==", path, "samples", tot)
    for k, v in self_c.most_common(12): print("  self %5.1f%% %s" % (100*v/tot, k[:140]))
    for k, v in incl.most_common(25):
        if 'run ' in k or '<module>' in k: continue
        print("  incl %5.1f%% %s" % (100*v/tot, k[:140]))
