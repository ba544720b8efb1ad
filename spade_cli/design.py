"""`spade design`: the designer writes B new env programs (design records)."""

from __future__ import annotations

from typing import Annotated

import typer

from spade_cli.options import (TOP_K, TOP_P, ApiKey, BackendName, BaseUrl, Compress, ContextLength,
                               Device, EnableThinking, MaxTokens, Model, Out, Overwrite, PolicyName,
                               PromptsDir, Round, SamplingSeed, SamplingSeedMode, Seed,
                               Temperature, TopK, TopP, backend_spec)


def register(app: typer.Typer) -> None:
    app.command("design")(design)


def design(
    backend: BackendName = "hf",
    model: Model = ...,
    policy: PolicyName = None,
    out: Out = "-",
    domain: Annotated[str, typer.Option(help="game or tool_use.")] = "game",
    batch: Annotated[int, typer.Option("--batch", "-b", min=1, help="Envs to design.")] = 24,
    round: Round = 0,
    active_skills: Annotated[int, typer.Option(min=1, max=6,
                                               help="Skills active in this env set.")] = 3,
    skill: Annotated[list[str] | None, typer.Option(
        metavar="NAME", help="Rotate over these skills only (repeat the option; default: all "
                             "six of the domain).")] = None,
    every: Annotated[int | None, typer.Option(
        min=1, help="k, the rounds an env set lives (default 4 for games, 8 for tool use): "
                    "skills rotate by env set, round // k.")] = None,
    difficulty: Annotated[str, typer.Option(help="easy, medium or hard.")] = "medium",
    corpus: Annotated[str | None, typer.Option(
        metavar="PATH", help="Corpus: JSONL (text/orig_doc), a directory of .txt/.md, or builtin:games / "
             "builtin:tool_use (the default for the domain).")] = None,
    no_corpus: Annotated[bool, typer.Option(
        "--no-corpus", help="Design without a corpus document (the no-corpus ablation).")] = False,
    corpus_words: Annotated[int | None, typer.Option(
        help="Truncate documents to this many words (default 6000 for games, 4000 for tool "
             "use).")] = None,
    memory: Annotated[str | None, typer.Option(metavar="PATH", help="Memory shard for few-shot examples.")] = None,
    retry: Annotated[list[str] | None, typer.Option(
        metavar="DIR", help="Validate output(s): design a new attempt for each rejected slot "
                            "(with --repair, also the design shards they judged).")] = None,
    repair: Annotated[bool, typer.Option(
        "--repair", help="With --retry: go on with each rejected design's own conversation, "
                         "telling the designer which check failed and why (pass the design "
                         "shards with --retry too), instead of a fresh attempt.")] = False,
    max_attempts: Annotated[int, typer.Option(min=1, help="Attempts per slot with --retry.")] = 5,
    seed: Seed = 0,
    sampling_seed: SamplingSeed = SamplingSeedMode.request,
    temperature: Temperature = 0.6,
    top_p: TopP = TOP_P,
    top_k: TopK = TOP_K,
    enable_thinking: EnableThinking = None,
    max_tokens: MaxTokens = 4096,
    stop_loops: Annotated[bool, typer.Option(
        "--stop-loops/--no-stop-loops",
        help="End a design that repeats one stretch of 2-100 tokens 20 times in a row, where it "
             "stands, instead of at --max-tokens (finish_reason repetition; hf, vllm, or a vLLM "
             "server).")] = False,
    context_length: ContextLength = None,
    prompts: PromptsDir = None,
    base_url: BaseUrl = None,
    api_key: ApiKey = None,
    device: Device = None,
    overwrite: Overwrite = False,
    compress: Compress = "jsonl",
) -> None:
    """Prompt the Environment Designer for new env programs, one per slot.

    Skills rotate by env set (round // k); each slot gets one corpus document (none with
    --no-corpus) and memory examples. With --retry, only the slots whose previous attempt
    `spade validate` rejected are designed again: afresh, or with --repair as the next turn of
    the rejected design's conversation, which names the failed check and quotes its message. Into a directory, each design is saved the
    moment it is answered: a rerun after a stop (Ctrl-C, a kill, a server that died) asks only
    for the designs still missing.

    Examples:

        spade design -m runs/q/model -b 8 -o runs/q/r00/design-a0
        spade design -m runs/q/model -b 8 | spade validate > checked.jsonl
        spade design -m runs/q/model -b 8 --retry runs/q/r00/validate-a0
        spade design -m runs/q/model --retry runs/q/r00/validate-a0 \\
            --retry runs/q/r00/design-a0 --repair
    """
    from spade_cli.errors import UsageError, errors_to_exit
    from spade_cli.options import StageBackend
    from spade_cli.progress import Progress
    from spade_cli.summary import summarize
    from stages import corpus as corpus_mod
    from stages import design as stage
    from stages.backends import Sampling
    from stages.shards import Stats, emit, find_shards, read
    from stages.skills import SKILLS

    with errors_to_exit("design"):
        if domain not in ("game", "tool_use"):
            raise UsageError(f"--domain must be game or tool_use, not {domain!r}")
        if difficulty not in stage.DIFFICULTY_STEPS:
            raise UsageError(f"--difficulty must be one of {', '.join(stage.DIFFICULTY_STEPS)}")
        skills = tuple(dict.fromkeys(skill or ()))
        unknown = [name for name in skills if name not in SKILLS[domain]]
        if unknown:
            raise UsageError(f"--skill {unknown[0]!r} is not a {domain} skill: one of "
                             f"{', '.join(SKILLS[domain])}")
        if active_skills > len(skills or SKILLS[domain]):
            raise UsageError(f"--active-skills {active_skills} is more than the "
                             f"{len(skills or SKILLS[domain])} skills to rotate over")
        if no_corpus and corpus:
            raise UsageError("--no-corpus and --corpus exclude each other")
        spec = backend_spec(backend, model, base_url, api_key, device, context_length, policy)
        cfg = stage.Config(domain=domain, batch=batch, round=round, active_skills=active_skills,
                           every=every, difficulty=difficulty, seed=seed, max_attempts=max_attempts,
                           prompts_dir=prompts, skills=skills, sampling=Sampling(
                               temperature=temperature, top_p=top_p, top_k=top_k,
                               max_tokens=max_tokens, enable_thinking=enable_thinking,
                               per_request_seed=sampling_seed.per_request, stop_loops=stop_loops))
        documents = None if no_corpus else corpus_mod.load(
            corpus or f"builtin:{'games' if domain == 'game' else domain}",
            corpus_words or stage.CORPUS_WORDS[domain])
        memories = list(read([memory], kinds={"memory"})) if memory else []
        if repair and not retry:
            raise UsageError("--repair goes with --retry: the rejects to repair and their "
                             "designs")
        if retry:
            slots = retry_or_repair(retry, round, repair, cfg)
        else:
            slots = stage.fresh_slots(cfg)
        inputs = [s.digest() for s in find_shards(([memory] if memory else []) + (retry or []))]
        config = {"repair": repair, "backend": backend, "model": model, "domain": domain, "batch": batch,
                  "round": round, "active_skills": active_skills,
                  "env_set": stage.env_set_index(cfg), "difficulty": difficulty,
                  "corpus": corpus, "no_corpus": no_corpus,
                  "skills": list(skills), "seed": seed, "temperature": temperature,
                  "top_p": top_p, "top_k": top_k, "enable_thinking": enable_thinking,
                  "max_tokens": max_tokens, **sampling_seed.config(), "inputs": inputs,
                  # only when set: a run stopped before the option existed resumes as it was
                  **({"stop_loops": True} if stop_loops else {}),
                  "slots": [(s.slot, s.attempt) for s in slots]}
        stats = Stats()
        progress = Progress("design", "designs", len(slots))
        model_backend = StageBackend(spec, progress)

        def produce(journal):
            if not slots:
                return
            progress.add_total(-len(journal.made))  # the bar, its rate and eta: this run's designs

            def keep(record):  # counted as answered, not when the slots before it are
                journal.keep(record)
                progress.advance()
                if record.meta.get("copy_retried"):  # a repair that copied its parent
                    stats.extra["copies"] = stats.extra.get("copies", 0) + 1

            yield from stage.run(model_backend.get(), documents, memories, cfg, slots,
                                 journal.made, keep)

        with progress, model_backend:
            resumed = emit("design", out, produce, config, stats, overwrite, f".{compress}")
        kept = f" ({resumed} made before a stop, kept)" if resumed else ""
        turns = sorted({s.repairs.turn + 1 for s in slots if s.repairs is not None})
        repairs = (f"; repairs at turn {', '.join(map(str, turns))}, "
                   f"{stats.extra.get('copies', 0)} copied their parent and were asked again"
                   if turns else "")
        summarize("design", stats,
                  f"{stats.written['design']} designs for {len(slots)} slots{kept}{repairs}")


def retry_or_repair(paths: list[str], round: int, repair: bool, cfg) -> list:
    """The slots --retry asks for: fresh attempts, or with --repair the next turn of each
    rejected design's conversation (its design records must be among the --retry inputs)."""
    from spade_cli.errors import UsageError
    from stages import design as stage
    from stages.records import Design
    from stages.shards import read

    records = list(read(paths, kinds={"validation", "design"} if repair else {"validation"}))
    rejects = [r for r in records if not isinstance(r, Design) and r.round == round]
    if not repair:
        return stage.retry_slots(rejects, cfg)
    try:
        return stage.repair_slots(rejects, [r for r in records if isinstance(r, Design)], cfg)
    except KeyError as missing:
        raise UsageError(f"--repair: the design {missing.args[0]} that a reject in "
                         f"{', '.join(paths)} judged is not in the --retry inputs: pass its "
                         "design shard with --retry too") from None
