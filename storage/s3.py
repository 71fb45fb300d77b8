"""Object storage: the write-ahead log's batches in a bucket, and the lease of the active node.

Keys (all under `storage.s3.prefix`):
    wal/WWW/SSSSSSSSSSSSSSSSSSSS-EEEEEEEEEEEEEEEEEEEE-eEPOCH.log   bytes [S, E) of log W
    lease.json                                                   {"node", "epoch", "expires_at"}

A batch object holds exactly the bytes of the local segment range it covers, so a node with an
empty disk rebuilds its log by writing the objects back in key order. The epoch in the key is
the lease epoch of the node that wrote it: after a takeover, objects of an older epoch beyond
the point the new node recovered to are ignored (fencing: a node that lost its lease never had
those records acknowledged). The lease is created with If-None-Match and renewed or taken with
If-Match on its ETag, so two nodes can never both believe they hold it.

Blocking calls (boto3): run them on a thread, never on an event loop.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

import botocore.exceptions

from agentos import metrics
from agentos.config import S3Config

_BATCH = re.compile(r"wal/(\d{3})/(\d{20})-(\d{20})-e(\d+)\.log$")


class LeaseLost(RuntimeError):
    """Another node holds (or has taken) the lease."""


class S3Unavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class BatchObject:
    writer: int
    start: int
    end: int
    epoch: int
    key: str


@dataclass
class Lease:
    node: str
    epoch: int
    expires_at: float
    etag: str


def client(config: S3Config):
    """A boto3 S3 client (credentials from the usual AWS environment or files). boto3 is imported
    here, not with this module: 0.15 s of CPU that the fork server (agentos/forkserver.py) would
    otherwise spend at every start of a tree that keeps its log on local disk only."""
    import boto3
    import botocore.config
    return boto3.client("s3", endpoint_url=config.endpoint_url or None, region_name=config.region or None,
                        config=botocore.config.Config(retries={"max_attempts": 2, "mode": "standard"},
                                                      connect_timeout=5, read_timeout=30,
                                                      max_pool_connections=16))


def warm(config: S3Config) -> None:
    """Make a client and drop it: boto3's default session then holds S3's models, endpoint rules
    and the credentials it found, and a process forked after this makes its own client for about
    0.02 s of CPU instead of 0.4 (the imports, and JSON models read and parsed again; measured).
    The supervisor calls it before it forks the first fork server, whose children write to the
    bucket (writer/log, the gateway's log). Best effort: a client that cannot be made here fails
    where it is used, with its own message."""
    try:
        client(config)
    except Exception:
        pass


def _failed(exc: Exception) -> bool:
    return isinstance(exc, (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError))


def _precondition(exc: Exception) -> bool:
    if not isinstance(exc, botocore.exceptions.ClientError):
        return False
    return exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412", "ConditionalRequestConflict")


class ObjectStore:
    """Every request is counted in `agentos_s3_requests_total` by operation (put, get, list,
    delete) and purpose: wal (shipping), compaction, recovery (rebuilding the log), lease."""

    def __init__(self, config: S3Config, s3=None) -> None:
        self.bucket = config.bucket
        self.prefix = config.prefix.rstrip("/") + "/" if config.prefix else ""
        self.s3 = s3 or client(config)
        self.puts = 0
        self.gets = 0

    @staticmethod
    def _count(op: str, purpose: str) -> None:
        metrics.s3_requests.labels(op, purpose).inc()

    # -- the log -----------------------------------------------------------------------------

    def batch_key(self, writer: int, start: int, end: int, epoch: int) -> str:
        return f"{self.prefix}wal/{writer:03d}/{start:020d}-{end:020d}-e{epoch}.log"

    def put_batch(self, writer: int, start: int, end: int, epoch: int, data: bytes, purpose: str = "wal") -> str:
        key = self.batch_key(writer, start, end, epoch)
        self._count("put", purpose)
        try:
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)
        except Exception as exc:
            if _failed(exc):
                raise S3Unavailable(f"PUT {key}: {exc}") from None
            raise
        self.puts += 1
        return key

    def batches(self, writer: int, purpose: str = "recovery") -> list[BatchObject]:
        """Every batch object of a log, in log order."""
        out = []
        prefix = f"{self.prefix}wal/{writer:03d}/"
        try:
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                self.gets += 1
                self._count("list", purpose)
                for item in page.get("Contents", ()):
                    match = _BATCH.search(item["Key"])
                    if match:
                        out.append(BatchObject(int(match[1]), int(match[2]), int(match[3]), int(match[4]), item["Key"]))
        except Exception as exc:
            if _failed(exc):
                raise S3Unavailable(f"LIST {prefix}: {exc}") from None
            raise
        return sorted(out, key=lambda b: (b.start, b.end))

    def logs(self, purpose: str = "check") -> list[int]:
        """The logs the bucket holds objects of (by writer index)."""
        prefix = f"{self.prefix}wal/"
        found = set()
        try:
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                          Delimiter="/"):
                self._count("list", purpose)
                for item in page.get("CommonPrefixes", ()):
                    name = item["Prefix"][len(prefix):].rstrip("/")
                    if name.isdigit():
                        found.add(int(name))
        except Exception as exc:
            if _failed(exc):
                raise S3Unavailable(f"LIST {prefix}: {exc}") from None
            raise
        return sorted(found)

    def chain(self, writer: int, purpose: str = "recovery") -> list[BatchObject]:
        """The batches that make up the log, in order: where two start at the same position (a
        node that lost its lease kept writing after the takeover), the higher epoch wins."""
        best: dict[int, BatchObject] = {}
        for batch in self.batches(writer, purpose):
            known = best.get(batch.start)
            if known is None or batch.epoch > known.epoch or (batch.epoch == known.epoch and batch.end > known.end):
                best[batch.start] = batch
        out, end = [], -1
        for start in sorted(best):
            batch = best[start]
            if batch.start < end:
                continue  # overlaps what the chain already covers
            out.append(batch)
            end = batch.end
        return out

    def get(self, key: str, purpose: str = "recovery") -> bytes:
        try:
            self.gets += 1
            self._count("get", purpose)
            return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as exc:
            if _failed(exc):
                raise S3Unavailable(f"GET {key}: {exc}") from None
            raise

    def delete(self, keys: list[str], purpose: str = "compaction") -> None:
        for i in range(0, len(keys), 1000):
            chunk = keys[i:i + 1000]
            self._count("delete", purpose)
            try:
                self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in chunk]})
            except Exception as exc:
                if _failed(exc):
                    raise S3Unavailable(f"DELETE {len(chunk)} objects: {exc}") from None
                raise

    # -- the lease ---------------------------------------------------------------------------

    @property
    def lease_key(self) -> str:
        return f"{self.prefix}lease.json"

    def read_lease(self) -> Lease | None:
        try:
            self.gets += 1
            self._count("get", "lease")
            obj = self.s3.get_object(Bucket=self.bucket, Key=self.lease_key)
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise S3Unavailable(f"GET lease: {exc}") from None
        except Exception as exc:
            if _failed(exc):
                raise S3Unavailable(f"GET lease: {exc}") from None
            raise
        body: dict[str, Any] = json.loads(obj["Body"].read())
        return Lease(body["node"], int(body["epoch"]), float(body["expires_at"]), obj["ETag"])

    def write_lease(self, node: str, epoch: int, ttl_secs: float, etag: str | None) -> Lease:
        """Create (etag None) or replace (If-Match etag) the lease; LeaseLost if someone else won.

        A write that failed on the way back (a connection cut, a retry answered 503) may still have
        landed, leaving the lease with an ETag its writer never saw: the next renewal's If-Match
        then fails although nobody else wrote. So a failed condition is checked against the
        lease itself, and if it still names this node and epoch, the write is made again on the
        ETag found — another node taking over writes its own name, which no renewal overwrites."""
        try:
            return self._put_lease(node, epoch, ttl_secs, etag)
        except LeaseLost:
            if etag is None:
                raise
            current = self.read_lease()
            if current is None or current.node != node or current.epoch != epoch or current.etag == etag:
                raise
            return self._put_lease(node, epoch, ttl_secs, current.etag)

    def _put_lease(self, node: str, epoch: int, ttl_secs: float, etag: str | None) -> Lease:
        expires_at = time.time() + ttl_secs
        body = json.dumps({"node": node, "epoch": epoch, "expires_at": expires_at}).encode()
        condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        self._count("put", "lease")
        try:
            reply = self.s3.put_object(Bucket=self.bucket, Key=self.lease_key, Body=body,
                                       ContentType="application/json", **condition)
        except Exception as exc:
            if _precondition(exc):
                raise LeaseLost("the lease changed hands") from None
            if _failed(exc):
                raise S3Unavailable(f"PUT lease: {exc}") from None
            raise
        self.puts += 1
        return Lease(node, epoch, expires_at, reply["ETag"])

    def release(self, lease: Lease) -> None:
        """Hand the lease back on a clean stop, so a standby need not wait for it to expire."""
        body = json.dumps({"node": lease.node, "epoch": lease.epoch, "expires_at": 0}).encode()
        self._count("put", "lease")
        try:
            self.s3.put_object(Bucket=self.bucket, Key=self.lease_key, Body=body, IfMatch=lease.etag)
            self.puts += 1
        except Exception as exc:
            if not (_precondition(exc) or _failed(exc)):
                raise

    def acquire(self, node: str, ttl_secs: float) -> Lease | None:
        """Take the lease if it is free or expired; None while another node holds it."""
        current = self.read_lease()
        if current is None:
            return self.write_lease(node, 1, ttl_secs, None)
        if current.node == node:
            return self.write_lease(node, current.epoch, ttl_secs, current.etag)
        if time.time() > current.expires_at:
            return self.write_lease(node, current.epoch + 1, ttl_secs, current.etag)
        return None
