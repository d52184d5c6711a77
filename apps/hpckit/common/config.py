"""Benchmark configurations: built-in YAML files, user files, and `--set key=value` overrides.

A configuration is a nested dict. The built-in ones live in
`hpckit/<benchmark>/configs/<name>.yaml`. A user file is read as overrides of a built-in
base (`base: reference` by default, or `base: mini`), so it only names what it changes.
Every key of an override must already exist in the base: an unknown key is a typo and is
reported, never silently ignored. Values keep the base's type (an int may stand for a
float; a mapping or list must stay a mapping or list).
"""

from __future__ import annotations

import copy
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml

from hpckit.common.errors import KitError

BUILTIN_CONFIGS = ("mini", "reference")


def builtin_config_path(benchmark: str, name: str) -> Path:
    return Path(str(resources.files(f"hpckit.{benchmark}") / "configs" / f"{name}.yaml"))


def _read_yaml(path: Path, what: str) -> dict:
    from hpckit.common.inputs import read_text   # the kit's one reader: a regular file, bounded, one line
    text = read_text(path, f"{what} {path}", limit=1 << 24)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise KitError(f"{what} {path}:{where} not valid YAML")
    except (ValueError, RecursionError) as e:   # a date 2026-02-30, !!float x; nesting past the parser's recursion
        raise KitError(f"{what} {path}: not valid YAML ({(str(e).splitlines() or [type(e).__name__])[0][:200]})") \
            from None
    if not isinstance(data, dict):
        raise KitError(f"{what} {path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def _merge(base: dict, override: dict, source: str, prefix: str = "") -> None:
    for key, value in override.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            raise KitError(f"unknown config key '{dotted:.100}' in {source}")
        base[key] = _coerce(base[key], value, dotted, source)


# keys that take `auto` or a count (whichever the base has): the loader's workers, sized by
# the core plan when auto (common/cores.py plan)
AUTO_OR_COUNT = ("data.loader_workers",)


def _coerce(old: Any, new: Any, dotted: str, source: str) -> Any:
    if dotted in AUTO_OR_COUNT:
        if new == "auto" or (isinstance(new, int) and not isinstance(new, bool) and new >= 0):
            return new
        raise KitError(f"config key '{dotted}' in {source}: expected auto or a count >= 0, got {new!r:.60}")
    if isinstance(old, dict):
        if not isinstance(new, dict):
            raise KitError(f"config key '{dotted}' in {source}: expected a mapping, got {new!r:.60}")
        if dotted.endswith("decay_schedule"):  # free-form epoch -> factor mapping
            return dict(new)
        merged = copy.deepcopy(old)
        _merge(merged, new, source, dotted + ".")
        return merged
    if isinstance(old, bool):
        if not isinstance(new, bool):
            raise KitError(f"config key '{dotted}' in {source}: expected true/false, got {new!r:.60}")
        return new
    if isinstance(old, float):
        if isinstance(new, str):   # YAML 1.1 reads 1e12 (no dot) as a string
            try:
                new = float(new) if math.isfinite(float(new)) else new
            except ValueError:
                pass
        if isinstance(new, bool) or not isinstance(new, (int, float)):
            raise KitError(f"config key '{dotted}' in {source}: expected a number, got {new!r:.60}")
        try:
            return float(new)
        except OverflowError:   # an integer beyond what a float holds (10**400)
            raise KitError(f"config key '{dotted}' in {source}: {new!r:.60} is too large a number") from None
    if isinstance(old, int):
        if isinstance(new, bool) or not isinstance(new, int):
            raise KitError(f"config key '{dotted}' in {source}: expected an integer, got {new!r:.60}")
        return new
    if isinstance(old, list):
        if not isinstance(new, list):
            raise KitError(f"config key '{dotted}' in {source}: expected a list, got {new!r:.60}")
        kinds = {type(v) for v in old}
        if len(kinds) == 1 and kinds <= {int, float}:   # a list of numbers: each item keeps the type
            return [_coerce(old[0], v, f"{dotted}[{i}]", source) for i, v in enumerate(new)]
        return new
    if isinstance(old, str):
        if old == "auto" and isinstance(new, bool):   # an auto | true | false key
            return new
        if not isinstance(new, str):
            raise KitError(f"config key '{dotted}' in {source}: expected a string, got {new!r:.60}")
        return new
    return new  # None in the base: anything goes


def parse_overrides(items: Iterable[str]) -> dict:
    """['a.b=3', 'c=x'] -> {'a': {'b': 3}, 'c': 'x'} (values parsed as YAML scalars)."""
    nested: dict = {}
    for item in items:
        if "=" not in item:
            raise KitError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise KitError(f"--set {item!r}: empty key")
        try:
            value = yaml.safe_load(raw)
        except (yaml.YAMLError, ValueError, RecursionError):
            raise KitError(f"--set {item!r}: value is not a valid YAML scalar") from None
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise KitError(f"--set {item!r}: '{part}' is set twice")
        node[parts[-1]] = value
    return nested


def load_config(benchmark: str, spec: str, overrides: Iterable[str] = ()) -> dict:
    """Resolve `spec` (a built-in name or a YAML file) and apply `--set` overrides."""
    if spec in BUILTIN_CONFIGS:
        config = _read_yaml(builtin_config_path(benchmark, spec), "built-in config")
        config["name"] = spec
    else:
        path = Path(spec)
        if not os.path.lexists(path):   # a FIFO or a directory: the reader says what it is
            raise KitError(
                f"config {spec!r}: not a built-in config ({', '.join(BUILTIN_CONFIGS)}) and no such file")
        user = _read_yaml(path, "config file")
        base = user.pop("base", "reference")
        if base not in BUILTIN_CONFIGS:
            raise KitError(f"config file {path}: base {base!r:.60} is not one of {', '.join(BUILTIN_CONFIGS)}")
        config = _read_yaml(builtin_config_path(benchmark, base), "built-in config")
        _merge(config, user, f"config file {path}")
        config["name"] = str(path)
    _merge(config, parse_overrides(overrides), "--set")
    return config


def load_pytorch_config(args, benchmark: str, label: str, validate) -> dict:
    """The validated config of a benchmark implemented in PyTorch only, as its reference is
    (DeepCAM, OC20): --framework auto or pytorch, else one line."""
    if args.framework not in ("auto", "pytorch"):
        raise KitError(f"--framework {args.framework}: {label} is implemented in PyTorch, as the reference")
    config = load_config(benchmark, args.config, args.overrides)
    validate(config)
    return config


def flatten(config: dict, prefix: str = "") -> dict:
    """{'a': {'b': 1}} -> {'a.b': 1}; mappings that are values (decay schedules) stay whole."""
    flat = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and not dotted.endswith("decay_schedule"):
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def check_auto_or_count(value, key: str) -> None:
    """A key of AUTO_OR_COUNT as a config file or the built-in config gives it."""
    require(value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0), key,
            f"must be auto or a count >= 0 (got {value!r})")


def require(cond: bool, key: str, message: str) -> None:
    """Validation helper: one line naming the key."""
    if not cond:
        raise KitError(f"config key '{key}': {message}")
