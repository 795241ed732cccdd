"""The base policies' samples the PRMs learn from (``race prm-samples``), drawn once per study.

Every PRM of the feedback ladder learns from the same samples: the sampling settings are the
config's shared ``prm:`` keys (:data:`SETTINGS`), so one job draws them and each ``race prm``
job reads them (:func:`read_samples`), and no two PRMs pay for the same generation.

The output folder holds ``completions.jsonl`` (one line per prompt, in the train split's
order: the prompt and its completions, ``samples_per_prompt`` per base policy, policies in
order) and ``samples.json``: the settings, the policies, and the sampling's ``pre`` FLOPs
(model, executed; :func:`race.feedback.prm_data.sample_completions`) and completion tokens.
Those FLOPs are counted here, once; a ``prm.json`` built from this folder counts its own
training only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from race.core.engines import DECODE_DEFAULT

#: The ``prm:`` keys that decide the samples (what a ``race prm-samples`` job carries).
SETTINGS = ("n_prompts", "samples_per_prompt", "temperature", "max_new_tokens",
            "sample_batch_size", "seed")
RECORD = "samples.json"
COMPLETIONS = "completions.jsonl"


def settings_of(spec) -> dict:
    """The :data:`SETTINGS` of a PRM spec or a samples job, as a dict."""
    return {k: getattr(spec, k) for k in SETTINGS}


def draw_samples(policies: Sequence[str | Path], data_dir: str | Path, out_dir: str | Path,
                 spec, device: str = "cpu", engine: str = DECODE_DEFAULT) -> dict:
    """Sample the first ``spec.n_prompts`` train-split prompts from every base policy in
    ``policies`` and write the two files of the module docstring; returns the record.
    ``spec``: anything with the :data:`SETTINGS` attributes; ``engine``: the rollout engine
    that decodes (race.core.engines: the job's), recorded beside the settings (not one of
    them: another engine's samples differ by rounding, not in what a PRM learns from)."""
    from race.core.atomic import write_json_atomic
    from race.data.task import load_jsonl, write_jsonl
    from race.feedback.prm_data import sample_completions

    t0 = time.perf_counter()
    policies = [str(p) for p in policies]
    if not policies:
        raise ValueError("race prm-samples: needs at least one base policy directory")
    records = load_jsonl(Path(data_dir) / "train.jsonl")[: spec.n_prompts]
    samples, sampling = sample_completions(
        policies, [r.prompt for r in records], per_prompt=spec.samples_per_prompt,
        max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, seed=spec.seed,
        batch_size=spec.sample_batch_size, device=device, engine=engine)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / COMPLETIONS, ({"prompt": r.prompt, "completions": texts}
                                    for r, texts in zip(records, samples, strict=True)))
    record = {"phase": "pre", "policies": policies, "settings": settings_of(spec),
              "engine": engine, "prompts": len(records), "completions": sum(map(len, samples)),
              "model_flops": sampling.model, "executed_flops": sampling.executed,
              "tokens": sampling.tokens, "wall_s": round(time.perf_counter() - t0, 3)}
    write_json_atomic(out / RECORD, record, indent=2)  # last: its presence means complete
    return record


def read_samples(samples_dir: str | Path, policies: Sequence[str], spec,
                 prompts: Sequence[str]) -> list[list[str]]:
    """The completions of ``prompts`` (grouped per prompt) from a :func:`draw_samples` folder;
    ``ValueError`` naming the folder when it was drawn from other policies, with other
    settings than ``spec``'s, or for other prompts: a PRM never trains on samples its own
    config would not have drawn."""
    folder = Path(samples_dir)
    try:
        record = json.loads((folder / RECORD).read_text())
        rows = [json.loads(line) for line in (folder / COMPLETIONS).read_text().splitlines()
                if line]
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"PRM samples {folder}: cannot be read ({exc})") from exc
    want = {"policies": [str(p) for p in policies], "settings": settings_of(spec)}
    for key, value in want.items():
        if record.get(key) != value:
            raise ValueError(f"PRM samples {folder}: drawn with {key} {record.get(key)}, but "
                             f"this PRM's are {value} (rerun race prm-samples)")
    if [r["prompt"] for r in rows] != list(prompts):
        raise ValueError(f"PRM samples {folder}: {COMPLETIONS} holds other prompts than the "
                         f"first {len(prompts)} of the train split (rerun race prm-samples)")
    return [r["completions"] for r in rows]
