#!/usr/bin/env bash
# Installs every system package atoll needs (Debian 12), then configures and builds.
# Idempotent: a second run skips apt when everything is present and rebuilds incrementally.
#   scripts/setup.sh            install + configure + build into ./build
#   ATOLL_BUILD_DIR=dir scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libcaf-dev libucx-dev ucx-utils catch2 libboost-dev libyaml-cpp-dev nlohmann-json3-dev
  libopenblas-dev libfmt-dev libspdlog-dev libcli11-dev libxxhash-dev
  clang libclang-rt-14-dev
  python3 python3-venv
)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get -o Acquire::Retries=3 update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Acquire::Retries=3 --no-install-recommends "${missing[@]}"
fi

# Python tools for interoperability tests (the safetensors package reads atoll's files), in a
# virtual environment of the project's own; tests that need it skip cleanly without it.
python_tools_missing() {  # CI requires the Python tests (ATOLL_REQUIRE_PYTHON_TESTS=1): fail here, not after the build
  echo "setup: $1; the Python interoperability tests will skip"
  if [ "${ATOLL_REQUIRE_PYTHON_TESTS:-0}" = 1 ]; then exit 1; fi
}
if ! .venv-tools/bin/python -c "import safetensors, numpy" >/dev/null 2>&1; then
  if /usr/bin/python3 -m venv .venv-tools >/dev/null 2>&1; then
    # Pinned: the NumPy references are checked with these (a new release must not move them).
    .venv-tools/bin/pip install -q --disable-pip-version-check --retries 5 safetensors==0.8.0 numpy==2.4.6 ||
      python_tools_missing "could not install safetensors/numpy"
  else
    python_tools_missing "python3 venv unavailable"
  fi
fi

# nvcc lives outside PATH on some machines; the CUDA parts build only when it is found.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

build_dir="${ATOLL_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build_dir" -j "$(nproc)"
