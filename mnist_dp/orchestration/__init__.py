"""The Substra side: assets and their contract, function archives, compute plans, registration,
execution."""
