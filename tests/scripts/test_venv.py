"""scripts/venv.sh, which the README's two commands source before they install anything.

What a user relies on: outside a virtual environment the scripts make `.venv/` in the clone once,
say so in one line, and install and run there (so an externally managed system Python, PEP 668,
is never asked to install); inside one they use it and make nothing. The end-to-end install under
an externally managed Python is tests/scripts/test_quickstart.py's.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]
PROBE = '. scripts/venv.sh; python3 -c "import sys; print(sys.prefix)"'


def base_python_bin(tmp_path: Path) -> Path:
    """A bin/ whose python3 is an interpreter outside any venv (the one this venv was made from)."""
    directory = tmp_path / "system-bin"
    directory.mkdir()
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (directory / "python3").symlink_to(base)
    return directory


def source_venv_sh(clone: Path, path_head: Path, **extra: str) -> subprocess.CompletedProcess:
    (clone / "scripts").mkdir(parents=True, exist_ok=True)
    (clone / "scripts" / "venv.sh").write_bytes((REPO / "scripts" / "venv.sh").read_bytes())
    env = {key: value for key, value in os.environ.items()
           if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{path_head}{os.pathsep}/usr/bin{os.pathsep}/bin", **extra)
    return subprocess.run(["bash", "-c", PROBE], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=120)


def test_outside_a_venv_the_scripts_make_dot_venv_once_and_say_so(tmp_path):
    clone = tmp_path / "spade"
    first = source_venv_sh(clone, base_python_bin(tmp_path))
    assert first.returncode == 0, first.stderr
    assert Path(first.stdout.strip()) == clone / ".venv"
    assert first.stderr.count("\n") == 1 and ".venv" in first.stderr
    made = (clone / ".venv" / "pyvenv.cfg").stat().st_mtime_ns
    again = source_venv_sh(clone, tmp_path / "system-bin")
    assert Path(again.stdout.strip()) == clone / ".venv"
    assert (clone / ".venv" / "pyvenv.cfg").stat().st_mtime_ns == made   # reused, not remade


def test_inside_a_venv_the_scripts_use_it_and_make_nothing(tmp_path):
    venv = tmp_path / "mine"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    clone = tmp_path / "spade"
    done = source_venv_sh(clone, venv / "bin", VIRTUAL_ENV=str(venv))
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == venv
    assert done.stderr == ""
    assert not (clone / ".venv").exists()
