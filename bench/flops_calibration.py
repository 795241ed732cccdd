"""Calibrate the analytic FLOP model against torch's FlopCounterMode.

    python bench/flops_calibration.py

For each tiny Qwen2 config and attention implementation (eager, CPU SDPA with the registered
formulas) it measures one batch per phase and prints measured / analytic-executed (1.000000 =
exact), plus model / executed (how much the causal triangle and padding-free counting save) and
the wall time of the measured runs. Nothing is asserted: tests/test_flops.py holds the bar.
"""

from __future__ import annotations

import time
import warnings

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from race.flops import analytic as F
from race.flops.counter import measure_forward, measure_generate, measure_train_step
from race.policy.ladder import ladder_config

warnings.filterwarnings("ignore")

CONFIGS: dict[str, dict] = {
    "kv1 h48 ff100": dict(hidden_size=48, intermediate_size=100, num_hidden_layers=2,
                          num_attention_heads=3, num_key_value_heads=1, vocab_size=50,
                          tie_word_embeddings=True),
    "untied h64": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
                       tie_word_embeddings=False),
    "head_dim12 L3": dict(hidden_size=40, intermediate_size=72, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                          vocab_size=33, tie_word_embeddings=False),
    "nano": ladder_config("nano", 64).to_dict(),
    "micro": ladder_config("micro", 64).to_dict(),
}
SEQ, BATCH, PROMPT, NEW = 37, 2, 13, 6
LORA_SETS = {"all": F.ALL_PROJECTIONS, "qv": ("q_proj", "v_proj"), "mlp": F.MLP_PROJECTIONS}
RANK = 8


def _config(values: dict, impl: str, **extra) -> Qwen2Config:
    clean = {k: v for k, v in values.items()
             if k not in ("pad_token_id", "bos_token_id", "eos_token_id")}
    cfg = Qwen2Config.from_dict({**clean, "pad_token_id": 0, "bos_token_id": 1,
                                 "eos_token_id": 2, **extra})
    cfg._attn_implementation = impl
    return cfg


def _lora(model, targets):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=RANK, target_modules=list(targets),
                                            lora_dropout=0.0))


def _phases(values: dict, impl: str, device: str = "cpu"):
    """Yield (phase, measure() -> int, analytic executed, analytic model) per phase, the
    models and inputs on ``device`` (bench/gpu_check.py measures on CUDA)."""
    arch = F.Arch.from_config(_config(values, impl))
    att = "full" if impl == "eager" else "sdpa"
    vocab = values["vocab_size"]

    def ids(n):
        return torch.randint(3, vocab, (BATCH, n), device=device)

    def causal_lm():
        torch.manual_seed(0)
        return Qwen2ForCausalLM(_config(values, impl)).to(device)

    yield ("forward", lambda: measure_forward(causal_lm().eval(), ids(SEQ)),
           BATCH * F.forward_flops(arch, SEQ, attention=att), BATCH * F.forward_flops(arch, SEQ))
    yield ("train full", lambda: measure_train_step(causal_lm().train(), ids(SEQ)),
           BATCH * F.train_flops(arch, SEQ, attention=att), BATCH * F.train_flops(arch, SEQ))
    for name, targets in LORA_SETS.items():
        spec = F.LoraSpec(RANK, targets)
        yield (f"train LoRA {name}",
               lambda t=targets: measure_train_step(_lora(causal_lm(), t).train(), ids(SEQ)),
               BATCH * F.train_flops(arch, SEQ, lora=spec, attention=att),
               BATCH * F.train_flops(arch, SEQ, lora=spec))
    spec = F.LoraSpec(RANK, F.MLP_PROJECTIONS)

    def ckpt():
        model = _lora(causal_lm(), F.MLP_PROJECTIONS)
        model.gradient_checkpointing_enable()
        return measure_train_step(model.train(), ids(SEQ))

    yield ("train LoRA mlp ckpt", ckpt,
           BATCH * F.train_flops(arch, SEQ, lora=spec, grad_ckpt=True, attention=att),
           BATCH * F.train_flops(arch, SEQ, lora=spec, grad_ckpt=True))
    yield ("generate", lambda: measure_generate(causal_lm().eval(), ids(PROMPT), NEW)[0],
           BATCH * F.generate_flops(arch, PROMPT, NEW, executed=True),
           BATCH * F.generate_flops(arch, PROMPT, NEW))

    def reward():
        torch.manual_seed(0)
        return measure_forward(Qwen2ForTokenClassification(_config(values, impl, num_labels=2))
                               .to(device).eval(), ids(SEQ))

    yield ("reward forward", reward,
           BATCH * F.reward_model_flops(arch, SEQ, attention=att),
           BATCH * F.reward_model_flops(arch, SEQ))


def main() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the "use_cache is incompatible with checkpointing" note
    torch.set_num_threads(1)
    print(f"batch {BATCH}, seq {SEQ}, generate {PROMPT}+{NEW}, LoRA r={RANK}\n")
    header = (f"{'config':<15} {'attn':<6} {'phase':<20} {'measured':>12} {'executed':>12} "
              f"{'meas/exec':>10} {'model/exec':>10} {'wall_s':>7}")
    print(header)
    print("-" * len(header))
    worst = 0.0
    for cname, values in CONFIGS.items():
        for impl in ("eager", "sdpa"):
            for phase, measure, executed, model in _phases(values, impl):
                torch.manual_seed(0)
                start = time.perf_counter()
                measured = measure()
                wall = time.perf_counter() - start
                ratio = measured / executed
                worst = max(worst, abs(ratio - 1))
                print(f"{cname:<15} {impl:<6} {phase:<20} {measured:>12} {executed:>12} "
                      f"{ratio:>10.6f} {model / executed:>10.4f} {wall:>7.3f}")
    print(f"\nlargest |measured/executed - 1| = {worst:.2e}")


if __name__ == "__main__":
    main()
