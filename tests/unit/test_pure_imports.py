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
