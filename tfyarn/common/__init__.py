"""What the gateway and the tasks both use: paths, interrupts, fsspec I/O and retries, the fork server's wire."""
