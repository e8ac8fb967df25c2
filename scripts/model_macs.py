"""Multiply-accumulates per inference of ONNX models (Conv, ConvInteger,
QLinearConv, MatMul, Gemm), from onnx shape inference: the MACs column of
scripts/board-costs.sh. Usage: model_macs.py MODEL.onnx..."""
import sys

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference


def dims(vi):
    return [d.dim_value for d in vi.type.tensor_type.shape.dim]


def macs(path):
    m = shape_inference.infer_shapes(onnx.load(path))
    g = m.graph
    shapes = {vi.name: dims(vi) for vi in list(g.value_info) + list(g.input) + list(g.output)}
    inits = {t.name: list(t.dims) for t in g.initializer}
    shapes.update(inits)
    # QDQ graphs: a DequantizeLinear's output has its input's shape.
    for n in g.node:
        if n.op_type in ("DequantizeLinear", "QuantizeLinear") and n.input[0] in shapes:
            shapes.setdefault(n.output[0], shapes[n.input[0]])
    total = 0
    for n in g.node:
        if n.op_type in ("Conv", "ConvInteger"):
            w, out = shapes.get(n.input[1]), shapes.get(n.output[0])
        elif n.op_type == "QLinearConv":
            w, out = shapes.get(n.input[3]), shapes.get(n.output[0])
        elif n.op_type in ("MatMul", "Gemm", "MatMulInteger"):
            a, out = shapes.get(n.input[0]), shapes.get(n.output[0])
            if a and out:
                total += int(np.prod(out)) * a[-1]
            continue
        else:
            continue
        if not w or not out:
            raise SystemExit(f"{path}: no shape for {n.op_type} {n.name}")
        total += int(np.prod(out)) * int(np.prod(w)) // w[0]
    return total


for p in sys.argv[1:]:
    print(p.rsplit("/", 1)[-1].split(".")[0], macs(p))
