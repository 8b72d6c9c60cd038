"""The hostile findings of issue 39, by class, re-run: each class's tests (those added for the issue
failed or hung on the code it was filed against, 702d691; `test_hostile_out` and the Ray executor's
first test are older ones the class extends), how many cases they hold (each parametrized case
counts), and how many pass now. Not a test itself: it runs pytest on them and prints one row per
class.

    .venv/bin/python bench/hostile.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLASSES: dict[str, list[str]] = {
    "a run folder that changes under the run": [
        "tests/test_runfolder.py",
        "tests/test_hostile.py::test_hostile_out",
    ],
    "processes and signals": ["tests/test_signals.py"],
    "numbers at the edge": [
        "tests/test_living.py::test_a_bad_trace_is_refused_with_one_line",
        "tests/test_living.py::test_a_pickle_claiming_a_terabyte_is_refused_not_allocated",
        "tests/test_living.py::test_a_csv_trace_with_a_byte_order_mark_is_read",
        "tests/test_living.py::test_the_breakdown_of_a_round_no_client_completed_fits_in_the_round",
        "tests/test_scenario_input.py::test_a_profile_file_that_is_a_pipe_or_a_device_is_refused_not_read",
        "tests/test_scenario_input.py::test_an_inline_table_set_on_a_section_keeps_its_other_keys",
        "tests/test_energy.py::test_an_empty_battery_on_a_weak_charger_pays_for_no_work",
        "tests/test_living_energy.py::test_a_round_whose_every_client_cannot_pay_waits_until_one_can",
        "tests/test_living_energy.py::test_a_round_no_battery_or_charger_can_ever_pay_for_is_one_line",
        "tests/test_energy.py::test_a_battery_is_filled_enough_when_its_charger_has_brought_the_joules",
        "tests/test_living.py::test_a_stalled_async_run_names_the_key_to_change",
        "tests/test_living.py::test_an_async_run_at_the_edge_ends",
        "tests/test_timeline.py",
    ],
    "determinism on the distributed engine": [
        "tests/test_ray.py::test_an_async_run_under_ray_evaluates_as_in_process",
        "tests/test_ray.py::test_ray_matches_in_process_and_survives_a_dead_worker",
    ],
    "losing a machine": [
        "tests/test_ray_cluster.py",
        "tests/test_ray.py::test_a_failed_ray_task_is_one_line_naming_its_clients_and_the_setting",
        "tests/test_ray.py::test_a_task_that_runs_its_node_out_of_memory_is_one_line_naming_its_clients",
        "tests/test_ray.py::test_a_full_object_store_for_the_model_state_is_one_line",
        "tests/test_ray.py::test_a_cluster_failing_mid_run_is_one_line_and_the_run_resumes_to_the_same_files",
        "tests/test_ray.py::test_a_run_begun_on_ray_resumes_in_process_to_the_same_files",
    ],
}


class Outcomes:
    """A pytest plugin that keeps each test's outcome by node id."""

    def __init__(self) -> None:
        self.by_id: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.by_id.setdefault(report.nodeid, report.outcome)


def main() -> int:
    outcomes = Outcomes()
    targets = [t for tests in CLASSES.values() for t in tests]
    code = pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT), *targets],
                       plugins=[outcomes])
    print(f"\n{'class':<40} {'tests':>5} {'cases':>5} {'passed':>6}")
    for name, tests in CLASSES.items():
        ids = [i for i in outcomes.by_id if any(i == t or i.startswith((t + "::", t + "[")) for t in tests)]
        functions = {i.split("[")[0] for i in ids}
        passed = sum(outcomes.by_id[i] == "passed" for i in ids)
        print(f"{name:<40} {len(functions):>5} {len(ids):>5} {passed:>6}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
