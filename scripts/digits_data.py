#!/usr/bin/env python3
"""Write the digits data of models/digits_mlp.onnx as npy, for `mote quantize`.

Usage: digits_data.py OUTDIR [--n-calib 100]

Reproduces the split of scripts/make_digits_model.py (scikit-learn digits,
pixel values / 16, 80/20 stratified split, random_state 0) and writes
  OUTDIR/calib/input.npy   float32 [n_calib, 64]: the first n_calib training rows
  OUTDIR/test_x.npy        float32 [360, 64]: the held-out rows
  OUTDIR/test_y.npy        int64 [360]: their labels
"""
import argparse
import os

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--n-calib", type=int, default=100)
    args = ap.parse_args()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_tr, x_te, _, y_te = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
    os.makedirs(os.path.join(args.outdir, "calib"), exist_ok=True)
    np.save(os.path.join(args.outdir, "calib", "input.npy"), np.ascontiguousarray(x_tr[: args.n_calib]))
    np.save(os.path.join(args.outdir, "test_x.npy"), np.ascontiguousarray(x_te))
    np.save(os.path.join(args.outdir, "test_y.npy"), y_te)
    print(f"calib {min(args.n_calib, len(x_tr))} rows, test {len(x_te)} rows -> {args.outdir}")


if __name__ == "__main__":
    main()
