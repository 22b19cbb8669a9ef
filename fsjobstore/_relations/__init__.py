"""The features that relate jobs: unique keys, dependencies, groups, subscriptions, limits and schedules' ticks.
Each attaches to named points of the transitions (``_core._hooks``).
"""
