"""What a client's training reply holds: the record names, keys and statuses that the ClientApp
writes and the server reads, in one place so that both sides agree.

A reply holds the updated weights (:data:`ARRAYS`), ``num-examples`` and the training loss
(:data:`METRICS`, averaged by FedAvg), the client's declared settings, its :data:`STATUS` and,
for a failed round, its :data:`REASON` (:data:`CLIENT`, a ConfigRecord, never averaged), and,
in simulation only, which samples it trained on (:data:`AUDIT`). A failed reply has no arrays
and ``num-examples`` 0: nothing of it can be aggregated.
"""

from __future__ import annotations

# Records of the reply (and the server's message: ``arrays`` and ``config``).
ARRAYS = "arrays"
METRICS = "metrics"
CLIENT = "client"
AUDIT = "audit"
CONFIG = "config"

# Keys inside them.
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
SERVER_ROUND = "server-round"
PARTITION_ID = "partition-id"
SAMPLE_IDS = "sample-ids"
STATUS = "status"
REASON = "reason"

# Statuses: a client's own (``ok``, ``diverged``, ``client-error``), and the server's verdict on
# a reply it cannot use whatever the client declared (``rejected``).
OK = "ok"
DIVERGED = "diverged"
CLIENT_ERROR = "client-error"
REJECTED = "rejected"
# A client sampled under secure aggregation whose masked vector never came (its round failed
# or it left): the sum was unmasked without it.
DROPPED = "dropped"
# The statuses of a reply left out of aggregation, as clients.jsonl and the audit record them.
LEFT_OUT = (DIVERGED, CLIENT_ERROR, REJECTED, DROPPED)

# What a client's check of the model it received found (:mod:`clients.tamper_check`), declared
# in :data:`CLIENT`: whether the model looks tampered with, which checks fired (their names
# joined by ", ": a string, since SecAgg+'s legacy fit metrics carry scalars only), why, and
# the share of its first layer's (sample, neuron) pairs its own batch activated.
TAMPER_FLAGGED = "tamper-flagged"
TAMPER_CHECKS = "tamper-checks"
TAMPER_REASON = "tamper-reason"
ACTIVE_SHARE = "active-share"
