#!/usr/bin/env bash
# Lists the panic call sites left in the compiled-model runtime, innermost
# mote-core source line first, when `tests/tests/nostd.rs`'s link check
# fails: builds this crate with a real panic handler (feature `list`),
# disassembles it and symbolizes every call into core's panic functions.
#   bash boards/nopanic/sites.sh [TARGET]      (default thumbv7em-none-eabihf)
# Needs llvm-objdump and llvm-symbolizer (Debian package llvm).
set -euo pipefail
cd "$(dirname "$0")"
T="${1:-thumbv7em-none-eabihf}"
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-../../target/boards/nopanic-list}"
cargo build -q --release --features list --target "$T"
ELF="$CARGO_TARGET_DIR/$T/release/mote-nopanic"
DIS="$(mktemp)"
llvm-objdump -d --no-show-raw-insn "$ELF" >"$DIS"
# Core's panic entry points (panicking::*, slice index and length failures).
P=$(grep -E '^[0-9a-f]+ <' "$DIS" | grep -E 'core9panicking|slice5index|_fail|panic_const' |
  awk '{print $1}' | sed 's/^0*//' | paste -sd'|')
[ -n "$P" ] || { echo "no panic functions linked: nothing to list"; exit 0; }
ADDRS=$(grep -E "\\s(bl|b\\.w|b)\\s+0x($P)\\s" "$DIS" | awk '{print $1}' | tr -d ':' | sed 's/^/0x/')
echo "$(echo $ADDRS | wc -w) panic call site(s) in $ELF:"
for a in $ADDRS; do
  # The first mote-core frame of the inline chain, else the outermost.
  llvm-symbolizer --obj="$ELF" --inlining "$a" | paste - - | awk -v a="$a" '
    $2 ~ /\/core\/src\// && $2 !~ /rustc/ && !done { print a, $2, $1; done = 1 }
    { last = $0 }
    END { if (!done) print a, last }'
done | sort -k2
rm -f "$DIS"
