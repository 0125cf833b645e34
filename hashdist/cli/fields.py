"""Command-line options derived from an options object's fields (hashdist.options): the flag, type, choices,
default and help text come from the field, so each is written once."""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING, fields

from hashdist.options import help_text

_SCALARS = (int, float, str)


def parse_number(text: str):
    """A radius: an int when whole ("2"), else a float ("1.5")."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    return int(value) if value.is_integer() else value


def _literal_choices(hint) -> list | None:
    """The values of a Literal type, also inside ``X | None`` and ``tuple[X, ...]``."""
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    for arg in typing.get_args(hint):
        found = _literal_choices(arg)
        if found:
            return found
    return None


def _scalar(hint):
    """The argparse type of a field's annotation: int, float or str (the first such in a union)."""
    if hint in _SCALARS:
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType, tuple):
        return next((_scalar(arg) for arg in typing.get_args(hint) if _scalar(arg) is not str), str)
    return str


def add_fields(parser, cls, skip: tuple[str, ...] = ()) -> None:
    """One option per field of ``cls`` that declares a command-line form (``option(...)`` metadata)."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.name in skip or "cli" not in f.metadata:
            continue
        cli = dict(f.metadata["cli"])
        flag = cli.pop("flag", "--" + f.name.replace("_", "-"))
        kind = cli.pop("type", None)
        default = [] if cli.get("action") == "append" else f.default if f.default is not MISSING else None
        kwargs = {"dest": f.name, "help": help_text(f), "default": list(default) if isinstance(default, tuple)
                  else default, **cli}
        if f.default is MISSING and f.default_factory is MISSING:
            kwargs["required"] = True
        choices = _literal_choices(hints[f.name])
        if choices:
            kwargs["choices"] = choices
        elif kind == "number":
            kwargs["type"] = parse_number
        else:
            kwargs["type"] = {"json": str}.get(kind, kind) or _scalar(hints[f.name])
        parser.add_argument(flag, **kwargs)


def from_args(cls, args, **given):
    """An options object from the parsed command line: its fields that declare a command-line form and the parser
    has, and ``given`` (a field without one, such as EvaluateOptions.engine, never takes another's flag)."""
    taken = {f.name: getattr(args, f.name) for f in fields(cls)
             if "cli" in f.metadata and hasattr(args, f.name) and f.name not in given}
    return cls(**taken, **given)
