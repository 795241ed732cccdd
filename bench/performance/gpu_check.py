"""The GPU path in one short run: where ``race train`` computes, FLOP fidelity on CUDA, speed.

    python bench/performance/gpu_check.py [--steps 6] [--rounds 2] [--cpu] [--rates FILE]

On a bare GPU machine: ``bash bench/performance/run_gpu_check.sh`` (DEVELOPERS.md). Sized to
finish within 6 minutes on one GPU (every part prints its elapsed seconds). Without a visible
GPU it prints "no GPU" and what it did not measure, and exits 0. ``--cpu`` runs every part on
the CPU at a tiny scale instead (the ladder's micro policy, short sequences, float32): that is
how the tests run every code path of this script without a GPU; its numbers say nothing about
a GPU. A part that raises prints its traceback and the others still run; the script then
exits 1. ``--rates FILE`` writes the model FLOP/s it measured as a rates file for ``race
check-config --rates`` (race.study.hours.write_rates): rollout (the counted run's engine),
learning and reward over step 2 of part 2, evaluation over part 3's ``race evaluate`` (model
loading included) -- small batches, so below what a study's larger batches sustain.

Prints, in order (nothing is asserted):

1. the device: torch and CUDA versions, the GPU's name and compute capability; the versions of
   transformers, TRL, PEFT, accelerate, datasets and huggingface_hub;
2. one ``race train`` step counted: a run of 2 steps of a padded batch (16 rows: 4 prompts of
   different lengths, up to 64 tokens, x 4 completions of up to 128 tokens that stop where they
   sample EOS) on the Qwen2.5-0.5B architecture (random init), ``training.dtype: bfloat16``,
   SDPA, gradient checkpointing and a ``rule+prm`` reward on a tiny random PRM, as
   ``configs/qwen2.5.yaml`` trains; its first step under torch's ``FlopCounterMode``
   (``race.flops.counter.count_flops``, split by phase at TRL's ``_generate`` and
   ``_calculate_rewards``). It prints the batch's padding, the ledger's executed FLOPs of
   step 1 over the counted ones per phase (rollout, learning, reward) and in total, each
   step's seconds per phase from the ledger and its MFU per phase from ``metrics.jsonl``
   (step 1's seconds include the counter's overhead and the warm-up: step 2 is the one to
   read), and the peak memory (``torch.cuda.max_memory_allocated``; not measured on the CPU)
   against ``race.study.memory.train_job_memory``'s estimate;
3. where the models compute, with ``device: auto`` and ``training.dtype: bfloat16`` on the GPU
   (float32 on the CPU): inside ``race train`` (a ``rule+prm`` reward on a tiny random PRM,
   gradient checkpointing on, as ``configs/qwen2.5.yaml`` has it) the device and dtype of the
   policy's non-LoRA weights, of its LoRA weights and of the PRM at every training step; then
   ``race evaluate``'s policy and PRM, and the evaluation's targets and wall time (a few
   prompts, the PRM's best-of-n included);
4. FLOP fidelity on the Qwen2.5-0.5B architecture (random init, ``race.known_configs``):
   torch's ``FlopCounterMode`` (through ``race.flops.counter.count_flops``) over the analytic
   executed count, for a forward, full and LoRA training steps, a KV-cached generate and a
   reward-model forward, with eager and SDPA attention
   (``bench/calibration/flops_calibration.py``'s phases, ``bench.common.phases``);
5. ``race train`` against TRL's own GRPOTrainer on the same job
   (``bench/performance/overhead.py``'s paired rounds, ``bench.common.paired``): the median
   step time of each and their ratio (the goal: at most 1.05);
6. rollout: the time of one greedy ``generate`` batch (64 rows of 64 prompt tokens, 256 new
   tokens) with transformers' default dynamic KV cache and with a static cache, and whether
   both produce the same tokens.
"""

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common

import torch

from bench.common import (
    ALLOC,
    REFERENCE,
    flop_configs,
    paired,
    phases,
    race_run,
    reference_policy,
    tiny_study,
)
from race.core.jobs import TrainJob
from race.core.specs import Allocation, RewardSpec
from race.flops import known_configs

warnings.filterwarnings("ignore")  # library warnings stay out of the report


def device_line(device: str) -> str:
    if device == "cpu":
        return f"device: CPU (torch {torch.__version__}; --cpu: tiny shapes, not a GPU figure)"
    cap = ".".join(map(str, torch.cuda.get_device_capability()))
    return (f"device: {torch.cuda.get_device_name()} (compute capability {cap}; torch "
            f"{torch.__version__}, CUDA {torch.version.cuda})")


def stack_line() -> str:
    """The versions of the libraries the check runs on (a GPU image may have its own)."""
    import importlib

    names = ("transformers", "trl", "peft", "accelerate", "datasets", "huggingface_hub")
    return "stack: " + ", ".join(f"{n} {importlib.import_module(n).__version__}" for n in names)


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


# -- one race train step, counted ---------------------------------------------------------------

#: The counted run's prompt lengths in tokens (all different, so every batch is padded) and its
#: completion cap, on a GPU and with --cpu.
COUNTED_SHAPES = {"cuda": (range(16, 65, 3), 128), "cpu": (range(8, 25), 24)}
#: Its allocation: 4 prompts x 4 completions = 16 rows (the cap comes from COUNTED_SHAPES).
COUNTED_ALLOC = {"num_generations": 4, "prompts_per_step": 4, "lora_rank": 16}
BUDGET_PHASES = ("rollout", "learning", "reward")


def padded_prompts(path: Path, lengths, seed: int = 0) -> Path:
    """A train JSONL of one arithmetic prompt (``d+d-d...=?``, the task's characters) of each
    length in ``lengths`` characters -- tokens, for the character tokenizer -- with its
    answer."""
    rng = random.Random(seed)
    records = []
    for length in lengths:
        body = length - 3  # "=?\n"
        first = rng.randint(10, 99) if body % 2 == 0 else rng.randint(1, 9)
        text, value = str(first), first
        while len(text) < body:
            op, digit = rng.choice("+-"), rng.randint(1, 9)
            text += f"{op}{digit}"
            value += digit if op == "+" else -digit
        records.append({"prompt": f"{text}=?\n", "answer": str(value)})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def counting_trainer_class(original, counts: dict, shapes: dict):
    """A ``race.grpo.run.metered_trainer_class`` replacement: the trainer runs its first
    optimizer step under ``count_flops`` and adds the counted FLOPs to ``counts`` (``total``,
    and ``rollout`` and ``reward`` inside TRL's ``_generate`` and ``_calculate_rewards``), and
    records each step's generated batch shapes in ``shapes`` (step -> BatchShapes)."""
    from race.flops.counter import count_flops

    def factory():
        class Counting(original()):
            _counter = None

            def _counted(self, phase, method, *args, **kwargs):
                counter = self._counter
                before = counter.so_far() if counter is not None else 0
                try:
                    return method(*args, **kwargs)
                finally:
                    if counter is not None:
                        counts[phase] += counter.so_far() - before

            def _generate(self, *args, **kwargs):
                return self._counted("rollout", super()._generate, *args, **kwargs)

            def _calculate_rewards(self, *args, **kwargs):
                return self._counted("reward", super()._calculate_rewards, *args, **kwargs)

            def training_step(self, model, *args, **kwargs):
                step = self.state.global_step + 1  # the optimizer step this call belongs to
                if step > 1:
                    out = super().training_step(model, *args, **kwargs)
                else:
                    with count_flops() as counter:
                        self._counter = counter
                        try:
                            out = super().training_step(model, *args, **kwargs)
                        finally:
                            self._counter = None
                    counts["total"] += counter.total
                shapes[step] = self.recorder.last_shapes
                return out

        return Counting

    return factory


def memory_estimate(job: TrainJob, max_prompt_tokens: int):
    """``race.study.memory.train_job_memory``'s estimate of ``job``'s peak device memory (a
    ``MemoryEstimate``: ``.total`` bytes, ``.parts`` name -> bytes), or None where that module
    is not there."""
    try:
        from race.study.memory import train_job_memory
    except ImportError:
        return None
    return train_job_memory(job, max_prompt_tokens)


def _gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB"


def _ratio(num: int, den: int) -> str:
    if den == 0:
        return "- (0 / 0)" if num == 0 else "inf (counted 0)"
    return f"{num / den:.6f}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _mfu(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def counted_step(root: Path, base: Path, prm: Path, device: str, dtype: str) -> dict:
    """Part 2 of the module docstring: a 2-step ``race train`` run, its first step counted.
    Returns step 2's model FLOP/s per phase (its model FLOPs over its seconds)."""
    import race.grpo.run as rt
    from race.core.cells import PERF
    from race.data.tokenizer import load_tokenizer
    from race.flops.ledger import Ledger

    lengths, cap = COUNTED_SHAPES[device]
    data = padded_prompts(root / "padded.jsonl", lengths)
    job = TrainJob(base=str(base), train_data=str(data), run_dir=str(root / "counted"),
                   rungs=[1e18], alloc=Allocation(**COUNTED_ALLOC, max_completion_length=cap),
                   reward=RewardSpec(type="rule+prm", prm=str(prm)), results_dir=str(root),
                   save_every=10, run_key="gpu-check/counted", dtype=dtype, device=device,
                   attn_implementation="sdpa", gradient_checkpointing=True)
    counts = {"total": 0, "rollout": 0, "reward": 0}
    shapes: dict = {}
    if device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    original = rt.metered_trainer_class
    rt.metered_trainer_class = counting_trainer_class(original, counts, shapes)
    try:
        race_run(job, 2)
    finally:
        rt.metered_trainer_class = original
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    counts["learning"] = counts["total"] - counts["rollout"] - counts["reward"]

    run_dir = Path(job.run_dir)
    ledger = Ledger.load(run_dir / "ledger.json")
    rows = {(r.step, r.phase): r for r in ledger.rows}
    metrics = {m["step"]: m for m in map(json.loads,
                                         (run_dir / "metrics.jsonl").read_text().splitlines())}
    perf = json.loads((run_dir / PERF).read_text())
    a = job.alloc
    print(f"race train, one step counted ({a.prompts_per_step} prompts x {a.num_generations} "
          f"completions = {a.rows} rows, completion cap {cap}; training.dtype: {dtype}, "
          f"attention: {job.attn_implementation}, gradient checkpointing, rule+prm reward):",
          flush=True)
    for step in sorted(shapes):
        b = shapes[step]
        print(f"  step {step} batch: prompts {min(b.prompt_lens)}..{max(b.prompt_lens)} tokens "
              f"(padded to {b.padded_prompt_len}), completions {min(b.completion_lens)}.."
              f"{max(b.completion_lens)} tokens (width {b.completion_width}); padding: prompts "
              f"{_yes(len(set(b.prompt_lens)) > 1)}, completions "
              f"{_yes(len(set(b.completion_lens)) > 1)}", flush=True)
    print("  step 1, ledger executed FLOPs / FlopCounterMode FLOPs:", flush=True)
    for phase in BUDGET_PHASES:
        ledger_flops = rows[(1, phase)].executed_flops
        print(f"    {phase:<8} ledger {ledger_flops:.4e}  counted {counts[phase]:.4e}  "
              f"ledger / counter {_ratio(ledger_flops, counts[phase])}", flush=True)
    executed = sum(rows[(1, phase)].executed_flops for phase in BUDGET_PHASES)
    print(f"    {'total':<8} ledger {executed:.4e}  counted {counts['total']:.4e}  "
          f"ledger / counter {_ratio(executed, counts['total'])}", flush=True)
    print(f"  peak: {perf['flops_per_s']:.4e} FLOP/s ({perf['name']}, {perf['dtype']}, "
          f"{perf['source']})", flush=True)
    for step in sorted({s for s, _ in rows}):
        note = " (counted: the counter's overhead and the warm-up)" if step == 1 else ""
        seconds = ", ".join(f"{p} {rows[(step, p)].wall_s:.3f} s" for p in BUDGET_PHASES
                            if (step, p) in rows)
        mfu = ", ".join(f"{p} {_mfu(metrics[step].get(f'mfu_{p}'))}" for p in BUDGET_PHASES)
        print(f"  step {step}{note}: seconds {seconds}; MFU {mfu}", flush=True)
    if peak is None:
        print("  peak memory: not measured on CPU", flush=True)
    else:
        print(f"  peak memory: {_gib(peak)} (torch.cuda.max_memory_allocated over both steps; "
              f"{_gib(before)} allocated before the run)", flush=True)
    rates = {p: rows[(2, p)].model_flops / rows[(2, p)].wall_s for p in BUDGET_PHASES
             if (2, p) in rows and rows[(2, p)].model_flops > 0 and rows[(2, p)].wall_s > 0}
    max_prompt = rt._dataset(job.train_data, load_tokenizer(job.base))[1]
    estimate = memory_estimate(job, max_prompt)
    if estimate is None:
        print("  memory estimate: not available (no race.study.memory)", flush=True)
        return rates
    parts = ", ".join(f"{k} {_gib(v)}" for k, v in estimate.parts.items())
    print(f"  memory estimate (race.study.memory.train_job_memory, longest prompt {max_prompt} "
          f"tokens): {_gib(estimate.total)} ({parts})"
          + ("" if peak is None else f"; measured / estimate {peak / estimate.total:.3f}"),
          flush=True)
    return rates

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


def write_measured_rates(path: Path, measured: dict, job: TrainJob, device: str,
                         dtype: str) -> None:
    """The rates this run measured, as a rates file (race.study.hours.write_rates)."""
    from race.study.hours import write_rates

    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    lengths, cap = COUNTED_SHAPES[device]
    a = COUNTED_ALLOC
    policy = "the ladder's micro" if device == "cpu" else "Qwen2.5-0.5B (random init)"
    where = (f"bench/performance/gpu_check.py{' --cpu' if device == 'cpu' else ''}: race "
             f"train step 2 of {a['prompts_per_step']} x "
             f"{a['num_generations']} rows, prompts up to {max(lengths)} + completions up to "
             f"{cap} tokens, {policy}, {dtype}, a tiny PRM reward; race evaluate of a few "
             "prompts, loading included")
    engine = job.rollout_engine
    rollout = {engine: measured["rollout"]} if "rollout" in measured else None
    write_rates(path, device=name, measured=where, rollout=rollout,
                learning=measured.get("learning"), reward=measured.get("reward"),
                eval=measured.get("eval"))
    print(f"rates file {path}: " + ", ".join(f"{p} {v:.3g}" for p, v in measured.items())
          + " model FLOP/s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="steps per paired run")
    parser.add_argument("--rounds", type=int, default=2, help="paired rounds")
    parser.add_argument("--cpu", action="store_true", help="every part on the CPU, tiny")
    parser.add_argument("--rates", type=Path, metavar="FILE",
                        help="write the measured model FLOP/s per phase (race check-config "
                             "--rates)")
    args = parser.parse_args()
    if args.steps < 4:  # the first 2 steps of every run are warm-up, not timed
        parser.error("--steps must be at least 4")
    if not args.cpu and not torch.cuda.is_available():
        print("no GPU: torch sees no CUDA device on this machine, so nothing was measured "
              "(one counted race train step: ledger vs FlopCounterMode, seconds, MFU and peak "
              "memory; the policy's device and dtype in race train, CUDA FLOP fidelity, race "
              "train vs TRL step time, rollout cache speed-up). Run it where a GPU is visible, "
              "or with --cpu to exercise the script at a tiny scale.")
        return
    device = "cpu" if args.cpu else "cuda"
    dtype = "float32" if args.cpu else "bfloat16"
    if args.cpu:
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    failed = []

    def part(name: str, run) -> None:
        """Run one part; a failure prints its traceback, and the next part still runs."""
        start = time.perf_counter()
        try:
            run()
        except Exception:
            failed.append(name)
            print(f"{name}: FAILED\n{traceback.format_exc()}", flush=True)
        print(f"  [{name}: {time.perf_counter() - start:.0f} s]", flush=True)

    print(device_line(device), flush=True)
    print(stack_line(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # GPU: the Qwen2.5-0.5B architecture; --cpu: the ladder's micro rung.
        base, data = tiny_study(root, None if args.cpu else reference_policy)
        job = TrainJob(base=str(base), train_data=str(data), run_dir=str(root / "runs"),
                       rungs=[1e18], alloc=ALLOC, save_every=10, run_key="gpu-check",
                       dtype=dtype, device=device)
        prm = tiny_prm(root, base)

        measured: dict = {}
        part("counted step", lambda: measured.update(counted_step(root, base, prm, device,
                                                                  dtype)))

        def placements():
            spy = replace(job, run_dir=str(root / "spy"), gradient_checkpointing=True,
                          reward=RewardSpec(type="rule+prm", prm=str(prm)),
                          results_dir=str(root))
            print(f"race train (device: {device}, training.dtype: {dtype}, rule+prm reward, "
                  "gradient checkpointing):", flush=True)
            for name, placed in models_inside_race_train(spy, 2).items():
                print(f"  {name}: {sorted(placed)}", flush=True)
            seen, payload = models_inside_race_evaluate(root, base, prm, device, dtype)
            print(f"race evaluate (device: {device}, training.dtype: {dtype}, "
                  f"{payload['wall_s']:.1f} s):", flush=True)
            for name, placed in seen.items():
                print(f"  {name}: {sorted(placed)}", flush=True)
            print("  " + ", ".join(f"{t} {r['acc']:.3f}" for t, r in payload["targets"].items()
                                   if r.get("acc") is not None), flush=True)
            if payload["wall_s"] > 0:
                measured["eval"] = payload["executed_total"]["model"] / payload["wall_s"]

        def fidelity_part():
            print("FLOP fidelity (FlopCounterMode / analytic executed):", flush=True)
            fidelity(device)

        def against_trl():
            vanilla_times, race_times = paired(job, args.steps, args.rounds, device)
            v, r = statistics.median(vanilla_times), statistics.median(race_times)
            print(f"race train vs TRL GRPOTrainer ({args.rounds} rounds x {args.steps} steps): "
                  f"median step {r * 1e3:.1f} ms vs {v * 1e3:.1f} ms, ratio {r / v:.3f} "
                  f"(goal <= 1.05)", flush=True)

        def rollout_part():
            print("rollout (HF generate):", flush=True)
            rollout(base, device, getattr(torch, dtype))

        part("placements", placements)
        part("FLOP fidelity", fidelity_part)
        part("race train vs TRL", against_trl)
        part("rollout", rollout_part)
        if args.rates is not None:
            part("rates file", lambda: write_measured_rates(args.rates, measured, job, device,
                                                            dtype))
    print(f"gpu_check: {time.perf_counter() - t0:.0f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
