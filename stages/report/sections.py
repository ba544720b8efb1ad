"""The report's sections: each turns a table of stages.report.tables into words, a chart, a table.

In: a `RunData`, the `Charts` to draw with, and a `numbers` dict each section fills with what it
shows (tests and `spade report` read it). Out: `Section`s (id, title, HTML body).
Guarantees: every section renders with whatever data the run has and says what is missing
(retention alone is None, left out, in a run without retention evals); a chart is drawn only
where its numbers vary: a series that is the same in every round, or flat
training, is said in words instead ("no learning signal: ..."); the start pool is shown apart
from the model's designs, labelled as such.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

from stages.records import Memory
from stages.report import plots, tables
from stages.report.data import (EXAMPLE_CHARS, EXAMPLE_TURNS, SOURCE_CHARS, Example, RunData,
                                cut)
from stages.report.diversity import (PAPER_VENDI_N, Embedder, EmbedderUnavailable,
                                     default_embedder, diversity)
from stages.report.page import Cell, Section, designer_text, esc, metric, num, pct, say, table
from stages.report.plots import Charts, note

Numbers = dict[str, Any]
EXAMPLE_ROUNDS = 3  # rounds whose plays are shown as transcripts (the newest ones)
DESIGNS_SHOWN = 2  # per round and verdict (accepted, rejected, not judged)
EXAMPLES_MAX_CHARS = 150_000  # the examples section's HTML stops growing here (page size bound)
RETENTION_ENVS_SHOWN = 40  # rows of the retention section's per-env table (a bounded page)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _value(value: float) -> str:
    if 0 < abs(value) <= tables.NOISE_FLOOR:
        return f"≈ 0 (at most {value:.1g})"
    return f"{value:.4g}"


def no_hint(run: RunData, charts: Charts, numbers: Numbers) -> tuple[Section, tuple[str, str]]:
    """The headline: the agent's mean no-hint reward per round, and its change since the first."""
    title = "No-hint reward per round"
    rewards = tables.no_hint_rewards(run)
    numbers["no_hint_reward"] = {n: r.mean for n, r in rewards.items()}
    if not rewards:
        return (Section("no-hint", title, note("no no-hint rollouts in this run")),
                ("no-hint reward", "none (no no-hint plays)"))
    rounds = sorted(rewards)
    first, last = rewards[rounds[0]].mean, rewards[rounds[-1]].mean
    headline = f"{first:.3f} (r{rounds[0]:02d})"
    if len(rounds) > 1:
        headline += f" → {last:.3f} (r{rounds[-1]:02d}), change {last - first:+.3f}"
    rows = [[f"r{n:02d}", f"{r.envs} ({r.pool})", str(r.plays),
             metric(num(r.mean), "no_hint_reward", n), pct(r.won), f"{r.mean - first:+.3f}"]
            for n, r in sorted(rewards.items())]
    means = [r.mean for r in rewards.values()]
    if len(rounds) < 2:
        chart = say("One round of no-hint plays: nothing to compare it with yet.")
    elif tables.flat(means):
        chart = note(f"The mean no-hint reward is {first:.3f} in every round: the agent's "
                     f"no-hint play did not change.")
    else:
        chart = plots.chart_no_hint(charts, rewards)
    body = (say("The agent's mean reward over its no-hint plays in each round (every play "
                "counts once; start-pool envs included): the number the loop is meant to raise.")
            + chart + table(["round", "envs (of them start pool)", "plays", "mean reward",
                             "plays won (reward > 0)", "change since first round"], rows))
    return Section("no-hint", title, body), ("no-hint reward", headline)


def overview(run: RunData) -> Section:
    kinds = ["design", "env", "validation", "rollout", "regret", "train", "eval", "memory"]
    if not run.all_rounds():
        return Section("overview", "Overview", note("no round directories (r<NN>/) in this run"))
    rows = [[f"r{n:02d}"] + [str(run.counts[n][k]) if run.counts[n][k] else "·" for k in kinds]
            for n in run.all_rounds()]
    body = (say(f"{run.shards} shards, {run.records} records read (duplicates, such as env "
                f"records re-emitted by the hint stage, counted once below).")
            + table(["round"] + kinds, rows, "counts"))
    return Section("overview", "Overview: records per round", body)


def wins(run: RunData, charts: Charts, numbers: Numbers) -> Section:
    title = "Win rates and learnable share"
    found = tables.win_rates(run)
    numbers["learnable_share"] = {n: w.learnable_share for n, w in found.items()}
    numbers["win_source"] = {n: w.source for n, w in found.items()}
    if not found:
        return Section("win-rate", title,
                       note("no regret records and no no-hint rollouts in this run"))
    rows = [[f"r{n:02d}", w.source, f"{len(w.wins)} ({w.pool})", num(tables.mean(w.wins)),
             metric(pct(w.learnable_share), "learnable_share", n)]
            for n, w in sorted(found.items())]
    every_win = [x for w in found.values() for x in w.wins]
    if tables.flat(every_win):
        charts_html = note(f"Every env's win rate is {every_win[0]:.2f} in every round: no "
                           f"env is learnable yet.")
    else:
        shares = [(n, w.learnable_share) for n, w in sorted(found.items())]
        charts_html = plots.chart_wins(charts, found) + (
            plots.chart_line(charts, "learnable_share.png", "learnable share per round", shares,
                             "learnable share", (0, 1.05))
            if len(shares) > 1 and not tables.flat([s for _, s in shares]) else "")
    body = (say(f"Win per env: the regret records' win, the mean no-hint reward over the "
                f"window (rewards run from -1 to 1: it is what the plateau scores, the "
                f"reference's win rate), for scored envs; where a round has no regret records, "
                f"the share of its no-hint plays with reward > 0 (orange). Learnable: win in "
                f"[{tables.LEARNABLE[0]}, {tables.LEARNABLE[1]}] (green band).")
            + charts_html + table(["round", "source", "envs (of them start pool)",
                                   "mean win (mean reward)",
                                   "learnable share"], rows))
    return Section("win-rate", title, body)


def regret(run: RunData, charts: Charts, numbers: Numbers) -> Section:
    title = "Regret and designer reward"
    stats = tables.regret_stats(run)
    numbers["regret"] = stats
    carried = tables.carried_over(run)
    numbers["regret_carried"] = {n: len(envs) for n, envs in carried.items()}
    numbers["regret_carried_envs"] = carried
    if not stats:
        return Section("regret", title, note("no regret records in this run"))
    rows = []
    for n, s in sorted(stats.items()):
        r, d = s["regret"], s["designer_reward"]
        rows.append([f"r{n:02d}", str(r.n if r else 0),
                     metric(num(r and r.mean), "regret_mean", n), num(r and r.std),
                     num(r and r.min), num(r and r.median), num(r and r.max), str(s["invalid"]),
                     metric(f'{s["hint_leaks"]}/{s["envs"]}', "hint_leaks", n),
                     metric(str(s["shortcuts"]), "shortcuts", n),
                     num(s["judging_seconds"], 1),
                     metric(str(s["at_chance"]), "at_chance", n),
                     metric(str(len(carried.get(n, []))), "carried_over", n),
                     str(d.n if d else 0), metric(num(d and d.mean), "designer_reward_mean", n),
                     num(d and d.std), num(d and d.min), num(d and d.max)])
    drawn, words = [], []
    for key, missing, same in (
            ("regret", "No regret: every scored env was broken or rejected.",
             "The regret of every scored env is {:.3f} in every round."),
            ("designer_reward", "No designer reward: none of this run's designs was scored.",
             "The designer reward of every design is {:.3f} in every round.")):
        ends = [x for s in stats.values() if s[key] is not None for x in (s[key].min, s[key].max)]
        if not ends or tables.flat(ends):
            words.append(same.format(ends[0]) if ends else missing)
        else:
            drawn.append(key)
    stale = [note(f"r{n:02d}: {len(envs)} of {s['envs']} scored envs carried over: no play of "
                  f"theirs in r{n:02d}, so their regret and win are earlier rounds' plays, not "
                  f"new evidence ({', '.join(envs[:5])}{' …' if len(envs) > 5 else ''}).")
             for n, s in sorted(stats.items()) if (envs := carried.get(n))]
    body = (say("Regret = mean hinted reward − mean no-hint reward, over scored envs (rejected "
                "and broken designs left out; start-pool envs in). Designer reward over this "
                "run's scored designs, rejected ones included (they earn the invalid penalty); "
                "the start pool is not the model's design and is left out. Hint leaks: envs whose hint, "
                "played alone with no model, wins most validation seeds (they earn no designer "
                "reward), or whose hinted winners' actions win other seeds when replayed. "
                "Shortcuts: envs whose no-hint winners' actions win other seeds of the env "
                "beyond chance, replayed as plays after each rollout (no designer reward, their "
                "plays do not train, and they are not played again in their set); replay "
                "jail-s is what those replays cost. At chance: scored envs whose no-hint win "
                "is within two standard "
                "errors of what a blind player wins (another seed's solution replayed): the "
                "difficulty band pays their luck unless score-regret runs --chance-adjusted.")
            + "".join(note(w) for w in words) + "".join(stale)
            + (plots.chart_spreads(charts, stats, drawn) if drawn else "")
            + table(["round", "envs", "regret mean", "std", "min", "median", "max", "invalid",
                     "hint leaks", "shortcuts", "replay jail-s", "at chance",
                     "carried over (not played this round)",
                     "designs", "designer mean", "std", "min", "max"], rows))
    return Section("regret", title, body)


def _acceptance_row(where: str, attempt: str, acc: tables.Acceptance, rate: Cell) -> list[Cell]:
    reasons = ", ".join(f"{check} {count}" for check, count in acc.reasons.most_common())
    return [where, attempt, str(acc.designs), str(acc.accepted), str(acc.rejected), rate,
            reasons or "—", str(acc.unjudged)]


def validation(run: RunData, charts: Charts, numbers: Numbers) -> Section:
    title = "Validation: acceptance of the model's designs"
    found = tables.acceptance(run)
    overall = tables.acceptance_of(tables.verdicts(run))
    pool = sum(len(envs) for envs in run.envs_of("pool").values())
    numbers["acceptance"] = {n: a[None].rate for n, a in found.items()}
    numbers["acceptance_attempts"] = {n: {k: v.rate for k, v in a.items() if k is not None}
                                      for n, a in found.items()}
    numbers["acceptance_overall"] = overall.rate
    numbers["reject_reasons"] = {n: dict(a[None].reasons) for n, a in found.items()}
    start = (say(f"Start pool: {pool} envs joined the first env set without being designed "
                 f"(the recipe's start_pool: {(run.recipe or {}).get('start_pool', '—')}); they "
                 f"are not counted here.") if pool else "")
    designer = say(f"Designer: {designer_text(run.recipe)}.")
    if not found:
        return Section("validation", title,
                       designer + note("no designs or rejects in this run") + start)
    rows = []
    for n, attempts in found.items():
        rows.append(_acceptance_row(f"r{n:02d}", "all", attempts[None],
                                    metric(pct(attempts[None].rate), "acceptance_rate", n)))
        if len(attempts) > 2:  # more than one attempt: one row each
            rows += [_acceptance_row(f"r{n:02d}", f"a{a}", acc, metric(
                pct(acc.rate), "acceptance_rate", n, attempt=str(a)))
                for a, acc in attempts.items() if a is not None]
    rows.append(_acceptance_row("all rounds", "all", overall,
                                metric(pct(overall.rate), "acceptance_rate", "all")))
    by_turn = tables.turn_yield(run)
    numbers["slot_yield_by_turn"] = {n: [filled / slots if slots else None
                                         for filled, slots in turns]
                                     for n, turns in by_turn.items()}
    reasons = {n: a[None].reasons for n, a in found.items()}
    captions = {n: f"{a[None].accepted} of {a[None].designs} accepted" for n, a in found.items()}
    chart = (plots.chart_stacked(charts, "validation.png", "reject reasons per round", reasons,
                                 "rejected designs", captions)
             if overall.rejected else say("No design was rejected."))
    body = (designer
            + say(f"Acceptance rate = designs accepted by every check / designs judged, per "
                  f"round, per attempt (a later attempt redesigns the slots still rejected) and "
                  f"over the run: {overall.accepted} of {overall.designs} designs accepted. "
                  f"Reject reasons are the failing check (an audit reject after validation "
                  f"passed counts as audit).")
            + start + chart + table(["round", "attempt", "designs", "accepted", "rejected",
                                     "acceptance rate", "reject reasons", "not judged"], rows)
            + _turn_yield_table(by_turn))
    return Section("validation", title, body)


def _turn_yield_table(by_turn: dict[int, list[tuple[int, int]]]) -> str:
    """Slots filled by designer turn, where repairs ran: turn 1, after one repair, ..."""
    if not by_turn:
        return ""
    turns = max(len(t) for t in by_turn.values())
    heads = ["turn 1"] + [f"after {n} repair{'s' if n > 1 else ''}" for n in range(1, turns)]
    rows = [[f"r{n:02d}", str(found[0][1])] + [f"{filled} ({pct(filled / slots)})"
                                               for filled, slots in found]
            + ["—"] * (turns - len(found)) for n, found in by_turn.items()]
    return (say("Slots filled by designer turn: a repair goes on with a rejected design's "
                "conversation, telling the designer which check failed and why.")
            + table(["round", "slots", *heads], rows))


def skills(run: RunData, charts: Charts, numbers: Numbers) -> Section:
    title = "Skill mix"
    mix, pool = tables.skill_mix(run), tables.pool_skills(run)
    numbers["skills"] = {n: dict(c) for n, c in mix.items()}
    numbers["pool_skills"] = dict(pool)
    if not mix and not pool:
        return Section("skills", title, note("no env records in this run"))
    names = sorted({s for c in [*mix.values(), pool] for s in c})
    rows = [[f"r{n:02d}: accepted designs"] + [str(mix[n][s]) for s in names] for n in sorted(mix)]
    if pool:
        rows.append(["start pool (not designed)"] + [str(pool[s]) for s in names])
    chart = (plots.chart_stacked(charts, "skills.png", "skill mix of accepted designs per round",
                                 mix, "accepted designs")
             if mix else note("No design of this run was accepted: no skill mix of designs."))
    return Section("skills", title, chart + table(["envs"] + names, rows))


def diversity_section(run: RunData, charts: Charts, numbers: Numbers,
                      embedder: Embedder | Literal["auto"] | None,
                      warnings: list[str]) -> Section:
    title = "Diversity (Vendi score)"
    if not any(run.envs.values()):
        return Section("diversity", title, note("no env records in this run"))
    if embedder is None:
        return Section("diversity", title, note("diversity not computed (--no-diversity)"))
    try:
        values = diversity(run, default_embedder() if embedder == "auto" else embedder)
    except EmbedderUnavailable as exc:
        warnings.append(f"diversity not computed: {exc}")
        return Section("diversity", title, note(f"Diversity not computed: {exc}."))
    except Exception as exc:  # the rest of the report is still worth having
        warnings.append(f"diversity not computed: {type(exc).__name__}: {exc}")
        return Section("diversity", title,
                       note(f"Diversity not computed: {type(exc).__name__}: {exc}"))
    numbers["vendi"] = {n: d.vendi for n, d in values.designed.items()}
    numbers["vendi_n"] = {n: d.vendi_n for n, d in values.designed.items()}
    numbers["vendi_pool"] = values.pool and values.pool.vendi
    rows = [[f"r{n:02d}: accepted designs", str(d.n), metric(num(d.vendi, 2), "vendi", n),
             metric(num(d.vendi_n, 2), "vendi_n", n)] for n, d in sorted(values.designed.items())]
    if values.pool:
        rows.append(["start pool (not designed)", str(values.pool.n),
                     metric(num(values.pool.vendi, 2), "vendi", "pool"),
                     metric(num(values.pool.vendi_n, 2), "vendi_n", "pool")])
    chart = (plots.chart_diversity(charts, values.designed) if values.designed
             else note("No design of this run was accepted: no diversity of designs."))
    paper = ", ".join(f"{value} {label}" for label, value in PAPER_VENDI_N.items())
    body = (say(f"Vendi score of each round's accepted designs, and separately of the start "
                f"pool: exp(entropy of the eigenvalues of K/n), K the cosine similarities of "
                f"all-MiniLM-L6-v2 embeddings of each source's first {SOURCE_CHARS} characters. "
                f"1 = all alike, n = all different. SPADE reports Vendi/n per batch of 24: "
                f"{paper}.")
            + chart + table(["envs", "n", "Vendi", "Vendi / n"], rows))
    return Section("diversity", title, body)


def evaluation(run: RunData, charts: Charts, numbers: Numbers) -> Section:
    series = tables.eval_series(run)
    numbers["eval"] = {name: [(n, e.score) for n, e in points] for name, points in series.items()}
    if not series:
        extra = f" ({run.failed_evals} failed roll-ups)" if run.failed_evals else ""
        return Section("eval", "Evaluation", note(f"no eval records in this run{extra}"))
    rows = [[name, f"r{n:02d}", metric(num(e.score), "eval_score", n), num(e.ci_low),
             num(e.ci_high), str(e.samples)] for name, points in series.items()
            for n, e in points]
    scores = [e.score for points in series.values() for _, e in points]
    chart = (note(f"Every suite scored {scores[0]:.3f} in every round evaluated: nothing to draw.")
             if tables.flat(scores) else plots.chart_eval(charts, series))
    failed = say(f"{run.failed_evals} failed roll-ups not shown.") if run.failed_evals else ""
    body = (say("Roll-up eval records (empty task) per suite and category; error bars span "
                "ci_low–ci_high.") + chart + failed
            + table(["suite/category", "round", "score", "ci low", "ci high", "samples"], rows))
    return Section("eval", "Evaluation", body)


def retention(run: RunData, charts: Charts, numbers: Numbers) -> Section | None:
    """The first env set played again at each eval point; None in a run without retention evals
    (a recipe without `retention`)."""
    points = tables.retention_curve(run)
    if not points:
        return None
    by_env = tables.retention_by_env(run)
    numbers["retention"] = {p.round: (p.envs, p.score) for p in points}
    numbers["retention_envs"] = by_env
    scores = [p.score for p in points]
    chart = (note(f"The retention envs scored {scores[0]:.3f} at every eval point: nothing to "
                  f"draw.") if tables.flat(scores) else plots.chart_retention(charts, points))
    rows = [[f"r{p.round:02d}", str(p.envs), metric(num(p.score), "retention_score", p.round),
             num(p.ci_low), num(p.ci_high), str(p.failed)] for p in points]
    # the envs that lost the most first: where the forgetting is
    changes = sorted(by_env.items(), key=lambda item: (item[1][1][1] - item[1][0][1], item[0]))
    env_rows = [[env_id, f"r{first[0]:02d}", num(first[1]), f"r{latest[0]:02d}",
                 metric(num(latest[1]), "retention_env", latest[0], env=env_id),
                 f"{latest[1] - first[1]:+.3f}"]
                for env_id, (first, latest) in changes[:RETENTION_ENVS_SHOWN]]
    more = len(changes) - len(env_rows)
    body = (say("The first env set's envs (the recipe's `retention`: a seeded sample of the "
                "envs round 0 played) played without the hint by the checkpoint of each eval "
                "point: a point is the "
                "mean success rate over those envs, with its 95% interval; a falling curve is "
                "forgetting.") + chart
            + table(["round", "envs", "score", "ci low", "ci high", "failed"], rows)
            + say("Each env's score at its first and latest eval point, the largest drop first"
                  + (f" ({more} more not shown)." if more else "."))
            + table(["env", "first", "score", "latest", "score", "change"], env_rows))
    return Section("retention", "Retention: the first env set, played again", body)


def training(run: RunData, charts: Charts, numbers: Numbers) -> Section:
    title = "Training curves"
    series = tables.train_series(run)
    numbers["train_steps"] = len(run.train)
    if not series:
        return Section("train", title, note("no train records in this run"))
    signal = tables.training_signal(run, series)
    numbers["learned"] = signal.learned
    numbers["flat_stats"] = signal.flat
    steps = len(run.train)
    if signal.learned is False:
        words = note(f"No learning signal in any of the {_steps(steps)}: "
                     + "; ".join(signal.notes) + ". With every advantage 0 the loss and the "
                     "gradient are 0: the weights did not change, so no curves are drawn.")
    else:
        words = "".join(note(f"{line[0].upper()}{line[1:]}.") for line in signal.notes)
    if signal.flat:
        words += say("The same in every step that records it (not drawn): " + ", ".join(
            f"{key} {_value(value)}" for key, value in signal.flat.items()) + ".")
    panels = plots.train_panels(series, skip=list(signal.flat))
    chart = plots.chart_train(charts, panels) if signal.learned is not False and panels else ""
    rows = []
    for key in sorted(series):
        for line, points in series[key].items():
            values = [v for _, v in points]
            rows.append([key, line, str(len(points)), f"{values[0]:.4g}", f"{values[-1]:.4g}",
                         f"{min(values):.4g}", f"{max(values):.4g}"])
    roles = "; ".join(f"{role}: {_steps(n)} ({first}–{last})"
                      for role, (n, first, last) in tables.role_steps(run).items())
    body = (say(f"{_steps(steps)} of the optimiser. Roles in the batches: {roles}.") + words
            + chart + table(["stat", "line", "steps", "first", "last", "min", "max"], rows))
    return Section("train", title, body)


def memory(run: RunData) -> Section:
    if not run.memory:
        return Section("memory", "Memory", note("no memory entries in this run"))
    by_skill: dict[str, list[Memory]] = defaultdict(list)
    for entry in run.memory.values():
        by_skill[entry.skill or "(none)"].append(entry)
    rows = [[skill, str(len(entries)), num(tables.mean(e.win_rate for e in entries), 2),
             num(tables.mean(e.regret for e in entries), 3),
             str(min(e.round for e in entries)), str(max(e.round for e in entries))]
            for skill, entries in sorted(by_skill.items())]
    body = (f"<p>{len(run.memory)} entries in <code>{esc(run.memory_file)}</code>, the memory "
            f"at the end of the run (round −1: seed library).</p>"
            + table(["skill", "entries", "mean win rate (share won)", "mean regret", "oldest round",
                     "newest round"], rows))
    return Section("memory", "Memory", body)


def alerts(run: RunData, numbers: Numbers) -> list[str]:
    """One line per training statistic past its collapse threshold (shown atop the page)."""
    found = tables.collapse(run)
    numbers["collapse"] = [{"stat": c.stat, "line": c.line, "step": c.step, "round": c.round,
                            "steps": c.steps, "worst": c.worst} for c in found]
    return [c.text for c in found]


def _play_rows(play: Example) -> list[list[Cell]]:
    rows: list[list[Cell]] = []
    last = len(play.turns) - 1
    for index, turn in enumerate(play.turns):
        number = index + 1
        if play.left_out and index == last:  # the kept last turn, after the ones left out
            rows.append(["…", f"[{play.left_out} turns not shown]", "", "", "", ""])
            number += play.left_out
        rows.append([str(number), turn.completion, turn.action, turn.observation,
                     f"{turn.reward:.3g}", turn.finish_reason])
    return rows


def _play(run: RunData, label: str, play: Example) -> str:
    hint = play.hint_text if play.hint_text is not None else (
        cut(run.hints[play.env_id]) if play.hint and play.env_id in run.hints else None)
    head = say(f"{label}: env {play.env_id}, seed {play.seed}, reward {play.reward:.3g}, "
               f"outcome {play.outcome}, {len(play.turns) + play.left_out} turns.")
    if play.hint:
        head += (f'<p class="hint"><strong>hint:</strong> {esc(hint)}</p>' if hint is not None
                 else note("the hint of this play is not recorded"))
    if not play.turns:
        return head + note("no turns recorded (the play ended before its first action)")
    return head + table(["turn", "completion", "action", "observation (env's answer)",
                         "reward", "finish"], _play_rows(play), "transcript")


def _reason(reject) -> str:
    if reject.error is not None and reject.error.msg:
        return reject.error.msg
    msg = reject.meta.get("msg")
    return str(msg) if msg else "—"


def examples(run: RunData, numbers: Numbers) -> Section:
    """The best and worst plays of the newest rounds as transcripts (the hint beside each hinted
    play), and a few designs of each round with their verdict."""
    title = "Examples: plays and designs"
    shown: Numbers = {}
    numbers["examples"] = shown
    numbers["design_examples"] = {}
    parts: list[str] = []
    rounds = [n for n in sorted(run.examples, reverse=True) if run.examples[n]][:EXAMPLE_ROUNDS]
    labels = [((False, "best"), "best no-hint play"), ((False, "worst"), "worst no-hint play"),
              ((True, "best"), "best hinted play"), ((True, "worst"), "worst hinted play")]
    size, full = 0, False
    for position, number in enumerate(rounds):
        kept, seen, blocks = run.examples[number], set(), []
        for key, label in labels:
            play = kept.get(key)
            if play is None or play.id in seen:
                continue
            seen.add(play.id)
            shown.setdefault(number, {})[f"{'hint' if key[0] else 'no_hint'}_{key[1]}"] = {
                "id": play.id, "env_id": play.env_id, "reward": play.reward}
            blocks.append(_play(run, label, play))
        block = (f"<details{' open' if position == 0 else ''}><summary>r{number:02d}: "
                 f"{len(blocks)} plays</summary>{''.join(blocks)}</details>")
        if size + len(block) > EXAMPLES_MAX_CHARS:
            full = True
            break
        size += len(block)
        parts.append(block)
    plays_html = "".join(parts) or note("no rollouts in this run")
    designs_html = _design_examples(run, numbers)
    body = (say(f"Of each of the newest {EXAMPLE_ROUNDS} rounds: the no-hint play with the "
                f"highest and the lowest reward, and the same of the hinted plays, beside their "
                f"hint (ties: the first read). Texts are cut at {EXAMPLE_CHARS} characters and "
                f"plays at {EXAMPLE_TURNS} turns (the first ones and the last), each cut marked.")
            + plays_html
            + (note(f"more rounds not shown: the examples stop at {EXAMPLES_MAX_CHARS} "
                    f"characters") if full else "")
            + "<h3>Designs and their verdicts</h3>" + designs_html)
    return Section("examples", title, body)


def _design_examples(run: RunData, numbers: Numbers) -> str:
    rejected = run.rejected_designs()
    origins = run.origins()
    accepted = {parent for envs in run.envs.values() for env_id, env in envs.items()
                if origins[env_id] == "designed" for parent in env.parents}
    rows: list[list[Cell]] = []
    for number in sorted(run.design_samples, reverse=True)[:EXAMPLE_ROUNDS]:
        picked: dict[str, int] = defaultdict(int)
        for design in run.design_samples[number]:
            if design.id in rejected:
                verdict, reason = (f"rejected: {rejected[design.id][1].check}",
                                   _reason(rejected[design.id][1]))
            elif design.id in accepted:
                verdict, reason = "accepted", "—"
            else:
                verdict, reason = "not judged", "—"
            kind = verdict.split(":")[0]
            if picked[kind] >= DESIGNS_SHOWN:
                continue
            picked[kind] += 1
            numbers["design_examples"].setdefault(number, []).append(
                {"id": design.id, "verdict": verdict, "reason": reason})
            rows.append([f"r{number:02d}", design.id, f"a{design.attempt}", str(design.slot),
                         design.skill or "—", verdict, cut(reason), design.text])
    if not rows:
        return note("no design records in this run")
    return (say(f"Per round (the newest {EXAMPLE_ROUNDS}), up to {DESIGNS_SHOWN} designs of each "
                f"verdict, in the order read; the reason is the failing check's message.")
            + table(["round", "design", "attempt", "slot", "skill", "verdict", "reason",
                     "design text"], rows, "transcript"))


def throughput(run: RunData, charts: Charts, numbers: Numbers) -> Section:
    """Completion length and plays/s, tokens/s per round."""
    title = "Completion length and throughput"
    rates = tables.play_rates(run)
    numbers["completion_tokens"] = {n: r.mean_tokens for n, r in rates.items()}
    numbers["plays_per_s"] = {n: r.plays_per_s for n, r in rates.items()}
    numbers["tokens_per_s"] = {n: r.tokens_per_s for n, r in rates.items()}
    numbers["train_tokens_per_s"] = {n: r.train_tokens_per_s for n, r in rates.items()}
    if not rates:
        return Section("throughput", title, note("no rollout or train records in this run"))
    panels, words = [], []
    for label, key in (("completion tokens per completion", "mean_tokens"),
                       ("plays/s (rollout stages)", "plays_per_s"),
                       ("completion tokens/s (rollout stages)", "tokens_per_s"),
                       ("train tokens/s", "train_tokens_per_s")):
        points = [(n, getattr(r, key)) for n, r in sorted(rates.items())
                  if getattr(r, key) is not None]
        if not points:
            continue
        if len(points) > 1 and not tables.flat([v for _, v in points]):
            panels.append((label, points))
        elif len(points) > 1:
            words.append(f"{label}: {points[0][1]:.4g} in every round")
    missing = []
    if all(r.mean_tokens is None for r in rates.values()):
        missing.append("no completion lengths: the plays record no completion_ids")
    if all(r.plays_per_s is None for r in rates.values()):
        missing.append("no rollout throughput: no rollout stage directory has a _manifest.json "
                       "with stats.seconds")
    rows = [[f"r{n:02d}", str(r.plays), str(r.completions),
             metric(num(r.mean_tokens, 1), "completion_tokens", n),
             num(r.seconds, 1), metric(num(r.plays_per_s, 3), "plays_per_s", n),
             metric(num(r.tokens_per_s, 1), "tokens_per_s", n),
             metric(num(r.train_tokens_per_s, 1), "train_tokens_per_s", n)]
            for n, r in sorted(rates.items())]
    body = (say("Completion length: completion tokens per model turn (hinted and no-hint plays). "
                "Throughput: the plays of the rollout stage directories whose _manifest.json "
                "records the stage's wall time (stats.seconds, jail start-up included), and "
                "their completion tokens, over that time; train tokens/s: loss tokens over the "
                "train records' meta.seconds.")
            + "".join(note(m + ".") for m in missing)
            + ("".join(say(w + ".") for w in words))
            + (plots.chart_round_panels(charts, "throughput.png",
                                        "completion length and throughput per round", panels)
               if panels else "")
            + table(["round", "plays", "completions", "tokens per completion",
                     "rollout seconds", "plays/s", "tokens/s", "train tokens/s"], rows))
    return Section("throughput", title, body)
