"""The tier contract, scenario by scenario, on every CPU tier through the runtime.

The scenarios live in ``tests/tier_scenarios.py`` so the GPU (simulator) and Ray test
processes run the same ones. Run this file again with ``PYDOTCOMPUTE_PUREPYTHON=1`` for the
process tier on the pure-Python ring.
"""

from __future__ import annotations

import inspect

import pytest

from tests import tier_scenarios as sc

CASES = [
    pytest.param(sc.ASYNCIO, id="asyncio"),
    pytest.param(sc.THREAD, id="thread"),
    pytest.param(sc.PROCESS, id="process"),
    pytest.param(sc.PROCESS_SPIN, id="process-spin"),
]


def _makes_requests(test_name: str) -> bool:
    """Whether the scenario a test runs calls ``send_and_receive`` (reading its source):
    ``reply_spin_us`` changes nothing else, so process-spin runs only those."""
    scenario = getattr(sc, "scenario_" + test_name.removeprefix("test_"), None)
    return scenario is None or "send_and_receive" in inspect.getsource(scenario)


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> sc.TierCase:
    if request.param is sc.PROCESS_SPIN and not _makes_requests(request.node.originalname):
        pytest.skip(
            "reply_spin_us changes only send_and_receive, which this scenario never calls: "
            "the process case runs the same code"
        )
    return request.param  # type: ignore[no-any-return]


async def test_request_loop_lets_other_tasks_run(case: sc.TierCase) -> None:
    await sc.scenario_request_loop_lets_other_tasks_run(case)


async def test_terminate_with_unread_replies(case: sc.TierCase) -> None:
    await sc.scenario_terminate_with_unread_replies(case)


async def test_forward_into_full_kernel_at_terminate(case: sc.TierCase) -> None:
    await sc.scenario_forward_into_full_kernel_at_terminate(case)


async def test_message_in_hand_at_grace_end(case: sc.TierCase) -> None:
    await sc.scenario_message_in_hand_at_grace_end(case)


async def test_answered_message_in_hand_is_not_handed_back(case: sc.TierCase) -> None:
    await sc.scenario_answered_message_in_hand_is_not_handed_back(case)


async def test_forward_into_reject_inbox(case: sc.TierCase) -> None:
    await sc.scenario_forward_into_reject_inbox(case)


async def test_failure_reports_each_message_once(case: sc.TierCase) -> None:
    await sc.scenario_failure_reports_each_message_once(case)


async def test_drop_oldest_counted(case: sc.TierCase) -> None:
    await sc.scenario_drop_oldest_counted(case)


async def test_leave_scope_mid_pipeline(case: sc.TierCase) -> None:
    await sc.scenario_leave_scope_mid_pipeline(case)


async def test_abandoned_replies_do_not_wedge(case: sc.TierCase) -> None:
    await sc.scenario_abandoned_replies_do_not_wedge(case)


async def test_cancel_send_and_receive_loops(case: sc.TierCase) -> None:
    await sc.scenario_cancel_send_and_receive_loops(case)


async def test_receive_on_launched_kernel(case: sc.TierCase) -> None:
    await sc.scenario_receive_on_launched_kernel(case)


async def test_restart_on_failure(case: sc.TierCase) -> None:
    await sc.scenario_restart_on_failure(case)


@pytest.mark.parametrize("serialize", [False, True], ids=["objects", "serialized"])
async def test_bad_field_is_not_a_poison_pill(case: sc.TierCase, serialize: bool) -> None:
    await sc.scenario_bad_field_is_not_a_poison_pill(case, serialize=serialize)


async def test_bridge_bound_holds(case: sc.TierCase) -> None:
    if case.name == "asyncio":
        pytest.skip("the asyncio tier has no bridge: its inbox is the only bound")
    await sc.scenario_bridge_bound_holds(case)


async def test_priority_not_starved(case: sc.TierCase) -> None:
    if case.name == "asyncio":
        pytest.skip("the asyncio tier serves its banded inbox directly")
    await sc.scenario_priority_not_starved(case)


async def test_wrong_actor_kind_refused(case: sc.TierCase) -> None:
    await sc.scenario_wrong_actor_kind_refused(case)


async def test_oversized_message_refused_at_send(case: sc.TierCase) -> None:
    await sc.scenario_oversized_message(case)


async def test_pipeline_exactly_once(case: sc.TierCase) -> None:
    await sc.scenario_pipeline_exactly_once(case)


@pytest.mark.parametrize("serialize", [False, True], ids=["objects", "serialized"])
async def test_factory_message_keeps_its_class(case: sc.TierCase, serialize: bool) -> None:
    await sc.scenario_factory_message_keeps_its_class(case, serialize=serialize)


@pytest.mark.parametrize("serialize", [False, True], ids=["objects", "serialized"])
async def test_value_too_deep_refused_at_send(case: sc.TierCase, serialize: bool) -> None:
    await sc.scenario_value_too_deep_refused_at_send(case, serialize=serialize)


async def test_same_request_object_twice(case: sc.TierCase) -> None:
    await sc.scenario_same_request_object_twice(case)


async def test_abandoned_requests_bounded(case: sc.TierCase) -> None:
    await sc.scenario_abandoned_requests_bounded(case)


async def test_control_message_overtakes_blocked_senders(case: sc.TierCase) -> None:
    await sc.scenario_control_message_overtakes_blocked_senders(case)


async def test_producer_actor_yields(case: sc.TierCase) -> None:
    await sc.scenario_producer_actor_yields(case)


async def test_every_message_is_timed(case: sc.TierCase) -> None:
    await sc.scenario_every_message_is_timed(case)


async def test_actor_returns_by_itself(case: sc.TierCase) -> None:
    await sc.scenario_actor_returns_by_itself(case)


async def test_cut_off_in_send_to_full_kernel(case: sc.TierCase) -> None:
    await sc.scenario_cut_off_in_send_to_full_kernel(case)


async def test_shutdown_drains_pipeline_head_to_tail(case: sc.TierCase) -> None:
    await sc.scenario_shutdown_drains_pipeline_head_to_tail(case)


async def test_shutdown_from_inside_an_actor_is_refused(case: sc.TierCase) -> None:
    await sc.scenario_shutdown_from_inside_an_actor_is_refused(case)


async def test_non_finite_float_options_refused(case: sc.TierCase) -> None:
    await sc.scenario_non_finite_float_options_refused(case)


async def test_restart_intensity(case: sc.TierCase) -> None:
    if case.name not in sc.RESTARTS:
        pytest.skip(f"the {case.name} tier refuses restart='on_failure' at launch")
    await sc.scenario_restart_intensity(case)


async def test_restarted_request_error_does_not_say_active(case: sc.TierCase) -> None:
    if case.name not in sc.RESTARTS:
        pytest.skip(f"the {case.name} tier refuses restart='on_failure' at launch")
    await sc.scenario_restarted_request_error_does_not_say_active(case)


async def test_unordered_shutdown_counts_drops_in_one_line(case: sc.TierCase) -> None:
    await sc.scenario_unordered_shutdown_counts_drops_in_one_line(case)


async def test_restarts_account_for_every_message(case: sc.TierCase) -> None:
    if case.name not in sc.RESTART_TIERS:
        pytest.skip(f"the {case.name} tier refuses restart='on_failure' at launch")
    await sc.scenario_restarts_account_for_every_message(case)


async def test_handed_back_counted_as_undelivered(case: sc.TierCase) -> None:
    await sc.scenario_handed_back_counted_as_undelivered(case)


async def test_reply_nobody_waits_for_counted_as_lost(case: sc.TierCase) -> None:
    await sc.scenario_reply_nobody_waits_for_counted_as_lost(case)


async def test_returned_actor_hands_back_as_undelivered(case: sc.TierCase) -> None:
    await sc.scenario_returned_actor_hands_back_as_undelivered(case)


async def test_broadcast_reaches_every_replica(case: sc.TierCase) -> None:
    await sc.scenario_broadcast_reaches_every_replica(case)


async def test_broadcast_accounted_at_terminate(case: sc.TierCase) -> None:
    await sc.scenario_broadcast_accounted_at_terminate(case)


async def test_direct_and_queued_sends_keep_order(case: sc.TierCase) -> None:
    await sc.scenario_direct_and_queued_sends_keep_order(case)


async def test_batched_hand_over_keeps_promises(case: sc.TierCase) -> None:
    if case.name == "asyncio":
        pytest.skip("the asyncio tier has no bridge: nothing is handed over")
    await sc.scenario_batched_hand_over_keeps_promises(case)


async def test_spin_options_capped(case: sc.TierCase) -> None:
    await sc.scenario_spin_options_capped(case)


# --- round 4: tracing ---


async def test_tracing_lets_go_of_dropped_and_refused_messages(case: sc.TierCase) -> None:
    await sc.scenario_tracing_lets_go_of_dropped_and_refused_messages(case)


async def test_failed_message_spans_say_so(case: sc.TierCase) -> None:
    await sc.scenario_failed_message_spans_say_so(case)


async def test_shutdown_of_a_cycle_keeps_what_it_cannot_forward(case: sc.TierCase) -> None:
    await sc.scenario_shutdown_of_a_cycle_keeps_what_it_cannot_forward(case)


async def test_every_way_of_stopping_honours_drain_timeout(case: sc.TierCase) -> None:
    await sc.scenario_every_way_of_stopping_honours_drain_timeout(case)


async def test_unread_replies_reported_at_shutdown(case: sc.TierCase) -> None:
    await sc.scenario_unread_replies_reported_at_shutdown(case)


async def test_shutdown_cancelled_again_closes_its_books(case: sc.TierCase) -> None:
    await sc.scenario_shutdown_cancelled_again_closes_its_books(case)


async def test_mass_timeouts_do_not_wedge_request_reply(case: sc.TierCase) -> None:
    await sc.scenario_mass_timeouts_do_not_wedge_request_reply(case)


async def test_remove_reports_unread_replies(case: sc.TierCase) -> None:
    await sc.scenario_remove_reports_unread_replies(case)


# --- round 4: message types ---


@pytest.mark.parametrize("serialize", [False, True], ids=["objects", "serialized"])
async def test_typed_kernel_gets_its_own_class(case: sc.TierCase, serialize: bool) -> None:
    await sc.scenario_typed_kernel_gets_its_own_class(case, serialize=serialize)


async def test_reload_is_one_rule_on_every_tier(case: sc.TierCase) -> None:
    await sc.scenario_reload_is_one_rule_on_every_tier(case)


@pytest.mark.parametrize("serialize", [False, True], ids=["objects", "serialized"])
async def test_wrong_field_type_refused_at_send(case: sc.TierCase, serialize: bool) -> None:
    await sc.scenario_wrong_field_type_refused_at_send(case, serialize=serialize)


async def test_wrong_field_type_refused_in_ctx_send(case: sc.TierCase) -> None:
    await sc.scenario_wrong_field_type_refused_in_ctx_send(case)


@pytest.mark.parametrize("serialize", [False, True], ids=["objects", "serialized"])
async def test_unchecked_fields_rule(case: sc.TierCase, serialize: bool) -> None:
    await sc.scenario_unchecked_fields_rule(case, serialize=serialize)


# --- round 4: capabilities and instruments ---


async def test_instruments_see_every_message(case: sc.TierCase) -> None:
    await sc.scenario_instruments_see_every_message(case)
