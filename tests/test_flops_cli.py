"""``race flops`` through ``race.cli.main``: one test per phase, the table, the errors."""

from __future__ import annotations

import json

import pytest

from race.cli import main
from race.flops import analytic as F


def _run(capsys, *argv: str) -> dict:
    assert main(["flops", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_forward(capsys):
    out = _run(capsys, "nano", "--phase", "forward", "--batch", "3", "--seq", "37",
               "--logits", "5")
    arch = F.resolve_arch("nano")
    assert out["flops"] == 3 * F.forward_flops(arch, 37, logits=5)
    assert out["phase"] == "forward" and out["batch"] == 3 and out["seq"] == 37
    assert out["params"] == arch.params() == out["trainable_params"]
    assert out["non_embedding_params"] == arch.non_embedding_params()
    executed = _run(capsys, "nano", "--batch", "3", "--seq", "37", "--logits", "5",
                    "--executed")
    assert executed["flops"] == 3 * F.forward_flops(arch, 37, logits=5, attention="full")
    assert executed["flops"] > out["flops"]


def test_generate(capsys):
    out = _run(capsys, "Qwen/Qwen2.5-0.5B", "--phase", "generate", "--batch", "2",
               "--prompt", "100", "--new", "20", "--lora-rank", "8")
    arch = F.resolve_arch("Qwen2.5-0.5B")
    lora = F.LoraSpec(8)
    assert out["flops"] == 2 * F.generate_flops(arch, 100, 20, lora=lora)
    assert out["trainable_params"] == F.lora_params(arch, lora)
    big = _run(capsys, "Qwen2.5-14B", "--phase", "generate", "--batch", "512", "--prompt",
               "1000", "--new", "100")
    assert big["flops"] > 2**53  # still exact: a JSON integer, not a float
    assert big["flops"] == 512 * F.generate_flops(F.resolve_arch("Qwen2.5-14B"), 1000, 100)


def test_train(capsys, tmp_path):
    from race.policy.ladder import ladder_config

    ladder_config("micro", 50).save_pretrained(tmp_path)
    arch = F.resolve_arch(str(tmp_path))
    full = _run(capsys, str(tmp_path), "--phase", "train", "--batch", "4", "--seq", "13",
                "--grad-ckpt")
    assert full["flops"] == 4 * F.train_flops(arch, 13, grad_ckpt=True)
    assert full["trainable_params"] == arch.params()
    lora = _run(capsys, str(tmp_path), "--phase", "train", "--batch", "4", "--seq", "13",
                "--lora-rank", "4", "--lora-targets", "q_proj,v_proj", "--vocab", "60")
    spec = F.LoraSpec(4, ("q_proj", "v_proj"))
    assert lora["flops"] == 4 * F.train_flops(arch.with_vocab(60), 13, lora=spec)
    assert lora["lora_targets"] == ["q_proj", "v_proj"] and lora["vocab"] == 60


def test_human_output_and_table(capsys):
    assert main(["flops", "mini", "--seq", "64"]) == 0
    line = capsys.readouterr().out
    assert "e+" in line and str(F.forward_flops(F.resolve_arch("mini"), 64)) in line
    assert main(["flops", "--table", "--ref-len", "256"]) == 0
    table = capsys.readouterr().out
    rows = [r for r in table.splitlines() if r.startswith("| ")]
    assert len(rows) == 1 + 3 + 5  # header, ladder, Qwen2.5
    assert "Qwen2.5-14B" in table and "| 256 |" in table


@pytest.mark.parametrize("argv,needle", [
    (["no-such-model", "--seq", "8"], "no-such-model"),
    (["nano", "--phase", "train", "--lora-rank", "8", "--lora-targets", "q_proj,qkv",
      "--seq", "8"], "qkv"),
    (["nano", "--phase", "train"], "--seq"),
    (["nano", "--phase", "generate", "--prompt", "4"], "--new"),
])
def test_errors_exit_2(capsys, argv, needle):
    assert main(["flops", *argv]) == 2
    assert needle in capsys.readouterr().err
