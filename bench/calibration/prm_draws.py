"""How far a PRM's step AUC moves with its training seed, length, LR, batching and backbone
(gate A).

    python bench/calibration/prm_draws.py [--size mini] [--seeds 0 1] [--groups 4 1]
        [--steps 4500] [--lr 1e-3] [--results results] [--set prm.init=random ...]
        [--backbone DIR]
    python bench/calibration/prm_draws.py --results results --score-with OTHER/prm/size~mini ...

Trains the PRM of ladder size ``--size`` exactly as ``race prm`` does (the config's ``prm:``
section; ``--steps`` and ``--lr`` override its steps and learning rate, ``--set`` any key, e.g.
``prm.init=random``) on the base policies of a finished study (``--results``, after ``make run``),
once per seed x micro-batches per batch (``--groups``: 1 = each batch padded whole,
:data:`race.policy.optim.LENGTH_GROUPS` = what the study runs), into temporary folders.
Prints one line per run: the held-out step AUC overall, on the step lines alone (answer lines
left out: ``heldout.sampled_no_answer``) and per error family (``prm.json``'s ``auc`` and
``auc_by_error``), the final training loss and the wall seconds. Gate A wants the strong (mini)
PRM at 0.90 or more and above the weak one; whether it gets there for more than one draw is
what this shows. Prints, never asserts; about 14 minutes per run at the default 4500 steps
on 5000 prompts on one core (sampling them takes about 2 of those).

Which of data and backbone sets the AUC: ``--backbone DIR`` starts the PRM from another
checkpoint of the same architecture (e.g. another task seed's base policy, from
``bench/study/task_seeds.py``) while the training data stay this study's; ``--score-with PRM ...``
trains nothing and scores this study's held-out PRM samples (``prm/size~<size>/samples.jsonl``)
with already trained PRMs (e.g. another task seed's): a PRM that checks arithmetic on its own
draw and on this one says the held-out data are sound and the training did not learn it.
"""

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common

import torch

from bench.common import add_set_option, results_folder, study_config
from race.core.specs import PRMSpec
from race.data.tokenizer import load_tokenizer
from race.feedback.prm_data import Example
from race.feedback.prm_training import (
    headline_metrics,
    heldout_metrics,
    read_examples,
    train_prm,
)
from race.policy.optim import LENGTH_GROUPS


def score_with(prm_dir: Path, examples: list[Example]) -> dict:
    """Held-out metrics (as ``prm.json`` reports them) of the trained PRM in ``prm_dir``."""
    from transformers import Qwen2ForTokenClassification

    model = Qwen2ForTokenClassification.from_pretrained(prm_dir, use_safetensors=True).eval()
    return headline_metrics(heldout_metrics(model, load_tokenizer(prm_dir), examples))


def report(label: str, r: dict) -> None:
    families = "  ".join(f"{k} {v:.2f}" for k, v in sorted(r["auc_by_error"].items())
                         if v is not None)
    steps = r["heldout"]["sampled_no_answer"]["auc"]  # None: one class only
    extra = (f" | final loss {r['final_loss']:.3f} | {r['wall_s']:.0f} s"
             if "final_loss" in r else "")
    print(f"  {label}: AUC {r['auc']:.3f} (step lines "
          f"{'n/a' if steps is None else f'{steps:.3f}'}) | {families}{extra}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--results", default=None, type=Path,
                        help="the study's results folder (default: the config's results_dir)")
    parser.add_argument("--size", default="mini")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--groups", nargs="+", type=int, default=[LENGTH_GROUPS])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    add_set_option(parser)
    parser.add_argument("--backbone", type=Path, default=None,
                        help="start the PRM from this checkpoint's backbone (same architecture)")
    parser.add_argument("--score-with", nargs="+", type=Path, default=[],
                        help="train nothing: score the study's held-out PRM samples with these "
                             "trained PRM folders")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = study_config(args.config, args.overrides)
    results = results_folder(config, args.results)
    spec = PRMSpec.from_config(config["prm"])
    spec = replace(spec, steps=args.steps or spec.steps,
                   learning_rate=args.lr or spec.learning_rate)
    if args.score_with:
        examples = read_examples(results / "prm" / f"size~{args.size}" / "samples.jsonl")
        print(f"held-out PRM samples of {results} ({len(examples)} completions) scored by:")
        for prm_dir in args.score_with:
            report(str(prm_dir), score_with(prm_dir, examples))
        return
    policies = [results / "base" / f"size~{s}" for s in config["sizes"]]
    print(f"PRM {args.size}: steps {spec.steps}, lr {spec.learning_rate:g}, "
          f"{' '.join(args.overrides)} base policies of {results}, backbone "
          f"{args.backbone or 'as configured'}", flush=True)
    for seed in args.seeds:
        for groups in args.groups:
            with tempfile.TemporaryDirectory() as out:
                r = train_prm(args.size, policies, results / "data", out,
                              replace(spec, seed=seed), length_groups_per_batch=groups,
                              backbone=args.backbone)
            report(f"seed {seed} groups {groups}", r)


if __name__ == "__main__":
    main()
