"""What a task's role code is handed (train/, a user's entrypoint): its context, the KV, stack dumps; below train/."""
