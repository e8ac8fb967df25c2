#!/usr/bin/env bash
# Builds the build-only real-board firmwares (rp2040, nrf52840) around the
# KWS int8 test model: compiles it with the mote CLI into a model directory
# (model.mote, model.rs from --emit-rust, input.bin: the quantized test
# inputs, one after the other), builds both crates with MOTE_FW_MODEL_DIR pointing there, and
# prints their flash/RAM use (arm-none-eabi-size).
#
#   boards/build-real.sh            # KWS from $MOTE_QUANT_MODELS or .cache/quant-models
#   MOTE_FW_MODEL_DIR=DIR boards/build-real.sh   # where the model directory goes
#
# Needs: rustup targets thumbv6m-none-eabi and thumbv7em-none-eabihf,
# python3 (standard library only), arm-none-eabi-size (gcc-arm-none-eabi).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
models=${MOTE_QUANT_MODELS:-$root/.cache/quant-models}
onnx=$models/kws.qdq.onnx
npy=$models/kws.input.npy
if [ ! -f "$onnx" ] || [ ! -f "$npy" ]; then
    echo "error: $onnx or $npy missing: generate them with" >&2
    echo "  python scripts/make_quant_models.py $models   (or set MOTE_QUANT_MODELS)" >&2
    exit 1
fi
dir=${MOTE_FW_MODEL_DIR:-$root/target/fw-models/kws}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}/boards

(cd "$root" && cargo build --release --quiet -p mote-std)
"${CARGO_TARGET_DIR:-$root/target}/release/mote" compile "$onnx" -o "$dir/model.mote" --emit-rust "$dir/model.rs"

# input.bin: the float input quantized as mote does (IoDesc::quantize:
# rintf(x / scale) + zero_point, saturated). Dividing in f64 and rounding to
# f32 gives the f32 quotient exactly; round() is half-to-even like rintf.
python3 - "$npy" "$dir/model.rs" "$dir/input.bin" <<'PY'
import ast, re, struct, sys
npy, rs, out = sys.argv[1:]
b = open(npy, "rb").read()
if b[:6] != b"\x93NUMPY":
    sys.exit(f"{npy}: not a .npy file")
hl, start = (struct.unpack("<H", b[8:10])[0], 10) if b[6] == 1 else (struct.unpack("<I", b[8:12])[0], 12)
hdr = ast.literal_eval(b[start:start + hl].decode("latin1"))
if hdr["descr"] != "<f4" or hdr["fortran_order"]:
    sys.exit(f"{npy}: expected little-endian float32 in C order, got {hdr}")
data = b[start + hl:]
xs = struct.unpack(f"<{len(data) // 4}f", data)
text = open(rs).read()
def const(name):
    m = re.search(rf"pub (?:const|type) {name}(?:: [a-z0-9]+)? = ([^;]+);", text)
    if not m:
        sys.exit(f"{rs}: no {name}")
    return m.group(1).strip()
scale = struct.unpack("<f", struct.pack("<f", float(const("INPUT0_SCALE"))))[0]
zp = int(const("INPUT0_ZERO_POINT"))
n = int(const("INPUT0_LEN"))
lo, hi = (0, 255) if const("INPUT0_TYPE") == "u8" else (-128, 127)
if len(xs) == 0 or len(xs) % n:
    sys.exit(f"{npy}: {len(xs)} values, not a whole number of inputs of {n}")
f32 = lambda v: struct.unpack("<f", struct.pack("<f", v))[0]
q = [min(max(round(f32(x / scale)) + zp, lo), hi) for x in xs]
open(out, "wb").write(bytes(v & 0xFF for v in q))
print(f"wrote {out}: {len(xs) // n} inputs of {n} bytes (scale {scale:e}, zero point {zp})")
PY

export MOTE_FW_MODEL_DIR=$dir
for b in rp2040:thumbv6m-none-eabi nrf52840:thumbv7em-none-eabihf; do
    name=${b%%:*} triple=${b#*:}
    (cd "$root/boards/$name" && cargo build --release --quiet --target-dir "$target_dir")
    elf=$target_dir/$triple/release/mote-fw-$name
    echo "== $name ($triple): $elf"
    arm-none-eabi-size -A "$elf" | grep -E '^(\.boot2|\.vector_table|\.text|\.rodata|\.data|\.bss|\.uninit) '
    arm-none-eabi-size "$elf"
done
