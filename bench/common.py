"""What more than one bench script uses: config overrides, the study's folders, running the
workflow, the FLOP-calibration phases and the paired ``race train`` vs TRL step timing.

A script imports it as ``bench.common`` after putting the repository root on ``sys.path``
(the one line after its standard-library imports), so that both
``python bench/<group>/<script>.py`` and ``python -m bench.<group>.<script>`` work from the
repository root. Torch, transformers, PEFT and TRL are imported inside the functions that use
them: a script's ``--help`` does not load them.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from race.core.jobs import TrainJob
from race.core.specs import Allocation
from race.flops import analytic as F
from race.study.config import load_config

#: The repository root and the bench folder.
ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


# -- configs and folders ----------------------------------------------------------------------

def apply_overrides(config: dict, overrides: list[str]) -> dict:
    """``section.key=value`` pairs (value parsed as YAML) over a copy of ``config``."""
    config = copy.deepcopy(config)
    for item in overrides:
        dotted, _, raw = item.partition("=")
        section, _, key = dotted.partition(".")
        if not key:
            raise SystemExit(f"--set {item!r}: expected section.key=value")
        config.setdefault(section, {})[key] = yaml.safe_load(raw)
    return config


def add_set_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """The ``--set section.key=value ...`` option (``args.overrides``, for
    :func:`apply_overrides`)."""
    parser.add_argument("--set", dest="overrides", nargs="*", default=[],
                        help=help or "section.key=value overrides of the config (YAML values)")


def study_config(path: str | Path, overrides: Sequence[str] = ()) -> dict:
    """The resolved config at ``path`` with ``overrides`` (:func:`apply_overrides`) applied,
    checked again as a whole: written to a temporary YAML file and loaded as ``race`` loads
    a config (a resolved config is a valid config file, as the workflow's per-folder configs
    are)."""
    config = load_config(path)
    if not overrides:
        return config
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "config.yaml"
        file.write_text(yaml.safe_dump(apply_overrides(config, list(overrides)), sort_keys=False))
        return load_config(file)


def results_folder(config: dict, given: Path | None = None) -> Path:
    """The study's results folder: ``given`` (a ``--results`` option), else the config's
    ``results_dir``."""
    return Path(given or config["results_dir"])


# -- the workflow -----------------------------------------------------------------------------

def run(cmd: list[str], cwd: Path) -> None:
    """``cmd`` in ``cwd`` on one thread per process, echoed first; fails on a non-zero exit."""
    print(f"$ (cd {cwd} && {' '.join(cmd)})", flush=True)
    subprocess.run(cmd, cwd=cwd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def run_workflow(folder: Path, cores: int, *targets: str) -> None:
    """The repository's workflow on ``folder/config.yaml``, in ``folder`` (its own results/,
    reports/ and logs)."""
    run([sys.executable, "-m", "snakemake", *targets, "--snakefile", str(ROOT / "Snakefile"),
         "--directory", str(folder), "--cores", str(cores), "--quiet", "rules",
         "--configfile", "config.yaml"], folder)


# -- FLOP calibration phases ------------------------------------------------------------------

SEQ, BATCH, PROMPT, NEW = 37, 2, 13, 6
LORA_SETS = {"all": F.ALL_PROJECTIONS, "qv": ("q_proj", "v_proj"), "mlp": F.MLP_PROJECTIONS}
RANK = 8


@functools.cache
def flop_configs() -> dict[str, dict]:
    """The calibration's Qwen2 configs by name: three tiny hand-made shapes and the ladder's
    nano and micro rungs (vocabulary 64)."""
    from race.policy.ladder import ladder_config

    return {
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


def qwen2_config(values: dict, impl: str, **extra):
    """A ``Qwen2Config`` of ``values`` (special tokens 0, 1, 2) with attention ``impl``."""
    from transformers import Qwen2Config

    clean = {k: v for k, v in values.items()
             if k not in ("pad_token_id", "bos_token_id", "eos_token_id")}
    cfg = Qwen2Config.from_dict({**clean, "pad_token_id": 0, "bos_token_id": 1,
                                 "eos_token_id": 2, **extra})
    cfg._attn_implementation = impl
    return cfg


def with_lora(model, targets):
    """``model`` with LoRA adapters of rank :data:`RANK` on the ``targets`` projections."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=RANK, target_modules=list(targets),
                                            lora_dropout=0.0))


def phases(values: dict, impl: str, device: str = "cpu"):
    """Yield (phase, measure() -> int, analytic executed, analytic model) per phase -- forward,
    full and LoRA training steps, a checkpointed LoRA step, a KV-cached generate, a reward-model
    forward -- the models and inputs on ``device``."""
    import torch
    from transformers import Qwen2ForCausalLM, Qwen2ForTokenClassification

    from race.flops.counter import measure_forward, measure_generate, measure_train_step

    arch = F.Arch.from_config(qwen2_config(values, impl))
    att = "full" if impl == "eager" else "sdpa"
    vocab = values["vocab_size"]

    def ids(n):
        return torch.randint(3, vocab, (BATCH, n), device=device)

    def causal_lm():
        torch.manual_seed(0)
        return Qwen2ForCausalLM(qwen2_config(values, impl)).to(device)

    yield ("forward", lambda: measure_forward(causal_lm().eval(), ids(SEQ)),
           BATCH * F.forward_flops(arch, SEQ, attention=att), BATCH * F.forward_flops(arch, SEQ))
    yield ("train full", lambda: measure_train_step(causal_lm().train(), ids(SEQ)),
           BATCH * F.train_flops(arch, SEQ, attention=att), BATCH * F.train_flops(arch, SEQ))
    for name, targets in LORA_SETS.items():
        spec = F.LoraSpec(RANK, targets)
        yield (f"train LoRA {name}",
               lambda t=targets: measure_train_step(with_lora(causal_lm(), t).train(), ids(SEQ)),
               BATCH * F.train_flops(arch, SEQ, lora=spec, attention=att),
               BATCH * F.train_flops(arch, SEQ, lora=spec))
    spec = F.LoraSpec(RANK, F.MLP_PROJECTIONS)

    def ckpt():
        model = with_lora(causal_lm(), F.MLP_PROJECTIONS)
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
        return measure_forward(Qwen2ForTokenClassification(qwen2_config(values, impl, num_labels=2))
                               .to(device).eval(), ids(SEQ))

    yield ("reward forward", reward,
           BATCH * F.reward_model_flops(arch, SEQ, attention=att),
           BATCH * F.reward_model_flops(arch, SEQ))


# -- race train vs TRL's GRPOTrainer, paired ---------------------------------------------------

#: The paired runs' allocation.
ALLOC = Allocation(num_generations=8, prompts_per_step=4, max_completion_length=32)


class StepTimer:
    """A TrainerCallback timing each loop iteration, ``on_step_begin`` to ``on_step_begin``."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self

        class _Cb(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                now = time.perf_counter()
                if timer.t0 is not None:
                    timer.times.append(now - timer.t0)
                timer.t0 = now

        self.times, self.t0, self.callback = [], None, _Cb()


def vanilla(job: TrainJob, steps: int, device: str = "cpu") -> list[float]:
    """Step times of TRL's own GRPOTrainer on ``job``'s policy, data and LoRA, ``steps`` steps."""
    import torch
    from peft import LoraConfig
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from race.data.tokenizer import load_tokenizer
    from race.feedback.rewards import RuleReward
    from race.grpo.run import _dataset
    from race.grpo.trainer import grpo_config
    from race.policy.ladder import load_policy

    tok = load_tokenizer(job.base)
    dataset, max_prompt = _dataset(job.train_data, tok)
    timer = StepTimer()
    args = grpo_config(job, steps, device, max_prompt)
    trainer = GRPOTrainer(model=load_policy(job.base, dtype=getattr(torch, job.dtype)),
                          reward_funcs=[RuleReward()], args=args, train_dataset=dataset,
                          processing_class=tok, callbacks=[timer.callback],
                          peft_config=LoraConfig(r=job.alloc.lora_rank,
                                                 lora_alpha=job.alloc.alpha,
                                                 target_modules=list(job.alloc.lora_targets),
                                                 task_type="CAUSAL_LM"))
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return timer.times


def race_run(job: TrainJob, steps: int) -> list[float]:
    """Step times of ``race train`` on ``job``, stopped after ``steps`` steps."""
    import race.grpo.run as rt

    timer = StepTimer()
    original = rt.budget_callback_class

    def with_stop():
        cls = original()

        class Stop(cls):
            def on_step_end(self, args, state, control, **kw):
                out = super().on_step_end(args, state, control, **kw)
                if state.global_step >= steps:
                    control.should_training_stop = True
                    self.run.finished = True
                return out

            def on_step_begin(self, args, state, control, **kw):
                timer.callback.on_step_begin(args, state, control)

        return Stop

    rt.budget_callback_class = with_stop
    try:
        rt.run_training(job)
    finally:
        rt.budget_callback_class = original
    return timer.times


def paired(job: TrainJob, steps: int, rounds: int, device: str = "cpu",
           skip: int = 2) -> tuple[list[float], list[float]]:
    """(vanilla, race) step times over ``rounds`` alternating rounds of ``steps`` steps each,
    the first ``skip`` steps of every run left out (warm-up). Each round gets fresh run
    folders beside ``job.run_dir``."""
    vanilla_times, race_times = [], []
    for r in range(rounds):
        race_job = dataclasses.replace(job, run_dir=f"{job.run_dir}/race{r}",
                                       run_key=f"{job.run_key}/round~{r}")
        plain_job = dataclasses.replace(job, run_dir=f"{job.run_dir}/vanilla{r}")
        for kind in (["vanilla", "race"] if r % 2 == 0 else ["race", "vanilla"]):
            if kind == "vanilla":
                vanilla_times += vanilla(plain_job, steps, device)[skip:]
            else:
                race_times += race_run(race_job, steps)[skip:]
    return vanilla_times, race_times


#: The GPU benches' policy: the Qwen2.5-0.5B architecture (random init).
REFERENCE = "Qwen2.5-0.5B"


def reference_policy(tok):
    """The Qwen2.5-0.5B architecture with the task's character vocabulary, random init."""
    import torch
    from transformers import Qwen2ForCausalLM

    from race.flops import known_configs

    torch.manual_seed(0)
    return Qwen2ForCausalLM(known_configs.qwen2_config(
        REFERENCE, vocab_size=len(tok), pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))


def tiny_study(root: Path, build=None) -> tuple[Path, Path]:
    """(base policy folder, train JSONL) under ``root``: a small train split and the random-init
    policy ``build(tokenizer)`` (default: the ladder's micro rung)."""
    from race.core.specs import TaskSpec
    from race.data.task import write_splits
    from race.data.tokenizer import load_tokenizer, save_tokenizer
    from race.policy.ladder import build_ladder_model

    write_splits(TaskSpec(n_train=500, n_eval_in=10, n_eval_ood=10), root / "data")
    tok = load_tokenizer(save_tokenizer(root / "tok"))
    model = build(tok) if build else build_ladder_model("micro", tok)
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    return root / "base", root / "data" / "train.jsonl"
