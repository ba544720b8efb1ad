"""What an agent's reply becomes as an action, and which characters no reply carries.

In: a model's completion (or an action a `solution()` returns). Out: the action `spade rollout`
steps: for a game, `\\boxed{<content>}` of the last balanced `\\boxed{...}`, else the text as it
is; tool-use replies go as they are. Guarantees: pure, stdlib only, linear in the text; lives in
sandbox/ so that validation (sandbox/contract.py) plays a solution's actions through the very
path a model's reply takes (stages/rollout.py imports these names from here).
"""

from __future__ import annotations

import re

BOXED = "\\boxed{"
BRACES_RE = re.compile(r"[{}]")

# C0 controls other than \t and \n, and DEL: a tokenizer's decoded reply never holds them
# (an ordinary "\boxed{...}" literal holds a backspace, "\b", instead of a backslash and b)
UNSENDABLE_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
ESCAPES = {"\x00": "NUL (\"\\0\")", "\x07": "bell (\"\\a\")", "\x08": "backspace (\"\\b\")",
           "\x0b": "vertical tab (\"\\v\")", "\x0c": "form feed (\"\\f\")",
           "\x0d": "carriage return (\"\\r\")", "\x1b": "escape", "\x7f": "DEL"}


def last_boxed(text: str) -> str | None:
    """The content of the last balanced \\boxed{...} in text, or None: of the `\\boxed{`
    whose brace is closed (by the first `}` that balances it), the last one. Linear: one pass
    matches every brace (a stack), then the starts are tried from the last."""
    if BOXED not in text:
        return None
    closes: dict[int, int] = {}
    opened: list[int] = []
    for brace in BRACES_RE.finditer(text):
        if brace.group() == "{":
            opened.append(brace.start())
        elif opened:
            closes[opened.pop()] = brace.start()
    start = text.rfind(BOXED)
    while start != -1:
        end = closes.get(start + len(BOXED) - 1)
        if end is not None:
            return text[start + len(BOXED):end]
        start = text.rfind(BOXED, 0, start)
    return None


def game_action(completion: str) -> str:
    """The action a game gets for a reply: its last balanced box, or the reply as it is."""
    content = last_boxed(completion)
    return completion if content is None else f"\\boxed{{{content}}}"


def as_sent(action: str, domain: str) -> str:
    """`action` rendered as a reply and extracted as `spade rollout` would."""
    return game_action(action) if domain == "game" else action


def unsendable(action: str) -> str | None:
    """The first character of `action` no model reply carries, named (`backspace ("\\b")`,
    `control character U+0001`), or None."""
    found = UNSENDABLE_RE.search(action)
    if not found:
        return None
    char = found.group()
    return ESCAPES.get(char, f"control character U+{ord(char):04X}")


def unsendable_reason(action: str, index: int, seed: int) -> str | None:
    """Why a solution action cannot be what an agent sends, with the fix; None when it can."""
    name = unsendable(action)
    if name is None:
        return None
    fix = ("a backslash before a letter in an ordinary string literal is an escape: write "
           "r\"\\boxed{...}\" (a raw string) or \"\\\\boxed{...}\"")
    return (f"solution() action {index + 1} for seed {seed} holds a {name}, which no model "
            f"reply carries, so only solution() can send it ({action[:60]!r}): {fix}")
