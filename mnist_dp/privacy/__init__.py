"""What ε covers and how it is computed: DP events, the accountant, the ledger, a run's budget,
model files."""
