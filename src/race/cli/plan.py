"""``race plan``: what a FLOP budget buys for one size x allocation x reward, before training.

    race plan SIZE --budget B [--prompts P] [--generations G] [--iterations MU]
              [--prompt-len T] [--completion-len C] [--lora-rank R] [--lora-targets q_proj,...]
              [--beta BETA] [--grad-ckpt] [--prm SIZE]
              [--mean-completion M] [--flops-per-second S] [--json]
    race plan --config CONFIG --size SIZE --alloc NAME [--reward NAME] [--budget B]
              [--prompt-len T] [--prm ARCH] [--mean-completion M] [--flops-per-second S]
    race plan --gap D --accuracy P [--power Q] [--correlation RHO] [--json]

SIZE is a ladder size (nano, micro, mini), a known architecture (``Qwen2.5-1.5B``, any case, or
``Qwen/Qwen2.5-1.5B``) or a model folder. With ``--config`` the rows (prompts x generations),
updates per batch, completion cap, LoRA, beta and gradient checkpointing come from the study's
allocation, the reward's PRM (or ORM) is charged, the prompt length is the arithmetic task's
longest prompt (``--prompt-len`` otherwise) and the budget defaults to the largest rung;
``--prm ARCH`` stands in for a reward model not resolvable offline (a hub id).

Prints, in model FLOPs (race.study.plan: real tokens, causal attention, the LoRA policy's
forward + backward, frozen base), one generation step's cost per phase (rollout, reward,
learning) and one reuse step's when ``num_iterations > 1`` -- through the trainer's own meter
(race.flops.meter.StepMeter) -- then the steps, updates and rollouts the budget buys under the
trainer's stop rule. The worst case (every completion at the cap: what the stop reserves, so
the fewest steps) always; the typical case with ``--mean-completion M`` (every completion M
tokens: an assumption); the time at ``--flops-per-second`` (an assumed sustained rate, not a
measurement).

``--gap D --accuracy P`` asks another question: how many evaluation prompts resolve a gap of D
(a fraction: 0.05 is 5 points) between two configs around accuracy P, at the report's decision
line z >= 2 (race.analysis.power: a paired comparison on the same prompts, the configs at
P +/- D/2, each prompt's score variance p(1 - p), exact for greedy pass@1 and an upper bound for
sampled pass@1; ``--correlation`` of the two configs' per-prompt scores, default 0, lowers it;
``--power`` 0.5 by default: the prompts at which the expected z is 2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HELP = "what a FLOP budget buys (per-phase step FLOPs, steps, updates, rollouts, time)"

#: Flags mode defaults (64 rows x (64 + 256) tokens, LoRA rank 16 on every projection).
DEFAULTS = {"prompts": 8, "generations": 8, "iterations": 1, "prompt_len": 64,
            "completion_len": 256, "lora_rank": 16, "beta": 0.0}
#: Flags that shape the step; with --config they come from the allocation instead.
SHAPE_FLAGS = ("prompts", "generations", "iterations", "completion_len", "lora_rank",
               "lora_targets", "beta")


def add_arguments(p) -> None:
    p.add_argument("size", nargs="?", help="ladder size, known architecture or model folder")
    p.add_argument("--budget", type=float, help="model FLOPs, e.g. 1e18 (with --config: "
                                                "default the largest rung)")
    p.add_argument("--config", help="study config: the allocation and reward come from it")
    p.add_argument("--size", dest="size_option", help="with --config: the policy size")
    p.add_argument("--alloc", help="with --config: an allocation name")
    p.add_argument("--reward", help="with --config: a reward name (its PRM / ORM is charged; "
                                    "default: a rule verifier, 0 FLOPs)")
    d = DEFAULTS
    p.add_argument("--prompts", type=int, help=f"prompts per step ({d['prompts']})")
    p.add_argument("--generations", type=int, help=f"completions per prompt ({d['generations']})")
    p.add_argument("--iterations", type=int, help=f"updates per generation batch "
                                                  f"({d['iterations']})")
    p.add_argument("--prompt-len", type=int, help=f"prompt tokens, the longest ({d['prompt_len']};"
                                                  " with --config: the task's longest prompt)")
    p.add_argument("--completion-len", type=int, help=f"completion cap in tokens "
                                                      f"({d['completion_len']})")
    p.add_argument("--mean-completion", type=int, help="typical completion length in tokens: "
                                                       "the typical case beside the worst case")
    p.add_argument("--lora-rank", type=int, help=f"LoRA rank ({d['lora_rank']})")
    p.add_argument("--lora-targets", help="comma-separated adapted projections (default all "
                                          "seven)")
    p.add_argument("--beta", type=float, help="KL coefficient (> 0: a reference forward is "
                                              "charged; default 0)")
    p.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing (its "
                                                            "recompute is charged)")
    p.add_argument("--prm", help="PRM of the reward: a ladder size, known architecture or model "
                                 "folder (default: a rule verifier, 0 FLOPs; with --config it "
                                 "stands in for the reward's own model, e.g. a hub id)")
    p.add_argument("--flops-per-second", type=float,
                   help="ASSUMED sustained model FLOP/s, for the time (e.g. 0.3 * 989e12 = "
                        "2.967e14: 30%% of an H100's dense bf16 peak)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    g = p.add_argument_group("evaluation size (instead of a budget plan)")
    g.add_argument("--gap", type=float, help="accuracy gap to resolve, a fraction (0.05 = 5 "
                                             "points): prints the evaluation prompts needed")
    g.add_argument("--accuracy", type=float, help="with --gap: the accuracy around which the "
                                                  "two configs sit, a fraction")
    g.add_argument("--power", type=float, default=None,
                   help="with --gap: chance of reaching z >= 2 if the gap is real (default "
                        "0.5: the expected z is 2)")
    g.add_argument("--correlation", type=float, default=0.0,
                   help="with --gap: correlation of the two configs' per-prompt scores on the "
                        "shared prompts (default 0: an upper bound on the prompts)")


def _size(spec: str) -> str:
    """A known architecture's canonical name, whatever its case (``qwen2.5-1.5b``)."""
    from race.flops import known_configs

    if Path(spec).exists():
        return spec
    bare = spec.rsplit("/", 1)[-1].lower()
    return next((n for n in known_configs.names() if n.lower() == bare), spec)


def _from_flags(args) -> dict:
    from race.flops import analytic as F

    v = {k: getattr(args, k) if getattr(args, k) is not None else d for k, d in DEFAULTS.items()}
    targets = (tuple(t.strip() for t in args.lora_targets.split(",") if t.strip())
               if args.lora_targets else F.ALL_PROJECTIONS)
    return {"prompts": v["prompts"], "generations": v["generations"],
            "num_iterations": v["iterations"], "prompt_len": v["prompt_len"],
            "completion_len": v["completion_len"], "lora": F.LoraSpec(v["lora_rank"], targets),
            "beta": v["beta"], "grad_ckpt": args.grad_ckpt, "reward_model": args.prm,
            "reward_head": "token", "budget": args.budget}


def _from_config(args) -> dict:
    from race.core.specs import RewardSpec
    from race.study.config import load_study

    given = [k for k in SHAPE_FLAGS if getattr(args, k) is not None] + (
        ["grad_ckpt"] if args.grad_ckpt else [])
    if given:
        raise ValueError(f"--config takes the step's shape from the allocation: drop "
                         f"{', '.join('--' + k.replace('_', '-') for k in given)}")
    if not args.alloc:
        raise ValueError("--config needs --alloc (and --size)")
    study = load_study(args.config)
    if args.alloc not in study.allocations:
        raise ValueError(f"--alloc {args.alloc!r} is not one of {list(study.allocations)}")
    if args.reward is not None and args.reward not in study.rewards:
        raise ValueError(f"--reward {args.reward!r} is not one of {list(study.rewards)}")
    a = study.allocations[args.alloc]
    reward = study.rewards[args.reward] if args.reward else RewardSpec()
    model = reward.model
    if reward.type == "rule" or (reward.type == "rule+prm" and reward.weight == 0):
        if args.prm:
            raise ValueError(f"--prm: reward {args.reward or 'rule'!r} runs no reward model "
                             "(name one with --reward)")
        model = None  # a rule verifier, or a rule+prm reward that never runs its PRM
    elif args.prm:
        model = args.prm  # an architecture standing in for the reward's model
    prompt_len = args.prompt_len or study.max_prompt_tokens()
    if prompt_len is None:
        raise ValueError(f"task.kind {study.source.kind!r}: prompt lengths are known only "
                         "once the data is built; give --prompt-len")
    from race.core.cells import Cell
    from race.study.builders import base_eval_job, train_job

    size = args.size or args.size_option
    return {"prompts": a.prompts_per_step, "generations": a.num_generations,
            "num_iterations": a.num_iterations, "prompt_len": prompt_len,
            "completion_len": a.max_completion_length, "lora": a.lora, "beta": a.beta,
            "grad_ckpt": study.training.gradient_checkpointing, "reward_model": model,
            "reward_head": "sequence" if reward.type == "orm" else "token",
            "budget": args.budget or study.budgets[-1],
            # The jobs this cell runs, for their peak-memory estimates.
            "jobs": (train_job(study, Cell(size, args.reward or next(iter(study.rewards)),
                                           args.alloc, study.seeds[0])),
                     base_eval_job(study, size)) if size in study.sizes else None}


def _request(args) -> dict:
    """Size, shapes, LoRA, beta, reward model and budget from the flags or the study config."""
    from race.core.errors import ConfigError
    from race.core.schema import check

    size = args.size or args.size_option
    if size is None:
        raise ValueError("SIZE (or --size) is required")
    req = _from_config(args) if args.config else _from_flags(args)
    if req["budget"] is None:
        raise ValueError("--budget is required (model FLOPs, e.g. 1e18)")
    if not req["budget"] > 0:  # NaN too
        raise ValueError(f"--budget must be a positive number of model FLOPs, got "
                         f"{req['budget']:g}")
    if req["prompt_len"] < 1:
        raise ValueError(f"prompt-len must be >= 1, got {req['prompt_len']}")
    # The flags obey the rules of the config keys they stand for (the schema's).
    for flag, section, key in (("generations", "allocations", "num_generations"),
                               ("prompts", "allocations", "prompts_per_step"),
                               ("num_iterations", "allocations", "num_iterations"),
                               ("completion_len", "training", "max_completion_length")):
        try:
            check(section, key, req[flag])
        except ConfigError as exc:
            raise ValueError(f"--{flag.replace('_', '-')}: {exc}") from None
    if args.mean_completion is not None and not 1 <= args.mean_completion <= \
            req["completion_len"]:
        raise ValueError(f"--mean-completion must be in [1, {req['completion_len']}]")
    return {"size": _size(size), "rows": req["prompts"] * req["generations"], **req}


def _header(req: dict, arch) -> str:
    lora = req["lora"]
    reward = (f"{'ORM' if req['reward_head'] == 'sequence' else 'PRM'} {req['reward_model']}"
              if req["reward_model"] else "rule verifier (0 FLOPs)")
    return (f"{req['size']} ({arch.params():,} parameters): {req['rows']} rows "
            f"({req['prompts']} prompts x {req['generations']} completions) x "
            f"({req['prompt_len']} prompt + {req['completion_len']} completion) tokens, "
            f"{req['num_iterations']} update(s) per generation batch, LoRA rank {lora.rank} on "
            f"{len(lora.targets)} projection(s), beta {req['beta']:g}"
            f"{', gradient checkpointing' if req['grad_ckpt'] else ''}, reward {reward}\n"
            "model FLOPs: real tokens, causal attention, the LoRA policy's forward + backward "
            "(frozen base), logits at the completion positions; a run stops before a step that "
            "could overrun the budget")


def run_gap(args) -> int:
    """``race plan --gap D --accuracy P``: the evaluation prompts that resolve the gap."""
    from race.analysis.frontier import DECIDED_Z
    from race.analysis.power import POWER, prompts_for_gap

    power = POWER if args.power is None else args.power
    try:
        if args.accuracy is None:
            raise ValueError("--gap needs --accuracy (a fraction, e.g. 0.4)")
        n = prompts_for_gap(args.gap, args.accuracy, power=power, rho=args.correlation)
    except ValueError as exc:
        print(f"race plan: error: {exc}", file=sys.stderr)
        return 2
    hi, lo = args.accuracy + args.gap / 2, args.accuracy - args.gap / 2
    if args.json:
        print(json.dumps({"gap": args.gap, "accuracy": args.accuracy, "z": DECIDED_Z,
                          "power": power, "correlation": args.correlation,
                          "prompts": int(n)}))
        return 0
    print(f"a gap of {100 * args.gap:.1f} points at accuracy {args.accuracy:.3f} ({hi:.3f} vs "
          f"{lo:.3f}) needs {int(n):,} evaluation prompts per config, the same prompts for "
          f"both, to reach z >= {DECIDED_Z:g} with power {power:g}\n"
          f"paired difference of two proportions: n = ((z + z_power) * sigma_d / gap)^2, "
          f"sigma_d^2 = p1(1 - p1) + p2(1 - p2) - 2 * rho * sqrt(p1(1 - p1) p2(1 - p2)), "
          f"rho = {args.correlation:g} (race.analysis.power); each prompt's variance p(1 - p) "
          "is exact for greedy pass@1 and an upper bound for sampled pass@1 (mean@k)")
    return 0


def run(args) -> int:
    if args.gap is not None or args.accuracy is not None:
        if args.gap is None:
            print("race plan: error: --accuracy needs --gap", file=sys.stderr)
            return 2
        return run_gap(args)
    from race.core.errors import ConfigError
    from race.flops.analytic import resolve_arch
    from race.study.plan import format_plan, plan, reward_reads, step_cost

    try:
        req = _request(args)
        arch = resolve_arch(req["size"])
    except (ValueError, KeyError, FileNotFoundError, ConfigError) as exc:
        print(f"race plan: error: {exc}", file=sys.stderr)
        return 2
    model = _size(req["reward_model"]) if req["reward_model"] else None
    try:
        if model is not None:
            resolve_arch(model)  # the reason an unknown one is unknown
    except (ValueError, KeyError, FileNotFoundError) as exc:
        print(f"race plan: error: the reward model: {exc}; --prm ARCH stands in for it",
              file=sys.stderr)
        return 2
    shapes = {"rows": req["rows"], "prompt_len": req["prompt_len"], "lora": req["lora"],
              "beta": req["beta"], "num_iterations": req["num_iterations"],
              "reward": reward_reads(req["size"], model, req["reward_head"]),
              "grad_ckpt": req["grad_ckpt"]}
    worst = step_cost(arch, completion_len=req["completion_len"], **shapes)
    cases = {f"worst case (every completion at the {req['completion_len']}-token cap: what "
             "the budget stop reserves, so the fewest steps)": plan(
                 worst, req["budget"], req["rows"], args.flops_per_second)}
    if args.mean_completion:
        typical = step_cost(arch, completion_len=args.mean_completion, **shapes)
        cases[f"typical case (ASSUMED: every completion {args.mean_completion} tokens; the stop "
              "still reserves the worst case)"] = plan(
            typical, req["budget"], req["rows"], args.flops_per_second, bound=worst)
    if args.json:
        print(json.dumps({"size": req["size"], "params": arch.params(), "rows": req["rows"],
                          "prompt_len": req["prompt_len"],
                          "completion_len": req["completion_len"],
                          "num_iterations": req["num_iterations"],
                          "reward_model": req["reward_model"],
                          "worst": cases[next(iter(cases))],
                          "typical": next(iter(list(cases.values())[1:]), None)}))
        return 0
    print(_header(req, arch))
    for label, result in cases.items():
        print(format_plan(result, label))
    if req.get("jobs"):
        from race.study.memory import eval_job_memory, train_job_memory

        train, evaluate = req["jobs"]
        print("peak memory (estimate, tensors only, race.study.memory):\n"
              f"  train job     {train_job_memory(train, req['prompt_len'], arch).summary()}\n"
              f"  evaluate job  {eval_job_memory(evaluate, req['prompt_len'], arch).summary()}")
    return 0
