import pytest

from tokenops.tunables import Tunable, TunableError, TunableRegistry


def test_validate_coerces_and_checks_range():
    t = Tunable("engine.max_num_seqs", "int", 32, "h", live=True, minimum=1, maximum=64)
    assert t.validate("16") == 16
    assert t.validate(8.0) == 8
    for bad, msg in [(0, "below the minimum"), (65, "above the maximum"), ("x", "expected int"), (2.5, "expected int"), (True, "expected int")]:
        with pytest.raises(TunableError, match=msg):
            t.validate(bad)


def test_bool_and_choices():
    b = Tunable("x.flag", "bool", True, "h")
    assert b.validate("off") is False and b.validate(1) is True
    with pytest.raises(TunableError):
        b.validate("maybe")
    c = Tunable("x.policy", "str", "fcfs", "h", choices=("fcfs", "priority"))
    with pytest.raises(TunableError, match="not one of"):
        c.validate("lifo")


def test_bad_default_and_type_rejected_at_declaration():
    with pytest.raises(TunableError):
        Tunable("x.n", "int", 0, "h", minimum=1)
    with pytest.raises(TunableError, match="type must be"):
        Tunable("x.n", "list", [], "h")


def test_registry_patch_is_all_or_nothing_and_duplicates_rejected():
    reg = TunableRegistry()
    reg.register(Tunable("a.n", "int", 1, "h", minimum=0), plugin="p1")
    reg.register(Tunable("a.f", "float", 0.5, "h", maximum=1.0), plugin="p1")
    assert reg.validate({"a.n": "3", "a.f": 1}) == {"a.n": 3, "a.f": 1.0}
    with pytest.raises(TunableError, match="a.f"):
        reg.validate({"a.n": 3, "a.f": 2.0})
    with pytest.raises(TunableError, match="unknown tunable"):
        reg.validate({"nope": 1})
    with pytest.raises(TunableError, match="declared twice"):
        reg.register(Tunable("a.n", "int", 1, "h"), plugin="p2")
    assert reg["a.n"].plugin == "p1"
    assert [t.name for t in reg] == ["a.f", "a.n"]
