"""Constants the optimization models use, each with where it comes from.

Every entry is ``{"value": ..., "source": "..."}``. "estimate" in a source means the number is
a modelling choice derived as stated, not a published measurement; tune it here, not in code.
"""

from __future__ import annotations

# AMP (transforms/opts/amp.py): the model's figures beside the GPU table's peaks
# (transforms/hardware.py) and autocast's op lists (transforms/kernel_class.py).
AMP = {
    "reduced_share": {"value": 0.5, "source": "definition: a trace whose matrix kernels spend "
                      "at least half their time in FP16/BF16/FP8 already runs mixed precision "
                      "(autocast leaves the rest FP32 by design); amp does not apply to it"},
    "fixed_percentile": {"value": 10, "source": "definition: a kernel's fixed cost (launch to "
                         "first block, last block to completion) is the trace's own 10th "
                         "percentile kernel duration, what its smallest kernels take; it does "
                         "not shrink with the data type"},
    "byte_ratio": {"value": 0.5, "source": "IEEE 754 binary16/bfloat16 are 2 bytes, binary32 "
                   "4: a bandwidth-bound kernel whose operands autocast makes 16-bit moves "
                   "half the bytes"},
    "achieved_bandwidth": {"value": 0.7, "source": "as GPU_MEMORY achieved: a streaming "
                           "kernel reaches ~70% of the datasheet's memory bandwidth"},
    "cast_bytes_per_param_byte": {"value": 1.5, "source": "a cast reads the 4-byte FP32 weight "
                                  "and writes its 2-byte copy: 6 bytes per 4 parameter bytes "
                                  "(and the same for the gradient's cast back)"},
    "launch_ns": {"value": 5000, "source": "estimate, used only where the trace has no "
                  "cudaLaunchKernel to measure: the host cost of one launch"},
    "sync_ns": {"value": 5000, "source": "estimate, used only where the trace has no blocking "
                "call to measure: a blocking call's own cost after its wait"},
}

# Arithmetic intensity (FLOPs per FP32 byte) of the matrix kernels of real workloads, by
# class: (intensity, share of the class's work time) per log-spaced bin. A matrix kernel whose
# trace records no shapes is scaled by the work-weighted mean of the roofline ratios of these
# intensities on its own device (transforms/opts/amp.py class_ratio). Measured by
# bench/amp_calibration.py on traces with recorded shapes that the AMP accuracy check does not
# judge.
AMP_INTENSITY = {
    "conv": {"value": [(7.5, 0.0549), (13.34, 0.0765), (23.71, 0.1182), (42.17, 0.1097),
                       (74.99, 0.156), (133.35, 0.1954), (237.14, 0.0879), (421.7, 0.1197),
                       (749.89, 0.0532), (1333.52, 0.0285)],
             "source": "bench/amp_calibration.py: the convolutions of "
             "kineto-tb-plugin/resnet50_v100_nw0_run1 (ResNet-50, batch 32, V100, "
             "record_shapes; 750 kernels), work = duration minus the fixed cost; run 2026-12-01, "
             "unchanged 2026-12-04; a calibration trace of bench/manifest.py, judged by no "
             "section since"},
    "gemm": {"value": [(0.42, 0.0007), (2.37, 0.0432), (4.22, 0.1525), (7.5, 0.2592),
                       (13.34, 0.149), (23.71, 0.0067), (42.17, 0.0798), (74.99, 0.0367),
                       (133.35, 0.0855), (237.14, 0.1866)],
             "source": "bench/amp_calibration.py: the GEMMs (addmm, mm, bmm, linear) of "
             "hta/ads_sampled_rank0_of128 and rank1 (record_shapes; 670 kernels), the "
             "calibration traces of bench/manifest.py; run 2026-12-04 (until then from "
             "hta/recsys_a100_rank3_of8, hta/torchrec_a100_rank0_of16 and param/dlrm_8ranks, "
             "which the accuracy sections judge)"},
}

# cuDNN's NCHW<->NHWC transposes around a 16-bit tensor-core convolution whose op records no
# shapes (transforms/opts/amp.py layout_transposes): transposed bytes per peak FLOP of the
# convolution kernel's FP32 work ((duration - fixed cost) x the FP32/TF32 peak), per pass
# (forward; backward: the data- and weight-gradient passes together, one op since PyTorch
# 1.11). A call of F FLOPs at an achieved fraction e of the peak and intensity F / B moves
# passes x B bytes, i.e. passes x e / (F / B) per peak FLOP: the work-weighted figure of the
# convolution calls with recorded shapes of a calibration trace (sum of passes x B over sum of
# peak FLOPs), measured by bench/amp_calibration.py as AMP_INTENSITY is.
AMP_TRANSPOSE = {
    "value": {"forward": 0.009285, "backward": 0.00881},
    "source": "bench/amp_calibration.py: the 636 convolution calls with shapes of "
    "kineto-tb-plugin/resnet50_v100_nw0_run1 (ResNet-50, batch 32 at 224x224, V100, FP32 "
    "NCHW; all 948 of its lowered convolution kernels), peak FLOPs at the V100's 15.7 TFLOPS; "
    "run 2026-12-05. Checked there with the shapes withheld: each half of the layers sized by "
    "the other half's rule -7.2% / +7.8% of its shaped bytes (the stated error), each "
    "iteration by the others' within 0.2%, one call alone 57% median; a calibration trace of "
    "bench/manifest.py, the same network and GPU as the judged AMP check (no shaped FP32 "
    "convolutions of another network are in ../shared)",
}

# Passes over parameter-sized tensors of one optimizer step in torch.optim's for-loop (and
# foreach) form and of its fused kernel (unfused, fused): the derivation above FUSED_OPTIMIZER.
FUSED_OPTIMIZER_PASSES = {
    "adam": {"value": (18, 7), "source": "derivation in the comment of FUSED_OPTIMIZER"},
    "adamw": {"value": (20, 7), "source": "derivation in the comment of FUSED_OPTIMIZER"},
    "sgd": {"value": (8, 5), "source": "derivation in the comment of FUSED_OPTIMIZER "
            "(momentum)"},
    "adagrad": {"value": (11, 5), "source": "derivation in the comment of FUSED_OPTIMIZER"},
}

# Fused optimizers: fused kernel duration = sum(removed kernels) * traffic factor.
# Derivation: count full passes over parameter-sized tensors (each tensor an op reads or
# writes) in torch.optim's for-loop form (torch 2.x, default hyper-parameters: no weight decay
# for Adam/SGD/Adagrad). Adam: exp_avg.lerp_(grad) 3, exp_avg_sq.mul_ 2 + addcmul_(grad, grad)
# 3, denom = sqrt 2 + div 2 + add_(eps) 2, param.addcdiv_(exp_avg, denom) 4 = 18 passes; the
# fused kernel reads p, g, m, v and writes p, m, v = 7 -> 7/18. AdamW adds param.mul_(1 - lr*wd)
# (2) -> 7/20. SGD with momentum: buf.mul_ 2 + buf.add_(grad) 3, param.add_(buf) 3 = 8; fused
# reads p, g, buf and writes p, buf = 5 -> 5/8. Adagrad: state_sum.addcmul_ 3, sqrt 2 + add_ 2,
# param.addcdiv_(grad, std) 4 = 11; fused reads p, g, state_sum, writes p, state_sum = 5 -> 5/11.
FUSED_OPTIMIZER = {
    "adam": {"value": 7 / 18, "source": "estimate from passes over memory (see comment; "
             "torch/optim/adam.py _single_tensor_adam vs _fused_adam)"},
    "adamw": {"value": 7 / 20, "source": "as adam, plus 2 passes of decoupled weight decay "
              "in the unfused form (torch/optim/adamw.py)"},
    "sgd": {"value": 5 / 8, "source": "estimate from passes over memory (see comment; "
            "torch/optim/sgd.py _single_tensor_sgd, momentum)"},
    "adagrad": {"value": 5 / 11, "source": "estimate from passes over memory (see comment)"},
    "fused_cpu_ns": {"value": 30000, "source": "estimate: one optimizer.step() of a fused "
                     "optimizer on the host (Python step + one multi_tensor launch per chunk). "
                     "On the CPU the fused path's Python beyond the for-loop's set-up and "
                     "wrap-up (not broken down: no Python stacks in the traces) measured "
                     "40-70 us per step at 52 tensors in a recording of tests/data/whatif on a "
                     "lightly loaded machine and 140-200 us in the committed one (load "
                     "5.5-6); kept at 30 us, the host cost of the call itself (see the comment "
                     "of FUSED_OPTIMIZER_CPU)"},
    "min_kernel_ns": {"value": 2000, "source": "estimate, as AMP min_kernel_ns"},
}

# Fused optimizers on the CPU (CPU-only traces; transforms/opts/fused_optimizer.py cpu_plan):
# what torch's fused=True path still runs per parameter. torch/optim/adam.py _fused_adam (also
# adamw, adagrad) first does torch._foreach_add_(state_steps, 1): foreach ops have no CPU
# kernel, so it runs one add_ per step tensor, as the for-loop's `step_t += 1` did (measured
# in tests/data/whatif: 560-610 us per step for _foreach_add_ in adam_fused vs 500-700 us for
# the for-loop's step add_ ops in adam_foreach_false). Then one _fused_adam_ op, which loops
# over the tensors in C++ (aten/src/ATen/native/FusedAdam.cpp): the for-loop's Python between
# ops and its per-op dispatch are gone. kept_op: the op of the step-counter increment, found
# as the op that opens a parameter's update (the step's first op, or the op right after the
# previous parameter's last op last_op); kept_foreach: the same in the foreach form.
# The fused op's element-proportional time (transforms/opts/fused_optimizer.py cpu_plan: each
# dropped op's duration above the lower median of its op name, times the traffic factor above)
# predicts 380-410 us per step for _fused_adam_ in tests/data/whatif (measured: 376 us plus 57 us
# of Python before it), 140-190 us for _fused_sgd_ (205), 320-360 for _fused_adagrad_ (277+53).
# With the shortest op as the floor instead, every op's jitter counted as element work and the
# estimate doubled (600-720 us for Adam). Cross-check of the factors on the CPU:
# bench/fused_cpu_factor.py (per-element slope between 4096 and 65536 elements, this 2-vCPU VM)
# gave fused/for-loop 0.29-0.33 for Adam (7/18 = 0.39 here), 0.30-0.36 for AdamW (0.35), and
# 1.0-1.1 for SGD (0.625): on the CPU fused SGD saves dispatch, not per-element work. The pass
# counts are kept for both devices. Not modelled (measured in tests/data/whatif): the fused
# path's own Python before its first op is 130-200 us longer per step at 52 tensors (40-70 us
# in a recording on a quieter machine), and zero_grad after it 30-130 us shorter.
FUSED_OPTIMIZER_CPU = {
    "adam": {"value": {"kept_op": "aten::add_", "last_op": "aten::addcdiv_",
                       "kept_foreach": "aten::_foreach_add_"},
             "source": "torch 2.13 torch/optim/adam.py _single_tensor_adam / _fused_adam"},
    "adamw": {"value": {"kept_op": "aten::add_", "last_op": "aten::addcdiv_",
                        "kept_foreach": "aten::_foreach_add_"},
              "source": "torch 2.13 torch/optim/adamw.py (Adam with decoupled weight decay)"},
    "adagrad": {"value": {"kept_op": "aten::add_", "last_op": "aten::addcdiv_",
                          "kept_foreach": "aten::_foreach_add_"},
                "source": "torch 2.13 torch/optim/adagrad.py _single_tensor_adagrad / "
                          "_fused_adagrad"},
    "sgd": {"value": {"kept_op": None, "last_op": None, "kept_foreach": None},
            "source": "torch 2.13 torch/optim/sgd.py _fused_sgd: no step counter"},
}

DATALOADER = {
    "ipc_ns": {"value": 100000, "source": "estimate: per batch, the main thread still takes "
               "the batch off the worker queue and rebuilds its tensors from shared memory "
               "(~0.1 ms for an image batch)"},
}

CUDA_GRAPHS = {
    "graph_launch_ns": {"value": 10000, "source": "estimate: cudaGraphLaunch host cost ~10 us "
                        "(NVIDIA 'Getting Started with CUDA Graphs' blog: a graph launch costs "
                        "about one kernel launch's host time, independent of its size)"},
    "per_node_ns": {"value": 0, "source": "assumed 0: the replayed kernels' launch latency is "
                    "kept on the launch edges' lags"},
}

FUSION = {
    "min_chain": {"value": 2, "source": "a chain of two or more element-wise kernels"},
}

# Communication links: per-GPU, per-direction bandwidth (GB/s = 1e9 bytes/s) and the latency of
# one step of a collective over the link (ns). Bandwidths are the vendors' peak numbers; what
# NCCL achieves is ``efficiency`` of it (nccl-tests bus bandwidth against the peak).
_NV_NVLINK = ("NVIDIA NVLink product page and the GPU datasheets (P100/V100/A100/H100/B200): "
              "total NVLink bandwidth per GPU, both directions; half of it per direction")
_NCCL_TESTS = ("NVIDIA nccl-tests doc/PERFORMANCE.md (bus bandwidth: what a collective moves "
               "per rank over the slowest link, comparable to the link's peak)")
COMM_LINK = {
    "nvlink1": {"value": {"gbps": 80.0, "latency_ns": 3000}, "source": _NV_NVLINK +
                ": P100 160 GB/s"},
    "nvlink2": {"value": {"gbps": 150.0, "latency_ns": 3000}, "source": _NV_NVLINK +
                ": V100 300 GB/s"},
    "nvlink3": {"value": {"gbps": 300.0, "latency_ns": 3000}, "source": _NV_NVLINK +
                ": A100 600 GB/s"},
    "nvlink4": {"value": {"gbps": 450.0, "latency_ns": 3000}, "source": _NV_NVLINK +
                ": H100 900 GB/s"},
    "nvlink5": {"value": {"gbps": 900.0, "latency_ns": 3000}, "source": _NV_NVLINK +
                ": B200 1.8 TB/s"},
    "pcie3": {"value": {"gbps": 15.75, "latency_ns": 5000}, "source": "PCI-SIG: PCIe 3.0 x16, "
              "8 GT/s x 16 lanes, 128b/130b encoding = 15.75 GB/s per direction"},
    "pcie4": {"value": {"gbps": 31.5, "latency_ns": 5000}, "source": "PCI-SIG: PCIe 4.0 x16 "
              "= 31.5 GB/s per direction"},
    "pcie5": {"value": {"gbps": 63.0, "latency_ns": 5000}, "source": "PCI-SIG: PCIe 5.0 x16 "
              "= 63 GB/s per direction"},
    "ib_edr": {"value": {"gbps": 12.5, "latency_ns": 8000}, "source": "InfiniBand Trade "
               "Association roadmap: EDR 100 Gb/s per port"},
    "ib_hdr": {"value": {"gbps": 25.0, "latency_ns": 8000}, "source": "IBTA roadmap: HDR "
               "200 Gb/s per port"},
    "ib_ndr": {"value": {"gbps": 50.0, "latency_ns": 8000}, "source": "IBTA roadmap: NDR "
               "400 Gb/s per port"},
    "eth10": {"value": {"gbps": 1.25, "latency_ns": 30000}, "source": "IEEE 802.3: 10 GbE"},
    "eth25": {"value": {"gbps": 3.125, "latency_ns": 30000}, "source": "IEEE 802.3by: 25 GbE"},
    "eth100": {"value": {"gbps": 12.5, "latency_ns": 20000}, "source": "IEEE 802.3: 100 GbE"},
    "efficiency": {"value": 0.8, "source": "estimate from " + _NCCL_TESTS + ": all-reduce "
                   "bus bandwidth reaches ~75-85% of the link peak for large messages"},
    "latency_note": {"value": None, "source": "latency_ns per step: estimate, NCCL LL/LL128 "
                     "protocol step latency of a few us inside a node (NVLink, PCIe) and "
                     "~5-10 us across InfiniBand; tens of us over TCP (Ethernet); fitted from "
                     "the trace's own collectives where their sizes are known"},
}

def _log2(n: int) -> int:
    return max(int(n - 1).bit_length(), 0)


# Collective cost (alpha-beta model): (steps(n), wire_factor(n)) per algorithm and collective;
# time = steps(n) * latency + wire_factor(n) * bytes / bw,
# bytes = the message each rank holds (the gathered size for all_gather), n = ranks.
# Source: Thakur, Rabenseifner, Gropp, "Optimization of Collective Communication Operations in
# MPICH", IJHPCA 19(1), 2005 (ring/pairwise/binomial-tree costs); NCCL's bus-bandwidth factors
# in nccl-tests doc/PERFORMANCE.md (all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n,
# broadcast and reduce 1). ``tree`` all-reduce is NCCL's double binary tree: log2(n) steps up
# and down, the whole message each way.
COLLECTIVE = {
    "ring": {"value": {
        "all_reduce": (lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n),
        "reduce_scatter": (lambda n: n - 1, lambda n: (n - 1) / n),
        "all_gather": (lambda n: n - 1, lambda n: (n - 1) / n),
        "all_to_all": (lambda n: n - 1, lambda n: (n - 1) / n),
        "broadcast": (lambda n: n - 1, lambda n: 1.0),
        "reduce": (lambda n: n - 1, lambda n: 1.0),
        "send_recv": (lambda n: 1, lambda n: 1.0),
    }, "source": "Thakur et al. 2005 (ring and pairwise exchange); nccl-tests PERFORMANCE.md"},
    "tree": {"value": {
        "all_reduce": (lambda n: 2 * _log2(n), lambda n: 2.0),
        "broadcast": (lambda n: _log2(n), lambda n: 1.0),
        "reduce": (lambda n: _log2(n), lambda n: 1.0),
    }, "source": "Thakur et al. 2005 (binomial tree); NCCL 2.4 double binary tree blog "
                 "(developer.nvidia.com/blog/massively-scale-deep-learning-training-nccl-2-4)"},
}

DISTRIBUTED = {
    "bucket_mb": {"value": 25, "source": "PyTorch DistributedDataParallel bucket_cap_mb "
                  "default (pytorch.org/docs/stable/generated/"
                  "torch.nn.parallel.DistributedDataParallel.html)"},
    "first_bucket_mb": {"value": 1, "source": "PyTorch DDP: the first bucket is capped at 1 MB "
                        "(dist._DEFAULT_FIRST_BUCKET_BYTES) so communication starts early"},
    "grad_bytes_per_param": {"value": 4, "source": "FP32 gradients (DDP all-reduces the .grad "
                             "tensors in the parameters' dtype)"},
    "dgc_select_frac": {"value": 0.25, "source": "estimate: top-k selection by sampling, as in "
                        "Lin et al., 'Deep Gradient Compression', ICLR 2018, sec. 3 (sampled "
                        "threshold): about a quarter of one pass of an optimizer step over the "
                        "gradients"},
    "dgc_min_kernel_ns": {"value": 5000, "source": "estimate: one small selection kernel"},
    "qsgd_min_kernel_ns": {"value": 5000, "source": "estimate, as dgc_min_kernel_ns: the "
                           "least one quantize or dequantize kernel takes (a launch and one "
                           "small element-wise pass)"},
    "p3_slice_kb": {"value": 200, "source": "Jayarajan et al., 'Priority-based Parameter "
                    "Propagation for Distributed DNN Training', MLSys 2019: slices of 50,000 "
                    "parameters (200 KB of FP32) in their evaluation"},
    "launch_ns": {"value": 5000, "source": "estimate, used only where the trace has no "
                  "cudaLaunchKernel to measure: the host cost of launching a collective or "
                  "kernel a distributed what-if inserts"},
    "p3_max_slices": {"value": 64, "source": "estimate: a bound on a collective's slices so "
                      "that a transform never multiplies the graph's collectives without limit "
                      "(a 25 MB DDP bucket at 200 KB would be 125)"},
    "p3_max_overhead": {"value": 0.05, "source": "estimate: slicing stops where the latency the "
                        "extra slices add (one collective latency each, transforms.comm) would "
                        "exceed 5% of the collective's transfer: P3's slices pay for themselves "
                        "by overlap, which a slice's latency eats"},
}

# What a kernel a model inserts to stream over gradients reaches of the GPU's memory bandwidth
# (the figure itself is the GPU's own: transforms.hardware, memory_gbps).
GPU_MEMORY = {
    "achieved": {"value": 0.7, "source": "estimate: a streaming kernel reaches ~70% of peak "
                 "memory bandwidth (STREAM-like kernels on V100/A100)"},
}

# The profiler's own CPU cost (transforms/profiler.py), per event it records.
PROFILER = {
    "per_op_ns": {"value": 1780, "source": "bench/profiler_overhead.py on the CPU pairs of "
                  "tests/data/whatif (torch 2.13 CPU profiler, a shared 2-vCPU VM): (profiled "
                  "minus unprofiled step) / recorded ops per step, median of 12 variants "
                  "(1.39-3.26 us; one data-loader variant -1.70, noise); run 2026-12-01. A "
                  "server CPU runs the same callbacks faster: this is an upper estimate there"},
    "per_call_ns": {"value": 0, "source": "not fitted: the CPU pairs trace no CUDA runtime "
                    "calls, and no shared trace records the profiler's own overhead (the "
                    "Nsight export's CUPTI_ACTIVITY_KIND_OVERHEAD rows are 'command buffer "
                    "full' waits, a CUDA cost); CUPTI's per-record cost is left out until GPU "
                    "pairs with unprofiled step times (bench/gpu_pairs.py) fit it"},
    "min_host_share": {"value": 0.1, "source": "estimate: a thread's host time in an iteration "
                       "is never cut below a tenth of itself (the estimate is a median over "
                       "other machines; a thread whose host time it exceeds is mostly not "
                       "profiler time)"},
}

# gpu(NAME) between devices that both have an entry here (transforms/opts/gpu.py): per kernel
# group (memory: element-wise, normalization, reduction, copies; matrix: GEMMs and
# convolutions; attention: fused attention kernels), the fraction of the datasheet peak
# (transforms/hardware.py) that the vendor's library achieves in a published microbenchmark,
# and the fixed launch-to-finish cost of a kernel of that group. A kernel's time on a device is
# its fixed cost plus its work at the achieved rate. Fractions come from published
# measurements; the fixed costs of the memory and matrix groups are calibrated on shared traces
# that no GPU-model case judges (bench/calibrate_gpu_fixed.py), never on the tracelens pairs.
_AZURE = ("Azure AI-benchmarking-guide, Azure_Results/{f} (as forked in "
          "samuel-bohman/AI-benchmarking-guide @{c}), {t}")
_MAMF = ("stas00/ml-engineering, compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS "
         "comparison table' (BF16 matmul, brute-force shape search with mamf-finder.py): {r}")
_FIXED_CAL = ("bench/calibrate_gpu_fixed.py: 10th percentile of the {g} kernel durations of "
              "{t} (not judged by any GPU-model case), run 2026-12-04")
GPU_ACHIEVED = {
    "h100-sxm": {
        "memory_fraction": {"value": 2970 / 3350, "source": _AZURE.format(
            f="ND_H100_v5_results.md", c="26d18e9", t="'HBM Bandwidth' Triad 2.97 TB/s on an "
            "H100 80GB HBM3, of the datasheet's 3.35 TB/s")},
        "matrix_fraction": {"value": 792.1 / 989, "source": _MAMF.format(
            r="NVIDIA H100 SXM 792.1 of 989 TFLOPS (80.1%), CUDA 12.1")},
        "attention_fraction": {"value": 327.9 / 989.4, "source": _AZURE.format(
            f="ND_H100_v5_results.md", c="26d18e9", t="'Flash Attention 2.0' 327.9 TFLOPS "
            "(head dim 128, batch 2, sequence 8192), of the 989.4 dense BF16/FP16 peak")},
        "memory_fixed_ns": {"value": 1312, "source": _FIXED_CAL.format(
            g="2802 memory-class", t="nsys/fsdp_t5_2xh100_1s (H100 SXM, FSDP T5)")},
        "matrix_fixed_ns": {"value": 4797, "source": _FIXED_CAL.format(
            g="640 GEMM", t="nsys/fsdp_t5_2xh100_1s (H100 SXM, FSDP T5)")},
        "attention_fixed_ns": {"value": 4797, "source": "assumed equal to matrix_fixed_ns: "
                               "FlashAttention-2 is a CUTLASS kernel, launched and drained "
                               "like a GEMM; no published H100 floor was found and no "
                               "calibration trace runs fused attention on an H100"},
    },
    "mi300x": {
        "memory_fraction": {"value": 4090 / 5300, "source": _AZURE.format(
            f="ND_MI300X_v5_results.md", c="3de0c29", t="'HBM Bandwidth' Triad 4.09 TB/s, of "
            "the datasheet's 5.3 TB/s")},
        "matrix_fraction": {"value": 781.9 / 1300, "source": _MAMF.format(
            r="AMD MI300X 781.9 of 1300 TFLOPS (60.1%), ROCm 6.2 (hipBLASLt)")},
        "attention_fraction": {"value": 328.6 / 1307.4, "source": _AZURE.format(
            f="ND_MI300X_v5_results.md", c="3de0c29", t="'Flash Attention 2.0' 328.6 TFLOPS "
            "(head dim 64, batch 2, sequence 8192), of the 1307.4 dense BF16/FP16 peak")},
        "memory_fixed_ns": {"value": 2119, "source": _FIXED_CAL.format(
            g="2653 memory-class", t="tracelens/resnet_actckpt_mi300x_rank0_of8 (MI300X, "
            "ResNet DDP training)")},
        "matrix_fixed_ns": {"value": 6615, "source": _FIXED_CAL.format(
            g="325 GEMM and convolution", t="tracelens/resnet_actckpt_mi300x_rank0_of8 "
            "(MI300X, ResNet DDP training)")},
        "attention_fixed_ns": {"value": 24700, "source": "meta-pytorch/tritonbench pull "
                               "request #612 (2025-11-01), 'run.py --op flash_attention' on "
                               "an MI300: triton_tutorial_flash_v2 forward latency 0.024714 ms "
                               "at (batch 4, heads 48, sequence 128, head dim 64), the "
                               "smallest shape: a Triton-compiled attention forward's floor "
                               "(PyTorch's ROCm SDPA runs AOTriton's Triton-compiled attn_fwd)"},
    },
}
