"""Batched, seeded generation with the token counts the FLOP meter needs.

Prompts are left-padded so that every row's prompt ends at the same position (the standard for
decoder-only batch generation). For each batch we return the real prompt and completion lengths
(model FLOPs are charged on those) and the padded prompt width and number of decode steps the
batch actually ran (executed FLOPs: ``generate`` keeps computing finished rows until the whole
batch stops), and under a static KV cache its length (every decode attends to all of it). The
rollout engine that decodes is the caller's (race.core.engines).

Rows are batched in order of prompt length (in tokens; a stable sort, so the samples of one
prompt stay together), and results come back in the caller's order. On a task whose answer
length grows with its prompt, a batch of short prompts stops decoding early instead of waiting
for the longest solution in a mixed batch (``bench/performance/generation_order.py`` measures
both). The order
changes which random stream a row draws (it is part of "fixed seed and batch size"), never the
model FLOPs, which count real tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationBatch:
    """Shapes of one ``generate`` call (lengths in tokens)."""

    prompt_lens: list[int]
    completion_lens: list[int]  # new tokens per row, EOS included when produced
    padded_prompt_len: int
    new_tokens_run: int  # decode width of the batch: max completion length
    cache_len: int | None = None  # positions of the static KV cache it ran with (None: dynamic)


@dataclass
class Generations:
    """Completions in the caller's row order, the (prompt_len, completion_len) of each row in
    that order, and the batches as they ran (length-sorted)."""

    texts: list[str] = field(default_factory=list)
    batches: list[GenerationBatch] = field(default_factory=list)
    rows: list[tuple[int, int]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(sum(b.completion_lens) for b in self.batches)


def completion_lengths(new_ids, eos_ids, pad_id: int | None) -> list[int]:
    """Real new tokens per row: up to and including the first of ``eos_ids`` (pads after it
    excluded); a row without EOS loses its trailing ``pad_id`` tokens (None: keeps them)."""
    eos = {t for t in eos_ids if t is not None}
    lens = []
    for row in new_ids.tolist():
        n = len(row)
        first = next((i for i, t in enumerate(row) if t in eos), None)
        if first is not None:
            n = first + 1
        elif pad_id is not None and pad_id not in eos:
            while n > 0 and row[n - 1] == pad_id:
                n -= 1
        lens.append(n)
    return lens


def length_order(lengths: list[int]) -> list[int]:
    """Row indices by increasing length, ties in row order: the order :func:`generate` batches
    rows in (and :func:`race.evaluation.targets.rebatched_flops` assumes)."""
    return sorted(range(len(lengths)), key=lambda i: lengths[i])


def generate(model, tokenizer, prompts: list[str], *, engine: str, max_new_tokens: int,
             batch_size: int = 64, do_sample: bool = False, temperature: float = 1.0,
             seed: int = 0, num_return_sequences: int = 1,
             length_sorted: bool = True) -> Generations:
    """Generate completions for ``prompts`` (each repeated ``num_return_sequences`` times).

    Deterministic for a fixed seed, batch size and thread count: the torch generator is reseeded
    from ``seed`` and the batch index before every batch. Rows run length-sorted (module
    docstring); ``texts`` and ``rows`` come back in the order of ``prompts`` (each prompt's
    samples adjacent). ``length_sorted=False`` batches rows in the caller's order (what
    ``bench/performance/generation_order.py`` compares against). ``engine``: the rollout
    engine that decodes (race.core.engines; race.policy.engines.decode): ``fused`` decodes
    with :class:`race.policy.decoder.FusedDecoder` (the same FLOPs as ``model.generate`` in
    fewer calls; samples agree in distribution, greedy output to rounding), or with
    ``model.generate`` for a model it does not support or one whose generation config adds
    logits processors; ``static`` with ``model.generate`` and a static cache sized once for
    the call's longest prompt; ``peft`` and ``merged`` with ``model.generate``.
    """
    import torch

    from race.core.engines import engine as engine_spec
    from race.core.engines import static_cache_len
    from race.policy.engines import cache_len_of, decode, usable_decoder

    spec = engine_spec(engine)
    model.eval()
    decoder = usable_decoder(model, spec)  # built once: it reads the weights once
    expanded = [p for p in prompts for _ in range(num_return_sequences)]
    lengths = [len(ids) for ids in tokenizer(expanded, add_special_tokens=False)["input_ids"]]
    # A static cache sized once for the call: every batch runs the same shapes.
    cache = static_cache_len(max(lengths, default=0), max_new_tokens) \
        if spec.static_cache else None
    order = length_order(lengths) if length_sorted else list(range(len(expanded)))
    texts: list[str] = [""] * len(expanded)
    rows: list[tuple[int, int]] = [(0, 0)] * len(expanded)
    batches: list[GenerationBatch] = []
    pad_id = tokenizer.pad_token_id
    eos_id = tokenizer.eos_token_id
    for bi, start in enumerate(range(0, len(expanded), batch_size)):
        index = order[start:start + batch_size]
        chunk = [expanded[i] for i in index]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, padding_side="left",
                        add_special_tokens=False).to(model.device)
        torch.manual_seed(seed * 1_000_003 + bi)
        width = enc["input_ids"].shape[1]
        new_ids = decode(model, spec, enc["input_ids"], enc["attention_mask"],
                         max_new_tokens=max_new_tokens, do_sample=do_sample,
                         temperature=temperature, eos_token_id=eos_id, pad_token_id=pad_id,
                         decoder=decoder, max_cache_len=cache)
        lens = completion_lengths(new_ids, [eos_id], pad_id)
        prompt_lens = enc["attention_mask"].sum(dim=1).tolist()
        for i, row, n, p in zip(index, new_ids.tolist(), lens, prompt_lens, strict=True):
            texts[i] = tokenizer.decode(row[:n], skip_special_tokens=True)
            rows[i] = (p, n)
        batches.append(GenerationBatch(prompt_lens=prompt_lens, completion_lens=lens,
                                       padded_prompt_len=width, new_tokens_run=new_ids.shape[1],
                                       cache_len=cache_len_of(model, spec)))
    return Generations(texts, batches, rows)
