"""Errors about a caller's arguments, worded in the caller's own names.

A library function names its arguments (``devices='cuda:0,0'``); the CLI, which calls it with
the user's flags, names the flags instead (``--devices cuda:0,0``). An :class:`ArgumentError`
holds its message as a template whose ``{name}`` and ``{name=value}`` fields are rendered by
whoever reports it: ``str(error)`` in the library's words, :meth:`ArgumentError.naming` in
another's.
"""
from __future__ import annotations

import re
from typing import Callable

_FIELD = re.compile(r"\{(\w+)(?:=([^{}]*))?\}")


class ArgumentError(ValueError):
    """A bad argument. ``template`` names arguments as ``{name}`` or ``{name=value}``.

    Example:
        >>> error = ArgumentError("{nprocs=0}: a job needs at least 1 rank.")
        >>> str(error)
        'nprocs=0: a job needs at least 1 rank.'
        >>> error.naming(lambda name: "--" + name)
        '--nprocs 0: a job needs at least 1 rank.'
    """

    def __init__(self, template: str):
        self.template = template
        super().__init__(self.naming(None))

    def naming(self, flag_of: Callable[[str], str] | None) -> str:
        """The message with each argument named as a keyword (``flag_of`` None) or by
        ``flag_of(name)``, its value following the flag."""
        def render(match: re.Match) -> str:
            name, value = match.groups()
            if flag_of is None:
                return name if value is None else f"{name}={value}"
            return flag_of(name) if value is None else f"{flag_of(name)} {value}"
        return _FIELD.sub(render, self.template)
