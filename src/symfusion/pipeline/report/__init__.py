"""The report step: tables and figures from stage results, beside the paper's own numbers."""
