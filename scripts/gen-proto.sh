#!/usr/bin/env bash
# Regenerate proto/src/onnx.rs from proto/onnx-ml.proto (pure Rust: protox, no protoc).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet --manifest-path proto/codegen/Cargo.toml
echo "regenerated proto/src/onnx.rs"
