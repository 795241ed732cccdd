"""Rollout engines (race.grpo.rollout): generating from merged weights leaves the trained model
exactly as it was, and the budget does not depend on the engine."""

from dataclasses import replace

import pytest
import torch

from race.core import ladder
from race.core.specs import ROLLOUT_ENGINES, LoraSpec, rollout_engine
from race.flops import analytic as F
from race.flops.meter import BatchShapes, StepMeter
from race.grpo.rollout import merged_weights, static_cache_len

TARGETS = ("q_proj", "v_proj", "gate_proj", "down_proj")


@pytest.fixture
def peft_policy():
    """A nano policy with LoRA adapters whose B is not zero (a trained adapter's state)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**ladder.config_dict("nano", 40))
    model = get_peft_model(Qwen2ForCausalLM(config),
                           LoraConfig(r=4, lora_alpha=8, target_modules=list(TARGETS),
                                      lora_dropout=0.0, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def frozen(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def gradients(model, ids) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("engine", ["merged", "fused"])
def test_merged_generation_restores_the_weights_bit_for_bit(peft_policy, engine):
    """Many merged generations (``generate`` with the adapters off, or the fused decoder
    reading the merged copies): every frozen weight is the same Parameter holding the same
    bits, and the learning step's gradients -- hence its update -- equal those before."""
    from race.policy.decoder import FusedDecoder

    ids = torch.randint(3, 40, (3, 9))
    before, params = frozen(peft_policy), {n: p for n, p in peft_policy.named_parameters()}
    grads = gradients(peft_policy, ids)
    for _ in range(20):
        if engine == "fused":
            with merged_weights(peft_policy, adapters_off=False):
                FusedDecoder(peft_policy.get_base_model()).generate(
                    ids[:, :4], torch.ones_like(ids[:, :4]), max_new_tokens=3,
                    do_sample=True, pad_token_id=0)
            continue
        with merged_weights(peft_policy):
            peft_policy.generate(input_ids=ids[:, :4], max_new_tokens=3, do_sample=True,
                                 pad_token_id=0)
    assert all(p is params[n] for n, p in peft_policy.named_parameters())
    after = frozen(peft_policy)
    assert after.keys() == before.keys()
    assert all(torch.equal(after[n], before[n]) for n in before)
    assert all(torch.equal(g, grads[n]) for n, g in gradients(peft_policy, ids).items())


def test_merged_weights_compute_the_adapted_policy(peft_policy):
    """Inside the block the model is W + s·B·A with its adapters off: the adapted policy's
    logits, to float rounding (the merged sum rounds differently)."""
    ids = torch.randint(3, 40, (2, 7))
    with torch.no_grad():
        adapted = peft_policy(input_ids=ids).logits
        with peft_policy.disable_adapter():
            base = peft_policy(input_ids=ids).logits
        with merged_weights(peft_policy):
            merged = peft_policy(input_ids=ids).logits
    assert not torch.allclose(adapted, base, atol=1e-4)  # the adapters matter here
    torch.testing.assert_close(merged, adapted, rtol=1e-5, atol=1e-5)


def test_model_flops_do_not_depend_on_the_engine():
    """The same shapes give the same model FLOPs, phase by phase, under every engine; only the
    executed rollout differs (no adapter matmuls and one merge when merged; a static cache's
    full-length attention)."""
    arch = F.resolve_arch("micro")
    lora = LoraSpec(8, TARGETS)
    cache = static_cache_len(14, 12)
    shapes = BatchShapes((9, 14, 11, 14), (12, 3, 7, 12), 14, 12, cache_len=cache)
    meters = {engine: StepMeter(arch, lora, beta=0.04, num_iterations=2, rollout_engine=engine)
              for engine in ROLLOUT_ENGINES}
    dynamic = replace(shapes, cache_len=None)
    rollout = {e: m.rollout(shapes if e == "static" else dynamic) for e, m in meters.items()}
    assert len({r.model for r in rollout.values()}) == 1
    assert len({m.learning(shapes, True) for m in meters.values()}) == 1
    peft = rollout["peft"].executed
    merge = F.lora_merge_flops(arch, lora)
    no_adapters = F.batch_generate_flops(arch, shapes.prompt_lens, shapes.completion_lens,
                                         executed=True)
    assert rollout["merged"].executed == no_adapters + merge < peft
    assert rollout["static"].executed > rollout["merged"].executed  # reads the whole cache


def test_the_engine_is_named_or_refused():
    assert rollout_engine(None) == "peft" and rollout_engine("static") == "static"
    with pytest.raises(ValueError, match="rollout_engine must be one of"):
        rollout_engine("vllm")
