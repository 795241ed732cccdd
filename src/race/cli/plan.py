"""``race plan``: what a FLOP budget buys for one size x allocation x reward, before training.

    race plan SIZE --budget B --prompts P --generations G --prompt-len T --completion-len C
              [--iterations MU] [--lora-rank R] [--beta BETA] [--prm SIZE]
              [--mean-completion M] [--flops-per-second S] [--head all|completion] [--json]
    race plan --config CONFIG --size SIZE --alloc NAME --reward NAME --budget B [...]

SIZE is a ladder size, a Qwen2.5 name or a model folder. With ``--config`` the allocation, the
completion cap, the reward's PRM and LoRA come from the study config and ``--prompt-len``
defaults to 64. Prints one generation (and reuse) step's model FLOPs per phase, the steps,
updates and rollouts the budget buys in the worst case (every completion at the cap: what the
trainer's budget stop assumes), the typical case with ``--mean-completion``, and the time at a
stated FLOP/s (an assumption). Conventions: race.flops.plan.
"""

from __future__ import annotations

import json
import sys

HELP = "what a FLOP budget buys (steps, updates, rollouts, phase split, time)"


def add_arguments(p) -> None:
    p.add_argument("size", nargs="?", help="ladder size, Qwen2.5 name or model folder")
    p.add_argument("--budget", type=float, required=True, help="model FLOPs, e.g. 1e18")
    p.add_argument("--config", help="study config: the allocation and reward come from it")
    p.add_argument("--size", dest="size_option", help="with --config: the size")
    p.add_argument("--alloc", help="with --config: an allocation name")
    p.add_argument("--reward", help="with --config: a reward name (its PRM is charged)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    p.add_argument("--generations", type=int, default=8, help="completions per prompt (8)")
    p.add_argument("--iterations", type=int, default=1, help="updates per generation batch")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt tokens (default 64)")
    p.add_argument("--completion-len", type=int, default=256, help="completion cap (256)")
    p.add_argument("--mean-completion", type=int, help="typical completion length, for the "
                                                       "typical case beside the worst case")
    p.add_argument("--lora-rank", type=int, default=16, help="LoRA rank on all projections")
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (> 0: reference "
                                                           "forward charged)")
    p.add_argument("--prm", help="PRM size of the reward (default: a rule verifier, 0 FLOPs)")
    p.add_argument("--flops-per-second", type=float,
                   help="assumed sustained model FLOP/s, for the time (e.g. 0.3 * 989e12)")
    p.add_argument("--head", choices=("all", "completion"), default="all",
                   help="LM-head logits in the update: at all positions (TRL's plain path, the "
                        "CPU trainer) or completion positions only (fused head on a GPU)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _request(args) -> dict:
    """Size, shapes, LoRA, beta and PRM from the flags, or from the study config."""
    from race.flops import analytic as F

    req = {"size": args.size or args.size_option, "rows": args.prompts * args.generations,
           "prompt_len": args.prompt_len, "completion_len": args.completion_len,
           "lora": F.LoraSpec(args.lora_rank, F.ALL_PROJECTIONS), "beta": args.beta,
           "num_iterations": args.iterations, "prm": args.prm}
    if args.config:
        from race.study import specs
        from race.study.config import load_config

        config = load_config(args.config)
        if not (args.alloc and req["size"]):
            raise ValueError("--config needs --size and --alloc")
        a = specs.allocation(config, args.alloc)
        reward = config["rewards"][args.reward] if args.reward else {"type": "rule"}
        req.update(rows=a.rows, completion_len=a.max_completion_length, lora=a.lora,
                   beta=a.beta, num_iterations=a.num_iterations, prm=reward.get("prm"))
    if req["size"] is None:
        raise ValueError("SIZE is required")
    return req


def run(args) -> int:
    from race.flops.analytic import resolve_arch
    from race.flops.plan import format_plan, plan, step_cost

    try:
        req = _request(args)
        arch = resolve_arch(req["size"])
        reward_arch = resolve_arch(req["prm"]) if req["prm"] else None
    except (ValueError, KeyError) as exc:
        print(f"race plan: error: {exc}", file=sys.stderr)
        return 2
    shapes = {"rows": req["rows"], "prompt_len": req["prompt_len"], "lora": req["lora"],
              "beta": req["beta"], "num_iterations": req["num_iterations"],
              "reward_arch": reward_arch, "head_all_positions": args.head == "all"}
    cases = {"worst case": req["completion_len"]}
    if args.mean_completion:
        cases[f"typical ({args.mean_completion}-token completions)"] = args.mean_completion
    results = {case: plan(step_cost(arch, completion_len=length, **shapes), args.budget,
                          req["rows"], args.flops_per_second)
               for case, length in cases.items()}
    if args.json:
        print(json.dumps({"size": req["size"], "params": arch.params(), **results}))
        return 0
    print(f"{req['size']} ({arch.params():,} parameters), {req['rows']} rows x "
          f"({req['prompt_len']} + {req['completion_len']}) tokens, {req['num_iterations']} "
          f"update(s) per batch, reward {'PRM ' + req['prm'] if req['prm'] else 'rule (0)'}, "
          f"LM head at {args.head} positions")
    for case, result in results.items():
        print(format_plan(result, case))
    return 0
