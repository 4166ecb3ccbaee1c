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


def test_stability_figure_names_every_arm_in_each_panel_and_labels_its_axes(tmp_path):
    """Each arm's name is on one of its lines in both panels, also where its first seed logged no gradient norm
    (that arm's lines were all unnamed, so the legend lacked it); the axes say what they show, and the saved
    figure is the one drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nvfp4train.compare.report import arm_colors, stability_figure

    curves = {
        "bf16": {"grad_norm": {"s1": [], "s2": [(64, 1.5), (128, 1.2)]}, "tokens_per_s": {"s1": [(64, 900.0)]}},
        "nvfp4": {"grad_norm": {"s1": [(64, 1.7), (128, 1.3)]}, "tokens_per_s": {"s1": [], "s2": [(128, 700.0)]}},
    }
    markers = [{"kind": "decay", "tokens": 96, "label": "LR decay"}, {"kind": "end", "tokens": 128, "label": "end"}]
    fig = stability_figure({"curves": curves, "markers": markers}, arm_colors(list(curves)))
    fig.savefig(tmp_path / "stability.png")
    grad, speed = fig.axes
    for ax in (grad, speed):
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["bf16", "nvfp4"]
        assert ax.get_xlabel() == "tokens" and ax.get_ylabel()
    assert grad.get_ylabel().startswith("gradient norm") and speed.get_ylabel() == "tokens/s"
    for ax in (grad, speed):  # the markers' names on the axis above each panel
        assert [t.get_text() for top in ax.child_axes for t in top.get_xticklabels()] == ["LR decay"]
    plt.close(fig)
