"""Running generated environment programs safely.

jail.py starts a long-lived nsjail worker per episode and classifies every outcome; worker.py
is what runs inside it; contract.py holds validate's named checks; tool_base.py is the base
class tool-use envs subclass; reference_tool_base.py and math_verify_shim.py let envs written to
the reference code's templates run in the jail; gym.py wraps a jailed env as a gymnasium.Env.
"""
