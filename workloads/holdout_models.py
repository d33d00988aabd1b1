"""Hold-out models: third-party architectures the rules were never tuned on, profiled once each
with torch.profiler, so that advisor's findings can be checked on traces nobody planted.

Each model is built from a `transformers` config or a timm name with random weights and run as
its users run it by default (no fixes applied): the point is to see what advisor says and to
check every finding against the raw trace by hand (tests/eval_set.toml records the verdicts).

    t5_train          T5 (d_model 768, 6+6 layers) seq2seq training step, bf16 autocast, 8 x 512
    vit_train         timm vit_base_patch16_224 training step, bf16 autocast, batch 64
    whisper_generate  Whisper (d_model 768, 6+6 layers) fp16: encode 30 s of audio, 24 greedy tokens
    gemma_prefill     Gemma (hidden 2048, 6 layers) forward over 4 x 1024 tokens in fp32 (the dtype
                      from_config gives when nobody asks for another)
    convnext_infer    timm convnext_tiny inference, fp16, batch 128 at 224, NCHW
    distilbert_b1     DistilBERT inference at batch 1, 128 tokens, fp32 (a serving loop's shape)

A second set, captured after the rules were fixed on the first (2026-12-03):

    bert_train_fp32   BERT (hidden 768, 6 layers) masked-LM training step, fp32 (PyTorch's default
                      precision, TF32 off), AdamW, 16 x 256
    mixtral_moe       Mixtral-style mixture of experts (hidden 1024, 4 layers, 8 experts, top 2)
                      forward, bf16, 4 x 512 tokens
    llama_generate    Llama (hidden 2048, 8 layers, 32 query / 8 KV heads) bf16: 512-token prompt,
                      32 greedy tokens at batch 1 (eager, dynamic cache)
    resnet50_train    timm resnet50 training step, bf16 autocast, batch 64 at 224, NCHW
    qwen2_prefill     Qwen2 (hidden 1536, 4 layers, 12 / 2 heads) bf16 forward over 1 x 8192 tokens
    mobilenet_b8      timm mobilenetv3_large_100 inference, fp16, batch 8 at 224

A third set (second session of 2026-12-03): gpt2_compile_train (torch.compile, Inductor's
Triton kernels), swin_infer (timm Swin-T, bf16), opt_generate_b16 (OPT fp16 batched greedy
decode), efficientnet_train_cl (timm EfficientNet-B0 training, channels_last) and
deberta_infer_fp16 (DeBERTa-v2 fp16 inference); gpt2_eager_train / gpt2_sdpa_train and
swin_infer_sdpa time the fused-attention fix. A fourth: wav2vec2_train_fp32, bart_beam_generate,
clip_infer_fp16, mamba_prefill, llama_train_bf16_ckpt. A fifth: lstm_lm_train, dlrm_train,
flex_attention_train, segformer_infer_fp16, fp8_mlp. A sixth: gnn_train, grouped_mm_moe,
pageable_feed_train. A seventh (for slow_memory_bound_kernel): poolformer_infer_fp16,
resnetv2_bit_train, dpt_depth_infer_fp16, upernet_convnext_infer_fp16, with `_compiled`
variants of the three inference models. An eighth (2026-12-03, fourth session): mistral_generate_b4,
bloom_generate_fp16, esm_train_bf16, videomae_train_bf16, phi3_prefill_fp32, mobilevit_infer_fp16.
A ninth (2026-12-04, for kv_cache_copies): mistral_decode_dynamic, mistral_decode_static,
llama_decode_dynamic, llama_decode_static (`_gqa_decode`), and the fixes it names timed:
mistral_decode_grouped, mistral_decode_static_grouped. A tenth (2026-12-04): falcon_decode_mqa,
t5_beam_generate, gpt_neox_train_bf16, qwen2_moe_decode, regnety_train_bf16, dinov2_reg_infer_fp16,
llama_decode_static_b1. An eleventh (2026-12-04, eager attention around a KV cache):
llama_decode_eager, gemma2_decode. A twelfth set (2026-12-04): detr_train, longformer_train_bf16,
resnet18_b1_fp32, sam_vision_infer_fp16, eva02_train_bf16, xlnet_train_bf16. A thirteenth
(2026-12-04): rwkv_generate_fp16, recurrent_gemma_generate_bf16, deformable_detr_train,
maxvit_train_bf16, densenet121_train_bf16, autoformer_train_fp32, and for small traces of Python
position loops recurrent_gemma_prefill_bf16 and mamba_prefill_short. A fourteenth (2026-12-04):
convnext_train_bf16 (and _cl), nfnet_train_bf16 (and _cl), swinv2_train_bf16, bigbird_train_fp32,
encodec_infer_fp32, patchtst_train_fp32; and long-context decodes qwen2_decode_16k and
llama_decode_32k_static. For materialised_attention_bias (2026-12-04): sam_vision_infer_fp16's fixes
(_compiled_helper, _compiled_bias, _compiled_attention, _channels), t5_train_padded (and
_compiled_mask), beit_infer_fp16, vitdet_infer_fp16 (and _sdpa_eager_bias, _sdpa_compiled_bias);
a fifteenth set: umt5_encode_padded (and _compiled_mask), coatnet_train_bf16, modernbert_train_bf16,
olmoe_decode_bf16, siglip_train_bf16. For dtype_churn's sdpa_backend cause (2026-12-04): the fixes
it names, t5_train_contiguous_mask, t5_train_padded_contiguous_mask, umt5_encode_padded_contiguous_mask
(a contiguous position bias) and falcon_decode_mqa_gqa (enable_gqa=True), and the fallback
t5_train_padded_bf16_math / umt5_encode_padded_bf16_math. A sixteenth set (2026-12-04):
deepseek_v3_prefill_bf16, hubert_train_bf16, hubert_train_bf16_conv_fp32, pegasus_generate_fp16, informer_train_fp32,
jamba_prefill_bf16, ast_infer_fp16. See each builder's docstring.

The second set's three models with the fix advisor named (bert_train_fp32_tf32, resnet50_train_cl,
mobilenet_b8_graph: a CUDA graph of the forward), timed against the originals with
`--time-only --steps 20` (no profiler):

    python3 workloads/holdout_models.py bert_train_fp32 bert_train_fp32_tf32 resnet50_train \
        resnet50_train_cl mobilenet_b8 mobilenet_b8_graph --time-only --steps 20 --out OUTDIR

    python3 workloads/holdout_models.py all --out OUTDIR              # on the GPU machine
    python3 workloads/holdout_models.py t5_train --device cpu --tiny --out /tmp/h   # smoke run

Writes OUTDIR/holdout_NAME.kineto.json.gz and one line per model to OUTDIR/holdout.jsonl (step
time, versions). `--nsys` profiles with NVTX ranges (emit_nvtx with shapes) for a run under
`nsys profile -t cuda,nvtx -s none --capture-range=cudaProfilerApi` instead (capture_holdout2.sh). A model that fails is reported and skipped; the others still run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

from kineto_out import export_gz  # beside this script


def _autocast(device: str, dtype):
    return torch.autocast(device_type=device.split(":")[0], dtype=dtype)


def _generate_step(model, n: int, **inputs):
    """A step that generates exactly `n` new tokens without sampling from `inputs` (input_ids=...,
    input_features=..., plus generate() options such as num_beams or cache_implementation)."""

    @torch.no_grad()
    def step():
        return model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return step


def _train_step(opt, dev: str, loss_fn, autocast: bool = True):
    """A training step: `loss_fn()` under bf16 autocast (in the model's own dtype without
    `autocast`), backward, the optimizer's step, the gradients dropped."""

    def step():
        with _autocast(dev, torch.bfloat16) if autocast else contextlib.nullcontext():
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _sgd_classifier_step(model, x: torch.Tensor, classes: int, dev: str):
    """One bf16-autocast training step of an image classifier on `x` with random labels:
    cross entropy, backward, SGD with momentum (the timm training models share it)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    y = torch.randint(0, classes, (x.shape[0],), device=dev)

    return _train_step(opt, dev, lambda: torch.nn.functional.cross_entropy(model(x), y))


def _adamw_classifier_step(model, x: torch.Tensor, classes: int, dev: str):
    """_sgd_classifier_step with AdamW (lr 1e-4, weight decay 0.05), as the timm transformer and
    ConvNeXt recipes train."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    y = torch.randint(0, classes, (x.shape[0],), device=dev)

    return _train_step(opt, dev, lambda: torch.nn.functional.cross_entropy(model(x), y))


def _channels_last(model, x: torch.Tensor, on: bool):
    """Model and input in channels_last where `on` (the fix layout_churn names), else as given."""
    if not on:
        return model, x
    return model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)


def _prefill_step(model, ids: torch.Tensor):
    """One no-grad forward over `ids` keeping only the last position's logits (a prefill)."""

    @torch.no_grad()
    def step():
        model(input_ids=ids, logits_to_keep=1)
    return step


def t5_train(dev: str, tiny: bool, fix: str | None = None):
    """T5 seq2seq training step (see the module docstring). `fix="contiguous_mask"`: the
    position bias made contiguous, so that SDPA's mask is and a fused backend takes it
    (_contiguous_position_bias, what dtype_churn's sdpa_backend cause names)."""
    from transformers import T5Config, T5ForConditionalGeneration

    if fix == "contiguous_mask":
        _contiguous_position_bias()
    elif fix is not None:
        raise ValueError(f"unknown T5 fix {fix!r}")

    cfg = T5Config(d_model=64 if tiny else 768, d_ff=128 if tiny else 3072, num_layers=1 if tiny else 6,
                   num_decoder_layers=1 if tiny else 6, num_heads=2 if tiny else 12, d_kv=32 if tiny else 64,
                   vocab_size=1000 if tiny else 32128, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, s = (2, 16) if tiny else (8, 512)
    ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)
    labels = torch.randint(0, cfg.vocab_size, (b, s // 4), device=dev)

    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=labels).loss)


def t5_train_contiguous_mask(dev: str, tiny: bool):
    """t5_train with a contiguous position bias (its SDPA mask): a fused backend takes the call."""
    return t5_train(dev, tiny, fix="contiguous_mask")


def _sdpa_refusals(run) -> None:
    """Print why each fused SDPA backend refuses the model's first attention call: capture that
    call's arguments during one forward, then call it under each backend alone (torch warns the
    reason before it raises). What `dtype_churn -> sdpa_backend` tells a user to ask torch."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    orig, seen = F.scaled_dot_product_attention, []

    def spy(*a, **kw):
        if not seen:
            seen.append((a, kw))
        return orig(*a, **kw)

    F.scaled_dot_product_attention = spy
    try:
        with torch.no_grad():
            run()
    finally:
        F.scaled_dot_product_attention = orig
    if not seen:
        print("  sdpa: no call seen", flush=True)
        return
    a, kw = seen[0]
    mask = kw.get("attn_mask")
    print(f"  sdpa call: q {tuple(a[0].shape)} {a[0].dtype}, mask "
          f"{None if mask is None else (tuple(mask.shape), mask.dtype, mask.stride())}", flush=True)
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        with warnings.catch_warnings(record=True) as caught, sdpa_kernel(backend), torch.no_grad():
            warnings.simplefilter("always")
            try:
                orig(*a, **kw)
                verdict = "runs"
            except RuntimeError as e:
                verdict = f"refused ({str(e).splitlines()[0]})"
        why = "; ".join(str(w.message).replace("\n", " ")[:300] for w in caught)
        print(f"  sdpa {backend.name}: {verdict}{': ' + why if why else ''}", flush=True)


def _contiguous_position_bias() -> None:
    """Make transformers' T5-family SDPA mask contiguous at its source: the position bias comes
    laid out [1, L, S, H] (a permuted embedding lookup), so the torch.where that merges it with
    the padding mask writes [B, H, L, S] with stride H on its last dim, which every fused GPU
    backend refuses (the math backend takes it). A contiguous bias makes the mask contiguous at
    no extra pass over it (the fix dtype_churn's sdpa_backend cause names)."""
    import transformers.integrations.sdpa_attention as sdpa_mod

    orig = sdpa_mod.create_position_bias_mask

    def contiguous_bias_mask(position_bias, *args, **kwargs):
        out = orig(position_bias.contiguous(), *args, **kwargs)
        if out.stride(-1) != 1:
            raise AssertionError(f"mask still has stride {out.stride(-1)} on its last dim")
        return out

    sdpa_mod.create_position_bias_mask = contiguous_bias_mask


def t5_train_padded(dev: str, tiny: bool, fix: str | None = None):
    """t5_train with a padding mask (each of the 8 rows 256-512 tokens long, the decoder's labels
    unpadded), as fine-tuning on real text runs it: transformers' SDPA path then builds each
    layer's float mask from the [1, H, L, S] position bias and the [B, 1, 1, S] padding mask
    (`create_position_bias_mask`: a torch.where into [B, H, L, S]). `fix="compiled_mask"`:
    that function under torch.compile (what materialised_attention_bias names), checked first
    against the eager loss."""
    import transformers.integrations.sdpa_attention as sdpa_mod
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(d_model=64 if tiny else 768, d_ff=128 if tiny else 3072, num_layers=1 if tiny else 6,
                   num_decoder_layers=1 if tiny else 6, num_heads=2 if tiny else 12, d_kv=32 if tiny else 64,
                   vocab_size=1000 if tiny else 32128, decoder_start_token_id=0, pad_token_id=0,
                   attn_implementation="sdpa")
    model = T5ForConditionalGeneration(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, s = (2, 16) if tiny else (8, 512)
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (b, s), generator=g).to(dev)
    lengths = s - torch.randint(0, s // 2, (b,), generator=g)
    mask = (torch.arange(s)[None, :] < lengths[:, None]).long().to(dev)
    labels = torch.randint(0, cfg.vocab_size, (b, s // 4), generator=g).to(dev)

    def loss():
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss

    if fix == "compiled_mask":
        model.eval()  # no dropout; fp32: the masks must agree, the loss to rounding
        with torch.no_grad():
            ref = loss()
        sdpa_mod.create_position_bias_mask = torch.compile(sdpa_mod.create_position_bias_mask, dynamic=False)
        with torch.no_grad():
            got = loss()
        model.train()
        err = (abs(got - ref) / abs(ref)).item()
        print(f"  t5 fix {fix}: fp32 loss {got.item():.6f} against {ref.item():.6f} eager (rel. {err:.1e})", flush=True)
        if not err <= 1e-4:
            raise AssertionError(f"t5 fix {fix}: loss rel. error {err:.1e}")
    elif fix == "bf16_math":
        if dev != "cpu":
            _sdpa_refusals(loss)
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    elif fix == "contiguous_mask":
        _contiguous_position_bias()
    elif fix is not None:
        raise ValueError(f"unknown T5 fix {fix!r}")
    return _train_step(opt, dev, loss)


def t5_train_padded_bf16_math(dev: str, tiny: bool):
    """t5_train_padded with SDPA's math backend reducing in 16-bit (the fix dtype_churn ->
    sdpa_backend names: torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)); prints why
    the fused backends refuse the call first."""
    return t5_train_padded(dev, tiny, fix="bf16_math")


def t5_train_padded_contiguous_mask(dev: str, tiny: bool):
    """t5_train_padded with the position bias made contiguous, so that its SDPA mask is and a
    fused backend takes the call (_contiguous_position_bias)."""
    return t5_train_padded(dev, tiny, fix="contiguous_mask")


def t5_train_padded_compiled_mask(dev: str, tiny: bool):
    """t5_train_padded with transformers' position-bias mask built by torch.compile."""
    return t5_train_padded(dev, tiny, fix="compiled_mask")


def beit_infer_fp16(dev: str, tiny: bool):
    """BEiT-base (12 layers, 768 wide, relative position bias in every layer) fp16 image
    classification, batch 32 at 224, SDPA: the bias is [1, H, 197, 197], broadcast over the batch."""
    from transformers import BeitConfig, BeitForImageClassification

    cfg = BeitConfig(use_relative_position_bias=True, attn_implementation="sdpa",
                     **(dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             image_size=32, patch_size=8) if tiny else {}))
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = BeitForImageClassification(cfg).to(dtype).eval()
    hw = 32 if tiny else 224
    x = torch.randn(2 if tiny else 32, 3, hw, hw, device=dev, dtype=dtype)

    @torch.no_grad()
    def step():
        model(pixel_values=x)
    return step


def umt5_encode_padded(dev: str, tiny: bool, fix: str | None = None):
    """UMT5 encoder (768 wide, 8 layers, 12 heads, a relative position bias in every layer) bf16
    inference over 16 x 512 padded tokens (256-512 a row), SDPA: each layer's
    `create_position_bias_mask` writes a [16, 12, 512, 512] mask. `fix="compiled_mask"`: that
    function under torch.compile; `fix="bf16_math"`: SDPA's math backend reducing in 16-bit
    (torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp); `fix="contiguous_mask"`: the
    position bias made contiguous so that a fused backend takes the mask; each checked against
    the eager output first."""
    import transformers.integrations.sdpa_attention as sdpa_mod
    from transformers import UMT5Config, UMT5EncoderModel

    cfg = UMT5Config(d_model=64 if tiny else 768, d_ff=128 if tiny else 2048, num_layers=1 if tiny else 8,
                     num_heads=2 if tiny else 12, d_kv=32 if tiny else 64, vocab_size=1000 if tiny else 32000,
                     attn_implementation="sdpa")
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = UMT5EncoderModel(cfg).to(dtype).eval()
    b, s = (2, 16) if tiny else (16, 512)
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (b, s), generator=g).to(dev)
    lengths = s - torch.randint(0, s // 2, (b,), generator=g)
    mask = (torch.arange(s)[None, :] < lengths[:, None]).long().to(dev)

    def run():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state

    if fix in ("compiled_mask", "bf16_math", "contiguous_mask"):
        with torch.no_grad():
            ref = run().float()
        if fix == "compiled_mask":
            sdpa_mod.create_position_bias_mask = torch.compile(sdpa_mod.create_position_bias_mask, dynamic=False)
        elif fix == "contiguous_mask":
            _contiguous_position_bias()
        else:
            if dev != "cpu":
                _sdpa_refusals(run)
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
        with torch.no_grad():
            got = run().float()
        keep = mask.bool()[..., None]  # padded rows' outputs are not compared
        err = ((got - ref).masked_fill(~keep, 0).norm() / ref.masked_fill(~keep, 0).norm()).item()
        print(f"  umt5 fix {fix}: output rel. error {err:.1e} against eager", flush=True)
        # bf16 rounds to 2^-8 = 3.9e-3; over the 8 layers a bf16 softmax or P (the math backend
        # reducing in bf16, or a fused backend taking P to bf16 for its PV product) measured
        # 1.3-1.4e-2 against eager's fp32 math, the compiled mask 0 (the same arithmetic)
        if not err <= (1e-2 if fix == "compiled_mask" else 3e-2):
            raise AssertionError(f"umt5 fix {fix}: rel. error {err:.1e}")
    elif fix is not None:
        raise ValueError(f"unknown UMT5 fix {fix!r}")

    @torch.no_grad()
    def step():
        run()
    return step


def umt5_encode_padded_compiled_mask(dev: str, tiny: bool):
    """umt5_encode_padded with transformers' position-bias mask built by torch.compile."""
    return umt5_encode_padded(dev, tiny, fix="compiled_mask")


def umt5_encode_padded_bf16_math(dev: str, tiny: bool):
    """umt5_encode_padded with SDPA's math backend reducing in 16-bit (dtype_churn's fix)."""
    return umt5_encode_padded(dev, tiny, fix="bf16_math")


def umt5_encode_padded_contiguous_mask(dev: str, tiny: bool):
    """umt5_encode_padded with a contiguous position bias: its SDPA mask is contiguous and a
    fused backend takes the call (_contiguous_position_bias)."""
    return umt5_encode_padded(dev, tiny, fix="contiguous_mask")


def vitdet_infer_fp16(dev: str, tiny: bool, fix: str | None = None):
    """ViTDet-B backbone (transformers' VitDetBackbone: 768 wide, 12 layers, 14 x 14 windows with
    global attention at layers 2, 5, 8, 11, decomposed relative positions) fp16 inference, batch 2
    at 1024 x 1024. Its attention is op by op: the two relative-position terms are added to the
    [24, 4096, 4096] scores in the global layers. `fix`: "sdpa_eager_bias" (SDPA with the bias
    built by the same broadcast adds, unfused_attention's remedy taken literally) or
    "sdpa_compiled_bias" (that bias built by torch.compile, contiguous); each checked against the
    unpatched layers first (random weights and tables)."""
    import types

    import torch.nn.functional as F
    from transformers import VitDetBackbone, VitDetConfig

    hw = 64 if tiny else 1024
    cfg = VitDetConfig(image_size=hw, patch_size=16, hidden_size=32 if tiny else 768,
                       num_hidden_layers=2 if tiny else 12, num_attention_heads=2 if tiny else 12,
                       mlp_ratio=4, window_size=2 if tiny else 14,
                       window_block_indices=[0] if tiny else [0, 1, 3, 4, 6, 7, 9, 10],
                       use_relative_position_embeddings=True, out_features=["stage2" if tiny else "stage12"])
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = VitDetBackbone(cfg).to(dtype).eval()
    x = torch.randn(2, 3, hw, hw, device=dev, dtype=dtype)
    if fix is not None:
        from transformers.models.vitdet import modeling_vitdet as mv

        def bias_terms(q, rel_pos_h, rel_pos_w, hh, ww):
            rh = torch.einsum("bhwc,hkc->bhwk", q.reshape(q.shape[0], hh, ww, -1), mv.get_rel_pos(hh, hh, rel_pos_h))
            rw = torch.einsum("bhwc,wkc->bhwk", q.reshape(q.shape[0], hh, ww, -1), mv.get_rel_pos(ww, ww, rel_pos_w))
            return (rh[:, :, :, :, None] + rw[:, :, :, None, :]).reshape(q.shape[0], hh * ww, hh * ww)

        if fix == "sdpa_compiled_bias":
            import torch._dynamo as dynamo

            dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 64)
            build = torch.compile(lambda *a: bias_terms(*a).contiguous(), dynamic=False)
        elif fix == "sdpa_eager_bias":
            build = bias_terms
        else:
            raise ValueError(f"unknown ViTDet fix {fix!r}")

        def forward(self, hidden_state, output_attentions=False):
            B, hh, ww, _ = hidden_state.shape
            qkv = self.qkv(hidden_state).reshape(B, hh * ww, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.reshape(3, B * self.num_heads, hh * ww, -1).unbind(0)
            bias = build(q, self.rel_pos_h, self.rel_pos_w, hh, ww).view(B, self.num_heads, hh * ww, hh * ww)
            shape = (B, self.num_heads, hh * ww, -1)
            out = F.scaled_dot_product_attention(q.view(shape), k.view(shape), v.view(shape), attn_mask=bias,
                                                 scale=self.scale)
            out = out.view(B, self.num_heads, hh, ww, -1).permute(0, 2, 3, 1, 4).reshape(B, hh, ww, -1)
            return (self.proj(out),)

        layers = [m for m in model.modules() if type(m).__name__ == "VitDetAttention"]

        def patch():
            for m in layers:
                m.forward = types.MethodType(forward, m)

        _patched_and_checked(layers, dev, dtype, patch, f"vitdet fix {fix}")

    @torch.no_grad()
    def step():
        model(x)
    return step


def vitdet_infer_fp16_sdpa_eager_bias(dev: str, tiny: bool):
    """vitdet_infer_fp16 on SDPA with an eagerly built bias."""
    return vitdet_infer_fp16(dev, tiny, fix="sdpa_eager_bias")


def vitdet_infer_fp16_sdpa_compiled_bias(dev: str, tiny: bool):
    """vitdet_infer_fp16 on SDPA with the bias built by torch.compile."""
    return vitdet_infer_fp16(dev, tiny, fix="sdpa_compiled_bias")


def coatnet_train_bf16(dev: str, tiny: bool):
    """timm CoAtNet-0 (rw) training, bf16 autocast, batch 64 at 224: MBConv stages, then
    transformer stages whose attention takes a relative position bias through SDPA."""
    import timm

    model = timm.create_model("coatnet_nano_rw_224" if tiny else "coatnet_0_rw_224", pretrained=False).to(dev)
    x = torch.randn(2 if tiny else 64, 3, 224, 224, device=dev)
    return _sgd_classifier_step(model, x, 1000, dev)


def modernbert_train_bf16(dev: str, tiny: bool):
    """ModernBERT (768 wide, 12 layers, alternating 128-token local and global attention) masked-LM
    training, bf16 autocast, 8 x 1024, SDPA, AdamW."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    cfg = ModernBertConfig(hidden_size=64 if tiny else 768, intermediate_size=128 if tiny else 1152,
                           num_hidden_layers=2 if tiny else 12, num_attention_heads=2 if tiny else 12,
                           vocab_size=1000 if tiny else 50368, attn_implementation="sdpa",
                           **(dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
                              if tiny else {}))
    model = ModernBertForMaskedLM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, s = (2, 32) if tiny else (8, 1024)
    ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)
    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=ids).loss)


def olmoe_decode_bf16(dev: str, tiny: bool):
    """OLMoE (1024 wide, 4 layers, 16 experts, top 4) bf16: 256-token prompts at batch 4, 16 greedy tokens."""
    from transformers import OlmoeConfig, OlmoeForCausalLM

    cfg = OlmoeConfig(hidden_size=64 if tiny else 1024, intermediate_size=64 if tiny else 512,
                      num_hidden_layers=1 if tiny else 4, num_attention_heads=2 if tiny else 16,
                      num_key_value_heads=2 if tiny else 16, num_experts=4 if tiny else 16,
                      num_experts_per_tok=2 if tiny else 4, vocab_size=1000 if tiny else 50304)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = OlmoeForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (4, 16 if tiny else 256), device=dev)
    return _generate_step(model, 4 if tiny else 16, input_ids=ids, attention_mask=torch.ones_like(ids))


def siglip_train_bf16(dev: str, tiny: bool):
    """SigLIP (ViT-B/16 vision, 12-layer text) contrastive training, bf16 autocast, 64 images at
    224 and 64 texts of 64 tokens, sigmoid loss, AdamW."""
    from transformers import SiglipConfig, SiglipModel, SiglipTextConfig, SiglipVisionConfig

    if tiny:
        cfg = SiglipConfig(text_config=SiglipTextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                        num_attention_heads=2, vocab_size=1000),
                           vision_config=SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                            num_attention_heads=2, image_size=32, patch_size=16))
    else:
        cfg = SiglipConfig()
    model = SiglipModel(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b = 2 if tiny else 64
    hw = cfg.vision_config.image_size
    x = torch.randn(b, 3, hw, hw, device=dev)
    ids = torch.randint(0, cfg.text_config.vocab_size, (b, 16 if tiny else 64), device=dev)
    return _train_step(opt, dev, lambda: model(input_ids=ids, pixel_values=x, return_loss=True).loss)


def vit_train(dev: str, tiny: bool):
    import timm

    model = timm.create_model("vit_tiny_patch16_224" if tiny else "vit_base_patch16_224", pretrained=False).to(dev)
    x = torch.randn(2 if tiny else 64, 3, 224, 224, device=dev)
    return _sgd_classifier_step(model, x, 1000, dev)


def whisper_generate(dev: str, tiny: bool):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    d = 64 if tiny else 768
    cfg = WhisperConfig(d_model=d, encoder_layers=1 if tiny else 6, decoder_layers=1 if tiny else 6,
                        encoder_attention_heads=2 if tiny else 12, decoder_attention_heads=2 if tiny else 12,
                        encoder_ffn_dim=4 * d, decoder_ffn_dim=4 * d, vocab_size=51865,
                        max_source_positions=1500, max_target_positions=448)
    dtype = torch.float32 if dev == "cpu" else torch.float16
    model = WhisperForConditionalGeneration(cfg).to(dev, dtype).eval()
    feats = torch.randn(1, cfg.num_mel_bins, 3000, device=dev, dtype=dtype)
    n = 4 if tiny else 24
    return _generate_step(model, n, input_features=feats)


def gemma_prefill(dev: str, tiny: bool):
    from transformers import GemmaConfig, GemmaForCausalLM

    cfg = GemmaConfig(hidden_size=64 if tiny else 2048, intermediate_size=128 if tiny else 16384,
                      num_hidden_layers=1 if tiny else 6, num_attention_heads=2 if tiny else 8,
                      num_key_value_heads=1, head_dim=32 if tiny else 256, vocab_size=1000 if tiny else 256000)
    model = GemmaForCausalLM(cfg).to(dev).eval()  # fp32: what from_config gives
    b, s = (1, 16) if tiny else (4, 1024)
    ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)

    @torch.no_grad()
    def step():
        model(input_ids=ids, logits_to_keep=1)
    return step


def convnext_infer(dev: str, tiny: bool):
    import timm

    dtype = torch.float32 if dev == "cpu" else torch.float16
    model = timm.create_model("convnext_atto" if tiny else "convnext_tiny", pretrained=False).to(dev, dtype).eval()
    x = torch.randn(2 if tiny else 128, 3, 224, 224, device=dev, dtype=dtype)

    @torch.no_grad()
    def step():
        model(x)
    return step


def distilbert_b1(dev: str, tiny: bool):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    cfg = DistilBertConfig(dim=64 if tiny else 768, hidden_dim=128 if tiny else 3072, n_layers=1 if tiny else 6,
                           n_heads=2 if tiny else 12, vocab_size=1000 if tiny else 30522)
    model = DistilBertForSequenceClassification(cfg).to(dev).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 16 if tiny else 128), device=dev)

    @torch.no_grad()
    def step():
        for _ in range(4):  # a serving loop: one request after another
            model(input_ids=ids)
    return step


def bert_train_fp32(dev: str, tiny: bool):
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(hidden_size=64 if tiny else 768, intermediate_size=128 if tiny else 3072,
                     num_hidden_layers=1 if tiny else 6, num_attention_heads=2 if tiny else 12,
                     vocab_size=1000 if tiny else 30522)
    model = BertForMaskedLM(cfg).to(dev)  # fp32, as from_config gives it
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, s = (2, 16) if tiny else (16, 256)
    ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)

    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=ids).loss, autocast=False)


def mixtral_moe(dev: str, tiny: bool):
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(hidden_size=64 if tiny else 1024, intermediate_size=128 if tiny else 3584,
                        num_hidden_layers=1 if tiny else 4, num_attention_heads=2 if tiny else 16,
                        num_key_value_heads=1 if tiny else 4, num_local_experts=4 if tiny else 8,
                        num_experts_per_tok=2, vocab_size=1000 if tiny else 32000)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = MixtralForCausalLM(cfg).to(dtype).eval()
    b, s = (1, 16) if tiny else (4, 512)
    ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)

    @torch.no_grad()
    def step():
        model(input_ids=ids, logits_to_keep=1)
    return step


def llama_generate(dev: str, tiny: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64 if tiny else 2048, intermediate_size=128 if tiny else 5632,
                      num_hidden_layers=1 if tiny else 8, num_attention_heads=2 if tiny else 32,
                      num_key_value_heads=1 if tiny else 8, vocab_size=1000 if tiny else 32000)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 16 if tiny else 512), device=dev)
    n = 4 if tiny else 32
    return _generate_step(model, n, input_ids=ids)


def resnet50_train(dev: str, tiny: bool, channels_last: bool = False):
    import timm

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = timm.create_model("resnet18" if tiny else "resnet50", pretrained=False).to(dev).to(memory_format=fmt)
    x = torch.randn(2 if tiny else 64, 3, 224, 224, device=dev).contiguous(memory_format=fmt)
    return _sgd_classifier_step(model, x, 1000, dev)


def qwen2_prefill(dev: str, tiny: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=64 if tiny else 1536, intermediate_size=128 if tiny else 8960,
                      num_hidden_layers=1 if tiny else 4, num_attention_heads=2 if tiny else 12,
                      num_key_value_heads=1 if tiny else 2, vocab_size=1000 if tiny else 151936)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 32 if tiny else 8192), device=dev)

    @torch.no_grad()
    def step():
        model(input_ids=ids, logits_to_keep=1)
    return step


def mobilenet_b8(dev: str, tiny: bool):
    import timm

    dtype = torch.float32 if dev == "cpu" else torch.float16
    model = timm.create_model("mobilenetv3_small_050" if tiny else "mobilenetv3_large_100",
                              pretrained=False).to(dev, dtype).eval()
    x = torch.randn(2 if tiny else 8, 3, 224, 224, device=dev, dtype=dtype)

    @torch.no_grad()
    def step():
        model(x)
    return step


# The second set's models with the fix advisor named applied (timed with --time-only, to check
# each finding's estimate against what the fix gave).

def bert_train_fp32_tf32(dev: str, tiny: bool):
    inner = bert_train_fp32(dev, tiny)

    def step():  # TF32 for this step only: the models timed after it keep PyTorch's default
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            inner()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
    return step


def resnet50_train_cl(dev: str, tiny: bool):
    return resnet50_train(dev, tiny, channels_last=True)


def mobilenet_b8_graph(dev: str, tiny: bool):
    inner = mobilenet_b8(dev, tiny)
    return _graphed(inner) if dev.startswith("cuda") else inner


def _graphed(step):
    """`step` captured in one CUDA graph after three warm-up calls on a side stream (cuDNN picks
    its algorithms and workspaces, an optimizer makes its state), and its replay returned."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


# A third set (2026-12-03, second session): compiled, windowed-attention, batched-decode and
# depthwise-conv models, none of whose traces the rules have seen.

def gpt2_compile_train(dev: str, tiny: bool):
    """GPT-2 (768 wide, 6 layers) training step under torch.compile's default mode: Inductor's
    Triton kernels for everything but the matmuls, bf16 autocast, AdamW, 8 x 512."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=64 if tiny else 768, n_layer=1 if tiny else 6, n_head=2 if tiny else 12,
                     vocab_size=1000 if tiny else 50257, n_positions=512)
    model = GPT2LMHeadModel(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, s = (2, 16) if tiny else (8, 512)
    ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)
    fwd = torch.compile(lambda x: model(input_ids=x, labels=x).loss)

    return _train_step(opt, dev, lambda: fwd(ids))


def swin_infer(dev: str, tiny: bool, fused: bool = False):
    """timm swin_tiny inference, bf16 weights, batch 32 at 224 (windowed attention, odd shapes;
    timm leaves Swin's fused attention off by default)."""
    import timm

    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).to(dev, dtype).eval()
    if fused:
        for m in model.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = True
    x = torch.randn(2 if tiny else 32, 3, 224, 224, device=dev, dtype=dtype)

    @torch.no_grad()
    def step():
        model(x)
    return step


def gpt2_eager_train(dev: str, tiny: bool, attn: str = "eager"):
    """GPT-2 (768 wide, 6 layers) training step with transformers' eager attention (what a model
    that returns attention weights, or an older checkpoint's code, runs), bf16 autocast, AdamW,
    8 x 1024."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=64 if tiny else 768, n_layer=1 if tiny else 6, n_head=2 if tiny else 12,
                     vocab_size=1000 if tiny else 50304, n_positions=1024)
    model = GPT2LMHeadModel._from_config(cfg, attn_implementation=attn).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, s = (2, 16) if tiny else (8, 1024)
    ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)

    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=ids).loss)


def gpt2_sdpa_train(dev: str, tiny: bool):
    """gpt2_eager_train with attn_implementation="sdpa": the fix unfused_attention names."""
    return gpt2_eager_train(dev, tiny, attn="sdpa")


def swin_infer_sdpa(dev: str, tiny: bool):
    """swin_infer with timm's fused attention on (F.scaled_dot_product_attention): the fix the
    unfused_attention rule names, timed against swin_infer."""
    return swin_infer(dev, tiny, fused=True)


def opt_generate_b16(dev: str, tiny: bool):
    """OPT (768 wide, 12 layers) fp16 greedy decode at batch 16: 128-token prompts, 48 new tokens."""
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(hidden_size=64 if tiny else 768, ffn_dim=128 if tiny else 3072,
                    num_hidden_layers=1 if tiny else 12, num_attention_heads=2 if tiny else 12,
                    word_embed_proj_dim=64 if tiny else 768, vocab_size=1000 if tiny else 50272)
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = OPTForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(4, cfg.vocab_size, (2 if tiny else 16, 16 if tiny else 128), device=dev)
    n = 4 if tiny else 48
    return _generate_step(model, n, input_ids=ids)


def efficientnet_train_cl(dev: str, tiny: bool):
    """timm efficientnet_b0 training step, bf16 autocast, channels_last, batch 128 at 224
    (depthwise convolutions, squeeze-excite: many small kernels)."""
    import timm

    model = timm.create_model("efficientnet_b0", pretrained=False).to(dev).to(memory_format=torch.channels_last)
    x = torch.randn(2 if tiny else 128, 3, 224, 224, device=dev).contiguous(memory_format=torch.channels_last)
    return _sgd_classifier_step(model, x, 1000, dev)


def deberta_infer_fp16(dev: str, tiny: bool):
    """DeBERTa-v2 (768 wide, 6 layers) fp16 inference, 32 x 256 (disentangled attention)."""
    from transformers import DebertaV2Config, DebertaV2Model

    cfg = DebertaV2Config(hidden_size=64 if tiny else 768, intermediate_size=128 if tiny else 3072,
                          num_hidden_layers=1 if tiny else 6, num_attention_heads=2 if tiny else 12,
                          vocab_size=1000 if tiny else 128100, relative_attention=True,
                          pos_att_type=["p2c", "c2p"], max_relative_positions=-1, position_buckets=256)
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = DebertaV2Model(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 16) if tiny else (32, 256), device=dev)

    @torch.no_grad()
    def step():
        model(input_ids=ids)
    return step


# A fourth set (2026-12-03, second session): audio in fp32, beam search, a dual encoder, a
# state-space model on its slow path, bf16 training with activation checkpointing.

def wav2vec2_train_fp32(dev: str, tiny: bool):
    """Wav2Vec2 (768 wide, 6 layers) CTC training step in fp32 (the dtype from_config gives):
    a 7-layer conv1d feature encoder with group norm, then a transformer; 4 x 5 s of 16 kHz."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    cfg = Wav2Vec2Config(hidden_size=64 if tiny else 768, intermediate_size=128 if tiny else 3072,
                         num_hidden_layers=1 if tiny else 6, num_attention_heads=2 if tiny else 12,
                         vocab_size=32, conv_dim=(32,) * 7 if tiny else (512,) * 7)
    model = Wav2Vec2ForCTC(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2 if tiny else 4, 4000 if tiny else 80000, device=dev)
    labels = torch.randint(1, 32, (x.shape[0], 4 if tiny else 60), device=dev)

    return _train_step(opt, dev, lambda: model(input_values=x, labels=labels).loss, autocast=False)


def _with_backend_flags(inner, **flags):
    """A step run with torch.backends flags set for its duration (the models timed after it
    keep PyTorch's defaults): matmul_tf32 -> cuda.matmul.allow_tf32, cudnn_benchmark ->
    cudnn.benchmark."""
    names = {"matmul_tf32": (torch.backends.cuda.matmul, "allow_tf32"),
             "cudnn_benchmark": (torch.backends.cudnn, "benchmark")}

    def step():
        saved = {k: getattr(*names[k]) for k in flags}
        for k, v in flags.items():
            setattr(*names[k], v)
        try:
            inner()
        finally:
            for k, v in saved.items():
                setattr(*names[k], v)
    return step


def wav2vec2_train_tf32(dev: str, tiny: bool):
    """wav2vec2_train_fp32 with TF32 matmuls (the fix tensor_cores_unused names)."""
    return _with_backend_flags(wav2vec2_train_fp32(dev, tiny), matmul_tf32=True)


def wav2vec2_train_cudnn_bench(dev: str, tiny: bool):
    """wav2vec2_train_fp32 with cudnn.benchmark (cuDNN times its algorithms per shape)."""
    return _with_backend_flags(wav2vec2_train_fp32(dev, tiny), cudnn_benchmark=True)


def bart_beam_generate(dev: str, tiny: bool):
    """BART (768 wide, 6+6 layers) fp16 beam search: 4 sequences of 256 tokens, 4 beams, 32 new."""
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(d_model=64 if tiny else 768, encoder_layers=1 if tiny else 6, decoder_layers=1 if tiny else 6,
                     encoder_attention_heads=2 if tiny else 12, decoder_attention_heads=2 if tiny else 12,
                     encoder_ffn_dim=128 if tiny else 3072, decoder_ffn_dim=128 if tiny else 3072,
                     vocab_size=1000 if tiny else 50265)
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = BartForConditionalGeneration(cfg).to(dtype).eval()
    ids = torch.randint(4, cfg.vocab_size, (2 if tiny else 4, 16 if tiny else 256), device=dev)
    n = 4 if tiny else 32
    return _generate_step(model, n, input_ids=ids, num_beams=4)


def clip_infer_fp16(dev: str, tiny: bool, channels_last: bool = False):
    """CLIP (ViT-B/32 vision, 12-layer text) fp16 inference: 64 images against 64 captions."""
    from transformers import CLIPConfig, CLIPModel

    if tiny:
        cfg = CLIPConfig(text_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                                      "num_attention_heads": 2},
                         vision_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                                        "num_attention_heads": 2, "image_size": 64, "patch_size": 32})
    else:
        cfg = CLIPConfig()
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = CLIPModel(cfg).to(dtype).eval()
    b = 2 if tiny else 64
    img = torch.randn(b, 3, cfg.vision_config.image_size, cfg.vision_config.image_size, device=dev, dtype=dtype)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        img = img.contiguous(memory_format=torch.channels_last)
    ids = torch.randint(0, cfg.text_config.vocab_size, (b, 77), device=dev)

    @torch.no_grad()
    def step():
        model(input_ids=ids, pixel_values=img)
    return step


def clip_infer_fp16_cl(dev: str, tiny: bool):
    """clip_infer_fp16 with model and images in channels_last (what layout_churn names)."""
    return clip_infer_fp16(dev, tiny, channels_last=True)


def _mamba(dev: str, tiny: bool, layers: int, batch: int, tokens: int):
    """A Mamba LM (768 wide, state 16) in bf16 (fp32 on the CPU) and a prefill step over
    batch x tokens, through transformers' slow path (no mamba-ssm kernels)."""
    from transformers import MambaConfig, MambaForCausalLM

    cfg = MambaConfig(hidden_size=64 if tiny else 768, num_hidden_layers=1 if tiny else layers,
                      vocab_size=1000 if tiny else 50280, state_size=16)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = MambaForCausalLM(cfg).to(dtype).eval()
    return _prefill_step(model, torch.randint(0, cfg.vocab_size, (batch, 16 if tiny else tokens), device=dev))


def mamba_prefill(dev: str, tiny: bool):
    """Mamba (768 wide, 8 layers) bf16 forward over 2 x 256 tokens without the mamba-ssm CUDA
    kernels: transformers' slow path (a sequential selective scan, one step a token)."""
    return _mamba(dev, tiny, layers=8, batch=2, tokens=256)


def llama_train_bf16_ckpt(dev: str, tiny: bool):
    """Llama (1024 wide, 8 layers, 16 / 4 heads) training in pure bf16 weights with activation
    checkpointing and AdamW, 4 x 2048 tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64 if tiny else 1024, intermediate_size=128 if tiny else 2816,
                      num_hidden_layers=1 if tiny else 8, num_attention_heads=2 if tiny else 16,
                      num_key_value_heads=1 if tiny else 4, vocab_size=1000 if tiny else 32000)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).to(dtype)
    model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, cfg.vocab_size, (2, 32) if tiny else (4, 2048), device=dev)

    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=ids).loss, autocast=False)


# A fifth set (2026-12-03, third session): model families the rules had not seen at all: a
# recurrent LM on cuDNN's RNN kernels, a recommender's embedding bags, FlexAttention compiled
# by Inductor, a segmentation transformer with depthwise convolutions, and fp8 GEMMs.

def lstm_lm_train(dev: str, tiny: bool, graph: bool = False):
    """Two-layer LSTM language model (512 embedding, 1024 hidden, 16k vocabulary) training step
    in fp32 (PyTorch's default precision: cuDNN may use TF32, matmuls may not), 32 x 128 tokens.
    graph=True: the whole step (forward, backward, AdamW with capturable state) captured in one
    CUDA graph and replayed (the fix launch_overhead names)."""
    vocab, emb, hid = (500, 32, 64) if tiny else (16000, 512, 1024)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, emb)
            self.rnn = torch.nn.LSTM(emb, hid, num_layers=2, batch_first=True, dropout=0.1)
            self.head = torch.nn.Linear(hid, vocab)

        def forward(self, ids):
            return self.head(self.rnn(self.emb(ids))[0])

    model = LM().to(dev).train()
    graph = graph and dev.startswith("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=graph)
    ids = torch.randint(0, vocab, (4, 16) if tiny else (32, 128), device=dev)

    def step():
        logits = model(ids[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=not graph)  # a graph keeps its gradients' buffers
    return _graphed(step) if graph else step


def lstm_lm_train_graph(dev: str, tiny: bool):
    """lstm_lm_train with the step in one CUDA graph."""
    return lstm_lm_train(dev, tiny, graph=True)


def lstm_lm_train_tf32_graph(dev: str, tiny: bool):
    """lstm_lm_train with TF32 matmuls and the step in one CUDA graph (both fixes): the switch is
    on while the graph is captured, which is when cuBLAS picks its kernels."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return lstm_lm_train(dev, tiny, graph=True)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def lstm_lm_train_tf32(dev: str, tiny: bool):
    """lstm_lm_train with TF32 matmuls (the fix tensor_cores_unused names for its output layer)."""
    return _with_backend_flags(lstm_lm_train(dev, tiny), matmul_tf32=True)


def dlrm_train(dev: str, tiny: bool):
    """DLRM-style recommender training step in fp32: 8 embedding bags (200k x 64, sum of 20
    ids a bag), a 13-feature bottom MLP, pairwise feature interactions, a top MLP; batch 4096."""
    rows, dim, tables, bag, batch = (1000, 16, 2, 4, 64) if tiny else (200_000, 64, 8, 20, 4096)

    class DLRM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bags = torch.nn.ModuleList(torch.nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
            self.bottom = torch.nn.Sequential(torch.nn.Linear(13, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                              torch.nn.ReLU(), torch.nn.Linear(256, dim), torch.nn.ReLU())
            n = tables + 1
            self.top = torch.nn.Sequential(torch.nn.Linear(dim + n * (n - 1) // 2, 1024), torch.nn.ReLU(),
                                           torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))

        def forward(self, dense, ids):
            feats = [self.bottom(dense)] + [b(ids[i]) for i, b in enumerate(self.bags)]
            z = torch.stack(feats, 1)
            inter = torch.bmm(z, z.transpose(1, 2))
            i, j = torch.triu_indices(z.shape[1], z.shape[1], 1, device=z.device)
            return self.top(torch.cat([feats[0], inter[:, i, j]], 1))

    model = DLRM().to(dev).train()
    opt = torch.optim.Adagrad(model.parameters(), lr=1e-2)
    dense = torch.randn(batch, 13, device=dev)
    ids = torch.randint(0, rows, (tables, batch, bag), device=dev)
    y = torch.randint(0, 2, (batch, 1), device=dev).float()

    def step():
        torch.nn.functional.binary_cross_entropy_with_logits(model(dense, ids), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def dlrm_train_tf32(dev: str, tiny: bool):
    """dlrm_train with TF32 matmuls (the fix tensor_cores_unused names for its MLPs)."""
    return _with_backend_flags(dlrm_train(dev, tiny), matmul_tf32=True)


def flex_attention_train(dev: str, tiny: bool):
    """A 4-layer pre-norm transformer (1024 wide, 16 heads) training step, bf16, whose attention
    is FlexAttention with a 512-token sliding causal window, compiled (Inductor's attention
    templates); the rest eager. 4 x 2048 tokens."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    d, h, layers, b, s = (64, 2, 1, 1, 128) if tiny else (1024, 16, 4, 4, 2048)
    window = 32 if tiny else 512
    mask = create_block_mask(lambda _b, _h, q, k: (q >= k) & (q - k < window), None, None, s, s, device=dev)
    attend = torch.compile(flex_attention) if dev.startswith("cuda") else flex_attention
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

        def forward(self, x):
            q, k, v = self.qkv(self.n1(x)).view(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4)
            x = x + self.proj(attend(q, k, v, block_mask=mask).transpose(1, 2).reshape(b, s, d))
            return x + self.mlp(self.n2(x))

    model = torch.nn.Sequential(*(Block() for _ in range(layers))).to(dev, dtype).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(b, s, d, device=dev, dtype=dtype)

    def step():
        if not dev.startswith("cuda"):  # FlexAttention has no backward on the CPU: the smoke run checks the forward
            with torch.no_grad():
                return model(x)
        model(x).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def segformer_infer_fp16(dev: str, tiny: bool):
    """SegFormer (MiT-b2-sized encoder, all-MLP decoder) fp16 semantic segmentation of 16 images
    at 512 x 512: efficient self-attention with spatial reduction, depthwise 3x3 convolutions
    in the Mix-FFN."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    cfg = SegformerConfig(depths=[1, 1, 1, 1] if tiny else [3, 4, 6, 3],
                          hidden_sizes=[16, 32, 64, 128] if tiny else [64, 128, 320, 512],
                          decoder_hidden_size=64 if tiny else 768, num_labels=150)
    dtype = torch.float32 if dev == "cpu" else torch.float16
    model = SegformerForSemanticSegmentation(cfg).to(dev, dtype).eval()
    x = torch.randn(1 if tiny else 16, 3, 64 if tiny else 512, 64 if tiny else 512, device=dev, dtype=dtype)

    @torch.no_grad()
    def step():
        model(pixel_values=x)
    return step


def fp8_mlp(dev: str, tiny: bool):
    """A transformer FFN (4096 -> 14336 -> 4096, SwiGLU) forward in fp8 e4m3 through
    torch._scaled_mm with per-tensor scales, 8192 tokens: what float8 training and fp8 serving
    stacks launch. bf16 in and out; the activations are quantised on the fly."""
    n, d, f = (16, 32, 64) if tiny else (8192, 4096, 14336)
    if not dev.startswith("cuda"):  # fp8 GEMMs need sm_89+; the CPU smoke run checks the shapes in bf16
        w1, w3, w2 = (torch.randn(a, b, device=dev) * 0.02 for a, b in ((f, d), (f, d), (d, f)))
        x = torch.randn(n, d, device=dev)

        def cpu_step():
            h = torch.nn.functional.silu(x @ w1.t()) * (x @ w3.t())
            return h @ w2.t()
        return cpu_step
    fp8 = torch.float8_e4m3fn
    ws = [(torch.randn(a, b, device=dev) * 0.02) for a, b in ((f, d), (f, d), (d, f))]
    scales = [w.abs().max() / 448 for w in ws]
    w1, w3, w2 = ((w / s).to(fp8) for w, s in zip(ws, scales))
    s1, s3, s2 = (s.float() for s in scales)
    x = torch.randn(n, d, device=dev, dtype=torch.bfloat16)

    def mm(a, w, sw):  # a (n, k) bf16, w (out, k) fp8: w.t() is column-major, as _scaled_mm wants
        sa = a.abs().amax().float() / 448
        return torch._scaled_mm((a / sa).to(fp8), w.t(), scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16)

    def step():
        h = torch.nn.functional.silu(mm(x, w1, s1)) * mm(x, w3, s3)
        return mm(h, w2, s2)
    return step



# A sixth set (2026-12-03, third session): a graph network's scatter/gather, a mixture of experts
# on torch._grouped_mm, and a training loop that feeds the GPU from pageable host memory.

def gnn_train(dev: str, tiny: bool):
    """GraphSAGE-style mean aggregation, 3 layers of 256, bf16 autocast, on a random graph of
    200k nodes and 4M edges (index_select of source features, index_add_ into destinations)."""
    n, e, d = (200, 2000, 16) if tiny else (200_000, 4_000_000, 256)
    g = torch.Generator(device="cpu").manual_seed(0)
    src = torch.randint(0, n, (e,), generator=g).to(dev)
    dst = torch.randint(0, n, (e,), generator=g).to(dev)
    deg = torch.zeros(n, device=dev).index_add_(0, dst, torch.ones(e, device=dev)).clamp_(min=1).unsqueeze(1)
    x = torch.randn(n, d, device=dev)
    y = torch.randint(0, 16, (n,), device=dev)
    layers = torch.nn.ModuleList(torch.nn.Linear(2 * d, d) for _ in range(3)).to(dev)
    head = torch.nn.Linear(d, 16).to(dev)
    opt = torch.optim.Adam([*layers.parameters(), *head.parameters()], lr=1e-3)

    def step():
        with _autocast(dev, torch.bfloat16 if dev.startswith("cuda") else torch.float32):
            h = x
            for lin in layers:
                agg = torch.zeros_like(h).index_add_(0, dst, h.index_select(0, src)) / deg.to(h.dtype)
                h = torch.relu(lin(torch.cat([h, agg], 1)))
            loss = torch.nn.functional.cross_entropy(head(h).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def grouped_mm_moe(dev: str, tiny: bool):
    """A mixture-of-experts FFN (8 experts of 2048 -> 5632 -> 2048, top 2) forward in bf16 on
    torch._grouped_mm over tokens sorted by expert, 8192 tokens: the grouped-GEMM path MoE
    training stacks take on Hopper."""
    t, d, f, ne = (64, 32, 64, 4) if tiny else (8192, 2048, 5632, 8)
    dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    x = torch.randn(t, d, device=dev, dtype=dtype)
    router = torch.randn(d, ne, device=dev, dtype=dtype) * 0.02
    w1 = torch.randn(ne, d, f, device=dev, dtype=dtype) * 0.02
    w2 = torch.randn(ne, f, d, device=dev, dtype=dtype) * 0.02

    @torch.no_grad()
    def step():
        top = (x @ router).topk(2, dim=1).indices.flatten()
        order = top.argsort()
        tok = x.repeat_interleave(2, 0)[order]
        counts = torch.bincount(top, minlength=ne)
        if not dev.startswith("cuda"):  # the smoke run: one matmul per expert
            outs, at = [], 0
            for i, c in enumerate(counts.tolist()):
                outs.append(torch.nn.functional.silu(tok[at:at + c] @ w1[i]) @ w2[i])
                at += c
            return torch.cat(outs)
        offs = counts.cumsum(0).to(torch.int32)
        h = torch.nn.functional.silu(torch._grouped_mm(tok, w1, offs=offs))
        return torch._grouped_mm(h, w2, offs=offs)
    return step


def pageable_feed_train(dev: str, tiny: bool):
    """An MLP (1024 -> 4096 -> 4096 -> 10) trained in bf16 autocast on batches of 8192 made on
    the CPU each step and copied from pageable memory, with the loss printed through .item()
    every step: the input pipeline as many scripts write it."""
    b, d, h = (64, 32, 64) if tiny else (8192, 1024, 4096)
    model = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, h), torch.nn.GELU(),
                                torch.nn.Linear(h, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    losses = []

    def step():
        xb = torch.randn(b, d, generator=g)  # made on the CPU, in pageable memory
        yb = torch.randint(0, 10, (b,), generator=g)
        xb, yb = xb.to(dev), yb.to(dev)
        with _autocast(dev, torch.bfloat16 if dev.startswith("cuda") else torch.float32):
            loss = torch.nn.functional.cross_entropy(model(xb).float(), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # a host sync every step
    return step


def _compiled(build):
    """A builder whose model runs under torch.compile (default mode): the fix
    slow_memory_bound_kernel names, timed against the eager original."""
    def builder(dev: str, tiny: bool):
        return build(dev, tiny, compiled=True)
    builder.__doc__ = f"{build.__name__} under torch.compile (default mode)."
    return builder


def poolformer_infer_fp16(dev: str, tiny: bool, compiled: bool = False):
    """timm poolformer_s12 inference, fp16, batch 64 at 224, NCHW: token mixing by average
    pooling, GroupNorm(1, C) norms, no attention."""
    import timm

    dtype = torch.float32 if dev == "cpu" else torch.float16
    model = timm.create_model("poolformer_s12", pretrained=False).to(dev, dtype).eval()
    model = torch.compile(model) if compiled else model
    x = torch.randn(2 if tiny else 64, 3, 64 if tiny else 224, 64 if tiny else 224, device=dev, dtype=dtype)

    @torch.no_grad()
    def step():
        model(x)
    return step


def resnetv2_bit_train(dev: str, tiny: bool):
    """timm resnetv2_50x1_bit (BiT: GroupNorm and weight-standardized convolutions) training
    step, bf16 autocast, SGD, batch 32 at 224, NCHW."""
    import timm

    model = timm.create_model("resnetv2_50x1_bit", pretrained=False, num_classes=100).to(dev)
    n, r = (2, 64) if tiny else (32, 224)
    return _sgd_classifier_step(model, torch.randn(n, 3, r, r, device=dev), 100, dev)


def dpt_depth_infer_fp16(dev: str, tiny: bool, compiled: bool = False):
    """DPT (ViT-B/16 sized backbone, 12 layers) depth estimation in fp16, 8 images at 384 x 384:
    reassemble and fusion stages with bilinear upsampling and convolutions after the ViT."""
    from transformers import DPTConfig, DPTForDepthEstimation

    cfg = DPTConfig(image_size=64 if tiny else 384, num_hidden_layers=4 if tiny else 12,
                    hidden_size=64 if tiny else 768, num_attention_heads=2 if tiny else 12,
                    intermediate_size=128 if tiny else 3072, backbone_out_indices=[0, 1, 2, 3] if tiny else [2, 5, 8, 11],
                    neck_hidden_sizes=[16, 32, 64, 64] if tiny else [96, 192, 384, 768],
                    fusion_hidden_size=32 if tiny else 256)
    dtype = torch.float32 if dev == "cpu" else torch.float16
    model = DPTForDepthEstimation(cfg).to(dev, dtype).eval()
    model = torch.compile(model) if compiled else model
    x = torch.randn(1 if tiny else 8, 3, cfg.image_size, cfg.image_size, device=dev, dtype=dtype)

    @torch.no_grad()
    def step():
        model(pixel_values=x)
    return step


def upernet_convnext_infer_fp16(dev: str, tiny: bool, compiled: bool = False):
    """UperNet with a ConvNeXt-T backbone, fp16 semantic segmentation of 8 images at 512 x 512:
    pyramid pooling (adaptive pooling + bilinear upsampling), FPN fusion, batch-norm convs."""
    from transformers import ConvNextConfig, UperNetConfig, UperNetForSemanticSegmentation

    backbone = ConvNextConfig(depths=[1, 1, 1, 1] if tiny else [3, 3, 9, 3],
                              hidden_sizes=[16, 32, 64, 128] if tiny else [96, 192, 384, 768],
                              out_features=["stage1", "stage2", "stage3", "stage4"])
    cfg = UperNetConfig(backbone_config=backbone, hidden_size=32 if tiny else 512,
                        auxiliary_in_channels=64 if tiny else 384, num_labels=150)
    dtype = torch.float32 if dev == "cpu" else torch.float16
    model = UperNetForSemanticSegmentation(cfg).to(dev, dtype).eval()
    model = torch.compile(model) if compiled else model
    x = torch.randn(1 if tiny else 8, 3, 64 if tiny else 512, 64 if tiny else 512, device=dev, dtype=dtype)

    @torch.no_grad()
    def step():
        model(pixel_values=x)
    return step


def mistral_generate_b4(dev: str, tiny: bool):
    """Mistral (2048 wide, 8 layers, 32 query / 8 KV heads, sliding window 4096) bf16 greedy
    decode at batch 4: 4096-token prompts, 32 new tokens, eager, dynamic cache (long-context
    decode through SDPA's default backend choice)."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(hidden_size=64 if tiny else 2048, intermediate_size=128 if tiny else 5632,
                        num_hidden_layers=1 if tiny else 8, num_attention_heads=2 if tiny else 32,
                        num_key_value_heads=1 if tiny else 8, vocab_size=1000 if tiny else 32000,
                        sliding_window=4096, max_position_embeddings=8192)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = MistralForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (1 if tiny else 4, 16 if tiny else 4096), device=dev)
    n = 4 if tiny else 32
    return _generate_step(model, n, input_ids=ids)


def _register_sdpa_grouped() -> str:
    """Register with transformers an SDPA attention that takes the grouped K/V as they are
    (`enable_gqa=True`, mask or not) instead of repeating them to the query heads: the fix
    kv_cache_copies names (native_gqa). Returns its attn_implementation name."""
    import torch.nn.functional as F
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def sdpa_grouped(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        if attention_mask is not None and attention_mask.ndim == 4:
            attention_mask = attention_mask[:, :, :, : key.shape[-2]]
        causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal", True)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             scale=scaling, is_causal=causal,
                                             enable_gqa=key.shape[1] != query.shape[1])
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("sdpa_grouped", sdpa_grouped)
    AttentionMaskInterface.register("sdpa_grouped", sdpa_mask)
    return "sdpa_grouped"


def _gqa_decode(dev: str, tiny: bool, arch: str, cache: str, grouped: bool = False):
    """A 4-layer bf16 decoder (2048 wide, 32 query / 8 KV heads of 64) generating 16 tokens
    greedily after 4096-token prompts at batch 4, eager SDPA. arch "mistral" has a 4096-token
    sliding window (decode past it needs an explicit mask, so transformers repeats K/V to the
    query heads), "llama" none (no mask in decode: SDPA gets grouped K/V with enable_gqa).
    cache "dynamic" grows the KV cache by torch.cat every step; "static" preallocates it.
    grouped: attention through `_register_sdpa_grouped` (no repeat, whatever the mask)."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    common = dict(hidden_size=64 if tiny else 2048, intermediate_size=128 if tiny else 5632,
                  num_hidden_layers=1 if tiny else 4, num_attention_heads=2 if tiny else 32,
                  num_key_value_heads=1 if tiny else 8, vocab_size=1000 if tiny else 32000,
                  max_position_embeddings=8192)
    if arch == "mistral":
        cfg, cls = MistralConfig(sliding_window=8 if tiny else 4096, **common), MistralForCausalLM
    else:
        cfg, cls = LlamaConfig(**common), LlamaForCausalLM
    if grouped:
        cfg._attn_implementation = _register_sdpa_grouped()
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = cls(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (2 if tiny else 4, 16 if tiny else 4096), device=dev)
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    return _generate_step(model, 4 if tiny else 16, input_ids=ids, **extra)


def mistral_decode_dynamic(dev: str, tiny: bool):
    """_gqa_decode: Mistral, dynamic cache (KV cache concatenated, K/V repeated)."""
    return _gqa_decode(dev, tiny, "mistral", "dynamic")


def mistral_decode_static(dev: str, tiny: bool):
    """_gqa_decode: Mistral, static cache (K/V repeated over the preallocated length)."""
    return _gqa_decode(dev, tiny, "mistral", "static")


def mistral_decode_grouped(dev: str, tiny: bool):
    """mistral_decode_dynamic with SDPA on the grouped K/V (`_register_sdpa_grouped`)."""
    return _gqa_decode(dev, tiny, "mistral", "dynamic", grouped=True)


def mistral_decode_static_grouped(dev: str, tiny: bool):
    """mistral_decode_static with SDPA on the grouped K/V: both fixes kv_cache_copies names."""
    return _gqa_decode(dev, tiny, "mistral", "static", grouped=True)


def llama_decode_dynamic(dev: str, tiny: bool):
    """_gqa_decode: Llama, dynamic cache (KV cache concatenated, grouped K/V to SDPA)."""
    return _gqa_decode(dev, tiny, "llama", "dynamic")


def llama_decode_static(dev: str, tiny: bool):
    """_gqa_decode: Llama, static cache (its mask of unused slots makes transformers repeat K/V)."""
    return _gqa_decode(dev, tiny, "llama", "static")


def falcon_decode_mqa(dev: str, tiny: bool):
    """Falcon (2048 wide, 4 layers, 32 query heads, one KV head: multi-query) bf16 greedy decode at
    batch 8: 1024-token prompts, 16 new tokens, dynamic cache."""
    from transformers import FalconConfig, FalconForCausalLM

    cfg = FalconConfig(hidden_size=64 if tiny else 2048, num_hidden_layers=1 if tiny else 4,
                       num_attention_heads=2 if tiny else 32, multi_query=True, new_decoder_architecture=False,
                       vocab_size=1000 if tiny else 65024)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = FalconForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (2 if tiny else 8, 16 if tiny else 1024), device=dev)
    return _generate_step(model, 4 if tiny else 16, input_ids=ids)


def falcon_decode_mqa_gqa(dev: str, tiny: bool):
    """falcon_decode_mqa with SDPA told that its one K/V head is shared (enable_gqa=True, what
    dtype_churn's kv_heads_broadcast cause names), patched into torch.nn.functional for calls
    whose K has fewer heads than q; the greedy tokens are checked against the unpatched run."""
    F = torch.nn.functional
    orig = F.scaled_dot_product_attention

    def gqa_sdpa(q, k, v, *args, **kwargs):
        if k.dim() >= 3 and k.shape[-3] < q.shape[-3] and not kwargs.get("enable_gqa"):
            kwargs["enable_gqa"] = True
        return orig(q, k, v, *args, **kwargs)

    step = falcon_decode_mqa(dev, tiny)
    torch.manual_seed(0)
    ref = step()
    F.scaled_dot_product_attention = gqa_sdpa
    torch.manual_seed(0)
    got = step()
    same = (got == ref).float().mean().item()
    print(f"  falcon enable_gqa: {same:.3f} of the greedy tokens as unpatched", flush=True)
    return step


def t5_beam_generate(dev: str, tiny: bool):
    """T5 (512 wide, 6+6 layers) fp16 beam search: 8 inputs of 512 tokens, 4 beams, 24 new tokens
    (the self-attention cache grows and is reordered by beam every step)."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(d_model=64 if tiny else 512, d_ff=128 if tiny else 2048, num_layers=1 if tiny else 6,
                   num_decoder_layers=1 if tiny else 6, num_heads=2 if tiny else 8, vocab_size=1000 if tiny else 32128,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = T5ForConditionalGeneration(cfg).to(dtype).eval()
    ids = torch.randint(2, cfg.vocab_size, (2 if tiny else 8, 16 if tiny else 512), device=dev)
    return _generate_step(model, 4 if tiny else 24, input_ids=ids, num_beams=4)


def gpt_neox_train_bf16(dev: str, tiny: bool):
    """GPT-NeoX (1024 wide, 6 layers, rotary on a quarter of each head, parallel residual)
    training step under bf16 autocast, AdamW, 8 x 1024 tokens."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(hidden_size=64 if tiny else 1024, intermediate_size=128 if tiny else 4096,
                        num_hidden_layers=1 if tiny else 6, num_attention_heads=2 if tiny else 16,
                        vocab_size=1000 if tiny else 50432, rotary_pct=0.25)
    model = GPTNeoXForCausalLM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (2 if tiny else 8, 16 if tiny else 1024), device=dev)

    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=ids).loss)


def qwen2_moe_decode(dev: str, tiny: bool):
    """Qwen2-MoE (1024 wide, 4 layers, 16 / 4 heads, 16 experts top 4 plus a shared expert) bf16
    greedy decode at batch 4: 512-token prompts, 16 new tokens."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(hidden_size=64 if tiny else 1024, intermediate_size=128 if tiny else 2816,
                         moe_intermediate_size=32 if tiny else 704, shared_expert_intermediate_size=128 if tiny else 2816,
                         num_hidden_layers=1 if tiny else 4, num_attention_heads=2 if tiny else 16,
                         num_key_value_heads=1 if tiny else 4, num_experts=4 if tiny else 16,
                         num_experts_per_tok=2 if tiny else 4, vocab_size=1000 if tiny else 32000)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = Qwen2MoeForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (2 if tiny else 4, 16 if tiny else 512), device=dev)
    return _generate_step(model, 4 if tiny else 16, input_ids=ids)


def regnety_train_bf16(dev: str, tiny: bool):
    """timm regnety_016 (grouped convolutions, squeeze-excite) training step, bf16 autocast,
    batch 64 at 224, NCHW."""
    import timm

    model = timm.create_model("regnety_002" if tiny else "regnety_016", pretrained=False).to(dev)
    x = torch.randn(2 if tiny else 64, 3, 224, 224, device=dev)
    return _sgd_classifier_step(model, x, 1000, dev)


def dinov2_reg_infer_fp16(dev: str, tiny: bool):
    """timm DINOv2 ViT-S/14 with 4 register tokens (cls, registers and patches concatenated) fp16
    inference, batch 64 at 224."""
    import timm

    dtype = torch.float32 if dev == "cpu" else torch.float16
    model = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, img_size=224).to(dev, dtype).eval()
    x = torch.randn(2 if tiny else 64, 3, 224, 224, device=dev, dtype=dtype)

    @torch.no_grad()
    def step():
        model(x)
    return step


def llama_decode_static_b1(dev: str, tiny: bool):
    """Llama (2048 wide, 4 layers, 32 / 8 heads) bf16 greedy decode at batch 1 with a static cache
    (transformers compiles the decode step): a 1024-token prompt, 32 new tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64 if tiny else 2048, intermediate_size=128 if tiny else 5632,
                      num_hidden_layers=1 if tiny else 4, num_attention_heads=2 if tiny else 32,
                      num_key_value_heads=1 if tiny else 8, vocab_size=1000 if tiny else 32000)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 16 if tiny else 1024), device=dev)
    return _generate_step(model, 4 if tiny else 32, input_ids=ids, cache_implementation="static")


def llama_decode_eager(dev: str, tiny: bool):
    """_gqa_decode's Llama with attn_implementation="eager" (repeat_kv, then matmul, softmax,
    matmul): 4-layer bf16 greedy decode at batch 4, 4096-token prompts, 16 new tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64 if tiny else 2048, intermediate_size=128 if tiny else 5632,
                      num_hidden_layers=1 if tiny else 4, num_attention_heads=2 if tiny else 32,
                      num_key_value_heads=1 if tiny else 8, vocab_size=1000 if tiny else 32000,
                      max_position_embeddings=8192)
    cfg._attn_implementation = "eager"
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (2 if tiny else 4, 16 if tiny else 4096), device=dev)
    return _generate_step(model, 4 if tiny else 16, input_ids=ids)


def gemma2_decode(dev: str, tiny: bool):
    """Gemma-2 (2048 wide, 4 layers, 8 query / 4 KV heads of 256, a 4096-token sliding window on
    alternate layers, logit soft-capping) bf16 greedy decode at batch 4: 4096-token prompts, 16 new
    tokens, the attention transformers picks for it."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(hidden_size=64 if tiny else 2048, intermediate_size=128 if tiny else 8192,
                       num_hidden_layers=2 if tiny else 4, num_attention_heads=2 if tiny else 8,
                       num_key_value_heads=1 if tiny else 4, head_dim=32 if tiny else 256,
                       sliding_window=8 if tiny else 4096, vocab_size=1000 if tiny else 256000,
                       max_position_embeddings=8192)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = Gemma2ForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (2 if tiny else 4, 16 if tiny else 4096), device=dev)
    return _generate_step(model, 4 if tiny else 16, input_ids=ids)


# A twelfth set (2026-12-04): a detector whose loss matches boxes on the CPU, sliding-window
# attention, a ResNet at batch 1 in fp32, a windowed-attention image encoder with prompts, a ViT
# with rotary embeddings and SwiGLU, and relative positional attention written as einsums.

def detr_train(dev: str, tiny: bool):
    """DETR (timm resnet18 backbone with frozen batch norm, 256 wide, 6+6 layers, 100 queries)
    object-detection training step, bf16 autocast, AdamW: 8 images at 512 x 512 with 4 boxes each;
    the loss's Hungarian matcher copies the cost matrix to the host and runs scipy's
    linear_sum_assignment per image."""
    from transformers import DetrConfig, DetrForObjectDetection

    cfg = DetrConfig(use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False,
                     encoder_layers=1 if tiny else 6, decoder_layers=1 if tiny else 6, d_model=32 if tiny else 256,
                     encoder_attention_heads=2 if tiny else 8, decoder_attention_heads=2 if tiny else 8,
                     encoder_ffn_dim=64 if tiny else 2048, decoder_ffn_dim=64 if tiny else 2048,
                     num_queries=8 if tiny else 100, num_labels=91)
    model = DetrForObjectDetection(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    b, hw, k = (2, 64, 2) if tiny else (8, 512, 4)
    x = torch.randn(b, 3, hw, hw, device=dev)
    xy = torch.rand(b, k, 2, device=dev) * 0.5 + 0.25
    labels = [{"class_labels": torch.randint(0, 91, (k,), device=dev),
               "boxes": torch.cat([xy[i], torch.full((k, 2), 0.2, device=dev)], 1)} for i in range(b)]

    return _train_step(opt, dev, lambda: model(pixel_values=x, labels=labels).loss)


def longformer_train_bf16(dev: str, tiny: bool):
    """Longformer (512 wide, 4 layers, 8 heads, a 256-token sliding window, no global attention)
    masked-LM training step, bf16 autocast, AdamW, 4 x 4096 tokens: its attention is chunked
    matmuls over overlapping windows, padded, diagonals gathered (no SDPA)."""
    from transformers import LongformerConfig, LongformerForMaskedLM

    s = 64 if tiny else 4096
    cfg = LongformerConfig(hidden_size=64 if tiny else 512, intermediate_size=128 if tiny else 2048,
                           num_hidden_layers=1 if tiny else 4, num_attention_heads=2 if tiny else 8,
                           attention_window=8 if tiny else 256, vocab_size=1000 if tiny else 50265,
                           max_position_embeddings=s + 2, pad_token_id=1)
    model = LongformerForMaskedLM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(3, cfg.vocab_size, (2 if tiny else 4, s), device=dev)

    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=ids).loss)


def resnet18_b1_fp32(dev: str, tiny: bool):
    """timm resnet18 inference at batch 1, 224 x 224, fp32, NCHW, PyTorch's defaults (a serving
    loop's shape): cuDNN convolutions may use TF32 (torch.backends.cudnn.allow_tf32 is True by
    default) while matmuls, the classifier's, do not."""
    import timm

    model = timm.create_model("resnet18", pretrained=False).to(dev).eval()
    x = torch.randn(1, 3, 224, 224, device=dev)

    @torch.no_grad()
    def step():
        for _ in range(4):  # a serving loop: one request after another
            model(x)
    return step


def sam_vision_infer_fp16(dev: str, tiny: bool, fix: str | None = None):
    """SAM ViT-B (SamConfig's defaults: 768 wide, 12 layers, 14 x 14 windowed attention with
    global attention at layers 2, 5, 8 and 11) fp16 inference of the whole model: image encoder,
    prompt encoder and two-way mask decoder, one point prompt per image, batch 2 at 1024 x 1024
    (64 x 64 patches), three masks per prompt (multimask_output's default). The encoder's SDPA
    takes its decomposed relative positions as a dense additive mask (4096 x 4096 a head on the
    global layers). `fix`: the remedies materialised_attention_bias names (_sam_fix)."""
    from transformers import SamConfig, SamModel

    hw = 64 if tiny else 1024
    if tiny:
        cfg = SamConfig(vision_config=dict(image_size=hw, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           window_size=2, global_attn_indexes=[1], output_channels=32,
                                           num_pos_feats=16),
                        prompt_encoder_config=dict(image_size=hw, hidden_size=32),
                        mask_decoder_config=dict(hidden_size=32, mlp_dim=64, num_attention_heads=2,
                                                 iou_head_hidden_dim=32))
    else:
        cfg = SamConfig()
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = SamModel(cfg).to(dtype).eval()
    b = 2
    x = torch.randn(b, 3, hw, hw, device=dev, dtype=dtype)
    points = torch.rand(b, 1, 1, 2, device=dev) * hw
    point_labels = torch.ones(b, 1, 1, dtype=torch.long, device=dev)
    if fix is not None:
        _sam_fix(model, x, fix)

    @torch.no_grad()
    def step():
        model(pixel_values=x, input_points=points, input_labels=point_labels)
    return step


def _patched_and_checked(layers, device, dtype, patch, label: str) -> None:
    """Give each attention layer random weights and position tables (a randomly initialised SAM or
    ViTDet has them ~1e-9 and zero: a check would see no output and no bias), take each layer's
    output on its own random input, call `patch()`, and check the patched layers against those
    outputs (printed; a relative error over 2e-2 raises)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    inputs = []
    with torch.no_grad():
        for m in layers:
            for t in (m.rel_pos_h, m.rel_pos_w):
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
            for lin in (m.qkv, m.proj):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / lin.in_features ** 0.5)
            side = (m.rel_pos_h.shape[0] + 1) // 2  # the tables hold 2 x side - 1 offsets
            h = torch.randn((2, side, side, m.qkv.in_features), generator=g).to(device, dtype)
            inputs.append((h, m(h)[0].float()))
    patch()
    with torch.no_grad():
        err = max(((m(h)[0].float() - ref).norm() / ref.norm()).item() for m, (h, ref) in zip(layers, inputs))
    print(f"  {label}: {len(layers)} attention layers, worst output rel. error {err:.2e} against the unpatched "
          "layers", flush=True)
    if not err <= 2e-2:
        raise AssertionError(f"{label}: rel. error {err:.2e}")


def _sam_fix(model, x, fix: str) -> None:
    """Patch every SDPA attention of SAM's image encoder with one remedy, and check each layer's
    output against the unpatched layer's on a random input with random position tables (printed;
    a wrong patch raises):
    - "compiled_helper": get_decomposed_rel_pos under torch.compile as it is: Inductor writes the
      add in one kernel, but a compiled function's output keeps eager's strides (here a permuted
      layout), so the reshape after it still copies;
    - "compiled_bias": the same, returning .contiguous(): one kernel writes the bias in the layout
      SDPA takes, the reshape is a view;
    - "compiled_attention": every attention module under torch.compile (module.compile());
    - "channels": no bias in memory: rel_h / scale and rel_w / scale appended to q as channels, the
      key grid's one-hot row and column indicators to k (zero channels pad q and k to a multiple
      of 8 so that SDPA keeps a fused kernel), SDPA with scale= the model's."""
    layers = [m for m in model.vision_encoder.modules() if type(m).__name__ == "SamVisionSdpaAttention"]
    if not layers:
        raise RuntimeError("no SamVisionSdpaAttention in the image encoder: transformers changed")
    _patched_and_checked(layers, x.device, x.dtype, lambda: _sam_patch(layers, fix), f"sam fix {fix}")


def _sam_patch(layers, fix: str) -> None:
    """One of _sam_fix's remedies on SAM's attention layers."""
    import types

    import torch.nn.functional as F

    if fix in ("compiled_helper", "compiled_bias", "compiled_attention"):
        import torch._dynamo as dynamo

        dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 64)
        for m in layers:
            if fix == "compiled_helper":
                m.get_decomposed_rel_pos = torch.compile(m.get_decomposed_rel_pos, dynamic=False)
            elif fix == "compiled_bias":
                m.get_decomposed_rel_pos = torch.compile(
                    lambda *a, f=m.get_decomposed_rel_pos: f(*a).contiguous(), dynamic=False)
            else:
                m.compile(dynamic=False)
    elif fix == "channels":
        def forward(self, hidden_states, output_attentions=False):
            B, Hh, Ww, _ = hidden_states.shape
            nH, L = self.num_attention_heads, Hh * Ww
            qkv = self.qkv(hidden_states).reshape(B, L, 3, nH, -1).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.reshape(3, B * nH, L, -1).unbind(0)
            D = q.shape[-1]
            rq = q.reshape(B * nH, Hh, Ww, D)
            rel_h = torch.einsum("bhwc,hkc->bhwk", rq, self.get_rel_pos(Hh, Hh, self.rel_pos_h)).reshape(B * nH, L, Hh)
            rel_w = torch.einsum("bhwc,wkc->bhwk", rq, self.get_rel_pos(Ww, Ww, self.rel_pos_w)).reshape(B * nH, L, Ww)
            keys = torch.arange(L, device=q.device)
            eh = (keys[:, None] // Ww == torch.arange(Hh, device=q.device)).to(q.dtype).expand(B * nH, L, Hh)
            ew = (keys[:, None] % Ww == torch.arange(Ww, device=q.device)).to(q.dtype).expand(B * nH, L, Ww)
            pad = (-(D + Hh + Ww)) % 8
            zq = q.new_zeros(B * nH, L, pad)
            qa = torch.cat([q, rel_h / self.scale, rel_w / self.scale, zq], dim=-1).view(B, nH, L, -1)
            ka = torch.cat([k, eh, ew, zq], dim=-1).view(B, nH, L, -1)
            out = F.scaled_dot_product_attention(qa, ka, v.view(B, nH, L, D), scale=self.scale)
            out = out.view(B, nH, Hh, Ww, D).permute(0, 2, 3, 1, 4).reshape(B, Hh, Ww, -1)
            return self.proj(out), None

        for m in layers:
            m.forward = types.MethodType(forward, m)
    else:
        raise ValueError(f"unknown SAM fix {fix!r}")


def sam_vision_infer_fp16_compiled_helper(dev: str, tiny: bool):
    """sam_vision_infer_fp16 with SAM's bias helper under torch.compile as it is (_sam_fix)."""
    return sam_vision_infer_fp16(dev, tiny, fix="compiled_helper")


def sam_vision_infer_fp16_compiled_bias(dev: str, tiny: bool):
    """sam_vision_infer_fp16 with the bias helper compiled and returning it contiguous (_sam_fix)."""
    return sam_vision_infer_fp16(dev, tiny, fix="compiled_bias")


def sam_vision_infer_fp16_compiled_attention(dev: str, tiny: bool):
    """sam_vision_infer_fp16 with every image-encoder attention module compiled (_sam_fix)."""
    return sam_vision_infer_fp16(dev, tiny, fix="compiled_attention")


def sam_vision_infer_fp16_channels(dev: str, tiny: bool):
    """sam_vision_infer_fp16 with the bias as q / k channels, none in memory (_sam_fix)."""
    return sam_vision_infer_fp16(dev, tiny, fix="channels")


def eva02_train_bf16(dev: str, tiny: bool):
    """timm eva02_small_patch14_224 (384 wide, 12 layers, 2D rotary embeddings, SwiGLU MLP) with
    a 1000-class head, training step, bf16 autocast, AdamW, batch 64 at 224 (257 tokens)."""
    import timm

    if tiny:
        model = timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=28, num_classes=1000, depth=1)
    else:
        model = timm.create_model("eva02_small_patch14_224", pretrained=False, num_classes=1000)
    model = model.to(dev)
    hw = 28 if tiny else 224
    x = torch.randn(2 if tiny else 64, 3, hw, hw, device=dev)
    return _adamw_classifier_step(model, x, 1000, dev)


def xlnet_train_bf16(dev: str, tiny: bool):
    """XLNet (768 wide, 6 layers, 12 heads) language-model training step, bf16 autocast, AdamW,
    8 x 512 tokens, no permutation mask: relative positional attention written as einsums (content
    and position scores, the relative shift by reshapes and an index_select), no SDPA."""
    from transformers import XLNetConfig, XLNetLMHeadModel

    cfg = XLNetConfig(d_model=64 if tiny else 768, n_layer=1 if tiny else 6, n_head=2 if tiny else 12,
                      d_inner=128 if tiny else 3072, vocab_size=1000 if tiny else 32000)
    model = XLNetLMHeadModel(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (2 if tiny else 8, 16 if tiny else 512), device=dev)

    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=ids).loss)


def rwkv_generate_fp16(dev: str, tiny: bool):
    """RWKV-4 (768 wide, 6 layers) fp16 greedy decode at batch 4: 64-token prompts, 24 new tokens.
    transformers fetches RWKV's CUDA kernel from the Hub's `kernels` package; without it (no
    package, no network: the default here) the WKV recurrence runs as a Python loop over the
    prompt's tokens, a few elementwise kernels a token a layer."""
    from transformers import RwkvConfig, RwkvForCausalLM

    cfg = RwkvConfig(vocab_size=1000 if tiny else 50277, hidden_size=64 if tiny else 768,
                     num_hidden_layers=2 if tiny else 6, context_length=1024)
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = RwkvForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (2 if tiny else 4, 16 if tiny else 64), device=dev)
    return _generate_step(model, 4 if tiny else 24, input_ids=ids)


def _recurrent_gemma(dev: str, tiny: bool):
    """RecurrentGemma (Griffin: 1024 wide, 6 layers in the config's recurrent, recurrent,
    attention pattern, RG-LRU width 1024) in bf16 (fp32 on the CPU), random weights."""
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM

    cfg = RecurrentGemmaConfig(hidden_size=64 if tiny else 1024, lru_width=64 if tiny else 1024,
                               intermediate_size=128 if tiny else 3072, num_hidden_layers=3 if tiny else 6,
                               num_attention_heads=2 if tiny else 8, num_key_value_heads=1, head_dim=32 if tiny else 128,
                               vocab_size=1000 if tiny else 256000, attention_window_size=2048)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        return RecurrentGemmaForCausalLM(cfg).to(dtype).eval()


def recurrent_gemma_generate_bf16(dev: str, tiny: bool):
    """_recurrent_gemma's model, greedy decode at batch 2: 256-token prompts, 24 new tokens.
    Its prefill runs the RG-LRU recurrence as a Python loop over the tokens (the linear-mode
    scan), a handful of kernels a token a recurrent layer."""
    model = _recurrent_gemma(dev, tiny)
    ids = torch.randint(0, model.config.vocab_size, (2, 16 if tiny else 256), device=dev)
    return _generate_step(model, 4 if tiny else 24, input_ids=ids)


def recurrent_gemma_prefill_bf16(dev: str, tiny: bool):
    """_recurrent_gemma's model, one forward over 2 x 128 tokens: the RG-LRU's Python loop over
    the positions alone (a small trace of the loop)."""
    model = _recurrent_gemma(dev, tiny)
    return _prefill_step(model, torch.randint(0, model.config.vocab_size, (2, 16 if tiny else 128), device=dev))


def mamba_prefill_short(dev: str, tiny: bool):
    """mamba_prefill at 2 layers over 1 x 128 tokens: the slow path's selective scan (a Python
    loop over the positions) in a small trace."""
    return _mamba(dev, tiny, layers=2, batch=1, tokens=128)


def deformable_detr_train(dev: str, tiny: bool):
    """Deformable DETR (timm resnet50 backbone, 4 feature levels, 256 wide, 6+6 layers, 300
    queries) object-detection training step, bf16 autocast, AdamW: 4 images at 640 x 640 with 6
    boxes each. Multi-scale deformable attention runs as transformers' PyTorch code (grid_sample
    per level; the Hub kernel needs the `kernels` package); the Hungarian matcher runs on the
    host."""
    from transformers import DeformableDetrConfig, DeformableDetrForObjectDetection

    cfg = DeformableDetrConfig(use_timm_backbone=True, backbone="resnet18" if tiny else "resnet50",
                               use_pretrained_backbone=False, encoder_layers=1 if tiny else 6,
                               decoder_layers=2 if tiny else 6, d_model=32 if tiny else 256,
                               encoder_attention_heads=2 if tiny else 8, decoder_attention_heads=2 if tiny else 8,
                               encoder_ffn_dim=64 if tiny else 1024, decoder_ffn_dim=64 if tiny else 1024,
                               num_queries=8 if tiny else 300, num_labels=91)
    model = DeformableDetrForObjectDetection(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    b, hw, k = (2, 64, 2) if tiny else (4, 640, 6)
    x = torch.randn(b, 3, hw, hw, device=dev)
    xy = torch.rand(b, k, 2, device=dev) * 0.5 + 0.25
    labels = [{"class_labels": torch.randint(0, 91, (k,), device=dev),
               "boxes": torch.cat([xy[i], torch.full((k, 2), 0.2, device=dev)], 1)} for i in range(b)]

    return _train_step(opt, dev, lambda: model(pixel_values=x, labels=labels).loss)


def maxvit_train_bf16(dev: str, tiny: bool, channels_last: bool = False):
    """timm maxvit_tiny_tf_224 (MBConv, then block and grid attention over 7 x 7 partitions in
    every stage) training step, bf16 autocast, AdamW, batch 64 at 224, NCHW."""
    import timm

    hw = 64 if tiny else 224
    model = timm.create_model("maxvit_tiny_tf_224", pretrained=False, img_size=hw).to(dev)
    x = torch.randn(2 if tiny else 64, 3, hw, hw, device=dev)
    return _adamw_classifier_step(*_channels_last(model, x, channels_last), 1000, dev)


def maxvit_train_bf16_cl(dev: str, tiny: bool):
    """maxvit_train_bf16 with model and images in channels_last (what layout_churn names)."""
    return maxvit_train_bf16(dev, tiny, channels_last=True)


def densenet121_train_bf16(dev: str, tiny: bool, channels_last: bool = False):
    """timm densenet121 (every layer's input the concatenation of all earlier ones in its block)
    training step, bf16 autocast, SGD, batch 64 at 224, NCHW."""
    import timm

    model = timm.create_model("densenet121", pretrained=False).to(dev)
    x = torch.randn(2 if tiny else 64, 3, 64 if tiny else 224, 64 if tiny else 224, device=dev)
    return _sgd_classifier_step(*_channels_last(model, x, channels_last), 1000, dev)


def densenet121_train_bf16_cl(dev: str, tiny: bool):
    """densenet121_train_bf16 with model and images in channels_last (what layout_churn names)."""
    return densenet121_train_bf16(dev, tiny, channels_last=True)


def autoformer_train_fp32(dev: str, tiny: bool):
    """Autoformer (time-series forecasting: series decomposition and FFT auto-correlation in
    place of attention; 64 wide, 2+1 layers) training step in fp32 (the dtype from_config gives),
    AdamW, 64 series of 7 variates, 192 steps of context, 96 predicted."""
    from transformers import AutoformerConfig, AutoformerForPrediction

    ctx, pred, nv = (16, 8, 2) if tiny else (192, 96, 7)
    cfg = AutoformerConfig(prediction_length=pred, context_length=ctx, input_size=nv, num_time_features=2,
                           d_model=16 if tiny else 64, encoder_layers=1 if tiny else 2, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2,
                           encoder_ffn_dim=32 if tiny else 256, decoder_ffn_dim=32 if tiny else 256)
    model = AutoformerForPrediction(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, past = (2 if tiny else 64), ctx + max(cfg.lags_sequence)
    inputs = dict(past_values=torch.randn(b, past, nv, device=dev), past_time_features=torch.randn(b, past, 2, device=dev),
                  past_observed_mask=torch.ones(b, past, nv, device=dev),
                  future_values=torch.randn(b, pred, nv, device=dev), future_time_features=torch.randn(b, pred, 2, device=dev))

    # fp32 as from_config gives: no autocast
    return _train_step(opt, dev, lambda: model(**inputs).loss, autocast=False)


def convnext_train_bf16(dev: str, tiny: bool, channels_last: bool = False):
    """timm convnext_tiny (7 x 7 depthwise convolutions, LayerNorm, no batch norm) training step,
    bf16 autocast, AdamW, batch 64 at 224, NCHW."""
    return _timm_adamw_step("convnext_tiny", dev, tiny, channels_last)


def _timm_adamw_step(name: str, dev: str, tiny: bool, channels_last: bool):
    """A timm classifier's AdamW training step on 64 random images at 224 (2 at 64 tiny), NCHW
    or, with `channels_last`, model and images in channels_last."""
    import timm

    hw = 64 if tiny else 224
    model = timm.create_model(name, pretrained=False).to(dev)
    x = torch.randn(2 if tiny else 64, 3, hw, hw, device=dev)
    return _adamw_classifier_step(*_channels_last(model, x, channels_last), 1000, dev)


def convnext_train_bf16_cl(dev: str, tiny: bool):
    """convnext_train_bf16 with model and images in channels_last (what layout_churn names)."""
    return convnext_train_bf16(dev, tiny, channels_last=True)


def nfnet_train_bf16(dev: str, tiny: bool, channels_last: bool = False):
    """timm nfnet_l0 (normalizer-free: weight-standardized convolutions, scaled activations,
    squeeze-excite; no batch norm) training step, bf16 autocast, SGD, batch 64 at 224, NCHW."""
    import timm

    model = timm.create_model("nfnet_l0", pretrained=False).to(dev)
    hw = 64 if tiny else 224
    x = torch.randn(2 if tiny else 64, 3, hw, hw, device=dev)
    return _sgd_classifier_step(*_channels_last(model, x, channels_last), 1000, dev)


def nfnet_train_bf16_cl(dev: str, tiny: bool):
    """nfnet_train_bf16 with model and images in channels_last (what layout_churn names)."""
    return nfnet_train_bf16(dev, tiny, channels_last=True)


def swinv2_train_bf16(dev: str, tiny: bool):
    """timm swinv2_tiny_window8_256 (cosine attention with a learned temperature, a continuous
    position-bias MLP) training step, bf16 autocast, AdamW, batch 64 at 256."""
    import timm

    hw = 64 if tiny else 256
    model = timm.create_model("swinv2_tiny_window8_256", pretrained=False, img_size=hw).to(dev)
    x = torch.randn(2 if tiny else 64, 3, hw, hw, device=dev)
    return _adamw_classifier_step(model, x, 1000, dev)


def bigbird_train_fp32(dev: str, tiny: bool):
    """BigBird (768 wide, 4 layers, block-sparse attention: 64-token blocks, 3 random blocks)
    masked-LM training step in fp32 (the dtype from_config gives; under bf16 autocast its
    block-sparse attention's scatter fails on mixed dtypes), AdamW, 4 x 4096 tokens (attention
    written as gathers and batched matmuls over blocks)."""
    from transformers import BigBirdConfig, BigBirdForMaskedLM

    s = 1024 if tiny else 4096
    cfg = BigBirdConfig(hidden_size=64 if tiny else 768, intermediate_size=128 if tiny else 3072,
                        num_hidden_layers=1 if tiny else 4, num_attention_heads=2 if tiny else 12,
                        attention_type="block_sparse", block_size=64, num_random_blocks=3,
                        vocab_size=1000 if tiny else 50358, max_position_embeddings=s)
    model = BigBirdForMaskedLM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, cfg.vocab_size, (1 if tiny else 4, s), device=dev)

    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=ids).loss, autocast=False)


def encodec_infer_fp32(dev: str, tiny: bool):
    """EnCodec 24 kHz (SEANet convolutions, a 2-layer LSTM, residual vector quantization at 6
    kbps: 8 codebooks) fp32 inference, encode and decode, 8 clips of 10 s, the dtype
    from_config gives."""
    from transformers import EncodecConfig, EncodecModel

    cfg = EncodecConfig()
    with torch.device(dev):
        model = EncodecModel(cfg).eval()
    x = torch.randn(1 if tiny else 8, 1, 24_000 if tiny else 240_000, device=dev)

    @torch.no_grad()
    def step():
        model(input_values=x)
    return step


def patchtst_train_fp32(dev: str, tiny: bool):
    """PatchTST (128 wide, 3 layers, channel-independent patches of 16 steps) forecasting training
    step in fp32, AdamW: 64 series of 21 variates, 512 steps of context, 96 predicted."""
    from transformers import PatchTSTConfig, PatchTSTForPrediction

    ctx, pred, nv = (64, 8, 3) if tiny else (512, 96, 21)
    cfg = PatchTSTConfig(num_input_channels=nv, context_length=ctx, prediction_length=pred, patch_length=16,
                         patch_stride=8, d_model=16 if tiny else 128, num_hidden_layers=1 if tiny else 3,
                         num_attention_heads=2 if tiny else 16, ffn_dim=32 if tiny else 256)
    model = PatchTSTForPrediction(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b = 2 if tiny else 64
    past, future = torch.randn(b, ctx, nv, device=dev), torch.randn(b, pred, nv, device=dev)

    # fp32, as from_config gives
    return _train_step(opt, dev, lambda: model(past_values=past, future_values=future).loss, autocast=False)


def qwen2_decode_16k(dev: str, tiny: bool):
    """Qwen2 (1536 wide, 4 layers, 12 query / 2 KV heads of 128) bf16 greedy decode at batch 1
    after a 16384-token prompt, 16 new tokens, eager SDPA, dynamic cache: long-context decode,
    the case split-KV attention is for (docs/split_kv.md)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    s = 64 if tiny else 16384
    cfg = Qwen2Config(hidden_size=64 if tiny else 1536, intermediate_size=128 if tiny else 8960,
                      num_hidden_layers=1 if tiny else 4, num_attention_heads=2 if tiny else 12,
                      num_key_value_heads=1 if tiny else 2, vocab_size=1000 if tiny else 151936,
                      max_position_embeddings=s + 64)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, s), device=dev)
    return _generate_step(model, 4 if tiny else 16, input_ids=ids)


def llama_decode_32k_static(dev: str, tiny: bool):
    """Llama (2048 wide, 2 layers, 32 query / 8 KV heads of 64) bf16 greedy decode at batch 2
    after 32768-token prompts, 8 new tokens, static cache (SDPA over the preallocated length)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    s = 64 if tiny else 32768
    cfg = LlamaConfig(hidden_size=64 if tiny else 2048, intermediate_size=128 if tiny else 5632,
                      num_hidden_layers=1 if tiny else 2, num_attention_heads=2 if tiny else 32,
                      num_key_value_heads=1 if tiny else 8, vocab_size=1000 if tiny else 32000,
                      max_position_embeddings=s + 64)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, s), device=dev)
    return _generate_step(model, 4 if tiny else 8, input_ids=ids, cache_implementation="static")


def bloom_generate_fp16(dev: str, tiny: bool):
    """BLOOM (1024 wide, 8 layers, 16 heads, ALiBi) fp16 greedy decode at batch 8: 256-token
    prompts, 32 new tokens (its attention is baddbmm + softmax + bmm, not SDPA)."""
    from transformers import BloomConfig, BloomForCausalLM

    cfg = BloomConfig(hidden_size=64 if tiny else 1024, n_layer=1 if tiny else 8, n_head=2 if tiny else 16,
                      vocab_size=1000 if tiny else 250880)
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = BloomForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (2 if tiny else 8, 16 if tiny else 256), device=dev)
    n = 4 if tiny else 32
    return _generate_step(model, n, input_ids=ids)


def esm_train_bf16(dev: str, tiny: bool):
    """ESM-2-style protein language model (640 wide, 8 layers, 20 heads, rotary) masked-LM
    training step, bf16 autocast, AdamW, 16 sequences of 512 residues (vocabulary 33)."""
    from transformers import EsmConfig, EsmForMaskedLM

    cfg = EsmConfig(hidden_size=64 if tiny else 640, num_hidden_layers=1 if tiny else 8,
                    num_attention_heads=2 if tiny else 20, intermediate_size=128 if tiny else 2560,
                    vocab_size=33, position_embedding_type="rotary", pad_token_id=1, mask_token_id=32,
                    max_position_embeddings=1026)
    model = EsmForMaskedLM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, s = (2, 16) if tiny else (16, 512)
    ids = torch.randint(4, 24, (b, s), device=dev)

    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=ids).loss)


def videomae_train_bf16(dev: str, tiny: bool):
    """VideoMAE (768 wide, 6 layers) video classification training step, bf16 autocast, AdamW:
    4 clips of 16 frames at 224 (tubelets of 2 x 16 x 16: 1568 tokens a clip)."""
    from transformers import VideoMAEConfig, VideoMAEForVideoClassification

    cfg = VideoMAEConfig(image_size=32 if tiny else 224, num_frames=4 if tiny else 16,
                         hidden_size=64 if tiny else 768, num_hidden_layers=1 if tiny else 6,
                         num_attention_heads=2 if tiny else 12, intermediate_size=128 if tiny else 3072,
                         num_labels=400)
    model = VideoMAEForVideoClassification(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(1 if tiny else 4, cfg.num_frames, 3, cfg.image_size, cfg.image_size, device=dev)
    labels = torch.randint(0, 400, (x.shape[0],), device=dev)

    return _train_step(opt, dev, lambda: model(pixel_values=x, labels=labels).loss)


def phi3_prefill_fp32(dev: str, tiny: bool):
    """Phi-3-style decoder (2048 wide, 4 layers, 32 heads) forward over 1 x 4096 tokens in fp32
    (the dtype a model built from its config gets when nobody asks for another)."""
    from transformers import Phi3Config, Phi3ForCausalLM

    cfg = Phi3Config(hidden_size=64 if tiny else 2048, intermediate_size=128 if tiny else 8192,
                     num_hidden_layers=1 if tiny else 4, num_attention_heads=2 if tiny else 32,
                     num_key_value_heads=2 if tiny else 32, vocab_size=1000 if tiny else 32064,
                     max_position_embeddings=4096, pad_token_id=0)
    with torch.device(dev):
        model = Phi3ForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 32 if tiny else 4096), device=dev)

    @torch.no_grad()
    def step():
        model(input_ids=ids, logits_to_keep=1)
    return step


def mobilevit_infer_fp16(dev: str, tiny: bool):
    """timm mobilevit_s inference, fp16, batch 32 at 256, NCHW (convolutions with small
    transformer blocks over unfolded patches)."""
    import timm

    dtype = torch.float32 if dev == "cpu" else torch.float16
    model = timm.create_model("mobilevit_xxs" if tiny else "mobilevit_s", pretrained=False).to(dev, dtype).eval()
    x = torch.randn(2 if tiny else 32, 3, 64 if tiny else 256, 64 if tiny else 256, device=dev, dtype=dtype)

    @torch.no_grad()
    def step():
        model(x)
    return step



def deepseek_v3_prefill_bf16(dev: str, tiny: bool):
    """DeepSeek-V3-style model from its transformers config (hidden 1024, 4 layers: 1 dense then 3
    MoE with 16 routed experts top 4 and a shared one; multi-head latent attention: q/kv LoRA
    ranks 384/256, qk head dim 64 + 32 rotary, v head dim 64, 16 heads) bf16 forward over
    2 x 2048 tokens."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        hidden_size=64 if tiny else 1024, intermediate_size=128 if tiny else 2816,
        moe_intermediate_size=32 if tiny else 512, num_hidden_layers=2 if tiny else 4,
        first_k_dense_replace=1, num_attention_heads=2 if tiny else 16, num_key_value_heads=2 if tiny else 16,
        n_routed_experts=4 if tiny else 16, num_experts_per_tok=2 if tiny else 4, n_shared_experts=1,
        n_group=1, topk_group=1, q_lora_rank=32 if tiny else 384, kv_lora_rank=16 if tiny else 256,
        qk_nope_head_dim=16 if tiny else 64, qk_rope_head_dim=8 if tiny else 32, v_head_dim=16 if tiny else 64,
        vocab_size=1000 if tiny else 32000, max_position_embeddings=4096)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = DeepseekV3ForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 32 if tiny else 2048), device=dev)
    return _prefill_step(model, ids)


def hubert_train_bf16(dev: str, tiny: bool, fix: str | None = None):
    """HuBERT-base (7 conv feature layers, 12 transformer layers, 768 wide) CTC fine-tuning step,
    bf16 autocast, AdamW, 8 clips of 10 s at 16 kHz. `fix="conv_fp32"`: the positional
    convolution (768 channels in 16 groups, kernel 128) run in fp32 outside autocast (what
    slow_convolution names), the model's output checked against the unpatched one first."""
    from transformers import HubertConfig, HubertForCTC

    cfg = HubertConfig(vocab_size=32, **(dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                              intermediate_size=64, conv_dim=(16,) * 7, num_conv_pos_embeddings=16)
                                         if tiny else {}))
    model = HubertForCTC(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, n = (2, 4000) if tiny else (8, 160000)
    x = torch.randn(b, n, device=dev)
    labels = torch.randint(1, cfg.vocab_size, (b, 8 if tiny else 120), device=dev)
    if fix == "conv_fp32":
        conv = model.hubert.encoder.pos_conv_embed.conv
        orig = conv.forward

        def conv_fp32(h):
            with torch.autocast(device_type=dev.split(":")[0], enabled=False):
                return orig(h.float()).to(h.dtype)

        model.eval()  # no dropout: the two passes must agree to rounding
        with torch.no_grad(), _autocast(dev, torch.bfloat16):
            ref = model(input_values=x).logits.float()
            conv.forward = conv_fp32
            got = model(input_values=x).logits.float()
        model.train()
        err = ((got - ref).norm() / ref.norm()).item()
        print(f"  hubert fix {fix}: logits rel. error {err:.1e} against bf16 autocast", flush=True)
        if not err <= 3e-2:  # bf16 autocast's own rounding through 12 layers
            raise AssertionError(f"hubert fix {fix}: rel. error {err:.1e}")
    elif fix is not None:
        raise ValueError(f"unknown HuBERT fix {fix!r}")
    return _train_step(opt, dev, lambda: model(input_values=x, labels=labels).loss)


def hubert_train_bf16_conv_fp32(dev: str, tiny: bool):
    """hubert_train_bf16 with its positional convolution in fp32 (slow_convolution's fix)."""
    return hubert_train_bf16(dev, tiny, fix="conv_fp32")


def pegasus_generate_fp16(dev: str, tiny: bool):
    """Pegasus (1024 wide, 6+6 layers, 16 heads, vocabulary 96,103) fp16 greedy summarisation:
    8 inputs of 1024 tokens, 32 new tokens."""
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    cfg = PegasusConfig(d_model=64 if tiny else 1024, encoder_layers=1 if tiny else 6, decoder_layers=1 if tiny else 6,
                        encoder_attention_heads=2 if tiny else 16, decoder_attention_heads=2 if tiny else 16,
                        encoder_ffn_dim=128 if tiny else 4096, decoder_ffn_dim=128 if tiny else 4096,
                        vocab_size=1000 if tiny else 96103, max_position_embeddings=1024)
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = PegasusForConditionalGeneration(cfg).to(dtype).eval()
    ids = torch.randint(2, cfg.vocab_size, (2 if tiny else 8, 16 if tiny else 1024), device=dev)
    return _generate_step(model, 4 if tiny else 32, input_ids=ids)


def informer_train_fp32(dev: str, tiny: bool):
    """Informer (ProbSparse self-attention, distilling convolutions; d_model 512, 2+1 layers) time
    series training step in fp32 (its default), batch 32, context 336 + 48 lags, 96 predicted
    steps, 7 series dimensions as one multivariate input."""
    from transformers import InformerConfig, InformerForPrediction

    ctx_len, pred = (24, 8) if tiny else (336, 96)
    cfg = InformerConfig(prediction_length=pred, context_length=ctx_len, input_size=7, lags_sequence=[1, 2, 3],
                         num_time_features=1, d_model=32 if tiny else 512, encoder_layers=1 if tiny else 2,
                         decoder_layers=1, encoder_attention_heads=2 if tiny else 8,
                         decoder_attention_heads=2 if tiny else 8, encoder_ffn_dim=64 if tiny else 2048,
                         decoder_ffn_dim=64 if tiny else 2048)
    model = InformerForPrediction(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, past = 4 if tiny else 32, ctx_len + max(cfg.lags_sequence)
    batch = dict(past_values=torch.randn(b, past, 7, device=dev), past_time_features=torch.randn(b, past, 1, device=dev),
                 past_observed_mask=torch.ones(b, past, 7, device=dev),
                 future_values=torch.randn(b, pred, 7, device=dev), future_time_features=torch.randn(b, pred, 1, device=dev))

    return _train_step(opt, dev, lambda: model(**batch).loss, autocast=False)


def jamba_prefill_bf16(dev: str, tiny: bool):
    """Jamba-style hybrid (hidden 1024, 8 layers: Mamba mixers with one attention layer in 4, MoE
    MLPs every other layer, 8 experts top 2) bf16 forward over 2 x 1024 tokens, with transformers'
    own Mamba path (no mamba-ssm kernels installed, as on a fresh machine)."""
    from transformers import JambaConfig, JambaForCausalLM

    cfg = JambaConfig(hidden_size=64 if tiny else 1024, intermediate_size=128 if tiny else 2816,
                      num_hidden_layers=4 if tiny else 8, num_attention_heads=2 if tiny else 16,
                      num_key_value_heads=2 if tiny else 8, num_experts=4 if tiny else 8, num_experts_per_tok=2,
                      attn_layer_period=4, attn_layer_offset=2, expert_layer_period=2, expert_layer_offset=1,
                      mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, use_mamba_kernels=False,
                      vocab_size=1000 if tiny else 32000)
    dtype = torch.float32 if dev == "cpu" else torch.bfloat16
    with torch.device(dev):
        model = JambaForCausalLM(cfg).to(dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 32 if tiny else 1024), device=dev)
    return _prefill_step(model, ids)


def ast_infer_fp16(dev: str, tiny: bool):
    """Audio Spectrogram Transformer (ViT-B on 128 mel bins x 1024 frames, 16 x 16 patches with
    stride 10: 1,212 tokens) fp16 classification, batch 16."""
    from transformers import ASTConfig, ASTForAudioClassification

    cfg = ASTConfig(**(dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                            max_length=64, num_mel_bins=32) if tiny else {}))
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = ASTForAudioClassification(cfg).to(dtype).eval()
    x = torch.randn(2 if tiny else 16, cfg.max_length, cfg.num_mel_bins, device=dev, dtype=dtype)

    @torch.no_grad()
    def step():
        model(input_values=x)
    return step


# A seventeenth set (2026-12-04, session 14): convolutions the slow_convolution rule was not
# measured on (depthwise 1-D, stacked positional, grouped pointwise, depthwise 2-D), LSH
# attention, and a speech encoder-decoder generating.

def _ctc_audio_step(model, dev: str, tiny: bool, vocab: int):
    """A CTC fine-tuning step of a speech encoder on 8 clips of 10 s at 16 kHz (2 of 0.25 s
    tiny), bf16 autocast, AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, n = (2, 4000) if tiny else (8, 160000)
    x = torch.randn(b, n, device=dev)
    labels = torch.randint(1, vocab, (b, 8 if tiny else 120), device=dev)
    return _train_step(opt, dev, lambda: model(input_values=x, labels=labels).loss)


_TINY_AUDIO = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                   conv_dim=(16,) * 7, num_conv_pos_embeddings=16)


def wav2vec2_conformer_train_bf16(dev: str, tiny: bool):
    """Wav2Vec2-Conformer (12 conformer layers, 768 wide: relative-position attention and a
    depthwise 1-D convolution of kernel 31 a layer) CTC training step, bf16 autocast."""
    from transformers import Wav2Vec2ConformerConfig, Wav2Vec2ConformerForCTC

    cfg = Wav2Vec2ConformerConfig(vocab_size=32, **(dict(_TINY_AUDIO, conv_depthwise_kernel_size=7) if tiny else {}))
    return _ctc_audio_step(Wav2Vec2ConformerForCTC(cfg).to(dev), dev, tiny, cfg.vocab_size)


def data2vec_audio_train_bf16(dev: str, tiny: bool):
    """Data2Vec-Audio base (12 layers, 768 wide; its positional embedding is 5 stacked grouped
    1-D convolutions, 16 groups of 48 channels, kernel 19) CTC training step, bf16 autocast."""
    from transformers import Data2VecAudioConfig, Data2VecAudioForCTC

    tiny_cfg = dict(_TINY_AUDIO, num_conv_pos_embeddings=2, conv_pos_kernel_size=5, num_conv_pos_embedding_groups=2)
    cfg = Data2VecAudioConfig(vocab_size=32, **(tiny_cfg if tiny else {}))
    return _ctc_audio_step(Data2VecAudioForCTC(cfg).to(dev), dev, tiny, cfg.vocab_size)


def _grouped_pointwise_as_gemm(conv):
    """A grouped 1 x 1 Conv1d's forward as one batched matmul over its groups (an einsum: bmm on
    the tensor cores under autocast), for squeezebert_train_bf16_conv_gemm."""
    g, (K, cg, _) = conv.groups, conv.weight.shape

    def forward(x):
        B, _, L = x.shape
        y = torch.einsum("gkc,bgcl->bgkl", conv.weight.view(g, K // g, cg), x.view(B, g, cg, L)).reshape(B, K, L)
        return y if conv.bias is None else y + conv.bias.view(1, K, 1).to(y.dtype)
    return forward


def _conv_fp32(conv, dev: str):
    """A convolution's forward in fp32 outside autocast, its output cast back (slow_convolution's fix)."""
    orig = conv.forward

    def forward(x):
        with torch.autocast(device_type=dev.split(":")[0], enabled=False):
            return orig(x.float()).to(x.dtype)
    return forward


def squeezebert_train_bf16(dev: str, tiny: bool, fix: str | None = None):
    """SqueezeBERT (12 layers, 768 wide; Q, K, V and the feed-forward are grouped 1 x 1 1-D
    convolutions, 4 groups) sequence-classification training step, bf16 autocast, AdamW,
    32 x 512 tokens. `fix`: its grouped convolutions in fp32 outside autocast ("conv_fp32") or
    as one batched matmul a layer ("conv_gemm"), the logits checked against the unpatched
    model's first."""
    from transformers import SqueezeBertConfig, SqueezeBertForSequenceClassification

    cfg = SqueezeBertConfig(**(dict(hidden_size=32, embedding_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=64, vocab_size=1000) if tiny else {}))
    model = SqueezeBertForSequenceClassification(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, s = (2, 16) if tiny else (32, 512)
    ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)
    labels = torch.randint(0, 2, (b,), device=dev)
    if fix is not None:
        if fix not in ("conv_fp32", "conv_gemm"):
            raise ValueError(f"unknown SqueezeBERT fix {fix!r}")
        convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv1d) and m.groups > 1]
        model.eval()  # no dropout: the two passes must agree to rounding
        with torch.no_grad(), _autocast(dev, torch.bfloat16):
            ref = model(input_ids=ids).logits.float()
            for m in convs:
                m.forward = _conv_fp32(m, dev) if fix == "conv_fp32" else _grouped_pointwise_as_gemm(m)
            got = model(input_ids=ids).logits.float()
        model.train()
        err = ((got - ref).norm() / ref.norm()).item()
        print(f"  squeezebert fix {fix} on {len(convs)} convolutions: logits rel. error {err:.1e}", flush=True)
        if not (convs and err <= 3e-2):  # bf16 autocast's own rounding through 12 layers
            raise AssertionError(f"squeezebert fix {fix}: {len(convs)} convolutions, rel. error {err:.1e}")
    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=labels).loss)


def squeezebert_train_bf16_conv_fp32(dev: str, tiny: bool):
    """squeezebert_train_bf16 with its grouped convolutions in fp32 (slow_convolution's fix)."""
    return squeezebert_train_bf16(dev, tiny, fix="conv_fp32")


def squeezebert_train_bf16_conv_gemm(dev: str, tiny: bool):
    """squeezebert_train_bf16 with its grouped 1 x 1 convolutions as batched matmuls in bf16."""
    return squeezebert_train_bf16(dev, tiny, fix="conv_gemm")


def reformer_lm_train_bf16(dev: str, tiny: bool):
    """Reformer (6 reversible layers, 256 wide, local and LSH self-attention alternating, axial
    positions 64 x 64) causal language-model training step on 8 x 4096 tokens, bf16 autocast,
    AdamW."""
    from transformers import ReformerConfig, ReformerModelWithLMHead

    shape = (4, 8) if tiny else (64, 64)
    cfg = ReformerConfig(is_decoder=True, axial_pos_shape=shape, max_position_embeddings=shape[0] * shape[1],
                         num_buckets=4 if tiny else None, lsh_attn_chunk_length=8 if tiny else 64,
                         local_attn_chunk_length=8 if tiny else 64, vocab_size=320)
    model = ReformerModelWithLMHead(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (2 if tiny else 8, shape[0] * shape[1]), device=dev)
    return _train_step(opt, dev, lambda: model(input_ids=ids, labels=ids).loss)


def convmixer_train_bf16(dev: str, tiny: bool, channels_last: bool = False):
    """timm convmixer_768_32 (7 x 7 patches, 32 blocks of a 7 x 7 depthwise and a 1 x 1
    convolution, batch norm, 768 channels at 32 x 32) training step, bf16 autocast, AdamW,
    batch 64 at 224, NCHW."""
    return _timm_adamw_step("convmixer_768_32", dev, tiny, channels_last)


def convmixer_train_bf16_cl(dev: str, tiny: bool):
    """convmixer_train_bf16 with model and images in channels_last (what layout_churn names)."""
    return convmixer_train_bf16(dev, tiny, channels_last=True)


def speech2text_generate_fp16(dev: str, tiny: bool):
    """Speech2Text (2 strided 1-D convolutions, 12 encoder and 6 decoder layers, 256 wide) fp16
    greedy transcription of 8 utterances of 30 s (3,000 frames of 80 filter banks), 64 tokens."""
    from transformers import Speech2TextConfig, Speech2TextForConditionalGeneration

    cfg = Speech2TextConfig(**(dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                    decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                    vocab_size=1000) if tiny else {}))
    dtype = torch.float32 if dev == "cpu" else torch.float16
    with torch.device(dev):
        model = Speech2TextForConditionalGeneration(cfg).to(dtype).eval()
    feats = torch.randn(2 if tiny else 8, 64 if tiny else 3000, cfg.input_feat_per_channel, device=dev, dtype=dtype)
    return _generate_step(model, 4 if tiny else 64, input_features=feats)

MODELS = {f.__name__: f for f in (t5_train, t5_train_contiguous_mask, t5_train_padded, t5_train_padded_compiled_mask, t5_train_padded_bf16_math,
                                  t5_train_padded_contiguous_mask, beit_infer_fp16, umt5_encode_padded,
                                  umt5_encode_padded_compiled_mask, umt5_encode_padded_bf16_math,
                                  umt5_encode_padded_contiguous_mask, coatnet_train_bf16, vitdet_infer_fp16,
                                  vitdet_infer_fp16_sdpa_eager_bias, vitdet_infer_fp16_sdpa_compiled_bias,
                                  modernbert_train_bf16, olmoe_decode_bf16, siglip_train_bf16, vit_train, whisper_generate, gemma_prefill, convnext_infer,
                                  distilbert_b1, bert_train_fp32, mixtral_moe, llama_generate, resnet50_train,
                                  qwen2_prefill, mobilenet_b8, bert_train_fp32_tf32, resnet50_train_cl,
                                  mobilenet_b8_graph, gpt2_compile_train, swin_infer, opt_generate_b16,
                                  efficientnet_train_cl, deberta_infer_fp16, swin_infer_sdpa,
                                  gpt2_eager_train, gpt2_sdpa_train, wav2vec2_train_fp32, bart_beam_generate,
                                  clip_infer_fp16, mamba_prefill, llama_train_bf16_ckpt, wav2vec2_train_tf32,
                                  wav2vec2_train_cudnn_bench, clip_infer_fp16_cl, lstm_lm_train, lstm_lm_train_tf32, lstm_lm_train_graph,
                                  lstm_lm_train_tf32_graph, dlrm_train, dlrm_train_tf32, gnn_train, grouped_mm_moe,
                                  pageable_feed_train,
                                  flex_attention_train, segformer_infer_fp16, fp8_mlp, poolformer_infer_fp16,
                                  resnetv2_bit_train, dpt_depth_infer_fp16, upernet_convnext_infer_fp16,
                                  mistral_generate_b4, bloom_generate_fp16, esm_train_bf16,
                                  videomae_train_bf16, phi3_prefill_fp32, mobilevit_infer_fp16,
                                  mistral_decode_dynamic, mistral_decode_static, mistral_decode_grouped,
                                  mistral_decode_static_grouped, llama_decode_dynamic, llama_decode_static,
                                  falcon_decode_mqa, falcon_decode_mqa_gqa, t5_beam_generate, gpt_neox_train_bf16, qwen2_moe_decode,
                                  regnety_train_bf16, dinov2_reg_infer_fp16, llama_decode_static_b1,
                                  llama_decode_eager, gemma2_decode, detr_train, longformer_train_bf16,
                                  resnet18_b1_fp32, sam_vision_infer_fp16, sam_vision_infer_fp16_compiled_helper,
                                  sam_vision_infer_fp16_compiled_bias, sam_vision_infer_fp16_compiled_attention,
                                  sam_vision_infer_fp16_channels, eva02_train_bf16,
                                  xlnet_train_bf16, rwkv_generate_fp16, recurrent_gemma_generate_bf16,
                                  deformable_detr_train, maxvit_train_bf16, densenet121_train_bf16,
                                  autoformer_train_fp32, maxvit_train_bf16_cl, densenet121_train_bf16_cl,
                                  recurrent_gemma_prefill_bf16, mamba_prefill_short, convnext_train_bf16,
                                  convnext_train_bf16_cl, nfnet_train_bf16, nfnet_train_bf16_cl, swinv2_train_bf16, bigbird_train_fp32,
                                  encodec_infer_fp32, patchtst_train_fp32, qwen2_decode_16k, llama_decode_32k_static,
                                  deepseek_v3_prefill_bf16, hubert_train_bf16, hubert_train_bf16_conv_fp32, pegasus_generate_fp16,
                                  informer_train_fp32, jamba_prefill_bf16, ast_infer_fp16,
                                  wav2vec2_conformer_train_bf16, data2vec_audio_train_bf16, squeezebert_train_bf16,
                                  reformer_lm_train_bf16, convmixer_train_bf16, speech2text_generate_fp16,
                                  squeezebert_train_bf16_conv_fp32, squeezebert_train_bf16_conv_gemm,
                                  convmixer_train_bf16_cl)}
# the seventh set's fixes (slow_memory_bound_kernel: torch.compile), timed against the originals
MODELS.update({f"{n}_compiled": _compiled(MODELS[n])
               for n in ("poolformer_infer_fp16", "dpt_depth_infer_fp16", "upernet_convnext_infer_fp16")})


def _sync(dev: str):
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def run(name: str, dev: str, tiny: bool, out: Path, steps: int, warmup: int, nsys: bool = False,
        time_only: bool = False) -> dict:
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    step = MODELS[name](dev, tiny)
    for _ in range(warmup):
        step()
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(dev)
    step_ms = (time.perf_counter() - t0) * 1e3 / steps
    if time_only:
        return {"model": name, "step_ms": round(step_ms, 3), "steps": steps, "time_only": True}
    if nsys:  # under `nsys profile --capture-range=cudaProfilerApi`: NVTX ranges carry the shapes
        with torch.autograd.profiler.emit_nvtx(record_shapes=True):
            torch.cuda.profiler.start()
            with torch.cuda.nvtx.range(f"holdout {name}"):
                for _ in range(steps):
                    step()
                _sync(dev)
            torch.cuda.profiler.stop()
        return {"model": name, "step_ms": round(step_ms, 3), "nsys": True}
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.startswith("cuda") else [])
    with profile(activities=acts, record_shapes=True) as prof:
        with record_function(f"holdout {name}"):
            for _ in range(steps):
                step()
            _sync(dev)
    path = export_gz(prof, out / f"holdout_{name}.kineto.json")
    return {"model": name, "step_ms": round(step_ms, 3), "steps": steps, "file": path.name,
            "bytes": path.stat().st_size}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help=f"'all' or any of: {', '.join(MODELS)}")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small configs, for a smoke run on the CPU")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--time-only", action="store_true", help="time --steps steps without a profiler, write no trace")
    ap.add_argument("--nsys", action="store_true",
                    help="profile for Nsight Systems instead (run under nsys --capture-range=cudaProfilerApi)")
    args = ap.parse_args(argv)
    names = list(MODELS) if args.models == ["all"] else args.models
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model {unknown[0]} (known: {', '.join(MODELS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    versions = {"torch": torch.__version__}
    for mod in ("transformers", "timm"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            pass
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    failed = 0
    for n in names:
        try:
            row = run(n, args.device, args.tiny, args.out, args.steps, args.warmup, args.nsys, args.time_only)
        except Exception:  # one model's failure must not cost the others' traces
            failed += 1
            traceback.print_exc()
            row = {"model": n, "error": traceback.format_exc(limit=1).strip().splitlines()[-1]}
        row.update(device=device, versions=versions, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        print(json.dumps(row), flush=True)
        with open(args.out / "holdout.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return 1 if failed == len(names) else 0


if __name__ == "__main__":
    sys.exit(main())
