"""The shared table model: names shortened by the documented rule, trace strings inert in the terminal."""

from __future__ import annotations

import io

from rich.console import Console

from bottleneck_oracle.analysis.whatif import Edit
from bottleneck_oracle.report.tables import Column, TableModel, shorten
from bottleneck_oracle.report.terminal import plain, print_table

KERNEL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::BUnaryFunctor<float, float, float, at::native::MulFunctor<float> >, "
    "at::detail::Array<char*, 2> >(int, at::native::BUnaryFunctor<float, float, float, at::native::MulFunctor<float> >, at::detail::Array<char*, 2>)"
)


def test_names_are_shortened_by_the_rule_keeping_what_tells_them_apart():
    assert shorten("aten::mm", 20) == "aten::mm"  # fits: unchanged
    assert shorten(KERNEL, 50) == "at::native::vectorized_elementwise_kernel<…>"  # void, parameters, templates
    assert (
        shorten("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", 40)
        == "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"[:19] + "…" + "NG_SIMPLE_Sum_int8_t"
    )
    # "(after ...)" is not a parameter list but a qualifier: it goes first, the op it qualifies stays
    assert shorten("own time of AddmmBackward0 (after aten::resolve_conj)", 30) == "own time of AddmmBackward0 (…)"
    assert shorten("untraced time in forward (from the step start to aten::empty)", 28) == "untraced time in forward (…)"
    short = shorten("own time of AddmmBackward0 (after aten::resolve_conj)", 20)  # the op alone is too long: its middle goes
    assert len(short) == 20 and short.startswith("own time") and short.endswith("Backward0")
    for width in (4, 10, 33, 80):
        assert len(shorten(KERNEL, width)) <= width


def test_control_characters_and_markup_stay_inert():
    assert plain("a\x1b[31mred\x9b") == "a\\x1b[31mred\\x9b"
    t = TableModel("t", [Column("op", "name"), Column("ms", "ms")], [["[/bold][link=http://x]evil\x1b[2J", 1500.0]])
    buf = io.StringIO()
    print_table(Console(file=buf, width=80, force_terminal=True), t)
    text = buf.getvalue()
    assert "\x1b[2J" not in text and "\\x1b[2J" in text and "[/bold]" in text and "1.500" in text


def test_edits_are_said_in_words():
    assert Edit.parse("rank=1,gap=1,scale=0.11").describe() == "make the untraced time after rank 1's ops 11% of what it is"
    assert Edit.parse("name~=all_reduce,scale=0.5").describe() == "make ops whose name contains 'all_reduce' 50% of what it is"
    assert Edit.parse("cat=kernel,max_us=20,scale=0").describe() == "remove GPU kernels of at most 20 µs"
    assert Edit.parse("id=7,delay_ms=5").describe() == "add 5 ms to each of op #7"
    assert Edit.parse("name~=nccl,detach=1").describe().startswith("let ops whose name contains 'nccl' neither wait")


def test_a_table_wider_than_the_terminal_stays_one_table_keys_kept_columns_said():
    """At 80 columns a table whose numbers do not all fit is not split into parts: the row key and
    its name stay, the rightmost other columns are left out and the caption names them."""
    cols = [Column("#", "key"), Column("op", "name"), *[Column(f"figure {i}", "ms") for i in range(12)], Column("typical from", "text")]
    names = ["aten::mm", "DistributedDataParallel.forward", "gloo:broadcast"]
    rows = [[k, names[k], *[123456789.0 + i for i in range(12)], "peer ranks"] for k in range(3)]
    buf = io.StringIO()
    print_table(Console(file=buf, width=80, force_terminal=False), TableModel("Culprits", cols, rows))
    text = buf.getvalue()
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= 80
    assert text.count("Culprits") == 1 and "(1/" not in text  # one table
    assert "typical from" in text.split("Not shown at 80 columns:")[1]  # the caption names what is left out
    assert "figure 0" in text and all(x[:8] in text for x in names)  # the key and names kept


def test_the_slack_histogram_of_a_step_whose_ops_are_all_critical_reads_in_microseconds():
    """A one-thread CPU step: every op on the path, its slack 0 up to float noise (1e-13 µs).
    The histogram's axis starts at 0 and spans at least log10(10 µs + 1): noise scaled it to femto
    units ("50f", "100f") before."""
    import json
    import re

    from bottleneck_oracle.report.html import slack_plot
    from conftest import DATA, cached_analyses

    a = cached_analyses(DATA / "own-cpu" / "host_waits_stack.json.gz")[0]
    assert (a.cpm.slack[a.graph.nodes["event"] >= 0] < 1e-6).mean() > 0.9
    text = slack_plot(a)
    lo, hi = json.loads(re.search(r'"xaxis":\{"range":(\[[^\]]*\])', text).group(1))
    assert lo == 0.0 and hi >= 1.0
