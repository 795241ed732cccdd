"""Rollout engines side by side (race.core.engines): generation tokens/s and the ``race train``
step time of each engine, per ladder size on the CPU, and on the Qwen2.5-0.5B architecture on
CUDA when a GPU is visible. Prints each engine's speed-up over ``peft``.

    python bench/performance/rollout_engines.py [--sizes nano micro mini] [--rounds 3]
                                                [--steps 8] [--no-train]

Generation: one training step's batch (bench.common.ALLOC: 32 rows of the task's prompts, left
padded; on CUDA 64 rows of 64-token prompts) sampled at temperature 1 to the completion cap
(``min_new_tokens`` = the cap, so every call decodes the same width), through a LoRA policy
(rank 8 on every projection, B not zero: a trained adapter's cost). The engines take turns
within each round, in a rotating order; each engine's time is its median over the rounds
after a first, untimed call (the static cache's compile on CUDA happens there; its seconds are
printed apart). Train: ``race train`` on the same random-init policy and data with each engine,
``--steps`` steps per run, the first 2 of each run untimed, the engines in a rotating order
over ``--rounds`` rounds; median step time. Random-init policies rarely sample EOS, so train
rollouts also run to the cap: the step times are an upper bound on what a trained policy
spends, the same for every engine.
"""

import argparse
import contextlib
import dataclasses
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common

import torch
import transformers

from bench.common import ALLOC, REFERENCE, race_run, reference_policy, tiny_study
from race.core.engines import ENGINES, ROLLOUT_ENGINES, static_cache_len
from race.core.jobs import TrainJob
from race.policy.engines import decoder_class, generate_kwargs, generation_weights


def adapted(base: Path, device: str, dtype: torch.dtype):
    """The base policy at ``base`` with rank-8 LoRA on every projection, B drawn (not zero)."""
    from peft import LoraConfig, get_peft_model

    from race.policy.ladder import load_policy

    model = get_peft_model(load_policy(base, dtype=dtype),
                           LoraConfig(r=ALLOC.lora_rank, lora_alpha=ALLOC.alpha,
                                      target_modules=list(ALLOC.lora_targets), lora_dropout=0.0,
                                      task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return model.to(device).eval()


def prompt_batch(base: Path, data: Path, rows: int, device: str, prompt: int | None):
    """(ids, mask): ``rows`` training prompts left-padded (``prompt``: random ids of that
    length instead, for the GPU's longer batch)."""
    from race.data.task import load_jsonl
    from race.data.tokenizer import load_tokenizer

    tok = load_tokenizer(base)
    if prompt is not None:
        ids = torch.randint(3, len(tok), (rows, prompt), generator=torch.Generator().manual_seed(0))
        return ids.to(device), torch.ones_like(ids).to(device)
    texts = [r.prompt for r in load_jsonl(data)][:rows]
    tok.padding_side = "left"
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return batch["input_ids"].to(device), batch["attention_mask"].to(device)


def generation_seconds(model, name: str, ids, mask, new: int, device: str) -> float:
    """One sampled ``generate`` of ``new`` tokens per row under engine ``name`` (as the
    trainer generates: race.policy.engines), in seconds."""
    spec = ENGINES[name]
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0,
                  top_k=0, top_p=1.0, pad_token_id=model.config.pad_token_id,
                  **generate_kwargs(spec, device, static_cache_len(ids.shape[1], new)))
    decoder = decoder_class(spec)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad(), generation_weights(model, spec):
        if decoder is not None:  # no EOS: every call decodes the same width, as min_new_tokens
            decoder(model.get_base_model()).generate(
                ids, mask, max_new_tokens=new, do_sample=True, eos_token_ids=[],
                pad_token_id=model.config.pad_token_id)
        else:
            model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def generation(base: Path, data: Path, device: str, dtype: torch.dtype, rounds: int
               ) -> dict[str, tuple[float, float]]:
    """Per engine: (tokens/s, first call's seconds)."""
    rows, prompt, new = (ALLOC.rows, None, ALLOC.max_completion_length) if device == "cpu" \
        else (64, 64, 256)
    model = adapted(base, device, dtype)
    ids, mask = prompt_batch(base, data, rows, device, prompt)
    first = {e: generation_seconds(model, e, ids, mask, new, device) for e in ROLLOUT_ENGINES}
    times = {e: [] for e in ROLLOUT_ENGINES}
    for r in range(rounds):
        for i in range(len(ROLLOUT_ENGINES)):
            engine = ROLLOUT_ENGINES[(r + i) % len(ROLLOUT_ENGINES)]
            times[engine].append(generation_seconds(model, engine, ids, mask, new, device))
    return {e: (rows * new / statistics.median(t), first[e]) for e, t in times.items()}


def train_steps(job: TrainJob, steps: int, rounds: int) -> dict[str, float]:
    """Per engine: the median ``race train`` step time (seconds)."""
    times = {e: [] for e in ROLLOUT_ENGINES}
    for r in range(rounds):
        for i in range(len(ROLLOUT_ENGINES)):
            engine = ROLLOUT_ENGINES[(r + i) % len(ROLLOUT_ENGINES)]
            run = dataclasses.replace(job, rollout_engine=engine,
                                      run_dir=f"{job.run_dir}/{engine}-{r}")
            with contextlib.redirect_stderr(io.StringIO()):  # race train's per-step lines
                times[engine] += race_run(run, steps)[2:]
    return {e: statistics.median(t) for e, t in times.items()}


def report(label: str, gen: dict, train: dict | None) -> None:
    for engine in ROLLOUT_ENGINES:
        tps, first = gen[engine]
        line = (f"{label:14s} {engine:7s} {tps:12.0f} tokens/s  x{tps / gen['peft'][0]:.2f}  "
                f"(first call {first:.2f} s)")
        if train:
            line += (f" | race train step {train[engine] * 1e3:8.1f} ms  "
                     f"x{train['peft'] / train[engine]:.2f}")
        print(line, flush=True)


def main() -> None:
    from race.policy.ladder import build_ladder_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=["nano", "micro", "mini"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="race train steps per run")
    parser.add_argument("--no-train", action="store_true", help="generation only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()  # the base policies' saves
    print(f"engines {', '.join(ROLLOUT_ENGINES)}; speed-ups over peft (x); CPU, 1 thread, "
          f"float32; {args.rounds} rounds", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            root = Path(tmp) / size
            base, data = tiny_study(root, lambda tok, s=size: build_ladder_model(s, tok))
            job = TrainJob(base=str(base), train_data=str(data), run_dir=str(root / "runs"),
                           rungs=[1e18], alloc=ALLOC, save_every=1000, device="cpu")
            gen = generation(base, data, "cpu", torch.float32, args.rounds)
            train = None if args.no_train else train_steps(job, args.steps, args.rounds)
            report(size, gen, train)
        if torch.cuda.is_available():
            root = Path(tmp) / "cuda"
            base, data = tiny_study(root, reference_policy)
            job = TrainJob(base=str(base), train_data=str(data), run_dir=str(root / "runs"),
                           rungs=[1e18], alloc=ALLOC, save_every=1000, device="cuda",
                           dtype="bfloat16")
            gen = generation(base, data, "cuda", torch.bfloat16, args.rounds)
            train = None if args.no_train else train_steps(job, args.steps, args.rounds)
            report(f"{REFERENCE} cuda", gen, train)
        else:
            print("no GPU visible: the CUDA line (Qwen2.5-0.5B, bf16, static cache compiled) "
                  "was not measured", flush=True)


if __name__ == "__main__":
    main()
