"""The pinned opencode install the benchmark peer runs: `npm install opencode-ai@VERSION` once.

Owns: the pinned version, the cache folder (bench/.cache/opencode, git-ignored), the npm call and
finding the runnable native binary in what npm installed. Never does: run a server (that is
bench/peer_opencode.py) or touch the user's opencode folders (the one `--version` check runs
confined like a peer run).

The npm package `opencode-ai` is a thin wrapper: its postinstall script links the right native
build (from an optional per-platform package such as `opencode-linux-x64`) to
`opencode-ai/bin/opencode.exe` and runs it once unconfined. We install with --ignore-scripts and
use the platform package's binary directly, picked the way the postinstall picks it (an install
whose postinstall did run is accepted too).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

from bench.npm_install import npm_install
from bench.opencode_config import peer_env, private_dirs

OPENCODE_VERSION = "1.18.32"  # the version of the reference measurements (section 34.6)
NPM_PACKAGE = "opencode-ai"
CACHE_DIR = Path(__file__).resolve().parent / ".cache" / "opencode"
NPM_INSTALL_TIMEOUT_SECS = 900.0  # the native build is a ~180 MB download
VERSION_CHECK_TIMEOUT_SECS = 30.0
_NATIVE_MAGIC = (b"\x7fELF", b"\xcf\xfa\xed\xfe")  # ELF, 64-bit Mach-O


class InstallError(RuntimeError):
    """opencode could not be installed or its binary does not run."""


def is_native(path: Path) -> bool:
    """True for an ELF or Mach-O file (not the wrapper's placeholder script)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) in _NATIVE_MAGIC
    except OSError:
        return False


def platform_packages(system: str | None = None, machine: str | None = None,
                      avx2: bool | None = None, musl: bool | None = None) -> list[str]:
    """opencode's per-platform npm packages that can run here, best first."""
    system = (system or platform.system()).lower()
    machine = (machine or platform.machine()).lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64"}.get(machine, machine)
    if musl is None:
        musl = system == "linux" and not platform.libc_ver()[0]
    suffix = "-musl" if musl else ""
    base = f"opencode-{system}-{arch}"
    if arch != "x64":
        return [base + suffix]
    if avx2 is None:
        avx2 = system != "linux" or " avx2" in _cpuinfo()
    fast, baseline = base + suffix, f"{base}-baseline{suffix}"
    return [fast, baseline] if avx2 else [baseline, fast]


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def installed_binary(cache_dir: Path = CACHE_DIR, version: str = OPENCODE_VERSION) -> Path | None:
    """The runnable opencode binary of `version` under `cache_dir`, or None if not installed."""
    modules = cache_dir / "node_modules"
    try:
        meta = json.loads((modules / NPM_PACKAGE / "package.json").read_text())
    except (OSError, ValueError):
        return None
    if meta.get("version") != version:
        return None
    candidates = [modules / NPM_PACKAGE / "bin" / "opencode.exe"]
    candidates += [modules / name / "bin" / "opencode" for name in platform_packages()]
    return next((path for path in candidates if is_native(path)), None)


def ensure_opencode(cache_dir: Path = CACHE_DIR, version: str = OPENCODE_VERSION) -> Path:
    """Install `opencode-ai@version` into `cache_dir` unless it is there; return the binary.

    Idempotent and fast when installed (two small file reads, no process). The install runs npm
    with the caller's environment, so the caller's registry settings apply; afterwards the binary
    runs `--version` once, confined to a temp folder, to prove it works and is the pinned one.
    """
    binary = installed_binary(cache_dir, version)
    if binary is not None:
        return binary
    npm_install(cache_dir, f"{NPM_PACKAGE}@{version}", NPM_INSTALL_TIMEOUT_SECS, InstallError)
    binary = installed_binary(cache_dir, version)
    if binary is None:
        raise InstallError(f"npm installed {NPM_PACKAGE}@{version} but left no runnable binary for "
                           f"{platform.system()}/{platform.machine()} under {cache_dir}")
    reported = binary_version(binary)
    if reported != version:
        raise InstallError(f"{binary} --version says {reported!r}, expected {version!r}")
    return binary


def binary_version(binary: Path) -> str:
    """`opencode --version`, run confined: even that creates folders under HOME and /tmp."""
    with tempfile.TemporaryDirectory(prefix="opencode-version-") as tmp:
        root = Path(tmp)
        for path in private_dirs(root).values():
            path.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                                  env=peer_env(root, os.environ), cwd=root, check=False,
                                  timeout=VERSION_CHECK_TIMEOUT_SECS)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InstallError(f"{binary} --version failed: {exc!r}") from exc
    return done.stdout.strip()
