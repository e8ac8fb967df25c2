//! Shared fixtures of the integration tests.
//!
//! Reference models and onnxruntime outputs are generated, not committed:
//! `scripts/make_test_models.py` builds them with the pinned `onnx` and
//! `onnxruntime` of `scripts/requirements.txt` (venv from `scripts/venv.sh`).
//! `.ci/run` generates them first; a test run without them generates them
//! on first use.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Directory of generated test models (`MOTE_TEST_MODELS` or `.cache/test-models`).
pub fn models_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("MOTE_TEST_MODELS")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join(".cache/test-models"));
        if !dir.join("dynamic.expected.npy").exists() {
            let py = python();
            let st = Command::new(&py)
                .arg(repo().join("scripts/make_test_models.py"))
                .arg(&dir)
                .status()
                .unwrap_or_else(|e| panic!("running {py}: {e}"));
            assert!(st.success(), "scripts/make_test_models.py failed");
        }
        dir
    })
    .clone()
}

/// Python of the project venv (created by `scripts/venv.sh` if needed).
pub fn python() -> String {
    if let Ok(p) = std::env::var("MOTE_PYTHON") {
        return p;
    }
    let out = Command::new("bash")
        .arg(repo().join("scripts/venv.sh"))
        .output()
        .expect("run scripts/venv.sh");
    assert!(
        out.status.success(),
        "scripts/venv.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    s.lines().last().unwrap_or("python3").trim().to_string()
}
