"""A GPT-2-shaped training step (Hugging Face `transformers`, random weights) for `advisor optimize`.

The vocabulary of GPT-2 is 50257, an odd number: the LM head GEMM 8192x50257x768 (and its two
backward GEMMs) run far below the padded shape's speed in cuBLAS (issue 35, H200: 5.1 ms vs
1.0 ms padded to 50304). `--pad` is the one-line fix (vocab padded to a multiple of 64);
without it, `advisor optimize` can route those GEMMs to a verified variant with advisor.use.

Steps are marked for the profilers after two warm-up steps: each is a `record_function("step")`
range (the PyTorch profiler) and an NVTX range "step" (Nsight Systems), so `advisor compare`
aligns the two runs on them and leaves warm-up and compilation out.

    python workloads/gpt2_step.py --steps 5                 # on a GPU, under advisor optimize
    python workloads/gpt2_step.py --steps 5 --pad
    python workloads/gpt2_step.py --device cpu --tiny        # smoke run without a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch


def gpt2(vocab: int, tiny: bool):
    """GPT-2 from a config, random weights; where transformers cannot be imported (a torchvision
    that does not match torch breaks its import), model_step.py's decoder at GPT-2's sizes."""
    d, layers, heads = (64, 1, 4) if tiny else (768, 4, 12)
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=vocab, n_positions=64 if tiny else 1024, n_embd=d, n_layer=layers, n_head=heads,
                         attn_implementation="sdpa")
        model = GPT2LMHeadModel(cfg)
        return model, lambda tokens: model(tokens).logits
    except Exception as exc:  # noqa: BLE001 (any import failure: say so, go on)
        print(f"gpt2_step: transformers unavailable ({type(exc).__name__}); using model_step.py's decoder at "
              "GPT-2's sizes", file=sys.stderr)
        from model_step import Model, Size  # beside this script

        model = Model(Size(layers=layers, d_model=d, heads=heads, ffn=4 * d, vocab=vocab))
        return model, model


def build(tiny: bool, pad: bool, device: str, dtype: torch.dtype):
    vocab = 257 if tiny else 50257
    if pad:
        vocab = -(-vocab // 64) * 64  # the one-line fix: 50257 -> 50304
    torch.manual_seed(0)
    model, forward = gpt2(vocab, tiny)
    model = model.to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, seq = (2, 32) if tiny else (8, 1024)
    real_vocab = 257 if tiny else 50257  # tokens and labels stay in the real vocabulary
    tokens = torch.randint(0, real_vocab, (batch, seq), device=device)

    def step():
        logits = forward(tokens)[..., :real_vocab]  # padded columns are never read
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, real_vocab),
                                                 tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def marked(name: str):
    """A step range both profilers see: record_function for Kineto, NVTX for nsys."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.profiler.record_function(name))
    if torch.cuda.is_available():
        stack.enter_context(torch.cuda.nvtx.range(name))
    return stack


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5, help="Marked steps after two warm-up steps.")
    p.add_argument("--pad", action="store_true", help="Pad the vocabulary to a multiple of 64 (50257 -> 50304).")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="A toy size (smoke runs without a GPU).")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpt2_step.py needs a CUDA GPU (or --device cpu --tiny)", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    step = build(args.tiny, args.pad, args.device, dtype)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for _ in range(2):
        step()
    sync()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        with marked("step"):
            loss = step()
            sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    print(f"gpt2 step ({'padded' if args.pad else 'vocab 50257' if not args.tiny else 'tiny'}): "
          f"median {1e3 * times[len(times) // 2]:.2f} ms over {args.steps} steps, loss {loss.item():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
