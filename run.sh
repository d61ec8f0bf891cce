#!/usr/bin/env bash
# impyard's two commands (see README.md):
#   ./run.sh          set everything up and run the main job: chat with an imp in the terminal
#   ./run.sh test     set everything up, check format, lint and types, and run the whole test suite
#                     (with extra args: only pytest, with those args)
set -euo pipefail
cd "$(dirname "$0")"

VENV=.venv
PYTHON=${PYTHON:-python3}

ensure_venv() {
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "impyard needs Python 3.11 or newer as '$PYTHON' (set PYTHON=/path/to/python3.11)" >&2
        exit 1
    fi
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    # Reinstall only when the dependencies changed.
    local stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
    if [ ! -f "$stamp" ]; then
        "$VENV/bin/python" -m pip install --quiet --upgrade pip
        "$VENV/bin/python" -m pip install --quiet -e '.[test]'
        rm -f "$VENV"/.installed-* && touch "$stamp"
    fi
}

docker_works() {
    command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1
}

banner() {
    printf '\n\033[1;31m!!! %s\033[0m\n\n' "$1" >&2
}

ensure_venv
case "${1:-}" in
    test)
        shift
        if [ "$#" -eq 0 ]; then
            # The whole suite starts with the checks CI holds the code to: format, lint, types.
            "$VENV/bin/ruff" format --check --quiet . || { echo "run: .venv/bin/ruff format ." >&2; exit 1; }
            "$VENV/bin/ruff" check --quiet .
            "$VENV/bin/mypy"
        fi
        if docker_works; then
            "$VENV/bin/impyard" box build
        else
            banner "No Docker engine: the Docker tests will be SKIPPED (install docker.io and start dockerd to run them)."
        fi
        exec "$VENV/bin/python" -m pytest "$@"
        ;;
    "")
        if docker_works; then
            "$VENV/bin/impyard" box build
            exec "$VENV/bin/impyard" chat
        fi
        banner "No Docker engine: using the PROCESS backend, which has NO lockdown. Install Docker for real use."
        exec "$VENV/bin/impyard" chat --backend process
        ;;
    *)
        echo "usage: ./run.sh [test [pytest args...]]" >&2
        exit 2
        ;;
esac
