#!/usr/bin/env bash
# System part of the browser-test setup (the playwright package comes with the test extra).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
chromium --version
