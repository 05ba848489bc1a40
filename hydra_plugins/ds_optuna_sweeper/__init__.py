"""hydra-ds-optuna-sweeper: one Optuna study driven from rank 0 of a torchrun world.

Hydra's plugin scanner imports every module under ``hydra_plugins`` in every Hydra app, so this
package keeps its modules light: torch, optuna, transformers and deepspeed are imported inside
functions (or in ``_impl.py``, which the scanner skips).
"""

__version__ = "0.1.0"
