# Sourced by the scripts: make sure .venv exists and matches pyproject.toml.
# Needs only a Python >= 3.11 on PATH (python3.13, python3.12, python3.11 or python3); see find_python.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

# python_info PY: "VERSION OPTIMISED EXECUTABLE" (e.g. "3.11 1 /usr/bin/python3.11") for a Python
# >= 3.11, nothing for anything else. OPTIMISED is 1 for an interpreter built with profile-guided
# optimisation or link-time optimisation: its sysconfig says so (--enable-optimizations, --with-lto,
# -fprofile-use, -flto), or it is a Debian/Ubuntu package's, whose builds use both on the common
# architectures but whose sysconfig does not show it.
python_info() {
  local out; out="$("$1" -c 'import os, sys, sysconfig
if sys.version_info < (3, 11): sys.exit(1)
keys = ("CONFIG_ARGS", "PY_CFLAGS_NODIST", "PY_LDFLAGS_NODIST", "CFLAGS", "LDFLAGS")
flags = " ".join(str(sysconfig.get_config_var(k) or "") for k in keys)
opt = any(f in flags for f in ("--enable-optimizations", "--with-lto", "-fprofile-use", "-flto"))
print("%d.%d" % sys.version_info[:2], int(opt), os.path.realpath(sys.executable))' 2>/dev/null)" || return 1
  [ -n "$out" ] || return 1
  local version opt exe; read -r version opt exe <<< "$out"
  if [ "$opt" = 0 ] && command -v dpkg >/dev/null 2>&1 &&
     dpkg -S "$exe" 2>/dev/null | grep -q '^python3\.[0-9]*-minimal:'; then
    opt=1
  fi
  echo "$version $opt $exe"
}

# can_make_venv PY VERSION: PY has venv and ensurepip. Debian ships ensurepip apart
# (python3.X-venv): as root, it is installed when that is all PY lacks.
can_make_venv() {
  "$1" -c 'import venv, ensurepip' >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 &&
     dpkg -S "$1" >/dev/null 2>&1; then
    echo ">> installing python$2-venv (venv's ensurepip for $1)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$2-venv") >/dev/null 2>&1 ||
      echo ">> could not install python$2-venv" >&2
    "$1" -c 'import venv, ensurepip' >/dev/null 2>&1 && return 0
  fi
  return 1
}

# find_python: "EXECUTABLE<TAB>DESCRIPTION" of the Python to build .venv with. $PYTHON wins when
# set. Otherwise every python3.13, python3.12, python3.11 and python3 on PATH is a candidate
# (each interpreter once, however many names and directories lead to it): the newest version
# first, and of one version an optimised build (PGO/LTO) before a plain one, PATH order
# breaking ties; the first that can make a venv is chosen.
find_python() {
  local info version opt exe
  if [ -n "${PYTHON:-}" ]; then
    if info="$(python_info "$PYTHON")"; then
      read -r version opt exe <<< "$info"
      printf '%s\t%s\n' "$PYTHON" "Python $version from \$PYTHON"; return 0
    fi
    echo "error: PYTHON=$PYTHON is not a Python >= 3.11" >&2
    return 1
  fi
  local dir name rows="" seen=" " order=0 dirs
  IFS=: read -r -a dirs <<< "$PATH"
  for dir in "${dirs[@]}"; do
    for name in python3.13 python3.12 python3.11 python3; do
      [ -x "$dir/$name" ] || continue
      info="$(python_info "$dir/$name")" || continue
      read -r version opt exe <<< "$info"
      case "$seen" in *" $exe "*) continue ;; esac
      seen="$seen$exe "
      order=$((order + 1))
      rows="$rows${version#3.} $opt $order $version $exe"$'\n'
    done
  done
  local _major _order
  while read -r _major opt _order version exe; do
    [ -n "$exe" ] || continue
    can_make_venv "$exe" "$version" || { echo ">> skipping $exe: it cannot make a venv" >&2; continue; }
    if [ "$opt" = 1 ]; then
      printf '%s\t%s\n' "$exe" "Python $version, an optimised build: PGO/LTO"
    else
      printf '%s\t%s\n' "$exe" "Python $version, a plain build: no PGO/LTO"
    fi
    return 0
  done < <(printf '%s' "$rows" | sort -k1,1nr -k2,2nr -k3,3n)
  echo "error: disque-py needs Python >= 3.11 with venv (set PYTHON=/path/to/python3.x)" >&2
  return 1
}

# ensure_venv EXTRAS: EXTRAS is a comma-separated list (dev, spark, bench). A venv installed
# with more extras than asked for is kept as it is.
ensure_venv() {
  local extras="${1:-dev}"
  local hash; hash="$(sha1sum < "$ROOT/pyproject.toml" | cut -c1-12)"
  if [ ! -x "$VENV/bin/python" ]; then
    local found py; found="$(find_python)" || exit 1
    py="${found%%$'\t'*}"
    echo ">> creating $VENV with $py (${found#*$'\t'})" >&2
    "$py" -m venv "$VENV" || { rm -rf "$VENV"; exit 1; }
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
