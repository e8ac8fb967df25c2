#!/usr/bin/env python3
"""Build the peer-benchmark model set (seeded random weights, onnx.helper).

Usage: make_models.py OUTDIR

f32 models (MLP, KWS, ResNet-8 and MobileNetV1-0.25 are the builders of
scripts/make_quant_models.py, BatchNorm folded, opset 13):

  mlp          MLP 784-256-128-10, batch 1
  kws          MLPerf Tiny KWS DS-CNN, 1x1x49x10
  resnet8      MLPerf Tiny ResNet-8, 1x3x32x32
  mbv1         MobileNetV1 width 0.25, 1x3x96x96
  mbv2         MobileNetV2 1.0, 1x3x224x224, 1000 classes: inverted residuals,
               Conv (no bias) + BatchNormalization + Clip(0, 6) as a PyTorch
               export with BatchNorm kept, opset 13
  resnet18     ResNet-18, 1x3x224x224, Conv + BatchNormalization, opset 13
  transformer  encoder block as a PyTorch export at opset 17: sequence 128,
               hidden 256, 4 heads, FFN 1024 (GELU as Erf), post-norm
               LayerNormalization; input 1x128x256
int8 models (onnxruntime quantize_static, QDQ, per-channel int8 weights,
int8 activations, MinMax on 8 seeded samples, after quant_pre_process):

  kws_int8, mbv2_int8

Writes OUTDIR/NAME.onnx, OUTDIR/NAME.input.npy (the one input every engine
sees) and OUTDIR/manifest.json last (its presence means the set is complete).
Every model passes onnx.checker and runs in onnxruntime.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import make_quant_models as mq  # noqa: E402

PRODUCER = "mote-bench"


class Builder(mq.Builder):
    """make_quant_models.Builder (He-normal weights) plus unfused layers."""

    def conv(self, x, c_in, c_out, k, stride=1, pad=None, group=1):
        nm = self.name("conv")
        fan_in = (c_in // group) * k * k
        w = self.rng.standard_normal((c_out, c_in // group, k, k)) * np.sqrt(2.0 / fan_in)
        wn = self.init(f"{nm}.weight", w.astype(np.float32))
        p = k // 2 if pad is None else pad
        return self.node(
            "Conv", [x, wn], kernel_shape=[k, k], strides=[stride, stride], pads=[p] * 4, group=group
        )

    def bn(self, x, c):
        nm = self.name("bn")
        r = self.rng
        ins = [x]
        for part, v in [
            ("weight", 1.0 + 0.1 * r.standard_normal(c)),
            ("bias", 0.1 * r.standard_normal(c)),
            ("running_mean", 0.1 * r.standard_normal(c)),
            ("running_var", r.uniform(0.5, 1.5, c)),
        ]:
            ins.append(self.init(f"{nm}.{part}", v.astype(np.float32)))
        return self.node("BatchNormalization", ins, epsilon=1e-5, momentum=0.9)

    def conv_bn_act(self, x, c_in, c_out, k, stride=1, group=1, act="relu6"):
        h = self.bn(self.conv(x, c_in, c_out, k, stride=stride, group=group), c_out)
        if act == "relu6":
            return self.relu6(h)
        if act == "relu":
            return self.node("Relu", [h])
        return h

    def linear(self, x, k_in, k_out, scale=None):
        """MatMul by a [k_in, k_out] weight, then Add of the bias (torch Linear on 3-D)."""
        nm = self.name("linear")
        s = np.sqrt(1.0 / k_in) if scale is None else scale
        w = self.init(f"{nm}.weight", (self.rng.standard_normal((k_in, k_out)) * s).astype(np.float32))
        b = self.init(f"{nm}.bias", (0.02 * self.rng.standard_normal(k_out)).astype(np.float32))
        return self.node("Add", [self.node("MatMul", [x, w]), b])

    def layer_norm(self, x, c):
        nm = self.name("ln")
        g = self.init(f"{nm}.weight", (1.0 + 0.1 * self.rng.standard_normal(c)).astype(np.float32))
        b = self.init(f"{nm}.bias", (0.1 * self.rng.standard_normal(c)).astype(np.float32))
        return self.node("LayerNormalization", [x, g, b], axis=-1, epsilon=1e-5)

    def const(self, name, arr):
        if name not in {i.name for i in self.inits}:
            self.init(name, np.asarray(arr))
        return name

    def finish_opset(self, graph_name, inp, inp_shape, out, out_shape, opset):
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


def make_mbv2():
    b = Builder(21)
    c = 32
    h = b.conv_bn_act("input", 3, c, 3, stride=2)  # 112x112
    for t, co, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            x = h
            hid = c * t
            if t != 1:
                h = b.conv_bn_act(h, c, hid, 1)
            h = b.conv_bn_act(h, hid, hid, 3, stride=stride, group=hid)
            h = b.conv_bn_act(h, hid, co, 1, act=None)
            if stride == 1 and c == co:
                h = b.node("Add", [x, h])
            c = co
    h = b.conv_bn_act(h, c, 1280, 1)
    h = b.node("GlobalAveragePool", [h])
    h = b.node("Flatten", [h], axis=1)
    b.gemm(h, 1280, 1000, out="logits")
    return b.finish_opset("mobilenet_v2", "input", [1, 3, 224, 224], "logits", [1, 1000], 13)


def make_resnet18():
    b = Builder(22)
    h = b.conv_bn_act("input", 3, 64, 7, stride=2, act="relu")  # 112x112
    h = b.node("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])  # 56x56
    c = 64
    for co, s in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        for i in range(2):
            stride = s if i == 0 else 1
            y = b.conv_bn_act(h, c, co, 3, stride=stride, act="relu")
            y = b.conv_bn_act(y, co, co, 3, act=None)
            sc = h
            if stride != 1 or c != co:
                sc = b.bn(b.conv(h, c, co, 1, stride=stride, pad=0), co)
            h = b.node("Relu", [b.node("Add", [y, sc])])
            c = co
    h = b.node("GlobalAveragePool", [h])
    h = b.node("Flatten", [h], axis=1)
    b.gemm(h, 512, 1000, out="logits")
    return b.finish_opset("resnet18", "input", [1, 3, 224, 224], "logits", [1, 1000], 13)


def make_transformer(seq=128, d=256, heads=4, ffn=1024):
    b = Builder(23)
    dh = d // heads
    split = b.const("shape.split_heads", np.array([1, seq, heads, dh], dtype=np.int64))
    merge = b.const("shape.merge_heads", np.array([1, seq, d], dtype=np.int64))
    x = "input"

    def heads_of(t, perm):
        return b.node("Transpose", [b.node("Reshape", [t, split])], perm=perm)

    q = heads_of(b.linear(x, d, d), [0, 2, 1, 3])  # [1, h, s, dh]
    k = heads_of(b.linear(x, d, d), [0, 2, 3, 1])  # [1, h, dh, s]
    v = heads_of(b.linear(x, d, d), [0, 2, 1, 3])
    scores = b.node("Div", [b.node("MatMul", [q, k]), b.const("attn.scale", np.array(np.sqrt(dh), dtype=np.float32))])
    p = b.node("Softmax", [scores], axis=-1)
    a = b.node("Transpose", [b.node("MatMul", [p, v])], perm=[0, 2, 1, 3])
    a = b.linear(b.node("Reshape", [a, merge]), d, d)
    h = b.layer_norm(b.node("Add", [x, a]), d)
    f = b.linear(h, d, ffn)
    # torch.nn.GELU() exported at opset 17: x * 0.5 * (1 + erf(x / sqrt(2)))
    e = b.node("Erf", [b.node("Div", [f, b.const("gelu.sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))])])
    e = b.node("Add", [e, b.const("gelu.one", np.array(1.0, dtype=np.float32))])
    f = b.node("Mul", [b.node("Mul", [f, e]), b.const("gelu.half", np.array(0.5, dtype=np.float32))])
    f = b.linear(f, ffn, d)
    b.layer_norm(b.node("Add", [h, f]), d)
    b.nodes[-1].output[0] = "output"
    return b.finish_opset("encoder_block", "input", [1, seq, d], "output", [1, seq, d], 17)


def sampler(kind):
    if kind == "uniform01":
        return lambda r, s: r.uniform(0.0, 1.0, s)
    if kind == "uniform11":
        return lambda r, s: r.uniform(-1.0, 1.0, s)
    return lambda r, s: r.standard_normal(s)


# name -> (builder, input shape, input distribution)
F32 = {
    "mlp": (mq.make_mlp, (1, 784), "uniform01"),
    "kws": (mq.make_kws, (1, 1, 49, 10), "normal"),
    "resnet8": (mq.make_resnet8, (1, 3, 32, 32), "normal"),
    "mbv1": (mq.make_mbv1, (1, 3, 96, 96), "uniform11"),
    "mbv2": (make_mbv2, (1, 3, 224, 224), "uniform11"),
    "resnet18": (make_resnet18, (1, 3, 224, 224), "uniform11"),
    "transformer": (make_transformer, (1, 128, 256), "normal"),
}
INT8 = {"kws_int8": "kws", "mbv2_int8": "mbv2"}
N_CALIB = 8


def ort_run(path, x):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def quantize(f32_path, out_path, shape, dist, seed):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    rng = np.random.default_rng(seed)
    samples = [sampler(dist)(rng, shape).astype(np.float32) for _ in range(N_CALIB)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {"input": x}

    with tempfile.TemporaryDirectory() as tmp:
        pre = os.path.join(tmp, "pre.onnx")
        # Folds BatchNormalization into Conv, as the onnxruntime quantization recipe does.
        quant_pre_process(f32_path, pre, skip_symbolic_shape=True)
        quantize_static(
            pre,
            out_path,
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
        )
    onnx.checker.check_model(onnx.load(out_path), full_check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--only", help="comma-separated model names (default: all)")
    args = ap.parse_args()
    out = args.outdir
    os.makedirs(out, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    man_path = os.path.join(out, "manifest.json")
    if os.path.exists(man_path):
        os.remove(man_path)
    manifest = {}
    for seed, (name, (fn, shape, dist)) in enumerate(F32.items()):
        if only and name not in only and not any(INT8.get(q) == name for q in only):
            continue
        path = os.path.join(out, f"{name}.onnx")
        onnx.save(fn(), path)
        x = sampler(dist)(np.random.default_rng(100 + seed), shape).astype(np.float32)
        np.save(os.path.join(out, f"{name}.input.npy"), x)
        y = ort_run(path, x)
        manifest[name] = {"file": f"{name}.onnx", "input_name": "input", "input_file": f"{name}.input.npy", "kind": "f32"}
        print(f"{name:12s} {os.path.getsize(path):>10d} bytes, output {list(y.shape)}", flush=True)
    for seed, (name, base) in enumerate(INT8.items()):
        if only and name not in only:
            continue
        _, shape, dist = F32[base]
        path = os.path.join(out, f"{name}.onnx")
        quantize(os.path.join(out, f"{base}.onnx"), path, shape, dist, 200 + seed)
        x = np.load(os.path.join(out, f"{base}.input.npy"))
        np.save(os.path.join(out, f"{name}.input.npy"), x)
        y = ort_run(path, x)
        oq = mq.output_quant(onnx.load(path))
        manifest[name] = {
            "file": f"{name}.onnx",
            "input_name": "input",
            "input_file": f"{name}.input.npy",
            "kind": "int8",
            "output_scale": None if oq is None else oq[0],
        }
        print(f"{name:12s} {os.path.getsize(path):>10d} bytes, output {list(y.shape)}", flush=True)
    with open(man_path, "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
