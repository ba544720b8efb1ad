"""stages.report: transcripts of the best and worst plays (hints beside hinted ones), designs with
their verdicts, the collapse alerts atop the page, completion length and throughput per round,
regret rows carried over from earlier rounds, and a page whose size stays bounded.

The run is built here by hand (two rounds, a handful of records) and every expected number below
is worked out from it in the comments."""

import json
import re
from pathlib import Path

import pytest

from stages import report
from stages.records import (Design, Env, Failure, Regret, Rollout, Train, Turn, Validation,
                            dumps)
from stages.report import sections, tables
from stages.report.data import EXAMPLE_CHARS, load_run
from stages.shards import write_atomic

HOSTILE = "$\\undefinedmacro{x}^$ [/] <b>&amp; \x1b]0;title\x07"
HINT = "Try <b>the corner</b> first."


def stage(run: Path, where: str, records, seconds: float | None = None) -> None:
    directory = run / where
    directory.mkdir(parents=True, exist_ok=True)
    for kind in sorted({r.kind for r in records}):
        write_atomic(directory / f"{kind}-00000.jsonl",
                     [dumps(r) for r in records if r.kind == kind])
    if seconds is not None:
        (directory / "_manifest.json").write_text(json.dumps(
            {"stage": directory.name, "complete": True, "stats": {"seconds": seconds}}))


def env(name: str, parents: list[str], hint: str | None = None) -> Env:
    return Env(domain="game", skill="spatial", class_name=name, source=f"# {name}",
               source_hash=name, max_turns=12, parents=parents, hint=hint)


def turn(tokens: int, reward: float = 0.0, text: str = "\\boxed{go}") -> Turn:
    return Turn(action="\\boxed{go}", completion=text, observation="state", reward=reward,
                completion_ids=list(range(tokens)))


def play(env_id: str, seed: int, reward: float, turns: list[Turn], round_: int,
         hint: bool = False, hint_text: str | None = None) -> Rollout:
    return Rollout(env_id=env_id, seed=seed, reward=reward, turns=turns, round=round_,
                   hint=hint, terminated=True, meta={"hint_text": hint_text} if hint else {})


def train(step: int, entropy: float, clip: float, kl: float, lr: float) -> Train:
    return Train(step=step, stats={"loss": 0.1 * step, "entropy": entropy, "clip_frac": clip,
                                   "approx_kl": kl, "lr": lr, "loss_tokens": 100.0,
                                   "agent_adv_mean": 0.0, "agent_adv_std": 0.5},
                 meta={"seconds": 2.0})


LONG = HOSTILE + "y" * 1000  # cut at EXAMPLE_CHARS, the rest counted in the mark


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    run = tmp_path_factory.mktemp("examples") / "run"
    d = [Design(skill="spatial", round=1, slot=slot, completion=f"design {slot} <i>src</i>")
         for slot in range(4)]
    a, b = env("A", [d[0].id]), env("B", ["des_elsewhere"])  # A designed (d0), B start pool
    stage(run, "r01/design", d)
    stage(run, "r01/validate", [a, Validation(check="oracle", round=1, parents=[d[1].id],
                                              error=Failure(type="env.oracle",
                                                            msg="solution() did not win <x>")),
                                Validation(check="trivial", round=1, parents=[d[2].id],
                                           meta={"msg": "a blind player wins"}),
                                Validation(check="parse", round=1, parents=[d[3].id])])
    stage(run, "r01/hint", [a.model_copy(update={"hint": HINT}),
                            b.model_copy(update={"hint": "Hint B"})])
    # no-hint plays, r01/rollout (10 s): A seed 0 (2 turns: 3 + 5 tokens, reward 0.5),
    # A seed 1 (1 turn, 4 tokens, -1: the worst), B seed 0 (10 turns of 2 tokens, 1.0: the best)
    stage(run, "r01/rollout", [
        play(a.id, 0, 0.5, [turn(3), turn(5, 0.5)], 1),
        play(a.id, 1, -1.0, [turn(4, -1.0)], 1),
        play(b.id, 0, 1.0, [turn(2, text=LONG) for _ in range(9)] + [turn(2, 1.0, "last")], 1)],
        seconds=10.0)
    # hinted plays, r01/rollout-hint (5 s): A 1.0 (hint in meta), B 0.0 (hint from its env)
    stage(run, "r01/rollout-hint", [play(a.id, 0, 1.0, [turn(4, 1.0)], 1, True, HINT),
                                    play(b.id, 0, 0.0, [turn(4)], 1, True, None)], seconds=5.0)
    stage(run, "r01/score-regret", [Regret(env_id=a.id, round=1, regret=0.5),
                                    Regret(env_id=b.id, round=1, regret=-1.0)])
    stage(run, "r01/train", [train(1, 7.6, 0.1, 0.01, 1e-6), train(2, 5.0, 0.7, 0.5, 1e-6)])
    # r02: only A is played (2 plays of 10 tokens, both 0) in 4 s; B is scored all the same
    stage(run, "r02/rollout", [play(a.id, seed, 0.0, [turn(10)], 2) for seed in (0, 1)],
          seconds=4.0)
    stage(run, "r02/score-regret", [Regret(env_id=a.id, round=2, regret=0.1),
                                    Regret(env_id=b.id, round=2, regret=0.2)])
    stage(run, "r02/train", [train(3, 0.5, 0.6, 2.0, 5e-7), train(4, 0.05, 1.0, 82.0, 5e-7),
                             train(5, 3e-5, 1.0, 10.0, 5e-7)])
    result = report.build(run, run / "report", embedder=None)
    return result, result.path.read_text()


def section(page: str, name: str) -> str:
    return re.search(rf'<section id="{name}" .*?</section>', page, re.S).group(0)


def test_best_and_worst_plays_are_transcripts_with_the_hint_beside_hinted_ones(built):
    result, page = built
    shown = result.numbers["examples"]
    # r01: best no-hint B seed 0 (1.0), worst A seed 1 (-1.0); hinted best A (1.0), worst B (0)
    assert {k: (v["reward"]) for k, v in shown[1].items()} == {
        "no_hint_best": 1.0, "no_hint_worst": -1.0, "hint_best": 1.0, "hint_worst": 0.0}
    # r02: both plays 0: the first read is best and worst, shown once
    assert list(shown[2]) == ["no_hint_best"]
    body = section(page, "examples")
    assert body.index("r02: 1 plays") < body.index("r01: 4 plays")  # newest round first
    assert "best no-hint play: env" in body and "worst hinted play" in body
    # the hint from the rollout's meta, and B's from its env record, both escaped
    assert "<strong>hint:</strong> Try &lt;b&gt;the corner&lt;/b&gt; first." in body
    assert "<strong>hint:</strong> Hint B" in body
    assert body.count("<strong>hint:</strong>") == 2  # no-hint plays show none


def test_long_texts_and_plays_are_cut_with_a_mark_and_escaped(built):
    _, page = built
    body = section(page, "examples")
    # B's play: 10 turns, kept the first 5 and the last (10th); 4 left out
    assert "[4 turns not shown]" in body and "<td>10</td><td>last</td>" in body
    assert f"[cut: {len(LONG) - EXAMPLE_CHARS} more characters]" in body
    assert "&lt;b&gt;&amp;amp;" in body and "<b>" not in body and "<i>" not in body


def test_designs_are_shown_with_their_verdict_and_reject_reason(built):
    result, page = built
    # 1 accepted, 3 rejected: at most DESIGNS_SHOWN (2) of each verdict, in the order read
    assert [(d["verdict"], d["reason"]) for d in result.numbers["design_examples"][1]] == [
        ("accepted", "—"), ("rejected: oracle", "solution() did not win <x>"),
        ("rejected: trivial", "a blind player wins")]
    body = section(page, "examples")
    assert "solution() did not win &lt;x&gt;" in body and "design 0 &lt;i&gt;src" in body
    assert "rejected: parse" not in body


def test_collapse_is_said_atop_the_page_one_line_per_problem(built):
    result, page = built
    alerts = re.search(r'<div class="alerts" id="alerts">.*?</div>', page, re.S).group(0)
    assert page.index('id="alerts"') < page.index('<section id="no-hint"')
    lines = re.findall(r"<li>([^<]*)</li>", alerts)
    # entropy floor 1% of 7.6 = 0.076: 0.05 (step 4, r02) and 3e-5 (step 5) are below it
    # clip_frac > 0.5: 0.7 (step 2, r01), 0.6, 1.0, 1.0; approx_kl > 1: 2 (step 3, r02), 82, 10
    assert lines == [
        "Entropy collapse: below 1% of its first value (7.6 at step 1) from step 4 (r02) on: "
        "2 of 5 steps past it, lowest 3e-05 at step 5.",
        "Clip_frac above 0.5 from step 2 (r01) on: 4 of 5 steps past it, peak 1 at step 4.",
        "Approx_kl above 1 from step 3 (r02) on: 3 of 5 steps past it, peak 82 at step 4."]
    assert [(c["stat"], c["round"]) for c in result.numbers["collapse"]] == [
        ("entropy", 2), ("clip_frac", 1), ("approx_kl", 2)]


def test_healthy_or_flat_training_raises_no_alert(built_flat, run_dir):
    # the conftest runs: entropy 2.0 -> 1.4 and 7.59 flat, clip_frac <= 0.05, approx_kl <= 0.012
    page = built_flat.path.read_text()
    assert built_flat.numbers["collapse"] == [] and 'id="alerts"' not in page
    assert tables.collapse(load_run(run_dir)) == []


def test_thresholds_are_documented_constants():
    assert (tables.ENTROPY_FLOOR, tables.CLIP_FRAC_MAX, tables.APPROX_KL_MAX) == (0.01, 0.5, 1.0)


def test_completion_length_and_throughput_per_round(built, metric):
    result, page = built
    numbers = result.numbers
    # r01: tokens 3+5+4+10*2 (no-hint) + 4+4 (hinted) = 40 over 2+1+10+1+1 = 15 completions;
    #      5 plays and 40 tokens in 10 + 5 s; r02: 20 tokens / 2 completions, 2 plays in 4 s
    assert numbers["completion_tokens"] == pytest.approx({1: 40 / 15, 2: 10.0})
    assert numbers["plays_per_s"] == pytest.approx({1: 5 / 15, 2: 0.5})
    assert numbers["tokens_per_s"] == pytest.approx({1: 40 / 15, 2: 5.0})
    # train: 100 loss tokens per 2 s step in every round: the same, said in words
    assert numbers["train_tokens_per_s"] == pytest.approx({1: 50.0, 2: 50.0})
    assert metric(page, "completion_tokens", 1) == "2.7"
    assert metric(page, "plays_per_s", 2) == "0.500"
    body = section(page, "throughput")
    assert "train tokens/s: 50 in every round." in body and 'src="throughput.png"' in body


def test_throughput_without_manifests_or_token_ids_is_said(run_dir, tmp_path):
    # the conftest run: no completion_ids, manifests without seconds
    result = report.build(run_dir, tmp_path, embedder=None)
    body = section(result.path.read_text(), "throughput")
    assert "no completion lengths: the plays record no completion_ids." in body
    assert "no rollout throughput: no rollout stage directory has a _manifest.json" in body
    assert "throughput.png" not in body


def test_the_learning_rate_is_a_training_curve(built):
    result, page = built
    body = section(page, "train")
    assert "<td>lr</td><td>all</td><td>5</td><td>1e-06</td><td>5e-07</td>" in body
    assert "lr" not in result.numbers["flat_stats"]


def test_regret_rows_carried_over_from_earlier_rounds_are_marked(built, metric):
    result, page = built
    # r02 scores A (played in r02) and B (last played in r01): B is carried over
    assert result.numbers["regret_carried"] == {1: 0, 2: 1}
    b = result.numbers["regret_carried_envs"][2][0]
    assert metric(page, "carried_over", 1) == "0" and metric(page, "carried_over", 2) == "1"
    assert "r02: 1 of 2 scored envs carried over: no play of theirs in r02" in page
    assert b in section(page, "regret")


def test_the_examples_keep_the_page_bounded(tmp_path):
    # 6 rounds of 25-turn plays whose every text is 50k characters of markup: only the
    # newest EXAMPLE_ROUNDS rounds, every text cut, the section under its cap
    big = "<&>" * 50_000
    for number in range(6):
        stage(tmp_path, f"r{number:02d}/rollout", [
            play(f"env_{number}_{i}", i, float(i), [turn(1, text=big)] * 25, number)
            for i in range(3)] + [play(f"env_{number}_h", 0, 1.0, [turn(1, text=big)] * 25,
                                       number, True, big)])
    result = report.build(tmp_path, tmp_path / "out", embedder=None)
    page = result.path.read_text()
    assert sorted(result.numbers["examples"]) == [3, 4, 5]
    assert len(section(page, "examples")) < sections.EXAMPLES_MAX_CHARS + 5_000
    assert len(page) < 200_000
