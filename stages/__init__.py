"""The spade library: one module per stage over iterables of records, plus what they share.

Stages: design, validate, hint, rollout, score_regret, train (train-grpo), evaluate, report.
Shared: records (the shard line kinds), shards (reading, atomic writing, resume), backends/
(model engines), prompts/ (prompt files), corpus, memory, rewards, skills, seed_library/.
Nothing here prints; the `spade` command (spade_cli) does the I/O and the exit codes.
"""

__version__ = "0.1.0"  # the distribution's (pyproject.toml): records and reports name it
