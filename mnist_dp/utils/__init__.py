"""Plumbing every part uses: one-line errors and exit codes, atomic writes, strict JSON input, phase
timing."""
