"""The ONNX facade: loading with clear errors, node names, float typing, data flow and weights
by reference. Each module holds one concern, and imports only the ones listed above it:

    control_flow  If, Loop and Scan bodies: walking them, what a node reads through them
    schema        what onnx's op schemas say about FP16 (inputs, FP32 outputs, parameters)
    names         the names trtbisect gives nodes, subgraphs' qualified (`flatten`)
    inline        model-local functions inlined as TensorRT's parser imports them
    weights       initializers held once (`Weights`), a model without its weights (`structure`)
    float_types   every tensor's element type, a float16 model's FP32 view (`upcast`)
    repair        the run's own copy of a model every runtime takes (docs/input_models.md)
    load          reading a file: one-line errors, external data checked, hashes
    core          `Graph`, the read-only view the rest of trtbisect works on

The input model is never mutated; everything that rewrites a graph works on a copy.
"""

from .control_flow import data_flow, node_reads, subgraphs, walk, walk_graphs
from .core import Graph
from .float_types import FLOAT, HALF_TYPES, infer, infer_types, upcast
from .inline import inline_functions
from .load import (
                   check_weight_sizes,
                   external_data_hash,
                   external_files,
                   load_model,
                   model_hash,
                   physical_memory,
                   tensor_bytes,
)
from .names import (
                   Flat,
                   check_names,
                   flatten,
                   named_as_trtbisect_names,
                   node_names,
                   qualified_name,
                   with_node_names,
)
from .schema import (
    PARAMETER_INPUTS,
    PASS_THROUGH_OPS,
    fp16_signature,
    fp32_by_schema,
    fp32_outputs,
    has_schema,
)
from .weights import (
                   SMALL_BYTES,
                   STORE_LOCATION,
                   Weights,
                   _mark_stored,
                   constant_value,
                   initializer_array,
                   structure,
)

__all__ = [
    "FLOAT", "HALF_TYPES", "PARAMETER_INPUTS", "PASS_THROUGH_OPS", "SMALL_BYTES",
    "STORE_LOCATION", "Flat", "Graph", "Weights", "check_names", "check_weight_sizes",
    "constant_value", "data_flow", "external_data_hash", "external_files", "flatten",
    "fp16_signature", "fp32_by_schema", "fp32_outputs", "has_schema", "infer", "infer_types",
    "initializer_array", "inline_functions", "load_model", "model_hash",
    "named_as_trtbisect_names", "node_names", "node_reads", "physical_memory", "qualified_name", "structure", "subgraphs", "tensor_bytes",
    "upcast", "walk", "walk_graphs", "with_node_names",
    "_mark_stored",  # mixed.py and backends/ort.py mark weights the store holds
]
