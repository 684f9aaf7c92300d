"""The leadership group's assignor and the instance's states (`bus.leadership`), without a broker
(the takeover with real processes: tests/e2e/test_standby.py)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from hivemux.bus import Service
from hivemux.bus.leadership import LEADER_PARTITION, KeepTheLeader, Leadership, Role, choose_leader
from hivemux.errors import ConfigurationError
from hivemux.settings import ServiceSettings
from hivemux.topics import JOBS_SUBMITTED, LEADERSHIP


@pytest.mark.parametrize(
    ("held", "leader"),
    [
        ({"m-a": False}, "m-a"),
        ({"m-b": False, "m-a": False}, "m-a"),  # nobody held it: the first by member id
        ({"m-a": False, "m-b": True}, "m-b"),  # the holder keeps it, whatever the ids
        ({"m-c": True, "m-b": True, "m-a": False}, "m-b"),  # two claim it (after a split): the first of them
    ],
    ids=["alone", "fresh-group", "holder-keeps", "split"],
)
def test_choose_leader(held: dict[str, bool], leader: str) -> None:
    assert choose_leader(held) == leader


def _leadership(instance: str = "0") -> Leadership:
    settings = ServiceSettings.model_validate({"HIVEMUX_INSTANCE": instance})
    return Leadership("matcher", f"matcher/{instance}", settings)


def test_the_assignor_gives_the_one_partition_to_the_member_that_held_it() -> None:
    holder, newcomer = _leadership("1"), _leadership("0")
    holder.held = True
    members = {
        "aaa-restarted": KeepTheLeader(newcomer).metadata([LEADERSHIP.name]),
        "zzz-holder": KeepTheLeader(holder).metadata([LEADERSHIP.name]),
    }
    assignment = KeepTheLeader(newcomer).assign(None, members)  # whoever the group leader is computes the same
    assert [tuple(a) for a in assignment["zzz-holder"].assignment] == [(LEADERSHIP.name, [0])]
    assert list(assignment["aaa-restarted"].assignment) == []


def test_metadata_says_whether_this_member_held_the_lead() -> None:
    lead = _leadership()
    assert KeepTheLeader(lead).metadata([LEADERSHIP.name]) == ConsumerProtocolMemberMetadata(0, [LEADERSHIP.name], b"0")
    lead.assigned({LEADER_PARTITION})
    assert KeepTheLeader(lead).metadata([LEADERSHIP.name]).user_data == b"1"


async def test_states_standby_taking_over_standby() -> None:
    lead = _leadership()
    assert lead.role is Role.STANDBY and not lead.active
    lead.assigned({TopicPartition(LEADERSHIP.name, 0)})
    assert lead.role is Role.TAKING_OVER and lead.held
    lead.assigned(set())  # an assignment without the partition does not make it active
    assert lead.role is Role.TAKING_OVER and not lead.held
    await lead.step_down("revoked")
    assert lead.role is Role.STANDBY


async def test_a_revocation_waits_for_the_batch_in_hand() -> None:
    lead = _leadership()
    lead.role = Role.ACTIVE
    async with lead.turn():  # the fold loop is handling and publishing a batch
        stepping_down = asyncio.create_task(lead.step_down("revoked"))
        await asyncio.sleep(0.05)
        assert not stepping_down.done() and lead.active
    await stepping_down
    assert lead.role is Role.STANDBY


async def test_a_single_active_service_only_folds() -> None:
    service = Service("matcher", ServiceSettings(create_topics=False))
    service.on(JOBS_SUBMITTED, lambda event, ctx: None)
    service.audit({})
    service.single_active()
    with pytest.raises(ConfigurationError, match="only folds"):
        await service.run(install_signal_handlers=False)


def test_a_single_active_service_is_audited_first() -> None:
    """Its journal is what tells its standbys which records a leader decided (`bus.undecided`)."""
    service = Service("matcher", ServiceSettings(create_topics=False))
    with pytest.raises(ConfigurationError, match="audited first"):
        service.single_active()
    service.audit({})
    service.single_active()
    assert service.undecided is not None and service.undecided.incarnation == service.journal.incarnation  # type: ignore[union-attr]
