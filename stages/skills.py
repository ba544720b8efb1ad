"""The skill vocabularies the designer targets, one per domain.

In: nothing. Out: ordered {skill: description} maps. Guarantees: names are stable identifiers
(they appear in records, memory and recipes); descriptions are what prompts show the designer.
"""

GAME_SKILLS = {
    "deduction": "infer a hidden configuration from constraints and feedback, ruling out cases",
    "spatial": "track positions, directions and obstacles on a grid or map while moving",
    "arithmetic": "plan sequences of numeric operations toward an exact target",
    "induction": "discover a hidden rule or pattern from examples, then apply it",
    "planning": "order interdependent actions under limited resources to reach a goal",
    "memory": "keep track of information that is shown once and later hidden",
}

TOOL_SKILLS = {
    "api-orchestration": "chain several tools so one call's output feeds the next",
    "data-retrieval": "find the right record among many with search and lookup tools",
    "state-modification": "change the world through mutating tools with preconditions",
    "error-recovery": "notice a failed call, find why, and fix the inputs",
    "tool-selection": "pick the right tool among similar and distractor tools",
    "multi-step-workflow": "carry a request through several dependent phases in order",
}

SKILLS = {"game": GAME_SKILLS, "tool_use": TOOL_SKILLS}
