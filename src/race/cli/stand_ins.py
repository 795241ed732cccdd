"""``race stand-ins``: write the rehearsal's offline stand-ins for the hub (race.study.stand_ins):
GSM8K-format data, a tiny Qwen2 policy on Qwen2.5's real tokenizer, and a PRM in the
Qwen2.5-Math-PRM layout on the same vocabulary. ``configs/rehearsal.yaml`` names them under
results-rehearsal/hub."""

from __future__ import annotations

HELP = "write the rehearsal's stand-in data, policies and PRM (offline)"


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="output folder, e.g. results-rehearsal/hub")
    p.add_argument("--seed", type=int, default=0, help="data and init seed")


def run(args) -> int:
    import torch

    from race.study.stand_ins import write_stand_ins

    torch.set_num_threads(1)
    summary = write_stand_ins(args.out, seed=args.seed)
    for name, policy in summary["policies"].items():
        print(f"{args.out}/{name}: {policy['params']:,} parameters, greedy eval-in accuracy "
              f"{policy['eval_in_accuracy']:.3f} after fine-tuning")
    print(f"{summary['prm']}: Qwen2.5-Math-PRM layout (random init); data: {summary['data']}")
    return 0
