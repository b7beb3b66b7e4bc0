"""Argument checks shared by layers, models, data, generation and serving."""

import math
import numbers


def check_positive_int(name, value, owner=""):
    """Raises a ValueError naming `name` (of `owner`, e.g. "GPT's ") unless `value` is an int >= 1.

    numpy ints pass; bools and floats do not (`True` is no size, `16.0` no count).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{owner}`{name}` must be a positive int, got {value!r}.")


def check_int(name, value, low=0, high=None, none_ok=False, owner=""):
    """Raises a ValueError naming `name` (of `owner`) unless `value` is an int in `[low, high)` (or None if `none_ok`)."""
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (high is not None and value >= high):
        span = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"{owner}`{name}` must be an int {span}{' or None' if none_ok else ''}, got {value!r}.")


def check_batch_sizes(**tensors):
    """Raises a ValueError naming `tensors` (name: tensor or None) whose batch sizes (axis 0) differ.

    Checked where the sizes are known (eager calls, JAX's traces); a symbolic
    batch passes. Some backends would broadcast a batch of one against the
    other and return a result.
    """
    sizes = {}
    for name, tensor in tensors.items():
        shape = getattr(tensor, "shape", None)
        if shape is not None and len(shape) and isinstance(shape[0], int):
            sizes[name] = shape[0]
    if len(set(sizes.values())) > 1:
        names = " and ".join(f"`{name}`" for name in sizes)
        raise ValueError(f"{names} must have the same batch size (one row per example), got {sizes}.")


def check_rate(name, value):
    """Raises a ValueError naming `name` unless `value` is a dropout rate in [0, 1)."""
    check_number(name, value, low=0, high=1, high_open=True)


def check_number(name, value, low=None, high=None, low_open=False, high_open=False, none_ok=False):
    """Raises a ValueError naming `name` unless `value` is a finite real number within the bounds.

    `low` and `high` are included unless `low_open` / `high_open`. bools do not pass.
    """
    if value is None and none_ok:
        return
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    ok = ok and (low is None or (value > low if low_open else value >= low))
    ok = ok and (high is None or (value < high if high_open else value <= high))
    if not ok:
        bounds = [f"{'>' if low_open else '>='} {low}"] * (low is not None)
        bounds += [f"{'<' if high_open else '<='} {high}"] * (high is not None)
        span = f" {' and '.join(bounds)}" if bounds else ""
        raise ValueError(f"`{name}` must be a finite number{span}{' or None' if none_ok else ''}, got {value!r}.")
