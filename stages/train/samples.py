"""Which records train, as which samples, with what advantage: what train-grpo trains on.

In: `rollout` records (agent plays), `judgement` records (an env found to have a shortcut,
stages/judge.py), `regret` records (designer advantages, from score-regret) and the `design`
records they score (usually from k rounds earlier), and the run's Config.
Out: `build_samples` -> (samples, skipped): one `Sample` per training sequence (the token ids the
model read and wrote, the positions of the tokens that carry loss, the sampler's logprobs of
those tokens, the advantage, the sampling temperature, and its source: the play or design, the
batch unit), and a count per reason a record or turn did not train.
Guarantees:
- agent samples are the no-hint plays (the hinted ones too with `train_on_hinted`), never those
  of an env a `judgement` found a shortcut; agent advantage: z-score of episode rewards within
  one env's plays (per round, hinted plays apart); designer advantage: as score-regret computed
  it (skill-centred, scaled);
- one sequence per episode: when every turn's prompt ids extend the previous turn's prompt and
  completion token for token, a play is one sequence whose completion tokens carry loss and
  whose observations and tool results are context; otherwise (a template that rewrites earlier
  turns) each turn is its own sample, the prompt the model really saw, and the play is counted
  as a per-turn fallback. Both give the same per-token logprobs. A designer's repair
  conversation (`designer_sample = "conversation"`) is laid out the same way;
- plays the env broke: one whose step raised after the agent acted (`program_error` with a
  turn of model tokens) trains as an ordinary play with reward `rewards.failed_play_reward`
  (-1), in its env's group, as the reference's env wrapper turns the exception into reward -1
  and completes the trajectory; every other `ok: false` play (hangs, limits, load or reset
  failures, blacklisted, internal errors) is dropped and counted, as the reference drops its
  FAILED plays. `drop_env_errors` drops the crashed ones too (spade's earlier rule);
- `mask_truncated` and `mask_malformed_tool_calls` (the reference's tool-use launchers) take
  the loss off plays the turn budget ended and off turns whose tool call the env could not
  parse; masked plays still count in their group's advantages;
- samples without token ids (openai backend) are skipped and counted, never guessed;
- a non-finite reward, advantage, temperature or logprob in the inputs is a RecordError that
  names the record and the field: nothing trains.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from stages import rewards
from stages.judge import condemned
from stages.records import Design, Judgement, Record, RecordError, Regret, Rollout
from stages.train.config import Config


@dataclass
class Sample:
    """One training sequence: a whole play, one turn of it, or one design."""

    role: str
    ids: list[int]  # what the model read and wrote, in order
    loss_positions: list[int]  # positions in `ids` of the tokens that carry loss
    sampled_logprobs: list[float]  # the sampler's log p of each of those tokens
    advantage: float
    temperature: float = 1.0
    source: str = ""  # the play or design: the batch unit, and the "sample" of loss_norm
    per_turn: bool = False  # a turn of a play that could not be one sequence

    @classmethod
    def of_turn(cls, role: str, prompt_ids: list[int], completion_ids: list[int],
                logprobs: list[float], advantage: float, temperature: float = 1.0,
                source: str = "", per_turn: bool = False) -> "Sample":
        start = len(prompt_ids)
        return cls(role, prompt_ids + completion_ids,
                   list(range(start, start + len(completion_ids))),
                   list(logprobs[:len(completion_ids)]), advantage, temperature, source, per_turn)


def build_samples(records: Iterable[Record], cfg: Config) -> tuple[list[Sample], dict[str, int]]:
    """Agent samples from rollouts, designer samples from regret + design records."""
    plays: dict[str, list[tuple[Rollout, float]]] = defaultdict(list)
    designs: dict[str, Design] = {}
    regrets: list[Regret] = []
    skipped: dict[str, int] = defaultdict(int)
    records = list(records)
    shortcuts = condemned(r for r in records if isinstance(r, Judgement))
    for record in records:
        if isinstance(record, Rollout) and record.env_id in shortcuts:
            skipped["agent_shortcut_env_dropped"] += 1  # its winners win any seed: a trick
        elif isinstance(record, Rollout):
            if (record.hint and not cfg.train_on_hinted) or "agent" not in cfg.roles:
                continue
            reward = trained_reward(record, cfg)
            if reward is None:
                skipped[f"agent_{record.outcome}_dropped"] += 1
                continue
            plays[f"{record.env_id}:{int(record.hint)}:{record.round}"].append((record, reward))
        elif isinstance(record, Design):
            designs[record.id] = record
        elif isinstance(record, Regret):
            regrets.append(record)
    samples: list[Sample] = []
    if "agent" in cfg.roles:
        for group in plays.values():
            for play, reward in group:
                _require_finite([reward], play, "reward")
            advantages = rewards.agent_advantages([reward for _, reward in group], cfg.rewards)
            for (play, _), advantage in zip(group, advantages):
                samples += play_samples(play, advantage, cfg, skipped)
    if "designer" in cfg.roles:
        for regret in regrets:
            samples += designer_samples(regret, designs, skipped)
    return samples, dict(skipped)


def designer_samples(regret: Regret, designs: dict[str, Design],
                     skipped: dict[str, int]) -> list[Sample]:
    """The design a regret record pays, or with `designer_sample = "conversation"` every
    designer turn of its repair conversation: one sequence when the turns extend each other
    token for token, else one sample per turn."""
    turns = design_conversation(designs, regret.design_id or "") \
        if regret.designer_sample == "conversation" else \
        [designs[regret.design_id]] if regret.design_id in designs else []
    if not turns:
        skipped["designer_without_design_record"] += 1
        return []
    if any(not d.completion_ids or d.prompt_ids is None or not d.logprobs for d in turns):
        skipped["designer_no_token_ids"] += 1
        return []
    _require_finite([regret.designer_advantage], regret, "designer_advantage")
    for design in turns:
        _require_finite(design.logprobs, design, "logprobs")
    advantage, temperature, source = regret.designer_advantage, _temperature(turns[0]), turns[-1].id
    if len(turns) > 1 and turns_extend(turns) and \
            len({_temperature(d) for d in turns}) == 1:
        return [conversation_sample("designer", turns, [True] * len(turns), advantage,
                                    temperature, source)]
    return [Sample.of_turn("designer", d.prompt_ids, d.completion_ids, d.logprobs, advantage,
                           _temperature(d), source, per_turn=len(turns) > 1) for d in turns]


def design_conversation(designs: dict[str, Design], last: str) -> list[Design]:
    """The designs of a repair conversation, turn 1 first, walking back from `last` through
    `repairs`; empty when one of them is not among `designs`."""
    turns: list[Design] = []
    design_id: str | None = last
    while design_id is not None:
        if design_id not in designs:
            return []
        turns.append(designs[design_id])
        design_id = turns[-1].repairs
    return turns[::-1]


# The env outcome of a play whose step raised (or whose worker died or replied garbage) while
# it took the agent's action: the reference's env wrapper (spade/core/envs/
# synthetic_game_env.py, `step`) turns such an exception into reward -1 and ends the episode,
# which then trains as any other. Hangs (`timeout`, `env_budget`), limits (`oom`,
# `output_limit`) and load or reset failures are FAILED plays there, never trained.
STEP_CRASH = "program_error"


def crashed_step(play: Rollout) -> bool:
    """Whether the env raised on a step after the agent acted: a `program_error` play with a
    turn of model tokens (a load or reset that failed leaves none)."""
    return not play.ok and play.outcome == STEP_CRASH and \
        any(turn.completion_ids for turn in play.turns)


def trained_reward(play: Rollout, cfg: Config) -> float | None:
    """The reward a play trains the agent with; None: not trained (the env broke the play,
    not the agent)."""
    if play.ok:
        return play.reward
    if crashed_step(play) and not cfg.drop_env_errors:
        return cfg.rewards.failed_play_reward
    return None


def play_samples(play: Rollout, advantage: float, cfg: Config,
                 skipped: dict[str, int]) -> list[Sample]:
    """One sequence for the play when its turns extend each other token for token, else one
    sample per turn (`per_turn`); turns without token ids or masked by cfg carry no loss."""
    temperature = _temperature(play)
    trained = []  # (turn, carries loss)
    for index, turn in enumerate(play.turns):
        if not turn.completion_ids or turn.prompt_ids is None or not turn.logprobs:
            skipped["agent_no_token_ids"] += 1
            continue
        if cfg.mask_truncated and play.truncated:
            skipped["agent_truncated_masked"] += 1
            continue
        loss = not (cfg.mask_malformed_tool_calls and malformed_tool_call(turn.completion))
        if not loss:
            skipped["agent_malformed_tool_call_masked"] += 1
        _require_finite(turn.logprobs, play, f"turns.{index}.logprobs")
        trained.append((turn, loss))
    if not any(loss for _, loss in trained):
        return []
    if len(trained) == len(play.turns) and turns_extend(play.turns):
        return [episode_sample(play, advantage, temperature, [loss for _, loss in trained])]
    return [Sample.of_turn("agent", turn.prompt_ids, turn.completion_ids, turn.logprobs,
                           advantage, temperature, play.id, per_turn=len(play.turns) > 1)
            for turn, loss in trained if loss]


def turns_extend(turns: list) -> bool:
    """Whether each turn's prompt starts with the previous turn's prompt and completion."""
    for previous, turn in zip(turns, turns[1:]):
        seen = previous.prompt_ids + previous.completion_ids
        if turn.prompt_ids[:len(seen)] != seen:
            return False
    return True


def episode_sample(play: Rollout, advantage: float, temperature: float,
                   carries_loss: list[bool]) -> Sample:
    """The play as one sequence (conversation_sample over its turns)."""
    return conversation_sample("agent", play.turns, carries_loss, advantage, temperature,
                               play.id)


def conversation_sample(role: str, turns: list, carries_loss: list[bool], advantage: float,
                        temperature: float, source: str) -> Sample:
    """Turns that extend each other as one sequence: the last prompt (which holds every
    earlier turn) and the last completion, with loss on each turn's completion tokens that
    `carries_loss` keeps."""
    last = turns[-1]
    positions: list[int] = []
    sampled: list[float] = []
    for turn, loss in zip(turns, carries_loss):
        if loss:
            start = len(turn.prompt_ids)
            positions += range(start, start + len(turn.completion_ids))
            sampled += turn.logprobs[:len(turn.completion_ids)]
    return Sample(role, last.prompt_ids + last.completion_ids, positions, sampled,
                  advantage, temperature, source)


TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def malformed_tool_call(completion: str) -> bool:
    """A turn that tried to call a tool in a form the env rejects as a format error (the rule
    of sandbox/tool_base.py): unclosed, not JSON, no name, or arguments that are no object."""
    if "<tool_call>" not in completion:
        return False
    calls = TOOL_CALL_RE.findall(completion)
    if not calls:
        return True
    for raw in calls:
        try:
            call = json.loads(raw)
            arguments = call.get("arguments", {}) if isinstance(call, dict) else None
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            return True
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) \
                or not isinstance(arguments, dict):
            return True
    return False


def _require_finite(values: Iterable[float], record: Record, field: str) -> None:
    """Records read from shards are finite; records handed over in memory may not be."""
    if not all(map(math.isfinite, values)):
        raise RecordError(f"field '{field}': a non-finite number; nothing trained", record.id)


def _temperature(record: Record) -> float:
    value = record.meta.get("temperature", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value):
        raise RecordError(f"field 'meta.temperature': expected a finite number, got {value!r}",
                          record.id)
    return float(value)

