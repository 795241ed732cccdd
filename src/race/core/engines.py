"""The rollout engines in one table: how each generates, what it executes, what it holds in
memory and where it runs (``training.rollout_engine``; evaluation's ``eval.engine``).

=========  ======  ============  ===============  ===================  =========  ===========
engine     merges  static_cache  decoder          decoder_copies       devices    compile_on
=========  ======  ============  ===============  ===================  =========  ===========
``peft``   no      no            generate         --                   cpu, cuda  --
``merged`` yes     no            generate         --                   cpu, cuda  --
``static`` yes     yes           generate         --                   cpu, cuda  cuda
``fused``  yes     no            FusedDecoder     q|k|v, gate|up       cpu, cuda  --
=========  ======  ============  ===============  ===================  =========  ===========

This module is the table's data (no torch: every floor reads it); what an entry does with a
model -- the merged copy, the decoder it names, the ``generate`` arguments -- is
:mod:`race.policy.engines`. Each reader takes the columns it needs:

- the trainer (race.grpo.trainer): ``merges`` (its generation runs inside
  :func:`race.policy.engines.generation_weights`), ``decoder`` (a decode loop in place of TRL's
  ``generate``), ``static_cache`` (TRL's generation config), ``compile_on``, ``devices``;
- evaluation, base-policy evaluation and PRM sampling (:func:`race.policy.generation.generate`):
  ``decoder``, ``static_cache``, ``compile_on``, ``devices`` -- their policy is merged already
  (``eval.merge_adapter``) or has no adapter, so ``peft`` and ``merged`` both decode with
  ``generate``;
- the meter's executed FLOPs (race.flops.meter): ``merges`` (no LoRA matmuls while decoding,
  one merge ``B·A`` per generation), ``static_cache`` (every decode attends to the whole cache,
  whose length the recorded shapes carry); model FLOPs never depend on the engine;
- the memory estimate (race.study.memory): ``merges`` (a second copy of the adapted weights
  while generating), ``decoder_copies`` (the projections a decoder concatenates into new
  tensors), ``static_cache`` (a cache of :func:`static_cache_len` positions, held all job).

Adding an engine is one entry here, its name in the schema's enums (``training.rollout_engine``
and ``eval.engine``; tests/test_rollout.py holds them to this table) and its module (a decoder class
with :class:`race.policy.decoder.FusedDecoder`'s interface, where it has one).
"""

from __future__ import annotations

from dataclasses import dataclass

from race.core.schema import default, properties

#: The engines the schema allows, in its order (``training.rollout_engine``).
ROLLOUT_ENGINES: tuple[str, ...] = tuple(properties("training")["rollout_engine"]["enum"])
#: The engine of a config that names none (the schema's default).
DEFAULT_ENGINE: str = default("training", "rollout_engine")
#: The engine an evaluation or PRM-sampling job (or a direct call) that names none decodes
#: with: what every such job decoded with before its engine was configurable, so an older
#: job's JSON, which has no engine, means what it always did (race.core.jobs.OMIT_DEFAULT).
DECODE_DEFAULT: str = "fused"


@dataclass(frozen=True)
class Engine:
    """One rollout engine (module docstring)."""

    name: str
    #: Generates from the adapted weights merged into a copy, once per generation (the frozen
    #: weights restored bit for bit after); False: through the unmerged LoRA layers.
    merges: bool
    #: A static KV cache sized once per job: every decode runs the same shapes and attends to
    #: every cached position, filled or not.
    static_cache: bool = False
    #: ``module:Class`` of a decode loop run in place of transformers' ``generate``
    #: (race.policy.decoder.FusedDecoder's interface); None: ``generate``.
    decoder: str | None = None
    #: Projections whose weights the decoder copies (concatenated) while it decodes.
    decoder_copies: tuple[str, ...] = ()
    #: Devices it runs on (the ``device`` key's resolved values).
    devices: tuple[str, ...] = ("cpu", "cuda")
    #: Devices where its decode forward is compiled (torch.compile, through ``generate``).
    compile_on: tuple[str, ...] = ()

    def check_device(self, device: str) -> None:
        """ValueError unless the engine runs on ``device`` (``cpu`` or ``cuda``)."""
        if device not in self.devices:
            raise ValueError(f"the {self.name} rollout engine runs on {', '.join(self.devices)}, "
                             f"not {device}")


#: The table, one entry per engine of the schema.
ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("peft", merges=False),
    Engine("merged", merges=True),
    Engine("static", merges=True, static_cache=True, compile_on=("cuda",)),
    Engine("fused", merges=True, decoder="race.policy.decoder:FusedDecoder",
           decoder_copies=("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")),
)}

def engine(name: str) -> Engine:
    """The entry of the engine ``name``; ValueError naming the engines otherwise."""
    try:
        return ENGINES[name]
    except (KeyError, TypeError):
        raise ValueError(f"rollout_engine must be one of {ROLLOUT_ENGINES}, got {name!r}") \
            from None


def static_cache_len(max_prompt_len: int, max_new_tokens: int) -> int:
    """Positions of a static KV cache sized once for prompts of up to ``max_prompt_len``
    tokens and ``max_new_tokens`` new ones: transformers' ``generate`` caches ``max_length - 1
    = prompt + max_new_tokens - 1`` positions, at most this for any batch of those prompts (a
    larger cache would only be read, at a cost, never written)."""
    return max_prompt_len + max_new_tokens - 1
