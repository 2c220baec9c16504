"""A mod for a Flower app of one's own: its clients say who they are, so that its audit can
place them.

Flower's server knows a client only by its node id (a 20-digit number that changes with every
run); the partition a simulated node trains on is in the node's config, which the server never
sees. With ``ClientApp(mods=[declare_partition])`` each training reply declares it in its
``client`` ConfigRecord, where the audit reads what a client says of itself: records and the
report then name partition 3, not node 8302046195812264431.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp.typing import ClientAppCallable

from clients.defences.base import released
from clients.reply import CLIENT, PARTITION_ID

# Where Flower's simulation puts each node's partition (``flwr run`` with a simulation
# federation, ``run_simulation``); a deployment's SuperNodes are given it with --node-config.
NODE_PARTITION = "partition-id"


def declare_partition(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Run the ClientApp; to a training reply that carries an update, add the node's partition
    id (when its node config has one) to the reply's ``client`` ConfigRecord (made if absent)."""
    reply = call_next(msg, context)
    partition = context.node_config.get(NODE_PARTITION)
    if not released(reply) or partition is None:
        return reply
    record = reply.content.get(CLIENT)
    if not isinstance(record, ConfigRecord):
        record = ConfigRecord()
        reply.content[CLIENT] = record
    record[PARTITION_ID] = int(partition)
    return reply
