import inspect
import subprocess
import sys
from pathlib import Path

import postprocess


def test_defaults_come_from_the_exported_constants():
    assert (postprocess.DEFAULT_CUTOFF_HZ, postprocess.DEFAULT_ORDER, postprocess.DEFAULT_PEAK_DBFS) == (11000.0, 2, -3.0)
    lowpass_params = inspect.signature(postprocess.lowpass).parameters
    assert lowpass_params["cutoff_hz"].default == postprocess.DEFAULT_CUTOFF_HZ
    assert lowpass_params["order"].default == postprocess.DEFAULT_ORDER
    assert inspect.signature(postprocess.design_lowpass).parameters["order"].default == postprocess.DEFAULT_ORDER
    assert inspect.signature(postprocess.peak_normalize).parameters["target_dbfs"].default == postprocess.DEFAULT_PEAK_DBFS


def test_imports_with_numpy_and_scipy_only():
    code = "import sys, postprocess; assert not {'torch', 'comfy'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
