"""Contracts every floor shares and none owns: the status record (:mod:`.status`) and the KV protocol
(:mod:`.kv_keys`). They import nothing of tfyarn but ``errors``, so any layer may read them."""
