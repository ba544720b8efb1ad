"""Progress lines of long stages when stderr is not a terminal: counts, rate, tokens, ETA."""

import io
import logging

import pytest

from spade_cli import progress
from stages.backends import Completion


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture(autouse=True)
def info_level():
    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.INFO)
    yield root
    root.setLevel(before)


def test_a_line_says_done_total_rate_tokens_and_eta():
    clock, out = Clock(), io.StringIO()
    with progress.Progress("rollout", "plays", interval=0, stream=out, clock=clock) as bar:
        bar.add_total(64)
        clock.now += 9.0
        bar.add_tokens(7308)
        bar.advance(37)
    assert out.getvalue().splitlines()[-1] == \
        "rollout: 37/64 plays, 4.1 plays/s, 812 tok/s, eta 7s"


def test_slow_units_show_seconds_per_unit_and_minutes_of_eta():
    clock, out = Clock(), io.StringIO()
    with progress.Progress("train-grpo", "steps", interval=0, stream=out, clock=clock) as bar:
        clock.now += 62.0
        bar.reached(2, 8, tokens=0)
    assert out.getvalue() == "train-grpo: 2/8 steps, 31.0s/step, eta 3m06s\n"


def test_before_anything_finishes_the_line_says_how_long_it_has_been():
    clock, out = Clock(), io.StringIO()
    with progress.Progress("design", "designs", 24, interval=0, stream=out, clock=clock) as bar:
        clock.now += 75.0
        bar.add_tokens(0)
    assert out.getvalue() == "design: 0/24 designs, 1m15s elapsed\n"


def test_lines_come_once_per_interval():
    clock, out = Clock(), io.StringIO()
    with progress.Progress("hint", "envs", 10, interval=10, stream=out, clock=clock) as bar:
        for _ in range(10):
            clock.now += 3.0
            bar.advance()
    assert [line.split(",")[0] for line in out.getvalue().splitlines()] == \
        ["hint: 4/10 envs", "hint: 8/10 envs"]


def test_quiet_shows_nothing(info_level):
    info_level.setLevel(logging.WARNING)  # spade -q
    out = io.StringIO()
    with progress.Progress("rollout", "plays", 4, interval=0, stream=out) as bar:
        bar.advance(4)
        bar.note("something")
    assert out.getvalue() == ""


def test_counted_backend_adds_completion_tokens_and_passes_the_rest_through():
    class Backend:
        policy = "m"

        def chat(self, conversations, sampling, tools=None):
            return [Completion("ab", [1], [5, 6, 7], [0.0] * 3) for _ in conversations] + \
                [Completion("no ids")]

    bar = progress.Progress("hint", "envs", interval=0, stream=io.StringIO())
    counted = progress.Counted(Backend(), bar)
    assert len(counted.chat([[], []], None)) == 3 and counted.policy == "m"
    assert bar.tokens == 6
