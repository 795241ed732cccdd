"""A policy snapshot as evaluation loads it: a base policy, optionally with a budget rung's LoRA
adapter (merged, or kept apart and charged), and the rung it came from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from race.core.outputs import read_output
from race.flops import analytic as flops


@dataclass
class Snapshot:
    """A loaded policy and what its FLOPs depend on."""

    model: Any
    tokenizer: Any
    arch: flops.Arch
    lora: flops.LoraSpec | None  # adapters charged on every forward (None: none or merged)
    policy: str
    adapter: str | None
    merged: bool


def lora_spec_of(adapter_dir: str | Path) -> flops.LoraSpec:
    """The rank and target modules of a saved PEFT LoRA adapter (``adapter_config.json``)."""
    cfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    targets = cfg.get("target_modules") or ()
    targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets))
    return flops.LoraSpec(int(cfg["r"]), targets)


def load_snapshot(policy: str | Path, adapter: str | Path | None = None, *, merge: bool = True,
                  attn_implementation: str = "sdpa", dtype: str = "float32",
                  device: str = "cpu") -> Snapshot:
    """Base policy (in ``dtype``, on ``device``: ``cpu`` or ``cuda``, no remote code) +
    optionally the LoRA adapter in ``adapter``.

    ``merge``: fold the adapter into the base weights (``merge_and_unload``); otherwise keep it
    as a separate PEFT module and charge its FLOPs. The tokenizer is the base policy's. The
    policy moves to ``device`` before the adapter is applied, so the merge runs there.
    """
    import torch

    from race.data.tokenizer import load_tokenizer
    from race.policy.ladder import load_policy
    from race.study.inputs import check_adapter_dir

    if adapter is not None:
        check_adapter_dir(adapter)  # safetensors only, checked before the policy loads
    model = load_policy(str(policy), attn_implementation=attn_implementation,
                        dtype=getattr(torch, dtype)).to(device)  # a 7B merge is slow on a CPU
    arch = flops.Arch.from_config(model.config)
    lora = None
    if adapter is not None:
        from peft import PeftModel

        from race.policy.ladder import quiet_checkpointing_renames

        quiet_checkpointing_renames()  # PEFT reads a deprecated transformers property
        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        if merge:
            model = model.merge_and_unload()
        else:
            lora = lora_spec_of(adapter)
    # PEFT puts each adapter weight beside its base layer: this only makes sure of it.
    model.to(device).eval()
    return Snapshot(model, load_tokenizer(policy), arch, lora, str(policy),
                    None if adapter is None else str(adapter), adapter is not None and merge)


def rung_info(adapter: str | Path | None) -> dict:
    """``{step, budget, train_model_flops}`` of a rung folder (from its ledger.json); a base
    policy is step 0 with no budget. A folder without a ledger gives ``step: None``."""
    if adapter is None:
        return {"step": 0, "budget": None, "train_model_flops": 0}
    path = Path(adapter) / "ledger.json"
    if not path.exists():
        return {"step": None, "budget": None, "train_model_flops": None}
    ledger = read_output(path)
    return {"step": int(ledger["step"]), "budget": ledger.get("budget"),
            "train_model_flops": ledger.get("model_flops")}
