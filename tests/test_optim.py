"""The shared supervised step: length-grouped micro-batches give the whole batch's gradient."""

import pytest
import torch

from race.policy.ladder import build_ladder_model
from race.policy.optim import IGNORE_INDEX, collate, length_groups, optimizer_step


def _rows(seed: int = 0, n: int = 12) -> list[tuple[list[int], list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(6, 30, (1,), generator=gen))
        ids = torch.randint(3, 20, (length,), generator=gen).tolist()
        prompt = length // 3  # no loss on the prompt, as in pretraining
        rows.append((ids, [IGNORE_INDEX] * prompt + ids[prompt:]))
    return rows


def _step_grads(model, batches):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay, grads remain
    loss = optimizer_step(model, opt, 0.0, batches)
    return loss, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("groups", [2, 4, 12])
def test_length_groups_give_the_whole_batch_gradient(tokenizer, groups):
    model = build_ladder_model("nano", tokenizer, seed=0)
    rows = _rows()
    whole_loss, whole = _step_grads(model, [collate(rows, tokenizer.pad_token_id)])
    grouped = length_groups(rows, tokenizer.pad_token_id, groups)
    loss, grads = _step_grads(model, grouped)
    assert len(grouped) == groups and sum(b.rows for b in grouped) == len(rows)
    assert loss == pytest.approx(whole_loss, rel=1e-5)
    for g, w in zip(grads, whole, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    # Sorted by length: each micro-batch pads only to its own longest row, never wider.
    widths = [b.width for b in grouped]
    assert widths == sorted(widths) and widths[-1] == max(len(ids) for ids, _ in rows)
    assert sum(b.rows * b.width for b in grouped) < len(rows) * widths[-1]


def test_a_micro_batch_without_labels_adds_nothing(tokenizer):
    model = build_ladder_model("nano", tokenizer, seed=0)
    rows = _rows(n=4)
    unlabelled = [(ids, [IGNORE_INDEX] * len(ids)) for ids, _ in _rows(seed=1, n=4)]
    labelled_loss, labelled = _step_grads(model, [collate(rows, tokenizer.pad_token_id)])
    loss, grads = _step_grads(model, [collate(rows, tokenizer.pad_token_id),
                                      collate(unlabelled, tokenizer.pad_token_id)])
    assert loss == pytest.approx(labelled_loss)
    for g, w in zip(grads, labelled, strict=True):
        torch.testing.assert_close(g, w)
