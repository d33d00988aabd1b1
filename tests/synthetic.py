"""Build small `Trace` objects by hand for symptom tests (numbers worked out in each test)."""

from __future__ import annotations

import pandas as pd

from advisor.devices import complete_devices
from advisor.model import Trace

H100 = {
    "rank": 0,
    "device_id": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "vendor": "nvidia",
    "arch": "9.0",
    "cc_major": 9,
    "cc_minor": 0,
    "sm_count": 132,
    "sm_count_source": "trace",
    "warp_size": 32,
    "max_warps_per_sm": 64,
    "max_blocks_per_sm": 32,
    "regs_per_sm": 65536,
    "smem_per_sm_bytes": 233472,
    "mem_bandwidth_bytes_per_s": 4.8e12,
    "peak_tensor_tflops": 989.0,
}


def kernel(start, dur, name="matmul_kernel", grid=(1, 1, 1), block=(256, 1, 1), regs=128, smem=0, stream=7, corr=None, rank=0, device=0):
    return {
        "rank": rank,
        "device_id": device,
        "stream_id": stream,
        "correlation_id": corr,
        "start_ns": start,
        "end_ns": start + dur,
        "dur_ns": dur,
        "name": name,
        "grid_x": grid[0],
        "grid_y": grid[1],
        "grid_z": grid[2],
        "block_x": block[0],
        "block_y": block[1],
        "block_z": block[2],
        "grid_blocks": grid[0] * grid[1] * grid[2],
        "block_threads": block[0] * block[1] * block[2],
        "registers_per_thread": regs,
        "static_smem_bytes": 0,
        "dynamic_smem_bytes": smem,
    }


def back_to_back(n, dur, gap, start=0, **kw):
    """n kernels of `dur` ns separated by `gap` ns on one stream."""
    return [kernel(start + i * (dur + gap), dur, **kw) for i in range(n)]


def launch(corr, start, dur=2000, thread=1, rank=0, name="cudaLaunchKernel"):
    return {"rank": rank, "thread_id": thread, "correlation_id": corr, "start_ns": start, "end_ns": start + dur, "dur_ns": dur, "name": name}


def nvtx(text, start, end, thread=1, rank=0):
    return {"rank": rank, "thread_id": thread, "start_ns": start, "end_ns": end, "dur_ns": end - start, "text": text, "domain": None}


def make_trace(kernels, devices=(H100,), runtime=(), ranges=(), cpu_ops=(), memcpy=(), complete=True) -> Trace:
    t = Trace.build(
        meta={"format": "synthetic", "sources": ["synthetic"]},
        kernels=pd.DataFrame(list(kernels)),
        devices=pd.DataFrame(list(devices)),
        runtime=pd.DataFrame(list(runtime)),
        nvtx=pd.DataFrame(list(ranges)),
        cpu_ops=pd.DataFrame(list(cpu_ops)),
        memcpy=pd.DataFrame(list(memcpy)),
    )
    return complete_devices(t) if complete else t
