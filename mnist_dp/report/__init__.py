"""What a run reports: its train tasks' results, read from Substra and the ledgers, as a table and
files."""
