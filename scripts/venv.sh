# Sourced by scripts/test.sh and scripts/quickstart.sh: pick the Python they install into.
# Inside a virtual environment (an activated one, or python3 itself a venv's): that one.
# Otherwise a project venv, .venv/ in the clone, made on first use and reused after: a system
# Python may refuse installs (PEP 668's EXTERNALLY-MANAGED, the default on current Debian and
# Ubuntu), and a user's own packages stay untouched either way. The venv is activated, so
# `python3`, `pip` and `spade` in the script and in what it starts are the venv's.
if ! python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; then
  if [ ! -x .venv/bin/python3 ]; then
    python3 -m venv .venv || {
      echo "spade: cannot make .venv/ with 'python3 -m venv' (on Debian/Ubuntu: apt install python3-venv)" >&2
      exit 69
    }
  fi
  echo "spade: not in a virtual environment: installing into $(pwd)/.venv (activate it with '. .venv/bin/activate')" >&2
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
