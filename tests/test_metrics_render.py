"""/metrics sums every process's files; a file another process is creating must not fail it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_a_metrics_file_still_being_created_does_not_fail_the_scrape(tmp_path):
    # Values written by one process, then an empty file as a starting process leaves it for a moment.
    script = textwrap.dedent("""
        from agentos import metrics
        metrics.admission_rejected.inc(3)
        open(sys.argv[1] + "/counter_999999.db", "wb").close()
        print(metrics.render().decode())
    """)
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", "import sys\n" + script, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "agentos_admission_rejected_total 3.0" in out.stdout
