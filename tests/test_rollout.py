"""Rollout engines (race.core.engines, race.policy.engines): generating from merged weights
leaves the trained model exactly as it was, the budget does not depend on the engine, and every
engine of the one table goes through every reader of it (the trainer's config and generation
hook, the meter, the memory estimate, evaluation's generate)."""

from dataclasses import replace

import pytest
import torch

from race.core import ladder
from race.core.engines import DEFAULT_ENGINE, ENGINES, ROLLOUT_ENGINES, engine, static_cache_len
from race.core.specs import LoraSpec
from race.flops import analytic as F
from race.flops.meter import BatchShapes, StepMeter
from race.policy.engines import merged_weights

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
    meters = {name: StepMeter(arch, lora, beta=0.04, num_iterations=2, rollout_engine=name)
              for name in ROLLOUT_ENGINES}
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
    assert engine(DEFAULT_ENGINE).name == "peft" and engine("static").static_cache
    for bad in ("vllm", None):  # never null past the schema: its default is peft
        with pytest.raises(ValueError, match="rollout_engine must be one of"):
            engine(bad)


# --------------------------------------------------------------------------- the one table


def test_the_table_is_the_schemas_engines():
    """One entry per engine the schema allows (training.rollout_engine; eval.engine adds
    null, the training engine), each entry's columns within what its readers know."""
    from race.core.schema import default, properties
    from race.core.specs import ALL_PROJECTIONS, DEVICES
    from race.policy.engines import decoder_class

    assert tuple(ENGINES) == ROLLOUT_ENGINES == tuple(
        properties("training")["rollout_engine"]["enum"])
    assert tuple(properties("eval")["engine"]["enum"]) == (*ROLLOUT_ENGINES, None)
    assert default("training", "rollout_engine") == DEFAULT_ENGINE in ENGINES
    for spec in ENGINES.values():
        assert set(spec.compile_on) <= set(spec.devices) <= set(DEVICES)
        assert set(spec.decoder_copies) <= set(ALL_PROJECTIONS)
        assert bool(spec.decoder_copies) <= (spec.decoder is not None)
        decoder = decoder_class(spec)
        if decoder is not None:  # the interface the trainer and evaluation call
            assert all(callable(getattr(decoder, name)) for name in (
                "generate", "supports", "check_supported", "plain_sampling"))


@pytest.fixture(scope="module")
def tiny_policies(tokenizer):
    """A nano ladder policy per attention kernel, as evaluation loads one (merged, plain)."""
    from race.policy.ladder import build_ladder_model

    return {attn: build_ladder_model("nano", tokenizer, seed=0, attn_implementation=attn)
            for attn in ("eager", "sdpa")}


@pytest.mark.parametrize("name", ROLLOUT_ENGINES)
def test_every_engine_through_every_reader(name, peft_policy, tiny_policies, tokenizer,
                                           tmp_path):
    """Each engine of the table through each reader: the trainer's TRL config and generation
    hook, the meter's executed FLOPs, the memory estimate, and evaluation's generate on a
    tiny policy (greedy, what torch counts equal to its ledger's executed FLOPs)."""
    from race.core.jobs import TrainJob
    from race.evaluation.targets import batch_flops
    from race.flops.counter import count_flops
    from race.grpo.trainer import grpo_config
    from race.policy.engines import decoder_class, generate_kwargs, generation_weights
    from race.policy.generation import generate
    from race.study.memory import eval_memory, train_memory

    spec = engine(name)
    # The trainer: TRL's cache configuration, and the weights and decode of its one generation.
    job = TrainJob(base="b", train_data="d", run_dir=str(tmp_path), rungs=[1.0],
                   rollout_engine=name)
    config = grpo_config(job, 1, "cpu", max_prompt_len=14)
    assert (config.cache_implementation == "static") == spec.static_cache
    ids = torch.randint(3, 40, (2, 5))
    layer = peft_policy.get_base_model().model.layers[0].self_attn.q_proj
    original = layer.base_layer.weight
    with torch.no_grad():
        adapted = peft_policy.generate(input_ids=ids, max_new_tokens=4, do_sample=False,
                                       pad_token_id=0)[:, 5:]
        with generation_weights(peft_policy, spec):
            assert (layer.base_layer.weight is not original) == spec.merges
            assert layer.disable_adapters == (spec.merges and spec.decoder is None)
            decoder = decoder_class(spec)
            new = decoder(peft_policy.get_base_model()).generate(
                ids, torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                eos_token_ids=[], pad_token_id=0) if decoder is not None else \
                peft_policy.generate(input_ids=ids, max_new_tokens=4, do_sample=False,
                                     pad_token_id=0,
                                     **generate_kwargs(spec, "cpu", static_cache_len(5, 4)))[:, 5:]
    assert layer.base_layer.weight is original and torch.equal(new, adapted)
    # The meter: no LoRA matmuls and one merge where it merges; a static cache read whole.
    arch, lora = F.resolve_arch("micro"), LoraSpec(8, TARGETS)
    shapes = BatchShapes((9, 14, 11, 14), (12, 3, 7, 12), 14, 12,
                         cache_len=static_cache_len(14, 12) if spec.static_cache else None)
    rollout = StepMeter(arch, lora, beta=0.0, num_iterations=1, rollout_engine=name
                        ).rollout(shapes)
    plain = StepMeter(arch, lora, beta=0.0, num_iterations=1).rollout(
        replace(shapes, cache_len=None))
    assert rollout.model == plain.model
    merge = F.lora_merge_flops(arch, lora) if spec.merges else 0
    unmerged = F.batch_generate_flops(arch, shapes.prompt_lens, shapes.completion_lens,
                                      executed=True, lora=None if spec.merges else lora)
    assert (rollout.executed > unmerged + merge) == spec.static_cache
    assert (rollout.executed == unmerged + merge) == (not spec.static_cache)
    # The memory estimate: the merged copy and the decoder's copies while generating.
    train = train_memory(arch, rows=4, micro_rows=None, prompt_len=14, completion_len=12,
                         lora=lora, dtype="float32", grad_ckpt=False, rollout_engine=name)
    evaluate = eval_memory(arch, batch_rows=4, prompt_len=14, max_new_tokens=12,
                           dtype="float32", rollout_engine=name)
    extra = {"merged_weights"} if spec.merges else set()
    extra |= {"decoder_weights"} if spec.decoder_copies else set()
    assert set(train.phases["rollout"]) == {"kv_cache", "decode", *extra}
    assert set(evaluate.phases["generation"]) == {"kv_cache", "decode", *extra} - {
        "merged_weights"}  # an evaluated policy is merged already
    # Evaluation's generate: the same greedy completions under every engine, and the
    # ledger's executed FLOPs what torch ran (a static cache's whole length read).
    prompts = ["12+3=?\n", "4-1+20-7=?\n", "9=?\n"]
    for attn, model in tiny_policies.items():
        with count_flops() as fc:
            gens = generate(model, tokenizer, prompts, engine=name, max_new_tokens=6,
                            batch_size=2)
        assert batch_flops(model_arch(model), gens.batches, attn_implementation=attn
                           ).executed == fc.total, attn
        assert [b.cache_len is not None for b in gens.batches] == [spec.static_cache] * 2
        reference = generate(model, tokenizer, prompts, engine="merged", max_new_tokens=6,
                             batch_size=2)
        assert gens.texts == reference.texts


def model_arch(model) -> F.Arch:
    return F.Arch.from_config(model.config)
