"""The README's main command: the demo builds, trains, exports and serves."""

import os
import subprocess
import sys


def test_demo_runs_end_to_end(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-m", "kerasformer.demo", "--steps", "30",
         "--run-dir", str(tmp_path / "run"), "--export-dir", str(tmp_path / "saved_models" / "demo")],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "served: 'the old cat" in result.stdout
    assert "demo done: val_loss=" in result.stdout
    assert (tmp_path / "saved_models" / "demo" / "saved_model.pb").exists()
