"""An experiment file (YAML) and the configurations it expands to.

```yaml
name: dp-scaling          # optional; default: the file's name without .yaml
description: Data-parallel scaling of the small GPT
command: run              # a distperf command that prints JSON with --json (run, predict), or an argv list
timeout: 300              # seconds per configuration (optional; --timeout overrides)
scale: cpu                # where the CSV goes: data/fresh/<scale>/ (optional; --scale overrides)
repeats: 3                # independent repeats of each configuration, each in fresh processes (optional;
                          #   --repeats overrides; default: 3 for run at scale cpu or gpu, else 1)
skip_invalid: false       # true: a configuration the command rejects becomes an 'invalid' row, not an error
network: nodes=2,ranks_per_node=1,inter=200mbit   # optional: run every configuration on an emulated
                          #   cluster (run's --network, the same as base: {network: …}; needs root);
                          #   grid: {network: [SPEC, SPEC]} varies it
memory_limit: 4GiB        # optional: the address space each process of a configuration may map (RLIMIT_AS):
                          #   an allocation past it fails, as on a device that is full, and the row is 'oom';
                          #   such an experiment runs one configuration per process
base:                     # flags shared by every configuration (without the leading --)
  model: small
  steps: 5
  micro-batch: 2
env:                      # environment variables of every configuration (optional)
  OMP_NUM_THREADS: 1
grid:                     # each key a list; the configurations are their cartesian product,
  dp: [1, 2]              #   the first key varying slowest
  zero: [0, 1, 2, 3]
  env.DISTPERF_FAULT: ["", "raise:1:1"]   # an env.NAME key varies an environment variable
exclude:                  # optional: a configuration matching every key of an entry is left out
  - {dp: 1, zero: [1, 2, 3]}
```

Repeat 0 of a configuration has the configuration's own hash (:attr:`Configuration.hash`), so a table written
before repeats existed resumes; the repeats of a configuration share the hash and differ in their ``repeat``.

Flag names may be written with dashes or underscores (``micro_batch``); ``true`` gives a bare switch,
``false`` leaves a switch off (``--no-NAME`` for on/off flags). For a distperf command every key and
value is checked against that command's own parser and configuration rules before anything runs;
bad input raises :class:`~distperf.config.ConfigError` naming the YAML field (``grid.dp``) and the rule.
Relative paths in an argv ``command`` are relative to the experiment file; ``{python}`` stands for
this interpreter. A notebook describes the same thing as a dictionary and hands it to
:meth:`Experiment.from_dict` (with ``name``, and the folder its commands run in) instead of writing a file.
"""
from __future__ import annotations

import argparse
import difflib
import itertools
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..config import ConfigError

TOP_KEYS = ("name", "description", "command", "timeout", "scale", "repeats", "skip_invalid", "network", "memory_limit",
            "base", "env", "grid", "exclude")
TIMED_REPEATS = 3  # the default repeats of a run experiment at scale cpu or gpu: run-to-run spread needs at least 3
DISTPERF_COMMANDS = ("run", "predict")
RESERVED_FLAGS = ("json", "help")
Scalar = (str, int, float, bool)


@dataclass(frozen=True)
class Configuration:
    """One point of the grid: flag values and environment, in a canonical form."""

    params: dict  # flag name (dashes) -> scalar
    env: dict  # variable -> string
    command: tuple  # ("distperf", "run") or an argv prefix
    invalid: str = ""  # why the command rejects it (only with skip_invalid)

    @property
    def hash(self) -> str:
        """sha256 of the command, flags and environment (canonical JSON), first 16 hex digits."""
        from .resume import config_hash

        return config_hash({"command": list(self.command), "params": self.params, "env": self.env})

    def flags(self) -> list[str]:
        return flags_of(self.params, parser_for(self.command))

    def label(self, varying: list[str]) -> str:
        parts = [f"{k}={self.params[k]}" for k in varying if k in self.params]
        parts += [f"{k}={self.env[k[4:]]}" for k in varying if k.startswith("env.") and k[4:] in self.env]
        return " ".join(parts) or "base"


@dataclass(frozen=True)
class Experiment:
    """An experiment: its grid of configurations, checked. Build one with :meth:`from_dict` (a notebook's
    dictionary) or :func:`load` (a YAML file); both go through the same checks."""

    name: str
    source: str  # where it was described, for messages: the file's name, or "experiment <name>"
    workdir: Path  # where its commands run; relative paths in an argv command are relative to it
    command: tuple
    base: dict
    env: dict
    grid: dict  # key -> list (keys: flag names, or env.NAME)
    exclude: list
    timeout: float | None = None
    scale: str | None = None
    skip_invalid: bool = False
    description: str = ""
    configurations: list = field(default_factory=list)
    repeats: int | None = None  # None: the default of the scale (:meth:`repeats_at`)
    memory_limit: float | None = None  # bytes of address space per process (RLIMIT_AS), None: no limit

    @property
    def varying(self) -> list[str]:
        return list(self.grid)

    def repeats_at(self, scale: str | None) -> int:
        """How many repeats of each configuration to run: the experiment's own ``repeats``, else
        :data:`TIMED_REPEATS` for ``run`` at scale cpu or gpu (where its timings are read), else 1 (smoke,
        ``predict`` and foreign commands, whose results do not vary from run to run)."""
        if self.repeats is not None:
            return self.repeats
        return TIMED_REPEATS if self.command == ("distperf", "run") and (scale or self.scale) in ("cpu", "gpu") else 1

    @classmethod
    def from_dict(cls, data: dict, workdir: str | Path = ".", source: str | None = None) -> "Experiment":
        """Check an experiment given as a dictionary (the keys of an experiment file; ``name`` required
        unless ``source`` names a file) and expand its grid; raise ConfigError naming the field and the rule."""
        if not isinstance(data, dict):
            raise ConfigError("experiment", f"{source or 'the experiment'}: must hold a mapping with keys "
                                            f"{', '.join(TOP_KEYS)}")
        source = source or f"experiment {data.get('name', '?')}"
        exp = _validate(*_parse(data, source, Path(workdir)))
        exp.configurations.extend(expand(exp))
        if not exp.configurations:
            raise _err(source, "exclude", "leaves no configuration to run")
        return exp


def _err(source: str, where: str, rule: str) -> ConfigError:
    return ConfigError(f"{source}: {where}", rule)


def _canonical(key: str) -> str:
    return key.strip().lstrip("-").replace("_", "-")


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit; we want the rule
        raise argparse.ArgumentError(None, message)


_PARSERS: dict = {}


def parser_for(command: tuple):
    """The argparse parser of a distperf command, with the flags that command declares
    (:data:`distperf.flags.COMMAND_ARGUMENTS`); None for a foreign command."""
    from ..flags import COMMAND_ARGUMENTS

    if command[:1] != ("distperf",):
        return None
    if command not in _PARSERS:
        parser = _RaisingParser(prog=f"distperf {command[1]}", add_help=False, exit_on_error=False)
        COMMAND_ARGUMENTS[command[1]](parser)
        _PARSERS[command] = parser
    return _PARSERS[command]


def _actions(parser) -> dict[str, argparse.Action]:
    return {opt[2:]: a for a in parser._actions for opt in a.option_strings if opt.startswith("--")}


def flags_of(params: dict, parser) -> list[str]:
    """The command-line flags of ``params``: ``--name value``; booleans as switches."""
    actions = _actions(parser) if parser is not None else {}
    out = []
    for name, value in params.items():
        action = actions.get(name)
        if isinstance(value, bool):
            if value:
                out.append(f"--{name}")
            elif isinstance(action, argparse.BooleanOptionalAction):
                out.append(f"--no-{name}")
        else:
            out += [f"--{name}", str(value)]
    return out


def _check_value(source, where, value):
    if not isinstance(value, Scalar) or value is None:
        raise _err(source, where, f"must be a single number, string or boolean, got {value!r}")


def _check_flag(source, where, name, value, parser) -> None:
    """Is ``--name`` a flag of the command, and can it take ``value``?"""
    if parser is None:
        return
    actions = _actions(parser)
    if name in RESERVED_FLAGS or name not in actions:
        known = sorted(k for k in actions if k not in RESERVED_FLAGS and not k.startswith("no-"))
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}"
        raise _err(source, where, f"{name!r} is not a flag of `distperf {parser.prog.split()[-1]}`{hint}")
    action = actions[name]
    switch = action.nargs == 0
    if isinstance(value, bool) != switch:
        kind = "true or false (a switch)" if switch else "a value, not true/false"
        raise _err(source, where, f"must be {kind}, got {value!r}")


def load(path: str | Path) -> Experiment:
    """Read an experiment file (YAML) and check it (:meth:`Experiment.from_dict`; the name defaults to the
    file's stem, and the commands run in the file's folder)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError("experiment", f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError("experiment", f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    if isinstance(data, dict):
        data = {"name": path.stem, **data}
    return Experiment.from_dict(data, workdir=path.parent, source=path.name)


def _parse(data: dict, source: str, workdir: Path) -> tuple[Experiment, dict]:
    """Check the shape of every key (types, names, value ranges) and canonicalise flag names; return the
    experiment without configurations and, for each flag of base and grid, the field that set it (for
    :func:`_validate`'s messages)."""
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), TOP_KEYS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(TOP_KEYS)}"
        raise _err(source, str(unknown[0]), f"unknown key{hint}")
    name = data.get("name")
    if not isinstance(name, str) or not name or any(c in name for c in "/\\") or name.startswith("."):
        raise _err(source, "name", f"must be a non-empty file name without slashes, got {name!r}")
    timeout = data.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise _err(source, "timeout", f"must be a positive number of seconds, got {timeout!r}")
    scale = data.get("scale")
    if scale is not None:
        from ..results import SCALES

        if scale not in SCALES:
            raise _err(source, "scale", f"must be one of {', '.join(SCALES)}, got {scale!r}")
    skip_invalid = data.get("skip_invalid", False)
    if not isinstance(skip_invalid, bool):
        raise _err(source, "skip_invalid", f"must be true or false, got {skip_invalid!r}")
    repeats = data.get("repeats")
    if repeats is not None:
        check_repeats(repeats, f"{source}: repeats")
    memory_limit = data.get("memory_limit")
    if memory_limit is not None:
        from ..units import parse_size

        try:
            memory_limit = parse_size(memory_limit, "memory_limit")
        except ConfigError as e:
            raise _err(source, "memory_limit", e.rule) from None

    base, fields = {}, {}
    if data.get("network") is not None:
        if not isinstance(data["network"], str):
            raise _err(source, "network", f"must be a string like nodes=2,ranks_per_node=1,inter=200mbit, "
                                          f"got {data['network']!r}")
        base["network"], fields["network"] = data["network"], "network"
    for key, value in _mapping(source, "base", data.get("base", {})).items():
        flag = _canonical(str(key))
        if flag in base:
            raise _err(source, f"base.{key}", f"{flag!r} is also set at the top level; set it in one place")
        if isinstance(value, (list, dict)):
            raise _err(source, f"base.{key}", "must be a single value (lists of values go in grid)")
        _check_value(source, f"base.{key}", value)
        base[flag], fields[flag] = value, f"base.{key}"
    env = {}
    for key, value in _mapping(source, "env", data.get("env", {})).items():
        _check_value(source, f"env.{key}", value)
        env[str(key)] = _env_value(value)

    grid = {}
    for key, values in _mapping(source, "grid", data.get("grid", {})).items():
        where = f"grid.{key}"
        if not isinstance(values, list) or not values:
            raise _err(source, where, f"must be a non-empty list of values, got {values!r}")
        for v in values:
            _check_value(source, where, v)
        if len({json.dumps(v) for v in values}) != len(values):
            raise _err(source, where, f"lists a value twice: {values!r}")
        key = str(key)
        if key.startswith("env."):
            grid[key] = [_env_value(v) for v in values]
            continue
        flag = _canonical(key)
        if flag in base:
            raise _err(source, where, f"{flag!r} is also set in base; set it in one place")
        grid[flag], fields[flag] = list(values), where

    exclude = []
    raw_exclude = data.get("exclude", [])
    if not isinstance(raw_exclude, list):
        raise _err(source, "exclude", f"must be a list of mappings, got {raw_exclude!r}")
    for i, entry in enumerate(raw_exclude):
        entry = _mapping(source, f"exclude[{i}]", entry)
        rule = {}
        for key, value in entry.items():
            key = str(key) if str(key).startswith("env.") else _canonical(str(key))
            if key not in grid:
                raise _err(source, f"exclude[{i}].{key}", f"is not a key of grid ({', '.join(grid) or 'empty'})")
            values = value if isinstance(value, list) else [value]
            rule[key] = [_env_value(v) if key.startswith("env.") else v for v in values]
        exclude.append(rule)

    command = _command(source, workdir, data.get("command", "run"))
    return Experiment(name=name, source=source, workdir=workdir, command=command, base=base, env=env, grid=grid,
                      exclude=exclude, timeout=timeout, scale=scale, skip_invalid=skip_invalid,
                      description=str(data.get("description", "")), repeats=repeats,
                      memory_limit=memory_limit), fields


def check_repeats(value, field_name: str = "repeats") -> int:
    """``value`` if it is a whole number of repeats, 1 or more; else ConfigError naming ``field_name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(field_name, f"must be a whole number of repeats, 1 or more, got {value!r}")
    return value


def _validate(exp: Experiment, fields: dict) -> Experiment:
    """Check every flag of base and grid against the command's own parser."""
    parser = parser_for(exp.command)
    for flag, value in exp.base.items():
        _check_flag(exp.source, fields[flag], flag, value, parser)
    for flag, values in exp.grid.items():
        if not flag.startswith("env."):
            for v in values:
                _check_flag(exp.source, fields[flag], flag, v, parser)
    return exp


def _mapping(source, where, value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _err(source, where, f"must be a mapping, got {value!r}")
    return value


def _env_value(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _command(source: str, workdir: Path, value) -> tuple:
    if isinstance(value, str):
        if value not in DISTPERF_COMMANDS:
            raise _err(source, "command", f"must be one of {', '.join(DISTPERF_COMMANDS)} or a list (an argv), "
                                          f"got {value!r}")
        return ("distperf", value)
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        argv = []
        for v in value:
            v = v.replace("{python}", sys.executable)
            if not v.startswith("-") and (workdir / v).exists():
                v = str((workdir / v).resolve())
            argv.append(v)
        return tuple(argv)
    raise _err(source, "command", f"must be a distperf command name or a non-empty list of strings, got {value!r}")


def _excluded(exp: Experiment, point: dict) -> bool:
    return any(all(point[k] in values for k, values in rule.items()) for rule in exp.exclude)


def expand(exp: Experiment) -> list[Configuration]:
    """The cartesian product of the grid over the base, without the excluded points; each checked
    by the command's own rules."""
    keys = list(exp.grid)
    out = []
    for values in itertools.product(*(exp.grid[k] for k in keys)):
        point = dict(zip(keys, values))
        if _excluded(exp, point):
            continue
        params = {**exp.base, **{k: v for k, v in point.items() if not k.startswith("env.")}}
        env = {**exp.env, **{k[4:]: v for k, v in point.items() if k.startswith("env.")}}
        cfg = Configuration(params=params, env=env, command=exp.command)
        problem = check_configuration(cfg)
        if problem:
            if not exp.skip_invalid:
                raise _err(exp.source, f"grid configuration {cfg.label(keys)}",
                           f"{problem} (leave it out with exclude, or set skip_invalid: true)")
            cfg = Configuration(params=params, env=env, command=exp.command, invalid=problem)
        out.append(cfg)
    return out


def check_configuration(cfg: Configuration) -> str:
    """'' if the command accepts the configuration, else the rule it breaks (one line)."""
    from ..flags import config_and_policy, config_from_args, options_from_args

    parser = parser_for(cfg.command)
    if parser is None:
        return ""
    try:
        args = parser.parse_args(cfg.flags())
    except argparse.ArgumentError as e:
        return str(e)
    try:
        if cfg.command[1] == "run":
            from ..emulation.spec import check_world_size, parse
            from ..parallel.rules import check_run

            run_cfg = config_and_policy(args)[0]
            check_run(run_cfg, options_from_args(args))
            if args.network:
                check_world_size(parse(args.network, inter_optional=bool(args.network_like)),
                                 run_cfg.layout.world_size)
        else:
            config_from_args(args)
    except ConfigError as e:
        return str(e)
    return ""


def with_network(exp: Experiment, network: str) -> Experiment:
    """``sweep --network SPEC``: every configuration that sets no network of its own runs on ``SPEC``
    (its hash changes with it); each is checked again, as :func:`expand` does."""
    if exp.command[:1] != ("distperf",) or exp.command[1] != "run":
        raise ConfigError("network", "needs an experiment whose command is run")
    configurations = []
    for cfg in exp.configurations:
        if "network" not in cfg.params and not cfg.invalid:
            cfg = replace(cfg, params={**cfg.params, "network": network})
            problem = check_configuration(cfg)
            if problem and not exp.skip_invalid:
                raise ConfigError("network", f"configuration {cfg.label(exp.varying)}: {problem}")
            cfg = replace(cfg, invalid=problem)
        configurations.append(cfg)
    return replace(exp, configurations=configurations)
