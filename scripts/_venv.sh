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

# ensure_venv EXTRAS: EXTRAS is a comma-separated list (dev, spark, bench). A venv installed
# with more extras than asked for is kept as it is.
ensure_venv() {
  local extras="${1:-dev}"
  local hash; hash="$(sha1sum < "$ROOT/pyproject.toml" | cut -c1-12)"
  if [ ! -x "$VENV/bin/python" ]; then
    local py; py="$(find_python)" || exit 1
    echo ">> creating $VENV with $py" >&2
    "$py" -m venv "$VENV"
  fi
  local stamp have wanted ok
  for stamp in "$VENV"/.installed-"$hash"-*; do
    [ -f "$stamp" ] || continue
    have=",${stamp##*/.installed-$hash-},"
    ok=1
    for wanted in ${extras//,/ }; do
      case "$have" in *",$wanted,"*) ;; *) ok=0 ;; esac
    done
    [ "$ok" = 1 ] && return 0
  done
  # Keep the extras installed before (a venv made by scripts/test stays able to run everything).
  for stamp in "$VENV"/.installed-*; do
    [ -f "$stamp" ] || continue
    have="${stamp##*/.installed-}"; have="${have#*-}"
    for wanted in ${have//,/ }; do
      case ",$extras," in *",$wanted,"*) ;; *) extras="$extras,$wanted" ;; esac
    done
  done
  echo ">> installing disque-py[$extras] into .venv (first run or pyproject.toml changed)" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
  # compat: a plain .pth to the checkout, so that Spark's discovery (pkgutil.iter_modules) sees
  # the top-level module pyspark_disque.py of an editable install.
  # DISQUE_PY_PURE=1: the editable install builds no extension (scripts/build compiles in
  # place, with a progress line, when a script needs the compiled build).
  local out
  if ! out="$(DISQUE_PY_PURE=1 "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
      --config-settings editable_mode=compat -e "$ROOT[$extras]" 2>&1)"; then
    echo "$out" >&2
    echo ">> retrying without editable_mode=compat (Spark's discovery may miss pyspark_disque)" >&2
    DISQUE_PY_PURE=1 "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT[$extras]" >&2 || exit 1
  fi
  rm -f "$VENV"/.installed-*
  touch "$VENV/.installed-$hash-$extras"
}
