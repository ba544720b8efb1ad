"""Prompt templates, as plain files a user can read and override.

In: a template name (a `.md` file beside this module) and values for its `{{placeholders}}`.
Out: the filled text. Guarantees: a file of the same name in the override directory
(`--prompts DIR`) wins; a placeholder without a value is an error, never left in the text.
Braces other than `{{name}}` pass through untouched (prompts mention `\\boxed{}` and JSON).
"""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).parent
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def template(name: str, override_dir: str | None = None) -> str:
    if override_dir:
        custom = Path(override_dir) / f"{name}.md"
        if custom.exists():
            return custom.read_text()
    return (HERE / f"{name}.md").read_text()


def render(name: str, override_dir: str | None = None, **values: object) -> str:
    text = template(name, override_dir)
    missing = sorted(set(PLACEHOLDER.findall(text)) - set(values))
    if missing:
        raise KeyError(f"prompt {name!r} needs values for {', '.join(missing)}")
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text).rstrip()
