#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh) and runs the default test suite: labels unit and golden.
# Longer suites: ctest --test-dir build/release -L slow
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build/release -L 'unit|golden' --output-on-failure -j "$(nproc)"
