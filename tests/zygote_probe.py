"""Run as `python [-P] -m zygote_probe CODE`: prints what a launched process sees, as JSON, then
exits with CODE; `sleep` sleeps a minute (tests/test_zygote.py compares a zygote's launch with a subprocess's)."""
import json
import os
import sys
import threading
import time

import setproctitle

if sys.argv[1] == "sleep":
    time.sleep(60)
    raise SystemExit(0)
setproctitle.setproctitle("zygote-probe: a title of some length")
print(json.dumps({
    "title": open("/proc/self/cmdline", "rb").read().split(b"\0")[0].decode(),
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "probe_env": os.environ.get("ZYGOTE_PROBE"),
    "path": sys.path,
    "session_leader": os.getsid(0) == os.getpid(),
    "stdin": os.readlink("/proc/self/fd/0"),
    "prometheus_imported": "prometheus_client" in sys.modules,
    "our_modules": sorted(m for m in sys.modules if m.split(".")[0] in ("actors", "broker", "gateway", "storage")),
    "threads": threading.active_count(),
    "name": __name__,
}))
print("to stderr", file=sys.stderr)
raise SystemExit(int(sys.argv[1]))
