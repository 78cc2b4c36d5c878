"""specrt: speculative decoding deployed to ONNX Runtime and TensorRT.

The package is split the way data flows: ``specrt.export`` (checkpoints -> bound
weights -> ONNX), ``specrt.engines`` (ONNX -> depth-specialised engines),
``specrt.runtime`` (draft / verify scheduling). ``specrt`` itself holds the CLI
and the contracts every stage shares.
"""

__version__ = "0.1.0"
