"""A Bloom filter: a fixed-size set that can answer "certainly not in it".

writer/store keeps one of the sessions that have checkpoints, so loading a session that never
had one (every new session: sessions come into being with their first turn) answers at once
instead of scanning the checkpoints table, whose size grows with all history in the retention
window. A false "maybe" only costs that scan; the filter never says "no" to a member.
"""
from __future__ import annotations

import hashlib
import struct

DEFAULT_BITS = 1 << 23      # 1 MiB: about 1% false positives at 870k members, more beyond
RECENT_KEYS = 4096          # keys added lately: a session checkpoints after every step, hash it once


class BloomFilter:
    def __init__(self, bits: int = DEFAULT_BITS, hashes: int = 7) -> None:
        if bits < 8 or not 1 <= hashes <= 8:
            raise ValueError("a Bloom filter needs at least 8 bits and 1 to 8 hashes")
        self.bits = bits
        self.hashes = hashes
        self.array = bytearray((bits + 7) // 8)
        self._words = struct.Struct(f"<{hashes}I")
        self._recent: set[str] = set()

    def state(self) -> dict:
        """What `restore` takes (plain data: it goes over the bus as msgpack)."""
        return {"bits": self.bits, "hashes": self.hashes, "array": bytes(self.array)}

    @classmethod
    def restore(cls, state: dict) -> "BloomFilter":
        """A filter from `state()`; ValueError if it is not one."""
        try:
            bits, hashes, array = state["bits"], state["hashes"], state["array"]
        except (KeyError, TypeError):
            raise ValueError("a Bloom filter's state has 'bits', 'hashes' and 'array'") from None
        if type(bits) is not int or type(hashes) is not int or not isinstance(array, bytes):
            raise ValueError("a Bloom filter's 'bits' and 'hashes' are integers, its 'array' bytes")
        restored = cls(bits, hashes)
        if len(array) != len(restored.array):
            raise ValueError(f"a Bloom filter of {bits} bits has {len(restored.array)} bytes, not {len(array)}")
        restored.array[:] = array
        return restored

    def _positions(self, key: str) -> list[int]:
        digest = hashlib.blake2b(key.encode(), digest_size=32).digest()
        bits = self.bits
        return [word % bits for word in self._words.unpack_from(digest)]

    def add(self, key: str) -> bool:
        """Add `key`; whether it was new (False: added before, or a false "maybe")."""
        if key in self._recent:
            return False
        if len(self._recent) >= RECENT_KEYS:
            self._recent.clear()
        self._recent.add(key)
        new = False
        for bit in self._positions(key):
            mask = 1 << (bit & 7)
            if not self.array[bit >> 3] & mask:
                new = True
                self.array[bit >> 3] |= mask
        return new

    def __contains__(self, key: str) -> bool:
        return all(self.array[bit >> 3] & (1 << (bit & 7)) for bit in self._positions(key))
