"""Processes and process groups: the launcher (:mod:`.launch`, the only module that sets up and
tears down ``torch.distributed``), the deferred gradient all-reduce (:mod:`.grad_sync`) and the
ranks' exchange through shared memory on one machine (:mod:`.shared_rounds`)."""
