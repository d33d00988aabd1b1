"""Unplanted workloads: one training step and one short decode of a small GPT-style model.

The planted scenarios (planted.py) each hold one known symptom. These hold none on purpose:
they are the traces users bring, full of cuBLAS (nvjet) GEMMs in both layouts, attention,
layer norms, elementwise and optimizer kernels, so that the diagnosis can be checked for
what it says about work nobody arranged for it (and for what it must not say).

    train    one step of a 4-layer decoder (d_model 1024, 16 heads, FFN 4096, vocab 32768),
             batch 8 x 1024 tokens, bf16 weights, AdamW: GEMMs of 8192 rows in forward and
             backward (transposed operands), flash attention, a fused optimizer step
    decode   the same model generating 32 tokens one at a time for 4 sequences after a
             128-token prompt, with a KV cache: M=4 GEMMs and hundreds of microsecond
             kernels launched from Python (launch-bound, as eager decoding is)
    train_compiled
             `train` with the model under torch.compile(mode="max-autotune-no-cudagraphs"):
             Inductor's Triton kernels (triton_poi_/triton_red_/triton_per_ fusions, and
             triton_tem_ GEMM templates where autotuning picks them over cuBLAS)

Profilers (the profiled part only, after a warm-up run):
    --profiler nsys    under `nsys profile --capture-range=cudaProfilerApi ...`; the part runs
                       inside torch.autograd.profiler.emit_nvtx(record_shapes=True), so the
                       GEMM shapes reach the trace as aten NVTX ranges
    --profiler kineto  torch.profiler with record_shapes, written to --out as .json.gz

    python3 workloads/model_step.py train --profiler kineto --out out/models
    bash workloads/capture_models.sh out/models     # both profilers, both scenarios
    python3 workloads/model_step.py train --device cpu --tiny   # a smoke run without a GPU
    python3 workloads/model_step.py decode --time    # eager against one CUDA-graph replay

--time checks the remedy diagnose gives for eager decoding (capture the loop in a CUDA
graph): it times the 32-token generation eagerly and as one replay of a graph captured from
it (CUDA events, median of 20 after warm-up), after checking both produce the same tokens.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kineto_out import export_gz  # beside this script


@dataclass(frozen=True)
class Size:
    layers: int = 4
    d_model: int = 1024
    heads: int = 16
    ffn: int = 4096
    vocab: int = 32768
    batch: int = 8  # train
    seq: int = 1024  # train
    decode_batch: int = 4
    prompt: int = 128
    new_tokens: int = 32


TINY = Size(layers=2, d_model=64, heads=4, ffn=128, vocab=256, batch=2, seq=32, decode_batch=2, prompt=8,
            new_tokens=4)


class Block(nn.Module):
    def __init__(self, s: Size):
        super().__init__()
        self.heads = s.heads
        self.ln1, self.ln2 = nn.LayerNorm(s.d_model), nn.LayerNorm(s.d_model)
        self.qkv = nn.Linear(s.d_model, 3 * s.d_model, bias=False)
        self.proj = nn.Linear(s.d_model, s.d_model, bias=False)
        self.up = nn.Linear(s.d_model, s.ffn, bias=False)
        self.down = nn.Linear(s.ffn, s.d_model, bias=False)

    def forward(self, x, cache=None, pos: int = 0):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # decoding: write this step's keys and values, attend to all so far
            k_cache, v_cache = cache
            k_cache[:, :, pos:pos + T] = k
            v_cache[:, :, pos:pos + T] = v
            k, v = k_cache[:, :, :pos + T], v_cache[:, :, :pos + T]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Model(nn.Module):
    def __init__(self, s: Size):
        super().__init__()
        self.size = s
        self.embed = nn.Embedding(s.vocab, s.d_model)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.ln = nn.LayerNorm(s.d_model)
        self.head = nn.Linear(s.d_model, s.vocab, bias=False)

    def forward(self, tokens, caches=None, pos: int = 0):
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i], pos)
        return self.head(self.ln(x))


def train(s: Size, device: str, dtype: torch.dtype, compiled: bool = False):
    torch.manual_seed(0)
    model = Model(s).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, s.vocab, (s.batch, s.seq + 1), device=device)
    if compiled:
        model = torch.compile(model, mode="max-autotune-no-cudagraphs")

    def step():
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, s.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def decode(s: Size, device: str, dtype: torch.dtype):
    torch.manual_seed(0)
    model = Model(s).to(device=device, dtype=dtype).eval()
    prompt = torch.randint(0, s.vocab, (s.decode_batch, s.prompt), device=device)
    total = s.prompt + s.new_tokens
    shape = (s.decode_batch, s.heads, total, s.d_model // s.heads)
    caches = [(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype))
              for _ in range(s.layers)]

    @torch.no_grad()
    def generate():
        logits = model(prompt, caches, 0)
        out = [logits[:, -1].argmax(-1, keepdim=True)]
        for i in range(s.new_tokens - 1):
            logits = model(out[-1], caches, s.prompt + i)
            out.append(logits[:, -1].argmax(-1, keepdim=True))
        return torch.cat(out, dim=1)

    return generate


def train_compiled(s: Size, device: str, dtype: torch.dtype):
    return train(s, device, dtype, compiled=True)


SCENARIOS = {"train": train, "decode": decode, "train_compiled": train_compiled}


def time_eager_and_graph(run, reps: int = 20) -> dict:
    """Median ms of `run()` eagerly and as one replay of a CUDA graph captured from it; the
    graph's output must equal the eager one (the same tokens)."""
    import statistics

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants
        for _ in range(3):
            want = run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = run()
    graph.replay()
    torch.cuda.synchronize()
    if not torch.equal(got, want):
        raise SystemExit("the graph replay's output differs from the eager run's")

    def ms(fn) -> float:
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)

    return {"eager_ms": ms(run), "graph_ms": ms(graph.replay)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--profiler", choices=["nsys", "kineto", "none"], default="none")
    p.add_argument("--out", type=Path, default=Path("out/models"), help="Directory for Kineto traces.")
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke run with --tiny.")
    p.add_argument("--tiny", action="store_true", help="A toy size (smoke runs without a GPU).")
    p.add_argument("--time", action="store_true", help="decode: time it eagerly and as one CUDA-graph replay.")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("model_step.py needs a CUDA GPU (or --device cpu --tiny)", file=sys.stderr)
        return 2
    s = TINY if args.tiny else Size()
    run = SCENARIOS[args.scenario](s, args.device, torch.bfloat16 if args.device == "cuda" else torch.float32)
    if args.time:
        if args.scenario != "decode" or args.device != "cuda":
            print("--time takes the decode scenario on a CUDA GPU", file=sys.stderr)
            return 2
        t = time_eager_and_graph(run)
        print(f"decode {s.new_tokens} tokens x {s.decode_batch} sequences on {torch.cuda.get_device_name()}: "
              f"eager {t['eager_ms']:.2f} ms, one CUDA-graph replay {t['graph_ms']:.2f} ms "
              f"({t['eager_ms'] / t['graph_ms']:.1f}x)")
        return 0
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    run()  # warm-up: cuBLAS heuristics, allocator, optimizer state
    run()
    sync()
    if args.profiler == "nsys":
        torch.cuda.cudart().cudaProfilerStart()
        with torch.autograd.profiler.emit_nvtx(record_shapes=True):
            run()
            sync()
        torch.cuda.cudart().cudaProfilerStop()
    elif args.profiler == "kineto":
        from torch.profiler import ProfilerActivity, profile

        args.out.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=activities, record_shapes=True) as prof:
            run()
            sync()
        export_gz(prof, args.out / f"model_{args.scenario}.kineto.json")
    else:
        run()
        sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
