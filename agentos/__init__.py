import sys


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs one of our own modules in a new interpreter. `-P` keeps the
    working directory off sys.path, so a `storage/` or `agentos/` package where the server was
    started cannot stand in for ours (user code that wants the working directory adds it itself,
    as actors/worker_process.py does)."""
    return [sys.executable, "-P", "-m", module, *args]
