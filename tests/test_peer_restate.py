"""The Restate peer without npm, Restate or a network: arguments, commands, the config file,
finding the installed binary, the window maths and the result row (against a fake ingress)."""
from __future__ import annotations

import asyncio
import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

from actors.http1 import parse_endpoint
from bench import peer_restate as peer
from bench import restate_cli as cli
from bench import npm_install
from bench import restate_install as install
from bench import restate_load as load
from bench.restate_load import SCENARIOS, Sample, check_args, prebuilt, window_stats

pytestmark = pytest.mark.timeout(20)

ELF = b"\x7fELF" + b"\0" * 60


# ------------------------------------------------------------------------------------ install
def _fake_install(cache: Path, version: str, head: bytes = ELF) -> Path:
    package = cache / "node_modules" / install.platform_package()
    (package / "bin").mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"version": version}))
    (package / "bin" / "restate-server").write_bytes(head)
    return package / "bin" / "restate-server"


def test_installed_binary_is_found_only_for_the_pinned_native_build(tmp_path):
    assert install.installed_binary(tmp_path / "none") is None
    binary = _fake_install(tmp_path / "ok", install.RESTATE_VERSION)
    assert install.installed_binary(tmp_path / "ok") == binary
    _fake_install(tmp_path / "old", "1.6.2")
    assert install.installed_binary(tmp_path / "old") is None
    _fake_install(tmp_path / "script", install.RESTATE_VERSION, b"#!/usr/bin/env node\n")
    assert install.installed_binary(tmp_path / "script") is None


def test_ensure_restate_is_a_no_op_when_installed(tmp_path, monkeypatch):
    binary = _fake_install(tmp_path, install.RESTATE_VERSION)
    monkeypatch.setattr(npm_install.shutil, "which", lambda name: pytest.fail("npm was looked up"))
    assert install.ensure_restate(tmp_path) == binary


def test_ensure_restate_without_npm_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(npm_install.shutil, "which", lambda name: None)
    with pytest.raises(install.PeerError, match="npm is not on PATH"):
        install.ensure_restate(tmp_path)


def test_npm_command_pins_and_skips_install_scripts(tmp_path):
    cmd = install.npm_command("/usr/bin/npm", tmp_path, "1.7.12")
    assert cmd[:2] == ["/usr/bin/npm", "install"]
    assert cmd[cmd.index("--prefix") + 1] == str(tmp_path)
    assert "--ignore-scripts" in cmd and cmd[-1] == "@restatedev/restate-server@1.7.12"


@pytest.mark.parametrize("system, machine, expected", [
    ("Linux", "x86_64", "@restatedev/restate-server-linux-x64"),
    ("Linux", "aarch64", "@restatedev/restate-server-linux-arm64"),
    ("Darwin", "arm64", "@restatedev/restate-server-darwin-arm64"),
])
def test_platform_package(system, machine, expected):
    assert install.platform_package(system, machine) == expected


def test_platform_package_refuses_what_is_not_published():
    with pytest.raises(install.PeerError):
        install.platform_package("Windows", "x86_64")


# ---------------------------------------------------------------------------- config, commands
def test_toml_text_round_trips_through_a_toml_parser():
    settings = {"disable-telemetry": True, "default-num-partitions": 4, "cluster-name": 'a "b"',
                "worker": {"internal-queue-length": 500, "cleanup-interval": "1h"}}
    assert tomllib.loads(peer.toml_text(settings)) == settings


def test_tuned_settings_render_as_toml():
    settings = {**peer.DEFAULT_SETTINGS, **peer.TUNED_SETTINGS}
    assert tomllib.loads(peer.toml_text(settings)) == settings


def test_toml_text_rejects_unsupported_values():
    with pytest.raises(ValueError):
        peer.toml_text({"roles": ["admin"]})


def test_server_command_binds_loopback_on_kernel_chosen_ports(tmp_path):
    cmd = peer.server_command(Path("/x/restate-server"), tmp_path / "c.toml", tmp_path / "data")
    assert cmd[0] == "/x/restate-server"
    flags = {cmd[i]: cmd[i + 1] for i in range(1, len(cmd) - 1) if cmd[i].startswith("--")
             and not cmd[i + 1].startswith("--")}
    assert flags["--use-random-ports"] == "true" and flags["--bind-ip"] == "127.0.0.1"
    assert flags["--base-dir"] == str(tmp_path / "data")
    assert flags["--config-file"] == str(tmp_path / "c.toml")
    assert flags["--node-name"] == peer.NODE_NAME


def test_service_command_runs_the_services_module_with_the_inherited_socket():
    cmd = peer.service_command("hypercorn", fd=7)
    assert cmd[:5] == [sys.executable, "-m", "bench.restate_services", "--fd", "7"]
    assert cmd[cmd.index("--title") + 1] == peer.SERVICE_TITLE


def test_granian_command_binds_the_given_loopback_port_over_http2():
    cmd = peer.service_command("granian", port=4321)
    assert cmd[1:3] == ["-m", "granian"] and cmd[-1] == "bench.restate_services:make_app"
    assert cmd[cmd.index("--port") + 1] == "4321" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--http") + 1] == "2" and cmd[cmd.index("--interface") + 1] == "asgi"


@pytest.mark.parametrize("server, kwargs", [("hypercorn", {"port": 1}), ("granian", {"fd": 3}),
                                            ("uvicorn", {"fd": 3, "port": 1})])
def test_service_command_refuses_what_cannot_run(server, kwargs):
    with pytest.raises(ValueError):
        peer.service_command(server, **kwargs)


def test_restate_server_refuses_an_unknown_asgi_server():
    with pytest.raises(ValueError, match="asgi_server"):
        peer.RestateServer(asgi_server="uvicorn")


def test_child_env_drops_restate_settings(monkeypatch):
    monkeypatch.setenv("RESTATE_CONFIG", "/elsewhere.toml")
    monkeypatch.setenv("KEEP_ME", "1")
    env = peer.child_env()
    assert "RESTATE_CONFIG" not in env and env["KEEP_ME"] == "1"


def test_admin_socket_lives_in_the_private_base_dir(tmp_path):
    server = peer.RestateServer(tmp_root=tmp_path)
    with pytest.raises(peer.PeerError):
        _ = server.admin_socket
    server.root = tmp_path / "restate-x"
    assert server.admin_socket == tmp_path / "restate-x" / "data" / peer.NODE_NAME / "admin.sock"
    assert server.pids() == [] and server.settings["disable-telemetry"] is True


def test_group_members_sees_our_own_group():
    assert os.getpid() in peer.group_members(os.getpgid(0))


# ----------------------------------------------------------------------------------- the CLI
def test_parse_args_defaults_and_lists():
    args = cli.parse_args(["--scenarios", "sync_steps, flows", "--clients", "16,64",
                            "--set", "default-num-partitions=4", "--set", "log-filter=warn",
                            "--set", "disable-prometheus=true"])
    assert args.scenarios == ["sync_steps", "flows"] and args.clients == [16, 64]
    assert args.settings == {"default-num-partitions": 4, "log-filter": "warn",
                             "disable-prometheus": True}
    assert cli.parse_args([]).scenarios == list(SCENARIOS)
    assert cli.parse_args([]).asgi_server == "hypercorn"
    tuned = cli.parse_args(["--tuned", "--set", "default-num-partitions=2"]).settings
    assert tuned == {**peer.TUNED_SETTINGS, "default-num-partitions": 2}
    assert cli.parse_args(["--asgi-server", "granian"]).asgi_server == "granian"


@pytest.mark.parametrize("argv", [["--scenarios", "nope"], ["--clients", "0"],
                                  ["--clients", "x"], ["--duration", "0"], ["--set", "novalue"]])
def test_parse_args_rejects(argv, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(argv)


def test_format_table_has_a_row_per_result():
    row = {"scenario": "attr_read", "clients": 64, "ops_per_sec": 1234.5, "unit": "ops/s",
           "p50_ms": 1.25, "p99_ms": None, "errors": 0, "server_cpu_secs": 1.0,
           "service_cpu_secs": 2.0}
    lines = cli.format_table([row, row]).splitlines()
    assert len(lines) == 3 and "1,234" in lines[1] and lines[1].split()[5] == "-"


# ------------------------------------------------------------------------------- the window
def test_window_stats_counts_only_what_ended_inside():
    samples = [Sample(0.5, 9.0, None), Sample(1.0, 0.010, None), Sample(1.5, 0.020, None),
               Sample(2.9, 0.030, None), Sample(3.0, 9.0, None)]
    out = window_stats(samples, [0.1, 1.2, 3.5], 1.0, 3.0, per_op=10)
    assert out["completed"] == 3 and out["ops_per_sec"] == pytest.approx(15.0)
    assert out["p50_ms"] == 20.0 and out["p99_ms"] == 30.0  # nearest rank: measured values
    assert out["errors"] == 1 and out["window_secs"] == 2.0
    assert "client_p50_ms" not in out


def test_window_stats_with_nothing_done_and_with_client_latencies():
    empty = window_stats([], [], 0.0, 1.0, per_op=1)
    assert empty["ops_per_sec"] == 0 and empty["p50_ms"] is None and empty["p99_ms"] is None
    out = window_stats([Sample(0.5, 0.002, 0.004)], [], 0.0, 1.0, per_op=1)
    assert out["client_p50_ms"] == 4.0 and out["p50_ms"] == 2.0
    with pytest.raises(ValueError):
        window_stats([], [], 1.0, 1.0, per_op=1)


@pytest.mark.parametrize("args", [("nope", 1, 0, 1), ("flows", 0, 0, 1), ("flows", 1, -1, 1),
                                  ("flows", 1, 0, 0)])
def test_check_args_rejects(args):
    with pytest.raises(ValueError):
        check_args(*args)


def test_scenario_table_units():
    assert set(SCENARIOS) == {"sync_steps", "async_steps", "flows", "attr_read", "attr_update",
                              "attr_read_10x16k", "channel_wake"}
    for name, spec in SCENARIOS.items():
        assert spec.unit == ("steps/s" if name.endswith("_steps") else "ops/s")
        assert spec.per_op == (load.STEPS_PER_CALL if name.endswith("_steps") else 1)


def test_prebuilt_requests_per_key():
    ep = parse_endpoint("http://127.0.0.1:9/")
    assert prebuilt(ep, None, 4) == []
    assert len(prebuilt(ep, "/Steps/sync10", 4)) == 1
    keyed = prebuilt(ep, "/Attr/k{key}/get", 3)
    assert [r.split(b" ")[1] for r in keyed] == [b"/Attr/k0/get", b"/Attr/k1/get", b"/Attr/k2/get"]


# ------------------------------------------------------------- a whole run on a fake ingress
class _FakeIngress:
    """Answers every request 200 with a small JSON body; counts requests by path."""

    def __init__(self) -> None:
        self.paths: dict[str, int] = {}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode().split("\r\n")
                path = lines[0].split(" ")[1]
                self.paths[path] = self.paths.get(path, 0) + 1
                length = next((int(v) for k, _, v in (h.partition(": ") for h in lines[1:])
                               if k.lower() == "content-length"), 0)
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n7")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


class _FakeServer:
    def __init__(self, url: str) -> None:
        self.ingress_url = url

    def server_pids(self) -> list[int]:
        return [os.getpid()]

    def service_pids(self) -> list[int]:
        return []


def test_run_scenario_shapes_its_row_against_a_fake_ingress():
    fake = _FakeIngress()

    async def main() -> dict:
        srv = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            return await load.run_scenario_async(_FakeServer(f"http://127.0.0.1:{port}"),
                                                 "attr_update", 3, 0.05, 1.0, keys=4)
        finally:
            srv.close()

    row = asyncio.run(main())
    for key in ("scenario", "clients", "ops_per_sec", "unit", "p50_ms", "p99_ms", "errors",
                "server_cpu_secs", "service_cpu_secs", "window_secs"):
        assert key in row
    assert row["scenario"] == "attr_update" and row["clients"] == 3 and row["unit"] == "ops/s"
    assert row["errors"] == 0 and row["ops_per_sec"] > 0 and row["p50_ms"] is not None
    # /proc/stat counts in clock ticks, the driver's own CPU finer: allow one tick per core
    tick = os.cpu_count() / os.sysconf("SC_CLK_TCK")
    assert row["machine_busy_secs"] + tick >= row["client_cpu_secs"] >= 0
    # a 1 s window: a stall of a loaded machine could cover a 0.3 s one whole (no operation in it),
    # and stretches it
    assert row["service_cpu_secs"] == 0 and 0.95 <= row["window_secs"] <= 5.0
    assert all(fake.paths.get(f"/Attr/k{k}/incr", 0) >= 2 for k in range(4))  # prepared + run
