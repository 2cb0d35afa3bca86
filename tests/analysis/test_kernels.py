"""Kernel families and communication/compute overlap (analysis.kernels)."""

from __future__ import annotations

import numpy as np
import pytest

from bottleneck_oracle.analysis.kernels import family, interval_union, overlap_length
from conftest import PUBLIC, REAL, SAMPLE, cached_analyses


@pytest.mark.parametrize(
    "name,expected",
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
        ("gloo:all_reduce", "communication"),
        ("void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(cudnnTensorStruct)", "normalization"),
        ("void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false>(int)", "convolution"),
        (
            "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::WinogradDataParams)",
            "convolution",
        ),
        ("volta_sgemm_128x64_nt", "gemm"),
        ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel", "gemm"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> >(int)",
            "elementwise",
        ),
        ("Memset (Device)", "memory"),
        ("Memcpy HtoD (Pageable -> Device)", "memory"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)", "attention"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>(float*, float const*, int)", "normalization"),
        ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt64x128x32_wt32x32x8_ws1x1_wr2x1_ta1x8x1x1_1x", "convolution"),  # MIOpen (mi300 trace)
        ("_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47Grid", "convolution"),  # CK conv weight gradient
        ("Cijk_Ailk_Bljk_BBS_BH_MT32x32x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0_ACED", "gemm"),  # rocBLAS / Tensile
        ("batched_transpose_16x32_half", "memory"),
        ("SubTensorOpWithScalar1d", "elementwise"),
        ("some_custom_kernel", "other"),
        # collectives in kernels of their own (fields.DEVICE_COLLECTIVE_PATTERN), and names that only look so
        ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*)", "communication"),
        ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)", "communication"),
        ("void deep_ep::internode::combine<true, 8>(int4*, float*)", "communication"),
        ("hcom_allReduce__063_1_1", "communication"),
        ("void small_gather_kernel<float>(float*)", "other"),
    ],
)
def test_a_kernel_name_gets_its_family(name, expected):
    assert family(name) == expected


def test_interval_union_and_intersection_agree_with_a_brute_force_count():
    rng = np.random.default_rng(0)
    grid = np.arange(0, 1100) + 0.5  # unit cells: a cell is covered if its centre is
    for _ in range(50):
        a = rng.uniform(0, 990, 12), rng.uniform(1, 60, 12)
        b = rng.uniform(0, 990, 9), rng.uniform(1, 60, 9)
        sa, sb = np.floor(a[0]), np.floor(b[0])
        ua, ub = interval_union(sa, sa + np.floor(a[1])), interval_union(sb, sb + np.floor(b[1]))
        cov_a = ((grid[:, None] > sa) & (grid[:, None] < sa + np.floor(a[1]))).any(1)
        cov_b = ((grid[:, None] > sb) & (grid[:, None] < sb + np.floor(b[1]))).any(1)
        assert float((ua[1] - ua[0]).sum()) == pytest.approx(cov_a.sum())
        assert np.all(ua[0][1:] > ua[1][:-1])  # disjoint and sorted
        assert overlap_length(ua, ub) == pytest.approx((cov_a & cov_b).sum())


def test_the_resnet_trace_spends_its_gpu_time_in_convolutions():
    """The fp32 ResNet-50 step (tests/data/real-gpu): cuDNN convolution kernels are the largest
    family, batch norm is normalization; the families add up to the step's kernel time."""
    a = cached_analyses(REAL / "resnet50_legacy_2021_1gpu.pt.trace.json.gz")[-1]
    fams = a.kernel_families()
    g = a.graph
    kernels = g.nodes["on_gpu"].astype(bool)
    assert fams[0].family == "convolution" and fams[0].share > 0.5
    assert {"normalization", "elementwise", "gemm"} <= {f.family for f in fams}
    assert sum(f.total_us for f in fams) == pytest.approx(float(g.nodes["dur"][kernels].sum()))
    assert sum(f.share for f in fams) == pytest.approx(1.0)
    assert a.to_dict()["kernel_families"]["scope"] == "gpu"


def test_nccl_overlap_parts_add_up_and_cpu_traces_have_no_kernel_families():
    a = cached_analyses(PUBLIC / "nccl_2rank_rank0.json.gz")[-1]
    (o,) = a.overlap()
    assert o.communication_us > 0 and 0 < o.overlapped_us < o.communication_us
    assert o.exposed_us == pytest.approx(o.communication_us - o.overlapped_us)
    cpu = cached_analyses(SAMPLE)[-1]
    assert cpu.kernel_families() == [] and cpu.to_dict()["kernel_families"]["scope"] == "cpu"
    ranks = {x.rank for x in cpu.overlap()}
    assert ranks == {0, 1}  # the gloo all-reduces of both ranks, against their ops' own time
