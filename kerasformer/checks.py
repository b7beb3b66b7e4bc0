"""Argument checks shared by layers, models, data, generation and serving."""

import numbers


def check_positive_int(name, value, owner=""):
    """Raises a ValueError naming `name` (of `owner`, e.g. "GPT's ") unless `value` is an int >= 1.

    numpy ints pass; bools and floats do not (`True` is no size, `16.0` no count).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{owner}`{name}` must be a positive int, got {value!r}.")
