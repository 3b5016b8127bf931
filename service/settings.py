"""Settings declared once: each is a field of a config dataclass, and that one declaration
gives the field, its command-line flag, its ``HUBSPOKE_<FLAG>`` environment variable, its
default, the function that parses and checks its text, and its ``--help`` line.

    @settings
    class Listen:
        port: int = setting("--port", default=8700, parse=int, help="port to bind")

:func:`add_settings` adds a config class's flags to a parser, :func:`config_from` builds the
config from what the parser returns. Every flag reads its environment variable as its default,
so the flag wins; argparse parses a default given as text with the setting's ``parse``, so a
bad variable is refused with the same message as a bad flag. A default is written as on the
command line (``"256MiB"``) or as the value itself (``8701``); ``--help`` shows it as written.

Groups of settings that the hub and the spoke share (logging, auth, TLS, limits) are config
classes of their own, in the service module of their idea; a server's config inherits them.
Checks that involve two settings stay explicit code after parsing (see :mod:`service.tls`).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, dataclass_transform, overload

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
C = TypeVar("C")
D = TypeVar("D", bound="DataclassInstance")

METADATA_KEY = "hubspoke.setting"  # the Setting in each config field's metadata


class _Required(enum.Enum):
    REQUIRED = "required"


REQUIRED = _Required.REQUIRED  # no default: the flag (or its variable) must be given


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting's declaration, kept in its field's metadata."""

    flag: str
    help: str
    parse: Callable[[str], object]
    # As written on the command line ("256MiB"), or the value itself; REQUIRED for none.
    default: object = REQUIRED
    choices: Sequence[str] | None = None
    switch: bool = False  # a flag without a value (store_true); its variable reads 1/true/yes/on
    internal: bool = False  # set by the servers themselves: no --help line, no variable

    @property
    def dest(self) -> str:
        """The attribute argparse stores it under: ``--cache-dir`` → ``cache_dir``."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str | None:
        """Its environment variable, ``HUBSPOKE_CACHE_DIR``; None for an internal one."""
        return None if self.internal else env_name(self.flag)

    def value(self) -> object:
        """The default as the field holds it (parsed when written as text)."""
        return self.parse(self.default) if isinstance(self.default, str) else self.default


@overload
def setting(
    flag: str, *, help: str, default: str | _Required | None = REQUIRED,
    choices: Sequence[str] | None = None, internal: bool = False,
) -> str: ...


@overload
def setting(
    flag: str, *, help: str, parse: Callable[[str], T],
    default: T | str | _Required | None = REQUIRED, internal: bool = False,
) -> T: ...


@overload
def setting(flag: str, *, help: str, switch: Literal[True], default: bool = False) -> bool: ...


def setting(
    flag: str, *, help: str, parse: Callable[[str], Any] = str, default: Any = REQUIRED,
    choices: Sequence[str] | None = None, switch: bool = False, internal: bool = False,
) -> Any:
    """A config field that is also the flag ``flag`` (and its environment variable).

    ``parse`` turns its text into the value (raising ``argparse.ArgumentTypeError`` or
    ``ValueError`` on a bad one); a ``switch`` is a flag without a value, off by default.
    """
    if switch:
        parse = _switched_on
    spec = Setting(flag, help, parse, default, choices, switch, internal)
    if default is REQUIRED:
        return dataclasses.field(metadata={METADATA_KEY: spec})
    return dataclasses.field(default=spec.value(), metadata={METADATA_KEY: spec})


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(setting,))
def settings(cls: type[C]) -> type[C]:
    """Make ``cls`` a config class: a frozen dataclass of :func:`setting` fields, keyword-only
    (so a config may inherit groups of settings in any order)."""
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


def declared(cls: type[DataclassInstance]) -> list[Setting]:
    """``cls``'s settings in the order its source reads: each base's, left to right, then its
    own (``dataclasses.fields`` lists the last base's first)."""
    owners = (*cls.__mro__[1:], cls)
    names = dict.fromkeys(
        name for owner in owners for name in vars(owner).get("__annotations__", {})
    )
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    return [by_name[name].metadata[METADATA_KEY] for name in names if name in by_name]


def add_settings(
    parser: argparse.ArgumentParser, cls: type[DataclassInstance], env: Mapping[str, str],
    only: Sequence[str] | None = None,
) -> None:
    """Add the flags of ``cls``'s settings (or of those whose flag is in ``only``)."""
    for spec in declared(cls):
        if only is not None and spec.flag not in only:
            continue
        if spec.internal:
            parser.add_argument(spec.flag, type=spec.parse, help=argparse.SUPPRESS)
            continue
        default = None if spec.default is REQUIRED else spec.default
        extra: dict[str, Any] = ({"action": "store_true"} if spec.switch
                                 else {"type": _typed(spec), "choices": spec.choices})
        add_flag(parser, spec.flag, env=env, default=default, required=spec.default is REQUIRED,
                 help=spec.help, **extra)


def _typed(spec: Setting) -> Callable[[str], object]:
    """The ``type=`` of ``spec``'s flag. argparse checks ``choices`` only on a value given as
    a flag, not on a default, so a choice's variable is checked here, in argparse's words."""
    choices = spec.choices
    if choices is None:
        return spec.parse

    def choice(text: str) -> object:
        value = spec.parse(text)
        if value not in choices:
            listed = ", ".join(map(repr, choices))
            raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {listed})")
        return value

    return choice


def config_from(cls: type[D], args: argparse.Namespace) -> D:
    """The config of class ``cls`` that parsed ``args`` (from :func:`add_settings`) give."""
    values: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        spec: Setting = f.metadata[METADATA_KEY]
        value = getattr(args, spec.dest)
        if spec.switch and isinstance(value, str):  # its variable's text: argparse leaves it
            value = spec.parse(value)
        elif spec.default is None and value == "":  # an empty variable leaves it unset
            value = None
        values[f.name] = value
    return cls(**values)


def env_name(flag: str) -> str:
    """``--cache-dir`` → ``HUBSPOKE_CACHE_DIR``."""
    return "HUBSPOKE_" + flag.lstrip("-").replace("-", "_").upper()


def add_flag(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    env: Mapping[str, str],
    default: Any = None,
    required: bool = False,
    help: str,
    **kwargs: Any,
) -> None:
    """Add ``flag`` whose default comes from its environment variable when set."""
    name = env_name(flag)
    from_env = env.get(name)
    value = from_env if from_env is not None else default
    needed = required and value is None
    suffix = f" [env {name}]" + (f" (default: {default})" if default is not None else "")
    parser.add_argument(flag, default=value, required=needed, help=help + suffix, **kwargs)


def _switched_on(text: str) -> bool:
    """A switch's environment variable: on for ``1``, ``true``, ``yes``, ``on``."""
    return text.strip().lower() in ("1", "true", "yes", "on")
