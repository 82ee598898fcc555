"""Learning-curve plots: many curves are split into panels by data split."""

from hetfl.plots import panels, plot_curves


def test_many_labels_are_split_by_the_last_item_in_their_parentheses():
    labels = [f"{m} ({b}, {split})" for split in ("α0.3", "α1.0", "β2") for m in ("FedAvg", "FeDepth", "m-FeDepth")
              for b in ("Fair", "Surplus")]
    groups = panels(labels)
    assert list(groups) == ["α0.3", "α1.0", "β2"]
    assert groups["β2"] == [label for label in labels if label.endswith("β2)")]


def test_few_labels_or_labels_without_a_split_stay_in_one_panel():
    assert panels(["FedAvg (α0.3)", "FeDepth (α1.0)"]) == {"": ["FedAvg (α0.3)", "FeDepth (α1.0)"]}
    many = [f"run {i}" for i in range(12)]
    assert panels(many) == {"": many}
    one_split = [f"run {i} (IID)" for i in range(12)]  # a single group is no split
    assert panels(one_split) == {"": one_split}


def test_plot_curves_writes_a_png_with_one_panel_per_split(tmp_path):
    curves = {f"m{i} ({split})": [[(10, 0.1 * i), (20, 0.1 * i + 0.05)]] for i in range(5) for split in ("a", "b")}
    plot_curves(curves, tmp_path / "curves.png", title="t")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
