"""The TRL side of a metered run: GRPOTrainer with seams around its phases, the callback that
charges each step and stops at the budget, and the GRPOConfig a job asks for.

The seams are TRL's own phase methods (``_generate``, ``_calculate_rewards``,
``_generate_and_score_completions``, ``training_step``): the subclass only times them and
records the shapes TRL ran into the :class:`PhaseRecorder` it is built with, so the meter
(race.flops.meter) charges FLOPs from token counts and never changes what TRL computes. The
run that owns the recorder takes each step's record at the step's end; it never reaches into
the trainer. TRL is imported lazily (it is slow to import), so the classes are built by
functions.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from race.core.atomic import saving_weights
from race.core.engines import DEFAULT_ENGINE, engine, static_cache_len
from race.flops.meter import BatchShapes
from race.grpo.adapter_card import canonical_adapter_config
from race.grpo.resume import drop_older_checkpoints


@dataclass
class StepRecord:
    """What the seams saw during one optimizer step: wall seconds per phase and the shapes
    of the batch it generated (None on a reuse step, which generates nothing)."""

    rollout_s: float = 0.0
    reward_s: float = 0.0
    step_s: float = 0.0  # every micro-batch's training_step, generation included
    shapes: BatchShapes | None = None


class PhaseRecorder:
    """The trainer's seams write into it; the metered run takes one :class:`StepRecord` per
    step (:meth:`take`). ``last_shapes`` is the batch of the latest generation step: a reuse
    step trains on it again."""

    def __init__(self) -> None:
        self.current = StepRecord()
        self.last_shapes: BatchShapes | None = None

    def generated(self, shapes: BatchShapes) -> None:
        self.current.shapes = self.last_shapes = shapes

    def take(self) -> StepRecord:
        """This step's record; the next step starts a fresh one."""
        record, self.current = self.current, StepRecord()
        return record


def metered_trainer_class():
    """GRPOTrainer with seams around its phases (imported lazily: TRL is slow to import)."""
    # TRL's profiling module imports mlflow whenever it is installed (~3 s per job on 2 cores)
    # although this trainer reports to nothing (report_to="none"); race.tracking.mlflow_runs
    # does the MLflow logging, and only when asked to.
    os.environ.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")
    import torch
    from trl import GRPOTrainer

    from race.policy.ladder import quiet_checkpointing_renames

    # PEFT (wrapping the policy in its adapters) and TRL (around every generation) call
    # transformers' deprecated checkpointing names: their FutureWarnings, and only those, off.
    quiet_checkpointing_renames()

    class MeteredGRPOTrainer(GRPOTrainer):
        """Records, per step, the shapes TRL ran and the wall time of each phase into
        ``recorder``."""

        def __init__(self, *args, recorder: PhaseRecorder, rollout_engine: str = DEFAULT_ENGINE,
                     **kwargs):
            self.recorder = recorder
            self.engine = engine(rollout_engine)  # race.core.engines
            super().__init__(*args, **kwargs)
            device = self.accelerator.device.type
            self.engine.check_device(device)
            if self.engine.decoder is not None:
                self._check_decoder()
            if device in self.engine.compile_on:
                # TRL builds its generation config with disable_compile=True; a static cache
                # is what lets generate compile its decode forward once.
                self.generation_config.disable_compile = False

        def _clock(self) -> float:
            """Seconds, once the GPU's queued work is done: CUDA kernels run asynchronously,
            and a phase's backward would otherwise be timed in whichever phase waits next."""
            if self.accelerator.device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter()

        def _generate(self, *args, **kwargs):
            t0 = self._clock()
            try:
                return super()._generate(*args, **kwargs)
            finally:
                self.recorder.current.rollout_s += self._clock() - t0

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            # The one place TRL calls generate: the engine's weights for its duration
            # (race.policy.engines), and its decoder in place of generate where it has one.
            from race.policy.engines import generation_weights

            with generation_weights(self.model, self.engine):
                if self.engine.decoder is not None:
                    return self._decoder_generate(prompt_ids), None
                return super()._generate_single_turn(prompt_ids, *args, **kwargs)

        def _check_decoder(self) -> None:
            """Before any step: TRL's regular generation path on one process, sampling at the
            temperature alone (what :func:`grpo_config` asks for and the decoder implements);
            anything else would be generated differently, so it is refused."""
            from race.policy.engines import decoder_class

            decoder = decoder_class(self.engine)
            decoder.check_supported(self.model.config)
            plain = (self.top_k == 0 and self.top_p == 1.0 and self.args.generation_kwargs is None
                     and self.pad_to_multiple_of is None
                     and decoder.plain_sampling(self.generation_config))
            if not plain or self.use_vllm or self.use_transformers_continuous_batching \
                    or self.accelerator.num_processes > 1:
                raise ValueError(f"the {self.engine.name} rollout engine replaces TRL's regular "
                                 "generate on one process, sampling at top_k 0 and top_p 1 "
                                 "with no other logits processor")

        def _decoder_generate(self, prompt_ids: list[list[int]]) -> list[list[int]]:
            """TRL's regular generation path with the engine's decoder (race.policy.decoder)
            in place of ``generate``: prompts left-padded, completions cut after their first
            EOS (kept), as TRL returns them (:meth:`_check_decoder` holds)."""
            from trl.trainer.utils import pad

            from race.policy.engines import decoder_class
            from race.policy.generation import completion_lengths

            device = self.accelerator.device
            pad_id = self._tokenizer.pad_token_id
            rows = [torch.tensor(p) for p in prompt_ids]
            ids = pad(rows, padding_value=pad_id, padding_side="left").to(device)
            mask = pad([torch.ones_like(r) for r in rows], padding_side="left").to(device)
            decoder = decoder_class(self.engine)(self.model.get_base_model())
            new = decoder.generate(ids, mask, max_new_tokens=self.max_completion_length,
                                   do_sample=True, temperature=self.temperature,
                                   eos_token_ids=self.eos_token_ids, pad_token_id=pad_id)
            # As TRL cuts them: after the first EOS; a row without one is kept whole.
            return [row[:n] for row, n in zip(new.tolist(), completion_lengths(
                new, self.eos_token_ids, None), strict=True)]

        def _static_cache_len(self) -> int | None:
            """Positions of the static KV cache the last generate ran with (transformers keeps
            the largest it has built on the model), None under a dynamic cache."""
            from race.policy.engines import cache_len_of

            return cache_len_of(self.model, self.engine)

        def _calculate_rewards(self, *args, **kwargs):
            t0 = self._clock()
            try:
                return super()._calculate_rewards(*args, **kwargs)
            finally:
                self.recorder.current.reward_s += self._clock() - t0

        def _save_checkpoint(self, model, trial):
            """TRL's checkpoint, its weights following the umask and its adapter config
            reproducible; a full disk is an error that says so, and the partial folder is
            removed (the callback drops older checkpoints only after a complete save)."""
            folder = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
            with saving_weights(folder, f"checkpoint {folder}", discard_partial=True):
                super()._save_checkpoint(model, trial)
                canonical_adapter_config(folder)

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.recorder.generated(BatchShapes.from_masks(out["prompt_mask"],
                                                           out["completion_mask"],
                                                           self._static_cache_len()))
            return out

        def training_step(self, *args, **kwargs):
            # Called once per micro-batch: the optimizer step's time is their sum.
            t0 = self._clock()
            out = super().training_step(*args, **kwargs)
            self.recorder.current.step_s += self._clock() - t0
            return out

    return MeteredGRPOTrainer


def budget_callback_class():
    from transformers import TrainerCallback

    class BudgetCallback(TrainerCallback):
        """Charges each step to the ledger, snapshots rungs, stops at the budget, logs."""

        def __init__(self, run):
            self.run = run

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.run.end_of_step(state.global_step, model)
            if self.run.finished:
                control.should_training_stop = True
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.run.log_metrics(state.global_step, logs or {})

        def on_save(self, args, state, control, **kwargs):
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            # RACE's state completes the checkpoint: a full disk here is reported like one
            # during TRL's save (MeteredGRPOTrainer._save_checkpoint).
            with saving_weights(ckpt, f"checkpoint {ckpt}", discard_partial=True):
                self.run.save_state(ckpt, state.global_step)
            drop_older_checkpoints(ckpt)  # only now: the new one is complete

    return BudgetCallback


def fused_head_is_compact(device: str = "cpu") -> bool:
    """Whether TRL's fused LM head scores only the labelled positions (Triton devices) rather
    than every position (elsewhere, e.g. CPU), on the run's ``device`` (``cpu`` or ``cuda``:
    a CPU job on a GPU host runs the CPU's head)."""
    import torch

    try:
        from trl.trainer.utils import _use_triton
    except ImportError:  # a TRL without the fused head: logits at completion positions only
        return True
    return bool(_use_triton(torch.device(device)))




def micro_batches(rows: int, micro_batch_rows: int | None) -> int:
    """How many equal micro-batches a step of ``rows`` rows is cut into: the fewest whose size
    divides ``rows`` and is at most ``micro_batch_rows`` (None: one)."""
    if micro_batch_rows is None or micro_batch_rows >= rows:
        return 1
    return next(n for n in range(-(-rows // micro_batch_rows), rows + 1) if rows % n == 0)


def grpo_config(job, max_steps: int, device: str = "cpu", max_prompt_len: int | None = None):
    """The TRL config of a :class:`race.core.jobs.TrainJob`: one generation batch per
    optimizer step, its rows cut into :func:`micro_batches` whose gradients accumulate into
    that step, LR constant after ``warmup_steps``, weights in ``job.dtype`` (bf16 autocast
    when bfloat16), on ``device`` (resolved: ``cpu`` or ``cuda``; the trainer moves the policy
    there); under the ``static`` rollout engine, a KV cache sized once for the job's longest
    prompt (``max_prompt_len`` tokens)."""
    from trl import GRPOConfig

    a = job.alloc
    static = engine(job.rollout_engine).static_cache
    if static and max_prompt_len is None:
        raise ValueError("the static rollout engine sizes its cache from max_prompt_len")
    save_every = max(a.num_iterations, job.save_every // a.num_iterations * a.num_iterations)
    chunks = micro_batches(a.rows, job.micro_batch_rows)
    return GRPOConfig(
        output_dir=str(Path(job.run_dir) / "checkpoints"),
        per_device_train_batch_size=a.rows // chunks,
        # TRL generates once per steps_per_generation micro-batches and splits that batch
        # among them; with as many accumulation steps, one generation feeds one optimizer step.
        gradient_accumulation_steps=chunks,
        steps_per_generation=chunks,
        num_generations=a.num_generations,
        num_iterations=a.num_iterations,
        max_completion_length=a.max_completion_length,
        temperature=a.temperature,
        cache_implementation="static" if static else None,
        # One cache size for the whole run: generate would otherwise grow it with the longest
        # batch so far (and recompile on CUDA each time it grows).
        generation_kwargs={"max_cache_len": static_cache_len(
            max_prompt_len, a.max_completion_length)} if static else None,
        top_k=0,
        top_p=1.0,
        beta=a.beta,
        learning_rate=a.learning_rate,
        # Warmup counted in steps, then constant: the LR at step t does not depend on the run's
        # length, so the run to the top rung passes every smaller rung exactly as its own run.
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=a.warmup_steps,
        scale_rewards=a.scale_rewards,
        loss_type=a.loss_type,
        max_grad_norm=a.max_grad_norm,
        max_steps=max_steps,
        seed=job.seed,
        data_seed=job.seed,
        # TRL's accelerator moves the policy to its device: with use_cpu=True on a GPU host the
        # policy would silently stay on the CPU, and without it on a CPU job it would take a GPU.
        use_cpu=device == "cpu",
        # The policy is loaded in job.dtype; bf16 also runs the step under bf16 autocast.
        bf16=job.dtype == "bfloat16",
        activation_checkpointing=job.gradient_checkpointing,
        logging_steps=1,
        save_strategy="steps",
        save_steps=save_every,
        # The callback keeps the latest complete checkpoint (drop_older_checkpoints).
        save_total_limit=None,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
        remove_unused_columns=False,
        shuffle_dataset=True,
    )
