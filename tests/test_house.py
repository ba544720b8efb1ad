"""The house rules of spade's modules (scripts/house.py): no import cycle at module level, no
floor importing one above it (sandbox < stages < spade_cli), and stages.train entered only
through its package; and the script that prints the picture finds each kind of broken rule."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("house", ROOT / "scripts" / "house.py")
house = importlib.util.module_from_spec(spec)
sys.modules.setdefault("house", house)  # dataclasses look their module up
spec.loader.exec_module(house)

FOUND = house.scan(ROOT)


def test_no_import_cycle_among_modules_at_module_level():
    loops = house.cycles(FOUND)
    assert not loops, "\n".join(" -> ".join(loop + loop[:1]) for loop in loops)


def test_sandbox_never_imports_stages_or_the_cli_and_stages_never_the_cli():
    assert not [f"{i.source}:{i.line} {i.written}" for i in house.imports_up(FOUND)]


def test_outside_stages_train_only_the_package_and_what_it_names_are_imported():
    assert not [f"{i.source}:{i.line} {i.written}: {why}"
                for i, why in house.past_the_door(FOUND, ROOT)]
    assert all(why.strip() for why in house.ALLOWED.values())  # each exception says why


def test_every_name_stages_train_exports_exists():
    import stages.train as package

    names = house.door("stages.train", ROOT)
    assert names and len(names) == len(set(names))
    assert set(names) == set(package._FROM) | set(package._MODULES)
    for name in names:
        assert hasattr(package, name), name


def test_importing_stages_train_loads_a_module_only_when_one_of_its_names_is_asked_for():
    """The engines take the LoRA checkpoint helpers from stages.train in processes that have
    vLLM but not spade's dependencies (tests/stages/backends/test_vllm_cpu.py)."""
    code = ("import json, sys, stages.train\n"
            "loaded = lambda: sorted(m for m in sys.modules if m.startswith('stages'))\n"
            "before = loaded()\n"
            "from stages.train import adapter_base, adapter_rank\n"
            "print(json.dumps([before, loaded(), [m for m in ('orjson', 'pydantic', 'torch')\n"
            "                                     if m in sys.modules]]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    before, after, dependencies = json.loads(done.stdout)
    assert before == ["stages", "stages.train"]
    assert after == ["stages", "stages.train", "stages.train.attention",
                     "stages.train.checkpoint", "stages.train.parallel", "stages.trust"]
    assert dependencies == []


def test_the_script_prints_the_picture_and_the_tally():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "house.py")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("package") and "cycles: 0, imports up: 0" in lines
    rows = {line.split()[0]: line.split()[1] for line in lines[1:] if line[:1].isalpha()
            and line.split()[1].isdigit()}
    assert rows["stages.train"] == str(len(list((ROOT / "stages" / "train").glob("*.py"))))
    assert {"sandbox", "stages", "spade_cli"} <= set(rows)


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_each_broken_rule_is_found_and_named(tmp_path):
    write(tmp_path, {
        "sandbox/__init__.py": "",
        "sandbox/jail.py": "def f():\n    from stages import a\n",  # up, even in a function
        "stages/__init__.py": "",
        "stages/a.py": "from stages import b\n",
        "stages/b.py": "import stages.a\n\ndef g():\n    import spade_cli\n",
        "stages/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from stages import d\n",
        "stages/d.py": "from stages import c\n",  # no cycle: c imports d only for typing
        "stages/train/__init__.py": "from stages.train.loop import run\n__all__ = ['run']\n",
        "stages/train/loop.py": "from stages.train import parts\ndef run():\n    pass\n",
        "stages/train/parts.py": "",
        "stages/e.py": "from stages.train import run\nfrom stages.train.loop import run\n"
                       "from stages.train import parts\n",
        "spade_cli/__init__.py": "from stages import train\nfrom . import sub\n",
        "spade_cli/sub.py": "from stages.train import hidden\n",
    })
    found = house.scan(tmp_path)
    assert house.cycles(found) == [["stages.a", "stages.b"]]
    assert sorted((i.source, i.target) for i in house.imports_up(found)) == [
        ("sandbox.jail", "stages.a"), ("stages.b", "spade_cli")]
    past = sorted((i.source, i.line, why) for i, why in house.past_the_door(found, tmp_path))
    assert past == [
        ("spade_cli.sub", 1, "hidden is not in stages.train.__all__"),
        ("stages.e", 2, "imports stages.train.loop by its own path: import it through "
                        "stages.train"),
        ("stages.e", 3, "imports stages.train.parts by its own path: import it through "
                        "stages.train")]
    assert house.main(tmp_path) == 1
