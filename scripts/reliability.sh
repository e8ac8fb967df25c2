#!/usr/bin/env bash
# The reliability checks of .ci/run that need more than `cargo test`
# (README "Reliability"):
#   1. mote-core's unit tests on a 32-bit host target (i686): sizes past
#      32 bits must be errors there, not wrapped;
#   2. the kernels' unsafe code under Miri (a fast subset of the kernel
#      tests: every unsafe path, small cases);
#   3. every fuzz target for FUZZ_SECONDS (default 60) each;
#   4. panic sites: the on-device ONNX firmware (import, optimizer, planner,
#      every operator) built as a size-optimized LTO release must keep no
#      panic call on a mote-core source line (boards/onnx-an386/panic-sites.sh;
#      needs the model that tests/tests/onnx_on_device.rs writes).
# Each step installs what it needs when missing.
#   bash scripts/reliability.sh [i686] [miri] [fuzz] [panics]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(i686 miri fuzz panics)
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

for step in "${STEPS[@]}"; do
  case "$step" in
    i686)
      echo "== mote-core unit tests on i686 (32-bit usize)"
      rustup target add i686-unknown-linux-gnu >/dev/null 2>&1 ||
        rustup target add i686-unknown-linux-gnu
      # The 32-bit C runtime to link test binaries.
      if [ ! -e /usr/lib/gcc/x86_64-linux-gnu/12/32/libgcc.a ] &&
        ! ls /usr/lib/gcc/x86_64-linux-gnu/*/32/libgcc.a >/dev/null 2>&1; then
        $SUDO apt-get update && $SUDO apt-get install -y gcc-multilib
      fi
      cargo test -q -p mote-core --lib --target i686-unknown-linux-gnu
      ;;
    miri)
      echo "== kernel tests under Miri (subset)"
      if ! cargo +nightly --version >/dev/null 2>&1; then
        rustup toolchain install nightly --profile minimal
      fi
      rustup +nightly component add miri rust-src >/dev/null 2>&1 ||
        rustup +nightly component add miri rust-src
      cargo +nightly miri setup >/dev/null
      # The parallel-for hook and SharedMut (threads), the f32 GEMM and
      # depthwise kernels, the integer GEMM, depthwise (flat and row paths,
      # in place), pointwise in place and requantization: each reaches the
      # unsafe blocks of its module with small cases (kern::pick / count).
      # Built with AVX2+FMA enabled, so that the tests' kernel lists
      # (kinds()) hold both the portable blocked kernels and the AVX2
      # micro-kernels: Miri interprets the intrinsics, whatever the host.
      # Then the arena views of sessions and kernels (session.rs, ops/mod.rs:
      # whole small runs, in place, aliased, with a run-time shape record)
      # and the parallel output split of convolutions (under Miri the split
      # threshold is lowered so that small convolutions split).
      RUSTFLAGS="-C target-feature=+avx2,+fma" CARGO_TARGET_DIR=target/miri-avx2 \
        cargo +nightly miri test -q -p mote-core --lib -- \
        kern::par:: \
        kern::dwconv:: \
        kern::sgemm::tests::dots_match_reference \
        kern::sgemm::tests::beta_zero_never_reads_c \
        kern::sgemm::tests::short_buffers_are_refused \
        kern::qconv::tests::in_place_ \
        kern::qconv::tests::fuzz_ \
        kern::qconv::tests::qgemm_ \
        kern::requant::tests::bad_multipliers_are_errors_not_panics \
        kern::requant::tests::branch_free_rounding_is_the_branchy_one \
        session::tests:: \
        ops::conv::tests::split_conv_small \
        ops::select::tests::compress_non_zero_unique \
        kern::dconv::tests::matches_reference_on_small_geometries
      # The AVX-512 VNNI integer GEMM (kern/qgemm_vnni.rs), which CI
      # machines without VNNI never run natively: built with its target
      # features, Miri interprets vpdpbusd and the tests' kernel list
      # (qgemm::testing::selections) includes it. With it, the int8
      # depthwise flat path's AVX-512 row copy and AVX2 row packing
      # (kern::qdw::tests; the whole flat path cannot run under Miri: it
      # lacks vpermi2d). And the f32 AVX-512 depthwise planes
      # (kern/dw512.rs: masked loads and stores at the planes' edges; a
      # planted mask letting a lane read before the input fails it), and
      # the direct Conv's 16-lane tiles on small geometries (kern/dconv.rs,
      # its last vector loaded and stored masked; a planted unmasked store
      # fails it as a write past Y; with AVX2 above it runs the 8-lane
      # tiles: 11 + 16 s), and the f32 GEMM's 12 x 32 tiles on every source
      # of B (in place at its row stride, packed by the task, prepacked;
      # 22 s). The int8 requantization's AVX-512 rows (kern/requant.rs:
      # masked loads and byte stores of row tails; a planted unmasked load
      # fails it as a read past the sums; 14 s), which the VNNI GEMM and
      # depthwise tests above reach too, with the GEMM's AVX-512 B packing.
      RUSTFLAGS="-C target-feature=+avx2,+fma,+avx512f,+avx512bw,+avx512vnni" \
        CARGO_TARGET_DIR=target/miri-vnni \
        cargo +nightly miri test -q -p mote-core --lib -- kern::qconv::tests::qgemm_ kern::qdw::tests:: \
        kern::dw512::tests:: kern::dconv::tests::matches_reference_on_small_geometries \
        kern::sgemm::tests::avx512_tiles_give_the_avx2_bits_from_every_source \
        kern::requant::tests::avx512_row_is_the_loop
      ;;
    fuzz)
      bash scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
      ;;
    panics)
      echo "== panic call sites in the on-device ONNX path"
      if ! command -v llvm-objdump >/dev/null || ! command -v llvm-symbolizer >/dev/null; then
        $SUDO apt-get update && $SUDO apt-get install -y llvm
      fi
      bash boards/onnx-an386/panic-sites.sh --max-core 0
      ;;
    *)
      echo "unknown step '$step' (i686, miri, fuzz, panics)" >&2
      exit 2
      ;;
  esac
done
