#!/usr/bin/env bash
# Install what tests/viewer/test_viewer_browser.py needs: Debian's Chromium and the playwright
# Python package (which drives that Chromium through executable_path; no `playwright install`).
# Idempotent: each step is skipped when already done. Run as root (apt) with the venv active,
# or pass the venv's python as PYTHON=/path/to/python.
set -euo pipefail

PYTHON="${PYTHON:-python}"

if ! command -v chromium >/dev/null 2>&1; then
    echo "install_browser: installing Debian chromium" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
chromium --version >&2

if ! "$PYTHON" -c "import playwright" >/dev/null 2>&1; then
    echo "install_browser: installing playwright (python package)" >&2
    "$PYTHON" -m pip install -q playwright
fi
"$PYTHON" -c "from importlib.metadata import version; print('playwright', version('playwright'))" >&2
