# Sourced by the GPU scripts: NVLink multicast off, wheels from .whl/, dflashd importable, $OUT set.
# NVLink multicast stays off for every process (shared hosts).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SITE="$(mktemp -d)"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl || exit 1
fi
# dflashd is a namespace package: link the three folders under it, as the wheel would install them.
mkdir -p "$SITE/dflashd"
for pkg in supervisor trainer logs; do ln -s "$PWD/$pkg" "$SITE/dflashd/$pkg"; done
export PYTHONPATH="$SITE:$PWD"
# The log path's C loops: logs/_lines.cpython-312-*.so when it was built elsewhere and carried,
# else built here where a compiler is; without either, the Python ones (status: log_codec).
if ! compgen -G "logs/_lines.cpython-3*.so" >/dev/null; then
    python3 setup.py -q build_ext --inplace --build-temp "$(mktemp -d)" >/dev/null 2>&1 || true
fi
python3 -c 'from dflashd.logs.linecodec import CODEC; print("log codec:", CODEC.implementation)'
# Bytecode written once, as an install writes it: the wheels above go in with --no-compile, a
# checkout has none, and the GPU host sets PYTHONDONTWRITEBYTECODE, so every start (the daemon's,
# each benchmark run's) would otherwise compile its modules afresh.
python3 -m compileall -q -j 0 "$SITE" supervisor logs trainer >/dev/null 2>&1 || true
# And the dataclasses' code cache (supervisor/host/codecache.py), which a start writes where
# bytecode may be written: one start with it allowed, as a user's first start after an install
# writes it. Without it every start compiles ~1,000 methods: 622 against 438 ms of CPU here.
WARM="$(mktemp -d)"
printf 'gpus = "none"\n' > "$WARM/d.toml"
env -u PYTHONDONTWRITEBYTECODE python3 -m dflashd.supervisor start --foreground --quiet \
    --home "$WARM/home" --config "$WARM/d.toml" -- true >/dev/null 2>&1 || true

export PATH="$SITE/bin:$PATH"  # py-spy (a wheel in .whl/) installs its binary there
OUT="${OUT:-$(mktemp -d)}"
export OUT
