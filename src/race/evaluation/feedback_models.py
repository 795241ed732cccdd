"""The feedback models of one evaluation job, each loaded once and shared by every snapshot and
target that uses it (a 7B PRM for ``prm_bon`` and the same PRM as the ``native_reward`` reward
is one copy in memory beside the policy, not two per rung)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class FeedbackModels:
    """A per-job cache of loaded feedback models; :meth:`load` is called as
    :func:`race.feedback.loading.load_feedback_model` is (the ``load`` of
    :func:`race.feedback.rewards.build_model_reward`).

    Key (:meth:`key`): the model reference (a ladder name as its folder
    ``results_dir/prm/size~NAME`` and a directory as its absolute path, so two spellings of one
    folder share; a hub id as written, not downloaded to be named), the loading options
    (:data:`race.core.specs.MODEL_OPTIONS`, unset ones left out, the device resolved as the model
    resolves it: they decide the weights' placement and dtype, the kernels, the text format and
    the batching, hence the scores and the executed FLOPs), and the policy tokenizer's
    ``name_or_path`` (the load probes the PRM's vocabulary against it and measures the
    ``expansion`` of :attr:`FeedbackModel.reads` from it). An option spelled out at its default
    value makes its own key: at worst a second load, never a wrong share.

    Sharing keeps every ledger exact: a model's FLOP ledger is one per instance, and each
    target consumes it right before and right after its own scoring (race.evaluation.targets),
    so what one target ran is never charged to another.
    """

    def __init__(self):
        self._models: dict[tuple, Any] = {}

    @staticmethod
    def key(reference: str | Path, results_dir: str | Path = "results", *,
            policy_tokenizer=None, **options) -> tuple:
        """What identifies a loaded model (class docstring)."""
        from race.feedback.models import resolve_device

        options = {k: v for k, v in options.items() if v is not None}
        if "device" in options:
            options["device"] = resolve_device(options["device"])
        return (_reference(reference, results_dir), tuple(sorted(options.items())),
                getattr(policy_tokenizer, "name_or_path", None))

    def load(self, reference: str | Path, results_dir: str | Path = "results", *,
             policy_tokenizer=None, **options):
        """The model ``reference`` names, loaded with ``options`` on the first call for its key
        and the same instance on every later one."""
        key = self.key(reference, results_dir, policy_tokenizer=policy_tokenizer, **options)
        if key not in self._models:
            from race.feedback.loading import load_feedback_model

            self._models[key] = load_feedback_model(str(reference), results_dir,
                                                    policy_tokenizer=policy_tokenizer, **options)
        return self._models[key]


def _reference(reference: str | Path, results_dir: str | Path) -> str:
    """A ladder name or a directory as its absolute folder; anything else (a hub id) as written:
    resolving it would download it, and the load says what is wrong with a bad one."""
    from race.core.ladder import LADDER_DIALS
    from race.feedback.loading import resolve_model_dir

    text = str(reference)
    if text not in LADDER_DIALS and not Path(text).is_dir():
        return text
    return str(resolve_model_dir(text, results_dir).resolve())
