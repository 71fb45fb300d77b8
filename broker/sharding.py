"""Stable mapping of session ids to actor shards.

crc32 is stable across processes and Python versions (unlike hash(), which is salted per
process), so a restarted actor/n gets back exactly the sessions of actor/n.
"""
from __future__ import annotations

import zlib


def shard_of(session_id: str, shards: int) -> int:
    if shards < 1:
        raise ValueError("shard count must be at least 1")
    return zlib.crc32(session_id.encode()) % shards


ACTOR_PREFIX = "actor/"


def actor_name(session_id: str, shards: int) -> str:
    return f"{ACTOR_PREFIX}{shard_of(session_id, shards)}"


def is_actor_name(name: object) -> bool:
    """`actor/<n>`: what a peer may name as an actor to be answered at (a child's parent)."""
    return (isinstance(name, str) and name.startswith(ACTOR_PREFIX) and name[len(ACTOR_PREFIX):].isdigit()
            and len(name) <= 16)


STORE = "writer/store"
SCHEDULER = "scheduler"
LOG_WRITER_PREFIX = "writer/log/"


def log_writer(index: int) -> str:
    return f"{LOG_WRITER_PREFIX}{index}"


def writer_name(session_id: str, writers: int) -> str:
    """The writer/log owning a session's records: one writer keeps a session's order."""
    return log_writer(shard_of(session_id, writers))
