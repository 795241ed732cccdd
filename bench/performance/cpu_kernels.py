"""The pinned CPU kernel path (``race.cpu_kernels``): same bits across kernel paths? what speed?

    python bench/performance/cpu_kernels.py [STEPS] [ROUNDS]  # default 20 steps x 4 rounds

Each kernel path runs in its own process (the paths are chosen by environment variables read
at the first kernel call): *pinned* is what importing ``race`` sets (ATen AVX2, MKL's AVX2
branch); *native* is this machine's own choice (ATen's best capability, MKL ``AUTO``);
*aten-only* pins ATen and leaves MKL on ``AUTO`` (its digest equals *pinned*'s where MKL ignores
the AVX2 branch, as Intel documents for other vendors' processors); *compatible* pins ATen and
puts MKL on its vendor-neutral ``COMPATIBLE`` branch; *default* is the portable scalar path
(ATen DEFAULT, MKL ``COMPATIBLE``). Prints the processor's vendor. Each process builds the mini
ladder policy (seed 0), takes STEPS full fine-tuning AdamW steps on seeded random batches of
32 rows x 64 tokens, and samples 64 completions of 48 tokens. Prints, per path, a digest of the
trained weights (equal digests: bit-identical training), and the median step and generation
seconds over ROUNDS rounds, alternating the paths so machine load hits all alike, as ratios
to native. Prints, never asserts: these machines are shared and noisy.

A machine whose native path is AVX2 gives the pinned path's digest natively; one with AVX-512
gives another unless pinned. That difference is why the package pins (a different last bit
in a step becomes a different model after a few thousand).
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from race.core.cpu_kernels import PINNED, cpu_vendor

PATHS = {
    "pinned": PINNED,
    # ATen's pin alone (MKL on its own choice): equal to *pinned* where MKL ignores its AVX2
    # branch, which Intel documents for other vendors' processors
    "aten-only": {"ATEN_CPU_CAPABILITY": PINNED["ATEN_CPU_CAPABILITY"], "MKL_CBWR": "AUTO"},
    # MKL's vendor-neutral branch under ATen's pin: what a pin that holds on AMD too would cost
    "compatible": {"ATEN_CPU_CAPABILITY": PINNED["ATEN_CPU_CAPABILITY"], "MKL_CBWR": "COMPATIBLE"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},
}


def worker(steps: int) -> dict:
    """One process's run on the kernel path its environment selects (see the docstring)."""
    import torch

    import race  # noqa: F401  (pins the kernel path where the environment leaves it open)
    from race.data.tokenizer import load_tokenizer, save_tokenizer
    from race.policy.device import kernel_path
    from race.policy.ladder import build_ladder_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = load_tokenizer(save_tokenizer(tmp))
    model = build_ladder_model("mini", tokenizer, seed=0)
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    vocab = model.config.vocab_size
    step_s = []
    for _ in range(steps):
        x = torch.randint(0, vocab, (32, 64), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        step_s.append(time.perf_counter() - t0)
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    prompts = torch.randint(0, vocab, (64, 16), generator=gen)
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.manual_seed(0)
        model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                       max_new_tokens=48, min_new_tokens=48, pad_token_id=0)
    generate_s = time.perf_counter() - t0
    return {**kernel_path(), "digest": digest.hexdigest()[:16],
            "step_s": statistics.median(step_s[2:]), "generate_s": generate_s}


def run_path(env: dict, steps: int) -> dict:
    out = subprocess.run([sys.executable, __file__, str(steps), "--worker"], check=True,
                         capture_output=True, text=True, env={**os.environ, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


def native_env() -> dict:
    """This machine's own kernel path, spelled out so that importing race leaves it alone."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    clean = {k: v for k, v in os.environ.items() if k not in PINNED}
    best = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                          text=True, env=clean).stdout.strip().lower()
    return {"ATEN_CPU_CAPABILITY": best, "MKL_CBWR": "AUTO"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="?", type=int, default=20)
    parser.add_argument("rounds", nargs="?", type=int, default=4)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.steps)))
        return
    paths = {"native": native_env(), **PATHS}
    runs: dict[str, list[dict]] = {name: [] for name in paths}
    for r in range(args.rounds):
        order = list(paths) if r % 2 == 0 else list(reversed(paths))
        for name in order:
            runs[name].append(run_path(paths[name], args.steps))
    print(f"cpu_kernels: mini policy, {args.steps} AdamW steps (32 x 64 tokens) + 64 x 48 "
          f"sampled tokens, {args.rounds} rounds, {cpu_vendor()} processor")
    native = runs["native"]
    for name, rs in runs.items():
        digests = sorted({r["digest"] for r in rs})
        step = statistics.median(r["step_s"] for r in rs)
        generate = statistics.median(r["generate_s"] for r in rs)
        step_ratio = step / statistics.median(r["step_s"] for r in native)
        gen_ratio = generate / statistics.median(r["generate_s"] for r in native)
        print(f"  {name:10s} ATen {rs[0]['cpu_capability']:7s} MKL {rs[0]['mkl_cbwr']:10s} "
              f"weights {', '.join(digests)} | step {1e3 * step:6.1f} ms ({step_ratio:.2f}x "
              f"native) | generate {generate:5.2f} s ({gen_ratio:.2f}x native)")


if __name__ == "__main__":
    main()
