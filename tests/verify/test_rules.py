"""``cuvil verify --rules``: every canonicalization rule proved at several shapes with distinct
dims >= 2; a wrong rule is refuted, a rule without an instance model is reported, not skipped."""

import json

from cuvil import cli
from cuvil.ir import DType
from cuvil.passes.canonicalize import RULES
from cuvil.passes.rewrite import Rule, RuleSet, any_, op
from verify import rules_check


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_canonicalization_rule_has_instances_at_distinct_shapes():
    assert {r.name for r in RULES} <= set(rules_check.INSTANCES)
    assert len(rules_check.SHAPES) >= 2
    for shape in rules_check.SHAPES:
        assert len(set(shape)) == len(shape) and min(shape) >= 2


def test_rules_are_all_proved(capsys, tmp_path):
    path = tmp_path / "rules.json"
    code, out, _ = run(capsys, "verify", "--rules", "-j", "1", "-q", "--json", path)
    assert code == 0
    proofs = json.loads(path.read_text())["proofs"]
    for rule in RULES:
        mine = [p for p in proofs if p["rule"] == rule.name]
        assert len({tuple(p["shape"]) for p in mine}) >= 2, rule.name
        assert all(p["verdict"] == "proved" for p in mine), rule.name
        assert rule.name in out


def test_a_wrong_rule_is_refuted_and_a_rule_without_instance_is_not_proved(capsys, monkeypatch):
    wrong = Rule("relu-dropped", op("relu", any_("x")), lambda m, b: m["x"], "relu(x) -> x (wrong)")
    monkeypatch.setattr(rules_check, "rule_table", lambda: RuleSet((wrong,)))
    monkeypatch.setitem(rules_check.INSTANCES, "relu-dropped",
                        [("relu", DType.f32, lambda b, x: b.exp(b.relu(x)))])
    code, out, _ = run(capsys, "verify", "--rules", "-j", "1", "-q")
    assert code == 1 and "REFUTED" in out and "counterexample" in out

    unlisted = Rule("unlisted", op("neg", any_("x")), lambda m, b: None, "never fires")
    monkeypatch.setattr(rules_check, "rule_table", lambda: RuleSet((unlisted,)))
    code, out, _ = run(capsys, "verify", "--rules", "-j", "1", "-q")
    assert code == 3 and "no instance" in out


def test_rule_proofs_do_not_depend_on_the_worker_count():
    serial = [(o.case.label, o.status) for o in rules_check.check_rules(jobs=1)]
    parallel = [(o.case.label, o.status) for o in rules_check.check_rules(jobs=2)]
    assert serial == parallel
    assert {c.rule for c in rules_check.cases()} == {r.name for r in RULES}
