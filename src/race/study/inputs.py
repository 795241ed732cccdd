"""The study's inputs, checked before any compute: the user's task files and every local model
or adapter folder the config names (a feedback model's of the kind its key asks for).

Run by ``race check-config`` and by the workflow when it parses the config, so a bad file
fails in seconds with the key and the file (and line) named, instead of a job failing later
with an error from deep inside a library. Hub ids are not checked here (the hub may be
unreachable from the machine that checks); ladder names are built by the workflow itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from race.core.cells import is_ladder

#: pickle formats that ``torch.load`` would have to unpickle; RACE loads safetensors only
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


class InputError(ValueError):
    """An input file or folder the config names is missing or unusable."""


def _json_object(path: Path, key: str) -> dict:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{key}: {path} is not readable JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise InputError(f"{key}: {path} holds a JSON {type(payload).__name__}, not an object")
    return payload


def _safetensors_only(folder: Path, key: str, weights: str) -> None:
    """``weights`` (a file name, or ``"*.safetensors"``) must be there; pickles are refused."""
    found = sorted(folder.glob(weights))
    if found:
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise InputError(f"{key}: {folder} holds pickle weights ({', '.join(pickles)}); RACE "
                         "loads safetensors only (resave with save_pretrained(..., "
                         "safe_serialization=True))")
    raise InputError(f"{key}: {folder} has no weights ({weights})")


def check_model_dir(path: str | Path, key: str) -> None:
    """A local model folder: ``config.json`` with a ``model_type``, safetensors weights and
    a tokenizer."""
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(f"{key}: {folder} is not a folder")
    config = folder / "config.json"
    if not config.is_file():
        raise InputError(f"{key}: {folder} is not a model folder (no config.json)")
    if "model_type" not in _json_object(config, key):
        raise InputError(f"{key}: {config} names no model_type")
    _safetensors_only(folder, key, "*.safetensors")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"{key}: {folder} has no tokenizer (one of {', '.join(TOKENIZER_FILES)})")


def check_adapter_dir(path: str | Path, key: str = "adapter") -> None:
    """A PEFT LoRA adapter folder: ``adapter_config.json`` and ``adapter_model.safetensors``."""
    folder = Path(path)
    config = folder / "adapter_config.json"
    if not config.is_file():
        raise InputError(f"{key}: no LoRA adapter (adapter_config.json) in {folder}")
    _json_object(config, key)
    _safetensors_only(folder, key, "adapter_model.safetensors")


def check_task_file(path: str | Path, key: str, solutions: bool = False) -> int:
    """A task JSONL file with at least one record (race.data.task.load_jsonl checks each
    line), each with a ``solution`` when ``solutions`` (the ladder's base policies are
    fine-tuned on them); returns the number of records."""
    from race.data.task import load_jsonl

    try:
        records = load_jsonl(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{key}: {exc}") from None
    if not records:
        raise InputError(f"{key}: {path} holds no records")
    if solutions:
        lacking = [i for i, r in enumerate(records, 1) if not r.solution]
        if lacking:
            raise InputError(f"{key}: {path} has {len(lacking)} record(s) without a solution "
                             f"(first: record {lacking[0]}); the ladder sizes are fine-tuned "
                             "on the training records' solutions")
    return len(records)


def _local(spec) -> bool:
    """A model spec that names a local folder (not a ladder name, not a hub id)."""
    return spec is not None and not is_ladder(spec) and Path(str(spec)).exists()


def check_inputs(study) -> None:
    """Check every input file and local model folder a :class:`race.core.study.Study` names."""
    source = study.source
    if source.kind == "jsonl":
        pretrained = any(is_ladder(s) for s in study.sizes)
        for key in ("train_jsonl", "eval_in_jsonl", "eval_ood_jsonl"):
            if getattr(source, key):
                check_task_file(getattr(source, key), f"task.{key}",
                                solutions=pretrained and key == "train_jsonl")
    for split, path in (source.hf_data_files or {}).items():
        if not Path(path).is_file():
            raise InputError(f"task.hf_data_files.{split}: {path} is not a file")
    named = [(f"sizes[{i}]", s) for i, s in enumerate(study.sizes)]
    named += [(f"prm.sizes[{i}]", s) for i, s in enumerate(study.prm_sizes)]
    named += [(f"rewards.{name}.{kind}", getattr(r, kind)) for name, r in study.rewards.items()
              for kind in ("prm", "orm")]
    named.append(("eval.prm", study.eval.prm))
    for key, spec in named:
        if _local(spec):
            check_model_dir(spec, key)
            if not key.startswith("sizes"):  # a feedback model
                check_feedback_kind(spec, key, orm=key.endswith(".orm"))


def check_feedback_kind(path: str | Path, key: str, orm: bool) -> None:
    """A local feedback model is the kind its key asks for: an ORM for an orm reward, a PRM
    (ours or Qwen-Math) for the others (race.feedback.kind.model_kind)."""
    from race.feedback.kind import model_kind

    try:
        kind = model_kind(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{key}: {exc}") from None
    if (kind == "orm") != orm:
        want = "an ORM (a sequence classifier)" if orm else "a PRM"
        raise InputError(f"{key}: {path} holds {'an ORM' if kind == 'orm' else 'a PRM'} "
                         f"({kind}), and this key needs {want}")


def check_rung_snapshots(study) -> None:
    """Every finished rung snapshot (DONE written) of the study's cells holds an adapter the
    evaluate job can load (:func:`check_adapter_dir`: safetensors, never a pickle).

    The workflow runs this when it starts, before it schedules a job: one evaluate job covers
    all the rungs of a cell, and Snakemake deletes a job's outputs before running it and again
    when it fails, so a bad rung first met there would cost the cell's good eval.json files."""
    from race.core.cells import DONE, Cell, rung_dir

    extra = [s for s in study.race.validation_seeds if s not in study.seeds]
    cells = study.grid_cells() + [Cell(size, reward, alloc, seed) for size in study.sizes
                                  for reward in study.rewards for alloc in study.allocations
                                  for seed in extra]
    for cell in cells:
        for budget in study.evaluated_rungs(cell):
            folder = rung_dir(study.run_dir(cell), budget)
            if not (folder / DONE).is_file():
                continue  # not written yet, or half-written: its training job's to redo
            try:
                check_adapter_dir(folder, "rung snapshot")
            except InputError as exc:
                raise InputError(f"{exc}; delete that folder and rerun to have the cell's "
                                 "training job write it again") from None


def check_stored_models(study) -> None:
    """Every model folder a job of the study will read, where it exists (a base policy or PRM
    this study trained, or a local folder the config names), holds weight files whose
    safetensors header is intact and fits the file (a truncated copy fails here): only the
    headers are read, never the tensors. Run when the workflow starts, so that a damaged file
    is named with its repair before any job, not met as a traceback mid-study."""
    from safetensors import safe_open

    feedback = {s for r in study.rewards.values() for s in (r.prm, r.orm) if s is not None}
    feedback |= set(study.prm_sizes) | ({study.eval.prm} if study.eval.prm else set())
    folders = [(study.base_dir(s), is_ladder(s), "base") for s in study.sizes]
    folders += [(study.prm_dir(s), is_ladder(s), "prm") for s in sorted(feedback)]
    for folder, trained, rule in folders:
        if not Path(folder).is_dir():
            continue  # a hub id, or not trained yet
        for weights in sorted(Path(folder).glob("*.safetensors")):
            try:
                with safe_open(weights, framework="pt") as f:
                    f.keys()
            except Exception as exc:  # safetensors' own error type varies by version
                repair = (f"delete {folder} and rerun to have the {rule} job write it again"
                          if trained else "restore it from where it came")
                raise InputError(f"{weights} is damaged ({str(exc).strip() or type(exc).__name__}"
                                 f"): {repair}") from None


def check_tracking_db(study) -> None:
    """The study's sqlite tracking DB, where it exists, answers a query: a damaged one is
    named with its repair before any job runs (the mirror rebuilds a deleted DB from the run
    folders, race.tracking.mirror)."""
    import sqlite3

    db = study.mlflow.sqlite_db
    if not (study.mlflow.enabled and db is not None and db.is_file()):
        return
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            con.execute("select count(*) from sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise InputError(f"mlflow.tracking_uri: {db} is damaged ({exc}): delete it, and the "
                         "workflow rebuilds it from the run folders") from None


def check_devices_here(study) -> None:
    """Every device the study's model jobs ask for, checked on this machine, where the local
    executor runs them: ``device: cuda`` where torch sees no GPU (or ``training.dtype:
    bfloat16`` on a GPU without it, race.policy.device), a reward's ``cuda:N`` past the GPUs
    torch sees. Run when the workflow starts: each job would fail at its own start, after
    Snakemake had deleted the outputs it reruns. ``auto`` and ``cpu`` always resolve: torch is
    not imported for them."""
    from race.core.errors import ConfigError

    if study.device == "cuda":
        from race.policy.device import prepare_device

        prepare_device(study.device, study.training.dtype)
    for name, reward in study.rewards.items():
        if reward.device is None or not reward.device.startswith("cuda"):
            continue
        import torch

        index, seen = int(reward.device.partition(":")[2] or 0), torch.cuda.device_count()
        if index >= seen:
            raise ConfigError(f"rewards.{name}.device: {reward.device}, but torch sees {seen} "
                              "CUDA device(s) on this machine")
