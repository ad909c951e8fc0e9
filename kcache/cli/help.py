"""`kcache --version` and `kcache help [COMMAND]`, answered as git, pip and ccache answer them."""

from __future__ import annotations

import argparse
import json
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent.parent
DISTRIBUTION = "kcache-gpu"  # pyproject.toml's name; the import name is `kcache`


def version_fields() -> dict[str, str | None]:
    """Which kcache runs: its version (None: run from a checkout on PYTHONPATH, never installed), where
    it runs from, and the Python."""
    try:
        installed: str | None = version(DISTRIBUTION)
    except PackageNotFoundError:
        installed = None
    return {"version": installed, "location": str(PACKAGE_DIR), "python": platform.python_version()}


def version_text() -> str:
    """"kcache 0.1.0 from /site-packages/kcache (Python 3.11.7)": which kcache runs, as pip says it."""
    fields = version_fields()
    installed = fields["version"] or "(no package metadata: not installed)"
    return f"kcache {installed} from {fields['location']} (Python {fields['python']})"


class VersionAction(argparse.Action):
    """`--version`: argparse's own "version" action, with the version looked up only when asked for
    (reading the package metadata costs every other command a few milliseconds)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        # --json anywhere among kcache's own options (cli._run says so: it may follow --version).
        print(json.dumps(version_fields(), indent=1) if getattr(parser, "json_requested", False) else version_text())
        parser.exit()


def add_parser(command: Any) -> None:
    """`kcache help [COMMAND]`; `command` makes a subcommand's parser (cli.build_parser's)."""
    helper = command("help", "this help, or a command's: kcache help COMMAND is kcache COMMAND --help")
    helper.add_argument("topic", nargs="?", metavar="COMMAND", help="the command to explain")


def show_help(parser: argparse.ArgumentParser, topic: str | None, as_json: bool = False) -> int:
    """Print kcache's help, or COMMAND's (as JSON with --json: the command, its usage and the whole text);
    ValueError (one line, exit status 2) for an unknown command."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if topic is not None and topic not in commands:
        raise ValueError(f"help: {topic!r} is no kcache command (commands: {', '.join(commands)})")
    chosen = parser if topic is None else commands[topic]
    if as_json:
        print(json.dumps({"command": topic, "usage": chosen.format_usage().strip(), "help": chosen.format_help(),
                          "commands": sorted(commands) if topic is None else None}, indent=1))
    else:
        print(chosen.format_help(), end="")
    return 0
