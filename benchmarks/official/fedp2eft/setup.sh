#!/usr/bin/env bash
# Prepare the authors' FedP2EFT code (royson/fedp2eft) to run on this CPU machine, outside the fedpeft package:
# a copy of their repository at the pinned commit with our patches applied, and a virtual environment of its own
# built from their requirement.txt pins.
#
#   bash benchmarks/official/fedp2eft/setup.sh [--repo PATH_OR_URL] [--work DIR]
#
# --repo: where to clone their repository from (default: GitHub). Any git source works: a local clone or a bare
#         mirror. The commit is pinned (COMMIT below) whatever the source.
# --work: the work folder (default: benchmarks/official/fedp2eft/.work, git-ignored). It receives repo/ (their code,
#         patched) and venv/ (Python 3.11). Run again to refresh: the clone is redone, the venv reused.
set -euo pipefail
shopt -s nullglob

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO_URL="https://github.com/royson/fedp2eft"
COMMIT="35ef17d"
WORK="$HERE/.work"
PYTHON="${PYTHON:-python3.11}"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --repo) REPO_URL="$2"; shift 2 ;;
        --work) WORK="$2"; shift 2 ;;
        *) echo "unknown argument: $1 (use --repo PATH_OR_URL, --work DIR)" >&2; exit 2 ;;
    esac
done
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"

# 1. Their code at the pinned commit, patched. A fresh clone each time, so the patches always apply to pristine files.
rm -rf "$WORK/repo"
git clone --quiet "$REPO_URL" "$WORK/repo"
git -C "$WORK/repo" -c advice.detachedHead=false checkout --quiet "$COMMIT"
for patch in "$HERE"/patches/*.patch; do
    git -C "$WORK/repo" apply --whitespace=nowarn "$patch"
done
echo "their code: $WORK/repo at $(git -C "$WORK/repo" rev-parse --short HEAD), patches: $(ls "$HERE"/patches/*.patch | wc -l)"

# 2. The virtual environment. Their README asks for Python 3.10; this machine's CPU build of torch is a cp311 wheel.
if [[ ! -x "$WORK/venv/bin/python" ]]; then
    "$PYTHON" -m venv "$WORK/venv"
fi
PIP=("$WORK/venv/bin/python" -m pip install --quiet)
# torch: their pins imply torch 2.4 (torchaudio==2.4.0), whose Linux wheel on PyPI is the CUDA 12.1 build (with a
# dozen nvidia-* wheels, gigabytes). The CPU build of torch 2.13.0 that this machine holds is used instead
# (README.md, "torch").
"${PIP[@]}" "torch==2.13.0"
# Their pins, less what cannot install or run here (README.md, "Environment"): flash-attn (CUDA build), torchaudio
# (pins torch 2.4.0; no file imports it), pip (the venv's own), unstructured and python-pptx (no file imports them),
# learn2learn (below). Five additions that their pins leave open: flwr 1.7.0 needs numpy < 2, which the newest
# pyarrow and pandas refuse; wandb 0.14.0 imports pkg_resources, gone from setuptools 81 (torch 2.13 wants >= 77),
# and sentry_sdk.Hub, gone from sentry-sdk 3 (its pins leave sentry-sdk open: 3.0.1 broke every run of theirs);
# trl 0.10.1 imports rich without declaring it.
SKIP='^(flash-attn|torchaudio|pip|unstructured|python-pptx|learn2learn)=='
grep -v -E "$SKIP" "$WORK/repo/requirement.txt" > "$WORK/requirements.cpu.txt"
"${PIP[@]}" -r "$WORK/requirements.cpu.txt" "torch==2.13.0" "pyarrow<19" "pandas<2.3" "setuptools>=77,<81" "sentry-sdk<2" rich
# learn2learn 0.1.7 does not build for Python 3.11 (its generated C includes longintrepr.h) and its import needs a
# torchvision matching torch (this machine's is a CUDA build); their code imports one class from it, for FedL2P.
# A stand-in (shims/learn2learn) provides the name and refuses to be used.
SITE="$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$SITE/learn2learn"
cp -r "$HERE/shims/learn2learn" "$SITE/learn2learn"
"$WORK/venv/bin/python" -m pip freeze > "$WORK/venv.freeze.txt"
echo "venv: $WORK/venv ($("$WORK/venv/bin/python" -c 'import torch, transformers, peft, flwr, ray; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__, "flwr", flwr.__version__, "ray", ray.__version__)'))"
