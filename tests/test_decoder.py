"""The fused decoder (race.policy.decoder): Qwen2's forward in fewer calls. Its greedy
output is ``generate``'s token for token, its logits the model's to rounding, on left-padded
batches, grouped-query attention and LoRA-merged weights; what it cannot read is refused."""

import pytest
import torch

from race.core import ladder
from race.policy.decoder import FusedDecoder, check_supported, plain_sampling, supports
from race.policy.engines import merged_weights


def qwen2(heads: int, kv_heads: int, **extra):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = dict(ladder.config_dict("nano", 40), num_attention_heads=heads,
                  num_key_value_heads=kv_heads, **extra)
    return Qwen2ForCausalLM(Qwen2Config(**config)).eval()


def left_padded(rows: int = 5, pad: int = 0):
    """Prompts of 3..7 tokens, left-padded with ``pad``."""
    g = torch.Generator().manual_seed(1)
    lens = [3 + i % 5 for i in range(rows)]
    width = max(lens)
    ids = torch.full((rows, width), pad)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for r, n in enumerate(lens):
        ids[r, width - n:] = torch.randint(3, 40, (n,), generator=g)
        mask[r, width - n:] = 1
    return ids, mask


def hf_new_tokens(model, ids, mask, new: int, eos: int, **kw):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                             pad_token_id=0, eos_token_id=eos, **kw)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("heads,kv_heads", [(2, 1), (4, 4), (4, 2)], ids=["gqa", "mha", "gqa2"])
def test_greedy_decoding_is_generates_token_for_token(heads, kv_heads):
    model = qwen2(heads, kv_heads)
    ids, mask = left_padded()
    decoder = FusedDecoder(model)
    # As EOS, the token the random model emits in the most rows: rows finish at different
    # columns and are padded after, as generate pads them.
    free = decoder.generate(ids, mask, max_new_tokens=12, do_sample=False, eos_token_ids=[],
                            pad_token_id=0)
    eos = max(range(3, 40), key=lambda t: int((free == t).any(dim=1).sum()))
    want = hf_new_tokens(model, ids, mask, 12, eos=eos, do_sample=False)
    got = decoder.generate(ids, mask, max_new_tokens=12, do_sample=False, eos_token_ids=[eos],
                           pad_token_id=0)
    assert (want == eos).any() and (want[:, -1] == 0).any()  # some row stopped and was padded
    assert torch.equal(got, want)


def test_logits_are_the_models_to_rounding():
    """The first sampled step's logits on a left-padded batch, against the model's forward
    over the same tokens (positions from the mask, as generate counts them)."""
    model = qwen2(4, 2)
    ids, mask = left_padded()
    decoder = FusedDecoder(model)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    seen = {}
    real_logits = decoder._logits

    def keep(hidden):
        seen.setdefault("logits", real_logits(hidden))
        return seen["logits"]

    decoder._logits = keep
    decoder.generate(ids, mask, max_new_tokens=1, do_sample=False, eos_token_ids=[],
                     pad_token_id=0)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    torch.testing.assert_close(seen["logits"], want, rtol=1e-5, atol=1e-5)


def test_sampling_follows_the_temperature_and_the_seed():
    model = qwen2(2, 1)
    ids, mask = left_padded()
    decoder = FusedDecoder(model)
    greedy = decoder.generate(ids, mask, max_new_tokens=8, do_sample=False, eos_token_ids=[],
                              pad_token_id=0)
    cold = decoder.generate(ids, mask, max_new_tokens=8, do_sample=True, temperature=1e-4,
                            eos_token_ids=[], pad_token_id=0)
    assert torch.equal(cold, greedy)

    def sample(seed):
        torch.manual_seed(seed)
        return decoder.generate(ids, mask, max_new_tokens=8, do_sample=True, eos_token_ids=[],
                                pad_token_id=0)

    assert torch.equal(sample(3), sample(3)) and not torch.equal(sample(3), sample(4))


def test_merged_lora_weights_decode_like_the_adapted_policy():
    """Built inside race.policy.engines.merged_weights, the decoder reads the merged copies
    through PEFT's wrappers: the adapted policy's greedy tokens; the frozen weights are
    untouched afterwards."""
    from peft import LoraConfig, get_peft_model

    from race.policy.ladder import quiet_checkpointing_renames

    quiet_checkpointing_renames()
    policy = get_peft_model(qwen2(4, 2), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                           "up_proj", "down_proj"],
        lora_dropout=0.0, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    ids, mask = left_padded()
    want = hf_new_tokens(policy, ids, mask, 10, eos=None, do_sample=False)
    with torch.no_grad(), policy.disable_adapter():
        base = hf_new_tokens(policy, ids, mask, 10, eos=None, do_sample=False)
    assert not torch.equal(want, base)  # the adapters matter here
    assert not supports(policy.get_base_model())  # wrapped: merge first
    with merged_weights(policy, adapters_off=False):
        got = FusedDecoder(policy.get_base_model()).generate(
            ids, mask, max_new_tokens=10, do_sample=False, eos_token_ids=[], pad_token_id=0)
    assert torch.equal(got, want)
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())


def test_what_the_decoder_cannot_read_is_refused():
    from peft import LoraConfig, get_peft_model
    from transformers import GenerationConfig, LlamaConfig

    from race.policy.ladder import quiet_checkpointing_renames

    with pytest.raises(ValueError, match="model_type 'llama'"):
        check_supported(LlamaConfig())
    with pytest.raises(ValueError, match="sliding-window"):
        check_supported(qwen2(2, 1, use_sliding_window=True, max_window_layers=0).config)
    with pytest.raises(ValueError, match="attention_dropout"):
        check_supported(qwen2(2, 1, attention_dropout=0.1).config)
    with pytest.raises(ValueError, match="'dynamic' rope"):
        check_supported(qwen2(2, 1, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                     "rope_theta": 10000.0}).config)
    assert supports(qwen2(2, 1))
    # Sampling beyond the temperature is generate's: a repetition penalty, suppressed tokens.
    assert plain_sampling(GenerationConfig()) and plain_sampling(GenerationConfig(top_k=0))
    assert not plain_sampling(GenerationConfig(repetition_penalty=1.05))
    assert not plain_sampling(GenerationConfig(suppress_tokens=[3]))
    # PEFT applies DoRA and LoRA dropout where a merged copy would not: refused.
    quiet_checkpointing_renames()
    for extra in ({"use_dora": True}, {"lora_dropout": 0.1}):
        policy = get_peft_model(qwen2(2, 1), LoraConfig(r=2, target_modules=["q_proj"],
                                                         task_type="CAUSAL_LM", **extra))
        with pytest.raises(ValueError, match="plain LoRA"), merged_weights(policy):
            pass


def test_evaluation_keeps_generate_for_a_config_that_asks_more():
    """race.policy.generation.generate under the fused engine decodes with the fused decoder
    only where it samples as generate would: a repetition penalty in the model's generation
    config keeps generate (whose output then differs from the decoder's)."""
    from race.policy.generation import generate

    class Tokens:
        """Prompts are space-separated ids; decoding joins them back."""
        pad_token_id, eos_token_id = 0, 1

        def __call__(self, texts, return_tensors=None, **kw):
            rows = [[int(t) for t in x.split()] for x in texts]
            if return_tensors is None:
                return {"input_ids": rows}
            width = max(map(len, rows))
            ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
            return _Batch(input_ids=ids, attention_mask=mask)

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    model = qwen2(2, 1)
    prompts = ["5 6 7", "8 9 10 11 12"]
    plain = generate(model, Tokens(), prompts, engine="fused", max_new_tokens=10)
    model.generation_config.repetition_penalty = 3.0
    penalised = generate(model, Tokens(), prompts, engine="fused", max_new_tokens=10)
    unfused = generate(model, Tokens(), prompts, engine="merged", max_new_tokens=10)
    assert penalised.texts == unfused.texts != plain.texts


class _Batch(dict):
    def to(self, device):
        return self

    def __getattr__(self, name):
        return self[name]
