"""Human approval gates: resume tokens, the approval ledger and the gate."""
