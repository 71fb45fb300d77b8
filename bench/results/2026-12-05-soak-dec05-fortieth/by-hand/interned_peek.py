"""How full each process's table of interned strings is, read from outside through /proc/PID/mem.

CPython 3.11 keeps interned strings in a dict that only ever grows: a string interned and freed
leaves a used entry (`nentries` counts them, `usable` is what is left) until the table is
rebuilt at twice the live count or more. Run as root, with the processes' own libpython (its
`interned` symbol from `nm`):  python interned_peek.py PID...
"""
import re
import struct
import subprocess
import sys


def libpython(pid: int) -> tuple[str, int]:
    for line in open(f"/proc/{pid}/maps"):
        parts = line.split()
        if len(parts) >= 6 and re.search(r"libpython3\.\d+\.so", parts[5]) and int(parts[2], 16) == 0:
            return parts[5], int(parts[0].split("-")[0], 16)
    raise SystemExit(f"{pid}: no libpython mapped")


def symbol(lib: str, name: str) -> int:
    for line in subprocess.run(["nm", lib], capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[2] == name:
            return int(fields[0], 16)
    raise SystemExit(f"{lib}: no symbol {name}")


def peek(pid: int) -> dict:
    lib, base = libpython(pid)
    with open(f"/proc/{pid}/mem", "rb") as mem:
        def read(addr: int, n: int) -> bytes:
            mem.seek(addr)
            return mem.read(n)
        (table,) = struct.unpack("<Q", read(base + symbol(lib, "interned"), 8))
        _, _, used, _, keys, _ = struct.unpack("<qQqQQQ", read(table, 48))   # PyDictObject
        _, log2_size = struct.unpack("<qB", read(keys, 9))                    # PyDictKeysObject
        usable, nentries = struct.unpack("<qq", read(keys + 16, 16))
    return {"used": used, "slots": 1 << log2_size, "usable": usable, "nentries": nentries}


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(arg, open(f"/proc/{arg}/comm").read().strip(), peek(int(arg)))
