import sys, collections
self_c=collections.Counter(); tot=0
incl=collections.Counter()
for line in open(sys.argv[1]):
    line=line.rstrip()
    if not line: continue
    stack, n = line.rsplit(" ",1); n=int(n); tot+=n
    frames=stack.split(";")
    self_c[frames[-1]]+=n
    for f in set(frames): incl[f]+=n
print("total", tot)
print("--self"); [print(f"{v/tot*100:5.1f} {k[:150]}") for k,v in self_c.most_common(15)]
print("--incl"); [print(f"{v/tot*100:5.1f} {k[:150]}") for k,v in incl.most_common(30)]
