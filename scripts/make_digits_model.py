#!/usr/bin/env python3
"""Train a small MLP on scikit-learn's bundled 8x8 digits and export it to ONNX.

Writes (by default into <repo>/models/):
  digits_mlp.onnx    input "input" float32 [batch,64] -> output "logits" float32 [batch,10]
                     MatMul -> Add -> Relu -> Gemm, opset 13
  digits_sample.npy  one held-out sample, shape (1,64) float32
  digits_mlp.json    {"heldout_accuracy": ..., "n_test": ..., "hidden": 32}

Inputs are pixel values / 16 (range [0,1]). No network access is needed.
"""
import argparse
import json
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

HIDDEN = 32
SEED = 0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_onnx(w1, b1, w2, b2):
    inits = [
        numpy_helper.from_array(w1, "fc1.weight"),  # [64, H]
        numpy_helper.from_array(b1, "fc1.bias"),  # [H]
        numpy_helper.from_array(w2, "fc2.weight"),  # [H, 10]
        numpy_helper.from_array(b2, "fc2.bias"),  # [10]
    ]
    nodes = [
        helper.make_node("MatMul", ["input", "fc1.weight"], ["fc1.mm"], name="fc1_matmul"),
        helper.make_node("Add", ["fc1.mm", "fc1.bias"], ["fc1.out"], name="fc1_add"),
        helper.make_node("Relu", ["fc1.out"], ["relu1.out"], name="relu1"),
        helper.make_node("Gemm", ["relu1.out", "fc2.weight", "fc2.bias"], ["logits"], name="fc2_gemm"),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 13)],
        producer_name="mote-scripts",
        producer_version="1",
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=os.path.join(REPO, "models"))
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, stratify=y, random_state=SEED)

    clf = MLPClassifier(
        hidden_layer_sizes=(HIDDEN,),
        activation="relu",
        solver="adam",
        alpha=1e-4,
        max_iter=300,
        random_state=SEED,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x_tr, y_tr)
    assert list(clf.classes_) == list(range(10))

    w1 = clf.coefs_[0].astype(np.float32)
    b1 = clf.intercepts_[0].astype(np.float32)
    w2 = clf.coefs_[1].astype(np.float32)
    b2 = clf.intercepts_[1].astype(np.float32)

    # numpy reference forward pass (float32, same weights as the ONNX file)
    logits_np = np.maximum(x_te @ w1 + b1, 0.0) @ w2 + b2
    pred_np = logits_np.argmax(axis=1)
    acc_np = float((pred_np == y_te).mean())

    model = build_onnx(w1, b1, w2, b2)
    onnx_path = os.path.join(args.out_dir, "digits_mlp.onnx")
    onnx.save(model, onnx_path)

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    logits_ort = sess.run(["logits"], {"input": x_te})[0]
    pred_ort = logits_ort.argmax(axis=1)
    acc_ort = float((pred_ort == y_te).mean())

    max_diff = float(np.abs(logits_ort - logits_np).max())
    print(f"held-out accuracy (numpy):       {acc_np:.4f} on {len(y_te)} samples")
    print(f"held-out accuracy (onnxruntime): {acc_ort:.4f} on {len(y_te)} samples")
    print(f"max |logits_ort - logits_numpy| = {max_diff:.3e}")
    if acc_np != acc_ort or not np.array_equal(pred_np, pred_ort):
        raise SystemExit("ERROR: numpy and onnxruntime predictions disagree")

    sample = x_te[:1].copy()
    np.save(os.path.join(args.out_dir, "digits_sample.npy"), sample)
    meta = {"heldout_accuracy": round(acc_ort, 6), "n_test": int(len(y_te)), "hidden": HIDDEN}
    with open(os.path.join(args.out_dir, "digits_mlp.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")

    size = os.path.getsize(onnx_path)
    print(f"sample label = {int(y_te[0])}, predicted = {int(pred_ort[0])}")
    print(f"wrote {onnx_path} ({size} bytes)")
    assert size < 100 * 1024


if __name__ == "__main__":
    main()
