import pytest

from daydream.base.errors import DaydreamError
from daydream.transforms import list_opts, rewrite
from daydream.transforms.registry import check
from daydream.transforms.spec import parse


def test_parse_chain_and_values():
    t = parse("amp + scale(select=\"kind = 'kernel' AND name LIKE '%a+b%'\", factor=0.5)"
              "+dataloader(4)+fused_optimizer(kind=adamw)")
    assert [x.name for x in t] == ["amp", "scale", "dataloader", "fused_optimizer"]
    assert t[1].kwargs == {"select": "kind = 'kernel' AND name LIKE '%a+b%'", "factor": 0.5}
    assert t[2].args == [4]
    assert t[3].kwargs == {"kind": "adamw"}


def test_check_binds_types():
    (o, kw), = check("dataloader(workers=8)")
    assert o.name == "dataloader" and kw == {"workers": 8}
    (o, kw), = check("scale(select='1=1', factor=1)")
    assert kw["factor"] == 1.0 and isinstance(kw["factor"], float)


@pytest.mark.parametrize("spec, msg", [
    ("amq", "unknown optimization 'amq'; known: amp, "),
    ("amp(x=1)", "amp: unknown parameter 'x'; parameters: dtype, casts, loss_scaling, gpu"),
    ("dataloader(workers=four)", "dataloader: parameter 'workers' must be int, got 'four'"),
    ("dataloader(workers=1.5)", "parameter 'workers' must be int"),
    ("scale(factor=0.5)", "scale: missing parameter 'select'"),
    ("amp(", "unbalanced '('"),
    ("scale(select='x, factor=1)", "unterminated quote"),
    ("", "empty optimization spec"),
    ("amp+", "bad spec term ''"),
    ("dataloader(workers=2, workers=3)", "given twice"),
    ("no_straggler(1)", "takes 0 parameters"),
])
def test_spec_errors(spec, msg):
    with pytest.raises(DaydreamError, match=None) as e:
        check(spec)
    assert msg in str(e.value)


def test_list_opts():
    names = [o["name"] for o in list_opts()]
    for n in ("scale", "amp", "fused_adam", "fused_adamw", "fused_sgd", "fused_adagrad",
              "fused_optimizer", "dataloader", "cuda_graphs"):
        assert n in names
    for o in list_opts():
        assert o["summary"], o["name"]


def test_bad_sql_select(graphs):
    with pytest.raises(DaydreamError, match="bad select"):
        rewrite(graphs["alexnet"], "scale(select='no_such_column = 1', factor=0.5)")


def test_errors_before_work(graphs):
    with pytest.raises(DaydreamError, match="unknown optimization"):
        rewrite(graphs["alexnet"], "amp+nope")
