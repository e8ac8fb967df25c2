#!/usr/bin/env python3
"""Build the int8 / f16 test models of quantized inference, with references.

Usage: make_quant_models.py OUTDIR

Float models (onnx.helper, opset 13, seeded He-normal weights, BatchNorm
folded into the conv weights and biases):

  mlp      MLP 784-256-128-10 (Gemm, Relu), logits out
  kws      MLPerf Tiny keyword spotting DS-CNN: 1x1x49x10, Conv 64 10x4 s2
           (same padding), 4 depthwise-separable blocks of 64, AveragePool,
           Flatten, Gemm 12 (logits)
  mbv1     MobileNetV1 width 0.25 at 1x3x96x96 (MLPerf Tiny visual wake
           words), ReLU6 (Clip 0..6), GlobalAveragePool, Gemm 2
  resnet8  MLPerf Tiny image classification ResNet-8 at 1x3x32x32: conv 16,
           stages 16/32/64 (stride 2 and 1x1 shortcut conv in stages 2, 3),
           Add, Relu, GlobalAveragePool, Gemm 10

For each model NAME this writes

  NAME.f32.onnx                 the float model
  NAME.qdq.onnx / .qdq_pc.onnx  quantize_static QDQ, per tensor / per channel
  NAME.qop.onnx / .qop_pc.onnx  quantize_static QOperator, per tensor / channel
  kws.qdq_u8.onnx               QDQ per tensor with uint8 activations
  NAME.f16.onnx                 (kws, resnet8) float16 everywhere, f16 IO
  NAME.f16_f32io.onnx           (kws, resnet8) float16 inside, f32 IO
  NAME.input.npy                8 seeded inputs (f32) stacked on a new axis 0
                                (the models have batch 1: run one at a time);
                                NAME.f16.input.npy the same in f16
  MODEL.ref.npy                 onnxruntime, ORT_DISABLE_ALL (ONNX meaning),
                                the 8 outputs stacked on a new axis 0
  MODEL.ort_opt.npy             (int8) onnxruntime, ORT_ENABLE_ALL, stacked
  manifest.json                 one entry per model file (see `entry` below)

int8 models are activations QInt8 (except kws.qdq_u8: QUInt8) and weights
QInt8, calibrated (MinMax) on 16 seeded random samples of the input
distribution. Every model passes onnx.checker. Everything is seeded, so
repeated runs write identical files. manifest.json is written last: its
presence means the set is complete.
"""
import argparse
import json
import os
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

PRODUCER = "mote-scripts"
OPSET = 13
N_CALIB = 16
N_SAMPLES = 8


class Builder:
    """Accumulates nodes/initializers; seeded He-normal weights, BN folded."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []
        self.counter = 0

    def name(self, prefix):
        self.counter += 1
        return f"{prefix}_{self.counter}"

    def init(self, name, arr):
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(self, op, inputs, out=None, **attrs):
        nm = self.name(op.lower())
        o = out if out is not None else f"{nm}_out"
        self.nodes.append(helper.make_node(op, inputs, [o], name=nm, **attrs))
        return o

    def conv_bn(self, x, c_in, c_out, kh, kw=None, stride=1, pads=None, group=1, bn=True):
        """Conv with He-normal weights; a random BatchNorm folded into it."""
        kw = kh if kw is None else kw
        nm = self.name("conv")
        r = self.rng
        fan_in = (c_in // group) * kh * kw
        w = r.standard_normal((c_out, c_in // group, kh, kw)) * np.sqrt(2.0 / fan_in)
        b = np.zeros(c_out)
        if bn:
            gamma = 1.0 + 0.1 * r.standard_normal(c_out)
            beta = 0.1 * r.standard_normal(c_out)
            mean = 0.1 * r.standard_normal(c_out)
            var = r.uniform(0.5, 1.5, c_out)
            s = gamma / np.sqrt(var + 1e-5)
            w = w * s[:, None, None, None]
            b = beta - mean * s
        else:
            b = 0.05 * r.standard_normal(c_out)
        if pads is None:
            pads = [kh // 2, kw // 2, kh // 2, kw // 2]
        wn = self.init(f"{nm}.weight", w.astype(np.float32))
        bn_ = self.init(f"{nm}.bias", b.astype(np.float32))
        return self.node(
            "Conv", [x, wn, bn_], kernel_shape=[kh, kw], strides=[stride, stride], pads=pads, group=group
        )

    def gemm(self, x, k_in, k_out, out=None):
        nm = self.name("fc")
        w = self.rng.standard_normal((k_out, k_in)) * np.sqrt(2.0 / k_in)
        b = 0.05 * self.rng.standard_normal(k_out)
        wn = self.init(f"{nm}.weight", w.astype(np.float32))
        bn = self.init(f"{nm}.bias", b.astype(np.float32))
        return self.node("Gemm", [x, wn, bn], out=out, transB=1)

    def relu6(self, x):
        if "clip.min" not in {i.name for i in self.inits}:
            self.init("clip.min", np.array(0.0, dtype=np.float32))
            self.init("clip.max", np.array(6.0, dtype=np.float32))
        return self.node("Clip", [x, "clip.min", "clip.max"])

    def finish(self, graph_name, inp, inp_shape, out, out_shape):
        graph = helper.make_graph(
            self.nodes,
            graph_name,
            [helper.make_tensor_value_info(inp, TensorProto.FLOAT, inp_shape)],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
            initializer=self.inits,
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER, producer_version="1"
        )
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        return model


def make_mlp():
    b = Builder(11)
    h = b.node("Relu", [b.gemm("input", 784, 256)])
    h = b.node("Relu", [b.gemm(h, 256, 128)])
    b.gemm(h, 128, 10, out="logits")
    return b.finish("mlp", "input", [1, 784], "logits", [1, 10])


def make_kws():
    b = Builder(12)
    # 'same' padding of a 10x4 stride-2 kernel on 49x10: out 25x5, pads 4/5, 1/1.
    h = b.conv_bn("input", 1, 64, 10, 4, stride=2, pads=[4, 1, 5, 1])
    h = b.node("Relu", [h])
    for _ in range(4):
        h = b.node("Relu", [b.conv_bn(h, 64, 64, 3, group=64)])
        h = b.node("Relu", [b.conv_bn(h, 64, 64, 1)])
    h = b.node("AveragePool", [h], kernel_shape=[25, 5], strides=[25, 5])
    h = b.node("Flatten", [h], axis=1)
    b.gemm(h, 64, 12, out="logits")
    return b.finish("kws", "input", [1, 1, 49, 10], "logits", [1, 12])


def make_mbv1():
    b = Builder(13)
    a = 0.25
    c = int(32 * a)
    h = b.relu6(b.conv_bn("input", 3, c, 3, stride=2))  # 48x48
    layers = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)]
    layers += [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    for co, s in layers:
        co = int(co * a)
        h = b.relu6(b.conv_bn(h, c, c, 3, stride=s, group=c))
        h = b.relu6(b.conv_bn(h, c, co, 1))
        c = co
    h = b.node("GlobalAveragePool", [h])
    h = b.node("Flatten", [h], axis=1)
    b.gemm(h, c, 2, out="logits")
    return b.finish("mbv1", "input", [1, 3, 96, 96], "logits", [1, 2])


def make_resnet8():
    b = Builder(14)
    h = b.node("Relu", [b.conv_bn("input", 3, 16, 3)])
    c = 16
    for co, s in [(16, 1), (32, 2), (64, 2)]:
        y = b.node("Relu", [b.conv_bn(h, c, co, 3, stride=s)])
        y = b.conv_bn(y, co, co, 3)
        sc = h if (s == 1 and c == co) else b.conv_bn(h, c, co, 1, stride=s, pads=[0, 0, 0, 0], bn=False)
        h = b.node("Relu", [b.node("Add", [y, sc])])
        c = co
    h = b.node("GlobalAveragePool", [h])
    h = b.node("Flatten", [h], axis=1)
    b.gemm(h, c, 10, out="logits")
    return b.finish("resnet8", "input", [1, 3, 32, 32], "logits", [1, 10])


# name -> (builder, input shape, sampler(rng, shape), depth class, f16 variants)
MODELS = {
    "mlp": (make_mlp, (1, 784), lambda r, s: r.uniform(0.0, 1.0, s), "shallow", False),
    "kws": (make_kws, (1, 1, 49, 10), lambda r, s: r.standard_normal(s), "shallow", True),
    "mbv1": (make_mbv1, (1, 3, 96, 96), lambda r, s: r.uniform(-1.0, 1.0, s), "deep", False),
    "resnet8": (make_resnet8, (1, 3, 32, 32), lambda r, s: r.standard_normal(s), "deep", True),
}

# variant -> (quant format, per channel, activation type)
QUANT = {
    "qdq": (QuantFormat.QDQ, False, QuantType.QInt8),
    "qdq_pc": (QuantFormat.QDQ, True, QuantType.QInt8),
    "qop": (QuantFormat.QOperator, False, QuantType.QInt8),
    "qop_pc": (QuantFormat.QOperator, True, QuantType.QInt8),
}
EXTRA_QUANT = {"kws": {"qdq_u8": (QuantFormat.QDQ, False, QuantType.QUInt8)}}


class Reader(CalibrationDataReader):
    def __init__(self, name, samples):
        self.name = name
        self.samples = samples
        self.i = 0

    def get_next(self):
        if self.i >= len(self.samples):
            return None
        self.i += 1
        return {self.name: self.samples[self.i - 1]}


def run_ort(path, name, xs, level):
    """Outputs of the model on each sample of xs (stacked on a new axis 0)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    (out,) = sess.get_outputs()
    return np.stack([sess.run([out.name], {name: x})[0] for x in xs])


def output_quant(model):
    """(scale, zero point) of the DequantizeLinear producing the graph output, or None."""
    out = model.graph.output[0].name
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if out in n.output and n.op_type == "DequantizeLinear":
            scale = inits.get(n.input[1])
            zp = inits.get(n.input[2]) if len(n.input) > 2 else None
            if scale is None or scale.size != 1:
                return None
            return float(scale.reshape(())), (int(zp.reshape(())) if zp is not None else 0)
    return None


def compare(ref, got, scale):
    """Statistics of got against ref: in LSBs of `scale`, or float (scale None)."""
    top1 = bool(np.all(np.argmax(ref, axis=-1) == np.argmax(got, axis=-1)))
    ref = ref.astype(np.float64).ravel()
    got = got.astype(np.float64).ravel()
    d = np.abs(got - ref)
    if scale is None:
        return {"max_abs_diff": float(d.max()), "frac_exact": float(np.mean(d == 0)), "top1_equal": top1}
    lsb = np.rint(d / scale)
    return {
        "max_lsb_diff": int(lsb.max()),
        "frac_exact": float(np.mean(lsb == 0)),
        "top1_equal": top1,
        "max_abs_diff": float(d.max()),
    }


def main():
    # Imported here so the model builders above import without onnxconverter_common (bench/).
    from onnxconverter_common import float16

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    args = ap.parse_args()
    out = args.outdir
    os.makedirs(out, exist_ok=True)
    man = os.path.join(out, "manifest.json")
    if os.path.exists(man):
        os.remove(man)
    t0 = time.time()
    entries = []

    def entry(file, base, kind, per_channel, act, model, input_file, ref_file, ort_opt_file=None, stats=None, oq=None):
        entries.append(
            {
                "file": file,
                "base": base,
                "kind": kind,
                "per_channel": per_channel,
                "activation_type": act,
                "depth": MODELS[base][3],
                "input_name": model.graph.input[0].name,
                "output_name": model.graph.output[0].name,
                "input_file": input_file,
                "samples": N_SAMPLES,
                "ref_file": ref_file,
                "ort_opt_file": ort_opt_file,
                "output_scale": None if oq is None else oq[0],
                "output_zero_point": None if oq is None else oq[1],
                "ort_opt_vs_ref": stats,
            }
        )

    for seed, (name, (fn, shape, sample, _depth, with_f16)) in enumerate(MODELS.items()):
        model = fn()
        f32 = f"{name}.f32.onnx"
        f32_path = os.path.join(out, f32)
        onnx.save(model, f32_path)
        rng = np.random.default_rng(2000 + seed)
        calib = [sample(rng, shape).astype(np.float32) for _ in range(N_CALIB)]
        x = sample(np.random.default_rng(3000 + seed), (N_SAMPLES,) + shape).astype(np.float32)
        inp = model.graph.input[0].name
        np.save(os.path.join(out, f"{name}.input.npy"), x)
        ref = run_ort(f32_path, inp, x, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        np.save(os.path.join(out, f"{name}.f32.ref.npy"), ref)
        entry(f32, name, "f32", False, "float32", model, f"{name}.input.npy", f"{name}.f32.ref.npy")

        variants = dict(QUANT)
        variants.update(EXTRA_QUANT.get(name, {}))
        for var, (fmt, pc, act) in variants.items():
            stem = f"{name}.{var}"
            path = os.path.join(out, f"{stem}.onnx")
            with tempfile.TemporaryDirectory() as td:
                tmp = os.path.join(td, "q.onnx")
                quantize_static(
                    f32_path,
                    tmp,
                    Reader(inp, calib),
                    quant_format=fmt,
                    per_channel=pc,
                    activation_type=act,
                    weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax,
                )
                q = onnx.load(tmp)
            q.producer_name = PRODUCER
            onnx.checker.check_model(q, full_check=True)
            onnx.save(q, path)
            r = run_ort(path, inp, x, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
            o = run_ort(path, inp, x, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
            np.save(os.path.join(out, f"{stem}.ref.npy"), r)
            np.save(os.path.join(out, f"{stem}.ort_opt.npy"), o)
            oq = output_quant(q)
            st = compare(r, o, None if oq is None else oq[0])
            kind = "qdq" if fmt == QuantFormat.QDQ else "qop"
            act_name = "int8" if act == QuantType.QInt8 else "uint8"
            entry(f"{stem}.onnx", name, kind, pc, act_name, q, f"{name}.input.npy", f"{stem}.ref.npy", f"{stem}.ort_opt.npy", st, oq)

        if with_f16:
            for var, keep_io in [("f16", False), ("f16_f32io", True)]:
                stem = f"{name}.{var}"
                path = os.path.join(out, f"{stem}.onnx")
                h = float16.convert_float_to_float16(onnx.load(f32_path), keep_io_types=keep_io)
                h.producer_name = PRODUCER
                onnx.checker.check_model(h, full_check=True)
                onnx.save(h, path)
                if keep_io:
                    xin, in_file, io = x, f"{name}.input.npy", "float32"
                else:
                    xin, in_file, io = x.astype(np.float16), f"{name}.f16.input.npy", "float16"
                    np.save(os.path.join(out, in_file), xin)
                r = run_ort(path, inp, xin, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
                np.save(os.path.join(out, f"{stem}.ref.npy"), r)
                st = compare(ref, r, None)
                entry(f"{stem}.onnx", name, "f16", False, io, h, in_file, f"{stem}.ref.npy", stats=None)
                entries[-1]["ref_vs_f32"] = st

    secs = time.time() - t0
    with open(man + ".tmp", "w") as f:
        json.dump({"models": entries}, f, indent=1)
    os.replace(man + ".tmp", man)
    print(f"make_quant_models: {len(entries)} models in {out} ({secs:.1f} s)")


if __name__ == "__main__":
    main()
