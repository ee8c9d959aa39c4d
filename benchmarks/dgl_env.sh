#!/usr/bin/env bash
# Builds (or reuses) the virtual environment that runs benchmarks/dgl_variant.py; prints its python.
#
# DGL 2.1.0, the newest DGL on the package registry, ships compiled GraphBolt libraries per torch
# version and only loads with torch 2.0.0-2.2.1, so it cannot share the project's environment.
# The venv lives outside the checkout so every later run (and every clone) reuses it.
#
# Usage:  python_path=$(bash benchmarks/dgl_env.sh)       # logs go to stderr, the path to stdout
# Env:    PYG_MGPU_DGL_ENV    where the venv lives (default ~/.cache/pyg_mgpu/dgl-env)
#         PYG_MGPU_DGL_BASE_PYTHON   interpreter the venv is made from (default: the first of
#                                    python3.11, 3.12, 3.10, 3.9 on PATH)
#         PYG_MGPU_DGL_TORCH_INDEX   torch wheel index tried first (default PyTorch's CPU
#                                    index); when unreachable, torch comes from PyPI with its
#                                    CUDA packages.
set -euo pipefail

ENV_DIR="${PYG_MGPU_DGL_ENV:-$HOME/.cache/pyg_mgpu/dgl-env}"
# 2.2.1, not 2.2.2: the DGL 2.1.0 wheel ships libgraphbolt_pytorch_<v>.so for torch 2.0.0 to 2.2.1
# only, and `import dgl` fails on any other torch.
TORCH_VERSION="2.2.1"
DGL_VERSION="2.1.0"
TORCH_INDEX="${PYG_MGPU_DGL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
# Written last: a venv without it is a half-finished build (interrupted, failed) and is rebuilt.
MARKER="$ENV_DIR/.pyg_mgpu_dgl_env_complete"
# The stamp records what was installed; a change here rebuilds the venv.
STAMP="torch==$TORCH_VERSION dgl==$DGL_VERSION torchdata==0.7.1 numpy<2 setuptools<70"

log() { echo "[dgl_env] $*" >&2; }

env_ok() {
    [[ -f "$MARKER" ]] && [[ "$(cat "$MARKER")" == "$STAMP" ]] \
        && "$ENV_DIR/bin/python" -c "import dgl" >/dev/null 2>&1
}

if env_ok; then
    echo "$ENV_DIR/bin/python"
    exit 0
fi

mkdir -p "$(dirname "$ENV_DIR")"
# Two CI jobs (or a CI job and compare_dgl) may ask at once: the second waits for the first build.
exec 9>"$ENV_DIR.lock"
flock 9
if env_ok; then
    echo "$ENV_DIR/bin/python"
    exit 0
fi

start=$(date +%s)
# torch 2.2 and DGL 2.1 have wheels for CPython 3.8 to 3.12 only.
BASE_PYTHON="${PYG_MGPU_DGL_BASE_PYTHON:-}"
if [[ -z "$BASE_PYTHON" ]]; then
    for v in 3.11 3.12 3.10 3.9; do
        if command -v "python$v" >/dev/null 2>&1; then
            BASE_PYTHON=$(command -v "python$v")
            break
        fi
    done
fi
if [[ -z "$BASE_PYTHON" ]]; then
    log "no python3.9 to python3.12 found (torch 2.2 and DGL 2.1 have no wheels for others);" \
        "install one or set PYG_MGPU_DGL_BASE_PYTHON"
    exit 1
fi
log "building $ENV_DIR from $BASE_PYTHON ($("$BASE_PYTHON" --version 2>&1))"
rm -rf "$ENV_DIR"
"$BASE_PYTHON" -m venv "$ENV_DIR"
PIP=("$ENV_DIR/bin/python" -m pip --disable-pip-version-check)

"${PIP[@]}" install --quiet "setuptools<70" wheel >&2

# The CPU wheel is ~200 MB; PyPI's default wheel pulls ~3 GB of CUDA libraries, used when a GPU is
# present, dead weight otherwise. Probe the CPU index first with a short timeout.
if "$ENV_DIR/bin/python" - "$TORCH_INDEX" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)
EOF
then
    log "torch==$TORCH_VERSION from $TORCH_INDEX"
    "${PIP[@]}" install --quiet "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX" >&2
else
    log "$TORCH_INDEX unreachable: torch==$TORCH_VERSION from PyPI" \
        "(with its CUDA packages: ~5 GB installed)"
    "${PIP[@]}" install --quiet "torch==$TORCH_VERSION" >&2
fi

# torch is pinned in the same command so that no dependency can replace it.
"${PIP[@]}" install --quiet "torch==$TORCH_VERSION" "numpy<2" "setuptools<70" \
    scipy networkx requests tqdm psutil pyyaml pydantic pandas >&2
# Without --no-deps, pip resolves DGL's "torchdata>=0.5" to a torchdata that requires a newer torch.
"${PIP[@]}" install --quiet --no-deps "torchdata==0.7.1" "dgl==$DGL_VERSION" >&2

"$ENV_DIR/bin/python" -c \
    "import dgl, torch; print('[dgl_env] dgl', dgl.__version__, 'torch', torch.__version__)" >&2
echo "$STAMP" > "$MARKER"
log "built in $(( $(date +%s) - start )) s, $(du -sh "$ENV_DIR" | cut -f1)"
echo "$ENV_DIR/bin/python"
