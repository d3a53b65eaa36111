"""The debugger's command language (pure: text in, records out).

``help``, ``list``, ``attach <actor> <rank>``, ``detach``, ``cast <actor> ranks(...) <pdb
command>``, ``continue``, ``quit`` (and their one-letter forms ``h``, ``l``, ``a``, ``c``,
``q``). ``ranks(...)`` takes a rank (``ranks(3)``), a list (``ranks(1,3,5)``), a slice
(``ranks(1:10:2)``, any part may be left out) or dims (``ranks(dp=(1,3), tp=2:8, pp=0)``).
"""

from __future__ import annotations

import re
import sys

import attrs

#: A rank selection: one rank, a list, a range, or per dim one of those.
Ranks = int | tuple[int, ...] | range | dict[str, int | tuple[int, ...] | range]


@attrs.frozen
class Help:
    pass


@attrs.frozen
class ListSessions:
    pass


@attrs.frozen
class Attach:
    actor: str
    rank: int


@attrs.frozen
class Detach:
    pass


@attrs.frozen
class Cast:
    actor: str
    ranks: Ranks
    command: str


@attrs.frozen
class Continue:
    pass


@attrs.frozen
class Quit:
    pass


Command = Help | ListSessions | Attach | Detach | Cast | Continue | Quit

_ACTOR = r"[-_.a-zA-Z0-9]+"
_ATTACH = re.compile(rf"^(?:a|attach)\s+({_ACTOR})\s+(\d+)$")
_CAST = re.compile(rf"^cast\s+({_ACTOR})\s*ranks\(((?:[^()]|\([^()]*\))*)\)\s*(\S.*)$")
_WORDS: dict[str, Command] = {
    "h": Help(),
    "help": Help(),
    "l": ListSessions(),
    "list": ListSessions(),
    "detach": Detach(),
    "c": Continue(),
    "continue": Continue(),
    "q": Quit(),
    "quit": Quit(),
}
_INT = re.compile(r"^\s*(\d+)\s*$")
_SLICE = re.compile(r"^\s*(\d*)\s*:\s*(\d*)\s*(?::\s*(\d*)\s*)?$")
_LIST = re.compile(r"^\s*\d+\s*(?:,\s*\d+\s*)+$")
_DIM = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\([^)]*\)|[^,()]+)\s*(?:,|$)")


def parse(line: str) -> Command:
    """The command ``line`` names; ``ValueError`` (saying what was expected) otherwise."""
    text = line.strip()
    if text in _WORDS:
        return _WORDS[text]
    match = _ATTACH.match(text)
    if match:
        return Attach(match[1], int(match[2]))
    match = _CAST.match(text)
    if match:
        return Cast(match[1], parse_ranks(match[2]), match[3].strip())
    head = text.split()[0] if text else ""
    if head in ("a", "attach"):
        raise ValueError(f"expected 'attach <actor> <rank>' (got {text!r})")
    if head == "cast":
        raise ValueError(f"expected 'cast <actor> ranks(...) <pdb command>' (got {text!r})")
    raise ValueError(
        f"unknown command {text!r}; expected one of help, list, attach <actor> <rank>, "
        "cast <actor> ranks(...) <pdb command>, continue, quit"
    )


def _one(text: str) -> int | tuple[int, ...] | range:
    """A rank, a slice or a comma list."""
    match = _INT.match(text)
    if match:
        return int(match[1])
    match = _SLICE.match(text)
    if match:
        start = int(match[1]) if match[1] else 0
        stop = int(match[2]) if match[2] else sys.maxsize
        step = int(match[3]) if match[3] else 1
        if step == 0:
            raise ValueError(f"a rank slice's step must not be 0 (got {text.strip()!r})")
        return range(start, stop, step)
    if _LIST.match(text):
        return tuple(int(part) for part in text.split(","))
    raise ValueError(
        f"expected a rank, a list like 1,3,5 or a slice like 1:10:2 (got {text.strip()!r})"
    )


def parse_ranks(text: str) -> Ranks:
    """The inside of ``ranks(...)``."""
    if "=" not in text:
        return _one(text)
    dims: dict[str, int | tuple[int, ...] | range] = {}
    position = 0
    body = text.strip()
    while position < len(body):
        match = _DIM.match(body, position)
        if not match or match.end() == position:
            raise ValueError(
                f"expected dims like dp=(1,3), tp=2:8 inside ranks(...) (got {body!r})"
            )
        value = match[2].strip()
        if value.startswith("("):
            inner = value[1:-1]
            dims[match[1]] = _one(inner) if not _INT.match(inner) else (int(inner),)
        else:
            dims[match[1]] = _one(value)
        position = match.end()
    return dims


def selects(ranks: Ranks, rank: int, coords: dict[str, int]) -> bool:
    """Whether a session at ``rank`` (``coords`` by dim) is in ``ranks``."""
    if isinstance(ranks, dict):
        for dim, want in ranks.items():
            if dim not in coords or not _within(want, coords[dim]):
                return False
        return True
    return _within(ranks, rank)


def _within(want: int | tuple[int, ...] | range, value: int) -> bool:
    if isinstance(want, int):
        return value == want
    return value in want
