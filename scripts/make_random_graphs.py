"""Random small graphs for the planner and optimizer (tests/tests/random_graphs.rs).

Usage: make_random_graphs.py OUTDIR. Seeded. Each case is a DAG of 3 to 14
nodes over one or two f32 inputs (unary and binary element-wise ops, views
such as Reshape / Flatten / Squeeze, Transpose, Conv, BatchNormalization,
MatMul, pooling, Softmax, Concat, Split, Slice) whose graph outputs are a
random set of its tensors: intermediate values that later nodes also read,
a Split's second output, sometimes the graph input itself. That is where
buffer sharing (in-place steps, views, fusions) can go wrong. Files:
CASE.onnx, CASE.in{i}.npy (graph inputs in order), CASE.out{k}.npy
(onnxruntime, graph optimizations disabled); manifest.json lists the cases.
"""
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(20261205)
CASES = 120


class G:
    def __init__(self):
        self.nodes, self.inits, self.pool, self.n = [], [], [], 0

    def name(self, p):
        self.n += 1
        return f"{p}{self.n}"

    def const(self, arr):
        nm = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(arr), nm))
        return nm

    def add(self, op, ins, shapes, **attrs):
        outs = [self.name("t") for _ in shapes]
        self.nodes.append(helper.make_node(op, ins, outs, name=self.name(op.lower()), **attrs))
        self.pool.extend(zip(outs, shapes))
        return outs


def fits(o, s):
    """o broadcasts to s (numpy rules) without changing it."""
    try:
        return len(o) <= len(s) and np.broadcast_shapes(tuple(o), tuple(s)) == tuple(s)
    except ValueError:
        return False


def pick(pool, pred=lambda s: True):
    c = [p for p in pool if pred(p[1])]
    return c[rng.integers(len(c))] if c else None


def step(g):
    """Adds one random node reading the pool; False if the pick did not fit."""
    t, s = pick(g.pool)
    s = list(s)
    r = len(s)
    k = rng.integers(17)
    if k == 0:
        op = ["Relu", "Neg", "Sigmoid", "Tanh", "Abs", "Identity", "Exp"][rng.integers(7)]
        g.add(op, [t], [s])
    elif k == 1:
        g.add("LeakyRelu", [t], [s], alpha=0.1)
    elif k == 2:
        lo, hi = g.const(np.float32(-0.5)), g.const(np.float32(0.7))
        g.add("Clip", [t, lo, hi], [s])
    elif k in (3, 4):
        # Binary with another pool tensor that broadcasts to this shape.
        other = pick(g.pool, lambda o: fits(o, s))
        op = ["Add", "Sub", "Mul", "Max"][rng.integers(4)]
        g.add(op, [t, other[0]] if rng.integers(2) else [other[0], t], [s])
    elif k == 5:
        cshape = [s[-1]] if rng.integers(2) else []
        c = g.const(rng.uniform(-1, 1, cshape).astype(np.float32))
        g.add(["Add", "Mul"][rng.integers(2)], [t, c], [s])
    elif k == 6:
        tgt = [int(v) for v in rng.permutation(s)]
        g.add("Reshape", [t, g.const(np.array(tgt, np.int64))], [tgt])
    elif k == 7:
        perm = [int(v) for v in rng.permutation(r)]
        g.add("Transpose", [t], [[s[p] for p in perm]], perm=perm)
    elif k == 8 and r >= 2:
        g.add("Flatten", [t], [[s[0], int(np.prod(s[1:]))]], axis=1)
    elif k == 9 and s[0] == 1 and r >= 2:
        g.add("Squeeze", [t, g.const(np.array([0], np.int64))], [s[1:]])
    elif k == 9 and r < 4:
        g.add("Unsqueeze", [t, g.const(np.array([0], np.int64))], [[1] + s])
    elif k == 10 and r == 4:
        c = s[1]
        ks = [1, 3][rng.integers(2)]
        w = g.const(rng.uniform(-0.5, 0.5, [c, c, ks, ks]).astype(np.float32))
        ins = [t, w] + ([g.const(rng.uniform(-0.5, 0.5, [c]).astype(np.float32))] if rng.integers(2) else [])
        g.add("Conv", ins, [s], pads=[ks // 2] * 4)
    elif k == 11 and r == 4:
        c = s[1]
        p = [g.const(rng.uniform(lo, hi, [c]).astype(np.float32))
             for lo, hi in [(0.5, 1.5), (-0.5, 0.5), (-0.5, 0.5), (0.5, 1.5)]]
        g.add("BatchNormalization", [t] + p, [s])
    elif k == 12:
        w = g.const(rng.uniform(-0.5, 0.5, [s[-1], s[-1]]).astype(np.float32))
        g.add("MatMul", [t, w], [s])
    elif k == 13 and r == 4:
        if rng.integers(2):
            g.add("MaxPool", [t], [s], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        else:
            g.add("GlobalAveragePool", [t], [[s[0], s[1], 1, 1]])
    elif k == 14:
        g.add("Softmax", [t], [s], axis=-1)
    elif k == 15:
        other = pick(g.pool, lambda o: list(o) == s)
        ax = int(rng.integers(r))
        o = list(s)
        o[ax] *= 2
        g.add("Concat", [t, other[0]], [o], axis=ax)
    elif k == 16:
        ax = int(rng.integers(r))
        if s[ax] >= 2:
            if rng.integers(2):
                h = s[ax] // 2
                a, b = list(s), list(s)
                a[ax], b[ax] = h, s[ax] - h
                g.add("Split", [t, g.const(np.array([h, s[ax] - h], np.int64))], [a, b], axis=ax)
            else:
                o = list(s)
                o[ax] = s[ax] - 1
                ins = [t] + [g.const(np.array([v], np.int64)) for v in (1, s[ax], ax)]
                g.add("Slice", ins, [o])
            return True
        return False
    else:
        return False
    return True


def make(out, ci):
    g = G()
    shape = [[1, 4, 5, 5], [1, 3, 6, 4], [2, 3, 4], [6, 5]][rng.integers(4)]
    n_in = 1 + int(rng.integers(2))
    ins = [(f"x{i}", shape) for i in range(n_in)]
    g.pool.extend(ins)
    want = int(rng.integers(3, 15))
    while len(g.nodes) < want:
        step(g)
    made = g.pool[n_in:]
    n_out = min(len(made), 1 + int(rng.integers(4)))
    idx = rng.choice(len(made), n_out, replace=False)
    outs = [made[i] for i in sorted(idx)]
    if rng.integers(8) == 0:
        outs.append(ins[0])
    vi = lambda nm, s: helper.make_tensor_value_info(nm, TensorProto.FLOAT, s)
    graph = helper.make_graph(g.nodes, f"random{ci}", [vi(n, s) for n, s in ins],
                              [vi(n, s) for n, s in outs], g.inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    name = f"random_{ci:03d}"
    path = os.path.join(out, name + ".onnx")
    onnx.save(m, path)
    feeds = {n: rng.uniform(-1, 1, s).astype(np.float32) for n, s in ins}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ys = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    for i, v in enumerate(feeds.values()):
        np.save(os.path.join(out, f"{name}.in{i}.npy"), v)
    for k, y in enumerate(ys):
        np.save(os.path.join(out, f"{name}.out{k}.npy"), y)
    return {"name": name, "nodes": len(g.nodes), "inputs": n_in, "outputs": len(outs)}


def main(out):
    os.makedirs(out, exist_ok=True)
    cases = [make(out, ci) for ci in range(CASES)]
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(cases, f, indent=1)
    open(os.path.join(out, ".complete"), "w").close()
    print(f"make_random_graphs: {len(cases)} graphs in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
