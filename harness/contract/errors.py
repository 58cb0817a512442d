"""The one error type for bad input: it names the offending config key."""
from harness.contract.units import GB


class ConfigError(ValueError):
    """A configuration the harness refuses; `key` is the dotted config key at fault."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


class PlanRefused(ConfigError):
    """`offload.if_infeasible=refuse`: the plan predicts a peak over its budget, so the point stops at the planning
    step, before the planned phase's step 0, and is recorded `config_error` with the shortfall."""

    def __init__(self, predicted_bytes: int, budget_bytes: int, phase: int):
        self.shortfall_bytes = predicted_bytes - budget_bytes
        super().__init__("offload.if_infeasible", f"refuse: the plan predicts a peak of {predicted_bytes / GB:.2f} GB "
                         f"against its budget of {budget_bytes / GB:.2f} GB, {self.shortfall_bytes / GB:.2f} GB "
                         f"short; refused before phase {phase}'s step 0")


def refusal_in(error: BaseException | None) -> PlanRefused | None:
    """The PlanRefused behind an error, where the compiler wrapped the one our pass raised (its cause, its context,
    or the `inner_exception` of torch's BackendCompilerFailed)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, PlanRefused):
            return error
        seen.add(id(error))
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return None
