#!/usr/bin/env bash
# Prepare this checkout on a fresh Debian machine (as root, Python >= 3.11):
# redis-server and chromium from apt when missing, a virtualenv in .venv with streamkit
# installed editable with its test and docs extras.  Safe to run again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
  || { echo "streamkit needs Python >= 3.11 as python3" >&2; exit 1; }

# Only touch apt when a piece is actually missing, so re-runs stay offline.
apt_packages=()
command -v redis-server >/dev/null 2>&1 || apt_packages+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || apt_packages+=(redis-tools)
# Debian's Chromium drives the console's browser tests (Playwright is pointed at
# it; Playwright's own browser downloads are not used).
[ -x /usr/bin/chromium ] || apt_packages+=(chromium)
if [ ! -x .venv/bin/python ] && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  apt_packages+=(python3-venv)  # Debian ships venv/ensurepip separately
fi
if [ "${#apt_packages[@]}" -gt 0 ]; then
  echo "+ apt-get install ${apt_packages[*]}"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${apt_packages[@]}"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet -e '.[test,docs]'
echo "streamkit is installed in .venv"
