#!/usr/bin/env bash
# Lists the panic call sites left in the compiled-model runtime, innermost
# mote-core source line first, when `tests/tests/nostd.rs`'s link check
# fails: builds this crate with a real panic handler (feature `list`) and
# symbolizes every call into core's panic functions (scripts/panic_sites.py).
#   bash boards/nopanic/sites.sh [TARGET]      (default thumbv7em-none-eabihf)
# Needs llvm-objdump and llvm-symbolizer (Debian package llvm).
set -euo pipefail
cd "$(dirname "$0")"
T="${1:-thumbv7em-none-eabihf}"
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-../../target/boards/nopanic-list}"
cargo build -q --release --features list --target "$T"
python3 ../../scripts/panic_sites.py --list "$CARGO_TARGET_DIR/$T/release/mote-nopanic"
