"""Deployment needs ONNX Runtime, numpy and a tokenizer: the runtime never imports torch or transformers."""

import subprocess
import sys


def test_runtime_and_engines_import_without_torch():
    code = ("import sys; import specrt.runtime.session, specrt.runtime.generate, specrt.runtime.canary, "
            "specrt.runtime.calibrate, specrt.engines.engine_set, specrt.engines.onnxruntime, specrt.cli; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
