"""Versioned map from raw Kineto trace fields to canonical EventTable columns.

A profiler format change is a one-file edit: add the new raw name to the spec
of the column it feeds. Raw names are tried in order; the first one present wins.
"""

from __future__ import annotations

from dataclasses import dataclass

FIELDS_VERSION = 1


@dataclass(frozen=True, slots=True)
class AttributeSpec:
    name: str  # canonical column name
    raw_names: tuple[str, ...]  # keys in an event's "args", tried in order
    dtype: str  # numpy dtype of the column
    default: float | int  # value when absent


ARG_SPECS = {
    spec.name: spec
    for spec in (
        AttributeSpec("correlation", ("correlation",), "int64", -1),
        AttributeSpec("ext_id", ("External id",), "int64", -1),
        AttributeSpec("stream", ("stream",), "int64", -1),
        AttributeSpec("wait_stream", ("wait_on_stream",), "int64", -1),
        AttributeSpec("wait_event_corr", ("wait_on_cuda_event_record_corr_id",), "int64", -1),
        AttributeSpec("msg_nelems", ("In msg nelems", "in_msg_nelems"), "float64", float("nan")),
        AttributeSpec("group_size", ("Group size", "group_size"), "int32", -1),
    )
}

# what the JSON scanner (scan.py) reads of every event, by the hash of the key's bytes, in this
# order: the event's own keys, and the hot args (the first raw names of correlation, ext_id and
# stream above, and the record-function id the execution-trace join uses)
EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")
SCANNED_ARG_KEYS = (
    ARG_SPECS["correlation"].raw_names[0],
    ARG_SPECS["ext_id"].raw_names[0],
    ARG_SPECS["stream"].raw_names[0],
    "Record function id",
    "Ev Idx",  # the exporter's index of the event: gaps mean events were sampled or removed
    "Profiler Event Index",  # its name before PyTorch 2.0 (traces of 2022): read as Ev Idx
)

# args keys with structured values, read by dedicated code in events.py
SYNC_KIND_KEY = "cuda_sync_kind"
PG_RANKS_KEYS = ("Process Group Ranks", "process_group_ranks")
PG_NAME_KEYS = ("Process Group Name", "process_group_name")
COLLECTIVE_NAME_KEYS = ("Collective name", "collective_name")
"""The collective an op or kernel is, in its args (recent PyTorch: record_param_comms and the NCCL
kernels it launched): what names it where the kernel's own name does not (NCCL 2.19 and later run
every collective in ``ncclDevKernel_Generic``)."""
P2P_PEER_KEYS = {"send": ("Dst Rank", "dst_rank"), "recv": ("Src Rank", "src_rank")}
"""The peer of a send or a receive, by its collective name, as recent PyTorch writes it on the
record_param_comms op and on the NCCL kernel it launched: the peer's global rank (the c10d call's
own argument is its rank in the call's group)."""
SEQ_KEYS = ("Seq", "seq")  # a collective's sequence number in its process group (recent PyTorch, record_param_comms / NCCL kernels)
INPUT_DIMS_KEY = "Input Dims"
CONCRETE_INPUTS_KEY = "Concrete Inputs"  # scalar arguments as strings; c10d::send/recv_: [tensors, pg, peer, tag]
INPUT_TYPE_KEY = "Input type"
DTYPE_KEYS = ("dtype",)

# Raw event categories ("cat") and the event class they map to.
CPU_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "Operator"})
# CPU events that mark a range of program code (record_function, Python frames), not an op: the
# time between their children is Python or untraced work, not the work of an op
RANGE_CATS = frozenset({"user_annotation", "python_function"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "Driver"})
KERNEL_CATS = frozenset({"kernel", "Kernel"})
MEMCPY_CATS = frozenset({"gpu_memcpy", "Memcpy"})
MEMSET_CATS = frozenset({"gpu_memset", "Memset"})
GPU_SYNC_CATS = frozenset({"cuda_sync"})
COPY_CALL_PATTERN = r"mem(cpy|set)"
"""A runtime call that copies or sets memory (``cudaMemcpyAsync``, ``hipMemsetAsync``, ``cuMemcpyDtoH``)."""
HOST_WAIT_PATTERN = r"^(ur|pi|ze)(QueueFinish|EventWait|EventsWait)$|^cl(Finish|WaitForEvents)$"
"""Runtime calls other than a synchronize that block their host until device work is done: the
waits of Intel's unified runtime (and its older plugin interface) and of OpenCL; not
``urEnqueueEventsWait``, which orders device work without blocking."""
HOST_BLOCKED_PATTERN = (
    r"^<built-in (function|method) (sleep|acquire|wait|select|poll|epoll_wait|recv|recv_into|recvfrom|accept|waitpid|run_backward)\b"
    r"(?!.* of Tensor object)"  # (Tensor.select is indexing)
    r"|^<built-in function read>"
)
"""Python calls (as the profiler's Python tracer names them, ``with_stack=True``) that block their
thread without computing: ``time.sleep``, a lock's ``acquire`` (``queue.get``, ``Thread.join``,
``Event.wait``), ``Future.wait``, ``select``/``poll``, a socket's ``recv``, ``os.read`` of a pipe (a
DataLoader worker's batch), ``loss.backward()``'s ``run_backward`` where the thread runs none of
the backward itself. Their time is the thread waiting (for another thread, a process, the
network, a timer), not the work of an op."""
PYTHON_CALL_PATTERN = r"^<built-in (function|method) |^<method '|\.py\(\d+\): "
"""A Python call as the profiler's Python tracer names it (``with_stack=True``): ``<built-in
function zoom_shift>``, ``<method 'append' of 'list' objects>``,
``transformers/image_transforms.py(390): normalize``."""
HOST_BLOCKED_MIN_US = 50.0
"""µs: such a call this long or longer blocked; a shorter one (an uncontended lock's acquire, a
poll that found data ready) is the call's own work."""
LOADER_WAIT_RANGE = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
"""The range a DataLoader with worker processes records around handing the loop its next batch.
Inside it the loop's thread runs nothing of its own: it takes the batch off the workers' queue
(``queue.get``, blocking until a worker has one ready) and rebuilds its tensors from shared
memory (the ``aten::empty``/``aten::set_`` ops inside it). Time in it with no op open is the loop
waiting for its workers (a wait on other processes the trace does not show), not untraced work."""
COLLECTIVE_WAIT_PATTERN = r"^_?c10d_functional::wait_tensors?$"
"""The wait of a functional collective (``torch.distributed._functional_collectives``: DTensor's
tensor parallelism, torch.compile's collectives): ``wait_tensor`` waits for the collective whose
output it is. On a backend that runs its collectives on the host (gloo) it blocks its thread until
the backend's op is done: a wait on that op, never work (edges.collective_waits); on NCCL it only
makes the stream wait, and returns."""
C10D_CALL_PATTERN = r"^c10d::(?!.*wait)"
"""A c10d collective's call on the thread that issues it (``c10d::allreduce_``, ``c10d::barrier``,
``c10d::send``; not a wait). Where the backend runs the collective on the host (gloo), the call hands
it to the backend's thread and returns, but it can hold its thread well past that: a contended
machine, a backend that runs a collective in the call. Its time is then the thread blocked in
communication, never compute (segments.node_class); a call of 1 ms or more with nothing of its
thread inside is counted with the blocked calls of the self-check (facts.WAITING_NAME)."""
FUNCTIONAL_COLLECTIVE_PATTERN = r"^_?c10d_functional::(?!wait_tensor|_wrap_tensor_autograd)"
"""A functional collective's op (``_c10d_functional::all_reduce``, ``all_gather_into_tensor``,
torch.compile's ``all_reduce_``): the c10d call inside it is what a later ``wait_tensor`` waits for."""
DEVICE_WAIT_PATTERN = r"(?i)^(event_?wait|wait_?(on_?)?events?|stream_?wait(_?events?)?|wait)$"
"""Device ops that are a queue waiting, not computing: an accelerator that shows its stream's wait
for an event as an op of its own (an MTIA's ``event_wait``, recorded for the runtime's
``enqueueCommand waitOnEvent``). CUDA and ROCm show no such op (a ``cudaStreamWaitEvent`` is an
edge); the graph keeps the op (the queue is held), waiting for the stream its args name
(edges.device_waits); a wait the trace does not tie to a cause is an untraced wait on the device
on the path, never compute; the facts leave such ops out of the device's busy time."""
LOCK_WAIT_PATTERN = r"^<built-in method (acquire|wait|run_backward)\b"
"""Of those, the waits another thread of the process ends: a lock's acquire (``queue.get``,
``Event.wait``, ``Thread.join``), a future's wait, and ``loss.backward()``'s call into the
autograd engine where it runs nothing itself (a leaf: the engine's device threads run a GPU
backward while the calling thread waits for them; on a CPU job it runs the backward itself, and
its ops are its children)."""
DEVICE_LABEL_PATTERN = r"^\s*(gpu|mtia|xpu|hpu|npu|tpu|device)\s*\d+\s*$"
"""A device process's label as a profiler writes it (Kineto's ``process_labels``: "GPU 1"): the
device's name where one process drives several (its lanes "GPU 1 stream 7")."""
# categories that are understood and carry no work of their own: the profiler's span, its own
# overhead, device-side copies of CPU ranges, instant events and flows, and the device-side marks
# of recorded CUDA events (``cuda_event``, one of Kineto's default activities since CUDA 12.8: a
# 1 µs mark where the stream reached the event, tied to its cudaEventRecord; before 12.8 at time 0)
IGNORED_CATS = frozenset({"Trace", "overhead", "Overhead", "gpu_user_annotation", "cpu_instant_event", "ac2g", "fwdbwd", "cuda_event"})
# a category of another vendor's runtime ("mtia_runtime", "xpu_runtime", "hpu_driver"): its calls
# are runtime calls like CUDA's
RUNTIME_CAT_SUFFIXES = ("_runtime", "_driver", "runtime", "driver")
# a process the profiler names like this is an accelerator, whatever its events' categories
# ("GPU 0", "MTIA 17", "HPU 3", "XPU 1", "NeuronCore 2", XLA's "/device:TPU:0", Ascend's "Ascend Hardware"; not XLA's
# host "/device:CPU:0")
DEVICE_PROCESS_PATTERN = (
    r"^\s*/?(gpu|mtia|hpu|xpu|npu|tpu|ipu|neuron\w*|ascend\s+hardware|device(?!\W*cpu\b)|accelerator|gaudi|cuda|rocm|hip)\b"
)
RUNTIME_PROCESS_PATTERN = r"^\s*cann\s*$"
"""A process the profiler names like this holds the accelerator runtime's calls, without a
category, on the ids of the host threads that made them: Ascend's torch_npu writes CANN's
``AscendCL@aclnnMatmul``, ``AscendCL@aclrtSynchronizeStream`` so, beside the torch ops' process."""
DEVICE_COLLECTIVE_PATTERN = (
    r"(?<!sm)all_?(reduce|gather|to_?all)|reduce_?scatter|multimem|cross_device_reduce|userbuffers|deep_ep::|nvshmem|^hcom_"
)
"""A device kernel that moves data between devices, where it is no NCCL/RCCL kernel: PyTorch's
symmetric-memory collectives (``multimem_all_reduce_kernel``, ``one_shot_all_reduce``), the
custom all-reduce of inference servers (vLLM's and SGLang's ``cross_device_reduce_1stage``),
TensorRT-LLM's ``allreduce_fusion``, Transformer Engine's ``userbuffers_*``, DeepEP's
``deep_ep::...`` dispatch and combine, NVSHMEM's, Ascend HCCL's ``hcom_allReduce_...`` tasks.
Its time on the critical path is communication (it spins until its peers' data arrives), not
compute; it is not matched across ranks as an NCCL collective is. (Not "small_gather",
"small_reduce": a kernel's name for its size.)"""
CPU_BACKEND_PREFIXES = ("gloo:", "mpi:", "ucc:")
"""The names a CPU collective backend records its ops under, on the thread that runs them
(``gloo:all_reduce``; ProcessGroupMPI's and ProcessGroupUCC's work records ``mpi:all_reduce``,
``ucc:all_reduce`` the same way, on their own worker thread): network ops."""
COUNTER_RANGE_SUFFIX = "profiler_range"
"""The category of a counter-reading profiler's kernel ranges ("cuda_profiler_range": the CUPTI range
profiler, torch.profiler's experimental ``profiler_metrics``; "mlu_profiler_range"): device ops
whose times are those of replays made to read counters (events.py says so)."""
FLOW_CATS = frozenset({"fwdbwd"})
LAUNCH_FLOW_CATS = frozenset({"async_npu"})
"""Flow events that tie a host op to the device op it launched, where the device's ops carry no
correlation id: Ascend's torch_npu writes ``torch_to_npu`` flows (category ``async_npu``) from a
torch op (its start) to each task it put on the NPU (the task's start)."""

STEP_PREFIX = "ProfilerStep#"
OPTIMIZER_STEP_PREFIX = "Optimizer.step#"
"""The annotation PyTorch's optimizers record around each ``step()`` (``Optimizer.step#SGD.step``):
where a loop never calls the profiler's ``step()``, the ends of these cut its iterations."""

# Element sizes in bytes for the dtype names profilers write.
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "Float": 4,
    "double": 8,
    "float64": 8,
    "Double": 8,
    "half": 2,
    "float16": 2,
    "Half": 2,
    "bfloat16": 2,
    "BFloat16": 2,
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "int": 4,
    "int32": 4,
    "Int": 4,
    "long": 8,
    "int64": 8,
    "Long": 8,
    "long int": 8,
    "int8": 1,
    "uint8": 1,
    "unsigned char": 1,
    "signed char": 1,
    "bool": 1,
    "Byte": 1,
    "Char": 1,
    "Bool": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
}
FLOAT_DTYPES = frozenset(k for k in DTYPE_BYTES if k.lower().removeprefix("c10::").startswith(("float", "double", "half", "bfloat16")))
"""The floating-point dtype names among DTYPE_BYTES: an op's precision is that of its first
floating-point input (an integer input is an index, a count, a mask)."""
PRECISION_OP_PATTERN = (
    r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|einsum|_scaled_mm|addmv|mv"
    r"|conv\w*|_?convolution\w*|cudnn_convolution\w*|miopen_convolution\w*|mkldnn_convolution\w*"
    r"|_?scaled_dot_product\w*|_flash_attention\w*|_efficient_attention\w*)$"
)
"""CPU ops whose device work runs in the precision of their inputs (matmuls, convolutions,
attention): their "Input type" (``record_shapes=True``) gives the precision of the kernels they
launch (facts.kernel_precision)."""
LOW_PRECISION_KERNEL_PATTERN = (
    r"bf16|bfloat16|f16(?!\d)|fp16|half|fp8|f8(?!\d)|e4m3|e5m2|float8|h884|h1688|h16816|h16832|hgemm"
    r"|_(?:HHS|HSS|BBS|BSS|HH|BB|F8\w*)_"
)
"""Kernel names that say the kernel works in 16 or 8 bits (cuBLAS/CUTLASS ``bf16``/``f16``/``h1688``,
Itanium-mangled ``DF16b``, ROCm Tensile's ``_BBS_``/``_HHS_`` data-type field, ``e4m3``);
case-insensitive. A kernel whose launching op has an input type is read from that instead."""
FULL_PRECISION_KERNEL_PATTERN = r"sgemm|dgemm|fp32|f32|tf32|float|double|_(?:SB|SS|DB|DD)_"
"""Kernel names that say fp32 or fp64 (and none of the 16/8-bit words above: a bf16 kernel's
name often holds ``float``, its accumulator); case-insensitive."""
