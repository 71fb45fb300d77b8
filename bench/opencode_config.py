"""What opencode is told when it runs as a benchmark peer: its config file and its environment.

Owns: the opencode config that points a custom provider (`@ai-sdk/openai-compatible`, bundled in
the opencode binary) at our mock model, with every optional feature that would add work or network
calls to a turn switched off; and the environment that confines opencode's config, data, state,
cache and temp files to one private folder per run and keeps it off the network. Pure functions:
no process, no file is touched here (bench/peer_opencode.py writes and runs them).

Why each setting (opencode 1.18.32, checked against its /doc OpenAPI `Config` schema):
- `enabled_providers` = [ours]: no other provider is loaded, even if the parent shell has API keys.
- `model` and `small_model` are ours: any helper call (titles, summaries) would hit the mock too.
- `tools` all false (by default): the mock never calls tools, and opencode otherwise serialises
  its tool set into every request (32 KB instead of 9 KB, measured); `permission` "allow" so
  nothing can ever wait on a permission prompt.
- `autoupdate` false, `share` "disabled", `snapshot` false (no git snapshot per step), `lsp` and
  `formatter` false, no `plugin`, no `mcp`, no `instructions`, `compaction` auto/prune off.
- The `title` agent is disabled: an untitled session otherwise costs a second model call on its
  first turn (measured); loadgen also names every session, which skips it as well.
Environment: OPENCODE_DISABLE_MODELS_FETCH (no models.dev download at start and every hour),
OPENCODE_DISABLE_AUTOUPDATE, OPENCODE_PURE (no external plugins), OPENCODE_DISABLE_DEFAULT_PLUGINS,
OPENCODE_DISABLE_LSP_DOWNLOAD, OPENCODE_DISABLE_CLAUDE_CODE, OPENCODE_DISABLE_EXTERNAL_SKILLS,
OPENCODE_DISABLE_PROJECT_CONFIG (no opencode.json or AGENTS.md from folders above the project),
OPENCODE_EXPERIMENTAL_DISABLE_FILEWATCHER, OPENCODE_DISABLE_EMBEDDED_WEB_UI. opencode also runs an
`npm install @opencode-ai/plugin` into its config folder in the background at start-up (only
needed for custom plugins, which we have none of): `npm_config_offline` makes that fail at once
from an empty private npm cache instead of reaching a registry.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

PROVIDER_ID = "mock"
MODEL_ID = "mock"
PROVIDER_NPM = "@ai-sdk/openai-compatible"
CONFIG_SCHEMA_URL = "https://opencode.ai/config.json"
# The mock ignores the key, but opencode's native request path wants one configured.
MOCK_API_KEY = "mock"
# Limits the mock "model" claims; compaction is off, these only have to be plausible.
CONTEXT_TOKENS = 128_000
OUTPUT_TOKENS = 4_096
# Tools opencode 1.18.32 offers the model; "*" covers any it adds later.
TOOL_NAMES = ("*", "bash", "edit", "write", "read", "grep", "glob", "list", "patch", "todowrite",
              "todoread", "webfetch", "websearch", "codesearch", "task", "skill", "question",
              "lsp", "batch")

# Variables passed through from the parent environment; everything else is dropped so that API
# keys, proxies and OPENCODE_* settings of the caller's shell never reach the peer.
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
FLAGS_ON = ("OPENCODE_DISABLE_MODELS_FETCH", "OPENCODE_DISABLE_AUTOUPDATE", "OPENCODE_PURE",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS", "OPENCODE_DISABLE_LSP_DOWNLOAD",
            "OPENCODE_DISABLE_CLAUDE_CODE", "OPENCODE_DISABLE_EXTERNAL_SKILLS",
            "OPENCODE_DISABLE_PROJECT_CONFIG", "OPENCODE_EXPERIMENTAL_DISABLE_FILEWATCHER",
            "OPENCODE_DISABLE_EMBEDDED_WEB_UI")


def mock_v1_url(mock_base_url: str) -> str:
    """The OpenAI base URL of the mock: `http://h:p`, `http://h:p/` and `http://h:p/v1` → `…/v1`."""
    parts = urlsplit(mock_base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"mock base URL must be http(s)://host:port[/v1], got {mock_base_url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"mock base URL must not have a query or fragment: {mock_base_url!r}")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


def opencode_config(mock_base_url: str, *, provider_id: str = PROVIDER_ID,
                    model_id: str = MODEL_ID, tools: bool = False) -> dict[str, Any]:
    """The opencode.json for a peer run: one custom provider at the mock, nothing optional on.

    `tools=True` leaves opencode's tool set in every request (as a user's install would send it);
    the default sends none, which is the least work opencode can do per turn.
    """
    model_ref = f"{provider_id}/{model_id}"
    config: dict[str, Any] = {
        "$schema": CONFIG_SCHEMA_URL,
        "model": model_ref,
        "small_model": model_ref,
        "enabled_providers": [provider_id],
        "provider": {
            provider_id: {
                "npm": PROVIDER_NPM,
                "name": "Agent OS mock model",
                "options": {"baseURL": mock_v1_url(mock_base_url), "apiKey": MOCK_API_KEY},
                "models": {
                    model_id: {
                        "name": model_id,
                        "tool_call": tools,
                        "reasoning": False,
                        "attachment": False,
                        "temperature": True,
                        "limit": {"context": CONTEXT_TOKENS, "output": OUTPUT_TOKENS},
                        "cost": {"input": 0, "output": 0},
                    },
                },
            },
        },
        "autoupdate": False,
        "share": "disabled",
        "snapshot": False,
        "lsp": False,
        "formatter": False,
        "plugin": [],
        "mcp": {},
        "instructions": [],
        "permission": "allow",
        "compaction": {"auto": False, "prune": False},
        "agent": {"title": {"disable": True}},
    }
    if not tools:
        config["tools"] = {name: False for name in TOOL_NAMES}
    return config


def config_json(mock_base_url: str, **options: Any) -> str:
    """`opencode_config` as the text of an opencode.json file."""
    return json.dumps(opencode_config(mock_base_url, **options), indent=2) + "\n"


def private_dirs(root: Path) -> dict[str, Path]:
    """Where one run keeps everything opencode writes; all of it lives under `root`."""
    home = root / "home"
    return {
        "home": home,
        "config": home / ".config",
        "data": home / ".local" / "share",
        "state": home / ".local" / "state",
        "cache": home / ".cache",
        "tmp": root / "tmp",
        "npm_cache": root / "npm-cache",
        "project": root / "project",
    }


def config_path(root: Path) -> Path:
    """opencode's global config file inside the private XDG_CONFIG_HOME."""
    return private_dirs(root)["config"] / "opencode" / "opencode.json"


def peer_env(root: Path, parent: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of an opencode peer confined to `root` (see the module docstring)."""
    dirs = private_dirs(root)
    env = {name: parent[name] for name in PASSED_ENV if name in parent}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update({
        "HOME": str(dirs["home"]),
        "XDG_CONFIG_HOME": str(dirs["config"]),
        "XDG_DATA_HOME": str(dirs["data"]),
        "XDG_STATE_HOME": str(dirs["state"]),
        "XDG_CACHE_HOME": str(dirs["cache"]),
        "TMPDIR": str(dirs["tmp"]),
        "npm_config_offline": "true",
        "npm_config_cache": str(dirs["npm_cache"]),
        "npm_config_update_notifier": "false",
    })
    env.update({flag: "1" for flag in FLAGS_ON})
    return env
