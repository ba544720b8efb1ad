#!/usr/bin/env bash
# Mutation testing (mutmut 3, the `mutation` extra) of the modules where a wrong number changes
# the science or the safety; not part of CI. Usage:
#   bash scripts/mutation.sh                      every module of scripts/mutation.py's TARGETS
#   bash scripts/mutation.sh stages/rewards.py    one module (or several)
#   bash scripts/mutation.sh --summary [MODULE]   re-print the last results, run nothing
# Env: MUTATION_WORKDIR (default /tmp/spade-mutation; one copy of the tree per module, kept as
# mutmut's cache), MUTATION_JOBS (mutmut --max-children, default 1).
# Each mutant runs only the tests that reached its function (mutmut's own per-mutant
# selection), among the module's mapped test files. Ends with `mutation: K/N killed (E
# equivalent)`; scripts/mutation-equivalent.txt lists the equivalent mutants, with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${MUTATION_WORKDIR:-/tmp/spade-mutation}
JOBS=${MUTATION_JOBS:-1}
helper() { python3 "$ROOT/scripts/mutation.py" "$@"; }

summary_only=0
if [ "${1:-}" = "--summary" ]; then summary_only=1; shift; fi
if [ $# -gt 0 ]; then modules=("$@"); else mapfile -t modules < <(helper modules); fi

if [ "$summary_only" = 0 ] && ! python3 -c "import mutmut" 2>/dev/null; then
  # the `mutation` extra, read from pyproject.toml (not `pip install -e .[mutation]`: that
  # would reinstall the project itself)
  mapfile -t reqs < <(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["mutation"]))')
  python3 -m pip install --quiet --disable-pip-version-check "${reqs[@]}"
fi

if [ "$summary_only" = 0 ]; then
  for module in "${modules[@]}"; do
    dir="$WORK/$(helper slug "$module")"
    helper prepare "$module" "$dir"
    mapfile -t globs < <(helper globs "$module")
    echo "== $module (in $dir)"
    start=$SECONDS
    # mutmut's exit status is not the verdict (the summary below is): keep going
    (cd "$dir" && python3 -m mutmut run --max-children "$JOBS" "${globs[@]}" > mutmut.log 2>&1) \
      || { echo "mutmut failed on $module, see $dir/mutmut.log"; tail -20 "$dir/mutmut.log"; }
    echo "$module: mutmut ran $((SECONDS - start)) s"
  done
fi
helper summary "$WORK" "${modules[@]}"
