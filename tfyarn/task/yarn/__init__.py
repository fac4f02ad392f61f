"""What only a YARN container's task runs: the skein KV and its task slots, the end of the app, the exit report."""
