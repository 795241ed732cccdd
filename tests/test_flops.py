"""The analytic FLOP model against torch's FlopCounterMode, and the parameter counts.

Every measured count must equal the analytic *executed* count (the acceptance bar is 0.5%; the
model is exact), with eager attention and with CPU SDPA through the registered formulas.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from transformers import (
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    Qwen2ForTokenClassification,
    Qwen2Model,
)

from race.flops import analytic as F
from race.flops import known_configs
from race.flops.counter import (
    CUDA_SDPA_BACKWARD,
    CUDA_SDPA_FORWARD,
    count_flops,
    cuda_sdpa_formulas,
    measure_forward,
    measure_generate,
    measure_train_step,
    register_cpu_sdpa_formulas,
    sdpa_backward_flops,
    sdpa_forward_flops,
)
from race.policy.ladder import count_parameters, ladder_config

warnings.filterwarnings("ignore", message=".*gradient checkpointing.*")

# Tiny architectures covering the corners: a single KV head with odd widths, an untied head,
# plain multi-head attention in one layer, an explicit head_dim != hidden / heads, a ladder rung.
CONFIGS: dict[str, dict] = {
    "kv1_odd": dict(hidden_size=48, intermediate_size=100, num_hidden_layers=2,
                    num_attention_heads=3, num_key_value_heads=1, vocab_size=50,
                    tie_word_embeddings=True),
    "untied": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
                   tie_word_embeddings=False),
    "mha_1layer": dict(hidden_size=32, intermediate_size=80, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, vocab_size=20,
                       tie_word_embeddings=True),
    "head_dim12": dict(hidden_size=40, intermediate_size=72, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=12, vocab_size=33,
                       tie_word_embeddings=False),
    "nano": ladder_config("nano", 64).to_dict(),
}
#: Non-power-of-two sequence lengths, one per config.
LENGTHS = {"kv1_odd": 13, "untied": 37, "mha_1layer": 13, "head_dim12": 19, "nano": 37}
IMPLS = ("eager", "sdpa")
EXECUTED = {"eager": "full", "sdpa": "sdpa"}
LORA_TARGET_SETS = {
    "all": F.ALL_PROJECTIONS,
    "qv": ("q_proj", "v_proj"),
    "mlp": F.MLP_PROJECTIONS,  # nothing below layer 0's MLP is differentiated
}
BATCH = 2
CASES = [(name, impl) for name in CONFIGS for impl in IMPLS]


def _config(name: str, impl: str, **extra) -> Qwen2Config:
    values = {k: v for k, v in CONFIGS[name].items()
              if k not in ("pad_token_id", "bos_token_id", "eos_token_id")}
    values.update(pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)
    cfg = Qwen2Config.from_dict(values)
    cfg._attn_implementation = impl
    return cfg


def _model(name: str, impl: str, cls=Qwen2ForCausalLM, **extra):
    torch.manual_seed(0)
    return cls(_config(name, impl, **extra))


def _arch(name: str) -> F.Arch:
    return F.Arch.from_config(_config(name, "eager"))


def _ids(name: str, length: int, batch: int = BATCH) -> torch.Tensor:
    vocab = CONFIGS[name]["vocab_size"]
    return torch.randint(3, vocab, (batch, length))  # no pad / bos / eos ids inside


def _lora_model(name: str, impl: str, targets: tuple[str, ...], rank: int = 4):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(_model(name, impl),
                          LoraConfig(r=rank, lora_alpha=8, target_modules=list(targets),
                                     lora_dropout=0.0))


def _same(measured: int, analytic: int) -> None:
    assert abs(measured - analytic) <= 0.005 * analytic, (measured, analytic)
    assert measured == analytic, f"measured/analytic = {measured / analytic:.6f}"


# --------------------------------------------------------------------------- measured = analytic


@pytest.mark.parametrize("name,impl", CASES)
def test_forward_matches_counter(name, impl):
    model, n = _model(name, impl).eval(), LENGTHS[name]
    arch, att = _arch(name), EXECUTED[impl]
    _same(measure_forward(model, _ids(name, n)),
          BATCH * F.forward_flops(arch, n, attention=att))
    # logits_to_keep: the LM head runs on the last 5 positions only.
    _same(measure_forward(model, _ids(name, n), logits_to_keep=5),
          BATCH * F.forward_flops(arch, n, logits=5, attention=att))


@pytest.mark.parametrize("name,impl", CASES)
def test_full_finetune_matches_counter(name, impl):
    model, n = _model(name, impl).train(), LENGTHS[name]
    arch, att = _arch(name), EXECUTED[impl]
    _same(measure_train_step(model, _ids(name, n)), BATCH * F.train_flops(arch, n, attention=att))
    _same(measure_train_step(model, _ids(name, n), logits_to_keep=4, loss="sum"),
          BATCH * F.train_flops(arch, n, logits=4, attention=att))


@pytest.mark.parametrize("targets", list(LORA_TARGET_SETS))
@pytest.mark.parametrize("name,impl", CASES)
def test_lora_matches_counter(name, impl, targets):
    model, n = _lora_model(name, impl, LORA_TARGET_SETS[targets]).train(), LENGTHS[name]
    lora = F.LoraSpec(4, LORA_TARGET_SETS[targets])
    _same(measure_train_step(model, _ids(name, n)),
          BATCH * F.train_flops(_arch(name), n, lora=lora, attention=EXECUTED[impl]))


@pytest.mark.parametrize("name,impl", CASES)
def test_generate_matches_counter(name, impl):
    model, prompt, new = _model(name, impl).eval(), LENGTHS[name], 5
    measured, width = measure_generate(model, _ids(name, prompt), new)
    assert width == new
    _same(measured, BATCH * F.generate_flops(_arch(name), prompt, new, executed=True))


@pytest.mark.parametrize("impl", IMPLS)
def test_generate_left_padded_batch(impl):
    """Left padding: every row prefills the padded width and decodes over padded context."""
    name = "kv1_odd"
    model = _model(name, impl).eval()
    ids = _ids(name, 11)
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 0, 0  # row 1 has a 7-token prompt
    measured, width = measure_generate(model, ids, 6, attention_mask=mask)
    arch = _arch(name)
    executed = F.batch_generate_flops(arch, [11, 7], [6, 6], executed=True,
                                      padded_prompt_len=11, generated_width=width)
    _same(measured, executed)
    model_flops = F.batch_generate_flops(arch, [11, 7], [6, 6])
    assert model_flops < executed


@pytest.mark.parametrize("name,impl", CASES)
def test_reward_models_match_counter(name, impl):
    n, arch, att = LENGTHS[name], _arch(name), EXECUTED[impl]
    token = _model(name, impl, Qwen2ForTokenClassification, num_labels=3).eval()
    _same(measure_forward(token, _ids(name, n)),
          BATCH * F.reward_model_flops(arch, n, head="token", num_labels=3, attention=att))
    # Sequence classification scores every position, then pools the last non-pad one.
    seq = _model(name, impl, Qwen2ForSequenceClassification, num_labels=1).eval()
    _same(measure_forward(seq, _ids(name, n)),
          BATCH * F.reward_model_flops(arch, n, head="sequence", num_labels=1, attention=att))


def test_prm_mlp_head_matches_counter():
    name, n = "untied", 13
    cfg = _config(name, "eager")
    backbone = Qwen2Model(cfg).eval()
    d = cfg.hidden_size
    head = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, 2))
    with torch.no_grad(), count_flops() as fc:
        head(backbone(input_ids=_ids(name, n)).last_hidden_state)
    _same(fc.total, BATCH * F.reward_model_flops(_arch(name), n, head="prm_mlp",
                                                 attention="full"))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("targets", [None, "mlp", "qv"])
def test_gradient_checkpointing_matches_counter(impl, targets):
    """transformers 5.24 checkpointing: the embedding output requires grad (so LoRA
    differentiates every layer), and the recompute stops before each layer's last matmul."""
    name, n = "kv1_odd", 13
    lora = None if targets is None else F.LoraSpec(4, LORA_TARGET_SETS[targets])
    model = _model(name, impl) if lora is None else _lora_model(name, impl, lora.targets)
    model.gradient_checkpointing_enable()
    model.train()
    seen = {}
    hook = model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: seen.update(requires_grad=out.requires_grad))
    measured = measure_train_step(model, _ids(name, n))
    hook.remove()
    assert seen["requires_grad"]
    _same(measured, BATCH * F.train_flops(_arch(name), n, lora=lora, grad_ckpt=True,
                                          attention=EXECUTED[impl]))


@pytest.mark.parametrize("impl", IMPLS)
def test_batch_forward_right_padded(impl):
    name = "untied"
    model = _model(name, impl).eval()
    ids = _ids(name, 13)
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0  # row 0 has 9 real tokens
    arch = _arch(name)
    executed = F.batch_forward_flops(arch, [9, 13], executed=True, attn_implementation=impl)
    _same(measure_forward(model, ids, attention_mask=mask), executed)
    assert F.batch_forward_flops(arch, [9, 13]) < executed


def test_sdpa_formulas_registered_idempotently():
    from torch.utils import flop_counter

    register_cpu_sdpa_formulas()
    register_cpu_sdpa_formulas()
    for op in (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
               torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward):
        assert op in flop_counter.flop_registry
    q = torch.randn(1, 4, 7, 8, requires_grad=True)
    k = torch.randn(1, 2, 7, 8, requires_grad=True)
    v = torch.randn(1, 2, 7, 8, requires_grad=True)
    with count_flops() as fc:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True).sum().backward()
    block = 2 * 4 * 7 * 7 * 8  # one (7x8)@(8x7) matmul per query head
    assert fc.total == 2 * block + 5 * block


def test_cuda_sdpa_kernels_count_a_gqa_call_as_the_expanded_one():
    """The flash, memory-efficient and cuDNN kernels (forward and backward), called as
    transformers calls them for Qwen2.5-0.5B (14 query heads, 2 KV heads), through the mapping
    count_flops hands FlopCounterMode: the count of the same call with expanded KV heads, the
    CPU kernels' count, and torch's own formula on the expanded shapes."""
    from torch.utils import flop_counter

    mode = flop_counter.FlopCounterMode(display=False, custom_mapping=cuda_sdpa_formulas())
    assert set(cuda_sdpa_formulas()) == set(CUDA_SDPA_FORWARD + CUDA_SDPA_BACKWARD)
    b, h_q, h_kv, s_q, s_k, d = 2, 14, 2, 9, 11, 64

    def meta(*shape):
        return torch.empty(*shape, device="meta")

    q, k, v, grad = meta(b, h_q, s_q, d), meta(b, h_kv, s_k, d), meta(b, h_kv, s_k, d), \
        meta(b, h_q, s_q, d)
    k_x, v_x = (b, h_q, s_k, d), (b, h_q, s_k, d)  # the expanded heads
    forward = flop_counter.sdpa_flop_count(q.shape, k_x, v_x)
    backward = flop_counter.sdpa_backward_flop_count(grad.shape, q.shape, k_x, v_x)
    assert forward == 2 * (2 * b * h_q * s_q * s_k * d)
    assert backward == 5 * (2 * b * h_q * s_q * s_k * d)
    for op in CUDA_SDPA_FORWARD:
        assert mode.flop_registry[op](q, k, v, 0.0, True, out_val=None) == forward
    for op in CUDA_SDPA_BACKWARD:
        assert mode.flop_registry[op](grad, q, k, v, out_val=None) == backward
    assert sdpa_forward_flops(q.shape, k.shape, v.shape) == sdpa_forward_flops(
        q.shape, k_x, v_x) == forward
    assert sdpa_backward_flops(grad.shape, q.shape, k.shape, v.shape) == backward
    with pytest.raises(ValueError, match="not a multiple of key/value heads"):
        sdpa_forward_flops(q.shape, (b, 3, s_k, d), (b, 3, s_k, d))


ADDMM_M, ADDMM_K, ADDMM_N = 3, 5, 7


def test_addmm_counts_the_product():
    """``torch.addmm(bias, a, b)`` and TRL's in-place ``acc.addmm_(a, b)``: 2·m·k·n each."""
    m, k, n = ADDMM_M, ADDMM_K, ADDMM_N
    a, b, bias = torch.randn(m, k), torch.randn(k, n), torch.randn(n)
    with count_flops() as fc:
        torch.addmm(bias, a, b)
    assert fc.total == 2 * m * k * n
    assert fc.by_op == {"aten.addmm": 2 * m * k * n}
    acc = torch.zeros(m, n)
    with count_flops() as fc:
        acc.addmm_(a, b)
    assert fc.total == 2 * m * k * n


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_addmm_with_out_dtype_counts_the_product(device):
    """TRL 1.16's chunked log-prob head in bf16 on CUDA: ``torch.addmm(acc, a, b,
    out_dtype=torch.float32, out=acc)`` (``aten.addmm.dtype_out``). Torch's own addmm formula
    takes the positional ``out_dtype`` for its ``out_shape`` and raises TypeError; count_flops
    maps the packet to a formula that takes it. The meta device has a kernel for this overload
    on every build, so the dispatch is exercised even where the CPU rejects it."""
    m, k, n = ADDMM_M, ADDMM_K, ADDMM_N
    a = torch.randn(m, k, dtype=torch.bfloat16).to(device)
    b = torch.randn(k, n, dtype=torch.bfloat16).to(device)
    acc = torch.zeros(m, n, dtype=torch.float32, device=device)
    try:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    except (NotImplementedError, RuntimeError) as err:
        pytest.skip(f"torch {torch.__version__} has no {device} kernel for addmm's out_dtype "
                    f"({type(err).__name__})")
    with count_flops() as fc:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    assert fc.total == 2 * m * k * n
    assert fc.by_op == {"aten.addmm": 2 * m * k * n}


# --------------------------------------------------------------------------- the model's algebra


def test_executed_minus_model_is_the_causal_triangle():
    arch, t = _arch("kv1_odd"), 37
    diff = F.forward_flops(arch, t, attention="full") - F.forward_flops(arch, t)
    assert diff == 4 * arch.layers * arch.heads * arch.head_dim * (t * t - t * (t + 1) // 2)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_model_flops_never_exceed_executed(name):
    arch, n, lora = _arch(name), LENGTHS[name], F.LoraSpec(8, ("q_proj", "v_proj"))
    for att in ("full", "sdpa"):
        assert F.forward_flops(arch, n) <= F.forward_flops(arch, n, attention=att)
        assert F.train_flops(arch, n, lora=lora) <= F.train_flops(arch, n, lora=lora,
                                                                  attention=att)
    assert (F.generate_flops(arch, 9, 4)
            <= F.generate_flops(arch, 9, 4, executed=True, padded_prompt_len=12, decode_steps=5))


def test_full_finetune_is_three_forwards():
    arch = _arch("untied")
    fwd = F.forward_flops(arch, 37)
    assert F.backward_flops(arch, 37) == 2 * fwd
    assert F.train_flops(arch, 37) == 3 * fwd


def test_lora_forward_adds_adapter_matmuls():
    arch, lora = _arch("kv1_odd"), F.LoraSpec(4, ("q_proj", "down_proj"))
    extra = arch.layers * 2 * 4 * ((48 + 48) + (100 + 48))
    assert F.forward_flops(arch, 1, lora=lora) - F.forward_flops(arch, 1) == extra


def test_mlp_only_lora_skips_the_bottom():
    """The first layer's attention and q/k/v are below every MLP adapter: no gradients there,
    so the backward is well under 2x the forward (docs/design.md: 21% off for MLP-only)."""
    arch, lora = _arch("nano"), F.LoraSpec(8, F.MLP_PROJECTIONS)
    below = F.backward_flops(arch, 64, lora=lora)
    rooted = F.backward_flops(arch, 64, lora=lora, inputs_require_grad=True)
    assert below < rooted
    assert below < 2 * F.forward_flops(arch, 64, lora=lora)


def test_generate_counts_prefill_and_decodes():
    arch = _arch("kv1_odd")
    prefill = F.forward_flops(arch, 10, logits=1)
    decodes = sum(F.decode_token_flops(arch, 10 + j) for j in (1, 2, 3))
    assert F.generate_flops(arch, 10, 4) == prefill + decodes
    assert F.generate_flops(arch, 10, 1) == prefill
    assert F.generate_flops(arch, 10, 0) == 0


def test_batch_helpers_sum_rows():
    arch = _arch("kv1_odd")
    rows = [(5, 2), (9, 3)]
    assert (F.batch_train_flops(arch, [5, 9], [2, 3])
            == sum(F.train_flops(arch, n, logits=g) for n, g in rows))
    # Executed: both rows at width 9 with the widest logit slice (3).
    assert (F.batch_train_flops(arch, [5, 9], [2, 3], executed=True)
            == 2 * F.train_flops(arch, 9, logits=3, attention="full"))
    assert (F.batch_reward_flops(arch, [5, 9], head="prm_mlp", executed=True, padded_len=12)
            == 2 * F.reward_model_flops(arch, 12, head="prm_mlp", attention="full"))


# --------------------------------------------------------------------------- parameters


@pytest.mark.parametrize("name", list(CONFIGS))
def test_param_counts_match_instantiated_model(name):
    total, non_embedding = count_parameters(_model(name, "eager"))
    arch = _arch(name)
    assert arch.params() == total
    assert arch.non_embedding_params() == non_embedding


@pytest.mark.parametrize("name", known_configs.names())
def test_known_configs_param_counts(name):
    cfg = known_configs.qwen2_config(name)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    total, non_embedding = count_parameters(model)
    arch = F.resolve_arch(name)
    assert arch == F.Arch.from_config(cfg)
    assert arch.params() == total
    assert arch.non_embedding_params() == non_embedding
    # Within 0.5% of the model card's figure, or within its last printed digit: "0.49B" has
    # two significant digits and the exact 494.0M is 0.8% above it.
    text = known_configs.PUBLISHED_PARAMS[name]
    published = float(text) * 1e9
    last_digit = 10.0 ** -len(text.split(".")[1]) * 1e9
    assert abs(total - published) <= max(0.005 * published, last_digit)


def test_lora_params_match_peft():
    model = _lora_model("head_dim12", "eager", LORA_TARGET_SETS["qv"], rank=3)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert F.lora_params(_arch("head_dim12"), F.LoraSpec(3, ("q_proj", "v_proj"))) == trainable


def test_known_configs_build_and_resolve():
    cfg = known_configs.qwen2_config("Qwen/Qwen2.5-7B")
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.tie_word_embeddings) == (3584, 4, False)
    assert cfg.rope_parameters["rope_theta"] == 1e6 and cfg.rms_norm_eps == 1e-6
    assert F.resolve_arch("Qwen/Qwen2.5-0.5B") == F.resolve_arch("Qwen2.5-0.5B")
    assert F.resolve_arch("Qwen2.5-0.5B").tied


# --------------------------------------------------------------------------- specs and validation


def test_resolve_arch_paths_and_ladder(tmp_path):
    cfg = _config("head_dim12", "eager")
    cfg.save_pretrained(tmp_path)
    arch = _arch("head_dim12")
    assert arch.head_dim == 12
    assert F.resolve_arch(str(tmp_path)) == arch
    assert F.resolve_arch(str(tmp_path / "config.json")) == arch
    assert F.resolve_arch(tmp_path / "config.json", vocab=7).vocab == 7
    nano = F.resolve_arch("nano")
    assert nano.vocab == F.LADDER_REFERENCE_VOCAB and nano.kv_heads == 1
    assert F.resolve_arch("nano", vocab=40).vocab == 40


def test_resolve_arch_errors(tmp_path):
    with pytest.raises(ValueError, match="'no-such-model'"):
        F.resolve_arch("no-such-model")
    with pytest.raises(ValueError, match="no config.json"):
        F.resolve_arch(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="llama"):
        F.resolve_arch(str(tmp_path))


def test_lora_spec_validation():
    assert F.LoraSpec(8).targets == F.ALL_PROJECTIONS
    with pytest.raises(ValueError, match="'qproj'"):
        F.LoraSpec(8, ("qproj",))
    with pytest.raises(ValueError, match="rank"):
        F.LoraSpec(0)
    with pytest.raises(ValueError, match="attention"):
        F.forward_flops(_arch("nano"), 4, attention="flash")
