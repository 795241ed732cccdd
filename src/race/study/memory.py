"""Peak device memory of a training or evaluation job, estimated before it runs (bytes).

Convention: tensor memory only (what ``torch.cuda.max_memory_allocated`` reports; no CUDA
context, allocator fragmentation, or the Python process), as the largest of the job's phases
on top of what stays resident through all of them:

* resident: the policy's weights in ``training.dtype``; the LoRA adapters in float32 (PEFT keeps
  adapters in float32 beside a bfloat16 base) with their gradients and AdamW's two moments,
  16 bytes a parameter; the feedback model's weights (float32 on a CPU, its checkpoint's
  bfloat16 on a GPU);
* rollout: the KV cache of every row at prompt + completion length (a static cache,
  race.core.engines, is that long), the decode step's float32 logits (scores and sampling
  probabilities) and one layer's prefill activations, and what the rollout engine holds while
  it generates (:func:`engine_bytes`: a merged copy of the adapted weights, a decoder's
  concatenated weights);
* reward: one scoring batch through the feedback model, one layer's activations at a time
  (inference keeps nothing for a backward);
* learning, per micro-batch (``training.micro_batch_rows``): the activations autograd keeps
  for the backward -- every layer's with all its tensors, or with gradient checkpointing each
  layer's input plus one layer recomputed -- and TRL's chunked log-prob head: a
  ``[min(tokens, 4096), 32768]`` matmul buffer in the compute dtype whatever the vocabulary
  (TRL 1.16's ``TOKEN_CHUNK_SIZE`` x ``chunk_size``) and its float32 tile temporaries.

A layer's activations per token are counted from what a Qwen2 decoder layer with LoRA keeps:
the two RMSNorms' float32 copies, q / k / v / attention output and the residuals (about 6·d and
2·kv wide), the SwiGLU's gate, up, activation and product (4·d_ff), and each adapter's float32
input copy and rank-r intermediate. The estimate is checked against a measurement:
``bench/calibration/memory_estimate.py`` (torch.profiler's memory accounting on the CPU; on a
GPU, ``bench/performance/gpu_check.py`` with ``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from race.core.engines import DEFAULT_ENGINE, Engine, engine
from race.flops import analytic as F

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: TRL 1.16's chunked log-prob head (trl/kernels/chunked_logprob.py): tokens per tile and the
#: width of its matmul buffer (allocated at this width even for a smaller vocabulary).
HEAD_TOKENS, HEAD_WIDTH = 4096, 32768
#: float32 [tokens, vocabulary-chunk] temporaries of one head tile alive at once (logits,
#: shifted, exp, products, their gradient), counted from the kernel's torch fallback.
HEAD_TEMPORARIES = 7
LORA_STATE_BYTES = 16  # float32 weight, gradient and AdamW's two moments
GIB = 1024 ** 3


@dataclass(frozen=True)
class Feedback:
    """A feedback model as memory sees it: its architecture, weight bytes per parameter, and
    the rows x tokens of one scoring batch."""

    arch: F.Arch
    weight_bytes: int
    batch_rows: int
    tokens: int


@dataclass(frozen=True)
class MemoryEstimate:
    """Resident parts plus the phase transients; the peak is resident + the largest phase."""

    resident: dict[str, int]
    phases: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: sum(self.phases[p].values()))

    @property
    def total(self) -> int:
        return sum(self.resident.values()) + max(
            (sum(v.values()) for v in self.phases.values()), default=0)

    @property
    def parts(self) -> dict[str, int]:
        """The resident parts and the peak phase's, by name."""
        return {**self.resident, **{f"{self.peak_phase}.{k}": v
                                    for k, v in self.phases[self.peak_phase].items()}}

    def summary(self) -> str:
        """One line: the total in GiB, then each part."""
        parts = ", ".join(f"{k} {v / GIB:.3g}" for k, v in self.parts.items() if v)
        return f"{self.total / GIB:.3g} GiB ({parts})"


def layer_bytes_per_token(arch: F.Arch, b: int, lora: F.LoraSpec | None) -> int:
    """What autograd keeps of one decoder layer for one token (module docstring)."""
    d, ff, kv = arch.hidden, arch.intermediate, arch.kv_width
    keep = b * (6 * d + 2 * kv + 4 * ff) + 4 * 2 * d * 2  # + the norms' float32 copies
    if lora is not None:
        proj = arch.projections()
        keep += sum(4 * (proj[t][0] + lora.rank) for t in lora.targets)
    return keep


def forward_bytes(arch: F.Arch, b: int, rows: int, tokens: int) -> int:
    """One layer's transient activations of an inference forward (the MLP's three d_ff-wide
    tensors and the hidden states) plus the attention mask."""
    return rows * tokens * b * (3 * arch.intermediate + 4 * arch.hidden) + rows * tokens ** 2


def head_bytes(arch: F.Arch, b: int, tokens: int) -> int:
    """TRL's chunked log-prob head over ``tokens`` positions (module docstring)."""
    tile = min(tokens, HEAD_TOKENS)
    return tile * HEAD_WIDTH * b + HEAD_TEMPORARIES * tile * min(arch.vocab, HEAD_WIDTH) * 4


def kv_cache_bytes(arch: F.Arch, b: int, rows: int, tokens: int) -> int:
    return 2 * arch.layers * arch.kv_width * rows * tokens * b


def decode_bytes(arch: F.Arch, b: int, rows: int, prompt: int) -> int:
    """The decode step's float32 logits and probabilities, and one prefill layer."""
    return 2 * rows * arch.vocab * 4 + forward_bytes(arch, b, rows, prompt)


def engine_bytes(arch: F.Arch, b: int, spec: Engine, lora: F.LoraSpec | None = None
                 ) -> dict[str, int]:
    """What the rollout engine ``spec`` holds while it generates, beyond the cache
    (race.core.engines): a second copy of every adapted projection where it ``merges``
    adapters (``lora``: a training job's; an evaluated policy is merged already) and the
    weights its decoder copies (``decoder_copies``), ``b`` bytes a weight."""
    out = {}
    if spec.merges and lora is not None:
        out["merged_weights"] = F.adapted_weights(arch, lora) * b
    if spec.decoder_copies:
        out["decoder_weights"] = b * F.projection_weights(arch, spec.decoder_copies)
    return out


def train_memory(arch: F.Arch, *, rows: int, micro_rows: int | None, prompt_len: int,
                 completion_len: int, lora: F.LoraSpec, dtype: str, grad_ckpt: bool,
                 feedback: Feedback | None = None,
                 rollout_engine: str = DEFAULT_ENGINE) -> MemoryEstimate:
    """A GRPO + LoRA training job's peak (module docstring), its rollouts generated by
    ``rollout_engine`` (:func:`engine_bytes`)."""
    b = BYTES[dtype]
    tokens = prompt_len + completion_len
    resident = {"policy_weights": arch.params() * b,
                "lora_and_optimizer": F.lora_params(arch, lora) * LORA_STATE_BYTES}
    if feedback is not None:
        resident["feedback_weights"] = feedback.arch.params() * feedback.weight_bytes
    m = rows if micro_rows is None else min(rows, micro_rows)
    per_layer = layer_bytes_per_token(arch, b, lora)
    kept = (arch.layers * m * tokens * arch.hidden * b + m * tokens * per_layer if grad_ckpt
            else arch.layers * m * tokens * per_layer)
    phases = {
        "rollout": {"kv_cache": kv_cache_bytes(arch, b, rows, tokens),
                    "decode": decode_bytes(arch, b, rows, prompt_len),
                    **engine_bytes(arch, b, engine(rollout_engine), lora)},
    }
    phases |= {
        "learning": {"activations": kept, "logprob_head": head_bytes(arch, b, m * tokens)},
    }
    if feedback is not None:
        phases["reward"] = {"scoring": forward_bytes(feedback.arch, feedback.weight_bytes,
                                                     feedback.batch_rows, feedback.tokens)}
    return MemoryEstimate(resident, phases)


def eval_memory(arch: F.Arch, *, batch_rows: int, prompt_len: int, max_new_tokens: int,
                dtype: str, feedbacks: list[Feedback] = (),
                rollout_engine: str = DEFAULT_ENGINE) -> MemoryEstimate:
    """An evaluation job's peak: the merged policy and its feedback models resident (each
    loaded once per job), then generation of one batch by ``rollout_engine``
    (:func:`engine_bytes`) or the largest scoring batch."""
    b = BYTES[dtype]
    resident = {"policy_weights": arch.params() * b}
    phases = {"generation": {
        "kv_cache": kv_cache_bytes(arch, b, batch_rows, prompt_len + max_new_tokens),
        "decode": decode_bytes(arch, b, batch_rows, prompt_len),
        **engine_bytes(arch, b, engine(rollout_engine))}}
    if feedbacks:
        resident["feedback_weights"] = sum(f.arch.params() * f.weight_bytes for f in feedbacks)
        phases["scoring"] = {"scoring": max(
            forward_bytes(f.arch, f.weight_bytes, f.batch_rows, f.tokens) for f in feedbacks)}
    return MemoryEstimate(resident, phases)


# --------------------------------------------------------------------------- jobs of a study


def feedback_of(policy: str, model: str | None, *, prompt_len: int, completion_len: int,
                device: str, dtype: str | None = None, batch_rows: int = 16) -> Feedback | None:
    """The feedback model ``model`` (a path, ladder name or known architecture) scoring rows
    of ``policy``'s prompt + completion: its tokens per row are those of the step bound
    (race.study.plan.reward_reads: measured from the tokenizers where both folders are here,
    the chat template's tokens included). None without a model or when its architecture is
    not known offline."""
    from race.study.plan import reward_reads

    reads = reward_reads(policy, model)
    if reads is None:
        return None
    tokens = reads.tokens(prompt_len, completion_len)
    weight = BYTES[dtype] if dtype in BYTES else (4 if device == "cpu" else 2)
    return Feedback(reads.arch, weight, batch_rows, tokens)


def train_job_memory(job, max_prompt_tokens: int, arch: F.Arch | None = None) -> MemoryEstimate:
    """The estimate of a :class:`race.core.jobs.TrainJob` whose longest prompt is
    ``max_prompt_tokens`` policy tokens, on the job's device (``auto`` counts as a GPU);
    ``arch``: the policy's, when its folder does not exist yet (a ladder size)."""
    arch = arch or F.resolve_arch(job.base)
    a, r = job.alloc, job.reward
    feedback = None if r.model is None or (r.type == "rule+prm" and r.weight == 0) else \
        feedback_of(job.base, r.model, prompt_len=max_prompt_tokens,
                    completion_len=a.max_completion_length, device=job.device, dtype=r.dtype,
                    batch_rows=r.batch_size or 16)
    return train_memory(arch, rows=a.rows, micro_rows=job.micro_batch_rows,
                        prompt_len=max_prompt_tokens, completion_len=a.max_completion_length,
                        lora=a.lora, dtype=job.dtype, grad_ckpt=job.gradient_checkpointing,
                        feedback=feedback, rollout_engine=job.rollout_engine)


def eval_job_memory(job, max_prompt_tokens: int, arch: F.Arch | None = None) -> MemoryEstimate:
    """The estimate of a :class:`race.core.jobs.EvalJob`: its policy, and the feedback
    models it loads, each once (best-of-n's PRM, the native reward's model)."""
    arch = arch or F.resolve_arch(job.policy)
    s = job.spec
    models = [job.prm] if "prm_bon" in s.targets and job.prm else []
    if "native_reward" in s.targets and job.reward is not None and job.reward.model:
        models.append(job.reward.model)
    feedbacks = [feedback_of(job.policy, m, prompt_len=max_prompt_tokens,
                             completion_len=s.max_new_tokens, device=job.device)
                 for m in dict.fromkeys(models)]
    return eval_memory(arch, batch_rows=s.batch_size, prompt_len=max_prompt_tokens,
                       max_new_tokens=max(s.max_new_tokens, s.max_new_tokens_ood),
                       dtype=job.dtype, feedbacks=[f for f in feedbacks if f is not None],
                       rollout_engine=job.engine)


def study_memory(study) -> dict[str, MemoryEstimate]:
    """Every distinct model job of a study with its estimate: one training job per size x
    reward x allocation, one evaluation job per size (a trained rung's evaluation loads the
    same models). Empty when the longest prompt is not known before the data is built
    (``task.max_prompt_tokens``); a size whose architecture is not known offline is left out."""
    from race.core.cells import Cell, is_ladder
    from race.data.tokenizer import VOCAB_SIZE
    from race.study.builders import base_eval_job, train_job

    prompt = study.max_prompt_tokens()
    if prompt is None:
        return {}
    out = {}
    for size in study.sizes:
        try:
            arch = F.resolve_arch(size, vocab=VOCAB_SIZE if is_ladder(size) else None)
        except (ValueError, FileNotFoundError, KeyError):
            continue
        for reward in study.rewards:
            for alloc in study.allocations:
                cell = Cell(size, reward, alloc, study.seeds[0])
                out[f"train {cell.key}"] = train_job_memory(train_job(study, cell), prompt, arch)
        out[f"evaluate size~{size}"] = eval_job_memory(base_eval_job(study, size), prompt, arch)
    return out


def format_study_memory(study) -> str:
    """Per size, the largest training job's and the evaluation job's peak estimate, against
    ``gpu_memory_gb`` when stated."""
    estimates = study_memory(study)
    if not estimates:
        return ("peak memory: not estimated (the longest prompt is known once the data is "
                "built: set task.max_prompt_tokens)")
    limit = (f"gpu_memory_gb {study.gpu_memory_gb:g}" if study.gpu_memory_gb is not None
             else "gpu_memory_gb not stated: not checked")
    lines = [f"peak memory per job (estimate, tensors only, race.study.memory; {limit}):"]
    for size in study.sizes:
        train = {k: v for k, v in estimates.items()
                 if k.startswith("train ") and f"size~{size.replace('/', '--')}/" in k}
        if train:
            name, top = max(train.items(), key=lambda kv: kv[1].total)
            lines.append(f"  {name[len('train '):]}: {top.summary()}")
        ev = estimates.get(f"evaluate size~{size}")
        if ev is not None:
            lines.append(f"  evaluate {size}: {ev.summary()}")
    return "\n".join(lines)
