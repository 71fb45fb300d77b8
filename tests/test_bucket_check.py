"""`agent-os log check --bucket` (storage/bucket_check.py): the bucket's copy of the logs read back,
against a real S3 endpoint (moto's server): whole objects and no gap is ok (exit 0); a damaged
object or a log with a gap is named (exit 1); beside a running server."""
import io

import pytest

from agentos.config import S3Config
from bench.failover import put
from log_frames import frames
from storage import bucket_check
from storage.s3 import ObjectStore


@pytest.fixture
def store(s3):
    return ObjectStore(S3Config(bucket=s3.new_bucket()), s3=s3.client())


def shipped(store, index, data, per_object=4):
    at = 0
    for i in range(0, len(data), per_object):
        body = b"".join(data[i:i + per_object])
        store.put_batch(index, at, at + len(body), 1, body)
        at += len(body)
    return at


def checked(store):
    out = io.StringIO()
    return bucket_check.print_check(store, out), out.getvalue()


def test_whole_objects_without_a_gap_check_ok(store):
    assert checked(store) == (0, f"no logs in the bucket {store.bucket!r} (prefix '')\n")
    end0 = shipped(store, 0, frames(12))
    end1 = shipped(store, 1, frames(5))
    code, text = checked(store)
    assert code == 0, text
    assert f"log 0: 3 objects, {end0:,} bytes, positions 0-{end0:,}" in text
    assert f"log 1: 2 objects, {end1:,} bytes, positions 0-{end1:,}" in text
    assert text.endswith("ok: every object whole records, every log without a gap\n")


def test_a_damaged_object_and_a_gap_are_named(store):
    shipped(store, 0, frames(12))
    shipped(store, 3, frames(12))
    middle = store.chain(0)[1]
    body = bytearray(store.get(middle.key))
    body[30] ^= 0xFF
    store.put_batch(0, middle.start, middle.end, 1, bytes(body))
    gone = store.chain(3)[1]
    store.delete([gone.key])
    code, text = checked(store)
    assert code == 1, text
    assert f"damaged: {middle.key}: the bytes at position {middle.start:,} are not a whole record" in text
    assert f"gap: positions [{gone.start:,}, {gone.end:,}) are in no object" in text
    assert "damaged: 2 problem(s)" in text


def test_the_command_beside_a_running_server(make_s3_server, s3):
    bucket = s3.new_bucket()
    node = make_s3_server(bucket, "a")
    for i in range(10):
        assert put(node.url, f"scrub-{i}", "k", f"state {i}".encode()) == 200
    check = node.cli("log", "check", "--bucket")
    assert check.returncode == 0 and "ok: every object whole records" in check.stdout, check.stdout + check.stderr
    client = s3.client()
    key = next(o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"] if "/wal/" in "/" + o["Key"])
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[10] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    check = node.cli("log", "check", "--bucket")
    assert check.returncode == 1 and f"damaged: {key}: " in check.stdout, check.stdout + check.stderr
    assert node.stop() == 0
    local = node.cli("log", "check")                 # the disk's copy is another matter
    assert local.returncode == 0, local.stdout
