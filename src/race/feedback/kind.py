"""What kind of feedback model a checkpoint folder holds -- our token-classifier PRM
(``token``), Qwen2.5-Math-PRM (``qwen_math``) or a sequence classifier used as an outcome
reward model (``orm``) -- read from its files alone, without torch: the config check tells a
PRM from an ORM before any job starts, and the loader (race.feedback.loading) picks the class
to load it with."""

from __future__ import annotations

import json
from pathlib import Path

#: The Qwen2.5-Math-PRM step separator: one token closing each step.
QWEN_STEP_TOKEN = "<extra_0>"
#: The system turn of the Qwen2.5-Math-PRM model card's usage example.
QWEN_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
#: Per kind, the text closing each step (None: an ORM reads the raw text) and the score
#: head the FLOP model prices (race.flops.analytic.reward_model_flops).
SEPARATOR = {"token": "\n", "qwen_math": QWEN_STEP_TOKEN, "orm": None}
HEAD = {"token": "token", "qwen_math": "prm_mlp", "orm": "sequence"}


def model_kind(path: str | Path) -> str:
    """``token`` (ours), ``qwen_math`` or ``orm``, from config.json's ``architectures`` (and
    the safetensors head names when that is inconclusive)."""
    path = Path(path)
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"feedback model directory {path} has no config.json")
    archs = json.loads(config.read_text()).get("architectures") or []
    for arch in archs:
        if arch.endswith("ForTokenClassification"):
            return "token"
        if arch.endswith("ForSequenceClassification"):
            return "orm"
        if arch.endswith("ForProcessRewardModel"):
            return "qwen_math"
    from safetensors import safe_open

    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(str(shard), framework="numpy") as f:  # the names only: no torch
            if "score.2.weight" in f.keys():
                return "qwen_math"
    raise ValueError(f"feedback model {path}: cannot tell its kind (architectures {archs}); "
                     "expected a token classifier, a sequence classifier or a Qwen-Math PRM")


def num_labels(path: str | Path) -> int:
    """The score head's labels, from config.json (``num_labels``, else ``id2label``; 2 when
    neither is written, transformers' default)."""
    config = json.loads((Path(path) / "config.json").read_text())
    return int(config.get("num_labels") or len(config.get("id2label") or {}) or 2)
