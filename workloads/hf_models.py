"""Real third-party models, profiled: each scenario one training step or forward of a model we
did not write (Hugging Face `transformers` built from a config with random weights, torchvision
and timm CNNs with no pretrained weights, `peft` LoRA), and most of them in pairs: a "before"
as users write it and an "after" with the one-line fix. The traces are what advisor must read
right (issues 32, 36, 39); the timed pairs are the measured gain of each fix.

Group A, the Tier 1-3 levers (pair: before -> after, the fix):
    gpt2_train -> gpt2_train_padded            GPT-2 (4 layers, n_embd 768), 8 x 1024 tokens, bf16,
                                               AdamW: vocab 50257 -> 50304 (misaligned LM head)
    resnet50_train -> resnet50_train_cl        torchvision ResNet-50, bf16, batch 64 at 224, SGD:
    efficientnet_b0_train -> ..._cl            timm EfficientNet-B0, batch 128: NCHW -> channels_last
    lora_llama_train -> lora_llama_train_bf16  Llama (hidden 1024, 4 layers, GQA 16/4, vocab 32000,
    lora_qwen2_train -> lora_qwen2_train_bf16  bf16) and Qwen2 (0.5B-shaped, 4 layers) with LoRA
                                               r=16 on q/k/v/o/gate/up/down: peft's default fp32
                                               adapters -> get_peft_model(..., autocast_adapter_dtype=False)
    bert_fp32_train -> bert_fp32_train_tf32    BERT (4 layers, hidden 1024) sequence classification,
                    -> bert_fp32_train_bf16    16 x 512 tokens, fp32 (PyTorch's default precision):
                                               set_float32_matmul_precision("high"), or bf16 autocast
Group B, schedules and healthy controls:
    sdpa_decode_flash, sdpa_decode_cudnn       decode attention (q length 1, 32 query / 8 KV heads,
                                               head_dim 128) at batch 1 and 4, context 8k and 32k,
                                               SDPA forced to one backend
    llama_decode -> llama_decode_static        HF Llama (hidden 4096, 4 layers, GQA 32/8) greedy,
                                               16 tokens after an 8k prompt: dynamic -> static cache
    moe_forward                                HF Mixtral (2 layers, 8 experts, top-2) forward
    llama_prefill                              control: 8 x 2048 tokens bf16 forward
Group C, compiled (slow to start: each process compiles):
    gpt2_train_compiled                        control: gpt2_train_padded under torch.compile
    llama_decode_static_compiled               llama_decode_static with transformers' automatic
                                               torch.compile (reduce-overhead: CUDA graphs)

Each scenario warms up (--warmup steps, compilation included), then, with --time, runs --reps
CUDA-synchronized steps and appends one JSON line to OUT/timings.jsonl; then profiles --steps
steps: under nsys (`--capture-range=cudaProfilerApi`) between cudaProfilerStart/Stop inside
emit_nvtx(record_shapes=True), or with torch.profiler (record_shapes) into
OUT/hf_NAME.kineto.json.gz. Every profiled window is inside an NVTX range / record_function
"hf_scenario NAME", so the nsys exports can be named after the fact (--label-nsys). Facts of
each scenario (pair, role, fix, sizes, adapter dtypes, versions) go to OUT/hf_NAME.meta.json.

    python3 workloads/hf_models.py A --time --out out/hf           # time group A, no profiler
    python3 workloads/hf_models.py gpt2_train --profiler kineto --out out/hf
    bash workloads/capture_hf.sh A OUTDIR                          # all of it -> OUTDIR/hf_A.tar.gz
    python3 workloads/hf_models.py A B --device cpu --tiny         # smoke run without a GPU

transformers, timm (with torchvision) and peft are imported only by the scenarios that use them.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import gzip
import json
import shutil
import sqlite3
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from kineto_out import export_gz  # beside this script


@dataclass(frozen=True)
class Ctx:
    device: str
    tiny: bool

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


@dataclass
class Built:
    step: Callable[[], object]
    info: dict = field(default_factory=dict)  # facts for the sidecar (sizes, dtypes, backends)
    parts: dict = field(default_factory=dict)  # name -> callable, timed one by one with --time


@dataclass(frozen=True)
class Scenario:
    name: str
    group: str
    pair: str  # the family of one before and its afters
    role: str  # before | after | control
    fix: str  # the one line that turns the pair's before into this one ("" for before/control)
    what: str
    build: Callable[[Ctx], Built]


def _on(ctx: Ctx):
    """Build modules straight on the target device (random init on the GPU is fast); each build
    still moves the model there after, in case a library built it elsewhere."""
    return torch.device(ctx.device)


def _tokens(ctx: Ctx, vocab: int, batch: int, seq: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(0)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(ctx.device)


def _train_step(model, opt, **batch):
    def step():
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def _versions() -> dict:
    out = {"torch": torch.__version__}
    for mod in ("transformers", "timm", "peft", "torchvision"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", "?")
    return out


# --- group A ------------------------------------------------------------------------------------

def gpt2_train(ctx: Ctx, vocab: int = 50257, compiled: bool = False) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, d, heads, batch, seq = (2, 64, 4, 2, 32) if ctx.tiny else (4, 768, 12, 8, 1024)
    cfg = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=d, n_layer=layers, n_head=heads)
    with _on(ctx):
        model = GPT2LMHeadModel(cfg)
    model = model.to(ctx.device, torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = _tokens(ctx, 50257, batch, seq)  # the real tokenizer's ids whatever the padding
    run = torch.compile(model) if compiled else model
    return Built(_train_step(run, opt, input_ids=tokens, labels=tokens),
                 {"vocab_size": vocab, "layers": layers, "n_embd": d, "batch": batch, "seq": seq,
                  "dtype": "bfloat16", "optimizer": "AdamW", "compiled": compiled})


def _cnn(ctx: Ctx, make, batch: int, channels_last: bool) -> Built:
    res = 32 if ctx.tiny else 224
    batch = 2 if ctx.tiny else batch
    dtype = torch.bfloat16 if ctx.cuda else torch.float32  # bf16 convolutions crawl on the CPU
    with _on(ctx):
        model = make()
    model = model.to(ctx.device, dtype).train()
    x = torch.randn(batch, 3, res, res, device=ctx.device, dtype=dtype)
    y = torch.randint(0, 1000, (batch,), device=ctx.device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step():
        loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return Built(step, {"batch": batch, "resolution": res, "dtype": str(dtype).removeprefix("torch."), "optimizer": "SGD",
                        "memory_format": "channels_last" if channels_last else "contiguous (NCHW)"})


def resnet50_train(ctx: Ctx, channels_last: bool = False) -> Built:
    import torchvision

    b = _cnn(ctx, lambda: torchvision.models.resnet50(weights=None), 64, channels_last)
    b.info["model"] = "torchvision resnet50"
    return b


def efficientnet_train(ctx: Ctx, channels_last: bool = False) -> Built:
    import timm

    b = _cnn(ctx, lambda: timm.create_model("efficientnet_b0", pretrained=False), 128, channels_last)
    b.info["model"] = "timm efficientnet_b0"
    return b


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _lora(ctx: Ctx, model, batch: int, seq: int, vocab: int, bf16_adapters: bool) -> Built:
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    # peft's default (autocast_adapter_dtype=True) upcasts bf16/fp16 adapters to fp32; the fix keeps
    # them in the base model's dtype
    pm = get_peft_model(model, cfg, **({"autocast_adapter_dtype": False} if bf16_adapters else {}))
    trainable = [p for p in pm.parameters() if p.requires_grad]
    dtypes = {p.dtype for p in trainable}
    if dtypes != {torch.bfloat16 if bf16_adapters else torch.float32}:  # the pair would measure nothing
        print(f"WARNING: this peft made {sorted(map(str, dtypes))} adapters", file=sys.stderr)
    opt = torch.optim.AdamW(trainable, lr=1e-4)
    tokens = _tokens(ctx, vocab, batch, seq)
    pm.train()
    return Built(_train_step(pm, opt, input_ids=tokens, labels=tokens),
                 {"batch": batch, "seq": seq, "base_dtype": "bfloat16", "lora_r": 16, "lora_targets": LORA_TARGETS,
                  "adapter_dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in trainable}),
                  "trainable_params": sum(p.numel() for p in trainable),
                  "autocast_adapter_dtype": not bf16_adapters})


def lora_llama_train(ctx: Ctx, bf16_adapters: bool = False) -> Built:
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv, inter, batch, seq = (
        (64, 2, 4, 2, 128, 2, 32) if ctx.tiny else (1024, 4, 16, 4, 2816, 8, 1024))
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=32000, max_position_embeddings=seq)
    with _on(ctx):
        model = LlamaForCausalLM(cfg)
    b = _lora(ctx, model.to(ctx.device, torch.bfloat16), batch, seq, 32000, bf16_adapters)
    b.info.update(model="transformers LlamaForCausalLM", hidden=hidden, layers=layers, heads=heads, kv_heads=kv)
    return b


def lora_qwen2_train(ctx: Ctx, bf16_adapters: bool = False) -> Built:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    # Qwen2-0.5B's widths (hidden 896, 14/2 heads, FFN 4864, vocab 151936, tied embeddings), 4 layers
    hidden, layers, heads, kv, inter, batch, seq, vocab = (
        (64, 2, 4, 2, 128, 2, 32, 1024) if ctx.tiny else (896, 4, 14, 2, 4864, 8, 1024, 151936))
    cfg = Qwen2Config(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=seq, tie_word_embeddings=True)
    with _on(ctx):
        model = Qwen2ForCausalLM(cfg)
    b = _lora(ctx, model.to(ctx.device, torch.bfloat16), batch, seq, vocab, bf16_adapters)
    b.info.update(model="transformers Qwen2ForCausalLM", hidden=hidden, layers=layers, heads=heads, kv_heads=kv)
    return b


def bert_fp32_train(ctx: Ctx, precision: str = "fp32") -> Built:
    from transformers import BertConfig, BertForSequenceClassification

    hidden, layers, heads, inter, batch, seq = (64, 2, 4, 128, 2, 32) if ctx.tiny else (1024, 4, 16, 4096, 16, 512)
    cfg = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=inter,
                     max_position_embeddings=max(512, seq), num_labels=2)
    with _on(ctx):
        model = BertForSequenceClassification(cfg)
    model = model.to(ctx.device).train()  # fp32 weights: PyTorch's default
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = _tokens(ctx, cfg.vocab_size, batch, seq)
    labels = torch.randint(0, 2, (batch,), device=ctx.device)
    if precision == "tf32":
        torch.set_float32_matmul_precision("high")  # reset to "highest" before every scenario
    autocast = torch.autocast(device_type="cuda" if ctx.cuda else "cpu", dtype=torch.bfloat16,
                              enabled=precision == "bf16")

    def step():  # autocast around the forward only, as the AMP recipe has it
        with autocast:
            loss = model(input_ids=tokens, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return Built(step, {"model": "transformers BertForSequenceClassification", "hidden": hidden, "layers": layers,
                        "batch": batch, "seq": seq, "weights": "float32", "precision": precision,
                        "float32_matmul_precision": torch.get_float32_matmul_precision()})


# --- group B ------------------------------------------------------------------------------------

def sdpa_decode(ctx: Ctx, backend: str) -> Built:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    hq, hkv, d = (4, 2, 16) if ctx.tiny else (32, 8, 128)
    shapes = [(1, 64), (2, 128)] if ctx.tiny else [(b, s) for b in (1, 4) for s in (8192, 32768)]
    want = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    used = backend
    if not ctx.cuda and backend == "cudnn":  # no cuDNN on the CPU: the smoke run takes the math path
        want, used = SDPBackend.MATH, "math (cpu)"
    g = torch.Generator(device="cpu").manual_seed(0)
    qkv = {}
    for b, s in shapes:
        qkv[f"b{b}_s{s}"] = [torch.randn(*shape, generator=g).to(ctx.device, torch.bfloat16)
                             for shape in ((b, hq, 1, d), (b, hkv, s, d), (b, hkv, s, d))]

    def make(gqa: bool):
        def one(q, k, v):
            def call():
                with sdpa_kernel(want):
                    if gqa:
                        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    return F.scaled_dot_product_attention(q, k.repeat_interleave(hq // hkv, 1),
                                                          v.repeat_interleave(hq // hkv, 1))
            return call
        return {key: one(*t) for key, t in qkv.items()}

    calls, gqa = make(True), "enable_gqa=True"
    try:
        for c in calls.values():
            c()  # a backend that cannot take these shapes fails here, not inside a profiled window
    except RuntimeError:  # this backend refuses GQA: expand K and V to the query heads, as HF's eager path does
        calls, gqa = make(False), "K/V repeated to the query heads"
        for c in calls.values():
            c()

    def step():
        return [c() for c in calls.values()]

    return Built(step, {"backend": used, "q_heads": hq, "kv_heads": hkv, "head_dim": d, "q_len": 1, "gqa": gqa,
                        "shapes": [{"batch": b, "kv_len": s} for b, s in shapes], "dtype": "bfloat16"}, parts=calls)


def _llama(ctx: Ctx, max_pos: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv, inter = (64, 2, 4, 2, 128) if ctx.tiny else (4096, 4, 32, 8, 14336)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=32000, max_position_embeddings=max_pos)
    with _on(ctx):
        model = LlamaForCausalLM(cfg)
    return model.to(ctx.device, torch.bfloat16).eval(), {"model": "transformers LlamaForCausalLM", "hidden": hidden,
                                             "layers": layers, "heads": heads, "kv_heads": kv, "ffn": inter}


def llama_decode(ctx: Ctx, cache: str = "dynamic", compiled: bool = False) -> Built:
    prompt, new = (32, 4) if ctx.tiny else (8192, 16)
    model, info = _llama(ctx, prompt + new)
    tokens = _tokens(ctx, 32000, 1, prompt)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(tokens))
    if cache == "static":
        kw["cache_implementation"] = "static"
    # transformers compiles the forward on its own for a static cache on CUDA; off unless asked
    kw["disable_compile"] = not compiled

    @torch.inference_mode()
    def step():
        out = model.generate(tokens, **kw)
        info["compiled_by_generate"] = hasattr(model, "_compiled_call")  # what generate did, not what we asked
        return out

    info.update(prompt=prompt, new_tokens=new, batch=1, cache=cache, auto_compile=compiled, dtype="bfloat16")
    return Built(step, info)


def moe_forward(ctx: Ctx) -> Built:
    from transformers import MixtralConfig, MixtralForCausalLM

    hidden, layers, heads, kv, inter, batch, seq = (
        (64, 2, 4, 2, 128, 2, 32) if ctx.tiny else (1024, 2, 16, 4, 3584, 8, 1024))
    cfg = MixtralConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv, num_local_experts=8,
                        num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=seq)
    with _on(ctx):
        model = MixtralForCausalLM(cfg)
    model = model.to(ctx.device, torch.bfloat16).eval()
    tokens = _tokens(ctx, 32000, batch, seq)

    @torch.inference_mode()
    def step():
        return model(input_ids=tokens, use_cache=False).logits

    return Built(step, {"model": "transformers MixtralForCausalLM", "hidden": hidden, "layers": layers, "experts": 8,
                        "top_k": 2, "ffn": inter, "batch": batch, "seq": seq, "dtype": "bfloat16",
                        "experts_implementation": str(getattr(cfg, "_experts_implementation", None))})


def llama_prefill(ctx: Ctx) -> Built:
    batch, seq = (2, 32) if ctx.tiny else (8, 2048)
    model, info = _llama(ctx, seq)
    tokens = _tokens(ctx, 32000, batch, seq)

    @torch.inference_mode()
    def step():  # as generate's prefill: the cache filled, logits for the last position only
        return model(input_ids=tokens, use_cache=True, logits_to_keep=1).logits

    info.update(batch=batch, seq=seq, dtype="bfloat16", logits_to_keep=1)
    return Built(step, info)


def _s(name, group, pair, role, fix, what, build):
    return Scenario(name, group, pair, role, fix, what, build)


PAD = "GPT2Config(vocab_size=50304)  # pad the vocabulary to a multiple of 64"
CL = "model = model.to(memory_format=torch.channels_last); x = x.contiguous(memory_format=torch.channels_last)"
ADP = "get_peft_model(model, config, autocast_adapter_dtype=False)  # or peft_model.to(torch.bfloat16)"
SCENARIOS = {s.name: s for s in [
    _s("gpt2_train", "A", "gpt2_vocab", "before", "", "GPT-2 train step, vocab 50257 (LM head rows of 100514 bytes)",
       gpt2_train),
    _s("gpt2_train_padded", "A", "gpt2_vocab", "after", PAD, "GPT-2 train step, vocab padded to 50304",
       lambda c: gpt2_train(c, 50304)),
    _s("resnet50_train", "A", "resnet50_layout", "before", "", "ResNet-50 bf16 train step, NCHW (default)",
       resnet50_train),
    _s("resnet50_train_cl", "A", "resnet50_layout", "after", CL, "ResNet-50 bf16 train step, channels_last",
       lambda c: resnet50_train(c, True)),
    _s("efficientnet_b0_train", "A", "efficientnet_layout", "before", "", "timm EfficientNet-B0 bf16 train step, NCHW",
       efficientnet_train),
    _s("efficientnet_b0_train_cl", "A", "efficientnet_layout", "after", CL,
       "timm EfficientNet-B0 bf16 train step, channels_last", lambda c: efficientnet_train(c, True)),
    _s("lora_llama_train", "A", "lora_llama_dtype", "before", "",
       "Llama bf16 + LoRA, peft's default fp32 adapters", lora_llama_train),
    _s("lora_llama_train_bf16", "A", "lora_llama_dtype", "after", ADP, "Llama bf16 + LoRA, bf16 adapters",
       lambda c: lora_llama_train(c, True)),
    _s("lora_qwen2_train", "A", "lora_qwen2_dtype", "before", "", "Qwen2 bf16 + LoRA, peft's default fp32 adapters",
       lora_qwen2_train),
    _s("lora_qwen2_train_bf16", "A", "lora_qwen2_dtype", "after", ADP, "Qwen2 bf16 + LoRA, bf16 adapters",
       lambda c: lora_qwen2_train(c, True)),
    _s("bert_fp32_train", "A", "bert_fp32", "before", "", "BERT train step in fp32, TF32 off (PyTorch's default)",
       bert_fp32_train),
    _s("bert_fp32_train_tf32", "A", "bert_fp32", "after", 'torch.set_float32_matmul_precision("high")',
       "BERT fp32 train step, TF32 matmuls", lambda c: bert_fp32_train(c, "tf32")),
    _s("bert_fp32_train_bf16", "A", "bert_fp32", "after",
       "with torch.autocast('cuda', dtype=torch.bfloat16): ...", "BERT fp32 weights, bf16 autocast",
       lambda c: bert_fp32_train(c, "bf16")),
    _s("sdpa_decode_flash", "B", "sdpa_decode", "before", "",
       "decode attention, SDPA flash backend (batch 1/4, context 8k/32k)", lambda c: sdpa_decode(c, "flash")),
    _s("sdpa_decode_cudnn", "B", "sdpa_decode", "after",
       "with torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION): ...",
       "decode attention, SDPA cuDNN backend", lambda c: sdpa_decode(c, "cudnn")),
    _s("llama_decode", "B", "llama_decode", "before", "",
       "HF Llama greedy decode, 16 tokens after 8k, dynamic cache, eager", llama_decode),
    _s("llama_decode_static", "B", "llama_decode", "after", 'model.generate(..., cache_implementation="static")',
       "the same with a static cache (compile disabled)", lambda c: llama_decode(c, "static")),
    _s("moe_forward", "B", "moe_forward", "control", "", "HF Mixtral (8 experts, top-2) forward, 8 x 1024 tokens",
       moe_forward),
    _s("llama_prefill", "B", "llama_prefill", "control", "", "HF Llama prefill, 8 x 2048 tokens, bf16", llama_prefill),
    _s("gpt2_train_compiled", "C", "gpt2_vocab", "control", "model = torch.compile(model)",
       "gpt2_train_padded under torch.compile (a healthy control)", lambda c: gpt2_train(c, 50304, compiled=True)),
    _s("llama_decode_static_compiled", "C", "llama_decode", "after",
       'model.generate(..., cache_implementation="static")  # compile left on: CUDA graphs',
       "static cache with transformers' automatic torch.compile", lambda c: llama_decode(c, "static", True)),
]}
# C holds the compiled scenarios: each process compiles afresh (Inductor's cache on disk helps the
# later ones), which would push B past its 8 minutes on one H200
GROUPS = {g: [s.name for s in SCENARIOS.values() if s.group == g] for g in ("A", "B", "C")}


# --- running ------------------------------------------------------------------------------------

def _sync(ctx: Ctx):
    if ctx.cuda:
        torch.cuda.synchronize()


def _quantiles(ms: list[float]) -> dict:
    q = statistics.quantiles(ms, n=10, method="inclusive")  # deciles: q[1] is p20, q[7] p80
    return {"median": round(statistics.median(ms), 4), "p20": round(q[1], 4), "p80": round(q[7], 4), "n": len(ms)}


def _time(ctx: Ctx, fn, reps: int, inner: int = 1) -> dict:
    """Wall time of `fn` (ms), synchronized before and after: the step time a user sees."""
    ms = []
    for _ in range(reps):
        _sync(ctx)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(ctx)
        ms.append((time.perf_counter() - t0) * 1e3 / inner)
    return _quantiles(ms)


def _device_name(ctx: Ctx) -> str:
    return torch.cuda.get_device_name() if ctx.cuda else "cpu"


def _meta_update(out: Path, name: str, update: dict):
    path = out / f"hf_{name}.meta.json"
    meta = json.loads(path.read_text()) if path.exists() else {}
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(meta.get(k), dict):
            meta[k].update(v)
        else:
            meta[k] = v
    path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def run_one(sc: Scenario, ctx: Ctx, args) -> None:
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("highest")  # PyTorch's default; the tf32 scenario sets its own
    built = sc.build(ctx)
    for _ in range(args.warmup):  # compilation, cuBLAS heuristics, allocator, optimizer state
        built.step()
    _sync(ctx)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    base = {"scenario": sc.name, "group": sc.group, "pair": sc.pair, "role": sc.role, "fix": sc.fix, "what": sc.what,
            "device": _device_name(ctx), "versions": _versions(), "tiny": ctx.tiny, "info": built.info}
    _meta_update(args.out, sc.name, base)
    if args.time:
        t = _time(ctx, built.step, args.reps)
        row = {"scenario": sc.name, "pair": sc.pair, "role": sc.role, "step_ms": t,
               "device": _device_name(ctx), "torch": torch.__version__, "date": now, "tiny": ctx.tiny}
        if built.parts:
            row["parts_ms"] = {k: _time(ctx, f, args.reps, inner=10) for k, f in built.parts.items()}
        with open(args.out / "timings.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        _meta_update(args.out, sc.name, {"timing": row})
        print(f"{sc.name}: median {t['median']:.2f} ms (p20 {t['p20']:.2f}, p80 {t['p80']:.2f})", flush=True)
    label = f"hf_scenario {sc.name}"
    if args.profiler == "nsys":
        torch.cuda.cudart().cudaProfilerStart()
        with torch.autograd.profiler.emit_nvtx(record_shapes=True), torch.cuda.nvtx.range(label):
            for _ in range(args.steps):
                built.step()
            _sync(ctx)
        torch.cuda.cudart().cudaProfilerStop()
        _meta_update(args.out, sc.name, {"captures": {"nsys": {"steps": args.steps, "warmup": args.warmup,
                                                               "file": f"hf_{sc.name}.sqlite.gz", "date": now}}})
    elif args.profiler == "kineto":
        from torch.profiler import ProfilerActivity, profile, record_function

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
        with profile(activities=acts, record_shapes=True) as prof:
            with record_function(label):
                for _ in range(args.steps):
                    built.step()
                _sync(ctx)
        path = export_gz(prof, args.out / f"hf_{sc.name}.kineto.json")
        _meta_update(args.out, sc.name, {"captures": {"kineto": {"steps": args.steps, "warmup": args.warmup,
                                                                 "file": path.name, "date": now}}})


def label_nsys(raw: Path, out: Path) -> int:
    """Name each SQLite export in RAW after the "hf_scenario NAME" NVTX range it holds and write it
    gzipped to OUT/hf_NAME.sqlite.gz (one nsys run with --capture-range-end=repeat leaves one
    report per scenario, numbered by nsys, not named)."""
    bad = 0
    for db in sorted(raw.glob("*.sqlite")):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            cols = {r[1] for r in con.execute("PRAGMA table_info(NVTX_EVENTS)")}
            # a range's text is inline, or (registered strings, newer nsys) a textId into StringIds
            text = "COALESCE(n.text, s.value)" if "textId" in cols else "n.text"
            join = "LEFT JOIN StringIds s ON n.textId = s.id" if "textId" in cols else ""
            rows = con.execute(f"SELECT DISTINCT {text} FROM NVTX_EVENTS n {join} "
                               f"WHERE {text} LIKE 'hf_scenario %'").fetchall()
        except sqlite3.Error as e:
            rows = []
            print(f"{db.name}: {e}", file=sys.stderr)
        finally:
            con.close()
        names = sorted({r[0].split(" ", 1)[1] for r in rows})
        if len(names) != 1:
            print(f"{db.name}: expected one hf_scenario range, found {names}", file=sys.stderr)
            bad += 1
            continue
        dst = out / f"hf_{names[0]}.sqlite.gz"
        with open(db, "rb") as src, gzip.open(dst, "wb", compresslevel=9) as gz:
            shutil.copyfileobj(src, gz)
        print(f"{db.name} -> {dst.name}")
    return 1 if bad else 0


def expand(names: list[str]) -> list[str]:
    out = []
    for n in names:
        for s in GROUPS.get(n, [n]):
            if s not in out:
                out.append(s)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", nargs="*", help=f"scenario names or a group ({', '.join(GROUPS)})")
    p.add_argument("--profiler", choices=["nsys", "kineto", "none"], default="none")
    p.add_argument("--out", type=Path, default=Path("out/hf"), help="Directory for traces, sidecars, timings.jsonl.")
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke run with --tiny.")
    p.add_argument("--tiny", action="store_true", help="Toy sizes (smoke runs without a GPU).")
    p.add_argument("--time", action="store_true", help="Time --reps synchronized steps into OUT/timings.jsonl.")
    p.add_argument("--warmup", type=int, default=3, help="Steps before timing and profiling (default 3).")
    p.add_argument("--reps", type=int, default=20, help="Timed steps (default 20).")
    p.add_argument("--steps", type=int, default=1, help="Profiled steps (default 1).")
    p.add_argument("--list", action="store_true", help="Print the scenarios named (or all), one a line, and exit.")
    p.add_argument("--label-nsys", type=Path, metavar="RAW",
                   help="Name RAW's .sqlite exports after their scenario, gzipped into --out, and exit.")
    args = p.parse_args(argv)
    if args.reps < 2:
        p.error("--reps must be at least 2 (p20 and p80 need two steps)")
    if args.label_nsys:
        args.out.mkdir(parents=True, exist_ok=True)
        return label_nsys(args.label_nsys, args.out)
    names = expand(args.scenario or list(GROUPS))
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario {unknown[0]} (known: {', '.join(SCENARIOS)}; groups {', '.join(GROUPS)})",
              file=sys.stderr)
        return 2
    if args.list:
        for n in names:
            s = SCENARIOS[n]
            print(f"{n}\t{s.group}\t{s.pair}\t{s.role}")
        return 0
    if not args.scenario:
        print("name a scenario or a group", file=sys.stderr)
        return 2
    ctx = Ctx(args.device, args.tiny)
    if ctx.cuda and not torch.cuda.is_available():
        print("hf_models.py needs a CUDA GPU (or --device cpu --tiny)", file=sys.stderr)
        return 2
    if args.profiler == "nsys" and not ctx.cuda:
        print("--profiler nsys needs --device cuda", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for n in names:
        t0 = time.perf_counter()
        try:
            run_one(SCENARIOS[n], ctx, args)
        except Exception as e:  # one broken scenario must not cost the rest of the group's traces
            traceback.print_exc()
            failed.append(n)
            _meta_update(args.out, n, {"errors": {args.profiler: f"{type(e).__name__}: {e}"[:500]}})
        finally:
            gc.collect()
            if ctx.cuda:
                torch.cuda.empty_cache()
            torch._dynamo.reset()
        print(f"[{n}] {time.perf_counter() - t0:.1f} s", flush=True)
    if failed:
        print(f"failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
