"""The plan and the stage registry: which items a script gets, in which order, and what a failure blocks.

Pinned: the plan starts with the script's load on its first device; every CPU item comes before any CUDA item;
stages run in rank order; an opt-in stage (baseline) runs only on the CPU and only when selected; the registry's
declarations are consistent (needs point to lower ranks, one first stage); `blocked_by` is the transitive closure
of `needs`; `cpu_first` moves only pipeline items; `STAGES` lists the default stages in rank order.
"""

from __future__ import annotations

import dataclasses

import pytest

from pytest_trainer import plan
from pytest_trainer.devices import DEVICES
from pytest_trainer.plan import LOAD, NEEDS, OPT_IN, STAGES, Step, blocked_by, cpu_first
from pytest_trainer.settings import Settings
from pytest_trainer.stages import registry

EVERY_STAGE = (*STAGES, *OPT_IN)


#: Every item of a script on one device, in the order the plugin runs them.
ITEMS = (
    "dataset",
    "collate",
    "targets",
    "forward",
    "backward",
    "step",
    "overfit",
    "save",
    "eval",
    "precision",
    "memory",
    "labels",
    "lengths",
    "padding",
)


def ranks(steps: list[Step]) -> list[int]:
    declared = registry()
    return [declared[step.stage].rank for step in steps]


# ---- the registry ---------------------------------------------------------------------------------------------


def test_registry_is_in_rank_order() -> None:
    declared = list(registry().values())
    assert [stage.rank for stage in declared] == sorted(stage.rank for stage in declared)


def test_registry_is_keyed_by_each_stage_s_own_name() -> None:
    assert all(name == stage.name for name, stage in registry().items())


def test_every_stage_needs_only_stages_of_lower_rank() -> None:
    declared = registry()
    for stage in declared.values():
        for need in stage.needs:
            assert need in declared, f"{stage.name} needs {need!r}, which is no stage"
            assert declared[need].rank < stage.rank, f"{stage.name} needs {need!r}, which does not run before it"


def test_exactly_one_stage_is_the_script_s_first_item_and_it_ranks_lowest() -> None:
    declared = registry()
    first = [name for name, stage in declared.items() if stage.first]
    assert first == [LOAD]
    assert declared[LOAD].rank == min(stage.rank for stage in declared.values())


def test_every_declared_stage_runs_on_known_devices() -> None:
    for stage in registry().values():
        assert stage.devices, stage.name
        assert set(stage.devices) <= set(DEVICES), stage.name


def test_stages_are_the_default_stages_in_rank_order() -> None:
    declared = registry()
    assert LOAD not in STAGES
    assert not set(OPT_IN) & set(STAGES)
    assert {LOAD, *STAGES, *OPT_IN} == set(declared)
    assert list(STAGES) == [name for name in declared if name in STAGES]


def test_stages_are_the_items_a_script_gets_on_one_device() -> None:
    assert STAGES == ITEMS


def test_baseline_is_opt_in_through_its_setting_and_runs_on_the_cpu_only() -> None:
    assert OPT_IN["baseline"] == "baseline"
    assert registry()["baseline"].devices == ("cpu",)


def test_every_opt_in_stage_is_turned_on_by_a_setting_that_exists() -> None:
    fields = {field.name for field in dataclasses.fields(Settings)}
    assert set(OPT_IN.values()) <= fields


# ---- the plan -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("devices", [("cpu", "cuda"), ("cuda", "cpu"), ("cpu",), ("cuda",)])
def test_plan_starts_with_the_load_on_the_first_selected_device(devices: tuple[str, ...]) -> None:
    steps = plan.plan(STAGES, devices)
    first = next(device for device in DEVICES if device in devices)
    assert steps[0] == Step(LOAD, first)
    assert [step for step in steps if step.stage == LOAD] == [steps[0]]


def test_plan_has_one_load_even_when_the_stages_name_it() -> None:
    steps = plan.plan((LOAD, "forward"), DEVICES)
    assert steps == [Step(LOAD, "cpu"), Step("forward", "cpu"), Step("forward", "cuda")]


def test_plan_puts_every_cpu_step_before_any_cuda_step_whatever_order_devices_are_given() -> None:
    steps = plan.plan(STAGES, ("cuda", "cpu"))
    devices = [step.device for step in steps]
    assert devices == sorted(devices, key=DEVICES.index)
    assert devices.count("cpu") == len(STAGES) + 1
    assert devices.count("cuda") == len(STAGES)


def test_plan_runs_stages_in_rank_order_within_a_device() -> None:
    steps = plan.plan(reversed(EVERY_STAGE), DEVICES)
    for device in DEVICES:
        on_device = [step for step in steps if step.device == device]
        assert ranks(on_device) == sorted(ranks(on_device))


def test_plan_keeps_only_the_selected_stages() -> None:
    steps = plan.plan(("step", "dataset"), ("cpu",))
    assert steps == [Step(LOAD, "cpu"), Step("dataset", "cpu"), Step("step", "cpu")]


def test_opt_in_stage_is_planned_only_when_selected() -> None:
    assert all(step.stage not in OPT_IN for step in plan.plan(STAGES, DEVICES))


def test_opt_in_baseline_is_planned_on_the_cpu_only() -> None:
    steps = plan.plan(EVERY_STAGE, DEVICES)
    assert [step for step in steps if step.stage == "baseline"] == [Step("baseline", "cpu")]


def test_baseline_alone_on_cuda_plans_only_the_load() -> None:
    assert plan.plan(("baseline",), ("cuda",)) == [Step(LOAD, "cuda")]


@pytest.mark.parametrize(("stages", "devices"), [((), DEVICES), (STAGES, ()), (STAGES, ("tpu",))])
def test_plan_is_empty_without_a_stage_or_a_known_device(stages: tuple[str, ...], devices: tuple[str, ...]) -> None:
    assert plan.plan(stages, devices) == []


def test_step_names_are_the_item_name_and_the_marker_id() -> None:
    step = Step("forward", "cuda")
    assert step.name == "forward[cuda]"
    assert step.marker_id == "forward-cuda"


# ---- what a failure blocks ------------------------------------------------------------------------------------


def closure(failed: str) -> set[str]:
    """Every stage that needs `failed` directly or through others, by repeating until nothing is added."""
    blocked: set[str] = set()
    while True:
        more = {stage for stage, needs in NEEDS.items() if {failed, *blocked} & set(needs)} - blocked
        if not more:
            return blocked
        blocked |= more


def test_failed_forward_blocks_every_stage_that_runs_the_model() -> None:
    assert blocked_by("forward") == {
        "backward",
        "step",
        "overfit",
        "save",
        "memory",
        "precision",
        "eval",
        "labels",
        "lengths",
        "padding",
        "baseline",
        "distributed",
    }


def test_failed_dataset_blocks_every_stage_after_it() -> None:
    assert blocked_by("dataset") == set(registry()) - {LOAD, "dataset"}


@pytest.mark.parametrize("failed", list(registry()))
def test_blocked_by_is_the_transitive_closure_of_needs(failed: str) -> None:
    assert blocked_by(failed) == closure(failed)


@pytest.mark.parametrize("failed", list(registry()))
def test_a_failure_never_blocks_itself_or_a_stage_of_lower_rank(failed: str) -> None:
    declared = registry()
    assert all(declared[stage].rank > declared[failed].rank for stage in blocked_by(failed))


def test_a_stage_nothing_needs_blocks_nothing() -> None:
    needed = {need for needs in NEEDS.values() for need in needs}
    for stage in set(registry()) - needed:
        assert blocked_by(stage) == set(), stage


# ---- cpu_first ------------------------------------------------------------------------------------------------


class Item:
    """Stands for a collected pytest item (cpu_first reads only identities)."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __repr__(self) -> str:
        return self.label


def test_cpu_first_moves_cpu_items_ahead_and_leaves_other_items_in_place() -> None:
    cuda_forward, cpu_forward, cuda_step, cpu_step = (Item(name) for name in ("f-cuda", "f-cpu", "s-cuda", "s-cpu"))
    plain_a, plain_b = Item("test_a"), Item("test_b")
    step_of = {
        id(cuda_forward): Step("forward", "cuda"),
        id(cpu_forward): Step("forward", "cpu"),
        id(cuda_step): Step("step", "cuda"),
        id(cpu_step): Step("step", "cpu"),
    }
    items = [plain_a, cuda_forward, cpu_forward, plain_b, cuda_step, cpu_step]
    ordered = cpu_first(items, step_of)
    assert ordered[0] is plain_a and ordered[3] is plain_b
    assert [item.label for item in ordered] == ["test_a", "f-cpu", "s-cpu", "test_b", "f-cuda", "s-cuda"]


def test_cpu_first_keeps_the_order_within_a_device_and_the_items_given() -> None:
    items = [Item(f"{stage}-{device}") for device in ("cuda", "cpu") for stage in STAGES]
    step_of = {id(item): Step(*item.label.split("-")) for item in items}
    ordered = cpu_first(items, step_of)
    assert sorted(map(id, ordered)) == sorted(map(id, items))
    assert [item.label for item in ordered] == [f"{stage}-{device}" for device in ("cpu", "cuda") for stage in STAGES]


def test_cpu_first_leaves_a_list_without_pipeline_items_unchanged() -> None:
    items = [Item("test_a"), Item("test_b")]
    assert cpu_first(items, {}) == items
