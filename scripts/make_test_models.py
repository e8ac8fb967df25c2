#!/usr/bin/env python3
"""Build small ONNX test models with onnx.helper and record reference outputs.

Usage: make_test_models.py OUTDIR

For each model NAME this writes
  OUTDIR/NAME.onnx           the model (checked with onnx.checker, full_check)
  OUTDIR/NAME.input.npy      a seeded random input
  OUTDIR/NAME.expected.npy   onnxruntime CPU output for that input (ORT_DISABLE_ALL)

Models: mlp, cnn, mobilenet, dynamic, convbn. All have a single input and a single output.
Everything is seeded, so repeated runs write identical files.
"""
import argparse
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

PRODUCER = "mote-scripts"


class Builder:
    """Tiny helper that accumulates nodes/initializers with a seeded RNG."""

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

    def weight(self, name, shape, scale=0.1):
        return self.init(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def node(self, op, inputs, n_out=1, out=None, **attrs):
        nm = self.name(op.lower())
        outs = [out] if out is not None else [f"{nm}_out{i}" if n_out > 1 else f"{nm}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=nm, **attrs))
        return outs[0] if n_out == 1 else outs

    # -- layers --------------------------------------------------------------
    def gemm(self, x, k_in, k_out, out=None, trans_b=0, scale=0.1):
        nm = self.name("fc")
        shape = (k_out, k_in) if trans_b else (k_in, k_out)
        w = self.weight(f"{nm}.weight", shape, scale)
        b = self.weight(f"{nm}.bias", (k_out,))
        return self.node("Gemm", [x, w, b], out=out, transB=trans_b) if trans_b else self.node("Gemm", [x, w, b], out=out)

    def conv(self, x, c_in, c_out, k, stride=1, pad=0, group=1, bias=True):
        nm = self.name("conv")
        w = self.weight(f"{nm}.weight", (c_out, c_in // group, k, k))
        inputs = [x, w]
        if bias:
            inputs.append(self.weight(f"{nm}.bias", (c_out,)))
        return self.node(
            "Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=group
        )

    def bn(self, x, c):
        nm = self.name("bn")
        r = self.rng
        scale = self.init(f"{nm}.scale", (1.0 + 0.1 * r.standard_normal(c)).astype(np.float32))
        bias = self.init(f"{nm}.bias", (0.1 * r.standard_normal(c)).astype(np.float32))
        mean = self.init(f"{nm}.mean", (0.1 * r.standard_normal(c)).astype(np.float32))
        var = self.init(f"{nm}.var", r.uniform(0.5, 1.5, c).astype(np.float32))
        return self.node("BatchNormalization", [x, scale, bias, mean, var], epsilon=1e-5)

    def clip6(self, x):
        if "clip.min" not in {i.name for i in self.inits}:
            self.init("clip.min", np.array(0.0, dtype=np.float32))
            self.init("clip.max", np.array(6.0, dtype=np.float32))
        return self.node("Clip", [x, "clip.min", "clip.max"])

    def finish(self, graph_name, inp, inp_shape, out, out_shape, opset):
        graph = helper.make_graph(
            self.nodes,
            graph_name,
            [helper.make_tensor_value_info(inp, TensorProto.FLOAT, inp_shape)],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
            initializer=self.inits,
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], producer_name=PRODUCER, producer_version="1"
        )
        model.ir_version = 8
        onnx.checker.check_model(model, full_check=True)
        return model


def make_mlp():
    b = Builder(1)
    h = b.gemm("input", 784, 256)
    h = b.node("Relu", [h])
    h = b.gemm(h, 256, 128)
    h = b.node("Relu", [h])
    h = b.gemm(h, 128, 10)
    b.node("Softmax", [h], out="output", axis=-1)
    return b.finish("mlp", "input", [1, 784], "output", [1, 10], 13), (1, 784)


def make_cnn():
    b = Builder(2)
    h = b.conv("input", 3, 16, 3, pad=1, bias=False)
    h = b.bn(h, 16)
    h = b.node("Relu", [h])
    h = b.node("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])  # 16x16
    h = b.conv(h, 16, 32, 3, stride=1, pad=1, bias=True)
    h = b.bn(h, 32)
    h = b.node("Relu", [h])
    h = b.node("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])  # 8x8
    h = b.node("Flatten", [h], axis=1)  # 32*8*8 = 2048
    b.gemm(h, 2048, 10, out="output")
    return b.finish("cnn", "input", [1, 3, 32, 32], "output", [1, 10], 13), (1, 3, 32, 32)


def make_mobilenet():
    b = Builder(3)
    h = b.conv("input", 3, 16, 3, stride=2, pad=1)  # 24x24
    h = b.clip6(h)
    h = b.conv(h, 16, 16, 3, pad=1, group=16)  # depthwise
    h = b.bn(h, 16)
    h = b.clip6(h)
    h = b.conv(h, 16, 32, 1)  # pointwise
    h = b.bn(h, 32)
    h = b.node("HardSwish", [h])
    h = b.conv(h, 32, 32, 3, stride=2, pad=1, group=32)  # depthwise s2 -> 12x12
    h = b.node("Relu", [h])
    p = b.conv(h, 32, 64, 1)  # pointwise
    g = b.node("HardSigmoid", [p])  # alpha=0.2, beta=0.5 defaults
    h = b.node("Mul", [p, g])
    h = b.node("GlobalAveragePool", [h])
    h = b.node("Flatten", [h], axis=1)
    # larger head weights so the softmax output is not nearly uniform (a weak check)
    h = b.gemm(h, 64, 10, scale=3.0)
    b.node("Softmax", [h], out="output", axis=-1)
    return b.finish("mobilenet", "input", [1, 3, 48, 48], "output", [1, 10], 14), (1, 3, 48, 48)


def make_dynamic():
    b = Builder(4)
    xc = b.conv("x", 3, 4, 3, pad=1)
    xc = b.node("Relu", [xc])
    shape = b.node("Shape", [xc])
    idx = b.init("gather.indices", np.array(0, dtype=np.int64))
    n = b.node("Gather", [shape, idx], axis=0)  # scalar batch size
    axes = b.init("unsqueeze.axes", np.array([0], dtype=np.int64))
    n1 = b.node("Unsqueeze", [n, axes])  # [1]
    neg1 = b.init("concat.minus_one", np.array([-1], dtype=np.int64))
    new_shape = b.node("Concat", [n1, neg1], axis=0)  # [batch, -1]
    flat = b.node("Reshape", [xc, new_shape])  # [batch, 256]
    b.gemm(flat, 4 * 8 * 8, 5, out="output", trans_b=1)
    return b.finish("dynamic", "x", ["batch", 3, 8, 8], "output", ["batch", 5], 13), (2, 3, 8, 8)


def make_convbn():
    """Conv-BN-Relu-Conv-BN as exporters write it before BN folding, with an
    inference Dropout and a MatMul + Add head: what mote's float rewrites
    fold (two BN folds, Dropout removed, MatMul + Add -> Gemm)."""
    b = Builder(5)
    h = b.conv("input", 3, 8, 3, pad=1, bias=True)
    h = b.bn(h, 8)
    h = b.node("Relu", [h])
    h = b.conv(h, 8, 8, 3, pad=1, group=8, bias=False)  # depthwise
    h = b.bn(h, 8)
    h = b.node("Relu", [h])
    h = b.node("GlobalAveragePool", [h])
    h = b.node("Flatten", [h], axis=1)
    h = b.node("Dropout", [h])
    w = b.weight("head.weight", (8, 10), scale=1.0)
    h = b.node("MatMul", [h, w])
    bias = b.weight("head.bias", (10,))
    b.node("Add", [h, bias], out="output")
    return b.finish("convbn", "input", [1, 3, 16, 16], "output", [1, 10], 13), (1, 3, 16, 16)


MODELS = {
    "mlp": make_mlp,
    "cnn": make_cnn,
    "mobilenet": make_mobilenet,
    "dynamic": make_dynamic,
    "convbn": make_convbn,
}


def ort_session(path):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), help="build only these models")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)

    for seed, (name, fn) in enumerate(MODELS.items()):
        if args.only and name not in args.only:
            continue
        model, in_shape = fn()
        path = os.path.join(args.outdir, f"{name}.onnx")
        onnx.save(model, path)

        rng = np.random.default_rng(1000 + seed)
        x = rng.standard_normal(in_shape).astype(np.float32)
        sess = ort_session(path)
        (inp,) = sess.get_inputs()
        (out,) = sess.get_outputs()
        y = sess.run([out.name], {inp.name: x})[0]
        np.save(os.path.join(args.outdir, f"{name}.input.npy"), x)
        np.save(os.path.join(args.outdir, f"{name}.expected.npy"), y)

        n_params = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
        print(
            f"{name:10s} nodes={len(model.graph.node):3d} param_bytes={n_params:8d} "
            f"file_bytes={os.path.getsize(path):8d} input={list(x.shape)} output={list(y.shape)} "
            f"opset={model.opset_import[0].version}"
        )


if __name__ == "__main__":
    main()
