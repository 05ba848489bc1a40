"""The faults the test apps inject into a task (``fault.kind``), as real tasks misbehave; shared by
``sweep_app.py`` and ``fault_plan_app.py``."""

import os
import time


def inject(kind: str, value, rank: int):
    """Misbehave like real tasks do on ``rank`` (the app's global rank, for the messages); returns the (possibly
    broken) objective."""
    if kind == "raise":
        raise RuntimeError(f"injected failure on rank {rank}")
    if kind == "return_nan":
        return float("nan")
    if kind == "text":
        return "not a number"
    if kind == "none_return":
        return None
    if kind == "dict":  # a metrics dict (what trainer.evaluate() returns) instead of the objective
        return {"eval_loss": float(value), "epoch": 1.0}
    if kind == "exit":
        raise SystemExit(3)
    if kind == "interrupt":
        raise KeyboardInterrupt()
    if kind == "kill9":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        time.sleep(3600)
    if kind == "preempt":  # SIGTERM to a task that checks should_preempt(): it stops there (saved, re-queued)
        import signal

        from hydra_plugins.ds_optuna_sweeper import current_trial

        trial = current_trial()
        trial.should_preempt()  # the process is preemption-aware from its first check
        os.kill(os.getpid(), signal.SIGTERM)
        assert trial.should_preempt(), "the SIGTERM did not set the flag"
        return value
    if kind == "signal_in_del":  # Ctrl-C or SIGTERM delivered inside a __del__: Python prints and drops its exception
        import signal

        class _SignalsWhenCollected:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM if os.environ.get("DSO_TEST_SIGNAL") == "TERM" else signal.SIGINT)
                time.sleep(0.5)  # the handler runs here, inside __del__

        _SignalsWhenCollected()
        return value
    if kind == "init_group":  # the task initialises the default group the sweeper already made (case C24)
        import torch.distributed as dist

        dist.init_process_group("gloo")
    if kind == "abort_at_exit":  # the task succeeds; the process aborts in interpreter teardown (DeepSpeed's case)
        import atexit

        atexit.register(os.abort)
    return value

