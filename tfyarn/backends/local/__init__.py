"""The local backend: every task an OS process on this machine (``backend``), run by a launcher process
(``launcher``: the application master of a local app) with its KV server, fork server client and memory
readings."""
