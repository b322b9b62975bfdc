#!/usr/bin/env bash
# One-time (and idempotent) set-up of everything mtpc builds against.
#
#  * Debian packages: MLIR/LLVM 19 and their tools (lit, FileCheck), the ANTLR4
#    tool and C++ runtime, flatbuffers, GoogleTest, ccache, Ninja, Java,
#    Chromium (headless, for the `mtpc report` page tests).
#  * LibTorch from the pinned PyPI `torch` wheel (and `transformers`, for the
#    pretrained-model tests), in a virtual environment kept
#    OUTSIDE the checkout ($MTPC_CACHE, default ~/.cache/mtpc) so that every
#    fresh clone (CI's included) reuses it.
#
# It writes $MTPC_CACHE/toolchain.env: the paths and facts the build needs
# (Torch_DIR, the wheel's CUDA version, whether it matches /usr/local/cuda).
# A second run with everything present takes a second or two.
set -euo pipefail

TORCH_VERSION=${MTPC_TORCH_VERSION:-2.11.0}
CACHE=${MTPC_CACHE:-$HOME/.cache/mtpc}
VENV=$CACHE/venv
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
ENV_FILE=$CACHE/toolchain.env

say() { printf '[setup] %s\n' "$*"; }

# --- Debian packages ---------------------------------------------------------
PKGS=(libmlir-19-dev mlir-19-tools llvm-19-dev llvm-19-tools
      antlr4 libantlr4-runtime-dev
      libflatbuffers-dev flatbuffers-compiler
      nlohmann-json3-dev             # the runtime's JSON (metrics, --dump-init)
      libgtest-dev googletest
      ccache ninja-build cmake default-jre-headless
      zlib1g-dev libzstd-dev libedit-dev libxml2-dev libcurl4-openssl-dev libffi-dev
      python3-venv
      clang-19 libclang-rt-19-dev    # libFuzzer + ASan for the frontend fuzzer
      chromium)                      # headless, loads `mtpc report` pages in the tests
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  say "Debian packages present"
fi

# --- LibTorch from the pinned torch wheel --------------------------------------
mkdir -p "$CACHE"
PY=${MTPC_PYTHON:-python3}
have_torch() {
  [ -x "$VENV/bin/python" ] &&
    [ "$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" = "$TORCH_VERSION" ]
}
TORCH_SOURCE=pypi
if have_torch; then
  say "torch $TORCH_VERSION present in $VENV"
else
  say "installing torch==$TORCH_VERSION into $VENV (several GB, once)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  if ! "$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION" numpy; then
    say "PyPI torch==$TORCH_VERSION unavailable: falling back to Debian's libtorch-dev (1.13, CPU only)"
    TORCH_SOURCE=debian
  fi
fi

# transformers (and safetensors with it) for the pretrained-model tests:
# they build small random models from configs and compare against them;
# nothing is downloaded from a model hub.
TRANSFORMERS_VERSION=${MTPC_TRANSFORMERS_VERSION:-5.24.0}
if [ "$TORCH_SOURCE" = pypi ]; then
  if [ "$("$VENV/bin/python" -c 'import transformers; print(transformers.__version__)' 2>/dev/null)" = "$TRANSFORMERS_VERSION" ]; then
    say "transformers $TRANSFORMERS_VERSION present"
  else
    say "installing transformers==$TRANSFORMERS_VERSION into $VENV"
    "$VENV/bin/python" -m pip install -q "transformers==$TRANSFORMERS_VERSION" ||
      say "transformers unavailable: the pretrained-model tests will be skipped"
  fi
fi

# The data tools and the metric checks (issue 19): `mtpc prepare` reads
# sentencepiece models (tokenizers comes with transformers); the tests check
# every evaluation metric against scikit-learn, scipy and seqeval.
DATA_PACKAGES="sentencepiece==0.2.3 scikit-learn==1.9.1 scipy==1.17.1 seqeval==1.2.2"
if [ -x "$VENV/bin/python" ]; then
  if "$VENV/bin/python" -c 'import sentencepiece, sklearn, scipy, seqeval' 2>/dev/null; then
    say "sentencepiece, scikit-learn, scipy, seqeval present"
  else
    say "installing $DATA_PACKAGES into $VENV"
    "$VENV/bin/python" -m pip install -q $DATA_PACKAGES ||
      say "data packages unavailable: the sentencepiece and metric tests will be skipped"
  fi
fi

if [ "$TORCH_SOURCE" = pypi ]; then
  TORCH_DIR=$("$VENV/bin/python" -c 'import torch, os; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))')
  TORCH_VER=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')
  TORCH_CUDA=$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda or "none")')
  TORCH_LIB=$("$VENV/bin/python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
else
  dpkg-query -W -f='${Status}' libtorch-dev 2>/dev/null | grep -q "install ok installed" ||
    { SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo; $SUDO apt-get install -y -qq libtorch-dev libgloo-dev; }
  TORCH_DIR=/usr/share/cmake/Torch
  TORCH_VER=$(dpkg-query -W -f='${Version}' libtorch-dev)
  TORCH_CUDA=none
  TORCH_LIB=/usr/lib/x86_64-linux-gnu
fi

# CUDA toolkit in /usr/local/cuda vs. the wheel's CUDA runtime: the runtime's
# LibTorch-CUDA parts are built only where the major.minor versions match.
SYS_CUDA=none
if [ -x "$CUDA_HOME/bin/nvcc" ]; then
  SYS_CUDA=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
fi
TORCH_CUDA_MATCH=OFF
[ "$TORCH_CUDA" != none ] && [ "$TORCH_CUDA" = "$SYS_CUDA" ] && TORCH_CUDA_MATCH=ON

cat >"$ENV_FILE.tmp" <<EOV
# written by scripts/setup.sh; read by scripts/build.sh
MTPC_TORCH_SOURCE=$TORCH_SOURCE
MTPC_TORCH_VERSION=$TORCH_VER
MTPC_TORCH_DIR=$TORCH_DIR
MTPC_TORCH_LIB=$TORCH_LIB
MTPC_TORCH_CUDA=$TORCH_CUDA
MTPC_SYSTEM_CUDA=$SYS_CUDA
MTPC_TORCH_CUDA_MATCH=$TORCH_CUDA_MATCH
MTPC_VENV=$VENV
EOV
mv "$ENV_FILE.tmp" "$ENV_FILE"
say "LibTorch $TORCH_VER ($TORCH_SOURCE), wheel CUDA $TORCH_CUDA, /usr/local/cuda $SYS_CUDA, LibTorch-CUDA parts: $TORCH_CUDA_MATCH"
say "wrote $ENV_FILE"
