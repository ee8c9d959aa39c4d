"""Processes and process groups: the launcher (:mod:`.launch`, the only module that sets up and
tears down ``torch.distributed``) and the deferred gradient all-reduce (:mod:`.grad_sync`)."""
