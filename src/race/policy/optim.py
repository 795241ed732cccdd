"""The supervised optimizer step shared by base-policy pretraining and PRM training.

A step's batch runs as length-grouped micro-batches: its rows sorted by length, cut into
``groups`` chunks, each right-padded only to its own longest row, their gradients accumulated
before one optimizer step. The loss is the batch's token mean either way (each micro-batch's
mean weighted by its share of the batch's labelled tokens), so the gradient is the full
batch's up to float rounding; what changes is the padding the kernels run on (executed
FLOPs), which a batch of mixed lengths padded to its longest row mostly spends on pad tokens.
Rows are independent under right padding and causal attention, so a row's outputs do not
depend on its batch-mates either. Dropout is the exception: where it is active (the PRM's
token-classifier head has transformers' default 0.1) its masks are drawn per micro-batch, so
grouping gives other draws of the same distribution, not the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

IGNORE_INDEX = -100  # the label of a position without a loss (torch's cross-entropy default)
#: Micro-batches per batch in pretraining and PRM training: the same gradient, less padding
#: executed. ``python bench/performance/length_groups.py`` times it beside the batch padded whole.
LENGTH_GROUPS = 4


@dataclass(frozen=True)
class MicroBatch:
    """One right-padded chunk: ``input_ids``, ``attention_mask``, ``labels`` (rows x width)."""

    input_ids: object
    attention_mask: object
    labels: object

    @property
    def width(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device) -> MicroBatch:
        """The same batch on ``device`` (batches are collated on the CPU and follow the model)."""
        return MicroBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask,
                                                     self.labels)))


def collate(rows: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int) -> MicroBatch:
    """Right-padded tensors of (ids, labels) rows (labels as long as ids; IGNORE_INDEX where no
    loss), padded to the longest row."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, :len(x)], labels[i, :len(y)], mask[i, :len(x)] = (
            torch.tensor(x), torch.tensor(y), 1)
    return MicroBatch(ids, mask, labels)


def length_groups(rows: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int,
                  groups: int) -> list[MicroBatch]:
    """The batch ``rows`` as at most ``groups`` micro-batches of consecutive lengths (a stable
    sort, so equal lengths keep their batch order)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    size = -(-len(rows) // max(1, groups))
    return [collate([rows[i] for i in order[at:at + size]], pad_id)
            for at in range(0, len(order), size)]


def optimizer_step(model, opt, lr: float, batches: Sequence[MicroBatch]) -> float:
    """One supervised step at learning rate ``lr`` over the micro-batches of one batch
    (gradients accumulated, norm clipped to 1); returns the batch's mean token loss.

    Each micro-batch's mean loss is weighted by its share of the batch's labelled tokens, so
    the accumulated gradient is that of the batch mean, as if the batch had run whole. The
    share counts labels != IGNORE_INDEX, which assumes a row's first position carries no
    label (a causal LM's shift drops it); both callers' rows start with a prompt token.
    """
    import torch

    for group in opt.param_groups:
        group["lr"] = lr
    counts = [int((b.labels != IGNORE_INDEX).sum()) for b in batches]
    items = sum(counts)
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for b, n in zip(batches, counts, strict=True):
        if n == 0:  # no labelled token: no loss term (its mean would be NaN)
            continue
        b = b.to(model.device)
        loss = model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                     labels=b.labels).loss * (n / items)
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return total
