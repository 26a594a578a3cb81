"""Error codes the library itself writes into records (docs/design.md §2.5 error-code syntax)."""

from __future__ import annotations

AMBIGUOUS_STEP = "ambiguous_step"
AMBIGUOUS_COMPENSATION = "ambiguous_compensation"
COMPENSATION_FAILED = "compensation_failed"
COMPENSATION_EXHAUSTED = "compensation_exhausted"
INVALID_RETRY_POLICY = "invalid_retry_policy"
INVALID_RESULT = "invalid_result"
UNKNOWN_TASK = "unknown_task"
NONDETERMINISTIC = "nondeterministic"
RUN_FAILED = "run_failed"
INVALID_STEP_CALL = "invalid_step_call"
PAYLOAD_TOO_LARGE = "payload_too_large"
CANCELLED = "cancelled"
NOT_STARTED = "not_started"
NOT_COMMITTED = "not_committed"
ARGUMENTS_MISMATCH = "arguments_mismatch"
STEP_ERROR = "step_error"
WORKER_LOST = "worker_lost"
TIME_LIMIT = "time_limit"
APPROVAL_DENIED = "approval_denied"
APPROVAL_EXPIRED = "approval_expired"
SIGNAL_TIMEOUT = "signal_timeout"
CHILD_COMPENSATED = "child_compensated"
CHILD_IN_REVIEW = "child_in_review"
CHILD_ID_TAKEN = "child_id_taken"
PARENT_COMPENSATING = "parent_compensating"
INVALID_RESULT = "invalid_result"

# Manual review caused only by an unknown outcome lifts itself once that outcome is known.
AUTO_LIFTED = frozenset({AMBIGUOUS_STEP, AMBIGUOUS_COMPENSATION})
