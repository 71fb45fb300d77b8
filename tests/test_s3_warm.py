"""`storage.s3.warm`: a process forked after it makes its S3 client from what boto3 already holds,
reading none of its JSON models from disk again (the supervisor calls it before it forks the fork
server, whose children write to the bucket). In a process of its own: boto3's default session is
process-wide state."""
import json
import subprocess
import sys

from harness import REPO

SCRIPT = """
import json, os, sys
import botocore.loaders
from agentos.config import S3Config
from storage import s3

config = S3Config(bucket="b", endpoint_url="http://127.0.0.1:9", region="us-east-1")
if sys.argv[1] == "warm":
    s3.warm(config)
read = []
load_file = botocore.loaders.JSONFileLoader.load_file
def counting(self, path, *args, **kwargs):
    read.append(os.path.basename(str(path)))
    return load_file(self, path, *args, **kwargs)
botocore.loaders.JSONFileLoader.load_file = counting
pid = os.fork()
if pid == 0:
    s3.client(config)
    print(json.dumps(read), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


def models_a_forked_child_reads(mode: str) -> list[str]:
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_child_forked_after_warm_reads_no_model_from_disk():
    assert models_a_forked_child_reads("cold"), "without warm the child reads S3's models itself"
    assert models_a_forked_child_reads("warm") == []
