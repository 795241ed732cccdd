"""What a saved rung adapter says about itself: a base model that resolves from anywhere, and
a short card stating how it was trained (instead of PEFT's empty template).

PEFT records ``base_model_name_or_path`` as the policy was loaded, and a run loads its base
from a path relative to the study's working directory (``results/base/size~nano``), which no
longer resolves once the adapter is read from elsewhere. A local base becomes an absolute path;
a hub id stays as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

from race.core.atomic import write_text_atomic
from race.core.cells import format_budget


def resolvable_base(base: str) -> str:
    """An absolute path for a local base policy, the hub id otherwise."""
    return str(Path(base).resolve()) if Path(base).exists() else base


def card(job, budget: float, summary: dict) -> str:
    """The adapter's README.md: YAML front matter for the hub, then what trained it."""
    a = job.alloc
    base = resolvable_base(job.base)
    reward = ", ".join(f"{k}={v}" for k, v in sorted(job.reward.to_dict().items()))
    lines = [
        "---", f"base_model: {base}", "library_name: peft", "pipeline_tag: text-generation",
        "tags: [race, grpo, lora, trl]", "---", "",
        f"# RACE rung adapter: {job.run_key or Path(job.run_dir).name}, budget "
        f"{format_budget(budget)} FLOPs", "",
        f"LoRA adapter (rank {a.lora_rank}, alpha {a.alpha:g}, on "
        f"{', '.join(a.lora_targets)}) of `{base}`, trained with GRPO (TRL) by RACE until the "
        f"next step could pass {budget:.4g} model FLOPs.", "",
        f"- steps {summary['steps']}, optimizer updates {summary['updates']}, rollouts "
        f"{summary['rollouts']} ({a.prompts_per_step} prompts x {a.num_generations} "
        f"completions per generation, {a.num_iterations} update(s) per generation batch)",
        f"- model FLOPs {summary['model_flops']:.4g}: rollout "
        f"{summary['phases']['rollout']['model_flops']:.4g}, learning "
        f"{summary['phases']['learning']['model_flops']:.4g}, reward "
        f"{summary['phases']['reward']['model_flops']:.4g}",
        f"- reward: {reward}",
        f"- learning rate {a.learning_rate:g} ({a.warmup_steps} warmup steps, then constant), "
        f"loss {a.loss_type}, reward scaling {a.scale_rewards}, KL beta {a.beta:g}, "
        f"temperature {a.temperature:g}, completions up to {a.max_completion_length} tokens, "
        f"seed {job.seed}",
        "- the FLOP ledger of these steps: `ledger.json` in this folder", "",
    ]
    return "\n".join(lines)


#: adapter_config.json fields that PEFT holds as sets and writes in set order, which changes from
#: one process to the next (Python salts string hashes per process).
SET_FIELDS = ("target_modules", "exclude_modules")


def canonical_adapter_config(folder: str | Path, base: str | None = None) -> None:
    """Rewrite ``folder/adapter_config.json`` so that one config is always the same bytes:
    keys sorted, :data:`SET_FIELDS` lists sorted, a final newline; ``base``, when given,
    replaces ``base_model_name_or_path``."""
    path = Path(folder) / "adapter_config.json"
    config = json.loads(path.read_text())
    for field in SET_FIELDS:
        if isinstance(config.get(field), list):
            config[field] = sorted(config[field])
    if base is not None:
        config["base_model_name_or_path"] = base
    write_text_atomic(path, json.dumps(config, indent=2, sort_keys=True) + "\n")


def finish_adapter(folder: str | Path, job, budget: float, summary: dict) -> None:
    """Point the saved adapter at a resolvable base, make its config reproducible and replace
    PEFT's template card."""
    folder = Path(folder)
    canonical_adapter_config(folder, resolvable_base(job.base))
    write_text_atomic(folder / "README.md", card(job, budget, summary))
