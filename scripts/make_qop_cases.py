"""Per-op cases of onnxruntime's com.microsoft QOperator kernels.

Usage: make_qop_cases.py OUTDIR. Seeded. Each case: CASE.onnx, CASE.in{i}.npy
(the graph inputs, in order), CASE.expected.npy (onnxruntime, graph
optimizations disabled); manifest.json lists {name, op, inputs}.
"""
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(20261202)
NP = {"u8": np.uint8, "i8": np.int8}
TP = {"u8": TensorProto.UINT8, "i8": TensorProto.INT8}


def qrange(t):
    return (0, 255) if t == "u8" else (-128, 127)


def rand_q(t, shape):
    lo, hi = qrange(t)
    return np.asarray(rng.integers(lo, hi + 1, size=shape)).astype(NP[t])


def zp(t):
    lo, hi = qrange(t)
    return np.array(rng.integers(lo + 40, hi - 40), dtype=NP[t])


def sc():
    return np.array(np.exp(rng.uniform(np.log(0.005), np.log(0.2))), dtype=np.float32)


def build(out, name, op, inputs, consts, attrs, out_type, out_shape, feeds):
    """inputs: names in node order ('' = omitted); consts: name->array;
    feeds: name->array (graph inputs)."""
    node = helper.make_node(op, inputs, ["y"], domain="com.microsoft", **attrs)
    ginputs = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in feeds.items()
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    g = helper.make_graph(
        [node], name, ginputs, [helper.make_tensor_value_info("y", out_type, None)], inits
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    m.ir_version = 8
    path = os.path.join(out, name + ".onnx")
    onnx.save(m, path)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    (y,) = s.run(None, feeds)
    for i, v in enumerate(feeds.values()):
        np.save(os.path.join(out, f"{name}.in{i}.npy"), v)
    np.save(os.path.join(out, name + ".expected.npy"), y)
    return {"name": name, "op": op, "inputs": len(feeds)}


def main(out):
    os.makedirs(out, exist_ok=True)
    cases = []
    for t in ["u8", "i8"]:
        for ci, op in enumerate(["QLinearAdd", "QLinearMul"] * 4):
            shapes = [([2, 3, 8, 8], [2, 3, 8, 8]), ([2, 3, 8, 8], [3, 1, 1]),
                      ([4, 1, 16], [5, 1]), ([2, 6, 7], [])][ci // 2]
            a, b = rand_q(t, shapes[0]), rand_q(t, shapes[1])
            consts = {"as": sc(), "az": zp(t), "bs": sc(), "bz": zp(t), "cs": sc(), "cz": zp(t)}
            ins = ["a", "as", "az", "b", "bs", "bz", "cs", "cz"]
            cases.append(build(out, f"{op}_{t}_{ci}", op, ins, consts, {}, TP[t], None,
                               {"a": a, "b": b}))
        for op in ["QLinearSigmoid", "QLinearLeakyRelu"]:
            for ci in range(3):
                x = rand_q(t, [3, 5, 17])
                consts = {"xs": np.array(rng.uniform(0.02, 0.1), np.float32), "xz": zp(t),
                          "ys": sc(), "yz": zp(t)}
                attrs = {"alpha": float(rng.uniform(0.01, 0.3))} if op == "QLinearLeakyRelu" else {}
                cases.append(build(out, f"{op}_{t}_{ci}", op, ["x", "xs", "xz", "ys", "yz"],
                                   consts, attrs, TP[t], None, {"x": x}))
        for ci in range(4):
            cl = ci % 2
            shp = [[2, 8, 7, 9], [1, 5, 5, 16], [3, 4, 13], [2, 6, 6, 3]][ci]
            x = rand_q(t, shp)
            consts = {"xs": sc(), "xz": zp(t), "ys": sc(), "yz": zp(t)}
            cases.append(build(out, f"QLinearGlobalAveragePool_{t}_{ci}", "QLinearGlobalAveragePool",
                               ["x", "xs", "xz", "ys", "yz"], consts, {"channels_last": cl}, TP[t],
                               None, {"x": x}))
        pool_cfgs = [
            ([2, 3, 9, 9], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
            ([2, 3, 9, 9], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0)),
            ([1, 4, 10, 11], dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1)),
            ([1, 4, 10, 11], dict(kernel_shape=[3, 2], auto_pad="SAME_UPPER")),
            ([2, 3, 12], dict(kernel_shape=[4], strides=[3], pads=[2, 1], count_include_pad=1)),
            ([1, 7, 7, 5], dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], channels_last=1)),
        ]
        for ci, (shp, attrs) in enumerate(pool_cfgs):
            x = rand_q(t, shp)
            consts = {"xs": sc(), "xz": zp(t), "ys": sc(), "yz": zp(t)}
            cases.append(build(out, f"QLinearAveragePool_{t}_{ci}", "QLinearAveragePool",
                               ["x", "xs", "xz", "ys", "yz"], consts, attrs, TP[t], None, {"x": x}))
        for ci in range(3):
            axis = [1, 0, -1][ci]
            base = [2, 3, 4]
            feeds, consts, ins = {}, {"ys": sc(), "yz": zp(t)}, ["ys", "yz"]
            for j in range(3):
                s = list(base)
                s[axis] = j + 1 + ci
                feeds[f"x{j}"] = rand_q(t, s)
                if j == 1:  # same params as the output: a copy
                    consts[f"s{j}"], consts[f"z{j}"] = consts["ys"], consts["yz"]
                else:
                    consts[f"s{j}"], consts[f"z{j}"] = sc(), zp(t)
                ins += [f"x{j}", f"s{j}", f"z{j}"]
            cases.append(build(out, f"QLinearConcat_{t}_{ci}", "QLinearConcat", ins, consts,
                               {"axis": axis}, TP[t], None, feeds))
    gemm_types = [("u8", "u8"), ("u8", "i8"), ("i8", "i8")]
    ci = 0
    for ta, tb in gemm_types:
        for ta_, tb_, bias, qout, percol in [(0, 0, False, True, False), (1, 0, True, True, False),
                                              (0, 1, True, True, True), (1, 1, True, False, False),
                                              (0, 1, False, False, True)]:
            m, k, n = int(rng.integers(3, 12)), int(rng.integers(4, 40)), int(rng.integers(3, 12))
            a = rand_q(ta, [k, m] if ta_ else [m, k])
            b = rand_q(tb, [n, k] if tb_ else [k, n])
            if (ta, tb) == ("u8", "i8"):
                # onnxruntime's u8 x s8 kernel on x86 CPUs without VNNI
                # (AVX2: vpmaddubsw) adds pairs of products in saturating
                # int16, so its output is not the exact QGemm there for
                # full 8-bit weights (up to 50 LSB off on this case set);
                # its quantizer's reduce_range keeps weights to 7 bits for
                # that reason. 7-bit weights keep every pair below 2^15 and
                # the reference exact on every x86 CPU.
                b = (b.astype(np.int16) // 2).astype(np.int8)
            consts = {"as": sc(), "az": zp(ta)}
            if percol:
                consts["bs"] = np.exp(rng.uniform(np.log(0.005), np.log(0.1), n)).astype(np.float32)
                consts["bz"] = np.array([zp(tb) for _ in range(n)], dtype=NP[tb])
            else:
                consts["bs"], consts["bz"] = sc(), zp(tb)
            ins = ["a", "as", "az", "b", "bs", "bz"]
            if bias:
                cshape = [[n], [m, n], [1, n], [m, 1]][ci % 4]
                consts["c"] = rng.integers(-3000, 3000, size=cshape).astype(np.int32)
                ins.append("c")
            elif qout:
                ins.append("")
            if qout:
                consts["ys"] = np.array(rng.uniform(0.05, 0.5), np.float32)
                consts["yz"] = zp(ta)
                ins += ["ys", "yz"]
            attrs = {"transA": ta_, "transB": tb_, "alpha": float(rng.choice([1.0, 0.5, 1.7]))}
            otype = TP[ta] if qout else TensorProto.FLOAT
            cases.append(build(out, f"QGemm_{ta}{tb}_{ci}", "QGemm", ins, consts, attrs, otype,
                               None, {"a": a, "b": b}))
            ci += 1
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(cases, f, indent=1)
    open(os.path.join(out, ".complete"), "w").close()
    print(f"{len(cases)} cases in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
