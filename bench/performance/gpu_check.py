"""The GPU path in one short run: where ``race train`` computes, FLOP fidelity on CUDA, speed.

    python bench/performance/gpu_check.py [--steps 6] [--rounds 2] [--cpu]

Sized to finish within about 5 minutes on one GPU. Without a visible GPU it prints "no GPU"
and what it did not measure, and exits 0. ``--cpu`` runs every part on the CPU at a tiny scale
instead (the ladder's micro policy, short sequences): that is how the tests run every code
path of this script without a GPU; its numbers say nothing about a GPU.

Prints, in order (nothing is asserted):

1. the device: torch and CUDA versions, the GPU's name and compute capability;
2. where the models compute, with ``device: auto`` and ``training.dtype: bfloat16`` on the GPU
   (float32 on the CPU): inside ``race train`` (a ``rule+prm`` reward on a tiny random PRM,
   gradient checkpointing on, as ``configs/qwen2.5.yaml`` has it) the device and dtype of the
   policy's non-LoRA weights, of its LoRA weights and of the PRM at every training step; then
   ``race evaluate``'s policy and PRM, and the evaluation's targets and wall time (a few
   prompts, the PRM's best-of-n included);
3. FLOP fidelity on the Qwen2.5-0.5B architecture (random init, ``race.known_configs``):
   torch's ``FlopCounterMode`` (through ``race.flops.counter.count_flops``) over the analytic
   executed count, for a forward, full and LoRA training steps, a KV-cached generate and a
   reward-model forward, with eager and SDPA attention
   (``bench/calibration/flops_calibration.py``'s phases, ``bench.common.phases``);
4. ``race train`` against TRL's own GRPOTrainer on the same job
   (``bench/performance/overhead.py``'s paired rounds, ``bench.common.paired``): the median
   step time of each and their ratio (the goal: at most 1.05);
5. rollout: the time of one greedy ``generate`` batch (64 rows of 64 prompt tokens, 256 new
   tokens) with transformers' default dynamic KV cache and with a static cache, and whether
   both produce the same tokens.
"""

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common

import torch

from bench.common import ALLOC, flop_configs, paired, phases, race_run, tiny_study
from race.core.jobs import TrainJob
from race.core.specs import RewardSpec
from race.flops import known_configs

REFERENCE = "Qwen2.5-0.5B"
warnings.filterwarnings("ignore")  # library warnings stay out of the report


def device_line(device: str) -> str:
    if device == "cpu":
        return f"device: CPU (torch {torch.__version__}; --cpu: tiny shapes, not a GPU figure)"
    cap = ".".join(map(str, torch.cuda.get_device_capability()))
    return (f"device: {torch.cuda.get_device_name()} (compute capability {cap}; torch "
            f"{torch.__version__}, CUDA {torch.version.cuda})")


def reference_policy(tok):
    """The Qwen2.5-0.5B architecture with the task's character vocabulary, random init."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(known_configs.qwen2_config(
        REFERENCE, vocab_size=len(tok), pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))


def tiny_prm(root: Path, base: Path) -> Path:
    """A random-init PRM of the ladder's nano shape on the policy's tokenizer (what ``race prm``
    starts from with ``prm.init: random``): a feedback model whose device and dtype can be
    followed."""
    from race.core.specs import PRMSpec
    from race.data.tokenizer import load_tokenizer
    from race.feedback.prm_training import init_classifier

    tok = load_tokenizer(base)
    model, _ = init_classifier("nano", tok, [], PRMSpec(init="random", seed=1))
    model.save_pretrained(root / "prm")
    tok.save_pretrained(root / "prm")
    return root / "prm"


def _placements(named) -> set[tuple[str, str]]:
    return {(str(p.device), str(p.dtype)) for _, p in named}


def models_inside_race_train(job: TrainJob, steps: int) -> dict[str, set]:
    """{model: {(device, dtype)}} at every training step of ``job``: the policy's base and LoRA
    weights and, for a model reward, the feedback model's."""
    import race.grpo.run as rt

    seen: dict[str, set] = {"policy": set(), "policy LoRA": set(), "reward model": set()}
    original = rt.metered_trainer_class

    def spying():
        class Spy(original()):
            def training_step(self, model, *args, **kwargs):
                params = list(model.named_parameters())
                seen["policy"] |= _placements(p for p in params if "lora_" not in p[0])
                seen["policy LoRA"] |= _placements(p for p in params if "lora_" in p[0])
                for reward in self.reward_funcs:
                    if hasattr(reward, "model"):
                        seen["reward model"] |= _placements(
                            reward.model.model.named_parameters())
                return super().training_step(model, *args, **kwargs)

        return Spy

    rt.metered_trainer_class = spying
    try:
        race_run(job, steps)
    finally:
        rt.metered_trainer_class = original
    return seen


def models_inside_race_evaluate(root: Path, base: Path, prm: Path, device: str,
                                dtype: str) -> tuple[dict[str, set], dict]:
    """{model: {(device, dtype)}} of the policy and the PRM ``evaluate`` loads, and its payload
    (a few prompts of every target)."""
    import race.evaluation.eval_job as ev
    from race.core.specs import EvalSpec

    seen: dict[str, set] = {"policy": set(), "PRM": set()}
    load_snapshot, resolve_prm = ev.load_snapshot, ev._resolve_prm

    def spy_snapshot(*args, **kwargs):
        snap = load_snapshot(*args, **kwargs)
        seen["policy"] |= _placements(snap.model.named_parameters())
        return snap

    def spy_prm(*args, **kwargs):
        scorer, name = resolve_prm(*args, **kwargs)
        seen["PRM"] |= _placements(scorer.model.named_parameters())
        return scorer, name

    spec = EvalSpec(n_in=8, n_ood=4, sample_prompts=4, k=4, bon_n=4, native_prompts=4,
                    native_samples=2, sampled_prompts=4, sampled_k=2, bootstrap_reps=100)
    ev.load_snapshot, ev._resolve_prm = spy_snapshot, spy_prm
    try:
        payload = ev.evaluate(base, root / "data", root / "eval.json", spec,
                              reward={"type": "rule"}, prm=str(prm), dtype=dtype, device=device)
    finally:
        ev.load_snapshot, ev._resolve_prm = load_snapshot, resolve_prm
    return seen, payload


def fidelity(device: str) -> None:
    values = known_configs.config_dict(REFERENCE) if device != "cpu" else flop_configs()["micro"]
    name = REFERENCE if device != "cpu" else "ladder micro"
    for impl in ("eager", "sdpa"):
        for phase, measure, executed, _model in phases(values, impl, device):
            torch.manual_seed(0)
            ratio = measure() / executed
            print(f"  {name} {impl:<5} {phase:<20} measured / analytic executed {ratio:.6f}",
                  flush=True)


def rollout(base: Path, device: str, dtype: torch.dtype) -> None:
    from race.policy.ladder import load_policy

    rows, prompt, new = (64, 64, 256) if device != "cpu" else (8, 16, 24)
    model = load_policy(base, dtype=dtype).to(device).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (rows, prompt), generator=gen).to(device)
    mask = torch.ones_like(ids)
    outputs, seconds = {}, {}
    for cache in ("dynamic", "static"):
        extra = {} if cache == "dynamic" else {"cache_implementation": "static"}
        times = []
        for _ in range(3):  # the first call warms up (and builds the static cache)
            if device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                                     min_new_tokens=new, do_sample=False,
                                     pad_token_id=model.config.pad_token_id, **extra)
            if device != "cpu":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        outputs[cache], seconds[cache] = out.cpu(), statistics.median(times[1:])
    same = torch.equal(outputs["dynamic"], outputs["static"])
    print(f"  {rows} rows x ({prompt} prompt + {new} new tokens), greedy, {dtype}: dynamic cache "
          f"{seconds['dynamic']:.3f} s, static cache {seconds['static']:.3f} s, speed-up "
          f"{seconds['dynamic'] / seconds['static']:.2f}x, same tokens: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="steps per paired run")
    parser.add_argument("--rounds", type=int, default=2, help="paired rounds")
    parser.add_argument("--cpu", action="store_true", help="every part on the CPU, tiny")
    args = parser.parse_args()
    if args.steps < 4:  # the first 2 steps of every run are warm-up, not timed
        parser.error("--steps must be at least 4")
    if not args.cpu and not torch.cuda.is_available():
        print("no GPU: torch sees no CUDA device on this machine, so nothing was measured "
              "(the policy's device and dtype in race train, CUDA FLOP fidelity, race train vs "
              "TRL step time, rollout cache speed-up). Run it where a GPU is visible, or with "
              "--cpu to exercise the script at a tiny scale.")
        return
    device = "cpu" if args.cpu else "cuda"
    dtype = "float32" if args.cpu else "bfloat16"
    if args.cpu:
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    print(device_line(device), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # GPU: the Qwen2.5-0.5B architecture; --cpu: the ladder's micro rung.
        base, data = tiny_study(root, None if args.cpu else reference_policy)
        job = TrainJob(base=str(base), train_data=str(data), run_dir=str(root / "runs"),
                       rungs=[1e18], alloc=ALLOC, save_every=10, run_key="gpu-check",
                       dtype=dtype, device=device)
        prm = tiny_prm(root, base)
        spy = replace(job, run_dir=str(root / "spy"), gradient_checkpointing=True,
                      reward=RewardSpec(type="rule+prm", prm=str(prm)), results_dir=str(root))
        print(f"race train (device: {device}, training.dtype: {dtype}, rule+prm reward, "
              "gradient checkpointing):", flush=True)
        for name, placed in models_inside_race_train(spy, 2).items():
            print(f"  {name}: {sorted(placed)}", flush=True)
        seen, payload = models_inside_race_evaluate(root, base, prm, device, dtype)
        print(f"race evaluate (device: {device}, training.dtype: {dtype}, {payload['wall_s']:.1f}"
              " s):", flush=True)
        for name, placed in seen.items():
            print(f"  {name}: {sorted(placed)}", flush=True)
        print("  " + ", ".join(f"{t} {r['acc']:.3f}" for t, r in payload["targets"].items()
                               if r.get("acc") is not None), flush=True)
        print("FLOP fidelity (FlopCounterMode / analytic executed):", flush=True)
        fidelity(device)
        vanilla_times, race_times = paired(job, args.steps, args.rounds, device)
        v, r = statistics.median(vanilla_times), statistics.median(race_times)
        print(f"race train vs TRL GRPOTrainer ({args.rounds} rounds x {args.steps} steps): "
              f"median step {r * 1e3:.1f} ms vs {v * 1e3:.1f} ms, ratio {r / v:.3f} "
              f"(goal <= 1.05)", flush=True)
        print("rollout (HF generate):", flush=True)
        rollout(base, device, getattr(torch, dtype))
    print(f"gpu_check: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
