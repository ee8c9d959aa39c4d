"""Processes and process groups: the launcher (:mod:`.launch`), the process groups' set-up and
teardown (:mod:`.process_group`, the only module that creates and destroys them), the deferred
gradient all-reduce (:mod:`.grad_sync`) and the ranks' exchange through shared memory on one
machine (:mod:`.shared_rounds`)."""
