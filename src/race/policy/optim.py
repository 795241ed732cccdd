"""The supervised optimizer step shared by base-policy pretraining and PRM training."""

from __future__ import annotations


def optimizer_step(model, opt, lr: float, **batch):
    """One supervised step at learning rate ``lr`` (gradient norm clipped to 1); returns the
    loss. Shared by base-policy pretraining and PRM training."""
    import torch

    for group in opt.param_groups:
        group["lr"] = lr
    loss = model(**batch).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss
