"""Feedback models by name: a PRM ladder name, a directory or a hub id, and the kind of model a
checkpoint holds (token classifier, sequence classifier, Qwen-Math PRM)."""

from __future__ import annotations

from pathlib import Path

from race.core.cells import is_hub_id
from race.core.specs import MODEL_OPTIONS
from race.feedback.kind import model_kind
from race.feedback.models import FeedbackModel, OutcomeRewardModel, TokenClassifierPRM
from race.feedback.qwen_math import QwenMathPRM

_HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "tokenizer*"]

# --------------------------------------------------------------------------- loading


def resolve_model_dir(spec: str | Path, results_dir: str | Path = "results",
                      revision: str | None = None) -> Path:
    """A local directory for a feedback-model spec: a PRM ladder name ->
    ``results_dir/prm/size~NAME``; an existing directory -> itself; a hub id (``org/name``)
    -> ``huggingface_hub.snapshot_download`` at ``revision``, else at its pin
    (:func:`race.core.references.revision_of`), else at the default branch (``ValueError``
    when the hub is unreachable)."""
    from race.core.ladder import LADDER_DIALS

    text = str(spec)
    if text in LADDER_DIALS:
        path = Path(results_dir) / "prm" / f"size~{text}"
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"PRM {text!r}: {path} holds no trained PRM; train it with "
                f"`race prm --config CONFIG --cell size~{text}` (the workflow's prm rule)")
        return path
    path = Path(text)
    if path.is_dir():
        return path
    if not is_hub_id(text):
        raise FileNotFoundError(f"feedback model {text!r}: not a PRM ladder name "
                                f"({', '.join(LADDER_DIALS)}), a directory or a hub id")
    from race.core.references import revision_of

    revision = revision_of(text, revision)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(text, revision=revision, allow_patterns=_HUB_FILES))
    except Exception as exc:  # offline, unknown id, gated repository: all end here
        reason = (str(exc).splitlines() or [""])[0][:200]
        at = f" --revision {revision}" if revision else ""
        raise ValueError(
            f"feedback model {text!r}: not a local directory, and the Hugging Face hub did not "
            f"provide it ({type(exc).__name__}: {reason}). "
            f"Download it where the hub is reachable (`hf download {text}{at} --local-dir DIR`) "
            "and pass DIR instead.") from None


def load_feedback_model(spec_or_path, results_dir: str | Path = "results", *,
                        policy_tokenizer=None, **options) -> FeedbackModel:
    """A feedback model from a ladder name, a directory, a hub id, or a ``rewards:`` entry
    (a dict: its ``prm`` or ``orm`` key names the model, :data:`MODEL_OPTIONS` keys pass
    through). The kind comes from the checkpoint (:func:`model_kind`)."""
    if isinstance(spec_or_path, dict):
        spec = spec_or_path
        target = spec.get("prm") or spec.get("orm")
        if target is None:
            raise ValueError(f"feedback model spec {spec} names no model (a prm or orm key)")
        options = {**{k: spec[k] for k in MODEL_OPTIONS if k in spec}, **options}
    else:
        target = spec_or_path
    unknown = sorted(set(options) - set(MODEL_OPTIONS))
    if unknown:
        raise TypeError(f"unknown feedback-model option(s) {unknown}; known: {MODEL_OPTIONS}")
    path = resolve_model_dir(target, results_dir)
    kind = model_kind(path)
    common = {"name": str(target), "policy_tokenizer": policy_tokenizer, **options}
    if kind == "qwen_math":
        return QwenMathPRM(path, **common)
    common.pop("chat_template", None)
    if kind == "orm":
        return OutcomeRewardModel(path, **common)
    return TokenClassifierPRM(path, **common)


def load_prm(path_or_spec, results_dir: str | Path = "results", **options) -> FeedbackModel:
    """For best-of-n reranking: an object with ``score(prompts, completions, aggregate="min")
    -> list[float]`` and ``consume() -> PhaseFlops`` (the eval FLOPs of scoring). Accepts
    what :func:`load_feedback_model` accepts (``options``: :data:`MODEL_OPTIONS`)."""
    return load_feedback_model(path_or_spec, results_dir, **options)
