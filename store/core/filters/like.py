"""SQL ``LIKE`` patterns matched in time linear in the text, without backtracking.

A pattern (``%`` any sequence, ``_`` any one character, an optional escape character making the next
``%``, ``_`` or itself literal) is compiled to a position automaton simulated with one integer bit set
per text character (a Shift-And matcher with ``%`` self-loops): bit ``i`` set means "the first ``i``
tokens of the pattern match what was read so far".  Each character costs a few integer operations on
a number of ``len(pattern)`` bits, so a match costs O(len(text) * len(pattern) / 64) word operations
whatever the input -- a regular expression built from the pattern (``.*`` for ``%``) backtracks
exponentially on texts such as ``aaaa...b`` against ``%a%a%a%a%c`` (RabbitMQ shipped such a ReDoS
in its filter's LIKE), which is why no ``re`` is used here.

Runs of ``%`` are collapsed when compiling (``%%`` matches what ``%`` matches), so the epsilon
closure over ``%`` is one shift.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_PATTERN = 1024  # characters of a LIKE pattern (the expression's own length limit is larger)


class PatternError(ValueError):
    """The pattern or its escape is malformed."""


_ANY_ONE, _ANY_SEQ = object(), object()


@dataclass(frozen=True, slots=True)
class LikePattern:
    """A compiled LIKE pattern; ``match(text)`` is linear in ``len(text)``."""

    source: str
    escape: str | None
    length: int = 0  # tokens after collapsing runs of %
    accept: int = 0  # bit of the final state
    seq_mask: int = 0  # positions holding %
    one_mask: int = 0  # positions holding _
    char_masks: dict[str, int] = field(default_factory=dict)  # positions holding each literal char
    start: int = 1

    def match(self, text: str) -> bool:
        masks, one, seq = self.char_masks, self.one_mask, self.seq_mask
        state = self.start
        for ch in text:
            moved = ((state & (masks.get(ch, 0) | one)) << 1) | (state & seq)
            state = moved | ((moved & seq) << 1)  # % may match nothing: skip over it
            if not state:
                return False
        return bool(state & self.accept)


def compile_like(pattern: str, escape: str | None = None) -> LikePattern:
    """Compile ``pattern``; PatternError if it is too long, the escape is not one character, or
    the escape ends the pattern."""
    if len(pattern) > MAX_PATTERN:
        raise PatternError(f"LIKE pattern longer than {MAX_PATTERN} characters")
    if escape is not None and len(escape) != 1:
        raise PatternError("ESCAPE must be a single character")
    tokens: list[object] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if escape is not None and ch == escape:
            if i + 1 >= n:
                raise PatternError("LIKE pattern ends with its escape character")
            tokens.append(pattern[i + 1])  # a literal, whatever it is
            i += 2
            continue
        if ch == "%":
            if not tokens or tokens[-1] is not _ANY_SEQ:
                tokens.append(_ANY_SEQ)
        elif ch == "_":
            tokens.append(_ANY_ONE)
        else:
            tokens.append(ch)
        i += 1
    seq = one = 0
    masks: dict[str, int] = {}
    for pos, token in enumerate(tokens):
        bit = 1 << pos
        if token is _ANY_SEQ:
            seq |= bit
        elif token is _ANY_ONE:
            one |= bit
        elif isinstance(token, str):  # a literal character (the other tokens are the two wildcards)
            masks[token] = masks.get(token, 0) | bit
    start = 1 | ((1 & seq) << 1)
    return LikePattern(pattern, escape, len(tokens), 1 << len(tokens), seq, one, masks, start)
