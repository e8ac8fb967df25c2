#!/usr/bin/env python3
"""Build float16 versions of the test models and record onnxruntime's f16 outputs.

Usage: make_f16_models.py OUTDIR

The f32 models of make_test_models.py (mlp, cnn, mobilenet, dynamic) and a
small conv net (`convnet`: Conv, grouped Conv, BatchNormalization, AveragePool,
Add, Concat, ConvTranspose, MaxPool, GlobalAveragePool, MatMul, Softmax) are
converted with onnxconverter-common's `float16.convert_float_to_float16`, once
with keep_io_types=False (`NAME_f16`: f16 input and output) and once with
keep_io_types=True (`NAME_f16io`: f32 input and output, Casts at the edges).
For each converted model this writes

  OUTDIR/NAME.onnx           the converted model
  OUTDIR/NAME.input.npy      a seeded random input (f16 or f32, as the model takes)
  OUTDIR/NAME.expected.npy   onnxruntime CPU output of the f16 model (ORT_DISABLE_ALL)
  OUTDIR/NAME.f32.npy        onnxruntime output of the original f32 model on the
                             same input (to report the f16 model's own error)

and the f32 model itself as OUTDIR/BASE_f32.onnx with BASE_f32.input.npy (the
input rounded to f16 values), to compare arena sizes.

Everything is seeded, so repeated runs write identical files.
"""
import argparse
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_test_models as base  # noqa: E402

from onnxconverter_common import float16  # noqa: E402


def make_convnet():
    b = base.Builder(5)
    h = b.conv("input", 3, 8, 3, pad=1)  # 16x16
    h = b.bn(h, 8)
    h = b.node("Relu", [h])
    a = b.node("AveragePool", [h], kernel_shape=[2, 2], strides=[2, 2])  # 8x8
    g = b.conv(a, 8, 8, 3, pad=1, group=2)
    p = b.conv(a, 8, 8, 1)
    s = b.node("Add", [g, p])
    c = b.node("Concat", [s, a], axis=1)  # 16 x 8x8
    w = b.weight("up.weight", (16, 4, 2, 2))
    t = b.node("ConvTranspose", [c, w], kernel_shape=[2, 2], strides=[2, 2])  # 4 x 16x16
    t = b.node("MaxPool", [t], kernel_shape=[2, 2], strides=[2, 2])  # 4 x 8x8
    c = b.node("Concat", [c, t], axis=1)  # 20 x 8x8
    h = b.node("GlobalAveragePool", [c])
    h = b.node("Flatten", [h], axis=1)
    w = b.weight("head.weight", (20, 10), scale=3.0)
    h = b.node("MatMul", [h, w])
    bias = b.weight("head.bias", (10,))
    h = b.node("Add", [h, bias])
    b.node("Softmax", [h], out="output", axis=-1)
    return b.finish("convnet", "input", [1, 3, 16, 16], "output", [1, 10], 13), (1, 3, 16, 16)


MODELS = dict(base.MODELS)
MODELS["convnet"] = make_convnet


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)

    for seed, (name, fn) in enumerate(MODELS.items()):
        model, in_shape = fn()
        onnx.checker.check_model(model, full_check=True)
        rng = np.random.default_rng(2000 + seed)
        x32 = rng.standard_normal(in_shape).astype(np.float32)
        f32_path = os.path.join(args.outdir, f"{name}_f32.onnx")
        onnx.save(model, f32_path)
        s32 = base.ort_session(f32_path)
        for keep_io, suffix in [(False, "f16"), (True, "f16io")]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m16 = float16.convert_float_to_float16(model, keep_io_types=keep_io)
            onnx.checker.check_model(m16, full_check=True)
            out = f"{name}_{suffix}"
            path = os.path.join(args.outdir, f"{out}.onnx")
            onnx.save(m16, path)
            in_type = m16.graph.input[0].type.tensor_type.elem_type
            x = x32.astype(np.float16) if in_type == TensorProto.FLOAT16 else x32
            sess = base.ort_session(path)
            (inp,) = sess.get_inputs()
            (o,) = sess.get_outputs()
            y = sess.run([o.name], {inp.name: x})[0]
            # The f32 model on the very same (f16-rounded, for f16 inputs) values.
            y32 = s32.run(None, {s32.get_inputs()[0].name: x.astype(np.float32)})[0]
            np.save(os.path.join(args.outdir, f"{out}.input.npy"), x)
            np.save(os.path.join(args.outdir, f"{out}.expected.npy"), y)
            np.save(os.path.join(args.outdir, f"{out}.f32.npy"), y32)
            err = np.max(np.abs(y.astype(np.float64) - y32.astype(np.float64)))
            param_bytes = sum(t.ByteSize() for t in m16.graph.initializer)
            print(
                f"{out:16s} nodes={len(m16.graph.node):3d} init_bytes={param_bytes:8d} "
                f"input={x.dtype}{list(x.shape)} output={y.dtype}{list(y.shape)} "
                f"ort f16 vs f32 max abs {err:.2e}"
            )
        # The f32 model itself, on the f16-rounded input (arena comparison).
        np.save(os.path.join(args.outdir, f"{name}_f32.input.npy"), x32.astype(np.float16).astype(np.float32))


if __name__ == "__main__":
    main()
