"""The jail's math_verify stand-in: the answers the reference's games compare with
`verify(parse(answer), parse(solution))` come out equal or not as they should, agreeing with the
real package where it is installed, and nothing raises."""

import pytest

from sandbox import math_verify_shim as shim

EQUAL = [("\\frac{3}{4}", "0.75"), ("3/4", "\\dfrac{3}{4}"), ("\\boxed{12}", "12"),
         ("$1,000$", "1000"), ("(2, 3)", "2,3"), ("2^{10}", "1024"), ("1/3", "0.3333333"),
         ("-5", "-5.0"), ("\\sqrt{2}", "1.41421356"), ("50\\%", "50"), ("\\text{north}", "north"),
         ("2\\cdot 3", "6")]
DIFFERENT = [("1/3", "0.333"), ("2", "3"), ("(2, 3)", "(3, 2)"), ("abc", "abd"),
             ("north", "North"), ("x+1", "1+x"), ("1,000", "1")]


@pytest.mark.parametrize("gold, answer", EQUAL)
def test_equal_answers_verify_both_ways(gold, answer):
    assert shim.verify(shim.parse(gold), shim.parse(answer))
    assert shim.verify(shim.parse(answer), shim.parse(gold))


@pytest.mark.parametrize("gold, answer", DIFFERENT)
def test_different_answers_do_not_verify(gold, answer):
    assert not shim.verify(shim.parse(gold), shim.parse(answer))


@pytest.mark.parametrize("text", ["", "}", "\\frac{", "\\sqrt{-1}", "10^{10^{10^{10}}}", "1/0",
                                  "(" * 500, "9" * 5000, None, 3.5, "\\boxed{\\boxed{"])
def test_nothing_raises_and_huge_powers_are_not_computed(text):
    parsed = shim.parse(text)
    assert isinstance(parsed, list)
    assert shim.verify(parsed, parsed) in (True, False)


@pytest.mark.parametrize("gold, answer", EQUAL[:4] + EQUAL[6:8] + DIFFERENT[:3])
def test_it_agrees_with_the_real_package_on_delimited_math(gold, answer):
    real = pytest.importorskip("math_verify")
    delimited = [text if text.startswith(("$", "\\boxed")) else f"${text}$"
                 for text in (gold, answer)]
    assert shim.verify(shim.parse(gold), shim.parse(answer)) == \
        real.verify(real.parse(delimited[0]), real.parse(delimited[1]))
