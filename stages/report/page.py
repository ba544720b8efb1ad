"""The report's HTML: escaping, tables, and the page around the sections.

In: the run (for the header), the sections' titles and bodies, warnings, header facts.
Out: one self-contained HTML document (inline CSS and script, no external requests, so it renders
offline) whose script marks on <body> how many images loaded (a browser test reads it).
Guarantees: training-collapse alerts lead <main>; every text that reaches the page passes
through `esc` (env-derived skills, reject
reasons and suite names show as they are, never as markup); a table over 25 rows folds into a
<details>; metric cells carry `data-metric`/`data-round` for tests and scrapers.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import orjson

from stages import __version__
from stages.report.data import RunData

Cell = str | tuple[str, dict[str, str]]
FOLD_ROWS = 25


@dataclass
class Section:
    id: str
    title: str
    body: str


def esc(value: Any) -> str:
    return html.escape(str(value))


def table(headers: Sequence[str], rows: Iterable[Sequence[Cell]], cls: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            text, attrs = (cell, {}) if isinstance(cell, str) else cell
            attr = "".join(f' {k}="{esc(v)}"' for k, v in attrs.items())
            cells.append(f"<td{attr}>{esc(text)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    rows_html = "\n".join(body)
    out = (f'<table class="{cls}"><thead><tr>{head}</tr></thead>'
           f"<tbody>\n{rows_html}\n</tbody></table>")
    if len(body) > FOLD_ROWS:
        return f"<details><summary>table ({len(body)} rows)</summary>{out}</details>"
    return out


def metric(text: str, name: str, number: int | str, **more: str) -> Cell:
    return (text, {"data-metric": name, "data-round": str(number),
                   **{f"data-{key}": value for key, value in more.items()}})


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def say(text: str) -> str:
    """A plain paragraph of the report's own words (HTML-escaped)."""
    return f"<p>{esc(text)}</p>"


def model_text(recipe: dict[str, Any] | None) -> str:
    model = (recipe or {}).get("model")
    if model is None:
        return "—"
    if isinstance(model, dict):
        parts = [f"{k}={v}" for k, v in model.items() if isinstance(v, (str, int, float, bool))]
        return ", ".join(parts) or "—"
    return str(model)


def designer_text(recipe: dict[str, Any] | None) -> str:
    """Which model designed: the recipe's `[designer]` table (a separate model, never trained),
    else the run's own model."""
    table = (recipe or {}).get("designer")
    if not isinstance(table, dict):
        return "the run's model"
    table = {key.replace("_", "-"): value for key, value in table.items()}
    where = f" at {table['base-url']}" if table.get("base-url") else ""
    return f"{table.get('model')} (frozen, {table.get('backend')}{where})"


CSS = """
:root { --fg:#1d232a; --muted:#5b6672; --line:#d9dee3; --bg:#fff; --panel:#f6f8fa;
        --accent:#1f77b4; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--fg); background: var(--bg); margin: 0; }
header { background: #16202a; color: #fff; padding: 18px 28px; }
header h1 { margin: 0 0 6px; font-size: 22px; }
header dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px;
            margin: 8px 0 0; font-size: 14px; }
header dt { color: #9fb3c8; } header dd { margin: 0; font-family: ui-monospace, monospace; }
header dd.headline { font-weight: bold; color: #ffe28a; }
header details { margin-top: 10px; } header summary { cursor: pointer; color: #9fb3c8; }
header pre { background: #0d141b; color: #d7e2ec; padding: 10px; overflow: auto;
             max-height: 420px; font-size: 12px; }
nav { position: sticky; top: 0; background: var(--panel); border-bottom: 1px solid var(--line);
      padding: 8px 28px; font-size: 14px; z-index: 1; }
nav a { margin-right: 14px; color: var(--accent); text-decoration: none; }
main { padding: 4px 28px 40px; max-width: 1100px; }
section { border-bottom: 1px solid var(--line); padding: 10px 0 18px; }
h2 { font-size: 18px; margin: 14px 0 6px; }
p { margin: 6px 0 10px; color: var(--muted); }
p.missing { color: #a15c00; background: #fff6e5; border-left: 3px solid #f0a020;
            padding: 6px 10px; }
img.chart { display: block; max-width: 100%; height: auto; margin: 8px 0; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid var(--line); padding: 3px 9px; text-align: right;
         font-variant-numeric: tabular-nums; }
th { background: var(--panel); } td:first-child, th:first-child { text-align: left; }
code { background: var(--panel); padding: 0 3px; }
.alerts { background: #fdecea; border: 1px solid #d93025; padding: 6px 12px; margin: 12px 0; }
table.transcript td { text-align: left; vertical-align: top; white-space: pre-wrap;
                      word-break: break-word; font-family: ui-monospace, monospace;
                      font-size: 12px; max-width: 420px; }
p.hint { background: #eef6ee; border-left: 3px solid #2ca02c; padding: 6px 10px;
         white-space: pre-wrap; color: var(--fg); }
h3 { font-size: 15px; margin: 12px 0 4px; }
.warnings { background: #fff6e5; border: 1px solid #f0a020; padding: 6px 12px; margin: 12px 0; }
"""

SCRIPT = """
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var ok = images.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  var body = document.body;
  body.setAttribute("data-images-total", String(images.length));
  body.setAttribute("data-images-ok", String(ok));
  body.setAttribute("data-images-loaded", ok === images.length ? "true" : "false");
});
"""


def _rounds_text(run: RunData) -> str:
    rounds = run.all_rounds()
    text = (f"{len(rounds)} ({', '.join(f'r{n:02d}' for n in rounds[:3])}"
            f"{' … ' + f'r{rounds[-1]:02d}' if len(rounds) > 3 else ''})" if rounds else "none")
    planned = (run.recipe or {}).get("rounds")
    return text if planned is None else f"{text} of {planned} in the recipe"


def render(run: RunData, sections: list[Section], warnings: list[str],
           headline: tuple[str, str], alerts: Sequence[str] = ()) -> str:
    """The whole page; `headline` is the (label, text) shown first and highlighted; `alerts`
    (training collapse, one line each) lead the page, above the warnings and sections."""
    facts = [("run", run.name), ("directory", str(run.path.resolve())),
             ("rounds", _rounds_text(run)), ("model", model_text(run.recipe)),
             ("designer", designer_text(run.recipe)),
             ("checkpoints", f"{len(run.checkpoints)}"
              + (f" (latest {run.checkpoints[-1]})" if run.checkpoints else "")),
             ("generated", time.strftime("%Y-%m-%d %H:%M:%S") + f" by spade {__version__}")]
    dl = f'<dt>{esc(headline[0])}</dt><dd class="headline" id="headline">{esc(headline[1])}</dd>'
    dl += "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
    recipe_text = (orjson.dumps(run.recipe, option=orjson.OPT_INDENT_2).decode()
                   if run.recipe is not None else run.recipe_text)
    recipe_block = (f'<details id="recipe"><summary>resolved recipe (recipe.json)</summary>'
                    f"<pre>{esc(recipe_text)}</pre></details>" if recipe_text
                    else '<p id="recipe">no recipe.json in this run</p>')
    log_block = (f"<details><summary>run.log (last {len(run.log_tail)} lines)</summary>"
                 f"<pre>{esc(chr(10).join(run.log_tail))}</pre></details>" if run.log_tail else "")
    warn_block = ("<div class=\"warnings\"><strong>warnings</strong><ul>"
                  + "".join(f"<li>{esc(w)}</li>" for w in warnings) + "</ul></div>"
                  if warnings else "")
    alert_block = ('<div class="alerts" id="alerts"><strong>training collapse</strong><ul>'
                   + "".join(f"<li>{esc(a)}</li>" for a in alerts) + "</ul></div>"
                   if alerts else "")
    nav = "".join(f'<a href="#{s.id}">{esc(s.title.split(":")[0])}</a>' for s in sections)
    body = "\n".join(f'<section id="{s.id}" class="report-section"><h2>{esc(s.title)}</h2>\n'
                     f"{s.body}\n</section>" for s in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>spade report: {esc(run.name)}</title>
<style>{CSS}</style></head>
<body>
<header><h1>SPADE run report: {esc(run.name)}</h1><dl>{dl}</dl>{recipe_block}{log_block}</header>
<nav>{nav}</nav>
<main>{alert_block}{warn_block}
{body}
</main>
<script>{SCRIPT}</script>
</body></html>
"""
