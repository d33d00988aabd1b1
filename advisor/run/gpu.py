"""The GPU this process runs on: whether there is one, and the model's view of it.

The --run loops (advisor.run.loop, advisor.run.group_loop, advisor.run.attn_loop) ask here, through the
module (`gpu.gpu_present()`), so a test replaces the GPU in one place:
`monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: True)`.
"""

from __future__ import annotations

import math

from ..codegen.schedule_model import Device


def gpu_present() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def device_spec() -> tuple[Device, dict]:
    """The model's view of the current GPU, and the TUNED_FOR record of a variant."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    from ..devices import lookup_gpu

    known = lookup_gpu(props.name)
    peak = known[1][5] if known and not math.isnan(known[1][5]) else 989.0
    bw = known[1][4] if known else 3.35e12
    dev = Device(name=props.name, sm_count=props.multi_processor_count, peak_tflops=peak, bandwidth_bytes_per_s=bw,
                 compute_capability=f"{props.major}.{props.minor}")
    tuned = {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "smem_per_block_bytes": getattr(props, "shared_memory_per_block_optin", None),
    }
    return dev, tuned
