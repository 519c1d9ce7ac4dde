"""Cell roles and the legal role changes, as data (readable in one screen).

A cell is in one of four roles. ``ROLE_CHANGES[(role, event)] -> role`` is the
whole table: a transition begins (the scheduler's BeginTransition) and ends
(the driver's TransitionDone). Nothing else changes a role.

    rollout --begin training--> to_training --done--> training
    training --begin rollout--> to_rollout --done--> rollout
"""

from __future__ import annotations

ROLLOUT = "rollout"
TRAINING = "training"
TO_TRAINING = "to_training"
TO_ROLLOUT = "to_rollout"
ROLES = (ROLLOUT, TO_TRAINING, TRAINING, TO_ROLLOUT)

#: (current role, what happens) -> next role
ROLE_CHANGES: dict[tuple[str, str], str] = {
    (ROLLOUT, "begin_training"): TO_TRAINING,
    (TO_TRAINING, "done_training"): TRAINING,
    (TRAINING, "begin_rollout"): TO_ROLLOUT,
    (TO_ROLLOUT, "done_rollout"): ROLLOUT,
}

#: the role a cell is heading for while it is switching
DESTINATION = {TO_TRAINING: TRAINING, TO_ROLLOUT: ROLLOUT}


def next_role(role: str, change: str) -> str | None:
    """The role after ``change``, or None when the change is illegal from ``role``."""
    return ROLE_CHANGES.get((role, change))
