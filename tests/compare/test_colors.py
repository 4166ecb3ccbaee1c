"""An arm's colour in compare's figures follows its name, not its place in the folder list."""

from nvfp4train.compare.report import PRECISION_COLORS, arm_colors


def test_a_precision_keeps_its_colour_in_every_comparison():
    one = arm_colors(["runs/a/bf16", "runs/a/nvfp4"])
    other = arm_colors(["runs/b/mxfp4", "runs/b/nvfp4/", "runs/b/fp8_blockwise", "runs/b/bf16"])
    assert one["runs/a/nvfp4"] == other["runs/b/nvfp4/"] == PRECISION_COLORS["nvfp4"]
    assert one["runs/a/bf16"] == other["runs/b/bf16"] == PRECISION_COLORS["bf16"]


def test_other_names_get_a_colour_of_their_own_that_does_not_depend_on_order():
    labels = ["runs/x/seed1", "runs/x/seed2", "runs/x/lr3e-3", "runs/x/nvfp4"]
    forward, backward = arm_colors(labels), arm_colors(labels[::-1])
    assert forward == backward
    assert len(set(forward.values())) == len(labels)  # no two arms of one figure share a colour
    assert forward["runs/x/nvfp4"] == PRECISION_COLORS["nvfp4"]  # a named precision is never displaced


def test_more_arms_than_colours_still_get_one_each():
    labels = [f"arm{i}" for i in range(13)]
    colors = arm_colors(labels)
    assert set(colors) == set(labels) and all(c.startswith("C") for c in colors.values())
