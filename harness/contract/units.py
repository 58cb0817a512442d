"""Units shared by the harness and the analysis."""

GB = 1e9  # decimal gigabytes everywhere (budgets, device sizes, tables), as DeepSpeed's DS_DC_OFFLOAD_OPT_BUDGET_GB
