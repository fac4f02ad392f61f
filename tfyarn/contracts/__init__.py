"""Contracts every floor shares and none owns: the status record (:mod:`.status`), the KV protocol
(:mod:`.kv_keys`) and the failure triage (:mod:`.triage`: the cluster's doing or the user's code). They import
nothing of tfyarn but ``errors``, so any layer may read them."""
