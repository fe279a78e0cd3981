import subprocess
import sys

CODE = """
import sys
import grpolab.algo, grpolab.eval.metrics, grpolab.types
heavy = sorted(m for m in ("transformers", "matplotlib") if m in sys.modules)
assert not heavy, f"pure modules imported {heavy}"
"""


def test_pure_modules_do_not_import_transformers():
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


MODELS = """
import sys
import grpolab.models.loading
above = sorted(m for m in sys.modules if m.startswith(("grpolab.training", "grpolab.run", "grpolab.rollout")))
assert not above, f"grpolab.models.loading imported {above}"
"""


def test_loading_a_model_imports_nothing_of_the_trainer():
    proc = subprocess.run([sys.executable, "-c", MODELS], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
