"""No storage password anywhere under the sweep dir (issue 38, C59).

The logs and MLflow hid it, but Hydra wrote it in plain text into every trial's ``.hydra/hydra.yaml``
(``hydra.sweeper.storage`` and the ``hydra.overrides.hydra`` line that set it). A sweep on the real PostgreSQL server (trust auth: it accepts the
made-up password), a trial that fails so the stop and resume paths run too, torchrun's error file set as
torchrun sets it; then every byte under the sweep dir, and the error file, is searched.

In process at world size 1 (``tests/in_process.py``, issue 39 item 1): the files under the sweep dir that name
the storage (``.hydra/``, the results file, rank 0's job logs) are rank 0's; rank 1 never opens the storage.
"""

import pytest
import sqlalchemy

from hydra_plugins.ds_optuna_sweeper._secrets import redact, redact_file
from tests.in_process import sweep as run_sweep
from tests.multirank.test_shared_study import pg_study, postgres_url  # noqa: F401 (fixtures)

PASSWORD = "S3cret-c59"


def test_redact_file_rewrites_only_a_file_with_a_password(tmp_path):
    plain, secret = tmp_path / "plain.yaml", tmp_path / "hydra.yaml"
    plain.write_text("storage: sqlite:///x.db\n")
    secret.write_text(f"storage: postgresql+psycopg2://me:{PASSWORD}@db:5432/optuna\n- hydra.sweeper.storage="
                      f"redis://u:{PASSWORD}@h:6379/0\n")
    assert not redact_file(plain) and not redact_file(tmp_path / "missing.yaml")
    assert redact_file(secret) and PASSWORD not in secret.read_text()
    assert secret.read_text() == redact(f"storage: postgresql+psycopg2://me:{PASSWORD}@db:5432/optuna\n"
                                        f"- hydra.sweeper.storage=redis://u:{PASSWORD}@h:6379/0\n")
    assert "postgresql+psycopg2://me:***@db:5432/optuna" in secret.read_text()


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_no_storage_password_under_the_sweep_dir(tmp_path, pg_study):
    url, name = pg_study
    with_password = sqlalchemy.engine.make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)
    assert PASSWORD in with_password
    error_file = tmp_path / "error.json"
    res = run_sweep(tmp_path, "x=interval(-1,1)", "hydra.sweeper.n_trials=3", f"hydra.sweeper.storage={with_password}",
                    f"hydra.sweeper.study_name={name}", "fail_on_rank=0", "fail_on_trial=1",
                    env={"TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert res.returncode != 0 and "trials of this run failed" in res.output, res.output[-4000:]
    assert "trials of this run failed" in error_file.read_text() and PASSWORD not in error_file.read_text()
    sweep = tmp_path / "sweep"
    files = [p for p in sweep.rglob("*") if p.is_file()]
    assert any(p.name == "hydra.yaml" for p in files)
    holding = [str(p.relative_to(sweep)) for p in files if PASSWORD.encode() in p.read_bytes()]
    assert holding == [], holding
    hydra_yaml = (sweep / "0" / ".hydra" / "hydra.yaml").read_text()
    assert ":***@" in hydra_yaml and f"study_name: {name}" in hydra_yaml
