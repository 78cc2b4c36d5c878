"""Engines: ONNX graphs -> depth-specialised engines (ONNX Runtime, TensorRT) the runtime runs.

Public API: ``build_engines`` (build.py), ``load_engines`` / ``EngineSet`` (engine_set.py),
``Runner`` (base.py). The tree mirrors polygraphy's loader/runner split: plan.py decides
shapes as data, one module per backend builds and runs, manifest.py ties an engines
folder to its export, backend version and device, costs.py profiles the cost table.
"""

from specrt.engines.base import Runner
from specrt.engines.build import build_engines
from specrt.engines.engine_set import EngineSet, load_engines

__all__ = ["Runner", "EngineSet", "build_engines", "load_engines"]
