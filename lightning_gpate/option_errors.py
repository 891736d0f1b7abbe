"""The command line's own syntax errors in one line: the bad option and the closest valid ones.

jsonargparse answers a typo in an option or a config key, a value of the wrong type, or a missing
config file with the whole usage (70-odd lines) and an error that nests the union of every subclass
it tried, often with the config dumped in it. :func:`option_error_line` reads that error and says
the same in one line, with ``difflib``'s closest valid names and where the full list is; the
command line prints it as ``lightning-gpate <command>: error: <line>`` (see :mod:`lightning_gpate.cli`).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from pathlib import Path
from typing import Iterable

#: How many close names a message offers.
MAX_SUGGESTIONS = 3
#: Parts of a jsonargparse error that only restate the tried union or dump the given value.
_NOISE = ("Given value", "Subtypes:", "Errors:", "Does not validate against any of the Union subtypes", "Expected a <class 'NoneType'>")


def closest(name: str, candidates: Iterable[str]) -> list[str]:
    """Up to :data:`MAX_SUGGESTIONS` of ``candidates`` closest to ``name`` (``difflib``), best first."""
    return difflib.get_close_matches(name, sorted(set(candidates)), n=MAX_SUGGESTIONS, cutoff=0.6)


def _with_article(what: str) -> str:
    return f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"


def _did_you_mean(names: list[str], prefix: str = "") -> str:
    return f"; did you mean {' or '.join(prefix + n for n in names)}?" if names else ""


def init_arg_names(class_path: str) -> list[str]:
    """The constructor arguments a config may give ``class_path`` (``**kwargs`` passed on to a base class included)."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return []
    names: list[str] = []
    for klass in cls.__mro__:
        if klass is object or "__init__" not in vars(klass):
            continue
        params = list(inspect.signature(klass.__init__).parameters.values())[1:]
        names += [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def flat_option_place(class_path: str, name: str) -> tuple[str, str] | None:
    """Where the flat option ``name`` of ``class_path`` lives since the option groups, and how a config writes it
    (:meth:`~lightning_gpate.models.base.GenerativeModel.flat_option_place`), or ``None``."""
    module, _, cls_name = class_path.rpartition(".")
    try:
        place = getattr(importlib.import_module(module), cls_name).flat_option_place
    except (ImportError, AttributeError, ValueError):
        return None
    return place(name)


def parser_keys(parser) -> list[str]:
    """Every option of ``parser`` and of its subcommands' parsers, as dotted keys (``trainer.max_steps``)."""
    keys = [a.dest for a in parser._actions if a.dest not in ("help", "==SUPPRESS==")]
    keys += [k for k in parser.get_defaults().keys()]
    subcommands = getattr(parser, "_subcommands_action", None)
    for sub in (subcommands.choices.values() if subcommands is not None else ()):
        keys += parser_keys(sub)
    return sorted(set(keys))


def _suggest_key(bad: str, keys: list[str]) -> list[str]:
    """Close valid keys for the dotted ``bad`` key: the whole key, else the first wrong part with the rest kept."""
    found = closest(bad, keys)
    if found:
        return found
    parts = bad.split(".")
    for i in range(len(parts)):
        prefix = ".".join(parts[:i])
        siblings = {k[len(prefix) + 1 if prefix else 0:].split(".")[0] for k in keys if not prefix or k.startswith(prefix + ".")}
        if parts[i] not in siblings:
            return [".".join([*parts[:i], s, *parts[i + 1:]]) for s in closest(parts[i], siblings)]
    return []


def _config_file_suggestions(missing: str) -> list[str]:
    """YAML files with names close to a missing ``--config`` path's, from its folder and ``./configs``
    (the project's layout), one or two levels down."""
    path = Path(missing)
    by_name: dict[str, list[str]] = {}
    for folder in dict.fromkeys([path.parent, Path("configs")]):
        if folder.is_dir():
            for found in sorted([*folder.glob("*.yaml"), *folder.glob("*/*.yaml")]):
                by_name.setdefault(found.name, []).append(str(found))
    return [p for name in closest(path.name, by_name) for p in dict.fromkeys(by_name[name])][:MAX_SUGGESTIONS]


def option_error_line(message: str, parser, command: str) -> str:
    """One line for jsonargparse's error ``message`` raised by ``parser`` under ``command``
    (``lightning-gpate fit``): the bad key, the closest valid ones, and where to see them all."""
    help_hint = f"see {command} --help"
    outer = re.search(r'Parser key "([^"]+)"', message)
    class_path = re.search(r"given class_path '([^']+)'", message)
    base = outer.group(1) if outer else ""
    names = init_arg_names(class_path.group(1)) if class_path else []
    if names:
        help_hint = f"see {command} --{base}.help {class_path.group(1).rpartition('.')[2]}"
    unknown = re.search(r"Option '([^']+)' is not accepted", message)
    if unknown and class_path and not re.findall(r'Parser key "([^"]+)"', message)[1:]:
        moved = flat_option_place(class_path.group(1), unknown.group(1))
        if moved:  # a name of before the option groups (issue 60): say where it went
            place, example = moved
            return (f"{base}.init_args.{unknown.group(1)} is now {place} under {base}.init_args (option groups: "
                    f"{example} in a config) ({help_hint})")
    if unknown and class_path:
        # an option group of the class (e.g. DP-GAN's warm_start: a dataclass): its key below init_args, its own names
        paths = re.findall(r"given class_path '([^']+)'", message)
        keys = re.findall(r'Parser key "([^"]+)"', message)
        prefix = f"{base}.init_args." + "".join(f"{k}." for k in keys[1:len(paths)])
        names = init_arg_names(paths[-1]) or names
        return (f"unknown option {prefix}{unknown.group(1)}"
                f"{_did_you_mean(closest(unknown.group(1), names), prefix)} ({help_hint})")
    wrong_type = re.findall(r'Parser key "([^"]+)":\s*Expected a <class \'([^\']+)\'>\. Got value: (.*)', message)
    if wrong_type:
        key, expected, value = wrong_type[-1]
        full = f"{base}.init_args.{key}" if class_path and key != base else key
        return f"{full} expects {_with_article(expected)}, got {value.strip()!r} ({help_hint})"
    missing_file = re.search(r'Parser key "config": File does not exist: \'([^\']+)\'', message)
    if missing_file:
        given = missing_file.group(1)
        try:
            given = str(Path(given).relative_to(Path.cwd()))
        except ValueError:
            pass
        return f"config file not found: {given}{_did_you_mean(_config_file_suggestions(given))} ({help_hint})"
    key = (re.search(r"does not accept option '([^']+)'", message) or re.search(r"Option '([^']+)' is not accepted", message)
           or re.search(r"unrecognized arguments: --?([^\s=]+)", message))
    if key:
        return f"unknown option {key.group(1)}{_did_you_mean(_suggest_key(key.group(1), parser_keys(parser)))} ({help_hint})"
    lines: list[str] = []  # the rest: jsonargparse's lines without the union's restatements, "expected"s joined by "or"
    for line in dict.fromkeys(line.strip(" -") for line in message.splitlines()):
        if not line or line.startswith(_NOISE):
            continue
        line = re.sub(r"<class '([\w.]+)'>", r"\1", re.sub(r'Parser key "([^"]+)":', r"\1:", line))
        line = re.sub(r"^Expected (an? )?", "expected ", line)
        if line.startswith("expected "):
            what = _with_article(line[len("expected "):])
            if lines and "expected " in lines[-1]:
                lines[-1] += f" or {what}"
                continue
            line = f"expected {what}"
        lines.append(line)
    return " ".join(lines) + f" ({help_hint})"
