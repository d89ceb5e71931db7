"""Stand-ins for what needs a GPU: cuda-python's runtime over host memory, TensorRT's runtime.

A GPU cannot exist here; these sit behind the same seams the real code uses (``cudart`` and
``trt`` handed to ``onnx2trt._RealTensorRT``/``PlanRunner``), so the logic around them runs.
"""

from __future__ import annotations

import numpy as np


class FakeCudart:
    """cuda-python's runtime API over host memory: records every call the runners make.

    Device and pinned memory are ctypes buffers; copies are real memmoves; events read a clock
    that each copy and execution advance, so elapsed times are positive and ordered.
    """

    class cudaMemcpyKind:  # noqa: N801 - cuda-python's names
        cudaMemcpyHostToDevice = "H2D"
        cudaMemcpyDeviceToHost = "D2H"
        cudaMemcpyDeviceToDevice = "D2D"

    def __init__(self):
        import ctypes

        self.ctypes, self.calls, self.memory = ctypes, [], {}
        self.device, self.pinned, self.freed = set(), set(), []
        self.clock, self.events, self.streams = 0.0, {}, 0

    def _alloc(self, size, kind):
        buffer = self.ctypes.create_string_buffer(size)
        pointer = self.ctypes.addressof(buffer)
        self.memory[pointer] = buffer
        kind.add(pointer)
        return pointer

    def cudaStreamCreate(self):  # noqa: N802
        self.calls.append("cudaStreamCreate")
        self.streams += 1
        return 0, 7  # stream handle 7: not the legacy default stream (0)

    def cudaEventCreate(self):  # noqa: N802
        event = 100 + len(self.events)
        self.events[event] = None
        return 0, event

    def cudaEventRecord(self, event, stream):  # noqa: N802
        assert stream == 7
        self.events[event] = self.clock
        return (0,)

    def cudaEventSynchronize(self, event):  # noqa: N802
        self.calls.append("cudaEventSynchronize")
        return (0,)

    def cudaEventElapsedTime(self, start, end):  # noqa: N802
        return 0, self.events[end] - self.events[start]

    def cudaEventDestroy(self, event):  # noqa: N802
        self.calls.append("cudaEventDestroy")
        return (0,)

    def cudaMalloc(self, size):  # noqa: N802
        self.calls.append("cudaMalloc")
        return 0, self._alloc(size, self.device)

    def cudaMallocHost(self, size):  # noqa: N802
        self.calls.append("cudaMallocHost")
        return 0, self._alloc(size, self.pinned)

    def cudaMemcpyAsync(self, dst, src, size, kind, stream):  # noqa: N802
        assert int(stream) == 7
        if kind == "H2D":
            assert src in self.pinned and dst in self.device, "copies go from pinned host memory"
        if kind == "D2H":
            assert src in self.device and dst in self.pinned, "copies go to pinned host memory"
        self.ctypes.memmove(dst, src, size)
        self.clock += 1.0
        self.calls.append(f"cudaMemcpyAsync {kind}")
        return (0,)

    def cudaFree(self, pointer):  # noqa: N802
        self.freed.append(pointer)
        return (0,)

    def cudaFreeHost(self, pointer):  # noqa: N802
        self.freed.append(pointer)
        return (0,)

    def cudaStreamDestroy(self, stream):  # noqa: N802
        self.calls.append("cudaStreamDestroy")
        return (0,)


class FakeTrt:
    """TensorRT's runtime objects for a plan like MiniLM's: int32 ``input_ids`` (TensorRT narrowed
    the graph's int64), int64 ``attention_mask``, float32 ``embedding`` = mean of ids * mask.

    ``set_input_shape`` refuses shapes outside the profile (batch 1..4, length 2..16), as
    TensorRT's returns False.
    """

    class TensorIOMode:  # noqa: N801
        INPUT, OUTPUT = "in", "out"

    class Logger:
        WARNING = 2

        def __init__(self, level):
            pass

    DTYPES = {"input_ids": "int32", "attention_mask": "int64", "embedding": "float32"}
    PROFILE = ((1, 2), (4, 8), (4, 16))

    def __init__(self, cudart, streams):
        self.streams, fake = streams, self

        class Context:
            def __init__(self):
                self.addresses, self.shapes = {}, {}

            def set_input_shape(self, name, shape):
                lo, _, hi = fake.PROFILE
                if not all(a <= d <= b for a, d, b in zip(lo, shape, hi)):
                    return False
                self.shapes[name] = tuple(shape)
                return True

            def get_tensor_shape(self, name):
                if name == "embedding":
                    return (self.shapes["input_ids"][0], 1)
                return self.shapes[name]

            def set_tensor_address(self, name, pointer):
                self.addresses[name] = pointer

            def execute_async_v3(self, stream):
                import ctypes

                fake.streams.append(stream)
                batch, length = self.shapes["input_ids"]
                ids = np.ctypeslib.as_array((ctypes.c_int32 * (batch * length)).from_address(
                    self.addresses["input_ids"])).reshape(batch, length)
                mask = np.ctypeslib.as_array((ctypes.c_int64 * (batch * length)).from_address(
                    self.addresses["attention_mask"])).reshape(batch, length)
                out = np.ctypeslib.as_array((ctypes.c_float * batch).from_address(self.addresses["embedding"]))
                out[:] = (ids * mask).mean(axis=1)
                cudart.clock += 10.0
                return True

        class Engine:
            num_io_tensors = 3

            def get_tensor_name(self, i):
                return ["input_ids", "attention_mask", "embedding"][i]

            def get_tensor_mode(self, name):
                return fake.TensorIOMode.OUTPUT if name == "embedding" else fake.TensorIOMode.INPUT

            def get_tensor_dtype(self, name):
                return fake.DTYPES[name]

            def get_tensor_profile_shape(self, name, profile):
                return list(fake.PROFILE)

            def create_execution_context(self):
                return Context()

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, data):
                return Engine()

        self.Runtime = Runtime

    @staticmethod
    def nptype(dtype):
        return np.dtype(dtype)




def skip_reason_without_gpu() -> str:
    """The reason the build records for a skipped plan here; skips the calling test on a GPU host."""
    import pytest

    from tools.build_repo import onnx2trt

    try:
        onnx2trt.probe_gpu()
    except onnx2trt.NoGpu as exc:
        return f"no GPU ({exc})"
    pytest.skip("this host has a GPU: the plan is built")
