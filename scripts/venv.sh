#!/usr/bin/env bash
# Create (idempotently) a Python venv with the packages in scripts/requirements.txt.
# Location: ${MOTE_VENV:-<repo>/.venv}. The last line printed is the venv's python path.
set -euo pipefail
SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPTS/.." && pwd)"
VENV="${MOTE_VENV:-$REPO/.venv}"
REQ="$SCRIPTS/requirements.txt"
STAMP="$VENV/.mote-requirements.sha256"
PY="$VENV/bin/python"

if command -v sha256sum >/dev/null 2>&1; then
    HASH="$(sha256sum "$REQ" | cut -d' ' -f1)"
else
    HASH="$(shasum -a 256 "$REQ" | cut -d' ' -f1)"
fi

if [[ -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]]; then
    echo "$PY"
    exit 0
fi

if [[ ! -x "$PY" ]]; then
    echo "venv.sh: creating venv at $VENV" >&2
    python3 -m venv "$VENV" >&2
fi
echo "venv.sh: installing $REQ" >&2
"$PY" -m pip install --quiet --disable-pip-version-check -r "$REQ" >&2
echo "$HASH" > "$STAMP"
echo "$PY"
