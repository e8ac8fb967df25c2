#!/usr/bin/env python3
"""Writes the ONNX backend node test cases as a flat conformance suite.

Usage: gen_conformance.py OUTDIR

Layout (same files as `onnx.backend.test.cmd_tools generate-data`, but flat
and node cases only): OUTDIR/<case>/model.onnx and
OUTDIR/<case>/test_data_set_N/{input,output}_K.pb (serialized TensorProto).
A case with a non-tensor (sequence/optional/map) input or output gets an
UNSUPPORTED file with the reason instead of data sets. OUTDIR/.complete is
written last.
"""

import os
import shutil
import sys
import time

import numpy as np
from onnx import TensorProto, numpy_helper
from onnx.backend.test.case.node import collect_testcases


def tensor_bytes(value, name):
    if isinstance(value, TensorProto):
        return value.SerializeToString()
    return numpy_helper.from_array(np.asarray(value), name).SerializeToString()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_conformance.py OUTDIR")
    out = sys.argv[1]
    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    stamp = os.path.join(out, ".complete")
    if os.path.exists(stamp):
        os.remove(stamp)
    cases = collect_testcases()
    for case in cases:
        d = os.path.join(out, case.name)
        if os.path.exists(d):
            shutil.rmtree(d)
        os.makedirs(d)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        g = case.model.graph
        bad = [
            v.name
            for v in list(g.input) + list(g.output)
            if not v.type.HasField("tensor_type")
        ]
        if bad:
            with open(os.path.join(d, "UNSUPPORTED"), "w") as f:
                f.write(f"non-tensor graph input/output: {', '.join(bad)}\n")
            continue
        try:
            for i, (inputs, outputs) in enumerate(case.data_sets):
                ds = os.path.join(d, f"test_data_set_{i}")
                os.makedirs(ds)
                for j, v in enumerate(inputs):
                    with open(os.path.join(ds, f"input_{j}.pb"), "wb") as f:
                        f.write(tensor_bytes(v, g.input[j].name))
                for j, v in enumerate(outputs):
                    with open(os.path.join(ds, f"output_{j}.pb"), "wb") as f:
                        f.write(tensor_bytes(v, g.output[j].name))
        except Exception as e:  # noqa: BLE001 - odd data: mark, keep going
            for name in os.listdir(d):
                if name.startswith("test_data_set_"):
                    shutil.rmtree(os.path.join(d, name))
            with open(os.path.join(d, "UNSUPPORTED"), "w") as f:
                f.write(f"data not serializable as tensors: {e}\n")
    with open(stamp, "w") as f:
        f.write(f"{len(cases)} cases\n")
    print(f"gen_conformance: {len(cases)} cases in {time.time() - t0:.1f}s -> {out}")


if __name__ == "__main__":
    main()
