import sys, time
pids=[int(p) for p in sys.argv[1:]]
def st(p):
    s=open(f"/proc/{p}/stat").read(); rest=s[s.rindex(")")+2:].split()
    return int(rest[7]), int(rest[11])+int(rest[12])   # minflt, utime+stime
a={p:st(p) for p in pids}; time.sleep(3); b={p:st(p) for p in pids}
for p in pids:
    name=open(f"/proc/{p}/comm").read().strip()
    print(p, name, "minflt/s", (b[p][0]-a[p][0])//3, "cpu%", (b[p][1]-a[p][1])/3)
