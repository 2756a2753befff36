"""INT8 and FP8 engines (explicit quantization): which quantized layers break accuracy, why,
and the fewest to run in float instead (docs/quantization.md).

qdq.py: the quantized layers as TensorRT fuses them, and a model with some un-quantized;
judge.py: plans judged on ONNX Runtime's CPU provider under the run's criteria;
diagnose.py: why a layer fails quantized; run.py: the run. ModelOpt's exclusions and the
other renderings of the plan: outputs/quantized.py.
"""

from .qdq import Edge, Layer, analyse, is_quantized, unquantize
from .run import QuantResult, is_quantized_file, run, wants_quantized

__all__ = ["Edge", "Layer", "QuantResult", "analyse", "is_quantized", "is_quantized_file",
           "run", "unquantize", "wants_quantized"]
