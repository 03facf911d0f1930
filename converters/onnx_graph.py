"""A small ONNX graph builder that streams initializers into one external data file.

Weights go to disk as they are made, so converting a model holds one tensor at a time in memory;
the graph itself (nodes and tensor references) stays small. Offsets are page-aligned so
onnxruntime can map the data file instead of copying it.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS_DOMAIN = "com.microsoft"
# onnxruntime 1.31 reads IR version <= 13; onnx 1.23 writes 14 by default.
IR_VERSION = 10
OPSET = 21
ALIGNMENT = 4096
# Small tensors (norm weights, shapes) stay inside the graph file.
INLINE_LIMIT_BYTES = 1024

NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.uint8): TensorProto.UINT8,
}


class ExternalData:
    """Appends arrays to the data file and returns TensorProtos pointing at them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stream: BinaryIO = path.open("wb")
        self.n_bytes = 0

    def add(self, name: str, array: np.ndarray) -> TensorProto:
        array = np.ascontiguousarray(array)
        if array.nbytes <= INLINE_LIMIT_BYTES:
            return numpy_helper.from_array(array, name)
        padding = -self.n_bytes % ALIGNMENT
        if padding:
            self._stream.write(b"\0" * padding)
            self.n_bytes += padding
        offset = self.n_bytes
        self._stream.write(memoryview(array).cast("B"))
        self.n_bytes += array.nbytes
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = NP_TO_ONNX[array.dtype]
        tensor.dims.extend(array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(offset)), ("length", str(array.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        return tensor

    def close(self) -> None:
        self._stream.close()


class GraphBuilder:
    """Nodes, initializers, inputs and outputs of one graph, with unique names made on the way."""

    def __init__(self, data: ExternalData) -> None:
        self.data = data
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._names: Counter[str] = Counter()

    def unique(self, base: str) -> str:
        self._names[base] += 1
        count = self._names[base]
        return base if count == 1 else f"{base}_{count}"

    def weight(self, name: str, array: np.ndarray) -> str:
        """Store an initializer; returns its name."""
        self.initializers.append(self.data.add(name, array))
        return name

    def _initializer(self, name: str) -> TensorProto:
        return next(tensor for tensor in self.initializers if tensor.name == name)

    def view(self, name: str, of: str, shape: tuple[int, ...]) -> str:
        """A second initializer over the stored bytes of `of`, in another shape of as many values:
        no second copy on disk, and onnxruntime maps (and releases) each separately."""
        source = self._initializer(of)
        if math.prod(shape) != math.prod(source.dims):
            raise ValueError(f"{name}: shape {shape} does not hold the {math.prod(source.dims)} values of {of}")
        self.initializers.append(_reshaped(source, name, shape))
        return name

    def rows(self, name: str, of: str, first: int, count: int) -> str:
        """A view of `count` rows of `of` (along its first axis) from row `first`."""
        source = self._initializer(of)
        if first + count > source.dims[0]:
            raise ValueError(f"{name}: rows {first}..{first + count} lie outside the {source.dims[0]} rows of {of}")
        row_bytes = math.prod(source.dims[1:]) * helper.tensor_dtype_to_np_dtype(source.data_type).itemsize
        tensor = _reshaped(source, name, (count, *source.dims[1:]))
        if source.data_location == TensorProto.EXTERNAL:
            stored = {entry.key: entry for entry in tensor.external_data}
            stored["offset"].value = str(int(stored["offset"].value) + first * row_bytes)
            stored["length"].value = str(count * row_bytes)
        else:  # a small tensor kept in the graph (`ExternalData.add`)
            tensor.raw_data = source.raw_data[first * row_bytes : (first + count) * row_bytes]
        self.initializers.append(tensor)
        return name

    def drop(self, name: str) -> None:
        """Take initializer `name` out of the graph; its stored bytes stay for views of them."""
        self.initializers = [tensor for tensor in self.initializers if tensor.name != name]

    def constant(self, name: str, value: np.ndarray | list[int] | int) -> str:
        """A small int64 (or given dtype) constant as an initializer."""
        array = np.asarray(value, dtype=np.int64) if not isinstance(value, np.ndarray) else value
        return self.weight(self.unique(name), array)

    def op(self, op_type: str, inputs: list[str], name: str, *, n_outputs: int = 1, domain: str = "", **attrs: object) -> list[str]:
        """Add a node; returns its output names (`name` or `name/outputN`)."""
        node_name = self.unique(name)
        outputs = [self.output_name(node_name, i) for i in range(n_outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=node_name, domain=domain or None, **attrs))
        return outputs

    @staticmethod
    def output_name(node: str, index: int = 0) -> str:
        """The name of output `index` of the node named `node` (a name used once)."""
        return f"{node}/output_{index}"

    def op1(self, op_type: str, inputs: list[str], name: str, *, domain: str = "", **attrs: object) -> str:
        return self.op(op_type, inputs, name, domain=domain, **attrs)[0]

    def add_input(self, name: str, elem_type: int, shape: list[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def add_output(self, source: str, name: str, elem_type: int, shape: list[int | str]) -> None:
        """Expose `source` as graph output `name` (renaming the producing node's output)."""
        for node in self.nodes:
            for i, output in enumerate(node.output):
                if output == source:
                    node.output[i] = name
            for i, value in enumerate(node.input):
                if value == source:
                    node.input[i] = name
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def operator_counts(self) -> dict[str, int]:
        return dict(Counter(node.op_type for node in self.nodes).most_common())

    def model(self, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
            producer_name="localchat",
        )
        model.ir_version = IR_VERSION
        return model


def _reshaped(source: TensorProto, name: str, shape: tuple[int, ...]) -> TensorProto:
    tensor = TensorProto()
    tensor.CopyFrom(source)
    tensor.name = name
    del tensor.dims[:]
    tensor.dims.extend(shape)
    return tensor
