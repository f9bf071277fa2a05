#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang into build-fuzz/ and runs each for a bounded
# time from its seed corpus (fuzz/corpus/<target>); a crash, sanitizer report or unexpected
# exception fails. Where clang or libFuzzer is missing it says so and exits 0 (optional), or 1
# with ATOLL_REQUIRE_FUZZ=1 (CI).
#   scripts/fuzz.sh                 about 20 s per target
#   ATOLL_FUZZ_SECONDS=300 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${ATOLL_FUZZ_SECONDS:-20}"

missing_tool() {
  echo "fuzz: $1"
  [ "${ATOLL_REQUIRE_FUZZ:-0}" = 1 ] && exit 1
  exit 0
}
if ! command -v clang++ >/dev/null; then
  missing_tool "clang++ not found; fuzz targets skipped (scripts/setup.sh installs clang)"
fi
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' > "$probe/p.cpp"
if ! clang++ -fsanitize=fuzzer "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1; then
  missing_tool "clang++ cannot link libFuzzer (libclang-rt-*-dev missing); fuzz targets skipped"
fi

CXX=clang++ cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz
for target in safetensors config token_file; do
  work="$probe/$target"  # new inputs go here, never into the committed seeds
  mkdir -p "$work"
  echo "== fuzz_$target for ${seconds}s"
  status=0
  mkdir -p build-fuzz/findings
  # TMPDIR: the targets write each input to a scratch file under it; the trap removes it
  TMPDIR="$probe" build-fuzz/fuzz_$target -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="build-fuzz/findings/$target-" "$work" "fuzz/corpus/$target" >"$probe/$target.log" 2>&1 ||
    status=$?
  grep -E "^Done" "$probe/$target.log" || true
  if [ "$status" -ne 0 ]; then
    tail -40 "$probe/$target.log"
    echo "fuzz: fuzz_$target found a failing input (exit $status), saved under build-fuzz/findings/;" \
      "rerun it with build-fuzz/fuzz_$target <file>"
    exit 1
  fi
done
