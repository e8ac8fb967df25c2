#!/usr/bin/env python3
"""Run an ONNX model with onnxruntime (CPU, graph optimizations disabled).

Usage: ort_run.py MODEL INPUT_NPY... --out DIR

Inputs are bound to the model's graph inputs (initializers excluded) in order.
Outputs are saved as DIR/OUT_0.npy, DIR/OUT_1.npy, ... in graph-output order.
"""
import argparse
import os
import sys

import numpy as np
import onnxruntime as ort


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("inputs", nargs="*", metavar="INPUT_NPY")
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args()

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    graph_inputs = sess.get_inputs()
    if len(args.inputs) != len(graph_inputs):
        names = ", ".join(f"{i.name}{i.shape}" for i in graph_inputs)
        sys.exit(f"ort_run: model has {len(graph_inputs)} input(s) ({names}), got {len(args.inputs)} file(s)")

    feeds = {gi.name: np.load(p) for gi, p in zip(graph_inputs, args.inputs)}
    outputs = sess.run(None, feeds)

    os.makedirs(args.out, exist_ok=True)
    for k, (meta, arr) in enumerate(zip(sess.get_outputs(), outputs)):
        path = os.path.join(args.out, f"OUT_{k}.npy")
        np.save(path, arr)
        if not args.quiet:
            print(f"{path}: {meta.name} {arr.dtype} {list(np.shape(arr))}")


if __name__ == "__main__":
    main()
