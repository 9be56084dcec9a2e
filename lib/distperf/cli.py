"""``python -m distperf {predict,run,sweep,calibrate,plan}``.

Each subcommand lives in its own module, which provides ``add_arguments(parser)`` and ``main(args) -> int``;
this file only dispatches, and imports only the command that runs. Bad input (ConfigError, a missing file, an
emulated network without root) ends with one line naming the field and the rule, and exit status 2 — never a
traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from .config import ConfigError
from .emulation.topology import NotPrivileged

COMMANDS = {
    "predict": ("distperf.commands.predict", "predict memory, communication and time with the cost model"),
    "run": ("distperf.commands.run", "train a configuration on torch.distributed and measure it"),
    "sweep": ("distperf.commands.sweep", "run a grid of configurations from a YAML file, resumably"),
    "calibrate": ("distperf.commands.calibrate", "measure this machine and write a hardware profile"),
    "plan": ("distperf.commands.plan", "PipeDream-2BW planner: pick width, depth, microbatch and recomputation"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag ends with one line (no usage block) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _command(module: str):
    """The command's module, or None when something it needs is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:  # the module exists but something it imports is missing
            raise
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = _Parser(prog="distperf",
                     description="Predict (cost model) and measure (torch.distributed) distributed Transformer training.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    module = None
    for name, (path, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen and (module := _command(path)) is not None:
            module.add_arguments(command)
    args = parser.parse_args(argv)
    if module is None:
        print(f"distperf {args.command}: error: not available (something it needs is not installed)", file=sys.stderr)
        return 2
    try:
        return module.main(args) or 0
    except ConfigError as e:
        print(f"distperf {args.command}: error: {e}", file=sys.stderr)
        return 2
    except NotPrivileged as e:  # an emulated network without root
        print(f"distperf {args.command}: error: network: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"distperf {args.command}: error: {e.filename}: no such file", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
