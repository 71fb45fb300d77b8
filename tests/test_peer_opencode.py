"""The opencode peer without npm or a network: its config, its environment, finding the installed
binary, and the server lifecycle against a fake `opencode` (a small Python HTTP server that
speaks the few endpoints start() uses), including stopping a tree that ignores SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import npm_install, opencode_install
from bench import peer_opencode as peer
from bench.opencode_config import (
    MODEL_ID, PROVIDER_ID, PROVIDER_NPM, config_json, config_path, mock_v1_url, opencode_config,
    peer_env, private_dirs,
)
from bench.opencode_install import InstallError, ensure_opencode, installed_binary, platform_packages
from bench.peer_opencode import (
    OpencodeServer, PeerError, listening_url, process_tree, tree_cpu_secs, tree_memory_kib,
)

pytestmark = pytest.mark.timeout(20)

ELF = b"\x7fELF" + b"\0" * 60


# ------------------------------------------------------------------------------------ config
@pytest.mark.parametrize("given", ["http://127.0.0.1:4010", "http://127.0.0.1:4010/",
                                   "http://127.0.0.1:4010/v1", "http://127.0.0.1:4010/v1/"])
def test_mock_url_always_ends_in_v1(given):
    assert mock_v1_url(given) == "http://127.0.0.1:4010/v1"


@pytest.mark.parametrize("bad", ["127.0.0.1:4010", "ftp://h:1", "http://h:1/v1?x=1", ""])
def test_mock_url_rejects_what_is_not_an_http_base(bad):
    with pytest.raises(ValueError):
        mock_v1_url(bad)


def test_config_is_json_with_our_provider_at_the_mock():
    config = json.loads(config_json("http://127.0.0.1:4010"))
    provider = config["provider"][PROVIDER_ID]
    assert provider["npm"] == PROVIDER_NPM == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:4010/v1"
    assert MODEL_ID in provider["models"]
    assert config["model"] == config["small_model"] == f"{PROVIDER_ID}/{MODEL_ID}"
    assert config["enabled_providers"] == [PROVIDER_ID]


def test_config_turns_optional_work_off():
    config = opencode_config("http://127.0.0.1:4010")
    assert config["autoupdate"] is False and config["share"] == "disabled"
    assert config["snapshot"] is False and config["lsp"] is False and config["formatter"] is False
    assert config["plugin"] == [] and config["mcp"] == {} and config["instructions"] == []
    assert config["permission"] == "allow"
    assert config["compaction"] == {"auto": False, "prune": False}
    assert config["agent"]["title"]["disable"] is True
    assert config["tools"]["*"] is False and not any(config["tools"].values())
    assert config["provider"][PROVIDER_ID]["models"][MODEL_ID]["tool_call"] is False


def test_config_with_tools_leaves_opencodes_tool_set_on():
    config = opencode_config("http://127.0.0.1:4010", tools=True)
    assert "tools" not in config
    assert config["provider"][PROVIDER_ID]["models"][MODEL_ID]["tool_call"] is True


def test_config_takes_other_ids():
    config = opencode_config("http://h:1", provider_id="p", model_id="m")
    assert config["model"] == "p/m" and config["enabled_providers"] == ["p"]
    assert list(config["provider"]["p"]["models"]) == ["m"]


def test_env_confines_opencode_to_the_run_folder(tmp_path):
    parent = {"PATH": "/usr/bin", "HOME": "/root", "OPENAI_API_KEY": "sk-secret",
              "OPENCODE_CONFIG": "/elsewhere.json", "XDG_CONFIG_HOME": "/root/.config",
              "HTTPS_PROXY": "http://proxy:3128", "LANG": "C.UTF-8"}
    env = peer_env(tmp_path, parent)
    for key in ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME",
                "TMPDIR", "npm_config_cache"):
        assert Path(env[key]).is_relative_to(tmp_path), key
    assert env["PATH"] == "/usr/bin" and env["LANG"] == "C.UTF-8"
    for key in ("OPENAI_API_KEY", "OPENCODE_CONFIG", "HTTPS_PROXY"):
        assert key not in env
    assert env["OPENCODE_DISABLE_MODELS_FETCH"] == env["OPENCODE_DISABLE_AUTOUPDATE"] == "1"
    assert env["OPENCODE_PURE"] == "1" and env["npm_config_offline"] == "true"
    assert config_path(tmp_path).is_relative_to(Path(env["XDG_CONFIG_HOME"]))
    assert all(p.is_relative_to(tmp_path) for p in private_dirs(tmp_path).values())


# ----------------------------------------------------------------------------------- install
def _fake_install(cache: Path, version: str, wrapper: bytes, platform_pkg: str | None) -> None:
    pkg = cache / "node_modules" / "opencode-ai"
    (pkg / "bin").mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps({"name": "opencode-ai", "version": version}))
    (pkg / "bin" / "opencode.exe").write_bytes(wrapper)
    if platform_pkg:
        (cache / "node_modules" / platform_pkg / "bin").mkdir(parents=True)
        (cache / "node_modules" / platform_pkg / "bin" / "opencode").write_bytes(ELF)


def test_no_binary_when_nothing_or_another_version_is_installed(tmp_path):
    assert installed_binary(tmp_path / "empty", "1.18.32") is None
    _fake_install(tmp_path, "1.0.0", ELF, None)
    assert installed_binary(tmp_path, "1.18.32") is None


def test_the_platform_binary_is_used_when_the_postinstall_did_not_run(tmp_path):
    name = platform_packages()[0]
    _fake_install(tmp_path, "1.18.32", b'#!/bin/sh\necho "postinstall was not run"\n', name)
    assert installed_binary(tmp_path, "1.18.32") == tmp_path / "node_modules" / name / "bin" / "opencode"


def test_a_linked_wrapper_binary_is_accepted(tmp_path):
    _fake_install(tmp_path, "1.18.32", ELF, None)
    found = installed_binary(tmp_path, "1.18.32")
    assert found == tmp_path / "node_modules" / "opencode-ai" / "bin" / "opencode.exe"


@pytest.mark.parametrize("args, expected", [
    (("linux", "x86_64", True, False), ["opencode-linux-x64", "opencode-linux-x64-baseline"]),
    (("linux", "x86_64", False, False), ["opencode-linux-x64-baseline", "opencode-linux-x64"]),
    (("linux", "x86_64", True, True), ["opencode-linux-x64-musl", "opencode-linux-x64-baseline-musl"]),
    (("linux", "aarch64", None, False), ["opencode-linux-arm64"]),
    (("Darwin", "arm64", None, False), ["opencode-darwin-arm64"]),
])
def test_platform_packages_follow_the_postinstall_order(args, expected):
    assert platform_packages(*args) == expected


def test_ensure_is_a_fast_no_op_when_installed(tmp_path, monkeypatch):
    _fake_install(tmp_path, "1.18.32", ELF, None)

    def no_process(*a, **k):
        raise AssertionError("ensure_opencode ran a process although opencode is installed")

    monkeypatch.setattr(opencode_install.subprocess, "run", no_process)
    assert ensure_opencode(tmp_path, "1.18.32").name == "opencode.exe"


def test_ensure_without_npm_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(npm_install.shutil, "which", lambda name: None)
    with pytest.raises(InstallError, match="npm is not on PATH"):
        ensure_opencode(tmp_path / "cache", "1.18.32")


# ------------------------------------------------------------------------------------ server
def test_listening_url_waits_for_the_whole_line():
    assert listening_url(b"Warning: unsecured\n") is None
    assert listening_url(b"opencode server listening on http://127.0.0.1:40") is None
    assert listening_url(b"x\nopencode server listening on http://127.0.0.1:4096\n") == \
        "http://127.0.0.1:4096"


FAKE_OPENCODE = r'''
import json, os, signal, subprocess, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
MODE = os.environ.get("XDG_CONFIG_HOME", "") and open(os.path.join(
    os.environ["XDG_CONFIG_HOME"], "opencode", "mode")).read().strip()
if MODE == "crash":
    print("boom: cannot start", flush=True)
    sys.exit(3)
config = json.load(open(os.path.join(os.environ["XDG_CONFIG_HOME"], "opencode", "opencode.json")))
providers = [] if MODE == "noprovider" else [
    {"id": pid, "models": p["models"]} for pid, p in config["provider"].items()]
if MODE == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        answers = {"/global/health": True, "/session/status": {"ses_1": {"type": "idle"}}}
        self._send(answers.get(self.path, {"providers": providers}))
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/session":
            self._send({"id": "ses_1"})
        else:
            self._send({"info": {"role": "assistant", "finish": "stop"}, "parts": []})

server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Handler)
print(f"opencode server listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()
'''


@pytest.fixture
def fake_binary(tmp_path, monkeypatch):
    """A fake opencode; its behaviour comes from a `mode` file start() copies into the config."""
    binary = tmp_path / "opencode"
    binary.write_text(f"#!{sys.executable}\n{FAKE_OPENCODE}")
    binary.chmod(0o755)

    def set_mode(mode: str) -> Path:
        original = peer.config_path

        def path_and_mode(root: Path) -> Path:
            path = original(root)
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / "mode").write_text(mode)
            return path

        monkeypatch.setattr(peer, "config_path", path_and_mode)
        return binary

    return set_mode


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_start_warm_up_and_stop_leave_nothing_behind(fake_binary):
    server = OpencodeServer(fake_binary("ok"), start_timeout_secs=10)
    with server:
        url = server.start("http://127.0.0.1:1")
        assert url.startswith("http://127.0.0.1:")
        tree = server.pids()
        assert len(tree) == 2  # the fake and its sleeping child
        root = server.root
        assert root is not None and (root / "home" / ".config" / "opencode" / "opencode.json").exists()
        assert server.turn()["info"]["finish"] == "stop"
        assert server.wait_idle(timeout_secs=5, quiet_secs=0.1) == 0
    assert not any(_alive(pid) for pid in tree)
    assert server.pids() == [] and server.url is None
    assert not root.exists()
    server.stop()  # idempotent


def test_a_tree_that_ignores_sigterm_is_killed(fake_binary):
    server = OpencodeServer(fake_binary("stubborn"), warm_up=False, stop_grace_secs=0.3,
                            start_timeout_secs=10)
    server.start("http://127.0.0.1:1")
    tree = server.pids()
    server.stop()
    assert tree and not any(_alive(pid) for pid in tree)


def test_a_server_that_dies_at_start_shows_its_log(fake_binary):
    server = OpencodeServer(fake_binary("crash"), start_timeout_secs=10)
    with pytest.raises(PeerError, match=r"(?s)exited with 3.*boom: cannot start"):
        server.start("http://127.0.0.1:1")
    assert server.root is None and server.pids() == []


def test_a_server_without_our_provider_is_refused(fake_binary):
    server = OpencodeServer(fake_binary("noprovider"), start_timeout_secs=10)
    with pytest.raises(PeerError, match="did not load provider"):
        server.start("http://127.0.0.1:1")
    assert server.pids() == []


def test_process_tree_lists_children_first_level_down():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = process_tree(os.getpid())
        assert tree[0] == os.getpid() and child.pid in tree
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert process_tree(child.pid) == []


def test_cpu_and_memory_of_a_tree_are_read_from_proc():
    me = [os.getpid()]
    assert tree_cpu_secs(me) > 0
    memory = tree_memory_kib(me)
    assert memory["rss_kib"] > 0 and 0 < memory["private_dirty_kib"] <= memory["rss_kib"]
    assert tree_cpu_secs([]) == 0 and tree_memory_kib([])["rss_kib"] == 0
