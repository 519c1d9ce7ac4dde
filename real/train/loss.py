"""Execution-level objective of docs/trajectories.md#execution-level-loss (``gyre.real.train.loss``, needs torch).

Inputs are per-token tensors of any one shape (rows of a micro-step, flattened
or not): current log-probabilities ``log pi_theta(y_u | c_u)`` with grad, the
recorded behaviour log-probabilities (reused, never recomputed), a boolean
target mask and the index of each token's execution; plus one advantage per
execution and the batch's raw execution count B * N.

For execution i with target set T_i, L_i = |T_i|:
- log rho_u = logp_u - behavior_u;
- s_i = stopgrad(exp(mean_{u in T_i} log rho_u)) (1 when L_i = 0), monitoring
  and clipping only;
- m_i = 0 if (A_i > 0 and s_i > clip_high) or (A_i < 0 and s_i < clip_low), else 1;
- w_u = stopgrad(min(rho_u, ratio_cap));
- l_u = min(token_loss_cap, -m_i * w_u * A_i * logp_u);
- L_i^loss = (1 / L_i) * sum_{u in T_i} l_u, and 0 when L_i = 0;
- loss = (1 / (B * N)) * sum_i L_i^loss.
Only the token losses carry gradient (through ``logp_u``); ``min`` with the
cap passes no gradient where the cap is taken.

Split invariance: nothing here depends on how T_i is split into trajectories
or rows, nor on their order. When an execution's targets are spread over
several micro-steps, pass ``target_counts`` (L_i of the whole execution) and
``sequence_log_ratio`` (its mean log rho from a no-grad pass) so every part
uses the whole execution's normalisation and clip decision; the sum of the
parts' losses then equals the loss of the whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RATIO_CAP = 5.0
TOKEN_LOSS_CAP = 100.0
CLIP_LOW = 0.995
CLIP_HIGH = 1.005


@dataclass(frozen=True)
class LossStats:
    sequence_ratio: torch.Tensor  # s_i per execution (1 where L_i = 0)
    clip_mask: torch.Tensor  # m_i per execution (1 = kept, 0 = clipped)
    target_counts: torch.Tensor  # L_i per execution
    clip_fraction: float  # clipped executions / executions with targets
    ratio_capped_fraction: float  # targets whose rho exceeded the ratio cap
    loss_capped_fraction: float  # targets whose token loss hit the loss cap


def _check_inputs(logprobs, behavior, mask, execution_index, advantages, num_executions) -> None:
    shapes = {"behavior_logprobs": behavior.shape, "target_mask": mask.shape, "execution_index": execution_index.shape}
    for name, shape in shapes.items():
        if shape != logprobs.shape:
            raise ValueError(f"{name} has shape {tuple(shape)}, logprobs {tuple(logprobs.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"target_mask must be a bool tensor, got {mask.dtype}")
    if advantages.dim() != 1:
        raise ValueError(f"advantages must be 1-D (one per execution), got shape {tuple(advantages.shape)}")
    if not isinstance(num_executions, int) or num_executions < advantages.shape[0] or num_executions < 1:
        raise ValueError(f"num_executions (B*N = {num_executions!r}) must be an int >= the {advantages.shape[0]} "
                         "executions given")
    targets = execution_index[mask]
    if targets.numel() and (targets.min() < 0 or targets.max() >= advantages.shape[0]):
        raise ValueError("execution_index at targets must lie in [0, len(advantages))")
    if not torch.isfinite(behavior[mask]).all() or not torch.isfinite(advantages).all():
        raise ValueError("behavior_logprobs at targets and advantages must be finite")


def execution_level_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    target_mask: torch.Tensor,
    execution_index: torch.Tensor,
    advantages: torch.Tensor,
    *,
    num_executions: int,
    target_counts: torch.Tensor | None = None,
    sequence_log_ratio: torch.Tensor | None = None,
    ratio_cap: float = RATIO_CAP,
    token_loss_cap: float = TOKEN_LOSS_CAP,
    clip_low: float = CLIP_LOW,
    clip_high: float = CLIP_HIGH,
) -> tuple[torch.Tensor, LossStats]:
    """The batch loss of docs/trajectories.md#execution-level-loss and its monitoring statistics (module docstring)."""
    _check_inputs(logprobs, behavior_logprobs, target_mask, execution_index, advantages, num_executions)
    n_exec = advantages.shape[0]
    index = execution_index[target_mask].long()
    logp = logprobs[target_mask]
    log_ratio = logp.detach() - behavior_logprobs[target_mask].to(logp)
    present = logp.new_zeros(n_exec).index_add_(0, index, torch.ones_like(logp))
    counts = present if target_counts is None else _checked_counts(target_counts, present)
    if sequence_log_ratio is None:
        sums = logp.new_zeros(n_exec).index_add_(0, index, log_ratio)
        sequence_log_ratio = sums / present.clamp(min=1)  # the targets this call sees
    seq_ratio = torch.exp(sequence_log_ratio.detach().to(logp))
    adv = advantages.detach().to(logp)
    clipped = ((adv > 0) & (seq_ratio > clip_high)) | ((adv < 0) & (seq_ratio < clip_low))
    keep = (~clipped).to(logp.dtype)
    weight = torch.exp(log_ratio).clamp(max=ratio_cap)
    raw = -keep[index] * weight * adv[index] * logp
    token_loss = raw.clamp(max=token_loss_cap)
    per_exec = logp.new_zeros(n_exec).index_add(0, index, token_loss) / counts.clamp(min=1)
    loss = per_exec.sum() / num_executions
    return loss, _stats(seq_ratio, keep, counts, clipped, log_ratio, raw.detach(), ratio_cap, token_loss_cap)


def _stats(seq_ratio, keep, counts, clipped, log_ratio, raw, ratio_cap, token_loss_cap) -> LossStats:
    with_targets = counts > 0
    n_targets = max(log_ratio.numel(), 1)
    return LossStats(
        sequence_ratio=seq_ratio,
        clip_mask=keep,
        target_counts=counts,
        clip_fraction=float((clipped & with_targets).sum()) / max(int(with_targets.sum()), 1),
        ratio_capped_fraction=float((torch.exp(log_ratio) > ratio_cap).sum()) / n_targets,
        loss_capped_fraction=float((raw > token_loss_cap).sum()) / n_targets,
    )


def _checked_counts(target_counts: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    counts = target_counts.to(present)
    if counts.shape != present.shape or (counts < present).any():
        raise ValueError("target_counts must give, per execution, L_i >= the targets present in this call")
    return counts
