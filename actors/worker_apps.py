"""The `App` a worker runs (`agent-os worker MODULE[:NAME] ...`): each module's, merged into one."""
from __future__ import annotations

import importlib
import os

from actors.sdk import App


def load_app(spec: str) -> App:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise            # the module is there; something it imports is not: its traceback says what
        raise SystemExit(f"agent-os worker: no module named {module_name!r} here ({os.getcwd()}) "
                         "or on PYTHONPATH") from None
    app = getattr(module, attr or "app", None)
    if not isinstance(app, App):
        raise SystemExit(f"agent-os worker: {module_name} has no App named {attr or 'app'!r}")
    return app


def merge(apps: list[App]) -> App:
    merged = App()
    for app in apps:
        merged.flows.update(app.flows)
        merged.tools.update(app.tools)
        merged.updates.update(app.updates)
    return merged
