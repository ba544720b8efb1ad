"""Adapters: a validated spade env, used from other RL stacks, always played in the jail.

Each takes what a user names (a `.py` env file, a shard of `env` records plus an id prefix, an
`Env` record, or the source) and gives that stack's own environment type:
    stages.adapters.trl        environment_factory(env) -> TRL GRPOTrainer(environment_factory=)
    stages.adapters.openenv    openenv_environment(env) -> an OpenEnv `Environment` class;
                               openenv_app(env) -> its FastAPI server app
    stages.adapters.verifiers  load_environment(env) -> a verifiers (v1) `Env` over a `Taskset`
    sandbox.gym                JailedEnv / register -> gymnasium (on the bottom floor: it needs
                               only the source, so it imports no `stages`)
They share stages/adapters/common.py (finding the source, probing the env, playing an episode),
so each guarantees the same: the env's code runs only inside the jail, a misbehaving env is an
outcome (the episode ends, reward 0.0), and rewards are outcome only, as `spade rollout` scores.
Import the one you need: each imports its own stack, and this package imports none of them.
"""
