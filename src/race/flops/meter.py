"""The online FLOP meter of a GRPO step, from token counts and the analytic model.

Production runs are metered analytically (``race.flops.analytic``) from the shapes TRL actually ran:
FlopCounterMode costs ~2.5x wall time and is for calibration only (tests, ``bench/``).

What one optimizer step charges (one step = one generation batch slice; this project runs
``gradient_accumulation_steps = steps_per_generation = 1``, so each step sees the whole batch):

rollout   a generation step only: ``model.generate`` of every completion by the policy with its
          adapters -- one prefill over the prompt, logits at the last position, then one cached
          decode per further token. Model FLOPs price it through the unmerged adapters whatever
          the rollout engine (race.core.engines), so a budget buys the same steps under every
          engine; executed FLOPs follow the engine's entry: one that ``merges`` runs no LoRA
          matmuls but merges once per generation, a ``static_cache`` one attends to all of the
          cache's positions (the recorded shapes carry its length). Reuse steps
          (``num_iterations > 1``) generate nothing and charge no rollout.
learning  every step: policy forward + backward over prompt + completion; gradient-checkpoint
          recompute when it is on. A generation step also charges the reference forward when
          ``beta > 0`` (adapter disabled: no LoRA cost, no backward) and the old-policy
          log-prob forward when ``num_iterations > 1`` (with adapters, no backward).
reward    the reward functions' own ledgers (a PRM or ORM forward; a rule verifier is 0 FLOPs,
          its wall time is still recorded).

The LM head of the learning phase. Model FLOPs charge it where the loss needs logits -- the
``g`` positions whose next token is a completion token -- forward, and backward to its input
(the head is frozen): the same on every device, so a budget buys the same steps on a CPU and a
GPU. Executed FLOPs follow TRL 1.16's chunked log-prob head (``trl.kernels.chunked_logprob``):
it scores only those positions on a Triton device (GPUs) but every position except each row's
last elsewhere (CPU), padding included, and its backward recomputes the logits before the input
gradient, so a position that is differentiated costs three head passes, not two (read from its
source, and measured: ``tests/test_train.py`` counts ``addmm_`` too). The no-grad log-prob
forwards (reference, old policy) run the head once.

Model FLOPs use each row's real tokens with causal attention; executed FLOPs use the padded
batch the kernels ran on (left-padded prompts, right-padded completions, the full attention
block; a generate batch keeps decoding finished rows until its longest completion stops).
"""

from __future__ import annotations

from dataclasses import dataclass

from race.core.engines import DEFAULT_ENGINE, engine
from race.core.specs import LoraSpec
from race.flops import analytic as flops
from race.flops.analytic import Arch

#: The version of what a step is charged. A run's fingerprint carries it, so a run metered
#: under another version is never resumed or reused (2: the update's LM head at the completion
#: positions on every device; 1 charged every position on the CPU).
FLOPS_CONVENTION = 2


@dataclass(frozen=True)
class BatchShapes:
    """Token shapes of one generation batch (lengths in tokens)."""

    prompt_lens: tuple[int, ...]
    completion_lens: tuple[int, ...]  # real completion tokens per row (EOS included)
    padded_prompt_len: int
    completion_width: int  # generated columns of the batch (its longest completion)
    cache_len: int | None = None  # positions of the static KV cache it ran with (None: dynamic)

    @property
    def rows(self) -> int:
        return len(self.prompt_lens)

    @classmethod
    def from_masks(cls, prompt_mask, completion_mask, cache_len: int | None = None
                   ) -> BatchShapes:
        return cls(
            prompt_lens=tuple(int(x) for x in prompt_mask.sum(dim=1).tolist()),
            completion_lens=tuple(int(x) for x in completion_mask.sum(dim=1).tolist()),
            padded_prompt_len=int(prompt_mask.shape[1]),
            completion_width=int(completion_mask.shape[1]),
            cache_len=cache_len,
        )

    @classmethod
    def worst_case(cls, rows: int, max_prompt_len: int, max_completion_len: int) -> BatchShapes:
        """Every row at the longest prompt and the completion cap: an upper bound."""
        return cls((max_prompt_len,) * rows, (max_completion_len,) * rows, max_prompt_len,
                   max_completion_len)


@dataclass(frozen=True)
class PhaseFlops:
    model: int
    executed: int
    tokens: int


def static_prefill_keys(prompt_lens, padded_prompt_len: int, cache_len: int | None,
                        attention: str) -> int | None:
    """Keys of a static-cache prefill (None: a dynamic cache): the whole cache, but for SDPA
    (``attention`` ``sdpa``) on a batch without padding, where transformers drops the mask for
    ``is_causal`` and cuts the keys to the prompt (``integrations.sdpa_attention``)."""
    if cache_len is None:
        return None
    unpadded = all(p == padded_prompt_len for p in prompt_lens)
    return padded_prompt_len if attention == "sdpa" and unpadded else cache_len


class StepMeter:
    """Charges the rollout and learning phases of a GRPO step for one policy."""

    def __init__(self, arch: Arch, lora: LoraSpec | None, *, beta: float, num_iterations: int,
                 grad_ckpt: bool = False, attn_implementation: str = "sdpa",
                 head_all_positions: bool = True, rollout_engine: str = DEFAULT_ENGINE):
        self.arch = arch
        self.lora = lora
        self.engine = engine(rollout_engine)  # race.core.engines
        # Generating from merged weights: no LoRA matmuls while decoding, one merge per
        # generation.
        self.merged = self.engine.merges and lora is not None
        self.beta = beta
        self.num_iterations = num_iterations
        self.grad_ckpt = grad_ckpt
        # Where TRL's head runs: every position (off Triton, the default: the CPU) or the
        # completion positions only. It changes executed FLOPs alone (module docstring).
        self.head_all_positions = head_all_positions
        # Executed attention: eager and masked SDPA both compute the full block.
        self.executed_attention = "full" if attn_implementation == "eager" else "sdpa"

    # ------------------------------------------------------------------ rollout
    def rollout(self, b: BatchShapes) -> PhaseFlops:
        model = flops.batch_generate_flops(self.arch, b.prompt_lens, b.completion_lens,
                                           lora=self.lora)
        executed = flops.batch_generate_flops(
            self.arch, b.prompt_lens, b.completion_lens, executed=True,
            padded_prompt_len=b.padded_prompt_len, generated_width=b.completion_width,
            lora=None if self.merged else self.lora, cache_len=b.cache_len,
            prefill_keys=static_prefill_keys(b.prompt_lens, b.padded_prompt_len, b.cache_len,
                                             self.executed_attention))
        if self.merged:
            executed += flops.lora_merge_flops(self.arch, self.lora)
        return PhaseFlops(model, executed, sum(b.completion_lens))

    # ------------------------------------------------------------------ learning
    def _executed_logits(self, g: int, width: int) -> int:
        """LM-head positions TRL's head ran for a row of ``g`` completion tokens in a batch
        ``width`` wide (module docstring); the model count is ``g`` on every device."""
        return width - 1 if self.head_all_positions else g

    def _forward_pair(self, b: BatchShapes, lora: LoraSpec | None) -> tuple[int, int]:
        """A no-grad log-prob forward (reference or old policy) over the batch."""
        width = b.padded_prompt_len + b.completion_width
        rows = list(zip(b.prompt_lens, b.completion_lens, strict=True))
        model = sum(flops.forward_flops(self.arch, p + g, logits=g, lora=lora) for p, g in rows)
        executed = sum(flops.forward_flops(self.arch, width, logits=self._executed_logits(g, width),
                                           lora=lora, attention=self.executed_attention)
                       for p, g in rows)
        return model, executed

    def learning(self, b: BatchShapes, generation_step: bool) -> PhaseFlops:
        width = b.padded_prompt_len + b.completion_width
        rows = list(zip(b.prompt_lens, b.completion_lens, strict=True))
        model = sum(flops.train_flops(self.arch, p + g, logits=g, lora=self.lora,
                                      grad_ckpt=self.grad_ckpt)
                    for p, g in rows)
        executed = sum(flops.train_flops(self.arch, width, logits=self._executed_logits(g, width),
                                         lora=self.lora, grad_ckpt=self.grad_ckpt,
                                         attention=self.executed_attention, head_recompute=True)
                       for p, g in rows)
        tokens = sum(b.prompt_lens) + sum(b.completion_lens)
        if generation_step:
            extra = []
            if self.beta > 0:
                extra.append(self._forward_pair(b, lora=None))  # adapter disabled
            if self.num_iterations > 1:
                extra.append(self._forward_pair(b, lora=self.lora))
            for m, e in extra:
                model += m
                executed += e
                tokens += sum(b.prompt_lens) + sum(b.completion_lens)
        return PhaseFlops(model, executed, tokens)


# --------------------------------------------------------------------------- the step bound


@dataclass(frozen=True)
class RewardReads:
    """What a reward model reads of one row, as a FLOP price: a row of ``P`` prompt and ``C``
    completion policy tokens is ``prompt_expansion * P + expansion * C + appended + template``
    of its own tokens (the expansions: the most of its tokens one policy token becomes, 1 when
    both share a tokenizer; ``appended``: the step separator closing the last line;
    ``template``: a chat template's tokens; race.feedback.reads measures them), each priced by
    :func:`race.flops.analytic.reward_model_flops`."""

    arch: Arch
    head: str = "token"
    num_labels: int = 2
    expansion: int = 1
    appended: int = 0
    template: int = 0
    prompt_expansion: int = 1

    def tokens(self, prompt_len: int, completion_len: int) -> int:
        return (self.prompt_expansion * prompt_len + self.expansion * completion_len
                + self.appended + self.template)

    def row_flops(self, prompt_len: int, completion_len: int) -> int:
        return flops.reward_model_flops(self.arch, self.tokens(prompt_len, completion_len),
                                        head=self.head, num_labels=self.num_labels)


@dataclass(frozen=True)
class GenerationStep:
    """Model FLOPs of one generation step with every row at the same lengths, per phase."""

    rollout: int
    reward: int
    learning: int

    @property
    def total(self) -> int:
        return self.rollout + self.reward + self.learning


def generation_step(meter: StepMeter, rows: int, prompt_len: int, completion_len: int,
                    reward: RewardReads | None) -> GenerationStep:
    """The model FLOPs of a generation step whose ``rows`` completions all have
    ``prompt_len + completion_len`` tokens, charged as the trainer charges a real one."""
    shapes = BatchShapes.worst_case(rows, prompt_len, completion_len)
    scored = 0 if reward is None else rows * reward.row_flops(prompt_len, completion_len)
    return GenerationStep(meter.rollout(shapes).model, scored,
                          meter.learning(shapes, generation_step=True).model)


def generation_step_bound(meter: StepMeter, rows: int, max_prompt_len: int,
                          max_completion_len: int, reward: RewardReads | None) -> int:
    """The budget stop's one rule: the most model FLOPs a generation step can cost, every row
    at the longest prompt and the completion cap, the reward model included. A run takes a
    step only while its total plus this bound stays within the budget (a reuse step, whose
    batch is known, is charged exactly instead), so total <= budget and budget - total < one
    step. The config check, ``race plan``, the trainer and the tests all ask this function."""
    return generation_step(meter, rows, max_prompt_len, max_completion_len, reward).total
