"""The pinned Restate server and the Python packages the Restate peer needs.

Owns: the pinned server version, the cache folder (bench/.cache/restate, git-ignored), the
`npm install` of `@restatedev/restate-server` into it, finding the native binary in what npm
installed, and naming the versions a run used. Never does: start anything but a one-off
`restate-server --version` after an install (bench/peer_restate.py runs the server).

The npm package is a node wrapper that spawns a native build from an optional per-platform
package (`@restatedev/restate-server-linux-x64`, …); we run that binary directly, so no node
process sits between us and the server, and install with --ignore-scripts (the wrapper's only
install script is a telemetry ping). The Python side (restate-sdk, hypercorn or granian) comes
from PyPI through the project's dev extra; `check_python_packages` names what is missing.
"""
from __future__ import annotations

import importlib.metadata
import json
import platform
import subprocess
import sys
from pathlib import Path

from bench import npm_install

RESTATE_VERSION = "1.7.12"  # the version of the earlier measurements on this machine
NPM_PACKAGE = "@restatedev/restate-server"
CACHE_DIR = Path(__file__).resolve().parent / ".cache" / "restate"
NPM_INSTALL_TIMEOUT_SECS = 600.0
VERSION_CHECK_TIMEOUT_SECS = 30.0


class PeerError(RuntimeError):
    """Restate or the service could not be installed, started, registered or stopped."""


def platform_package(system: str | None = None, machine: str | None = None) -> str:
    """The npm package holding the native server for this OS and CPU (node's naming)."""
    system = (system or platform.system()).lower()
    machine = (machine or platform.machine()).lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64"}.get(machine, machine)
    if system not in ("linux", "darwin") or arch not in ("x64", "arm64"):
        raise PeerError(f"Restate publishes no npm build for {system}/{machine}")
    return f"{NPM_PACKAGE}-{system}-{arch}"


def installed_binary(cache_dir: Path = CACHE_DIR, version: str = RESTATE_VERSION) -> Path | None:
    """The native restate-server of `version` under `cache_dir`, or None if not installed."""
    package = cache_dir / "node_modules" / platform_package()
    try:
        meta = json.loads((package / "package.json").read_text())
        with open(package / "bin" / "restate-server", "rb") as fh:
            native = fh.read(4) in (b"\x7fELF", b"\xcf\xfa\xed\xfe")
    except (OSError, ValueError):
        return None
    return package / "bin" / "restate-server" if native and meta.get("version") == version else None


def npm_command(npm: str, cache_dir: Path, version: str = RESTATE_VERSION) -> list[str]:
    # --ignore-scripts: the wrapper's only install script is a telemetry ping (@scarf/scarf).
    return npm_install.npm_command(npm, cache_dir, f"{NPM_PACKAGE}@{version}")


def ensure_restate(cache_dir: Path = CACHE_DIR, version: str = RESTATE_VERSION) -> Path:
    """Install `@restatedev/restate-server@version` into `cache_dir` unless there; the binary.

    Idempotent and fast when installed (two small file reads, no process). After an install
    the binary's `--version` must name the pinned version.
    """
    binary = installed_binary(cache_dir, version)
    if binary is not None:
        return binary
    npm_install.npm_install(cache_dir, f"{NPM_PACKAGE}@{version}", NPM_INSTALL_TIMEOUT_SECS,
                            PeerError)
    binary = installed_binary(cache_dir, version)
    if binary is None:
        raise PeerError(f"npm installed {NPM_PACKAGE}@{version} but no native binary "
                        f"{platform_package()} under {cache_dir}")
    reported = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                              timeout=VERSION_CHECK_TIMEOUT_SECS, check=False).stdout.split()
    if reported[-1:] != [version]:
        raise PeerError(f"{binary} --version says {' '.join(reported)!r}, expected {version}")
    return binary


def versions() -> dict[str, str | None]:
    """What a peer run used: the pinned server and the installed Python packages."""
    found: dict[str, str | None] = {"restate-server": RESTATE_VERSION}
    for dist in ("restate-sdk", "hypercorn", "granian"):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    return found


def check_python_packages(asgi_server: str) -> None:
    found = versions()
    missing = [name for name in ("restate-sdk", asgi_server) if found.get(name) is None]
    if missing:
        raise PeerError(f"missing Python packages: {sys.executable} -m pip install "
                        f"{' '.join(missing)}")
