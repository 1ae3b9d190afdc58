# Sourced by the scripts: make sure .venv exists and matches pyproject.toml.
# Needs only a Python >= 3.11 on PATH (python3.13, python3.12, python3.11 or python3).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

find_python() {
  for candidate in ${PYTHON:-} python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "error: disque-py needs Python >= 3.11 (set PYTHON=/path/to/python3.x)" >&2
  return 1
}

ensure_venv() {
  local extras="${1:-dev}"
  local stamp="$VENV/.installed-$(cat "$ROOT/pyproject.toml" | sha1sum | cut -c1-12)-$extras"
  if [ ! -x "$VENV/bin/python" ]; then
    local py; py="$(find_python)" || exit 1
    echo ">> creating $VENV with $py" >&2
    "$py" -m venv "$VENV"
  fi
  if [ ! -f "$stamp" ]; then
    echo ">> installing disque-py[$extras] into .venv (first run or pyproject.toml changed)" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT[$extras]" >&2
    rm -f "$VENV"/.installed-*
    touch "$stamp"
  fi
}
