"""`make demo` runs the product's main job end to end and fails when any step does."""

from bench import demo


def test_demo_proves_compiles_audits_and_refuses_the_wrong_pass(capsys):
    assert demo.main() == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "3 proved, 0 refuted" in out
    assert "answered unsat by cvc5" in out and "library binding checked" in out
    assert "CUVIL-PROOF-REFUTED" in out and "replayed on the reference interpreter" in out
    assert "no library was written for the wrong pipeline" in out
