"""What only the submitting machine uses: packaging the environment, preflight checks, the tasks' Python."""
