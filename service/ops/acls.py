"""``payauth acls``: the Kafka ACLs a principal needs to run as a worker of the configured
group and topics, printed (dry run) or created (``--execute``, with the current settings'
credentials: an administrator's).

The least a worker needs, and why each:

- Read on the input topic: fetch it (Read implies Describe: metadata, offsets);
- Read on the group: join, sync, heartbeat, commit offsets;
- Write on the output and dead-letter topics: the result events and dead letters (an
  idempotent producer needs no IdempotentWrite on the cluster once it may write a topic);
- DescribeConfigs on the dead-letter topic: its ``max.message.bytes``, read at start.

Nothing else: no Create (topics are an administrator's, ``payauth topics``), no Alter, no
cluster-wide right. Every binding is literal (one topic, one group) and allows any host.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported at run time
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from service.adapters.kafka.config import client_config
from service.config import Settings


class AclsRefused(Exception):
    """The cluster refused to create an ACL (one line for the operator)."""


@dataclass(frozen=True)
class Acl:
    resource: str  # "topic" or "group"
    name: str
    operation: str  # Kafka's name: Read, Write, DescribeConfigs

    def render(self, principal: str) -> str:
        return f"ALLOW {principal} {self.operation} on {self.resource} {self.name}"


def worker_acls(settings: Settings) -> list[Acl]:
    """The worker's ACLs for the settings' group and topics, in a stable order."""
    return [
        Acl("topic", settings.input_topic, "Read"),
        Acl("group", settings.group_id, "Read"),
        Acl("topic", settings.output_topic, "Write"),
        Acl("topic", settings.dlq_topic, "Write"),
        Acl("topic", settings.dlq_topic, "DescribeConfigs"),
    ]


_OPERATIONS = {"Read": AclOperation.READ, "Write": AclOperation.WRITE,
               "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS}
_RESOURCES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}


def bindings(acls: list[Acl], principal: str) -> list[AclBinding]:
    return [AclBinding(_RESOURCES[a.resource], a.name, ResourcePatternType.LITERAL, principal,
                       "*", _OPERATIONS[a.operation], AclPermissionType.ALLOW)
            for a in acls]


def create(settings: Settings, acls: list[Acl], principal: str, timeout: float = 30) -> int:
    """Create the ACLs (creating one that exists is a no-op for Kafka); return how many."""
    admin = AdminClient(client_config(settings))
    futures = admin.create_acls(bindings(acls, principal), request_timeout=timeout)
    for acl, future in zip(acls, futures.values(), strict=True):
        try:
            future.result(timeout=timeout)
        except Exception as exc:  # KafkaException, or a timeout: name the binding refused
            raise AclsRefused(f"could not create {acl.render(principal)}: {exc}") from None
    return len(futures)
