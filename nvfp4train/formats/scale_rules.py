"""MXFP4's block-scale rules (mxfp4.py), in a module without torch: the precision config checks them before
any tensor exists, and loads without torch."""

from __future__ import annotations

SCALE_RULES = ("rceil", "floor")


def check_scale_rule(scale_rule: str) -> str:
    """``scale_rule``, or ValueError in one line naming the allowed rules."""
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"mxfp4: scale_rule={scale_rule!r} is not supported; allowed: {SCALE_RULES}")
    return scale_rule
