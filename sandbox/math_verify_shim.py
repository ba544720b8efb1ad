"""`math_verify` inside the jail: a stand-in for its `parse` and `verify`, in pure Python.

The reference code's game templates put `from math_verify import parse, verify` in every env
(`verify(parse(answer), parse(solution))`, inside try/except). The jail holds no third-party
package, so the worker offers this module under that name, read-only; validation accepts no
other name from it.
In: answers as text: "\\frac{3}{4}", "0.75", "\\boxed{12}", "$1,000$", "(2, 3)", "2^{10}".
Out: parse(text) -> candidates (the value as a Fraction, or a tuple of them, when the text is
arithmetic: exact, except roots, pi and e; always the text itself, normalised);
verify(gold, target) -> True when a candidate of one equals a candidate of the other: numbers
within 10^-float_rounding (relative to their size when larger than 1), tuples element by
element, texts when equal once markup and spaces are dropped.
Guarantees: never raises. Unlike the real package it does no algebra: "x+1" and "1+x" are two
texts, so they differ.
"""

import ast
import math
import re
from fractions import Fraction

MAX_TEXT = 2000
MAX_BITS = 1 << 16  # an exact power larger than this is computed as a float
WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|operatorname)\{([^{}]*)\}")
DROPPED = re.compile(r"\\left|\\right|\\displaystyle|\\[,;:! ]|\$|\\\(|\\\)|\\\[|\\\]|~"
                     r"|\^\{?\\circ\}?|°|\\%|%")
THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
CONSTANTS = {"pi": Fraction(math.pi), "e": Fraction(math.e)}


def parse(text, *args, **kwargs):
    """[value, text] for arithmetic text, [text] for anything else."""
    try:
        normal = _normal(str(text)[:MAX_TEXT])
        value = _evaluate(_python(normal))
        return [normal] if value is None else [value, normal]
    except Exception:  # noqa: BLE001 - a stand-in must not raise where the real one would not
        return []


def verify(gold, target, float_rounding=6, *args, **kwargs):
    try:
        golds, targets = _candidates(gold), _candidates(target)
        return any(_equal(a, b, float_rounding) for a in golds for b in targets)
    except Exception:  # noqa: BLE001
        return False


def _candidates(parsed):
    return parsed if isinstance(parsed, list) else parse(parsed)


def _normal(text):
    """The answer inside the last \\boxed{}, without markup, spaces or thousands commas."""
    boxed = text.rfind("\\boxed{")
    if boxed >= 0:
        text = _braced(text, boxed + len("\\boxed"))
    text = WRAPPERS.sub(r"\1", text)
    text = DROPPED.sub("", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = "".join(text.split()).rstrip(".")
    return text.replace(",", "") if THOUSANDS.match(text) else text


def _braced(text, start):
    """The content of the {...} group opening at text[start]."""
    depth = 0
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[start + 1:index]
    return text[start + 1:]


def _python(text):
    """LaTeX arithmetic as a Python expression: \\frac{a}{b} -> ((a)/(b)), ^ -> **, ..."""
    for name, template in (("\\frac", "(({0})/({1}))"), ("\\sqrt", "(({0})**(1/2))")):
        while name + "{" in text:
            start = text.index(name + "{")
            first = _braced(text, start + len(name))
            after = start + len(name) + len(first) + 2
            if name == "\\frac":
                second = _braced(text, after)
                rest = text[after + len(second) + 2:]
                text = text[:start] + template.format(first, second) + rest
            else:
                text = text[:start] + template.format(first) + text[after:]
    for latex, python in (("\\cdot", "*"), ("\\times", "*"), ("\\div", "/"), ("^", "**"),
                          ("{", "("), ("}", ")"), ("\\pi", "pi")):
        text = text.replace(latex, python)
    return text


def _evaluate(expression):
    try:
        return _value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError, TypeError):
        return None


def _value(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(repr(node.value)) if isinstance(node.value, float) else Fraction(node.value)
    if isinstance(node, ast.Name) and node.id in CONSTANTS:
        return CONSTANTS[node.id]
    if isinstance(node, ast.Tuple):
        return tuple(_value(item) for item in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        operators = {ast.Add: lambda: left + right, ast.Sub: lambda: left - right,
                     ast.Mult: lambda: left * right, ast.Div: lambda: left / right}
        if type(node.op) in operators:
            return operators[type(node.op)]()
    raise ValueError("not arithmetic")


def _power(base, exponent):
    size = max(base.numerator.bit_length(), base.denominator.bit_length())
    if exponent.denominator == 1 and abs(exponent) * size <= MAX_BITS:
        return base ** int(exponent)
    return Fraction(float(base) ** float(exponent))  # a root: a float, made exact for equality


def _equal(a, b, float_rounding):
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) \
            and all(_equal(x, y, float_rounding) for x, y in zip(a, b))
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        tolerance = Fraction(1, 10 ** float_rounding) * max(1, abs(a), abs(b))
        return abs(a - b) <= tolerance
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return False
