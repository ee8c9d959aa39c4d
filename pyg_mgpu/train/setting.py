"""How one setting of a run is declared: once, with its flag, help, choices and checks.

A settings group (:mod:`pyg_mgpu.train.settings`) is a dataclass whose fields are made by
:func:`setting`. The field's metadata is all the CLI needs to make its flag
(:func:`pyg_mgpu.tools.cli.add_setting_flags`), and :func:`check_choices` is the one check of a
setting's choices, for the CLI and for a config built in code alike.
"""
from __future__ import annotations

from dataclasses import Field, field, fields
from typing import Any, Callable, Optional, Sequence

from pyg_mgpu.errors import ArgumentError


class ConfigError(ValueError):
    """A bad option: the message names the flag, what was given and what is accepted."""


# Every setting is the CLI flag of its name (``feature_cache_gb``: ``--feature-cache-gb``), but
# for these.
_FLAG_NAMES = {"timeout_s": "--timeout"}


def flag_of(name: str) -> str:
    """The CLI flag that sets the config field ``name``."""
    return _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))


def in_flags(error: BaseException) -> str:
    """An error's message for a user of the CLI: library arguments named as their flags."""
    return error.naming(flag_of) if isinstance(error, ArgumentError) else str(error)


def setting(default: Any, help: str, *, type: Optional[Callable] = None,
            choices: Optional[Sequence[str]] = None, metavar: Optional[str] = None,
            from_recipe: bool = False, same_on_resume: bool = False) -> Field:
    """A settings-group field that is also a flag.

    Args:
        default: The value when the flag is not given. ``False``: an on/off switch. A tuple:
            a comma-separated list on the command line.
        help: The flag's help: what the setting does, in the user's words.
        type: How the command line's text becomes the value, where the default does not show it
            (a default of None).
        choices: The accepted values, checked by :func:`check_choices` alone.
        metavar: The value's name in ``--help``.
        from_recipe: Unset (None), the setting takes the model's recipe value: the flag has no
            default of its own.
        same_on_resume: A resumed run must have the checkpoint's value, or it would not
            continue the same run.
    """
    meta = {"help": help, "type": type, "choices": tuple(choices) if choices else None,
            "metavar": metavar, "from_recipe": from_recipe, "same_on_resume": same_on_resume}
    return field(default=default, metadata=meta)


def flag_fields(group) -> list[Field]:
    """The fields of a settings group (class or instance) that are flags, in order."""
    return [f for f in fields(group) if "help" in f.metadata]


def check_choices(settings, *names: str) -> None:
    """Each named setting (default: every setting with choices) holds one of its choices."""
    for f in flag_fields(settings):
        allowed = f.metadata["choices"]
        if allowed and (not names or f.name in names):
            value = getattr(settings, f.name)
            if value not in allowed:
                raise ConfigError(f"{flag_of(f.name)} must be one of {', '.join(allowed)}, got "
                                  f"{value!r}.")


def check_positive(**values: Optional[int]) -> None:
    """Each value given (not None) is a positive integer."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise ConfigError(f"{flag_of(name)} must be a positive integer, got {value}.")


def listed(value: Any, name: str, kind: Callable, example: str) -> tuple:
    """A list setting as a tuple: from the command line's comma-separated text, or as given."""
    try:
        parts = value.split(",") if isinstance(value, str) else value
        return tuple(kind(part) for part in parts)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag_of(name)} takes comma-separated {kind.__name__} values such "
                          f"as {example}, got {value!r}.") from None
