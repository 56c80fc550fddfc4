"""Reference implementation of the growth metric used by the sales-analysis skill."""


def growth(previous: float, current: float) -> float:
    """Percentage growth from `previous` to `current`, rounded to one decimal."""
    if previous == 0:
        raise ValueError("growth from zero is undefined")
    return round((current - previous) / previous * 100, 1)
